"""What controllers see: TEI's metrics as scraped (`Scrape`) and one run's state as its controller may read it
(`View`). Every decision is made from what passes through here, so the policy and the baselines differ in how they
read the same scrapes (the direct source's deltas, Prometheus' rate() and instant vectors), never in what there is
to read; only the bounds read the true trace and backlog, and say so."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from rerank_operator.core.autoscale import exposition
from rerank_operator.core.autoscale.signals import PoolSignals

SCRAPE_S = 15            # Prometheus scrape interval (production default), and the direct source's tick
RATE_WINDOW_S = 60       # rate(...[1m]) for the Prometheus-fed baselines (production default)
BASELINE_LAG_S = 8       # HPA/KEDA sync relative to the scrape (production: not aligned with it)
# The three are the baselines' defaults; --baseline-period-s, --baseline-lag-s and --rate-window-s change them, so
# that the baselines can also be compared at the policy's own cadence (its 5 s ticks right after its own scrape).
TEI_BUCKETS = np.array([1e-5 * 1.5 ** k for k in range(1, 36)])
TEI_BOUNDS = (*(float(b) for b in TEI_BUCKETS), math.inf)


@dataclass(frozen=True)
class Scrape:
    """Pool-level te_* values at one successful scrape (counters summed over the pool's pods)."""

    time: int
    ready: int
    requests: float
    success: float
    failure: float
    queue: float
    buckets: np.ndarray  # cumulative counts per TEI bound (the +Inf bucket is `requests - failure`)


@dataclass
class View:
    """One simulation's state as its controller is allowed to see it."""

    now: int
    ready: list[int]
    starting: list[int]
    intent: list[int]           # replicas last asked for (the Deployments' spec.replicas)
    cpu_share: float            # share last asked for (the route's weight)
    scrapes: list[deque]        # per pool, recent successful scrapes, oldest first
    failed: list[bool]          # the latest scrape of each pool failed
    trace: np.ndarray | None = None  # the true arrival rate per second: for the bounds only
    backlog: tuple[float, float] = (0.0, 0.0)  # the true requests waiting per pool: for the bounds only
    rate_window: int = RATE_WINDOW_S  # the range of the baselines' rate(...[window])

    def direct(self, pool: int) -> PoolSignals:
        """Signals as the direct source computes them at a tick right after its scrape."""
        ready = self.ready[pool]
        if ready <= 0:
            return PoolSignals(ready_replicas=0)
        if self.failed[pool] or not self.scrapes[pool]:
            return PoolSignals(ready_replicas=ready, error="no pod answered /metrics")
        now = self.scrapes[pool][-1]
        if len(self.scrapes[pool]) < 2 or self.scrapes[pool][-2].ready <= 0:
            return PoolSignals(ready_replicas=ready, scraped_replicas=ready, queue_size=now.queue,
                               sampled_at=float(now.time))
        before = self.scrapes[pool][-2]
        span = max(now.time - before.time, 1)
        delta = exposition.Histogram(dict(zip(TEI_BOUNDS, [*(now.buckets - before.buckets).tolist(),
                                                            (now.requests - now.failure)
                                                            - (before.requests - before.failure)], strict=True)),
                                     now.requests - before.requests, 0.0)
        p95 = exposition.quantile(0.95, delta)
        return PoolSignals(
            ready_replicas=ready, scraped_replicas=ready,
            request_rate=(now.requests - before.requests) / span,
            success_rate=(now.success - before.success) / span,
            failure_rate=(now.failure - before.failure) / span,
            queue_size=now.queue, latency_p95_ms=None if p95 is None else p95 * 1000,
            sampled_at=float(now.time))

    def prom_rate(self, pool: int) -> float | None:
        """rate(te_request_count[window]) summed over the pool, as Prometheus computes it from its samples."""
        window = [s for s in self.scrapes[pool] if self.now - s.time <= self.rate_window]
        if len(window) < 2:
            return None
        return (window[-1].requests - window[0].requests) / max(window[-1].time - window[0].time, 1)

    def prom_queue(self, pool: int) -> float | None:
        """The last scraped te_queue_size of the pool (Prometheus' instant vector, 5 min staleness)."""
        recent = [s for s in self.scrapes[pool] if self.now - s.time <= 300]
        return recent[-1].queue if recent else None


Action = tuple[int, int, float]   # GPU replicas, CPU replicas, CPU share
Controller = Callable[[View], Action]
