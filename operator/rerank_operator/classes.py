"""RerankClasses in the reconcile loop: a model's class, its effective spec, ClassCompliant, quota verdicts. Pure.

The verdicts go into ``status.compute`` (the only status builder) as its ``compliance`` and ``quota`` inputs.

This module wires ``tenancy`` (the pure class, NetworkPolicy and quota functions) into the loop; it does no I/O
itself: reconcile.py hands it what the API returned, handlers.py hands it the class watch's events.

The class registry (``Registry``), created once by handlers.py and passed down to the reconcile loop and the
autoscaler (no process globals), holds two thread-safe indexes shared by the operator's handler threads:

- ``ClassIndex``: every RerankClass as last seen by the watch (``kopf.on.event``, which writes nothing on the class;
  kopf's on.create/update/delete would keep state in annotations and add a finalizer, which the operator has no
  right to). It is primed by one LIST before its first use, so a model reconciled before the watch's first listing
  never falls back to the built-in defaults by mistake (that would roll its pods twice on every operator restart).
- ``ModelIndex``: the models this operator reconciled and the className each asks for, so a class change reconciles at
  once exactly the models whose class (or lack of one) it changes; nothing is written on a model to trigger it.

Per reconcile (see ``for_model``): the model's class is the one named by ``spec.className``, else the default class;
``tenancy.resolve`` fills what the model left out from that class and spec.py then applies the built-in defaults
(tenant value, class default, built-in default), so a class change reaches the children through the applied-hash
like any spec change. No RerankClass at all: built-in defaults and no ClassCompliant condition. A class that does
not exist (or no default class while classes exist): ClassCompliant=False ClassNotFound and nothing is applied.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import conditions, tenancy
from .conditions import Condition
from .observed import Observed
from .settings import Settings
from .writes import Refused

Obj = Mapping[str, Any]



# -- registries ---------------------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """Plain dicts and lists (kopf hands out read-only mapping views)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _essence(rclass: Obj) -> dict[str, Any]:
    """What of a class matters to its models: name, the default-class annotation, creation time, spec."""
    meta = rclass.get("metadata") or {}
    kept: dict[str, Any] = {"name": meta.get("name", "")}
    if meta.get("creationTimestamp"):
        kept["creationTimestamp"] = meta["creationTimestamp"]
    if tenancy.is_default_class(rclass):
        kept["annotations"] = {tenancy.DEFAULT_CLASS_ANNOTATION: "true"}
    return {"apiVersion": rclass.get("apiVersion", ""), "kind": tenancy.CLASS_KIND, "metadata": kept,
            "spec": _plain(rclass.get("spec") or {})}


class ClassIndex:
    """RerankClasses by name, as the watch last delivered them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}
        self._seen: set[str] = set()  # names the watch delivered (added, changed or deleted): newer than a LIST
        self._primed = False

    @property
    def primed(self) -> bool:
        return self._primed

    def prime(self, listed: Iterable[Obj]) -> None:
        """Add what a LIST returned, except classes the watch already reported (its news is at least as new)."""
        with self._lock:
            for obj in listed:
                name = obj["metadata"]["name"]
                if name not in self._seen:
                    self._items[name] = _essence(obj)
            self._primed = True

    def items(self, lister: Callable[[], Iterable[Obj] | None]) -> list[dict[str, Any]]:
        """Every class; the first call reads them with ``lister`` (one LIST), later ones come from memory."""
        if not self._primed:
            self.prime(lister() or ())
        return self.snapshot()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(c) for c in self._items.values()]

    def record(self, event_type: str | None, rclass: Obj) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Apply one watch event; returns the classes before and after it."""
        name = rclass["metadata"]["name"]
        with self._lock:
            before = [copy.deepcopy(c) for c in self._items.values()]
            self._seen.add(name)
            if event_type == "DELETED":
                self._items.pop(name, None)
            else:
                self._items[name] = _essence(rclass)
            after = [copy.deepcopy(c) for c in self._items.values()]
        return before, after

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._seen.clear()
            self._primed = False


ModelKey = tuple[str, str]  # (namespace, name)


class ModelIndex:
    """The models reconciled by this process and the className each asks for (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models: dict[ModelKey, str | None] = {}

    def record(self, namespace: str, name: str, class_name: str | None) -> None:
        with self._lock:
            self._models[(namespace, name)] = class_name or None

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._models.pop((namespace, name), None)

    def snapshot(self) -> dict[ModelKey, str | None]:
        with self._lock:
            return dict(self._models)

    def clear(self) -> None:
        with self._lock:
            self._models.clear()


@dataclass
class Registry:
    """The operator's memory of RerankClasses and of the class each reconciled model asks for (see above)."""

    classes: ClassIndex = field(default_factory=ClassIndex)
    models: ModelIndex = field(default_factory=ModelIndex)


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


def class_event(event_type: str | None, rclass: Obj, index: ClassIndex, models: ModelIndex) -> list[ModelKey]:
    """Record a RerankClass watch event; returns the models to reconcile now (none for the watch's initial listing,
    which the models' own resume already covers, nor for changes that do not concern models, e.g. a label)."""
    name = rclass["metadata"]["name"]
    before, after = index.record(event_type, rclass)
    if event_type is None:
        return []
    old = next((c for c in before if c["metadata"]["name"] == name), None)
    new = next((c for c in after if c["metadata"]["name"] == name), None)
    if old == new:
        return []
    return affected_models(models.snapshot(), _essence(rclass), before, after)


# -- one model ------------------------------------------------------------------------------------------------------
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


def resolve_model(body: Obj, classes: Sequence[Obj]) -> Tenancy:
    """The model's class, effective spec and violations (the operator's double-check of the admission policy)."""
    raw = body.get("spec") or {}
    class_name = raw.get("className") or None
    missing = tenancy.class_not_found(class_name, classes)
    if missing is not None:
        return Tenancy(None, tenancy.resolve(raw, None), not_found=missing)
    chosen = tenancy.select_class(class_name, classes)
    rclass = _plain(chosen) if chosen is not None else None
    class_spec = (rclass or {}).get("spec") or {}
    effective = tenancy.resolve(raw, class_spec if rclass is not None else None)
    if rclass is None:
        return Tenancy(None, effective)
    try:
        found = tenancy.violations(effective, class_spec, rclass["metadata"]["name"])
    except ValueError as exc:  # a quantity the CRDs' patterns should have refused
        found = [f"cannot check the model against RerankClass {rclass['metadata']['name']}: {exc}"]
    return Tenancy(rclass, effective, violations=tuple(found))


def for_model(body: Obj, lister: Callable[[], Iterable[Obj] | None], registry: Registry) -> Tenancy:
    """``resolve_model`` against the cached classes; remembers which class the model asks for."""
    meta = body.get("metadata") or {}
    registry.models.record(meta.get("namespace", ""), meta.get("name", ""), (body.get("spec") or {}).get("className"))
    return resolve_model(body, registry.classes.items(lister))


def network_policy(body: Obj, t: Tenancy, settings: Settings) -> dict[str, Any] | None:
    """The model's NetworkPolicy (None: its class turns it off, or no class applies), admitting the operator's pods
    (``settings``: outside a pod the operator has no namespace and the peer is left out)."""
    policy = tenancy.build_network_policy(body, t.rclass, operator_namespace=settings.operator_namespace,
                                          operator_pod_labels=dict(settings.operator_pod_labels))
    if policy is not None and not policy["spec"].get("ingress"):
        # The API server drops an empty list; leaving it in would look like drift on every reconcile.
        policy["spec"].pop("ingress", None)
    return policy


# -- quotas -----------------------------------------------------------------------------------------------------------
def is_quota_error(error: object) -> bool:
    """A write the API server refused because of a ResourceQuota, whichever verb (``writes.Refused``)."""
    return isinstance(error, Refused) and error.is_quota


def quota_block(observed: Observed, refused: Iterable[Refused]) -> tenancy.QuotaBlock | None:
    """The first quota failure: a pool's ReplicaSet, the quantization Job's pod, or a write of ours."""
    api_errors = {str(r.ref): r.message for r in refused if r.is_quota}
    return tenancy.quota_blocked(replica_sets=observed.replica_sets, jobs=observed.jobs, events=observed.job_events,
                                 api_errors=api_errors)
