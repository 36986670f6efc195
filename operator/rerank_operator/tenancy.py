"""Many tenants, one platform: RerankClass defaults and limits, per-model NetworkPolicy, quota detection.

Pure functions over plain dicts (the objects as the API returns them); no I/O and no kopf, so the reconcile loop
calls them and unit tests drive them with tables.

- ``select_class`` picks a model's RerankClass: the one named by ``spec.className``, else the default class
  (annotation ``rerank.io/is-default-class: "true"``; with several, the newest, as for StorageClasses).
- ``resolve`` gives the effective spec: the tenant's values kept, what it left out filled from the class.
- ``violations`` double-checks an effective spec against its class. The API server already refuses these
  (policies/rerankmodel-class-policy.yaml, same wording); the operator reports them in condition ``ClassCompliant``
  because a class may be tightened after a model was admitted.
- ``build_network_policy`` lets only the routing layer, allowed namespaces and the operator reach TEI pods.
- ``quota_blocked`` turns "exceeded quota" failures of ReplicaSets, Jobs and claims into one reason and message.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import conditions, deployment, job, names, quantities

DEFAULT_CLASS_ANNOTATION = f"{names.GROUP}/is-default-class"
CLASS_KIND = "RerankClass"
CLASS_PLURAL = "rerankclasses"

Obj = Mapping[str, Any]


# -- class selection --------------------------------------------------------------------------------------------
def is_default_class(rclass: Obj) -> bool:
    return (rclass.get("metadata", {}).get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"


def select_class(class_name: str | None, classes: Iterable[Obj]) -> Obj | None:
    """The class a model uses: by name, else the newest default class (ties broken by name); None if there is none."""
    items = list(classes)
    if class_name:
        return next((c for c in items if c.get("metadata", {}).get("name") == class_name), None)
    defaults = [c for c in items if is_default_class(c)]
    if not defaults:
        return None
    return max(defaults, key=lambda c: (c["metadata"].get("creationTimestamp") or "", c["metadata"].get("name", "")))


def class_not_found(class_name: str | None, classes: Iterable[Obj]) -> str | None:
    """Why a model has no class, or None when it has one or when no RerankClass exists at all (built-in defaults)."""
    items = list(classes)
    if select_class(class_name, items) is not None or not items:
        return None
    if class_name:
        return f"RerankClass {class_name} (spec.className) does not exist"
    return f"spec.className is empty and no RerankClass is annotated {DEFAULT_CLASS_ANNOTATION}: \"true\""


def uses_class(model: Obj, rclass: Obj, classes: Iterable[Obj]) -> bool:
    """Whether a change of ``rclass`` concerns ``model`` (so the model must be reconciled again)."""
    chosen = select_class((model.get("spec") or {}).get("className"), classes)
    return chosen is not None and chosen["metadata"]["name"] == rclass["metadata"]["name"]


# -- effective spec ---------------------------------------------------------------------------------------------
def resolve(model_spec: Obj, class_spec: Obj | None) -> dict[str, Any]:
    """The spec the operator serves: the model's values, with what it left out taken from the class.

    A pool's ``resourceProfile`` becomes ``resources`` (an unknown profile is left in place for ``violations``).
    The class's nodeSelector and tolerations are added to the pool's and win on conflicting keys.
    """
    spec: dict[str, Any] = copy.deepcopy(dict(model_spec))
    spec.pop("className", None)
    if not class_spec:
        return spec
    pools = spec.setdefault("pools", {})
    pools.setdefault("cpu", {})  # the CPU pool is enabled unless disabled; an absent GPU pool stays absent
    for pool in names.POOLS:
        if pool in pools:
            _resolve_pool(pools[pool], _get(class_spec, "pools", pool))
    _resolve_storage(spec.setdefault("storage", {}), class_spec.get("storage") or {})
    _resolve_quantization(spec.setdefault("quantization", {}), class_spec.get("quantization") or {})
    return spec


def _resolve_pool(pool: dict[str, Any], cls: Obj) -> None:
    _set_default(pool, "image", _get(cls, "images", "default"))
    _set_default(pool, "minReplicas", cls.get("defaultMinReplicas"))
    default_max = cls.get("defaultMaxReplicas")
    if default_max is not None and isinstance(pool.get("minReplicas"), int):
        default_max = max(int(default_max), pool["minReplicas"])  # a default never contradicts the model's minimum
    _set_default(pool, "maxReplicas", default_max)
    if not pool.get("resources"):
        wanted = pool.get("resourceProfile") or cls.get("defaultResourceProfile")
        profile = next((p for p in cls.get("resourceProfiles") or () if p.get("name") == wanted), None)
        if profile is not None:
            pool["resources"] = copy.deepcopy(profile.get("resources") or {})
            pool.pop("resourceProfile", None)
    else:
        pool.pop("resourceProfile", None)
    if cls.get("nodeSelector"):
        pool["nodeSelector"] = {**(pool.get("nodeSelector") or {}), **cls["nodeSelector"]}
    extra = [t for t in cls.get("tolerations") or () if t not in (pool.get("tolerations") or ())]
    if extra:
        pool["tolerations"] = [*(pool.get("tolerations") or ()), *copy.deepcopy(extra)]


def _resolve_storage(storage: dict[str, Any], cls: Obj) -> None:
    if storage.get("existingClaim"):
        return
    _set_default(storage, "size", cls.get("defaultSize"))
    _set_default(storage, "storageClassName", cls.get("defaultStorageClassName"))


def _resolve_quantization(quant: dict[str, Any], cls: Obj) -> None:
    defaults = cls.get("defaults") or {}
    _set_default(quant, "image", _get(cls, "images", "default"))
    if not quant.get("resources") and cls.get("defaultResources"):
        quant["resources"] = copy.deepcopy(cls["defaultResources"])
    for key in ("mode", "target", "recipe"):
        _set_default(quant, key, defaults.get(key))
    gate = quant.setdefault("qualityGate", {})
    for key, value in (defaults.get("qualityGate") or {}).items():
        _set_default(gate, key, value)


# -- violations ---------------------------------------------------------------------------------------------------
def violations(effective_spec: Obj, class_spec: Obj, class_name: str = "of this model") -> list[str]:
    """Everything in ``effective_spec`` its class does not allow, one message each, worded like the admission policy."""
    found: list[str] = []
    where = f"RerankClass {class_name}"
    for pool in names.POOLS:
        spec = _get(effective_spec, "pools", pool)
        if spec and spec.get("enabled", pool == "cpu"):
            found += _pool_violations(pool, spec, _get(class_spec, "pools", pool), class_spec, where)
    found += _source_violations(effective_spec.get("model") or {}, class_spec.get("modelSources") or {}, where)
    found += _storage_violations(effective_spec.get("storage") or {}, class_spec.get("storage") or {}, where)
    quant = effective_spec.get("quantization") or {}
    if quant.get("enabled", True):
        found += _quantization_violations(quant, class_spec.get("quantization") or {}, where)
    found += _metrics_violations(_get(effective_spec, "autoscaling", "metrics"), class_spec.get("metrics") or {}, where)
    return found


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
    allowed_images = list(_get(cls, "images", "allowed") or ())
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
    if _get(class_spec, "security", "requireApiKey") and not _get(spec, "tei", "apiKeySecretRef"):
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
    allowed_images = list(_get(cls, "images", "allowed") or ())
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


# -- NetworkPolicy ------------------------------------------------------------------------------------------------
network_policy_name = names.network_policy_name


def build_network_policy(
    model: Obj,
    rclass: Obj | None,
    *,
    operator_namespace: str | None = None,
    operator_pod_labels: Mapping[str, str] | None = None,
) -> dict[str, Any] | None:
    """The NetworkPolicy isolating a model's TEI pods, or None when its class turns it off (or there is no class).

    Ingress to the TEI port only from: the routing layer (class ``network.routingNamespaces``, optionally only pods
    with ``routingPodLabels``), ``network.allowedNamespaces``, the model's own namespace (``allowSameNamespace``)
    and the operator (which scrapes TEI's /metrics for autoscaling). Egress is left alone (TEI downloads models).
    """
    network = _get(rclass or {}, "spec", "network")
    if rclass is None or not network.get("enabled", True):
        return None
    meta = model["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    peers: list[dict[str, Any]] = []
    if network.get("routingNamespaces"):
        peers.append(_namespace_peer(network["routingNamespaces"], network.get("routingPodLabels") or {}))
    if network.get("allowedNamespaces"):
        peers.append(_namespace_peer(network["allowedNamespaces"], {}))
    if network.get("allowSameNamespace", True):
        peers.append({"podSelector": {}})
    if operator_namespace:
        peers.append(_namespace_peer([operator_namespace], operator_pod_labels or {}))
    ingress = [{"from": peers, "ports": [{"protocol": "TCP", "port": deployment.PORT}]}] if peers else []
    owner = names.Owner(name=name, namespace=namespace, uid=meta.get("uid", ""), generation=meta.get("generation", 0))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(name),
            "namespace": namespace,
            "labels": {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: name,
                       names.LABEL_COMPONENT: "network-policy", names.LABEL_MANAGED_BY: names.OPERATOR_NAME,
                       names.LABEL_PART_OF: names.PART_OF},
            **({"ownerReferences": [names.owner_reference(owner)]} if meta.get("uid") else {}),
        },
        "spec": {
            "podSelector": {
                "matchLabels": {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: name},
                "matchExpressions": [{"key": names.LABEL_COMPONENT, "operator": "In",
                                      "values": [names.pool_component("cpu"), names.pool_component("gpu")]}],
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _namespace_peer(namespaces: Sequence[str], pod_labels: Mapping[str, str]) -> dict[str, Any]:
    peer: dict[str, Any] = {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(namespaces)}]}}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(pod_labels)}
    return peer


# -- quotas ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class QuotaBlock:
    """Creation of pods or claims refused by a ResourceQuota: what was blocked and the quota's own message."""

    reason: str
    message: str
    blocked: str  # e.g. "ReplicaSet/m-cpu-5d8f", "Job/m-q-1a2b3c4d-1", "PersistentVolumeClaim/m-models"


_QUOTA_MARKERS = ("exceeded quota", "failed quota")


def is_quota_message(message: str | None) -> bool:
    return bool(message) and any(m in str(message) for m in _QUOTA_MARKERS)


def quota_blocked(
    *,
    replica_sets: Iterable[Obj] = (),
    jobs: Iterable[Obj] = (),
    events: Iterable[Obj] = (),
    api_errors: Mapping[str, str] | None = None,
) -> QuotaBlock | None:
    """The first quota failure among a model's children, or None.

    - ReplicaSets: condition ReplicaFailure=True with reason FailedCreate (cleared by the controller on success).
    - Jobs: their FailedCreate events, counted only while the Job is unfinished and has no active pod.
    - Claims and other objects the operator creates itself: ``api_errors`` maps "Kind/name" to the message of the
      403 the API server answered.
    """
    for rs in replica_sets:
        for cond in (rs.get("status") or {}).get("conditions") or ():
            failing = cond.get("type") == "ReplicaFailure" and cond.get("status") == "True"
            if failing and is_quota_message(cond.get("message")):
                return _block(f"ReplicaSet/{rs['metadata']['name']}", cond["message"])
    stuck = {j["metadata"]["name"] for j in jobs if job.waiting_for_pods(j)}
    for event in sorted(events, key=_event_time, reverse=True):
        involved = event.get("involvedObject") or {}
        if (involved.get("kind") == "Job" and involved.get("name") in stuck
                and event.get("reason") == "FailedCreate" and is_quota_message(event.get("message"))):
            return _block(f"Job/{involved['name']}", event["message"])
    for blocked, message in (api_errors or {}).items():
        if is_quota_message(message):
            return _block(blocked, message)
    return None


def _block(blocked: str, message: str) -> QuotaBlock:
    quota = message.split("forbidden: ", 1)[-1].strip()  # "exceeded quota: q, requested: ..., used: ..., limited: ..."
    return QuotaBlock(reason=conditions.REASON_QUOTA_EXCEEDED, message=f"{blocked}: {quota}", blocked=blocked)


def _event_time(event: Obj) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")


# -- helpers ----------------------------------------------------------------------------------------------------------
def _get(obj: Obj, *path: str) -> Any:
    """Nested lookup that treats missing and null as an empty mapping on the way down."""
    for key in path:
        obj = (obj or {}).get(key) or {}
    return obj


def _set_default(obj: dict[str, Any], key: str, value: Any) -> None:
    if value not in (None, "", {}, []) and obj.get(key) in (None, "", {}, []):
        obj[key] = copy.deepcopy(value)
