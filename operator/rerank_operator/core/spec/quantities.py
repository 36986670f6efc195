"""Kubernetes resource quantities ("500m", "16Gi", 2) as exact Decimals, for comparisons the operator must make
itself (class limits, requests against limits, a claim's size). Pure."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
           "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def parse_quantity(value: str | int | float) -> Decimal:
    """A Kubernetes resource quantity as a Decimal in base units; ValueError when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    match = _QUANTITY.match(str(value).strip())
    if not match or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    try:
        return Decimal(match.group(1)) * Decimal(str(_SUFFIX[match.group(2)]))
    except InvalidOperation as err:
        raise ValueError(f"not a Kubernetes quantity: {value!r}") from err
