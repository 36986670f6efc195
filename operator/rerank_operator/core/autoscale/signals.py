"""What the policy knows about each pool at one moment, and whether it is recent enough to act on.

Both sources (direct scrape, Prometheus) produce these values, so the policy never depends on where numbers came
from. Rates and quantiles describe the interval between two observations (the histogram delta), never the
lifetime of a pod: a pod that was slow an hour ago must not look slow now.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rerank_operator.core.autoscale.exposition import Histogram


@dataclass(frozen=True)
class PoolSignals:
    """Aggregated load of one pool. ``None`` means "not measured" (not zero)."""

    ready_replicas: int
    scraped_replicas: int = 0
    request_rate: float | None = None      # requests arriving per second (te_request_count)
    success_rate: float | None = None      # requests completed per second (te_request_success)
    failure_rate: float | None = None      # failures per second (te_request_failure)
    queue_size: float | None = None        # sum of te_queue_size over the pool's pods
    latency_p50_ms: float | None = None    # te_request_duration
    latency_p95_ms: float | None = None
    queue_time_p95_ms: float | None = None  # te_request_queue_duration
    gpu_memory_fraction: float | None = None
    pair_rate: float | None = None         # query-passage pairs scored per second (te_batch_next_size's sum)
    # The interval's te_request_duration buckets summed over the pool (counts or rates: only their shape is used),
    # for the share of requests slower than the target (the SLO's counters); not recorded in the status.
    latency: Histogram | None = field(default=None, compare=False, repr=False)
    sampled_at: float | None = None        # unix seconds of the newest observation used
    error: str | None = None               # why the source could not measure, if it could not

    @property
    def queue_per_replica(self) -> float | None:
        if self.queue_size is None:
            return None
        return self.queue_size / max(self.scraped_replicas or self.ready_replicas, 1)

    def staleness(self, now: float, stale_after_seconds: float) -> str | None:
        """Why these signals cannot be acted on, or None if they can.

        A pool without ready replicas needs no metrics: there is nothing to scrape and the policy decides from
        readiness alone. Otherwise the rate must be known (it needs two observations) and recent.
        """
        if self.ready_replicas <= 0:
            return None
        if self.error:
            return self.error
        if self.sampled_at is None or self.request_rate is None:
            return "no complete sample yet (rates need two scrapes)"
        age = now - self.sampled_at
        if age > stale_after_seconds:
            return f"last sample {age:.0f}s old (> {stale_after_seconds:.0f}s)"
        return None

    def to_status(self) -> dict[str, Any]:
        """camelCase dict for `status.autoscaling.signals.<pool>`; unmeasured values are omitted."""
        values: dict[str, Any] = {
            "readyReplicas": self.ready_replicas,
            "scrapedReplicas": self.scraped_replicas,
            "requestRate": _round(self.request_rate, 3),
            "failureRate": _round(self.failure_rate, 3),
            "queueSize": _round(self.queue_size, 1),
            "latencyP50Ms": _round(self.latency_p50_ms, 1),
            "latencyP95Ms": _round(self.latency_p95_ms, 1),
            "queueTimeP95Ms": _round(self.queue_time_p95_ms, 1),
            "gpuMemoryFraction": _round(self.gpu_memory_fraction, 3),
            "error": self.error,
        }
        return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class ActivatorDemand:
    """What the activator says of one model (``GET /pending``): requests it holds now, and when the last one came
    (unix seconds). Only models at or going to zero have any (``zero.py``)."""

    waiting: int = 0
    last: float | None = None


@dataclass(frozen=True)
class Signals:
    gpu: PoolSignals = field(default_factory=lambda: PoolSignals(ready_replicas=0))
    cpu: PoolSignals = field(default_factory=lambda: PoolSignals(ready_replicas=0))
    # Pools the quality guard finds below the model's quality floor (core/quality/assessment.py): routing keeps traffic
    # away from them while the other pool can serve (split.effective_policy).
    below_floor: frozenset[str] = frozenset()
    # The activator's view of the model (scale to zero); None when it says nothing of it or there is none.
    activator: ActivatorDemand | None = None

    def pool(self, pool: str) -> PoolSignals:
        """One pool's signals; a name that is not a pool is a KeyError, never the other pool's numbers."""
        return {"gpu": self.gpu, "cpu": self.cpu}[pool]

    @property
    def total_request_rate(self) -> float:
        """Arrivals over both pools: the demand the GPU pool would see at 100% weight."""
        return (self.gpu.request_rate or 0.0) + (self.cpu.request_rate or 0.0)

    def to_status(self) -> dict[str, Any]:
        return {"gpu": self.gpu.to_status(), "cpu": self.cpu.to_status()}


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
