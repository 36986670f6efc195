"""Nested lookups over plain dicts, as the API returns them (missing and null are the same). Pure."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

Obj = Mapping[str, Any]


def get(obj: Obj, *path: str) -> Any:
    """Nested lookup that treats missing and null as an empty mapping on the way down."""
    for key in path:
        obj = (obj or {}).get(key) or {}
    return obj


def set_default(obj: dict[str, Any], key: str, value: Any) -> None:
    if value not in (None, "", {}, []) and obj.get(key) in (None, "", {}, []):
        obj[key] = copy.deepcopy(value)
