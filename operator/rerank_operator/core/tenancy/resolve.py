"""The effective spec: the tenant's values kept, what it left out filled from its RerankClass. Pure."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.tenancy import lookups as fields

Obj = Mapping[str, Any]


def resolve(model_spec: Obj, class_spec: Obj | None) -> dict[str, Any]:
    """The spec the operator serves: the model's values, with what it left out taken from the class.

    A pool's ``resourceProfile`` becomes ``resources`` (an unknown profile is left in place for ``violations``).
    The class's nodeSelector and tolerations are added to the pool's and win on conflicting keys. How the Job
    reaches the hub (``modelSources.hub``) is the class's alone: it becomes ``model.hub``.
    """
    spec: dict[str, Any] = copy.deepcopy(dict(model_spec))
    spec.pop("className", None)
    model = spec.get("model")
    if isinstance(model, dict):
        model.pop("hub", None)  # the class's alone (the CRD prunes it from a model; a hand-made body too)
    if not class_spec:
        return spec
    hub = fields.get(class_spec, "modelSources", "hub")
    if hub and isinstance(model, dict):
        model["hub"] = copy.deepcopy(dict(hub))
    pools = spec.setdefault("pools", {})
    pools.setdefault("cpu", {})  # the CPU pool is enabled unless disabled; an absent GPU pool stays absent
    for pool in names.POOLS:
        if pool in pools:
            _resolve_pool(pools[pool], fields.get(class_spec, "pools", pool))
    _resolve_storage(spec.setdefault("storage", {}), class_spec.get("storage") or {})
    _resolve_quantization(spec.setdefault("quantization", {}), class_spec.get("quantization") or {})
    return spec


def _resolve_pool(pool: dict[str, Any], cls: Obj) -> None:
    fields.set_default(pool, "image", fields.get(cls, "images", "default"))
    fields.set_default(pool, "minReplicas", cls.get("defaultMinReplicas"))
    default_max = cls.get("defaultMaxReplicas")
    if default_max is not None and isinstance(pool.get("minReplicas"), int):
        default_max = max(int(default_max), pool["minReplicas"])  # a default never contradicts the model's minimum
    fields.set_default(pool, "maxReplicas", default_max)
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
    fields.set_default(storage, "size", cls.get("defaultSize"))
    fields.set_default(storage, "storageClassName", cls.get("defaultStorageClassName"))


def _resolve_quantization(quant: dict[str, Any], cls: Obj) -> None:
    defaults = cls.get("defaults") or {}
    fields.set_default(quant, "image", fields.get(cls, "images", "default"))
    if not quant.get("resources") and cls.get("defaultResources"):
        quant["resources"] = copy.deepcopy(cls["defaultResources"])
    for key in ("mode", "target", "recipe"):
        fields.set_default(quant, key, defaults.get(key))
    gate = quant.setdefault("qualityGate", {})
    for key, value in (defaults.get("qualityGate") or {}).items():
        fields.set_default(gate, key, value)
