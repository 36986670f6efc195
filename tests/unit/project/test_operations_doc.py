"""docs/operations.md troubleshoots by condition reason: every reason the operator or the Job can set is there."""

from __future__ import annotations

import re
from pathlib import Path

from rerank_contracts import quantize_job
from rerank_operator.core.status import conditions

REPO_ROOT = Path(__file__).resolve().parents[3]
OPERATOR_SRC = REPO_ROOT / "operator" / "rerank_operator"
DOC = REPO_ROOT / "docs" / "operations.md"
NOT_REASONS = {"True", "False", "Unknown", "Running", "Failed", "Succeeded"}  # statuses and Job states


def literal_reasons() -> set[str]:
    """CamelCase literals still passed to the operator's Verdict / Condition / JobOutcome constructors."""
    found: set[str] = set()
    for f in OPERATOR_SRC.rglob("*.py"):
        text = f.read_text()
        for call in re.finditer(r"\b(?:Verdict|Condition|JobOutcome)\(([^()]*(?:\([^()]*\)[^()]*)*)\)", text, re.S):
            found |= set(re.findall(r'"([A-Z][A-Za-z]+)"', call.group(1)))
    return found - NOT_REASONS


def test_reasons_are_constants_in_one_module() -> None:
    assert not literal_reasons() - conditions.reasons(), "a reason written as a literal: make it a REASON_ constant"
    assert {"Serving", "ClassNotFound", "QuotaExceeded", "RecoveringResult", "HTTPRoute"} <= conditions.reasons()


def test_every_reason_is_documented() -> None:
    doc = DOC.read_text()
    reasons = conditions.reasons() | literal_reasons() | set(quantize_job.FAILURE_REASONS)
    assert {"Serving", "QualityGateFailed"} <= reasons
    missing = sorted(r for r in reasons if f"`{r}`" not in doc)
    assert not missing, f"docs/operations.md does not explain: {missing}"
