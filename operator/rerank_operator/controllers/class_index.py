"""The class watch's cache: every RerankClass as last seen, and the class each reconciled model asks for.

Created once per process (``controllers/handlers.py``'s ``Process``) and passed down to the reconcile loop and the
autoscaler (no process globals). It is state shared by the operator's handler threads, so it is shell, not core: the
decisions about classes are the pure functions of ``core/tenancy/tenant.py``.

- ``ClassIndex``: every RerankClass as last seen by the watch (``kopf.on.event``, which writes nothing on the class;
  kopf's on.create/update/delete would keep state in annotations and add a finalizer, which the operator has no
  right to). It is primed by one LIST before its first use, so a model reconciled before the watch's first listing
  never falls back to the built-in defaults by mistake (that would roll its pods twice on every operator restart).
- ``ModelIndex``: the models this operator reconciled and the className each asks for, so a class change reconciles at
  once exactly the models whose class (or lack of one) it changes; nothing is written on a model to trigger it.
- ``SpecCache``: each model's effective spec, resolved against its class and parsed (``Understood``), once per version
  of the model and of the classes, for both loops: the reconcile loop and the autoscaler act on the same parse, and
  a fleet's autoscaler ticks, which mostly see neither change, parse nothing.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rerank_operator.core.names import ModelKey
from rerank_operator.core.spec import parse as spec_parse
from rerank_operator.core.spec.model import RerankModelSpec, SpecError
from rerank_operator.core.tenancy import tenant
from rerank_operator.core.tenancy.tenant import Obj


class ClassIndex:
    """RerankClasses by name, as the watch last delivered them (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}
        self._seen: set[str] = set()  # names the watch delivered (added, changed or deleted): newer than a LIST
        self._primed = False
        self._priming = threading.Lock()  # one LIST however many workers need the classes first (single flight)
        self._finished = 0  # LISTs finished; a caller that waited through a failed one gets its error
        self._failed: BaseException | None = None
        self._version = 0

    @property
    def primed(self) -> bool:
        return self._primed

    @property
    def version(self) -> int:
        """Moves on every change: what was derived from the classes (the autoscaler's parsed specs) is stale."""
        with self._lock:
            return self._version

    def prime(self, listed: Iterable[Obj]) -> None:
        """Add what a LIST returned, except classes the watch already reported (its news is at least as new)."""
        with self._lock:
            for obj in listed:
                name = obj["metadata"]["name"]
                if name not in self._seen:
                    self._items[name] = tenant.essence(obj)
            self._primed = True
            self._version += 1

    def items(self, lister: Callable[[], Iterable[Obj] | None]) -> list[dict[str, Any]]:
        """Every class; the first call reads them with ``lister`` (one LIST), later ones come from memory. Calls
        made while that LIST runs wait for it: in a burst of applies every worker's first model needs the classes
        at once, and a LIST each (124 of them in a 300-model burst) loaded the API server when it was busiest. If it
        fails, those waiting get its error (their reconciles are retried) instead of each trying again in turn."""
        if not self._primed:
            seen = self._finished
            with self._priming:
                if not self._primed:
                    if self._finished != seen and self._failed is not None:
                        raise self._failed  # the LIST this caller waited for failed: no convoy of retries
                    try:
                        self.prime(lister() or ())
                    except BaseException as exc:
                        self._failed = exc
                        raise
                    finally:
                        self._finished += 1
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
                self._items[name] = tenant.essence(rclass)
            self._version += 1
            after = [copy.deepcopy(c) for c in self._items.values()]
        return before, after

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._seen.clear()
            self._primed = False
            self._version += 1


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


@dataclass(frozen=True)
class Understood:
    """A model's effective spec (its own, with its class's defaults) and its parse; ``spec`` is None when the class
    is not found (``tenancy.not_found``) or the spec is invalid (``error`` says why)."""

    tenancy: tenant.Tenancy
    spec: RerankModelSpec | None
    error: str | None = None


Versions = tuple[str, int]  # the model's resourceVersion, the classes' version


class SpecCache:
    """``Understood`` per model, valid for one version of the model and of the classes (thread-safe). Shared
    objects: nobody mutates what it hands out (the parse is frozen; the effective spec is only read)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: dict[ModelKey, tuple[Versions, Understood]] = {}

    def get(self, key: ModelKey, versions: Versions) -> Understood | None:
        with self._lock:
            found = self._items.get(key)
        return found[1] if found is not None and found[0] == versions else None

    def put(self, key: ModelKey, versions: Versions, understood: Understood) -> None:
        with self._lock:
            self._items[key] = (versions, understood)

    def forget(self, namespace: str, name: str) -> None:
        with self._lock:
            self._items.pop((namespace, name), None)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@dataclass
class Registry:
    """The operator's memory of RerankClasses, of the class each reconciled model asks for and of each model's
    resolved spec (see above)."""

    classes: ClassIndex = field(default_factory=ClassIndex)
    models: ModelIndex = field(default_factory=ModelIndex)
    specs: SpecCache = field(default_factory=SpecCache)

    def forget(self, namespace: str, name: str) -> None:
        """A model is gone: drop what was remembered of it."""
        self.models.forget(namespace, name)
        self.specs.forget(namespace, name)


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
    return tenant.affected_models(models.snapshot(), tenant.essence(rclass), before, after)


def for_model(body: Obj, lister: Callable[[], Iterable[Obj] | None], registry: Registry,
              quantizer_image: str | None = None) -> Understood:
    """``understand`` for the reconcile loop, which also remembers which class the model asks for."""
    meta = body.get("metadata") or {}
    registry.models.record(meta.get("namespace", ""), meta.get("name", ""), (body.get("spec") or {}).get("className"))
    return understand(body, lister, registry, quantizer_image)


def understand(body: Obj, lister: Callable[[], Iterable[Obj] | None], registry: Registry,
               quantizer_image: str | None = None) -> Understood:
    """The model's effective spec against the cached classes (``tenant.resolve_model``; ``quantizer_image``: the
    platform's default, a process setting), parsed by the one parser (``spec_parse.parse``); computed once per
    version of the model and of the classes, whichever loop asks first. A model without a resourceVersion (built by
    hand) is resolved every time."""
    meta = body.get("metadata") or {}
    key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
    # The classes' version is read before the classes: a change in between makes this entry stale, never wrong.
    rv, versions = meta.get("resourceVersion"), (str(meta.get("resourceVersion")), registry.classes.version)
    if rv is not None and (hit := registry.specs.get(key, versions)) is not None:
        return hit
    tenancy = tenant.resolve_model(dict(body), registry.classes.items(lister), quantizer_image)
    understood = Understood(tenancy, None)
    if tenancy.not_found is None:
        try:
            understood = Understood(tenancy, spec_parse.parse(tenancy.effective))
        except SpecError as exc:
            understood = Understood(tenancy, None, str(exc))
    if rv is not None:
        registry.specs.put(key, versions, understood)
    return understood
