"""Ranking-quality metrics comparing INT8 scores with FP32 scores. Pure numpy."""

from __future__ import annotations

from collections import defaultdict
from typing import Sequence

import numpy as np


def rankdata(x: Sequence[float]) -> np.ndarray:
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


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
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


def topk_agreement(groups: Sequence[object], ref: Sequence[float], cand: Sequence[float], k: int) -> float:
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


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if x.size == 0:
        return 0.0
    return float(np.max(np.abs(x - y)))


def all_finite(a: Sequence[float]) -> bool:
    return bool(np.all(np.isfinite(np.asarray(a, dtype=np.float64))))


def percentile(values: Sequence[float], q: float) -> float:
    v = np.asarray(values, dtype=np.float64)
    return float(np.percentile(v, q)) if v.size else float("nan")
