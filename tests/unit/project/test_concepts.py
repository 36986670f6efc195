"""docs/architecture.md's "Where each concept lives" names real paths, and each rule and default the house (issue
59) found defined several times is defined once: a second definition is a concept with two homes again."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = ROOT / "operator" / "rerank_operator"
SOURCES = [p for d in ("operator", "rerank_contracts", "quantizer_job", "quality_guard")
           for p in (ROOT / d).rglob("*.py")]


def concept_paths() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Where each concept lives", 1)[1].split("```", 1)[0]
    return sorted(set(re.findall(r"`([\w./]+(?:/|\.py))`", table)))


@pytest.mark.parametrize("path", concept_paths())
def test_every_path_of_the_concept_table_exists(path: str) -> None:
    candidates = [ROOT / path, OPERATOR / path, OPERATOR / "core" / path, ROOT / "rerank_contracts" / path]
    assert any(c.exists() for c in candidates), f"docs/architecture.md names {path}, which does not exist"


#: A definition, by the pattern that finds it, and the one module allowed to hold it.
ONE_HOME = {
    "ModelKey": (r"^ModelKey\s*=", "operator/rerank_operator/core/names.py"),
    "wake_pool": (r"^def wake_pool\b", "operator/rerank_operator/core/names.py"),
    # The rule itself (every enabled pool at minReplicas 0), whatever the function around it is called.
    "scales to zero": (r"min_replicas == 0 for|\"minReplicas\"\) == 0", "operator/rerank_operator/core/spec/model.py"),
    "the quality gate's Spearman default": (r"^\s*DEFAULT_MIN_SPEARMAN\s*=|min_spearman: float = 0\.99",
                                            "rerank_contracts/quantize_job.py"),
    "the quality gate's top-k default": (r"^\s*DEFAULT_MIN_TOPK_AGREEMENT\s*=|min_topk\w*: float = 0\.9\b",
                                         "rerank_contracts/quantize_job.py"),
    "the traffic split": (r"^def split\(", "operator/rerank_operator/core/autoscale/split.py"),
    "GuardSettings": (r"^class GuardSettings\b", "operator/rerank_operator/core/platform.py"),
    "the guard's configuration": (r"^class (Guard)?Config\b", "rerank_contracts/guard.py"),
    "the mirror token's header": (r"^MIRROR_TOKEN_HEADER\s*=", "rerank_contracts/guard.py"),
    "the recorded decision's reader": (r"^class RecordedDecision\b",
                                       "operator/rerank_operator/core/autoscale/recorded.py"),
    "the JSON log line": (r"^class JsonLines\b", "rerank_contracts/log_lines.py"),
}


@pytest.mark.parametrize("concept", sorted(ONE_HOME))
def test_each_rule_and_default_is_defined_once(concept: str) -> None:
    pattern, home = ONE_HOME[concept]
    found = sorted(str(p.relative_to(ROOT)) for p in SOURCES if re.search(pattern, p.read_text(), re.M))
    assert found == [home], f"{concept}: defined in {found}, its one home is {home}"
