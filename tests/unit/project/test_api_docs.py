"""docs/api-reference.md is generated from the CRDs in crds/ by hack/gen_api_docs.py (``rerank_devcluster.api_docs``);
it must not go stale."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from rerank_devcluster import api_docs as gen

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_committed_api_reference_is_current() -> None:
    committed = (REPO_ROOT / "docs" / "api-reference.md").read_text()
    assert committed == gen.generate(), "docs/api-reference.md is stale: run python hack/gen_api_docs.py"


def _fields(path: str, schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for name, sub in schema.get("properties", {}).items():
        yield path, name, sub
        child = sub.get("items", {}) if sub.get("type") == "array" else sub
        yield from _fields(f"{path}.{name}" + ("[]" if sub.get("type") == "array" else ""), child)


def test_every_field_default_and_rule_is_documented() -> None:
    text = gen.generate()
    crds = [d for f in (REPO_ROOT / "crds").glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    assert any(c["spec"]["names"]["kind"] == "RerankModel" for c in crds)
    for crd in crds:
        (version,) = crd["spec"]["versions"]
        kind = crd["spec"]["names"]["kind"]
        assert f"\n## {kind}\n" in text
        schema = version["schema"]["openAPIV3Schema"]
        for parent, name, sub in _fields("", schema):
            section = f"### {kind}: `{parent.lstrip('.') or '(root)'}`"
            assert section in text, section
            body = text.split(section, 1)[1].split("\n### ", 1)[0]
            assert f"`{name}`" in body, f"{parent}.{name} missing"
            if "default" in sub:
                assert gen.code(json.dumps(sub["default"], sort_keys=True)) in body, f"{parent}.{name} default"
            for rule in sub.get("x-kubernetes-validations", []):
                assert " ".join(rule["rule"].split()).replace("|", "\\|") in text or \
                    " ".join(rule["rule"].split()) in text, rule["rule"]


def test_check_mode_detects_staleness(tmp_path: Path) -> None:
    stale = tmp_path / "api.md"
    stale.write_text("old\n")
    assert gen.main(["--check", "--output", str(stale)]) == 1
    assert gen.main(["--output", str(stale)]) == 0
    assert gen.main(["--check", "--output", str(stale)]) == 0
