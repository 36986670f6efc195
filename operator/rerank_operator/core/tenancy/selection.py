"""A model's RerankClass: the one named by ``spec.className``, else the default class (annotation
``rerank.io/is-default-class: "true"``; with several, the newest, as for StorageClasses). Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rerank_operator.core import names

DEFAULT_CLASS_ANNOTATION = f"{names.GROUP}/is-default-class"
CLASS_KIND = "RerankClass"
CLASS_PLURAL = "rerankclasses"

Obj = Mapping[str, Any]


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
