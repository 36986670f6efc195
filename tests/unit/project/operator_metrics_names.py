"""The metric names the operator exports, read from its source: what the dashboard and the alert rules may use."""

from __future__ import annotations

import re
from pathlib import Path

OPERATOR_SRC = Path(__file__).resolve().parents[3] / "operator" / "rerank_operator"
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def operator_metric_names() -> set[str]:
    """Every rerank_operator_* string literal in the operator's code, with what prometheus_client exposes for it."""
    names: set[str] = set()
    for f in OPERATOR_SRC.rglob("*.py"):
        names |= set(re.findall(r"""["'](rerank_operator_[a-z0-9_]+)["']""", f.read_text()))
    exposed = set(names)
    for n in names:
        base = n.removesuffix("_total")
        exposed |= {base, base + "_total", *(base + s for s in HIST_SUFFIXES)}
    return exposed
