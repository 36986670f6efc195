"""Double-check of an effective spec against its RerankClass. The API server already refuses these
(policies/rerankmodel-class-policy.yaml, same wording); the operator reports them in condition
``ClassCompliant`` because a class may be tightened after a model was admitted. Pure.

One case table, tests/class_policy_cases.py, runs against both this module and the policy, so they cannot drift."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.spec import quantities
from rerank_operator.core.tenancy import lookups as fields

Obj = Mapping[str, Any]

# The CRDs' defaults (crds/rerankmodel.yaml autoscaling.idleSeconds, crds/rerankclass.yaml scaleToZero), for objects
# that predate the fields; the admission policy spells the same defaults.
IDLE_SECONDS = 900
MIN_IDLE_SECONDS = 300
MAX_IDLE_SECONDS = 86400


def violations(effective_spec: Obj, class_spec: Obj, class_name: str = "of this model") -> list[str]:
    """Everything in ``effective_spec`` its class does not allow, one message each, worded like the admission policy."""
    found: list[str] = []
    where = f"RerankClass {class_name}"
    enabled: list[Obj] = []
    for pool in names.POOLS:
        spec = fields.get(effective_spec, "pools", pool)
        if spec and spec.get("enabled", pool == "cpu"):
            enabled.append(spec)
            found += _pool_violations(pool, spec, fields.get(class_spec, "pools", pool), class_spec, where)
    if enabled and all(_int(spec, "minReplicas", 1) == 0 for spec in enabled):  # unset: the built-in 1
        found += _scale_to_zero_violations(fields.get(effective_spec, "autoscaling"),
                                           class_spec.get("scaleToZero") or {}, where)
    found += _source_violations(effective_spec.get("model") or {}, class_spec.get("modelSources") or {}, where)
    found += _storage_violations(effective_spec.get("storage") or {}, class_spec.get("storage") or {}, where)
    quant = effective_spec.get("quantization") or {}
    if quant.get("enabled", True):
        found += _quantization_violations(quant, class_spec.get("quantization") or {}, where)
    metrics = fields.get(effective_spec, "autoscaling", "metrics")
    found += _metrics_violations(metrics, class_spec.get("metrics") or {}, where)
    return found


def _int(obj: Obj, key: str, default: int) -> int:
    value = obj.get(key)
    return default if value is None else int(value)


def _scale_to_zero_violations(autoscaling: Obj, cls: Obj, where: str) -> list[str]:
    """A model with every enabled pool at minReplicas 0 goes to zero pods when idle: only where its class allows it,
    after an idle time within the class's bounds (checked only where it is allowed: otherwise it is moot)."""
    if not cls.get("allowed", False):
        return [f"scale to zero (minReplicas 0 on every enabled pool) is not allowed by {where}: "
                "scaleToZero.allowed is false"]
    idle = _int(autoscaling, "idleSeconds", IDLE_SECONDS)
    low, high = _int(cls, "minIdleSeconds", MIN_IDLE_SECONDS), _int(cls, "maxIdleSeconds", MAX_IDLE_SECONDS)
    if low <= idle <= high:
        return []
    return [f"autoscaling.idleSeconds {idle} is outside the bounds of {where}: scaleToZero allows {low}-{high}"]


def _metrics_violations(metrics: Obj, cls: Obj, where: str) -> list[str]:
    source = metrics.get("source") or "direct"
    allowed = list(cls.get("allowedSources") or ("direct", "prometheus"))
    if source in allowed:
        return []
    return [f"autoscaling.metrics.source {source} is not allowed by {where}: "
            f"metrics.allowedSources is [{', '.join(allowed)}]"]


def _pool_violations(pool: str, spec: Obj, cls: Obj, class_spec: Obj, where: str) -> list[str]:
    found: list[str] = []
    if not cls.get("allowed", True):
        found.append(f"pools.{pool} is enabled but {where} does not allow it (pools.{pool}.allowed: false)")
    allowed_images = list(fields.get(cls, "images", "allowed") or ())
    if spec.get("image") and allowed_images and not image_allowed(spec["image"], allowed_images):
        found.append(f"pools.{pool}.image {spec['image']} is not allowed by {where}: "
                     f"pools.{pool}.images.allowed is [{', '.join(allowed_images)}]")
    limit = cls.get("maxReplicas")
    low, high = int(spec.get("minReplicas", 0)), int(spec.get("maxReplicas", 0))
    if limit is not None and max(low, high) > int(limit):
        found.append(f"pools.{pool} replicas (minReplicas {low}, maxReplicas {high}) are above the limit of "
                     f"{where}: pools.{pool}.maxReplicas is {limit}")
    if spec.get("resourceProfile"):
        known = [p.get("name", "") for p in cls.get("resourceProfiles") or ()]
        found.append(f"pools.{pool}.resourceProfile {spec['resourceProfile']} is not a profile of {where}: "
                     f"pools.{pool}.resourceProfiles are [{', '.join(known)}]")
    found += _resource_violations(f"pools.{pool}", spec.get("resources") or {}, cls.get("maxResources"), where)
    if not cls.get("allowTenantPlacement", False) and _tenant_placement(spec, cls):
        found.append(f"pools.{pool}.nodeSelector, tolerations and affinity come from {where} "
                     f"(pools.{pool}.allowTenantPlacement: false): remove them from the RerankModel")
    if fields.get(class_spec, "security", "requireApiKey") and not fields.get(spec, "tei", "apiKeySecretRef"):
        found.append(f"pools.{pool}.tei.apiKeySecretRef is required by {where} (security.requireApiKey: true): "
                     "name a Secret key holding the API key clients must send")
    return found


def _tenant_placement(spec: Obj, cls: Obj) -> bool:
    """Whether the pool has placement beyond what the class itself adds (``resolve`` merges the class's in)."""
    class_selector = cls.get("nodeSelector") or {}
    class_tolerations = cls.get("tolerations") or ()
    own_selector = any(class_selector.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items())
    own_tolerations = any(t not in class_tolerations for t in spec.get("tolerations") or ())
    return own_selector or own_tolerations or bool(spec.get("affinity"))


def _resource_violations(path: str, resources: Obj, maxima: Obj | None, where: str) -> list[str]:
    if maxima is None:
        return []
    excess = [f"{section}.{name}={value}"
              for section in ("requests", "limits")
              for name, value in (resources.get(section) or {}).items()
              if name not in maxima or parse_quantity(value) > parse_quantity(maxima[name])]
    if not excess:
        return []
    limit = ", ".join(f"{k}: {v}" for k, v in maxima.items())
    field = "quantization.maxResources" if path == "quantization" else f"{path}.maxResources"
    return [f"{path}.resources {', '.join(excess)} exceed the limit of {where}: {field} is {{{limit}}} "
            "(resources not named there are not allowed)"]


def _source_violations(model: Obj, cls: Obj, where: str) -> list[str]:
    found: list[str] = []
    orgs = list(cls.get("hubOrganizations", ["*"]))
    model_id = model.get("id")
    if model_id and not hub_organization_allowed(model_id, orgs):
        found.append(f"model.id {model_id} is not from a hub organisation {where} allows: "
                     f"modelSources.hubOrganizations is [{', '.join(orgs)}]")
    if model.get("path") and not cls.get("allowLocalPaths", False):
        found.append(f"model.path is not allowed by {where} (modelSources.allowLocalPaths: false): "
                     "use model.id from an allowed hub organisation")
    if model.get("trustRemoteCode") and not cls.get("allowRemoteCode", False):
        found.append(f"model.trustRemoteCode is not allowed by {where} (modelSources.allowRemoteCode: false): "
                     "the Job would run the Python code the model repository ships")
    return found


def _storage_violations(storage: Obj, cls: Obj, where: str) -> list[str]:
    found: list[str] = []
    if storage.get("size") and cls.get("maxSize") and parse_quantity(storage["size"]) > parse_quantity(cls["maxSize"]):
        found.append(f"storage.size {storage['size']} is above the limit of {where}: "
                     f"storage.maxSize is {cls['maxSize']}")
    allowed = list(cls.get("allowedStorageClassNames", ["*"]))
    name = storage.get("storageClassName")
    if name and "*" not in allowed and name not in allowed:
        found.append(f"storage.storageClassName {name} is not allowed by {where}: "
                     f"storage.allowedStorageClassNames is [{', '.join(allowed)}]")
    if storage.get("existingClaim") and not cls.get("allowExistingClaim", True):
        found.append(f"storage.existingClaim is not allowed by {where} (storage.allowExistingClaim: false): "
                     "let the operator create the claim")
    return found


def _quantization_violations(quant: Obj, cls: Obj, where: str) -> list[str]:
    found: list[str] = []
    allowed_images = list(fields.get(cls, "images", "allowed") or ())
    if quant.get("image") and allowed_images and not image_allowed(quant["image"], allowed_images):
        found.append(f"quantization.image {quant['image']} is not allowed by {where}: "
                     f"quantization.images.allowed is [{', '.join(allowed_images)}]")
    found += _resource_violations("quantization", quant.get("resources") or {}, cls.get("maxResources"), where)
    floors = cls.get("minimumQualityGate") or {}
    gate = quant.get("qualityGate") or {}
    for key in ("minSpearman", "minTopKAgreement"):
        if key in gate and key in floors and float(gate[key]) < float(floors[key]):
            found.append(f"quantization.qualityGate.{key} {gate[key]} is below the floor of {where}: "
                         f"quantization.minimumQualityGate.{key} is {floors[key]}")
    return found


def image_allowed(image: str, allowed: Sequence[str]) -> bool:
    """Exact match, a prefix entry ending in '*', or '*' itself."""
    return any(a == "*" or a == image or (a.endswith("*") and image.startswith(a[:-1])) for a in allowed)


def hub_organization_allowed(model_id: str, organizations: Sequence[str]) -> bool:
    """``org/name`` ids whose organisation is listed (case-insensitively); '*' allows any id."""
    if "*" in organizations:
        return True
    org, sep, _ = model_id.partition("/")
    return bool(sep) and org.lower() in {o.lower() for o in organizations}


parse_quantity = quantities.parse_quantity
