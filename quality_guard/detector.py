"""Per (model, pool): is the pool below the model's quality floor, with confidence, over the sampled requests?

Each sampled request gives an :class:`~quality_guard.compare.Agreement`. The detector keeps a sliding window of the
last ``window`` requests and runs three one-sided tests (none before ``min_samples`` requests):

- **Spearman** below ``floor.min_spearman``. The floor is the Job's gate, and the gate's Spearman is one
  correlation over all its evaluation pairs pooled (``quantizer_job.verify.quality``), not a mean over queries: the
  detector computes exactly that over the window's pairs (100 requests of 15 passages: 1,500 pairs, the size of a
  Job's evaluation set). Its interval is a delete-one-request jackknife (pairs of a request are not independent), with
  the window's ranks held fixed so each of the 100 leave-one-out correlations is a subtraction of sums. It is bound
  by ``mean + z_detect * se`` and computed every ``check_every`` requests (ranking 1,500 pairs twice takes ~2 ms).
  Why not the mean of per-request Spearman: with 15 passages it is a different, lower figure; the healthy INT8 pool
  of the benchmark passes the gate at 0.995 pooled, and its per-request mean is 0.984. Compared with 0.99 it would
  raise an alarm on every healthy pool. The per-request mean is exported as ``request_spearman``.
- **Top-k agreement** below ``floor.min_topk_agreement``: this one *is* a mean over queries in the Job, so it is
  here too, bound by a t-interval ``mean + z_detect * s / sqrt(n)`` (n >= 30: the normal quantile).
- **Failure fraction** above ``max_failure_rate``: a request fails when its scores are broken (NaN, inf, saturated:
  what an FP16 overflow gives) or its own Spearman is under ``request_min_spearman``. ``f`` failures in ``n``
  requests are improbable under the allowed rate when the Chernoff bound ``exp(-n KL(f/n || p))`` is under
  ``failure_alpha``.

``z_detect`` is 4 (one-sided 3e-5 per test) because the tests run over and over: a healthy pool sees thousands of
overlapping windows, and a false alarm takes a pool out of traffic.

**Hysteresis.** A pool below the floor comes back only when, over the ``recovery_window`` requests since it went
below (a longer window, all of them new), the *lower* bounds (``z_recover``) of the pooled Spearman and of the top-k
mean are at or over the floor and the failures are few enough that the allowed rate is not exceeded with the same
confidence. Each transition clears the evidence it was decided on, so a stationary stream flips at most once and
never back within ``recovery_window`` requests. A pool sitting right at the floor stays where it is: neither bound
crosses it.

The running figures (pooled Spearman, per-request Spearman and top-k means with 95% intervals, the failure fraction
and the worst score difference) are what the guard exports.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from rerank_contracts.guard import Floor

from .compare import Agreement

State = Literal["healthy", "below_floor"]
#: The normal quantile of the exported intervals (95%, two-sided).
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Settings:
    """How much evidence a decision takes. The defaults meet the benchmark's targets (docs/quality-guard.md)."""

    window: int = 100
    min_samples: int = 30
    recovery_window: int = 300
    check_every: int = 5  # requests between two pooled-Spearman tests
    z_detect: float = 4.0
    z_recover: float = 2.0
    request_min_spearman: float = 0.5
    max_failure_rate: float = 0.02
    failure_alpha: float = 1e-6

    def __post_init__(self) -> None:
        if not 2 <= self.min_samples <= self.window:
            raise ValueError("need 2 <= min_samples <= window")
        if self.recovery_window < self.window:
            raise ValueError("the recovery window must be at least the detection window (hysteresis)")
        if self.check_every < 1:
            raise ValueError("check_every must be >= 1")
        if not 0.0 < self.max_failure_rate < 1.0 or not 0.0 < self.failure_alpha < 1.0:
            raise ValueError("max_failure_rate and failure_alpha must be within (0, 1)")
        # Recovery must show the failure rate under max_failure_rate with z_recover's confidence over the window: with
        # no failure at all, that takes n * KL(0 || p) = -n log(1 - p) >= -log(alpha). A shorter window could never
        # recover (2% and z 2: 187 requests).
        needed = math.ceil(math.log(_one_sided_alpha(self.z_recover)) / math.log(1.0 - self.max_failure_rate))
        if self.recovery_window < needed:
            raise ValueError(f"a recovery window of {self.recovery_window} requests can never show a failure rate "
                             f"under {self.max_failure_rate} at z {self.z_recover}: it needs at least {needed}")


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` values with a two-sided interval at the given normal quantile (NaN when n < 2)."""

    n: int
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class Figures:
    """The running figures over the detection window, for export."""

    requests: int
    spearman: Interval  # pooled over the window's pairs (the Job's statistic); n = requests pooled
    request_spearman: Interval  # mean of per-request Spearman
    topk: Interval
    failures: int
    failure_rate: float
    max_abs_diff: float


@dataclass(frozen=True)
class Status:
    state: State
    reason: str
    samples: int  # requests observed in all
    since: int  # the sample count at the last transition (0: never changed)
    transitions: int
    figures: Figures


class Window:
    """The last ``size`` values (NaN values count as requests, not as values), with their running sums."""

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self._sum = 0.0
        self._sq = 0.0
        self._n = 0
        self._updates = 0

    def push(self, x: float) -> None:
        if len(self.values) == self.values.maxlen:
            self._drop(self.values[0])
        self.values.append(x)
        if not math.isnan(x):
            self._sum += x
            self._sq += x * x
            self._n += 1
        self._updates += 1
        if self._updates % (4 * (self.values.maxlen or 1)) == 0:  # rebuild the sums now and then: no drift
            finite = [v for v in self.values if not math.isnan(v)]
            self._sum, self._sq, self._n = math.fsum(finite), math.fsum(v * v for v in finite), len(finite)

    def _drop(self, x: float) -> None:
        if not math.isnan(x):
            self._sum -= x
            self._sq -= x * x
            self._n -= 1

    def clear(self) -> None:
        self.values.clear()
        self._sum = self._sq = 0.0
        self._n = 0

    def __len__(self) -> int:
        return len(self.values)

    def interval(self, z: float) -> Interval:
        n = self._n
        if n == 0:
            return Interval(0, math.nan, math.nan, math.nan)
        mean = self._sum / n
        if n < 2:
            return Interval(n, mean, math.nan, math.nan)
        var = max(0.0, (self._sq - n * mean * mean) / (n - 1))
        half = z * math.sqrt(var / n)
        return Interval(n, mean, mean - half, mean + half)

    def total(self) -> float:
        return self._sum


class Pooled:
    """The last ``size`` requests' scores: their pooled Spearman and its delete-one-request jackknife interval."""

    def __init__(self, size: int) -> None:
        self.requests: deque[tuple[np.ndarray, np.ndarray] | None] = deque(maxlen=size)

    def push(self, a: Agreement) -> None:
        usable = a.passages >= 2 and a.nonfinite == 0
        self.requests.append((a.reference, a.pool) if usable else None)

    def clear(self) -> None:
        self.requests.clear()

    def __len__(self) -> int:
        return len(self.requests)

    def interval(self, z: float) -> Interval:
        pairs = [r for r in self.requests if r is not None]
        m = len(pairs)
        if m < 2:
            return Interval(m, math.nan, math.nan, math.nan)
        sizes = np.array([len(r) for r, _ in pairs])
        rx = average_ranks(np.concatenate([r for r, _ in pairs]))
        ry = average_ranks(np.concatenate([p for _, p in pairs]))
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
        per = np.stack([sizes.astype(np.float64)] + [np.add.reduceat(v, starts) for v in
                                                     (rx, ry, rx * rx, ry * ry, rx * ry)])  # [6, m]
        total = per.sum(axis=1, keepdims=True)
        rho = float(_pearson(total)[0])
        loo = _pearson(total - per)  # each request left out, the ranks held fixed
        ok = loo[np.isfinite(loo)]
        if not math.isfinite(rho) or ok.size < 2:
            return Interval(m, rho, math.nan, math.nan)
        half = z * math.sqrt((ok.size - 1) / ok.size * float(np.sum((ok - ok.mean()) ** 2)))
        return Interval(m, rho, rho - half, rho + half)


def average_ranks(x: np.ndarray) -> np.ndarray:
    """``quantizer_job.metrics.rankdata`` (ranks from 1, ties averaged) without its Python loop: the detector ranks
    1,500-4,500 pooled scores every few requests, where the loop costs milliseconds (tests check both agree)."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ordered = a[order]
    first = np.concatenate(([True], ordered[1:] != ordered[:-1]))  # each run of equal values starts here
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, a.size))
    ranks = np.empty(a.size, dtype=np.float64)
    ranks[order] = (starts + (lengths + 1) / 2.0)[np.cumsum(first) - 1]
    return ranks


def _pearson(s: np.ndarray) -> np.ndarray:
    """Pearson correlation from sums [n, x, y, xx, yy, xy] (rows), one per column; NaN where undefined."""
    n, x, y, xx, yy, xy = s
    with np.errstate(divide="ignore", invalid="ignore"):
        cov, vx, vy = xy - x * y / n, xx - x * x / n, yy - y * y / n
        out = cov / np.sqrt(vx * vy)
    return np.asarray(np.where((vx > 0) & (vy > 0), out, np.nan), dtype=np.float64)


def kl_bernoulli(q: float, p: float) -> float:
    """KL(Bernoulli(q) || Bernoulli(p)), 0 < p < 1."""
    out = 0.0
    if q > 0.0:
        out += q * math.log(q / p)
    if q < 1.0:
        out += (1.0 - q) * math.log((1.0 - q) / (1.0 - p))
    return out


def rate_exceeds(failures: float, n: int, p: float, alpha: float) -> bool:
    """``failures`` of ``n`` is too many for a rate of ``p``: the Chernoff tail bound is under ``alpha``."""
    q = failures / n if n else 0.0
    return n > 0 and q > p and n * kl_bernoulli(q, p) >= -math.log(alpha)


def rate_within(failures: float, n: int, p: float, alpha: float) -> bool:
    """``failures`` of ``n`` shows the rate is under ``p`` with confidence 1 - ``alpha`` (the mirror test)."""
    q = failures / n if n else 1.0
    return n > 0 and q < p and n * kl_bernoulli(q, p) >= -math.log(alpha)


def _one_sided_alpha(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


@dataclass
class Detector:
    """The sequential decision for one (model, pool). Feed it with :meth:`observe`; read :meth:`status`."""

    floor: Floor = field(default_factory=Floor)
    settings: Settings = field(default_factory=Settings)
    state: State = "healthy"
    reason: str = "no evidence yet"
    samples: int = 0
    since: int = 0
    transitions: int = 0

    def __post_init__(self) -> None:
        w = self.settings.window
        self._spearman, self._topk, self._failed, self._diff = Window(w), Window(w), Window(w), Window(w)
        self._pooled = Pooled(w)
        r = self.settings.recovery_window
        self._r_pooled, self._r_topk, self._r_failed = Pooled(r), Window(r), Window(r)

    def failed(self, a: Agreement) -> bool:
        """A request the pool got wrong by itself: broken scores, or a ranking that barely matches the reference."""
        return a.broken or (not math.isnan(a.spearman) and a.spearman < self.settings.request_min_spearman)

    def observe(self, a: Agreement) -> bool:
        """Add one sampled request; True when the state changed."""
        self.samples += 1
        fail = 1.0 if self.failed(a) else 0.0
        for w, x in ((self._spearman, a.spearman), (self._topk, a.topk), (self._failed, fail),
                     (self._diff, a.max_abs_diff)):
            w.push(x)
        self._pooled.push(a)
        if self.state == "healthy":
            why = self._below()
            if why:
                self._flip("below_floor", why)
                return True
            return False
        for w, x in ((self._r_topk, a.topk), (self._r_failed, fail)):
            w.push(x)
        self._r_pooled.push(a)
        why = self._recovered()
        if why:
            self._flip("healthy", why)
            return True
        return False

    def observe_all(self, agreements: Iterable[Agreement]) -> int:
        """Feed several; returns how many transitions they caused."""
        return sum(self.observe(a) for a in agreements)

    def _flip(self, state: State, reason: str) -> None:
        self.state, self.reason, self.since = state, reason, self.samples
        self.transitions += 1
        for w in (self._spearman, self._topk, self._failed, self._diff, self._pooled, self._r_pooled, self._r_topk,
                  self._r_failed):
            w.clear()

    def _due(self) -> bool:
        """Is the pooled Spearman tested at this request (every ``check_every`` since the last transition)?"""
        return (self.samples - self.since) % self.settings.check_every == 0

    def _below(self) -> str:
        s, f = self.settings, self.floor
        n = len(self._failed)
        if n < s.min_samples:
            return ""
        failures = self._failed.total()
        if rate_exceeds(failures, n, s.max_failure_rate, s.failure_alpha):
            return (f"{failures:.0f} of the last {n} sampled requests failed (broken scores or Spearman under "
                    f"{s.request_min_spearman}): more than {s.max_failure_rate:.0%} with confidence")
        ci = self._topk.interval(s.z_detect)
        if ci.n >= s.min_samples and ci.high < f.min_topk_agreement:
            return (f"mean top-k agreement {ci.mean:.4f} over {ci.n} sampled requests is below the floor "
                    f"{f.min_topk_agreement} (upper bound {ci.high:.4f})")
        if self._due():
            ci = self._pooled.interval(s.z_detect)
            if ci.n >= s.min_samples and ci.high < f.min_spearman:
                return (f"Spearman {ci.mean:.4f} over the pairs of {ci.n} sampled requests is below the floor "
                        f"{f.min_spearman} (upper bound {ci.high:.4f})")
        return ""

    def _recovered(self) -> str:
        s, f = self.settings, self.floor
        n = len(self._r_failed)
        if n < s.recovery_window or not self._due():
            return ""
        if not rate_within(self._r_failed.total(), n, s.max_failure_rate, _one_sided_alpha(s.z_recover)):
            return ""
        parts = [f"failures {self._r_failed.total():.0f}"]
        for name, ci, lim in (("Spearman", self._r_pooled.interval(s.z_recover), f.min_spearman),
                              ("top-k agreement", self._r_topk.interval(s.z_recover), f.min_topk_agreement)):
            if ci.n < s.min_samples:
                continue  # the traffic says nothing about it (e.g. requests of k passages or fewer)
            if not ci.low >= lim:
                return ""
            parts.append(f"{name} {ci.mean:.4f} (lower bound {ci.low:.4f}) >= {lim}")
        return f"over the last {n} sampled requests: " + ", ".join(parts)

    def figures(self) -> Figures:
        n = len(self._failed)
        failures = int(self._failed.total())
        diffs = [d for d in self._diff.values if not math.isnan(d)]
        return Figures(requests=n, spearman=self._pooled.interval(Z95), request_spearman=self._spearman.interval(Z95),
                       topk=self._topk.interval(Z95),
                       failures=failures, failure_rate=failures / n if n else math.nan,
                       max_abs_diff=max(diffs) if diffs else math.nan)

    def status(self) -> Status:
        return Status(state=self.state, reason=self.reason, samples=self.samples, since=self.since,
                      transitions=self.transitions, figures=self.figures())
