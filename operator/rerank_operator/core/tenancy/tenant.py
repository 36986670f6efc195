"""A model and its RerankClass: the class it gets, its effective spec, ClassCompliant, quota verdicts. Pure.

The verdicts go into ``status.compute`` (the only status builder) as its ``compliance`` and ``quota`` inputs.
This module wires the rest of ``tenancy`` (the class, NetworkPolicy and quota functions) into what one reconcile
needs; it does no I/O: the reconcile loop hands it what the API returned, and the class watch's cache
(``controllers/class_index.py``) hands it the classes.

Per reconcile: the model's class is the one named by ``spec.className``, else the default class;
``tenancy.resolve`` fills what the model left out from that class and spec.py then applies the built-in defaults
(tenant value, class default, built-in default), so a class change reaches the children through the applied-hash
like any spec change. No RerankClass at all: built-in defaults and no ClassCompliant condition. A class that does
not exist (or no default class while classes exist): ClassCompliant=False ClassNotFound and nothing is applied.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rerank_operator.core import tenancy
from rerank_operator.core.names import ModelKey
from rerank_operator.core.reconcile.observed import Observed
from rerank_operator.core.reconcile.writes import Refused
from rerank_operator.core.settings import Settings
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status import conditions
from rerank_operator.core.status.conditions import Condition

Obj = Mapping[str, Any]


def plain(value: Any) -> Any:
    """Plain dicts and lists (kopf hands out read-only mapping views)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def essence(rclass: Obj) -> dict[str, Any]:
    """What of a class matters to its models: name, the default-class annotation, creation time, spec."""
    meta = rclass.get("metadata") or {}
    kept: dict[str, Any] = {"name": meta.get("name", "")}
    if meta.get("creationTimestamp"):
        kept["creationTimestamp"] = meta["creationTimestamp"]
    if tenancy.is_default_class(rclass):
        kept["annotations"] = {tenancy.DEFAULT_CLASS_ANNOTATION: "true"}
    return {"apiVersion": rclass.get("apiVersion", ""), "kind": tenancy.CLASS_KIND, "metadata": kept,
            "spec": plain(rclass.get("spec") or {})}


def _choice(class_name: str | None, classes: Sequence[Obj]) -> tuple[str | None, bool]:
    chosen = tenancy.select_class(class_name, classes)
    return (chosen["metadata"]["name"] if chosen else None, tenancy.class_not_found(class_name, classes) is None)


def affected_models(models: Mapping[ModelKey, str | None], changed: Obj,
                    before: Sequence[Obj], after: Sequence[Obj]) -> list[ModelKey]:
    """Models a change of class ``changed`` concerns: those using it before or after, and those whose class (or
    whose having none) it changes, e.g. a new default class, or the last class deleted."""
    found = []
    for key, class_name in sorted(models.items()):
        spec = {"spec": {"className": class_name}} if class_name else {"spec": {}}
        if (tenancy.uses_class(spec, changed, before) or tenancy.uses_class(spec, changed, after)
                or _choice(class_name, before) != _choice(class_name, after)):
            found.append(key)
    return found


@dataclass(frozen=True)
class Tenancy:
    """A model's class and what follows from it."""

    rclass: dict[str, Any] | None  # None: no class applies (none exists at all, or ``not_found``)
    effective: dict[str, Any]  # the spec to parse: the model's, with the class's defaults filled in
    not_found: str | None = None  # why the model has no class although classes exist
    violations: tuple[str, ...] = field(default_factory=tuple)

    @property
    def class_name(self) -> str | None:
        return self.rclass["metadata"]["name"] if self.rclass else None

    def condition(self) -> Condition | None:
        """ClassCompliant, or None when no RerankClass exists (built-in defaults, nothing to comply with)."""
        if self.not_found is not None:
            return Condition(conditions.CLASS_COMPLIANT, "False", conditions.REASON_CLASS_NOT_FOUND, self.not_found)
        if self.rclass is None:
            return None
        if self.violations:
            return Condition(conditions.CLASS_COMPLIANT, "False", conditions.REASON_CLASS_VIOLATION,
                             "; ".join(self.violations))
        return Condition(conditions.CLASS_COMPLIANT, "True", conditions.REASON_COMPLIANT,
                         f"within the limits of RerankClass {self.class_name}")


def resolve_model(body: Obj, classes: Sequence[Obj], quantizer_image: str | None = None) -> Tenancy:
    """The model's class, effective spec and violations (the operator's double-check of the admission policy).
    ``quantizer_image``: the platform's (``--quantizer-image``), when the model names none and its class (if any)
    gives none (the RerankClass CRD defaults ``quantization.images.default``, so a class always decides)."""
    raw = body.get("spec") or {}
    class_name = raw.get("className") or None
    missing = tenancy.class_not_found(class_name, classes)
    if missing is not None:
        return Tenancy(None, tenancy.resolve(raw, None), not_found=missing)
    chosen = tenancy.select_class(class_name, classes)
    rclass = plain(chosen) if chosen is not None else None
    class_spec = (rclass or {}).get("spec") or {}
    effective = tenancy.resolve(raw, class_spec if rclass is not None else None)
    if quantizer_image and not (effective.get("quantization") or {}).get("image"):
        effective.setdefault("quantization", {})["image"] = quantizer_image
    if rclass is None:
        return Tenancy(None, effective)
    try:
        found = tenancy.violations(effective, class_spec, rclass["metadata"]["name"])
    except ValueError as exc:  # a quantity the CRDs' patterns should have refused
        found = [f"cannot check the model against RerankClass {rclass['metadata']['name']}: {exc}"]
    return Tenancy(rclass, effective, violations=tuple(found))


def network_policy(body: Obj, t: Tenancy, settings: Settings, spec: RerankModelSpec) -> dict[str, Any] | None:
    """The model's NetworkPolicy (None: its class turns it off, or no class applies), admitting the operator's pods
    (``settings``: outside a pod the operator has no namespace and the peer is left out)."""
    activator = settings.activator
    policy = tenancy.build_network_policy(body, t.rclass, operator_namespace=settings.operator_namespace,
                                          operator_pod_labels=dict(settings.operator_pod_labels),
                                          activator=((activator.namespace, dict(activator.pod_labels))
                                                     if activator is not None and spec.scales_to_zero
                                                     else None))
    if policy is not None and not policy["spec"].get("ingress"):
        # The API server drops an empty list; leaving it in would look like drift on every reconcile.
        policy["spec"].pop("ingress", None)
    return policy


def is_quota_error(error: object) -> bool:
    """A write the API server refused because of a ResourceQuota, whichever verb (``writes.Refused``)."""
    return isinstance(error, Refused) and error.is_quota


def quota_block(observed: Observed, refused: Iterable[Refused]) -> tenancy.QuotaBlock | None:
    """The first quota failure: a pool's ReplicaSet, the quantization Job's pod, or a write of ours."""
    api_errors = {str(r.ref): r.message for r in refused if r.is_quota}
    return tenancy.quota_blocked(replica_sets=observed.replica_sets, jobs=observed.jobs, events=observed.job_events,
                                 api_errors=api_errors)
