"""Builders for RerankClass and RerankModel dicts as the API server would store them (CRD defaults applied)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[5]
CLASS_CRD = REPO / "crds" / "rerankclass.yaml"
POLICY = REPO / "policies" / "rerankmodel-class-policy.yaml"

Mod = Callable[[dict[str, Any]], None]


def class_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CLASS_CRD.read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def apply_defaults(schema: dict[str, Any], obj: Any) -> Any:
    """Structural defaulting the way the API server does it: defaults set, then defaulted values defaulted."""
    if isinstance(obj, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                apply_defaults(sub, obj[key])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            apply_defaults(schema["items"], item)
    return obj


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        obj = obj.setdefault(key, {})
    obj[leaf] = value


def at(path: str, value: Any) -> Mod:
    return lambda obj: set_path(obj, path, copy.deepcopy(value))


def rclass(*mods: Mod, name: str = "standard", default: bool = False,
           created: str = "2025-01-01T00:00:00Z") -> dict[str, Any]:
    """A RerankClass object; ``mods`` edit its spec before the CRD's defaults are applied."""
    spec: dict[str, Any] = {}
    for mod in mods:
        mod(spec)
    meta: dict[str, Any] = {"name": name, "creationTimestamp": created}
    if default:
        meta["annotations"] = {"rerank.io/is-default-class": "true"}
    obj = {"apiVersion": "rerank.io/v1alpha1", "kind": "RerankClass", "metadata": meta, "spec": spec}
    return apply_defaults(class_schema(), obj)


def model_spec(*mods: Mod) -> dict[str, Any]:
    """A tenant's RerankModel spec: a hub model and nothing else, as a five-line manifest would have it."""
    spec: dict[str, Any] = {"model": {"id": "BAAI/bge-reranker-v2-m3"}}
    for mod in mods:
        mod(spec)
    return spec
