"""Typed, defaulted view of a RerankModel's spec.

The API server applies the CRD's defaults before the operator sees an object, but unit tests build specs by hand
and old objects may predate a field, so every default is repeated here; ``tests/unit/test_spec.py`` checks that
they match ``crds/rerankmodel.yaml``. Builders only ever see these frozen dataclasses, never raw dicts.
Fields a RerankClass can default (pool images, replicas and resources, the quantizer's image, mode, target, recipe
and quality gate) have no CRD default: the reconcile loop parses the effective spec (``classes.resolve_model``, i.e.
``tenancy.resolve``), so a value comes from the model, else its class, else the built-in default here.
(``spec.autoscaling`` beyond the three knobs the reconcile loop needs is parsed by ``autoscale.config``.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from . import names

QUANTIZER_IMAGE = "ghcr.io/rerank-operator/rerank-quantizer:0.1.0"
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
class ModelSource:
    id: str | None = None
    path: str | None = None
    revision: str | None = None
    token_secret: SecretKeyRef | None = None

    @property
    def display(self) -> str:
        """What ``kubectl get`` shows: ``org/name@rev`` (short commit) or the volume path."""
        if self.id:
            return f"{self.id}@{self.revision[:12]}" if self.revision else self.id
        return self.path or ""


@dataclass(frozen=True)
class QualityGate:
    min_spearman: float = 0.99
    min_topk_agreement: float = 0.9
    topk: int = 3


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


@dataclass(frozen=True)
class Storage:
    size: str = DEFAULT_STORAGE_SIZE
    storage_class_name: str | None = None
    access_modes: tuple[str, ...] = DEFAULT_ACCESS_MODES
    existing_claim: str | None = None
    reclaim_policy: Literal["Retain", "Delete"] = "Retain"


@dataclass(frozen=True)
class TeiSettings:
    max_batch_tokens: int = 16384
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
class Autoscaling:
    """Only what the reconcile loop needs; the policy knobs are read by ``autoscale.config``."""

    enabled: bool = True
    interval_seconds: int = 15
    replica_management: Literal["operator", "external"] = "operator"


@dataclass(frozen=True)
class RerankModelSpec:
    model: ModelSource
    quantization: Quantization
    storage: Storage
    cpu: Pool
    gpu: Pool
    routing: Routing
    autoscaling: Autoscaling

    def pool(self, name: names.PoolName) -> Pool:
        return self.cpu if name == "cpu" else self.gpu

    @property
    def enabled_pools(self) -> tuple[Pool, ...]:
        return tuple(p for p in (self.cpu, self.gpu) if p.enabled)


def parse(spec: Mapping[str, Any]) -> RerankModelSpec:
    """Read a RerankModel's ``spec``; raise :class:`SpecError` for what the CRD's validation should have refused."""
    model = _model(_section(spec, "model"))
    pools = _section(spec, "pools")
    cpu_section = _section(pools, "cpu")
    gpu_section = pools.get("gpu")
    parsed = RerankModelSpec(
        model=model,
        quantization=_quantization(_section(spec, "quantization")),
        storage=_storage(_section(spec, "storage")),
        cpu=_pool("cpu", cpu_section, present=True),
        gpu=_pool("gpu", gpu_section or {}, present=gpu_section is not None),
        routing=_routing(_section(spec, "routing")),
        autoscaling=_autoscaling(_section(spec, "autoscaling")),
    )
    if not parsed.enabled_pools:
        raise SpecError("no pool is enabled")
    return parsed


def _section(parent: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{key} must be an object")
    return value


def _secret(section: Mapping[str, Any] | None, default_key: str | None = None) -> SecretKeyRef | None:
    if not section:
        return None
    key = section.get("key", default_key)
    if not section.get("name") or not key:
        raise SpecError("a Secret reference needs name and key")
    return SecretKeyRef(name=str(section["name"]), key=str(key))


def _data(section: Mapping[str, Any] | None) -> DataSource | None:
    if not section:
        return None
    ref = section.get("configMapRef")
    source = DataSource(
        config_map=ConfigMapKeyRef(str(ref["name"]), str(ref["key"])) if ref else None,
        path=section.get("path"),
    )
    if (source.config_map is None) == (source.path is None):
        raise SpecError("data needs exactly one of configMapRef or path")
    return source


def _model(section: Mapping[str, Any]) -> ModelSource:
    source = ModelSource(
        id=section.get("id"),
        path=section.get("path"),
        revision=section.get("revision"),
        token_secret=_secret(section.get("tokenSecretRef"), default_key="token"),
    )
    if (source.id is None) == (source.path is None):
        raise SpecError("model needs exactly one of id or path")
    return source


def _quantization(section: Mapping[str, Any]) -> Quantization:
    gate = _section(section, "qualityGate")
    d = Quantization()
    return Quantization(
        enabled=bool(section.get("enabled", d.enabled)),
        mode=section.get("mode", d.mode),
        target=section.get("target", d.target),
        recipe=section.get("recipe", d.recipe),
        per_channel=bool(section.get("perChannel", d.per_channel)),
        reduce_range=bool(section.get("reduceRange", d.reduce_range)),
        operators=tuple(section.get("operators") or d.operators),
        optimization_level=int(section.get("optimizationLevel", d.optimization_level)),
        quality_gate=QualityGate(
            min_spearman=float(gate.get("minSpearman", d.quality_gate.min_spearman)),
            min_topk_agreement=float(gate.get("minTopKAgreement", d.quality_gate.min_topk_agreement)),
            topk=int(gate.get("topK", d.quality_gate.topk)),
        ),
        evaluation_data=_data(section.get("evaluationData")),
        calibration_data=_data(section.get("calibrationData")),
        image=str(section.get("image", d.image)),
        resources=dict(section.get("resources") or {}),
        active_deadline_seconds=int(section.get("activeDeadlineSeconds", d.active_deadline_seconds)),
        backoff_limit=int(section.get("backoffLimit", d.backoff_limit)),
        time_budget_seconds=int(section.get("timeBudgetSeconds", d.time_budget_seconds)),
    )


def _storage(section: Mapping[str, Any]) -> Storage:
    d = Storage()
    return Storage(
        size=str(section.get("size", d.size)),
        storage_class_name=section.get("storageClassName"),
        access_modes=tuple(section.get("accessModes") or d.access_modes),
        existing_claim=section.get("existingClaim"),
        reclaim_policy=section.get("reclaimPolicy", d.reclaim_policy),
    )


def _tei(section: Mapping[str, Any]) -> TeiSettings:
    d = TeiSettings()
    return TeiSettings(
        max_batch_tokens=int(section.get("maxBatchTokens", d.max_batch_tokens)),
        max_concurrent_requests=int(section.get("maxConcurrentRequests", d.max_concurrent_requests)),
        max_client_batch_size=int(section.get("maxClientBatchSize", d.max_client_batch_size)),
        auto_truncate=bool(section.get("autoTruncate", d.auto_truncate)),
        api_key_secret=_secret(section.get("apiKeySecretRef")),
        extra_args=tuple(str(a) for a in section.get("extraArgs") or ()),
    )


def _pool(name: names.PoolName, section: Mapping[str, Any], *, present: bool) -> Pool:
    cpu = name == "cpu"
    default_resources = DEFAULT_CPU_RESOURCES if cpu else {}
    return Pool(
        name=name,
        enabled=present and bool(section.get("enabled", True)),
        image=str(section.get("image", TEI_CPU_IMAGE if cpu else TEI_GPU_IMAGE)),
        min_replicas=int(section.get("minReplicas", DEFAULT_MIN_REPLICAS)),
        max_replicas=int(section.get("maxReplicas", DEFAULT_MAX_REPLICAS[name])),
        resources=dict(section["resources"] if "resources" in section else default_resources),
        node_selector=dict(section.get("nodeSelector") or {}),
        tolerations=tuple(dict(t) for t in section.get("tolerations") or ()),
        affinity=dict(section["affinity"]) if section.get("affinity") else None,
        tei=_tei(_section(section, "tei")),
        dtype=section.get("dtype", "float16"),
        allow_without_gpu_resource=bool(section.get("allowWithoutGPUResource", False)),
    )


def _routing(section: Mapping[str, Any]) -> Routing:
    weights = section.get("weights")
    gateway = section.get("gateway")
    return Routing(
        policy=section.get("policy", Routing.policy),
        weights=Weights(gpu=int(weights["gpu"]), cpu=int(weights["cpu"])) if weights else None,
        gateway=Gateway(
            parent_refs=tuple(dict(p) for p in gateway.get("parentRefs") or ()),
            hostnames=tuple(gateway.get("hostnames") or ()),
        )
        if gateway and gateway.get("parentRefs")
        else None,
    )


def _autoscaling(section: Mapping[str, Any]) -> Autoscaling:
    d = Autoscaling()
    return Autoscaling(
        enabled=bool(section.get("enabled", d.enabled)),
        interval_seconds=int(section.get("intervalSeconds", d.interval_seconds)),
        replica_management=section.get("replicaManagement", d.replica_management),
    )
