"""Typed, defaulted view of the parts of a RerankModel spec that the autoscaler reads.

The API server applies the CRD's defaults, but the operator also sees specs written before a field existed and
unit tests build specs by hand, so every default is repeated here and must stay identical to the CRD's
(`spec.autoscaling` in docs/design-notes.md); those the reconcile loop reads too are taken from spec.py.
Parsing happens once per timer tick; the policy then only sees these frozen dataclasses, never raw dicts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# Defaults this view shares with the reconcile loop's (spec.py): pool bounds, routing policy, and the three
# autoscaling knobs both read (``spec.Autoscaling``), defined once there.
from ..spec import DEFAULT_MAX_REPLICAS, DEFAULT_MIN_REPLICAS, ROUTING_POLICIES, Autoscaling, Routing, RoutingPolicy

Pool = Literal["gpu", "cpu"]
POOLS: tuple[Pool, Pool] = ("gpu", "cpu")


class InvalidAutoscalingSpec(ValueError):
    """The spec cannot be turned into a policy input (the operator should report it, not retry)."""


@dataclass(frozen=True)
class StepBehavior:
    """One direction of scaling: HPA-like stabilization window, largest change per decision, and cooldown."""

    stabilization_seconds: float
    max_step: int
    cooldown_seconds: float


@dataclass(frozen=True)
class Targets:
    """What "saturated" means. Latencies are TEI's end-to-end request p95 per pool."""

    gpu_latency_p95_ms: float = 250.0
    cpu_latency_p95_ms: float = 500.0
    queue_per_replica: float = 16.0
    gpu_memory_watermark: float = 0.9


@dataclass(frozen=True)
class Spillover:
    """How fast traffic moves to the CPU pool under GPU pressure, how fast it comes back, and the ceiling."""

    step_percent: int = 25
    recover_step_percent: int = 10
    max_cpu_percent: int = 100
    # Largest CPU scale-up per decision while it is sized for the GPU's measured excess (the GPU saturated and
    # waiting for replicas or at max); scaleUp.maxStep applies otherwise. The cooldown applies either way.
    surge_max_step: int = 32


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
    interval_seconds: float = 15.0
    replica_management: Literal["operator", "external"] = "operator"
    source: Literal["direct", "prometheus"] = "direct"
    stale_after_seconds: float = 60.0
    prometheus: PrometheusSettings = field(default_factory=PrometheusSettings)
    targets: Targets = field(default_factory=Targets)
    scale_up: StepBehavior = field(default_factory=lambda: StepBehavior(0.0, 2, 15.0))
    scale_down: StepBehavior = field(default_factory=lambda: StepBehavior(300.0, 1, 120.0))
    spillover: Spillover = field(default_factory=Spillover)
    routing_policy: RoutingPolicy = "gpu-first"
    fixed_gpu_percent: int = 100
    gpu: PoolBounds = field(default_factory=lambda: PoolBounds(False, 0, 0))
    cpu: PoolBounds = field(default_factory=lambda: PoolBounds(True, DEFAULT_MIN_REPLICAS,
                                                               DEFAULT_MAX_REPLICAS["cpu"]))

    def bounds(self, pool: Pool) -> PoolBounds:
        return self.gpu if pool == "gpu" else self.cpu

    def latency_target_ms(self, pool: Pool) -> float:
        return self.targets.gpu_latency_p95_ms if pool == "gpu" else self.targets.cpu_latency_p95_ms

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], prometheus: PrometheusSettings | None = None) -> AutoscalingSpec:
        """Read `spec.autoscaling`, `spec.routing` and the pools' bounds; raise InvalidAutoscalingSpec if unusable.

        A pool section that is absent means the pool is not deployed, except the CPU pool, which is the
        operator's baseline and exists unless `enabled: false`. ``prometheus`` is the server the platform chose
        (``endpoints.prometheus_for``): nothing in the model's spec ever names a host the operator calls.
        """
        auto = _section(spec, "autoscaling")
        metrics = _section(auto, "metrics")
        targets = _section(auto, "targets")
        spill = _section(auto, "spillover")
        routing = _section(spec, "routing")
        pools = _section(spec, "pools")
        weights = _section(routing, "weights")
        result = cls(
            enabled=bool(auto.get("enabled", Autoscaling.enabled)),
            interval_seconds=_number(auto, "intervalSeconds", Autoscaling.interval_seconds, minimum=1),
            replica_management=_choice(auto, "replicaManagement", Autoscaling.replica_management,
                                       ("operator", "external")),
            source=_choice(metrics, "source", "direct", ("direct", "prometheus")),
            stale_after_seconds=_number(metrics, "staleAfterSeconds", 60, minimum=1),
            prometheus=prometheus or PrometheusSettings(),
            targets=Targets(
                gpu_latency_p95_ms=_number(targets, "gpuLatencyP95Ms", 250, minimum=1),
                cpu_latency_p95_ms=_number(targets, "cpuLatencyP95Ms", 500, minimum=1),
                queue_per_replica=_number(targets, "queuePerReplica", 16, minimum=1),
                gpu_memory_watermark=_number(targets, "gpuMemoryWatermark", 0.9, minimum=0.01, maximum=1),
            ),
            scale_up=_behavior(_section(auto, "scaleUp"), 0, 2, 15),
            scale_down=_behavior(_section(auto, "scaleDown"), 300, 1, 120),
            spillover=Spillover(
                step_percent=int(_number(spill, "stepPercent", 25, minimum=1, maximum=100)),
                recover_step_percent=int(_number(spill, "recoverStepPercent", 10, minimum=1, maximum=100)),
                max_cpu_percent=int(_number(spill, "maxCpuPercent", 100, minimum=0, maximum=100)),
                surge_max_step=int(_number(spill, "surgeMaxStep", 32, minimum=1, maximum=1000)),
            ),
            routing_policy=_choice(routing, "policy", Routing.policy, ROUTING_POLICIES),
            fixed_gpu_percent=_fixed_gpu_percent(weights),
            gpu=_bounds(_section(pools, "gpu"), "gpu", present_by_default=False, present="gpu" in pools),
            cpu=_bounds(_section(pools, "cpu"), "cpu", present_by_default=True, present="cpu" in pools),
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


def _number(parent: Mapping[str, Any], key: str, default: float, *, minimum: float = 0,
            maximum: float | None = None) -> float:
    raw = parent.get(key, default)
    if raw is None:
        raw = default
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise InvalidAutoscalingSpec(f"{key} must be a number, got {raw!r}")
    try:
        value = float(raw)
    except ValueError as exc:
        raise InvalidAutoscalingSpec(f"{key} must be a number, got {raw!r}") from exc
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" + (f" and <= {maximum}" if maximum is not None else "")
        raise InvalidAutoscalingSpec(f"{key} must be {bounds}, got {raw!r}")
    return value


def _choice(parent: Mapping[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> Any:
    value = parent.get(key) or default
    if value not in allowed:
        raise InvalidAutoscalingSpec(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
    return value


def _behavior(section: Mapping[str, Any], stabilization: float, step: int, cooldown: float) -> StepBehavior:
    return StepBehavior(
        stabilization_seconds=_number(section, "stabilizationSeconds", stabilization),
        max_step=int(_number(section, "maxStep", step, minimum=1)),
        cooldown_seconds=_number(section, "cooldownSeconds", cooldown),
    )


def _bounds(section: Mapping[str, Any], pool: Pool, *, present_by_default: bool, present: bool) -> PoolBounds:
    enabled = bool(section.get("enabled", present or present_by_default))
    if not enabled:
        return PoolBounds(False, 0, 0)
    low = int(_number(section, "minReplicas", DEFAULT_MIN_REPLICAS))
    high = int(_number(section, "maxReplicas", max(low, DEFAULT_MAX_REPLICAS[pool])))
    if high < low:
        raise InvalidAutoscalingSpec(f"maxReplicas ({high}) is below minReplicas ({low})")
    if high < 1:
        raise InvalidAutoscalingSpec("an enabled pool needs maxReplicas >= 1")
    return PoolBounds(True, low, high)


def _fixed_gpu_percent(weights: Mapping[str, Any]) -> int:
    """The GPU share for the `fixed` policy; weights are relative (like Gateway API), so {3, 1} is 75%."""
    if not weights:
        return 100
    gpu = _number(weights, "gpu", 0)
    cpu = _number(weights, "cpu", 0)
    if gpu + cpu <= 0:
        raise InvalidAutoscalingSpec("routing.weights must not both be zero")
    return round(100 * gpu / (gpu + cpu))
