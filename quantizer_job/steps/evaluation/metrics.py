"""Ranking-quality metrics comparing INT8 scores with FP32 scores. Pure numpy."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

#: Scores: a list or a numpy array of floats.
Scores = Sequence[float] | npt.NDArray[np.floating[Any]]


def rankdata(x: Scores) -> np.ndarray:
    """Ranks starting at 1, ties get the average of their ranks (like scipy.stats.rankdata)."""
    a = np.asarray(x, dtype=np.float64)
    n = a.size
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(n, dtype=np.float64)
    sorted_a = a[order]
    i = 0
    while i < n:
        j = i
        while j + 1 < n and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(a: Scores, b: Scores) -> float:
    """Spearman rank correlation; NaN when either side is constant or sizes differ/too small."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.size < 2:
        return float("nan")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
        return float("nan")
    rx, ry = rankdata(x), rankdata(y)
    rx -= rx.mean()
    ry -= ry.mean()
    denom = float(np.sqrt((rx * rx).sum() * (ry * ry).sum()))
    if denom == 0.0:
        return float("nan")
    return float((rx * ry).sum() / denom)


def topk_agreement(groups: Sequence[object], ref: Scores, cand: Scores, k: int) -> float:
    """Mean over queries of |top-k(ref) ∩ top-k(cand)| / k.

    ``groups`` gives each pair's query key. Queries with fewer than k+1 texts are skipped (their top-k is every
    text, which says nothing); k is clipped to 1 at least. NaN when no query qualifies.
    """
    k = max(1, int(k))
    by_q: dict[object, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        by_q[g].append(i)
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    vals = []
    for idx in by_q.values():
        if len(idx) <= k:
            continue
        idx_a = np.asarray(idx)
        # Stable tie-break by position, so equal scores do not make the metric random.
        top_r = set(idx_a[np.argsort(-r[idx_a], kind="mergesort")[:k]].tolist())
        top_c = set(idx_a[np.argsort(-c[idx_a], kind="mergesort")[:k]].tolist())
        vals.append(len(top_r & top_c) / k)
    return float(np.mean(vals)) if vals else float("nan")


def max_abs_diff(a: Scores, b: Scores) -> float:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.size == 0:
        return 0.0
    return float(np.max(np.abs(x - y)))


def all_finite(a: Scores) -> bool:
    return bool(np.all(np.isfinite(np.asarray(a, dtype=np.float64))))


def percentile(values: Scores, q: float) -> float:
    v = np.asarray(values, dtype=np.float64)
    return float(np.percentile(v, q)) if v.size else float("nan")


def bootstrap_ci(stat: Callable[..., float], ref: Scores, cand: Scores, groups: Sequence[object] | None = None,
                 n_boot: int = 200, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(ref, cand[, groups])`` over pairs resampled with replacement.

    Why: the gate compares a point estimate with a threshold; the interval says whether the evaluation set is big
    enough for that comparison to mean anything (74 pairs give intervals about 0.01 wide at Spearman 0.99).
    Resampled pairs keep their query key, so top-k agreement is computed over the queries drawn. NaN when the
    statistic is undefined on every resample.
    """
    r = np.asarray(ref, dtype=np.float64)
    c = np.asarray(cand, dtype=np.float64)
    g = np.asarray(groups if groups is not None else np.zeros(r.size), dtype=object)
    rng = np.random.default_rng(seed)
    vals = []
    for _ in range(int(n_boot)):
        idx = rng.integers(0, r.size, r.size)
        v = stat(r[idx], c[idx], g[idx]) if groups is not None else stat(r[idx], c[idx])
        if np.isfinite(v):
            vals.append(v)
    if not vals:
        return float("nan"), float("nan")
    a = (1.0 - level) / 2.0
    return float(np.quantile(vals, a)), float(np.quantile(vals, 1.0 - a))
