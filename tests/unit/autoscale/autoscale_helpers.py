"""Builders for autoscale tests: specs and signals from a few keyword arguments (fixtures by modification)."""

from __future__ import annotations

from typing import Any

from rerank_operator.autoscale.config import AutoscalingSpec
from rerank_operator.autoscale.signals import PoolSignals

NOW = 10_000.0


def spec(gpu: tuple[int, int] | None = (1, 4), cpu: tuple[int, int] | None = (1, 6), policy: str = "gpu-first",
         **autoscaling: Any) -> AutoscalingSpec:
    pools: dict[str, Any] = {}
    pools["gpu"] = {"enabled": False} if gpu is None else {"minReplicas": gpu[0], "maxReplicas": gpu[1]}
    pools["cpu"] = {"enabled": False} if cpu is None else {"minReplicas": cpu[0], "maxReplicas": cpu[1]}
    routing: dict[str, Any] = {"policy": policy}
    if "weights" in autoscaling:
        routing["weights"] = autoscaling.pop("weights")
    return AutoscalingSpec.from_spec({"pools": pools, "routing": routing, "autoscaling": autoscaling})


def pool(ready: int, rate: float = 50.0, p95: float | None = 80.0, queue: float = 0.0, at: float = NOW,
         memory: float | None = None, served: float | None = None) -> PoolSignals:
    """Fresh signals of a pool with `ready` replicas; `queue` is per replica."""
    return PoolSignals(ready_replicas=ready, scraped_replicas=ready, request_rate=rate,
                       success_rate=rate if served is None else served, failure_rate=0.0,
                       queue_size=queue * ready, latency_p50_ms=None if p95 is None else p95 / 2,
                       latency_p95_ms=p95, gpu_memory_fraction=memory, sampled_at=at)
