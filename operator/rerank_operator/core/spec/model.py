"""Typed, defaulted view of a RerankModel's spec: the frozen dataclasses every builder and policy reads, never raw
dicts, and the built-in defaults.

Parsing lives beside it: ``spec_parse.parse`` (the model, quantization and storage; refusals as ``SpecError``),
``spec_serving`` (pools, routing, autoscaling) and ``spec_fields`` (the typed getters both use).

The API server applies the CRD's defaults before the operator sees an object, but unit tests build specs by hand and old
objects may predate a field, so every default is repeated here; ``tests/unit/operator/core/spec/test_spec_and_crd.py``
checks that they match ``crds/rerankmodel.yaml``. Fields a RerankClass can default (pool images, replicas and resources,
the quantizer's image, mode, target, recipe and quality gate) have no CRD default: the reconcile loop parses the
effective spec (``tenant.resolve_model``, i.e. ``tenancy.resolve``), so a value comes from the model, else its class,
else the built-in default here. (``spec.autoscaling`` beyond the three knobs the reconcile loop needs is parsed by
``autoscale.config``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rerank_contracts import quantize_job
from rerank_contracts.rerank_api import LongDocuments
from rerank_operator import __version__
from rerank_operator.core import names

QUANTIZER_IMAGE = f"ghcr.io/rerank-operator/rerank-quantizer:{__version__}"
TEI_CPU_IMAGE = "ghcr.io/huggingface/text-embeddings-inference:cpu-1.9"
TEI_GPU_IMAGE = "ghcr.io/huggingface/text-embeddings-inference:cuda-1.9"
DEFAULT_STORAGE_SIZE = "20Gi"
DEFAULT_ACCESS_MODES = ("ReadWriteOnce",)
DEFAULT_CPU_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}

# Pool bounds when neither the model nor its class sets them (no CRD default: a class may). autoscale.config
# reads these same constants, so the reconcile loop and the autoscaler cannot disagree about a pool's bounds.
DEFAULT_MIN_REPLICAS = 1
DEFAULT_MAX_REPLICAS: Mapping[str, int] = {"cpu": 4, "gpu": 2}

RoutingPolicy = Literal["gpu-first", "fixed", "cpu-only", "gpu-only"]
ROUTING_POLICIES: tuple[str, ...] = ("gpu-first", "fixed", "cpu-only", "gpu-only")


class SpecError(ValueError):
    """The spec cannot be served as written (the CRD should have refused it); retrying will not help."""


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class ConfigMapKeyRef:
    name: str
    key: str


@dataclass(frozen=True)
class DataSource:
    """JSONL pairs from a ConfigMap key or from a file on the volume (exactly one is set)."""

    config_map: ConfigMapKeyRef | None = None
    path: str | None = None


@dataclass(frozen=True)
class HubAccess:
    """How the quantization Job reaches the hub: the class's ``modelSources.hub`` (a tenant cannot set it: the
    effective spec carries the class's, ``tenancy.resolve``). Empty: huggingface.co directly."""

    endpoint: str | None = None
    proxy: str | None = None
    no_proxy: str | None = None


@dataclass(frozen=True)
class ModelSource:
    id: str | None = None
    path: str | None = None
    revision: str | None = None
    token_secret: SecretKeyRef | None = None
    #: Run the repository's own code (config.json ``auto_map``) in the Job; the class must allow it.
    trust_remote_code: bool = False
    hub: HubAccess = field(default_factory=HubAccess)

    @property
    def display(self) -> str:
        """What ``kubectl get`` shows: ``org/name@rev`` (short commit) or the volume path."""
        if self.id:
            return f"{self.id}@{self.revision[:12]}" if self.revision else self.id
        return self.path or ""


@dataclass(frozen=True)
class QualityGate:
    min_spearman: float = quantize_job.DEFAULT_MIN_SPEARMAN
    min_topk_agreement: float = quantize_job.DEFAULT_MIN_TOPK_AGREEMENT
    topk: int = 3


@dataclass(frozen=True)
class RequantizeOnDrift:
    """``quantization.requantizeOnDrift``: the tenant's consent to keep a sample of live queries (bounded, expiring)
    and to re-quantize on it when the guard finds the CPU pool drifting below the floor
    (``core/quality/requantize.py``)."""

    enabled: bool = False
    max_pairs: int = 1000
    max_age_hours: int = 168
    min_interval_hours: int = 24


@dataclass(frozen=True)
class Quantization:
    enabled: bool = True
    mode: Literal["dynamic", "static"] = "dynamic"
    target: Literal["auto", "avx512_vnni", "avx2", "arm64"] = "auto"
    recipe: Literal["auto", "fixed"] = "auto"
    per_channel: bool = True
    reduce_range: bool = False
    operators: tuple[str, ...] = ("MatMul",)
    optimization_level: int = 1
    quality_gate: QualityGate = field(default_factory=QualityGate)
    evaluation_data: DataSource | None = None
    calibration_data: DataSource | None = None
    image: str = QUANTIZER_IMAGE
    resources: Mapping[str, Any] = field(default_factory=dict)
    active_deadline_seconds: int = 3600
    backoff_limit: int = 2
    time_budget_seconds: int = 900
    requantize_on_drift: RequantizeOnDrift = field(default_factory=RequantizeOnDrift)
    #: Not a spec field: the re-quantization round on live traffic this spec is effective for ("": none), set by
    #: ``requantize.effective`` from the model's status. Part of the artifact's identity.
    live_round: str = ""


@dataclass(frozen=True)
class Storage:
    size: str = DEFAULT_STORAGE_SIZE
    storage_class_name: str | None = None
    access_modes: tuple[str, ...] = DEFAULT_ACCESS_MODES
    existing_claim: str | None = None
    reclaim_policy: Literal["Retain", "Delete"] = "Retain"


#: TEI's own ``--max-batch-tokens`` default: the GPU pool's, and the CPU pool's when its artifact does not report the
#: model's maximum input length.
TEI_MAX_BATCH_TOKENS = 16384


@dataclass(frozen=True)
class TeiSettings:
    #: ``--max-batch-tokens``; None (the CPU pool's default): the served model's maximum input length
    #: (``deployment.batch_tokens``).
    max_batch_tokens: int | None = TEI_MAX_BATCH_TOKENS
    max_concurrent_requests: int = 512
    max_client_batch_size: int = 32
    auto_truncate: bool = True
    api_key_secret: SecretKeyRef | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pool:
    name: names.PoolName
    enabled: bool
    image: str
    min_replicas: int = DEFAULT_MIN_REPLICAS
    max_replicas: int = DEFAULT_MAX_REPLICAS["cpu"]
    resources: Mapping[str, Any] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    tei: TeiSettings = field(default_factory=TeiSettings)
    dtype: Literal["float16", "float32"] = "float16"  # GPU pool only
    allow_without_gpu_resource: bool = False  # GPU pool only


@dataclass(frozen=True)
class Weights:
    gpu: int
    cpu: int


@dataclass(frozen=True)
class Gateway:
    parent_refs: tuple[Mapping[str, Any], ...]
    hostnames: tuple[str, ...] = ()


@dataclass(frozen=True)
class Routing:
    policy: RoutingPolicy = "gpu-first"
    weights: Weights | None = None
    gateway: Gateway | None = None


@dataclass(frozen=True)
class RerankApi:
    """``spec.api``: how the pool pods' front answers the Cohere and Jina shapes (``rerank_sampler.translation``)."""

    long_documents: LongDocuments = "truncate"


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


# Scale up by as much as 4 replicas per decision, with no cooldown (the HPA's default allows 4 pods per 15 s too);
# with the 5 s interval this is what benchmarks/autoscale_sim.py measured working (the earlier 15 s, +2, 15 s
# cooldown had 1.3x the violations on diurnal traffic with spikes: its `old_defaults` ablation row).
SCALE_UP = StepBehavior(stabilization_seconds=0.0, max_step=4, cooldown_seconds=0.0)
SCALE_DOWN = StepBehavior(stabilization_seconds=300.0, max_step=1, cooldown_seconds=120.0)
MetricsSource = Literal["direct", "prometheus"]


@dataclass(frozen=True)
class Autoscaling:
    """``spec.autoscaling``, every knob with its default (the CRD's: a unit test holds them equal). The reconcile
    loop reads the first three; ``autoscale.config.AutoscalingSpec`` derives the policy's view from the rest."""

    enabled: bool = True
    interval_seconds: int = 5
    replica_management: Literal["operator", "external"] = "operator"
    source: MetricsSource = "direct"
    stale_after_seconds: float = 60.0
    targets: Targets = field(default_factory=Targets)
    scale_up: StepBehavior = SCALE_UP
    scale_down: StepBehavior = SCALE_DOWN
    spillover: Spillover = field(default_factory=Spillover)
    #: ``autoscaling.idleSeconds``: with every enabled pool at minReplicas 0 (``RerankModelSpec.scales_to_zero``)
    #: the pools go to zero after this long without a request; ignored otherwise.
    idle_seconds: int = 900


@dataclass(frozen=True)
class RerankModelSpec:
    model: ModelSource
    quantization: Quantization
    storage: Storage
    cpu: Pool
    gpu: Pool
    routing: Routing
    autoscaling: Autoscaling
    api: RerankApi = field(default_factory=RerankApi)

    def pool(self, name: names.PoolName) -> Pool:
        return self.cpu if name == "cpu" else self.gpu

    @property
    def enabled_pools(self) -> tuple[Pool, ...]:
        return tuple(p for p in (self.cpu, self.gpu) if p.enabled)

    @property
    def scales_to_zero(self) -> bool:
        """Every enabled pool (at least one) has minReplicas 0: the model goes to zero pods after
        ``autoscaling.idle_seconds`` without a request and is woken through its HTTPRoute."""
        return all_at_zero(self.cpu, self.gpu)


class PoolFloor(Protocol):
    """What decides whether a pool may go to zero: a spec's :class:`Pool` or the autoscaler's bounds of one."""

    @property
    def enabled(self) -> bool: ...

    @property
    def min_replicas(self) -> int: ...


def all_at_zero(*pools: PoolFloor) -> bool:
    """Whether the enabled ones of ``pools`` (at least one) all have minReplicas 0: the one rule of "this model
    scales to zero" (``RerankModelSpec.scales_to_zero``, the autoscaler's idle period and ``may_sleep``)."""
    enabled = [p for p in pools if p.enabled]
    return bool(enabled) and all(p.min_replicas == 0 for p in enabled)
