"""What a model's pools cost, from the platform's prices (RerankClass ``spec.pricing``), and what the same load would
have cost on the GPU pool alone. Pure: the autoscaler's loop meters each model every tick and exports the result.

The cost model is the simulator's (``benchmarks/autoscale_sim``): replica-time x price per replica-hour, counting every
pod a pool's Deployment has, ready or starting (a starting pod is billed too). tests/unit/operator/core/test_cost.py
holds the two within 1% on the same trace.

The counterfactual ("GPU only") is what the CPU INT8 pool is for: the GPU replicas that would serve the model's whole
load within target, sized like the autoscaler sizes pools (``load.UTILIZATION`` of a replica's capacity), never
fewer than the GPU pool's minimum or one. A replica's capacity is the one the model's GPU pool has shown at its
target (learned by the policy), else the platform's measured figure (``pricing.gpuReplicaRequestsPerSecond``); with
neither the comparison is unknown and nothing is counted, rather than a guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rerank_operator.core import names, slo
from rerank_operator.core.autoscale import config
from rerank_operator.core.autoscale.load import UTILIZATION
from rerank_operator.core.autoscale.signals import Signals

SECONDS_PER_HOUR = 3600.0
METER_GAP_TICKS = 3.0  # a metering interval longer than this many ticks (a pause, a new leader) is cut to it


@dataclass(frozen=True)
class Pricing:
    """A RerankClass's prices per replica-hour (None: that pool is not priced, it costs nothing here)."""

    currency: str = "USD"
    gpu_replica_hour: float | None = None
    cpu_replica_hour: float | None = None
    gpu_requests_per_second: float | None = None  # the platform's measured GPU replica capacity

    @classmethod
    def from_class(cls, class_spec: Mapping[str, Any] | None) -> Pricing | None:
        """The class's ``spec.pricing``; None when the class sets no price (no cost figures at all)."""
        raw = (class_spec or {}).get("pricing") or {}
        gpu, cpu = _price(raw.get("gpuReplicaHour")), _price(raw.get("cpuReplicaHour"))
        if gpu is None and cpu is None:
            return None
        capacity = _price(raw.get("gpuReplicaRequestsPerSecond"))
        return cls(str(raw.get("currency") or "USD"), gpu, cpu, capacity if capacity else None)

    def per_replica_hour(self, pool: names.PoolName) -> float:
        price = self.gpu_replica_hour if pool == "gpu" else self.cpu_replica_hour
        return price or 0.0


def _price(value: Any) -> float | None:
    """A non-negative finite number, or None (the CRD refuses anything else; a hand-made object must not crash)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) and number >= 0 else None


@dataclass(frozen=True)
class Usage:
    """One metering interval of one model: how long, the pods each pool had, the GPU-only replicas it would need."""

    seconds: float
    replicas: Mapping[str, int]
    gpu_only_replicas: int | None = None


@dataclass(frozen=True)
class Accrued:
    """The cost of one interval, per pool and for the GPU-only counterfactual (None: unknown)."""

    pools: Mapping[str, float]
    gpu_only: float | None

    @property
    def total(self) -> float:
        return sum(self.pools.values())


def accrue(pricing: Pricing, usage: Usage) -> Accrued:
    """Replica-time x price for each pool over ``usage.seconds`` (replicas held constant over the interval)."""
    hours = max(usage.seconds, 0.0) / SECONDS_PER_HOUR
    pools: dict[str, float] = {pool: usage.replicas.get(pool, 0) * pricing.per_replica_hour(pool) * hours
                               for pool in names.POOLS}
    gpu_only = (None if usage.gpu_only_replicas is None
                else usage.gpu_only_replicas * pricing.per_replica_hour("gpu") * hours)
    return Accrued(pools, gpu_only)


def gpu_only_replicas(request_rate: float, capacity: float | None, min_replicas: int = 1) -> int | None:
    """GPU replicas that would serve ``request_rate`` alone at the autoscaler's sizing utilization; None when no
    capacity is known."""
    if capacity is None or not capacity > 0 or not math.isfinite(request_rate):
        return None
    needed = math.ceil(max(request_rate, 0.0) / (capacity * UTILIZATION) - 1e-9)
    return max(needed, min_replicas, 1)


def gpu_capacity(learned: float | None, pricing: Pricing, saturated: bool = True) -> float | None:
    """The GPU replica capacity for the counterfactual: what the model's own pool has shown at its target
    (``saturated``), else the platform's figure. A capacity seen only below target is a lower bound (the pool was
    never pushed): it overstates the GPU replicas needed, so it only raises the platform's figure and never stands
    alone (the saving would be overstated)."""
    known = learned if learned is not None and learned > 0 else None
    if known is not None and saturated:
        return known
    platform = pricing.gpu_requests_per_second
    if platform is None:
        return None
    return max(platform, known or 0.0)


def summary(pricing: Pricing, replicas: Mapping[str, int], gpu_only: int | None) -> dict[str, Any]:
    """``status.cost``: the hourly rate of what the pools have now, and of the GPU-only comparison."""
    hourly = accrue(pricing, Usage(SECONDS_PER_HOUR, replicas, gpu_only))
    out: dict[str, Any] = {
        "currency": pricing.currency,
        "perHour": _money(hourly.total),
        "pools": {pool: {"replicas": replicas.get(pool, 0), "perHour": _money(hourly.pools[pool])}
                  for pool in names.POOLS if replicas.get(pool, 0) or pricing.per_replica_hour(pool)},
    }
    if hourly.gpu_only is not None:
        out["gpuOnlyPerHour"] = _money(hourly.gpu_only)
        if hourly.gpu_only > 0:
            out["savedPercent"] = round(100 * (hourly.gpu_only - hourly.total) / hourly.gpu_only)
    return out


def _money(value: float) -> str:
    """Amounts as strings (four decimals): a status field that never loses precision to a float's rendering."""
    return f"{value:.4f}"


# --- metering one tick ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PoolReading:
    """One pool's figures for this tick: its gauges (pods, bound, latency target) and the requests it served."""

    pool: names.PoolName
    replicas: int
    max_replicas: int
    target_seconds: float
    served: slo.Served | None


@dataclass(frozen=True)
class Metered:
    """What one tick of one model exports: each pool's reading, the cost accrued since the last tick (None: no price
    or no time yet) and the GPU replicas the whole load would need alone (None: unknown)."""

    pools: tuple[PoolReading, ...]
    accrued: Accrued | None
    gpu_only: int | None


def metered_seconds(last: float | None, now: float, interval: float) -> float:
    """The span a tick accounts for: since this process's last look, cut to METER_GAP_TICKS intervals (a standby
    that just took over, or a paused process, starts afresh rather than billing time it did not see)."""
    return 0.0 if last is None else min(max(now - last, 0.0), METER_GAP_TICKS * interval)


def meter(auto: config.AutoscalingSpec, replicas: Mapping[str, int], signals: Signals | None,
          seconds: float, pricing: Pricing | None, learned_gpu_capacity: float | None = None,
          saturated: bool = False) -> Metered:
    """One tick's metering of one model, from the pods each pool has (``replicas``: every pod of the Deployment,
    ready or starting), the signals when they were measured, and the GPU capacity the policy learned."""
    readings = []
    for pool in config.POOLS:
        bounds = auto.bounds(pool)
        if not bounds.enabled and not replicas.get(pool, 0):
            continue
        target = auto.latency_target_ms(pool) / 1000
        served = None if signals is None else slo.served(signals.pool(pool), target, seconds)
        readings.append(PoolReading(pool, replicas.get(pool, 0), bounds.max_replicas, target, served))
    if pricing is None:
        return Metered(tuple(readings), None, None)
    gpu_only = None
    measured = signals is not None and all(signals.pool(pool).request_rate is not None for pool in config.POOLS
                                           if signals.pool(pool).ready_replicas > 0)
    if signals is not None and measured:
        capacity = gpu_capacity(learned_gpu_capacity, pricing, saturated=saturated)
        gpu_only = gpu_only_replicas(signals.total_request_rate, capacity, auto.gpu.min_replicas)
    accrued = accrue(pricing, Usage(seconds, replicas, gpu_only)) if seconds > 0 else None
    return Metered(tuple(readings), accrued, gpu_only)
