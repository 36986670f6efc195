"""Builders for autoscale tests: specs and signals from a few keyword arguments (fixtures by modification)."""

from __future__ import annotations

from typing import Any

from rerank_operator.core.autoscale.config import AutoscalingSpec
from rerank_operator.core.autoscale.signals import PoolSignals

NOW = 10_000.0


#: What the worked numbers in the tests' comments assume: the defaults before issue 12 (interval 15 s, scaleUp
#: maxStep 2 with a 15 s cooldown). Pinned so their arithmetic stays true; `spec(crd_defaults=True)` runs the CRD's.
WORKED: dict[str, Any] = {"intervalSeconds": 15, "scaleUp": {"maxStep": 2, "cooldownSeconds": 15}}


def spec(gpu: tuple[int, int] | None = (1, 4), cpu: tuple[int, int] | None = (1, 6), policy: str = "gpu-first",
         crd_defaults: bool = False, **autoscaling: Any) -> AutoscalingSpec:
    """A spec with the given pool bounds and spec.autoscaling fields over WORKED (or over nothing: the CRD's)."""
    if not crd_defaults:
        autoscaling = {**WORKED, **autoscaling,
                       "scaleUp": {**WORKED["scaleUp"], **autoscaling.get("scaleUp", {})}}
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
