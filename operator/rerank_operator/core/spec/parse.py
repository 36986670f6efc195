"""Parse a RerankModel's ``spec`` into the frozen dataclasses of ``core/spec/model.py``, section by section.

``parse`` refuses, with a ``SpecError`` naming the field and the offending value, what crds/rerankmodel.yaml refuses at
apply time and what would reach a command line or a child object unsafely (TEI flags outside ``tei_flags.ALLOWED``,
revisions and hub ids that read as flags or paths, negative quantities, requests above limits, ...): defence in depth,
because an object stored before a rule existed is never validated again. Fed any JSON it raises nothing but
``SpecError`` (tests/unit/operator/core/spec/test_spec_parse_property.py). The reconcile loop and the autoscaler parse
the same effective spec (``controllers/class_index.understand``), once per version of the model and of its class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rerank_operator.core.spec import fields, shapes
from rerank_operator.core.spec.model import (
    ConfigMapKeyRef,
    DataSource,
    HubAccess,
    ModelSource,
    QualityGate,
    Quantization,
    RequantizeOnDrift,
    RerankApi,
    RerankModelSpec,
    SpecError,
    Storage,
)
from rerank_operator.core.spec.quantities import parse_quantity
from rerank_operator.core.spec.serving import parse_autoscaling, parse_pool, parse_routing


def parse(spec: Mapping[str, Any]) -> RerankModelSpec:
    """Read a RerankModel's ``spec``; raise :class:`SpecError`, naming the field and its value, for anything the
    CRD's validation should have refused. Whatever JSON it is given, it raises nothing else."""
    try:
        return _parse(spec)
    except SpecError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, ArithmeticError, RecursionError) as exc:
        raise SpecError(f"spec cannot be read: {type(exc).__name__}: {exc}") from exc


def _api(section: Mapping[str, Any]) -> RerankApi:
    mode = fields.choice(section, "longDocuments", "api.longDocuments", "Truncate", ("Truncate", "Chunk"))
    return RerankApi(long_documents="chunk" if mode == "Chunk" else "truncate")


def _parse(spec: Mapping[str, Any]) -> RerankModelSpec:
    if not isinstance(spec, Mapping):
        raise SpecError(f"spec must be an object, got {fields.show(spec)}")
    model = _model(fields.obj(spec, "model", "model"))
    pools = fields.obj(spec, "pools", "pools")
    gpu_section = pools.get("gpu")
    quantization = _quantization(fields.obj(spec, "quantization", "quantization"))
    autoscaling = fields.obj(spec, "autoscaling", "autoscaling")
    parsed = RerankModelSpec(
        model=model,
        quantization=quantization,
        storage=_storage(fields.obj(spec, "storage", "storage")),
        cpu=parse_pool("cpu", fields.obj(pools, "cpu", "pools.cpu"), present=True),
        gpu=parse_pool("gpu", fields.obj(pools, "gpu", "pools.gpu"), present=gpu_section is not None),
        routing=parse_routing(fields.obj(spec, "routing", "routing")),
        autoscaling=parse_autoscaling(autoscaling),
        api=_api(fields.obj(spec, "api", "api")),
    )
    if not parsed.enabled_pools:
        raise SpecError("no pool is enabled")
    if parsed.scales_to_zero and not _can_wake(parsed):
        raise SpecError(SCALE_TO_ZERO_NEEDS)
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


#: The CRD's message for the same rule (crds/rerankmodel.yaml, the spec's rule on minReplicas 0). The effective spec
#: can scale to zero where the tenant's did not (a class's defaultMinReplicas 0), so the operator checks it again.
SCALE_TO_ZERO_NEEDS = ("every enabled pool at minReplicas 0 (scale to zero) needs autoscaling.enabled, "
                       "autoscaling.replicaManagement operator and routing.gateway: the activator that wakes the "
                       "model is reached through its HTTPRoute")


def _can_wake(parsed: RerankModelSpec) -> bool:
    """Whether a model at zero pods can be woken: the operator scales it (autoscaling on, replicas its own) and its
    HTTPRoute, which the activator is reached through, exists."""
    auto = parsed.autoscaling
    return auto.enabled and auto.replica_management == "operator" and parsed.routing.gateway is not None


# -- typed getters: each names the field and shows the offending value -------------------------------------------


def _data(section: Mapping[str, Any], path: str) -> DataSource | None:
    if not section:
        return None
    ref = fields.obj(section, "configMapRef", f"{path}.configMapRef")
    config_map = None
    if ref:
        name = fields.checked(ref, "name", f"{path}.configMapRef.name", shapes.dns_subdomain, "a ConfigMap name")
        key = fields.checked(ref, "key", f"{path}.configMapRef.key", shapes.config_key, "a ConfigMap key")
        if not name or not key:
            raise SpecError(f"{path}.configMapRef needs name and key")
        config_map = ConfigMapKeyRef(name, key)
    source = DataSource(config_map=config_map,
                        path=fields.checked(section, "path", f"{path}.path", shapes.volume_path,
                                            "a path inside the volume (no '.' or '..' segments)"))
    if (source.config_map is None) == (source.path is None):
        raise SpecError(f"{path} needs exactly one of configMapRef or path")
    return source


def _model(section: Mapping[str, Any]) -> ModelSource:
    source = ModelSource(
        id=fields.checked(section, "id", "model.id", shapes.hub_id,
                          "a hub repository id (organization/name; no '..' or '--')"),
        path=fields.checked(section, "path", "model.path", shapes.volume_path,
                            "a path inside the volume (no '.' or '..' segments)"),
        revision=fields.checked(section, "revision", "model.revision", shapes.revision,
                                "a revision (starting with a letter or digit; no '..', '//', or trailing '/' or '.')"),
        token_secret=fields.secret(fields.obj(section, "tokenSecretRef", "model.tokenSecretRef"),
                                   "model.tokenSecretRef",
                                   default_key="token"),
        trust_remote_code=fields.boolean(section, "trustRemoteCode", "model.trustRemoteCode", False),
        hub=_hub(fields.obj(section, "hub", "model.hub")),
    )
    if (source.id is None) == (source.path is None):
        raise SpecError("model needs exactly one of id or path")
    return source


def _hub(section: Mapping[str, Any]) -> HubAccess:
    """The class's hub access as the effective spec carries it (``model.hub``); the CRD checked the URLs."""
    return HubAccess(endpoint=fields.string(section, "endpoint", "model.hub.endpoint"),
                     proxy=fields.string(section, "proxy", "model.hub.proxy"),
                     no_proxy=fields.string(section, "noProxy", "model.hub.noProxy"))


def _quantization(section: Mapping[str, Any]) -> Quantization:
    gate = fields.obj(section, "qualityGate", "quantization.qualityGate")
    d = Quantization()
    operators = fields.strings(section, "operators", "quantization.operators") or list(d.operators)
    for op in operators:
        if not shapes.operator_type(op):
            raise SpecError(f"quantization.operators entry {op!r} is not an ONNX operator type such as MatMul")
    q = Quantization(
        enabled=fields.boolean(section, "enabled", "quantization.enabled", d.enabled),
        mode=fields.choice(section, "mode", "quantization.mode", d.mode, ("dynamic", "static")),
        target=fields.choice(section, "target", "quantization.target", d.target, ("auto", "avx512_vnni", "avx2",
                                                                                  "arm64")),
        recipe=fields.choice(section, "recipe", "quantization.recipe", d.recipe, ("auto", "fixed")),
        per_channel=fields.boolean(section, "perChannel", "quantization.perChannel", d.per_channel),
        reduce_range=fields.boolean(section, "reduceRange", "quantization.reduceRange", d.reduce_range),
        operators=tuple(operators),
        optimization_level=fields.choice(section, "optimizationLevel", "quantization.optimizationLevel",
                                         d.optimization_level, (0, 1, 2, 99)),
        quality_gate=QualityGate(
            min_spearman=fields.fraction(gate, "minSpearman", "quantization.qualityGate.minSpearman",
                                         d.quality_gate.min_spearman),
            min_topk_agreement=fields.fraction(gate, "minTopKAgreement", "quantization.qualityGate.minTopKAgreement",
                                               d.quality_gate.min_topk_agreement),
            topk=fields.integer(gate, "topK", "quantization.qualityGate.topK", d.quality_gate.topk, 1, 100),
        ),
        evaluation_data=_data(fields.obj(section, "evaluationData", "quantization.evaluationData"),
                              "quantization.evaluationData"),
        calibration_data=_data(fields.obj(section, "calibrationData", "quantization.calibrationData"),
                               "quantization.calibrationData"),
        image=fields.checked(section, "image", "quantization.image", shapes.image, "an image reference",
                             default=d.image) or d.image,
        resources=fields.resources(fields.obj(section, "resources", "quantization.resources"),
                                   "quantization.resources"),
        active_deadline_seconds=fields.integer(section, "activeDeadlineSeconds", "quantization.activeDeadlineSeconds",
                                               d.active_deadline_seconds, 1),
        backoff_limit=fields.integer(section, "backoffLimit", "quantization.backoffLimit", d.backoff_limit, 0),
        time_budget_seconds=d.time_budget_seconds,
        requantize_on_drift=_requantize_on_drift(fields.obj(section, "requantizeOnDrift",
                                                            "quantization.requantizeOnDrift")),
    )
    # Unset: the built-in budget, shrunk to fit a deadline the tenant shortened.
    budget = default_time_budget(q.active_deadline_seconds, d.time_budget_seconds)
    q = replace(q, time_budget_seconds=fields.integer(section, "timeBudgetSeconds", "quantization.timeBudgetSeconds",
                                                      budget, 1))
    if q.time_budget_seconds >= q.active_deadline_seconds:
        raise SpecError(f"quantization.timeBudgetSeconds {q.time_budget_seconds} must be below "
                        f"quantization.activeDeadlineSeconds {q.active_deadline_seconds}")
    return q


def _requantize_on_drift(section: Mapping[str, Any]) -> RequantizeOnDrift:
    d, path = RequantizeOnDrift(), "quantization.requantizeOnDrift"
    return RequantizeOnDrift(
        enabled=fields.boolean(section, "enabled", f"{path}.enabled", d.enabled),
        max_pairs=fields.integer(section, "maxPairs", f"{path}.maxPairs", d.max_pairs, 400, 20000),
        max_age_hours=fields.integer(section, "maxAgeHours", f"{path}.maxAgeHours", d.max_age_hours, 1, 2160),
        min_interval_hours=fields.integer(section, "minIntervalHours", f"{path}.minIntervalHours",
                                          d.min_interval_hours, 1,
                                          8760))


def default_time_budget(active_deadline_seconds: int, built_in: int) -> int:
    """The recipe search's budget when the tenant sets none: the built-in one, or three quarters of a shorter Job
    deadline. A CRD default would be filled in before the deadline is known, and a tenant who only shortens the
    deadline would then be refused for a budget they never wrote."""
    return min(built_in, max(1, active_deadline_seconds * 3 // 4))


ACCESS_MODES = ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod")


def _storage(section: Mapping[str, Any]) -> Storage:
    d = Storage()
    size = fields.string(section, "size", "storage.size", d.size) or d.size
    try:
        positive = parse_quantity(size) > 0
    except ValueError:
        positive = False
    if not positive:
        raise SpecError(f"storage.size {size!r} must be a positive quantity of bytes, e.g. 20Gi")
    modes = fields.strings(section, "accessModes", "storage.accessModes") or list(d.access_modes)
    for mode in modes:
        if mode not in ACCESS_MODES:
            raise SpecError(f"storage.accessModes entry {mode!r} is not one of {', '.join(ACCESS_MODES)}")
    if "ReadWriteOncePod" in modes and len(set(modes)) > 1:
        raise SpecError(f"storage.accessModes {modes}: ReadWriteOncePod cannot be combined with other modes")
    return Storage(
        size=size,
        storage_class_name=fields.checked(section, "storageClassName", "storage.storageClassName", shapes.dns_subdomain,
                                          "a StorageClass name"),
        access_modes=tuple(modes),
        existing_claim=fields.checked(section, "existingClaim", "storage.existingClaim", shapes.dns_subdomain,
                                      "a PersistentVolumeClaim name"),
        reclaim_policy=fields.choice(section, "reclaimPolicy", "storage.reclaimPolicy", d.reclaim_policy,
                                     ("Retain", "Delete")),
    )
