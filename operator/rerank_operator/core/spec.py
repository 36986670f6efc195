"""Typed, defaulted view of a RerankModel's spec, and the operator's own check of it.

``parse`` refuses, with a ``SpecError`` naming the field and the offending value, what crds/rerankmodel.yaml refuses
at apply time and what would reach a command line or a child object unsafely (TEI flags outside
``tei_flags.ALLOWED``, revisions and hub ids that read as flags or paths, negative quantities, requests above
limits, ...): defence in depth, because an object stored before a rule existed is never validated again. Fed any
JSON it raises nothing but ``SpecError`` (tests/unit/test_spec_parse_property.py).

The API server applies the CRD's defaults before the operator sees an object, but unit tests build specs by hand
and old objects may predate a field, so every default is repeated here; ``tests/unit/test_spec.py`` checks that
they match ``crds/rerankmodel.yaml``. Builders only ever see these frozen dataclasses, never raw dicts.
Fields a RerankClass can default (pool images, replicas and resources, the quantizer's image, mode, target, recipe
and quality gate) have no CRD default: the reconcile loop parses the effective spec (``tenant.resolve_model``, i.e.
``tenancy.resolve``), so a value comes from the model, else its class, else the built-in default here.
(``spec.autoscaling`` beyond the three knobs the reconcile loop needs is parsed by ``autoscale.config``.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal

from rerank_operator import __version__
from rerank_operator.core import names, shapes, tei_flags
from rerank_operator.core.quantities import parse_quantity

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
    min_spearman: float = 0.99
    min_topk_agreement: float = 0.9
    topk: int = 3


@dataclass(frozen=True)
class RequantizeOnDrift:
    """``quantization.requantizeOnDrift``: the tenant's consent to keep a sample of live queries (bounded, expiring)
    and to re-quantize on it when the guard finds the CPU pool drifting below the floor (``core/requantize.py``)."""

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
    """Read a RerankModel's ``spec``; raise :class:`SpecError`, naming the field and its value, for anything the
    CRD's validation should have refused. Whatever JSON it is given, it raises nothing else."""
    try:
        return _parse(spec)
    except SpecError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise SpecError(f"spec cannot be read: {type(exc).__name__}: {exc}") from exc


def _parse(spec: Mapping[str, Any]) -> RerankModelSpec:
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec must be an object, got {_show(spec)}")
    model = _model(_obj(spec, "model", "model"))
    pools = _obj(spec, "pools", "pools")
    gpu_section = pools.get("gpu")
    quantization = _quantization(_obj(spec, "quantization", "quantization"))
    parsed = RerankModelSpec(
        model=model,
        quantization=quantization,
        storage=_storage(_obj(spec, "storage", "storage")),
        cpu=parse_pool("cpu", _obj(pools, "cpu", "pools.cpu"), present=True),
        gpu=parse_pool("gpu", _obj(pools, "gpu", "pools.gpu"), present=gpu_section is not None),
        routing=parse_routing(_obj(spec, "routing", "routing")),
        autoscaling=parse_autoscaling(_obj(spec, "autoscaling", "autoscaling")),
    )
    if not parsed.enabled_pools:
        raise SpecError("no pool is enabled")
    if parsed.model.path is not None and parsed.storage.existing_claim is None:
        raise SpecError(f"model.path {parsed.model.path!r} needs storage.existingClaim (the volume holding it)")
    q = parsed.quantization
    if q.requantize_on_drift.enabled and parsed.routing.gateway is None:
        raise SpecError("quantization.requantizeOnDrift samples live traffic through the route's mirror: "
                        "set routing.gateway, or turn it off")
    if q.requantize_on_drift.enabled and q.recipe == "fixed" and q.mode == "dynamic":
        raise SpecError("quantization.requantizeOnDrift needs recipe auto or mode static: with a fixed dynamic "
                        "recipe a new Job makes the same artifact")
    return parsed


# -- typed getters: each names the field and shows the offending value -------------------------------------------
def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _obj(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path} must be an object, got {_show(value)}")
    return value


def _str(parent: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str | None:
    value = parent.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(f"{path} must be a non-empty string, got {_show(value)}")
    return value


def _checked(parent: Mapping[str, Any], key: str, path: str, ok: Callable[[str], bool], what: str,
             default: str | None = None) -> str | None:
    value = _str(parent, key, path, default)
    if value is not None and not ok(value):
        raise SpecError(f"{path} {value!r} is not {what}")
    return value


def _int(parent: Mapping[str, Any], key: str, path: str, default: int, minimum: int | None = None,
         maximum: int | None = None) -> int:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path} must be an integer, got {_show(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise SpecError(f"{path} must be within [{minimum}, {maximum}], got {value}")
    return value


def _number(parent: Mapping[str, Any], key: str, path: str, default: float, minimum: float) -> float:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{path} must be a number, got {_show(value)}")
    if value < minimum:
        raise SpecError(f"{path} must be at least {minimum:g}, got {_show(value)}")
    return float(value)


def _fraction(parent: Mapping[str, Any], key: str, path: str, default: float) -> float:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise SpecError(f"{path} must be a number in (0, 1], got {_show(value)}")
    return float(value)


def _bool(parent: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = parent.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"{path} must be true or false, got {_show(value)}")
    return value


def _choice(parent: Mapping[str, Any], key: str, path: str, default: str | int, allowed: tuple[str | int, ...]) -> Any:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or value not in allowed:  # True == 1: a boolean is never an allowed number
        raise SpecError(f"{path} must be one of {', '.join(map(str, allowed))}, got {_show(value)}")
    return value


def _list(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{path} must be a list, got {_show(value)}")
    return list(value)


def _strings(parent: Mapping[str, Any], key: str, path: str) -> list[str]:
    values = _list(parent, key, path)
    for v in values:
        if not isinstance(v, str):
            raise SpecError(f"{path} entries must be strings, got {_show(v)}")
    return values


# -- sections -----------------------------------------------------------------------------------------------------
def _secret(section: Mapping[str, Any], path: str, default_key: str | None = None) -> SecretKeyRef | None:
    if not section:
        return None
    name = _checked(section, "name", f"{path}.name", shapes.dns_subdomain, "a Secret name (a DNS subdomain)")
    key = _checked(section, "key", f"{path}.key", shapes.config_key, "a Secret key", default=default_key)
    if not name or not key:
        raise SpecError(f"{path} needs name and key")
    return SecretKeyRef(name=name, key=key)


def _data(section: Mapping[str, Any], path: str) -> DataSource | None:
    if not section:
        return None
    ref = _obj(section, "configMapRef", f"{path}.configMapRef")
    config_map = None
    if ref:
        name = _checked(ref, "name", f"{path}.configMapRef.name", shapes.dns_subdomain, "a ConfigMap name")
        key = _checked(ref, "key", f"{path}.configMapRef.key", shapes.config_key, "a ConfigMap key")
        if not name or not key:
            raise SpecError(f"{path}.configMapRef needs name and key")
        config_map = ConfigMapKeyRef(name, key)
    source = DataSource(config_map=config_map,
                        path=_checked(section, "path", f"{path}.path", shapes.volume_path,
                                      "a path inside the volume (no '.' or '..' segments)"))
    if (source.config_map is None) == (source.path is None):
        raise SpecError(f"{path} needs exactly one of configMapRef or path")
    return source


def _model(section: Mapping[str, Any]) -> ModelSource:
    source = ModelSource(
        id=_checked(section, "id", "model.id", shapes.hub_id,
                    "a hub repository id (organization/name; no '..' or '--')"),
        path=_checked(section, "path", "model.path", shapes.volume_path,
                      "a path inside the volume (no '.' or '..' segments)"),
        revision=_checked(section, "revision", "model.revision", shapes.revision,
                          "a revision (starting with a letter or digit; no '..', '//', or trailing '/' or '.')"),
        token_secret=_secret(_obj(section, "tokenSecretRef", "model.tokenSecretRef"), "model.tokenSecretRef",
                             default_key="token"),
        trust_remote_code=_bool(section, "trustRemoteCode", "model.trustRemoteCode", False),
        hub=_hub(_obj(section, "hub", "model.hub")),
    )
    if (source.id is None) == (source.path is None):
        raise SpecError("model needs exactly one of id or path")
    return source


def _hub(section: Mapping[str, Any]) -> HubAccess:
    """The class's hub access as the effective spec carries it (``model.hub``); the CRD checked the URLs."""
    return HubAccess(endpoint=_str(section, "endpoint", "model.hub.endpoint"),
                     proxy=_str(section, "proxy", "model.hub.proxy"),
                     no_proxy=_str(section, "noProxy", "model.hub.noProxy"))


def _resources(section: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Requests and limits as given, after checking what Kubernetes would refuse when the pod is written."""
    parsed: dict[str, dict[str, Decimal]] = {}
    for kind in ("requests", "limits"):
        values = _obj(section, kind, f"{path}.{kind}")
        parsed[kind] = {}
        for name, raw in values.items():
            try:
                amount = parse_quantity(raw)
            except ValueError:
                raise SpecError(f"{path}.{kind}.{name} {_show(raw)} is not a Kubernetes quantity") from None
            if amount < 0:
                raise SpecError(f"{path}.{kind}.{name} {raw} must not be negative")
            parsed[kind][str(name)] = amount
    for kind, values in parsed.items():
        for name in values:
            if not shapes.resource_name(name):
                raise SpecError(f"{path}.{kind}.{name} names a resource a container cannot request: use cpu, memory, "
                                "ephemeral-storage, hugepages-<size> or a qualified name such as nvidia.com/gpu")
    for name, amount in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and amount > limit:
            raise SpecError(f"{path}.requests.{name} {section['requests'][name]} is above "
                            f"{path}.limits.{name} {section['limits'][name]}")
        if shapes.extended_resource(name) and limit != amount:
            raise SpecError(f"{path}.requests.{name} {section['requests'][name]}: extended resources such as GPUs "
                            f"cannot be overcommitted: set the same value in {path}.limits (or only limits)")
    unknown = [str(k) for k in section if k not in ("requests", "limits")]
    if unknown:
        raise SpecError(f"{path} has {', '.join(unknown)}: only requests and limits are read")
    return {kind: dict(section[kind]) for kind in ("requests", "limits") if section.get(kind)}


def _quantization(section: Mapping[str, Any]) -> Quantization:
    gate = _obj(section, "qualityGate", "quantization.qualityGate")
    d = Quantization()
    operators = _strings(section, "operators", "quantization.operators") or list(d.operators)
    for op in operators:
        if not shapes.operator_type(op):
            raise SpecError(f"quantization.operators entry {op!r} is not an ONNX operator type such as MatMul")
    q = Quantization(
        enabled=_bool(section, "enabled", "quantization.enabled", d.enabled),
        mode=_choice(section, "mode", "quantization.mode", d.mode, ("dynamic", "static")),
        target=_choice(section, "target", "quantization.target", d.target, ("auto", "avx512_vnni", "avx2", "arm64")),
        recipe=_choice(section, "recipe", "quantization.recipe", d.recipe, ("auto", "fixed")),
        per_channel=_bool(section, "perChannel", "quantization.perChannel", d.per_channel),
        reduce_range=_bool(section, "reduceRange", "quantization.reduceRange", d.reduce_range),
        operators=tuple(operators),
        optimization_level=_choice(section, "optimizationLevel", "quantization.optimizationLevel",
                                   d.optimization_level, (0, 1, 2, 99)),
        quality_gate=QualityGate(
            min_spearman=_fraction(gate, "minSpearman", "quantization.qualityGate.minSpearman",
                                   d.quality_gate.min_spearman),
            min_topk_agreement=_fraction(gate, "minTopKAgreement", "quantization.qualityGate.minTopKAgreement",
                                         d.quality_gate.min_topk_agreement),
            topk=_int(gate, "topK", "quantization.qualityGate.topK", d.quality_gate.topk, 1, 100),
        ),
        evaluation_data=_data(_obj(section, "evaluationData", "quantization.evaluationData"),
                              "quantization.evaluationData"),
        calibration_data=_data(_obj(section, "calibrationData", "quantization.calibrationData"),
                               "quantization.calibrationData"),
        image=_checked(section, "image", "quantization.image", shapes.image, "an image reference",
                       default=d.image) or d.image,
        resources=_resources(_obj(section, "resources", "quantization.resources"), "quantization.resources"),
        active_deadline_seconds=_int(section, "activeDeadlineSeconds", "quantization.activeDeadlineSeconds",
                                     d.active_deadline_seconds, 1),
        backoff_limit=_int(section, "backoffLimit", "quantization.backoffLimit", d.backoff_limit, 0),
        time_budget_seconds=d.time_budget_seconds,
        requantize_on_drift=_requantize_on_drift(_obj(section, "requantizeOnDrift", "quantization.requantizeOnDrift")),
    )
    # Unset: the built-in budget, shrunk to fit a deadline the tenant shortened.
    budget = default_time_budget(q.active_deadline_seconds, d.time_budget_seconds)
    q = replace(q, time_budget_seconds=_int(section, "timeBudgetSeconds", "quantization.timeBudgetSeconds", budget, 1))
    if q.time_budget_seconds >= q.active_deadline_seconds:
        raise SpecError(f"quantization.timeBudgetSeconds {q.time_budget_seconds} must be below "
                        f"quantization.activeDeadlineSeconds {q.active_deadline_seconds}")
    return q


def _requantize_on_drift(section: Mapping[str, Any]) -> RequantizeOnDrift:
    d, path = RequantizeOnDrift(), "quantization.requantizeOnDrift"
    return RequantizeOnDrift(
        enabled=_bool(section, "enabled", f"{path}.enabled", d.enabled),
        max_pairs=_int(section, "maxPairs", f"{path}.maxPairs", d.max_pairs, 400, 20000),
        max_age_hours=_int(section, "maxAgeHours", f"{path}.maxAgeHours", d.max_age_hours, 1, 2160),
        min_interval_hours=_int(section, "minIntervalHours", f"{path}.minIntervalHours", d.min_interval_hours, 1,
                                8760))


def default_time_budget(active_deadline_seconds: int, built_in: int) -> int:
    """The recipe search's budget when the tenant sets none: the built-in one, or three quarters of a shorter Job
    deadline. A CRD default would be filled in before the deadline is known, and a tenant who only shortens the
    deadline would then be refused for a budget they never wrote."""
    return min(built_in, max(1, active_deadline_seconds * 3 // 4))


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _storage(section: Mapping[str, Any]) -> Storage:
    d = Storage()
    size = _str(section, "size", "storage.size", d.size) or d.size
    try:
        positive = parse_quantity(size) > 0
    except ValueError:
        positive = False
    if not positive:
        raise SpecError(f"storage.size {size!r} must be a positive quantity of bytes, e.g. 20Gi")
    modes = _strings(section, "accessModes", "storage.accessModes") or list(d.access_modes)
    for mode in modes:
        if mode not in ACCESS_MODES:
            raise SpecError(f"storage.accessModes entry {mode!r} is not one of {', '.join(ACCESS_MODES)}")
    if "ReadWriteOncePod" in modes and len(set(modes)) > 1:
        raise SpecError(f"storage.accessModes {modes}: ReadWriteOncePod cannot be combined with other modes")
    return Storage(
        size=size,
        storage_class_name=_checked(section, "storageClassName", "storage.storageClassName", shapes.dns_subdomain,
                                    "a StorageClass name"),
        access_modes=tuple(modes),
        existing_claim=_checked(section, "existingClaim", "storage.existingClaim", shapes.dns_subdomain,
                                "a PersistentVolumeClaim name"),
        reclaim_policy=_choice(section, "reclaimPolicy", "storage.reclaimPolicy", d.reclaim_policy,
                               ("Retain", "Delete")),
    )


def _tei(section: Mapping[str, Any], path: str, cpu: bool) -> TeiSettings:
    """``cpu``: the CPU pool, whose unset ``maxBatchTokens`` is left to the served artifact (None)."""
    d = TeiSettings()
    extra = _strings(section, "extraArgs", f"{path}.extraArgs")
    refused = tei_flags.refusals(extra, f"{path}.extraArgs")
    if refused:
        raise SpecError("; ".join(refused))
    return TeiSettings(
        max_batch_tokens=(None if cpu and section.get("maxBatchTokens") is None else
                          _int(section, "maxBatchTokens", f"{path}.maxBatchTokens", TEI_MAX_BATCH_TOKENS, 1)),
        max_concurrent_requests=_int(section, "maxConcurrentRequests", f"{path}.maxConcurrentRequests",
                                     d.max_concurrent_requests, 1),
        max_client_batch_size=_int(section, "maxClientBatchSize", f"{path}.maxClientBatchSize",
                                   d.max_client_batch_size, 1),
        auto_truncate=_bool(section, "autoTruncate", f"{path}.autoTruncate", d.auto_truncate),
        api_key_secret=_secret(_obj(section, "apiKeySecretRef", f"{path}.apiKeySecretRef"), f"{path}.apiKeySecretRef"),
        extra_args=tuple(extra),
    )


AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


def _placement(section: Mapping[str, Any], path: str) -> tuple[dict[str, str], tuple[dict[str, Any], ...],
                                                                 dict[str, Any] | None]:
    selector = dict(_obj(section, "nodeSelector", f"{path}.nodeSelector"))
    for key, value in selector.items():
        if not shapes.label_key(str(key)) or not isinstance(value, str) or not shapes.label_value(value):
            raise SpecError(f"{path}.nodeSelector {key}={_show(value)} is not a label key and value")
    tolerations = []
    for t in _list(section, "tolerations", f"{path}.tolerations"):
        if not isinstance(t, Mapping):
            raise SpecError(f"{path}.tolerations entries must be objects, got {_show(t)}")
        tolerations.append(dict(t))
    affinity = _obj(section, "affinity", f"{path}.affinity")
    unknown = [k for k in affinity if k not in AFFINITY_KINDS]
    if unknown:
        raise SpecError(f"{path}.affinity {', '.join(map(str, unknown))}: only {', '.join(AFFINITY_KINDS)} are allowed")
    return selector, tuple(tolerations), dict(affinity) if affinity else None


def parse_pool(name: names.PoolName, section: Mapping[str, Any], *, present: bool) -> Pool:
    """``spec.pools.<name>`` alone; ``present``: the section exists (an absent GPU section means no GPU pool)."""
    cpu = name == "cpu"
    path = f"pools.{name}"
    low = _int(section, "minReplicas", f"{path}.minReplicas", DEFAULT_MIN_REPLICAS, 0)
    # An unset maxReplicas is never below minReplicas: a default cannot make a spec contradict itself.
    high = _int(section, "maxReplicas", f"{path}.maxReplicas", max(low, DEFAULT_MAX_REPLICAS[name]), 1)
    if low > high:
        raise SpecError(f"{path}.minReplicas {low} is above {path}.maxReplicas {high}")
    selector, tolerations, affinity = _placement(section, path)
    resources = (_resources(_obj(section, "resources", f"{path}.resources"), f"{path}.resources")
                 if "resources" in section else dict(DEFAULT_CPU_RESOURCES if cpu else {}))
    return Pool(
        name=name,
        enabled=present and _bool(section, "enabled", f"{path}.enabled", True),
        image=_checked(section, "image", f"{path}.image", shapes.image, "an image reference",
                       default=TEI_CPU_IMAGE if cpu else TEI_GPU_IMAGE) or "",
        min_replicas=low,
        max_replicas=high,
        resources=resources,
        node_selector=selector,
        tolerations=tolerations,
        affinity=affinity,
        tei=_tei(_obj(section, "tei", f"{path}.tei"), f"{path}.tei", cpu),
        dtype=_choice(section, "dtype", f"{path}.dtype", "float16", ("float16", "float32")),
        allow_without_gpu_resource=_bool(section, "allowWithoutGPUResource", f"{path}.allowWithoutGPUResource", False),
    )


def _gateway(section: Mapping[str, Any]) -> Gateway | None:
    refs = _list(section, "parentRefs", "routing.gateway.parentRefs")
    if not refs:
        return None
    parents = []
    for ref in refs:
        if not isinstance(ref, Mapping):
            raise SpecError(f"routing.gateway.parentRefs entries must be objects, got {_show(ref)}")
        _checked(ref, "name", "routing.gateway.parentRefs[].name", shapes.dns_subdomain, "an object name")
        _checked(ref, "namespace", "routing.gateway.parentRefs[].namespace", shapes.dns_label,
                 "a namespace name (a DNS label)")
        parents.append(dict(ref))
    hostnames = _strings(section, "hostnames", "routing.gateway.hostnames")
    return Gateway(parent_refs=tuple(parents), hostnames=tuple(hostnames))


def parse_routing(section: Mapping[str, Any]) -> Routing:
    """``spec.routing`` alone (see ``parse_autoscaling``)."""
    weights = _obj(section, "weights", "routing.weights")
    return Routing(
        policy=_choice(section, "policy", "routing.policy", Routing.policy, ROUTING_POLICIES),
        weights=Weights(gpu=_int(weights, "gpu", "routing.weights.gpu", 0, 0, 100),
                        cpu=_int(weights, "cpu", "routing.weights.cpu", 0, 0, 100)) if weights else None,
        gateway=_gateway(_obj(section, "gateway", "routing.gateway")),
    )


def parse_autoscaling(section: Mapping[str, Any]) -> Autoscaling:
    """``spec.autoscaling`` alone (the autoscaler's unit tests and simulator build only this part of a spec)."""
    d = Autoscaling()
    metrics = _obj(section, "metrics", "autoscaling.metrics")
    targets = _obj(section, "targets", "autoscaling.targets")
    spill = _obj(section, "spillover", "autoscaling.spillover")
    t, sp = d.targets, d.spillover
    return Autoscaling(
        enabled=_bool(section, "enabled", "autoscaling.enabled", d.enabled),
        interval_seconds=_int(section, "intervalSeconds", "autoscaling.intervalSeconds", d.interval_seconds, 1),
        replica_management=_choice(section, "replicaManagement", "autoscaling.replicaManagement",
                                   d.replica_management, ("operator", "external")),
        source=_choice(metrics, "source", "autoscaling.metrics.source", d.source, ("direct", "prometheus")),
        stale_after_seconds=_number(metrics, "staleAfterSeconds", "autoscaling.metrics.staleAfterSeconds",
                                    d.stale_after_seconds, 1),
        targets=Targets(
            gpu_latency_p95_ms=_number(targets, "gpuLatencyP95Ms", "autoscaling.targets.gpuLatencyP95Ms",
                                       t.gpu_latency_p95_ms, 1),
            cpu_latency_p95_ms=_number(targets, "cpuLatencyP95Ms", "autoscaling.targets.cpuLatencyP95Ms",
                                       t.cpu_latency_p95_ms, 1),
            queue_per_replica=_number(targets, "queuePerReplica", "autoscaling.targets.queuePerReplica",
                                      t.queue_per_replica, 1),
            gpu_memory_watermark=_fraction(targets, "gpuMemoryWatermark", "autoscaling.targets.gpuMemoryWatermark",
                                           t.gpu_memory_watermark),
        ),
        scale_up=_behavior(_obj(section, "scaleUp", "autoscaling.scaleUp"), "autoscaling.scaleUp", d.scale_up),
        scale_down=_behavior(_obj(section, "scaleDown", "autoscaling.scaleDown"), "autoscaling.scaleDown",
                             d.scale_down),
        spillover=Spillover(
            step_percent=_int(spill, "stepPercent", "autoscaling.spillover.stepPercent", sp.step_percent, 1, 100),
            recover_step_percent=_int(spill, "recoverStepPercent", "autoscaling.spillover.recoverStepPercent",
                                      sp.recover_step_percent, 1, 100),
            max_cpu_percent=_int(spill, "maxCpuPercent", "autoscaling.spillover.maxCpuPercent", sp.max_cpu_percent,
                                 0, 100),
            surge_max_step=_int(spill, "surgeMaxStep", "autoscaling.spillover.surgeMaxStep", sp.surge_max_step,
                                1, 1000),
        ),
    )


def _behavior(section: Mapping[str, Any], path: str, d: StepBehavior) -> StepBehavior:
    return StepBehavior(
        stabilization_seconds=_number(section, "stabilizationSeconds", f"{path}.stabilizationSeconds",
                                      d.stabilization_seconds, 0),
        max_step=_int(section, "maxStep", f"{path}.maxStep", d.max_step, 1),
        cooldown_seconds=_number(section, "cooldownSeconds", f"{path}.cooldownSeconds", d.cooldown_seconds, 0),
    )
