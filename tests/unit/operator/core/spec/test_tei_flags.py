"""The TEI flag allow-list: the CRD's CEL (apply time) and tei_flags.py (the operator's parser) agree, and it refuses
what a deny-list let through (short forms, deprecated aliases, secrets, flags split from their values)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import parse as spec_parse
from rerank_operator.core.spec import tei_flags

CRD = yaml.safe_load((Path(__file__).resolve().parents[5] / "crds" / "rerankmodel.yaml").read_text())
POOLS = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["pools"]


@pytest.mark.parametrize("pool", ["cpu", "gpu"])
def test_the_crd_allows_exactly_the_flags_tei_flags_allows(pool: str) -> None:
    extra: dict[str, Any] = POOLS["properties"][pool]["properties"]["tei"]["properties"]["extraArgs"]
    rules = " ".join(r["rule"] for r in extra["items"]["x-kubernetes-validations"])
    listed = "[" + ", ".join(f"'{f}'" for f in tei_flags.ALLOWED) + "]"
    assert listed in rules
    alternation = "^(" + "|".join(f.pattern.strip("^$") for f in tei_flags.ALLOWED.values()) + ")$"
    assert alternation in rules


@pytest.mark.parametrize("args,fragment", [
    (["-p=9000"], "flag -p is not allowed"),
    (["--hf-api-token=hf_x"], "flag --hf-api-token is not allowed; secrets come only from Secret references"),
    (["--hf-token=hf_x"], "flag --hf-token is not allowed; secrets"),
    (["--api-key=k"], "flag --api-key is not allowed; secrets"),
    (["--model-id", "/etc"], "flag --model-id is not allowed"),
    (["--tokenization-workers", "4"], "--tokenization-workers is not valid"),
    (["--payload-limit=0"], "--payload-limit=0 is not valid"),
    (["--served-model-name=-x"], "--served-model-name=-x is not valid"),
    (["--disable-spans=1"], "--disable-spans takes no value"),
    (["--max-batch-requests=1", "--max-batch-requests=2"], "given more than once"),
])
def test_refusals_name_the_flag_and_never_echo_a_secret(args: list[str], fragment: str) -> None:
    found = "; ".join(tei_flags.refusals(args))
    assert fragment in found, found
    assert "hf_x" not in found


def test_allowed_flags_pass_and_reach_the_parser() -> None:
    ok = ["--tokenization-workers=8", "--max-batch-requests=32", "--payload-limit=2000000",
          "--served-model-name=search/bge", "--disable-spans"]
    assert tei_flags.refusals(ok) == []
    parsed = spec_parse.parse({"model": {"id": "a/b"}, "pools": {"cpu": {"tei": {"extraArgs": ok}}}})
    assert parsed.cpu.tei.extra_args == tuple(ok)
    with pytest.raises(specs.SpecError, match=re.escape("pools.gpu.tei.extraArgs: flag --port is not allowed")):
        spec_parse.parse({"model": {"id": "a/b"}, "pools": {"gpu": {"tei": {"extraArgs": ["--port=1"]}}}})
