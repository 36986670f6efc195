"""One sampled request, one pool: how closely the pool's scores rank the passages as the reference does.

The statistics are the quantization Job's own (:mod:`quantizer_job.metrics`), applied to one request (a query and
its passages) instead of the Job's pooled evaluation set:

- **Spearman** of the pool's scores against the reference's, ties given their average rank.
- **Top-k agreement**: |top-k(reference) ∩ top-k(pool)| / k, ties broken by position (the Job's rule).
- **Max absolute difference** of the scores as TEI returns them: sigmoid probabilities, or logits with
  ``raw_scores``; ``inf`` when a pool score is not finite.
- **Broken scores**: a pool score that is NaN or infinite, or *saturated* where the reference's is not: exactly 0 or
  1 as a probability (a logit past float32's sigmoid range: what an FP16 overflow to ±inf becomes after the
  sigmoid), or at/over float16's largest value as a raw logit. Such a request is a *failure* whatever its ranking.

Edge cases (a request says nothing about a figure, rather than something wrong, where the reference cannot rank):

- fewer than 2 passages: Spearman and top-k are NaN (no ranking to compare); broken scores still count;
- top-k needs more than k passages (with k or fewer, top-k is every passage and always agrees): NaN otherwise;
- reference scores all equal: Spearman NaN (the reference gives no order); pool scores all equal while the
  reference's are not: Spearman 0.0, the pool ranks nothing (a collapse, e.g. every score saturated);
- NaN figures are left out of the detector's means; broken scores are counted by its failure test.

The scores themselves travel with the figures: the detector pools the pairs of a window of requests for the Job's
own Spearman (one correlation over all pairs, not a mean over requests; see :mod:`.detector`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from quantizer_job.steps.evaluation import metrics

#: The largest finite float16: a raw logit at or past it is what an FP16 pool's overflow saturates to.
FP16_MAX = 65504.0
#: The Job's default k (``--topk``).
DEFAULT_K = 3


@dataclass(frozen=True, eq=False)
class Agreement:
    """One request's figures for one pool against the reference, and both sides' scores."""

    passages: int
    spearman: float  # NaN when the request cannot say (see the module docstring)
    topk: float  # NaN when the request has k passages or fewer
    k: int
    max_abs_diff: float  # inf when a pool score is not finite
    nonfinite: int  # pool scores that are NaN or ±inf
    saturated: int  # finite pool scores at the saturation bound where the reference's are not
    reference: np.ndarray  # float64, the passages' order
    pool: np.ndarray

    @property
    def broken(self) -> bool:
        """The pool's scores are unusable for this request (overflow, NaN, saturation): a failure by itself."""
        return self.nonfinite > 0 or self.saturated > 0


def at_bound(scores: np.ndarray, raw: bool) -> np.ndarray:
    """Which scores sit at the saturation bound: 0 or 1 for probabilities, |x| >= FP16_MAX for raw logits."""
    if raw:
        return np.asarray(np.abs(scores) >= FP16_MAX)
    return np.asarray((scores <= 0.0) | (scores >= 1.0))


def agreement(reference: Sequence[float] | np.ndarray, pool: Sequence[float] | np.ndarray, *, k: int = DEFAULT_K,
              raw: bool = False) -> Agreement:
    """Compare one request's pool scores with the reference's (same passages, same order)."""
    ref = np.asarray(reference, dtype=np.float64)
    got = np.asarray(pool, dtype=np.float64)
    if ref.shape != got.shape or ref.ndim != 1:
        raise ValueError(f"score shapes differ: reference {ref.shape}, pool {got.shape}")
    if not metrics.all_finite(ref):
        raise ValueError("the reference's scores are not all finite: it cannot be the reference")
    k = max(1, int(k))
    finite = np.isfinite(got)
    nonfinite = int(got.size - np.count_nonzero(finite))
    saturated = int(np.count_nonzero(finite & at_bound(got, raw) & ~at_bound(ref, raw)))
    n = int(ref.size)
    if nonfinite:
        return Agreement(n, math.nan, math.nan, k, math.inf, nonfinite, saturated, ref, got)
    return Agreement(passages=n, spearman=_spearman(ref, got), topk=metrics.topk_agreement([0] * n, ref, got, k), k=k,
                     max_abs_diff=metrics.max_abs_diff(ref, got), nonfinite=0, saturated=saturated, reference=ref,
                     pool=got)


def _spearman(ref: np.ndarray, got: np.ndarray) -> float:
    if ref.size < 2 or np.all(ref == ref[0]):
        return math.nan
    if np.all(got == got[0]):
        return 0.0
    return metrics.spearman(ref, got)


def sigmoid(logits: Sequence[float] | np.ndarray) -> np.ndarray:
    """Scores as TEI's ``/rerank`` returns them without ``raw_scores``: the sigmoid of the logit, in float32."""
    x = np.asarray(logits, dtype=np.float32)
    with np.errstate(over="ignore"):
        return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float32)
