"""The autoscaler's typed view of a RerankModel spec, derived from the one parser (``spec.py``).

spec.py parses and defaults every field once (its defaults are the CRD's:
tests/unit/operator/core/spec/test_spec_and_crd.py holds them equal); this module only derives what the policy needs
from the parsed spec: each pool's bounds, the GPU share of the ``fixed`` routing policy, and the Prometheus server the
platform chose. The policy then only sees these frozen dataclasses, never raw dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from rerank_operator.core import names
from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import serving as spec_serving
from rerank_operator.core.spec.model import (
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    SCALE_DOWN,
    SCALE_UP,
    MetricsSource,
    RoutingPolicy,
    Spillover,
    StepBehavior,
    Targets,
)

__all__ = ["POOLS", "AutoscalingSpec", "InvalidAutoscalingSpec", "Pool", "PoolBounds", "PrometheusSettings",
           "Spillover", "StepBehavior", "Targets"]

Pool = names.PoolName  # the pools, defined once (names.py)
POOLS = names.POOLS


class InvalidAutoscalingSpec(ValueError):
    """The spec cannot be turned into a policy input (the operator should report it, not retry)."""


@dataclass(frozen=True)
class PrometheusSettings:
    url: str | None = None
    gpu_memory_used_query: str | None = None
    gpu_memory_total_query: str | None = None


@dataclass(frozen=True)
class PoolBounds:
    enabled: bool
    min_replicas: int
    max_replicas: int

    def clamp(self, replicas: int) -> int:
        """Replicas a disabled pool must have (0) or the nearest count within [min, max]."""
        if not self.enabled:
            return 0
        return max(self.min_replicas, min(self.max_replicas, replicas))


@dataclass(frozen=True)
class AutoscalingSpec:
    enabled: bool = True
    interval_seconds: float = float(specs.Autoscaling.interval_seconds)
    replica_management: Literal["operator", "external"] = "operator"
    source: MetricsSource = "direct"
    stale_after_seconds: float = specs.Autoscaling.stale_after_seconds
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    targets: Targets = field(default_factory=Targets)
    scale_up: StepBehavior = SCALE_UP
    scale_down: StepBehavior = SCALE_DOWN
    spillover: Spillover = field(default_factory=Spillover)
    routing_policy: RoutingPolicy = "gpu-first"
    fixed_gpu_percent: int = 100
    gpu: PoolBounds = field(default_factory=lambda: PoolBounds(False, 0, 0))
    cpu: PoolBounds = field(default_factory=lambda: PoolBounds(True, DEFAULT_MIN_REPLICAS,
                                                               DEFAULT_MAX_REPLICAS["cpu"]))
    #: Scale to zero (``zero.py``): seconds without a request before the pools go to zero, for a model whose enabled
    #: pools are all at minReplicas 0; None for any other model, or when the operator has no activator to wake it.
    idle_seconds: float | None = None

    def bounds(self, pool: Pool) -> PoolBounds:
        return self.gpu if pool == "gpu" else self.cpu

    def latency_target_ms(self, pool: Pool) -> float:
        return self.targets.gpu_latency_p95_ms if pool == "gpu" else self.targets.cpu_latency_p95_ms

    @classmethod
    def from_model(cls, parsed: specs.RerankModelSpec, prometheus: PrometheusSettings | None = None
                   ) -> AutoscalingSpec:
        """The policy's view of a parsed spec; raise InvalidAutoscalingSpec if it cannot drive the policy.
        ``prometheus`` is the server the platform chose (``endpoints.prometheus_for``): nothing in the model's spec
        ever names a host the operator calls."""
        return cls._derive(parsed.autoscaling, parsed.routing, parsed.gpu, parsed.cpu, prometheus)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], prometheus: PrometheusSettings | None = None) -> AutoscalingSpec:
        """``from_model`` for the parts of a raw spec the autoscaler reads (``autoscaling``, ``routing``, ``pools``),
        parsed by spec_serving's section parsers, so unit tests and the simulator need no model section.

        A pool section that is absent means the pool is not deployed, except the CPU pool, which is the
        operator's baseline and exists unless `enabled: false`."""
        try:
            pools = _section(spec, "pools")
            return cls._derive(
                spec_serving.parse_autoscaling(_section(spec, "autoscaling")),
                spec_serving.parse_routing(_section(spec, "routing")),
                spec_serving.parse_pool("gpu", _section(pools, "gpu"), present="gpu" in pools),
                spec_serving.parse_pool("cpu", _section(pools, "cpu"), present=True),
                prometheus,
            )
        except specs.SpecError as exc:
            raise InvalidAutoscalingSpec(str(exc)) from exc

    @classmethod
    def _derive(cls, auto: specs.Autoscaling, routing: specs.Routing, gpu: specs.Pool, cpu: specs.Pool,
                prometheus: PrometheusSettings | None) -> AutoscalingSpec:
        result = cls(
            enabled=auto.enabled,
            interval_seconds=float(auto.interval_seconds),
            replica_management=auto.replica_management,
            source=auto.source,
            stale_after_seconds=auto.stale_after_seconds,
            prometheus=prometheus or PrometheusSettings(),
            targets=auto.targets,
            scale_up=auto.scale_up,
            scale_down=auto.scale_down,
            spillover=auto.spillover,
            routing_policy=routing.policy,
            fixed_gpu_percent=_fixed_gpu_percent(routing.weights),
            gpu=_bounds(gpu),
            cpu=_bounds(cpu),
            idle_seconds=float(auto.idle_seconds) if specs.all_at_zero(cpu, gpu) else None,
        )
        if not result.gpu.enabled and not result.cpu.enabled:
            raise InvalidAutoscalingSpec("both pools are disabled: nothing to scale or route")
        if result.source == "prometheus" and not result.prometheus.url:
            raise InvalidAutoscalingSpec("autoscaling.metrics.source is prometheus but the platform configured no "
                                         "Prometheus server")
        return result


def _section(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidAutoscalingSpec(f"{key} must be an object, got {type(value).__name__}")
    return value


def _bounds(pool: specs.Pool) -> PoolBounds:
    return PoolBounds(True, pool.min_replicas, pool.max_replicas) if pool.enabled else PoolBounds(False, 0, 0)


def _fixed_gpu_percent(weights: specs.Weights | None) -> int:
    """The GPU share for the `fixed` policy. The CRD makes the weights percentages that sum to 100, so the share is
    ``weights.gpu``; dividing by the sum keeps a spec that never met the CRD (a hand-written test spec) a valid
    split rather than a share above 100."""
    if weights is None:
        return 100
    if weights.gpu + weights.cpu <= 0:
        raise InvalidAutoscalingSpec("routing.weights must not both be zero")
    return round(100 * weights.gpu / (weights.gpu + weights.cpu))
