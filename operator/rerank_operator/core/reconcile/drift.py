"""Does a live object already match what the operator would apply? Pure; this is what makes idle reconciles free.

Two tests, both needed:
- every field the operator sets is present in the live object with the same value (the API server adds defaults
  and other managers add fields; those do not count), which catches someone editing the operator's fields;
- the hash of the applied manifest, stamped on the object as an annotation, is unchanged, which catches fields the
  operator *stopped* setting (the subset test cannot see a removal).
Resource quantities are compared by value ("0.5" and "500m" are the same CPU) because the API server canonicalizes
them.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.spec.quantities import parse_quantity

_QUANTITY_PARENTS = {"limits", "requests"}
_LIST_KEYS = ("uid", "mountPath", "name")


def quantity(value: Any) -> Decimal | None:
    """A Kubernetes quantity's value (quantities.py, the one parser), or None if ``value`` is not one."""
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def manifest_hash(desired: Mapping[str, Any]) -> str:
    body = copy.deepcopy(dict(desired))
    body.get("metadata", {}).get("annotations", {}).pop(names.ANNOTATION_APPLIED_HASH, None)
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def stamp(desired: Mapping[str, Any]) -> dict[str, Any]:
    """``desired`` with the hash annotation the next reconcile compares against."""
    stamped = copy.deepcopy(dict(desired))
    digest = manifest_hash(stamped)
    stamped.setdefault("metadata", {}).setdefault("annotations", {})[names.ANNOTATION_APPLIED_HASH] = digest
    return stamped


def _list_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(i, Mapping) for i in items):
        return None
    for key in _LIST_KEYS:
        if all(key in i for i in items):
            return key
    return None


def is_subset(desired: Any, live: Any, path: tuple[str, ...] = ()) -> bool:
    """Whether every value in ``desired`` is in ``live`` (maps: recursively; keyed lists: by key; others: exactly)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(k in live and is_subset(v, live[k], (*path, k)) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list):
            return False
        key = _list_key(desired)
        if key is None:
            return len(desired) == len(live) and all(
                is_subset(d, item, path) for d, item in zip(desired, live, strict=True))
        by_key = {i.get(key): i for i in live if isinstance(i, Mapping)}
        return all(d[key] in by_key and is_subset(d, by_key[d[key]], path) for d in desired)
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    if desired == live:
        return True
    if len(path) >= 2 and path[-2] in _QUANTITY_PARENTS:
        a, b = quantity(desired), quantity(live)
        return a is not None and a == b
    return False


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata", {})
    kept = {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if k in meta}
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    return {"metadata": kept, **body}


def needs_apply(stamped: Mapping[str, Any], live: Mapping[str, Any] | None) -> bool:
    """True unless ``live`` carries the same applied hash and every field of ``stamped``."""
    if live is None:
        return True
    want = stamped.get("metadata", {}).get("annotations", {}).get(names.ANNOTATION_APPLIED_HASH)
    have = (live.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_APPLIED_HASH)
    return want != have or not is_subset(_comparable(stamped), live)
