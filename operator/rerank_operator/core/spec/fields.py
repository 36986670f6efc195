"""Typed getters for a RerankModel's spec: each reads one field of a section, applies its default, and raises
``SpecError`` naming the field's path and showing the offending value. ``spec_parse`` builds every section with
them, so every refusal reads the same way ("pools.cpu.replicas must be ...") whatever the section."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from rerank_operator.core.spec import shapes
from rerank_operator.core.spec.model import SecretKeyRef, SpecError
from rerank_operator.core.spec.quantities import parse_quantity


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def obj(parent: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    value = parent.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"{path} must be an object, got {show(value)}")
    return value


def string(parent: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str | None:
    value = parent.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise SpecError(f"{path} must be a non-empty string, got {show(value)}")
    return value


def checked(parent: Mapping[str, Any], key: str, path: str, ok: Callable[[str], bool], what: str,
            default: str | None = None) -> str | None:
    value = string(parent, key, path, default)
    if value is not None and not ok(value):
        raise SpecError(f"{path} {value!r} is not {what}")
    return value


def integer(parent: Mapping[str, Any], key: str, path: str, default: int, minimum: int | None = None,
            maximum: int | None = None) -> int:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{path} must be an integer, got {show(value)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise SpecError(f"{path} must be within [{minimum}, {maximum}], got {value}")
    return value


def number(parent: Mapping[str, Any], key: str, path: str, default: float, minimum: float) -> float:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{path} must be a number, got {show(value)}")
    if value < minimum:
        raise SpecError(f"{path} must be at least {minimum:g}, got {show(value)}")
    return float(value)


def fraction(parent: Mapping[str, Any], key: str, path: str, default: float) -> float:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise SpecError(f"{path} must be a number in (0, 1], got {show(value)}")
    return float(value)


def boolean(parent: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = parent.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise SpecError(f"{path} must be true or false, got {show(value)}")
    return value


def choice(parent: Mapping[str, Any], key: str, path: str, default: str | int, allowed: tuple[str | int, ...]) -> Any:
    value = parent.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or value not in allowed:  # True == 1: a boolean is never an allowed number
        raise SpecError(f"{path} must be one of {', '.join(map(str, allowed))}, got {show(value)}")
    return value


def items(parent: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = parent.get(key)
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        raise SpecError(f"{path} must be a list, got {show(value)}")
    return list(value)


def strings(parent: Mapping[str, Any], key: str, path: str) -> list[str]:
    values = items(parent, key, path)
    for v in values:
        if not isinstance(v, str):
            raise SpecError(f"{path} entries must be strings, got {show(v)}")
    return values


def resources(section: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Requests and limits as given, after checking what Kubernetes would refuse when the pod is written."""
    parsed: dict[str, dict[str, Decimal]] = {}
    for kind in ("requests", "limits"):
        values = obj(section, kind, f"{path}.{kind}")
        parsed[kind] = {}
        for name, raw in values.items():
            try:
                amount = parse_quantity(raw)
            except ValueError:
                raise SpecError(f"{path}.{kind}.{name} {show(raw)} is not a Kubernetes quantity") from None
            if amount < 0:
                raise SpecError(f"{path}.{kind}.{name} {raw} must not be negative")
            parsed[kind][str(name)] = amount
    for kind, values in parsed.items():
        for name in values:
            if not shapes.resource_name(name):
                raise SpecError(f"{path}.{kind}.{name} names a resource a container cannot request: use cpu, memory, "
                                "ephemeral-storage, hugepages-<size> or a qualified name such as nvidia.com/gpu")
    for name, amount in parsed["requests"].items():
        limit = parsed["limits"].get(name)
        if limit is not None and amount > limit:
            raise SpecError(f"{path}.requests.{name} {section['requests'][name]} is above "
                            f"{path}.limits.{name} {section['limits'][name]}")
        if shapes.extended_resource(name) and limit != amount:
            raise SpecError(f"{path}.requests.{name} {section['requests'][name]}: extended resources such as GPUs "
                            f"cannot be overcommitted: set the same value in {path}.limits (or only limits)")
    unknown = [str(k) for k in section if k not in ("requests", "limits")]
    if unknown:
        raise SpecError(f"{path} has {', '.join(unknown)}: only requests and limits are read")
    return {kind: dict(section[kind]) for kind in ("requests", "limits") if section.get(kind)}


def secret(section: Mapping[str, Any], path: str, default_key: str | None = None) -> SecretKeyRef | None:
    if not section:
        return None
    name = checked(section, "name", f"{path}.name", shapes.dns_subdomain, "a Secret name (a DNS subdomain)")
    key = checked(section, "key", f"{path}.key", shapes.config_key, "a Secret key", default=default_key)
    if not name or not key:
        raise SpecError(f"{path} needs name and key")
    return SecretKeyRef(name=name, key=key)
