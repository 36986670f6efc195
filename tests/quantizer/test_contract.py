"""The operator <-> Job contract: command line round trip and the termination message size."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rerank_contracts import quantize_job
from rerank_contracts.quantize_job import JobRequest, JobResult

pytestmark = pytest.mark.quantizer

_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40).filter(
    lambda s: not s.startswith("-"))

requests = st.builds(
    JobRequest,
    model=_text, output_root=_text, artifact_id=_text,
    revision=st.none() | _text,
    mode=st.sampled_from(["dynamic", "static"]),
    target=st.sampled_from(["auto", "avx512_vnni", "avx2", "arm64"]),
    recipe=st.sampled_from(["auto", "fixed"]),
    per_channel=st.booleans(), reduce_range=st.booleans(),
    operators=st.lists(st.sampled_from(["MatMul", "Attention", "Gather", "Gemm"]), min_size=1, max_size=3,
                       unique=True).map(tuple),
    optimization_level=st.sampled_from([0, 1, 2, 99]),
    eval_pairs=st.none() | _text, calibration_pairs=st.none() | _text,
    min_spearman=st.floats(0, 1), min_topk_agreement=st.floats(0, 1),
    topk=st.integers(1, 50), time_budget_seconds=st.integers(1, 10_000), keep_original=st.booleans(),
    serve_threads=st.integers(0, 64), serve_batch_tokens=st.integers(0, 1 << 20),
)


@settings(max_examples=100, deadline=None)
@given(requests)
def test_build_args_parse_args_round_trip(req):
    assert quantize_job.parse_args(quantize_job.build_args(req)) == req


def test_result_message_stays_under_limit_with_huge_message():
    res = JobResult(ok=False, reason="QualityGateFailed", message="x" * 100_000 + "é" * 5000, artifact_id="a" * 64,
                    quality={"spearman": 0.5, "topk_agreement": 0.3}, speed={"speedup": 2.0},
                    recipe={"name": "r", "tried": [{"name": f"r{i}", "passed": False} for i in range(20)]})
    text = res.to_message()
    assert len(text.encode()) <= quantize_job.MAX_MESSAGE_BYTES
    back = quantize_job.parse_result(text)
    assert back.reason == "QualityGateFailed" and back.quality == res.quality and back.recipe == res.recipe
    assert back.message and back.message == res.message[: len(back.message)]


def test_result_round_trip_small():
    res = JobResult(ok=True, reason="Published", message="ok", artifact_id="id", path="/models/artifacts/id",
                    size_bytes=123, quality={"spearman": 0.997})
    assert quantize_job.parse_result(res.to_message()) == res
    with pytest.raises(quantize_job.ResultParseError):
        quantize_job.parse_result("not json")
    with pytest.raises(quantize_job.ResultParseError):
        quantize_job.parse_result(json.dumps({"message": "no ok"}))
