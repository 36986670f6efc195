"""How measured numbers are reported (manifest, Job result, logs): finite values only, rounded.

One rule for every report: a value that is not a finite number (a NaN Spearman of a constant model, an infinite
difference) was not measured, so it is left out of a mapping, or written as ``None`` (JSON null) where the key has
to stay, as in a line of the recipe search. JSON has no NaN, and the operator reads these numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def finite(value: object) -> float | None:
    """``value`` as a float when it is a finite number, else None (bools count as numbers, as ``isinstance`` does)."""
    if not isinstance(value, int | float):
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def round_finite(value: object, digits: int) -> float | None:
    """``value`` rounded to ``digits`` decimals, or None when it is not a finite number."""
    v = finite(value)
    return None if v is None else round(v, digits)


def finite_values(values: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers of ``values`` as floats, unrounded (the manifest keeps full precision)."""
    return {k: v for k, raw in values.items() if (v := finite(raw)) is not None}


def rounded(values: Mapping[str, object], digits: int = 5) -> dict[str, float]:
    """The finite numbers of ``values``, rounded to ``digits`` decimals (what the Job result and logs report)."""
    return {k: v for k, raw in values.items() if (v := round_finite(raw, digits)) is not None}
