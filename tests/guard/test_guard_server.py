"""quality_guard.server against pools that really score: three TEI-like servers (tests/guard/scoring_server.py)
run ONNX Runtime on a tiny cross-encoder exported by the Job's own export: the reference (FP32), a healthy pool
(the same FP32 graph on its own server, one pair per batch: float differences only) and a broken pool (the INT8 of
that model served with a truncation at 12 tokens, as a pool whose max input length is wrong)."""

from __future__ import annotations

import dataclasses
import json
import random
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from quality_guard import detector, endpoints, reference, server
from quality_guard.checks import Guard
from quantizer_job.steps.evaluation import evaldata
from quantizer_job.steps.tei import textenc
from rerank_contracts.guard import LOCAL_REFERENCE, Floor, GuardConfig
from tests.guard.scoring_server import ScoringServer, tiny_pools

pytestmark = [pytest.mark.quantizer, pytest.mark.slow]


def requests() -> list[dict[str, Any]]:
    by_query: dict[str, list[str]] = {}
    for p in evaldata.builtin_pairs():
        by_query.setdefault(p.query, []).append(p.text)
    return [{"query": q, "texts": ts} for q, ts in by_query.items()]


@pytest.fixture(scope="module")
def pools_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("guard")


@pytest.fixture(scope="module")
def pools(pools_dir: Path) -> Iterator[dict[str, ScoringServer]]:
    servers = tiny_pools(pools_dir)
    yield servers
    for s in servers.values():
        s.close()


def config(pools: dict[str, ScoringServer], **kw: Any) -> GuardConfig:
    """A guard posted to by hand (no route's token here: tests/guard/test_guard_intake.py checks tokens)."""
    return GuardConfig(namespace="team-a", model="search", reference=pools["reference"].url,
                       pools={"cpu": pools["cpu"].url, "truncated": pools["truncated"].url}, accept_unsigned=True,
                       **kw)


def test_tei_answers_are_put_back_in_text_order() -> None:
    assert endpoints.tei_scores([{"index": 1, "score": 0.9}, {"index": 0, "score": 0.2}], 2) == [0.2, 0.9]
    with pytest.raises(ValueError):
        endpoints.tei_scores([{"index": 0, "score": 0.9}], 2)


def test_the_guard_tells_the_broken_pool_from_the_healthy_one(pools: dict[str, ScoringServer]) -> None:
    guard = Guard(config(pools, fraction=1.0, calls_per_second=1e6))
    rng = random.Random(0)
    reqs = requests()
    for _ in range(200):
        body = rng.choice(reqs)
        assert guard.offer(body)
        got = guard.check(body)
        assert set(got) == {"cpu", "truncated"}
    assert guard.detectors["truncated"].state == "below_floor"
    assert guard.detectors["cpu"].state == "healthy"
    cpu = guard.detectors["cpu"].status().figures
    assert cpu.spearman.mean > 0.999 and cpu.topk.mean == 1.0 and cpu.failures == 0
    text = guard.metrics().decode()
    labels = 'namespace="team-a",pool="{}",rerankmodel="search"'
    assert f"rerank_guard_below_floor{{{labels.format('truncated')}}} 1.0" in text
    assert f"rerank_guard_below_floor{{{labels.format('cpu')}}} 0.0" in text
    assert f"rerank_guard_transitions_total{{{labels.format('truncated')}}} 1.0" in text
    m = re.search(r'rerank_guard_spearman\{namespace="team-a",pool="truncated",rerankmodel="search"\} (\S+)', text)
    assert m and float(m.group(1)) < Floor().min_spearman


def test_mirrored_requests_over_http_within_the_budget(pools: dict[str, ScoringServer]) -> None:
    calls_before = {n: s.calls for n, s in pools.items()}
    now = [0.0]
    guard = Guard(config(pools, fraction=1.0, calls_per_second=3.0), clock=lambda: now[0])
    running = server.serve(guard)
    try:
        sampled = 0
        for i, body in enumerate(requests() * 2):  # 24 copies in "1 second": the budget allows 2 samples
            if i == 20:
                now[0] = 1.0  # a second later: 3 more calls, one more sample
            req = urllib.request.Request(running.url + "/rerank", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                assert resp.status == 202
                sampled += json.loads(resp.read())["sampled"]
        bad = urllib.request.Request(running.url + "/rerank", data=b'{"query": 1}', method="POST")
        with urllib.request.urlopen(bad, timeout=30) as resp:
            assert json.loads(resp.read())["sampled"] is False
        deadline = time.monotonic() + 60
        while running.worker.done < sampled and time.monotonic() < deadline:
            time.sleep(0.05)
        with urllib.request.urlopen(running.url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
    finally:
        running.stop()
    assert sampled == 3  # burst of 6 calls = 2 samples of 3 calls each, then 3 calls refilled = 1 more
    for name, s in pools.items():
        assert s.calls - calls_before[name] == sampled  # each sampled request asked each server once
    assert 'rerank_guard_requests_total{namespace="team-a",outcome="sampled",rerankmodel="search"} 3.0' in text
    assert 'rerank_guard_requests_total{namespace="team-a",outcome="over_budget",rerankmodel="search"} 21.0' in text
    assert 'rerank_guard_requests_total{namespace="team-a",outcome="invalid",rerankmodel="search"} 1.0' in text
    assert 'rerank_guard_window_requests{namespace="team-a",pool="cpu",rerankmodel="search"} 3.0' in text


def test_a_pool_that_does_not_answer_is_an_error_not_a_ranking(pools: dict[str, ScoringServer]) -> None:
    cfg = GuardConfig(namespace="n", model="m", reference=pools["reference"].url,
                        pools={"cpu": pools["cpu"].url, "gone": "http://127.0.0.1:9"}, fraction=1.0,
                        calls_per_second=1e6, timeout_seconds=2.0)
    guard = Guard(cfg)
    body = requests()[0]
    assert guard.offer(body)
    assert set(guard.check(body)) == {"cpu"}
    assert guard.detectors["gone"].samples == 0
    assert 'rerank_guard_pool_errors_total{namespace="n",pool="gone",rerankmodel="m"} 1.0' in guard.metrics().decode()


def test_without_mirrored_traffic_the_guard_replays_the_artifacts_evaluation_pairs(
        pools: dict[str, ScoringServer], tmp_path: Path) -> None:
    # The file the Job writes beside the artifact (contract.EVALUATION_FILE), from the same pairs it verified on.
    pairs = tmp_path / "evaluation.jsonl"
    pairs.write_text("".join(json.dumps({"query": p.query, "text": p.text}) + "\n" for p in evaldata.builtin_pairs()))
    small = detector.Settings(window=20, min_samples=10, recovery_window=40, check_every=1, max_failure_rate=0.1)
    guard = Guard(config(pools, fraction=1.0, calls_per_second=1e6, evidence=dataclasses.asdict(small),
                         replay=str(pairs), replay_per_second=40.0))
    running = server.serve(guard)  # nothing is ever POSTed: the replay alone feeds it
    try:
        deadline = time.monotonic() + 60
        while guard.detectors["truncated"].state != "below_floor" and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        running.stop()
    assert guard.detectors["truncated"].state == "below_floor"
    assert guard.detectors["cpu"].state == "healthy" and guard.detectors["cpu"].samples >= 10
    # The replay is paced and within the budget like mirrored copies: every one was sampled and checked.
    assert guard.detectors["cpu"].samples == guard.detectors["truncated"].samples


# --- a model without a GPU pool: the guard's own FP32 reference --------------------------------------------------

def test_the_local_reference_scores_the_original_weights_as_the_fp32_export_does(
        pools: dict[str, ScoringServer], pools_dir: Path) -> None:
    """PyTorch on the published original/ vs ONNX Runtime on the Job's FP32 export of the same weights: the same
    function, so the same scores up to float noise, in TEI's sigmoid form and raw."""
    local = reference.LocalReference(pools_dir / "original", threads=1)
    post = endpoints.http_post(10.0)
    for body in requests():
        for raw in (False, True):
            b = {**body, "raw_scores": raw}
            ours, exported = local(b), post(pools["reference"].url, b)
            assert len(ours) == len(b["texts"])
            assert max(abs(x - y) for x, y in zip(ours, exported, strict=True)) < 1e-4, (b["query"], ours, exported)


def test_with_a_local_reference_the_guard_tells_the_broken_pool_from_the_healthy_one(
        pools: dict[str, ScoringServer], pools_dir: Path) -> None:
    calls = pools["reference"].calls
    guard = Guard(GuardConfig(namespace="team-a", model="cpu-only", reference=LOCAL_REFERENCE,
                                       reference_model=str(pools_dir / "original"), fraction=1.0,
                                       calls_per_second=1e6,
                                       pools={"cpu": pools["cpu"].url, "truncated": pools["truncated"].url}))
    assert guard.local is not None
    rng = random.Random(1)
    reqs = requests()
    for _ in range(200):
        body = rng.choice(reqs)
        assert guard.offer(body)
        assert set(guard.check(body)) == {"cpu", "truncated"}
    assert guard.detectors["truncated"].state == "below_floor"
    assert guard.detectors["cpu"].state == "healthy"
    cpu = guard.detectors["cpu"].status().figures
    assert cpu.spearman.mean > 0.999 and cpu.topk.mean == 1.0 and cpu.failures == 0
    assert pools["reference"].calls == calls  # no TEI reference was asked


def test_a_local_reference_that_cannot_load_is_a_reference_error_not_a_verdict(
        pools: dict[str, ScoringServer], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reference_model"):
        GuardConfig(namespace="n", model="m", reference=LOCAL_REFERENCE, pools={"cpu": pools["cpu"].url})
    guard = Guard(GuardConfig(namespace="n", model="m", reference=LOCAL_REFERENCE,
                                       reference_model=str(tmp_path / "missing"), fraction=1.0,
                                       calls_per_second=1e6, pools={"cpu": pools["cpu"].url}))
    body = requests()[0]
    for _ in range(2):
        assert guard.offer(body)
        assert guard.check(body) == {}
    assert guard.detectors["cpu"].samples == 0
    text = guard.metrics().decode()
    assert 'rerank_guard_requests_total{namespace="n",outcome="reference_error",rerankmodel="m"} 2.0' in text


def test_the_local_reference_takes_teis_max_input_length_not_the_jobs_cap(tmp_path: Path) -> None:
    """TEI's router: a Sentence Transformers config's max_seq_length, else max_position_embeddings less the position
    offset (pad_token_id + 1 for the RoBERTa family); with --auto-truncate, at most --max-batch-tokens."""
    xlmr = {"model_type": "xlm-roberta", "max_position_embeddings": 8194, "pad_token_id": 1}
    assert textenc.tei_max_input_length(tmp_path, xlmr) == 8192  # bge-reranker-v2-m3: not the Job's 512
    assert textenc.tei_max_input_length(tmp_path, xlmr, max_batch_tokens=4096) == 4096
    assert textenc.tei_max_input_length(tmp_path, {"model_type": "bert", "max_position_embeddings": 512}) == 512
    (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))
    assert textenc.tei_max_input_length(tmp_path, xlmr) == 256


def test_the_local_reference_truncates_long_pairs_as_the_pool_does_or_refuses_them(
        pools: dict[str, ScoringServer], pools_dir: Path) -> None:
    """A passage far over the tiny BERT's 512 tokens: truncated (the request's direction, longest-first) to the same
    scores the FP32 export gives truncated at 512; refused, as TEI refuses it, when neither the request nor the pool
    truncates."""
    # ~1,000 tokens: different text at each end, so left and right truncation keep different halves.
    long_text = ("the cat sat on the mat and purred. " + " ".join(str(i) for i in range(700))
                 + " stock markets fell sharply on monday.")
    body = {"query": "where did the cat sit", "texts": [long_text, "stocks fell on monday"]}
    local = reference.LocalReference(pools_dir / "original", threads=1)
    ours, exported = local(body), endpoints.http_post(10.0)(pools["reference"].url, body)
    assert local.max_length == 512
    assert max(abs(x - y) for x, y in zip(ours, exported, strict=True)) < 1e-4
    left = local({**body, "truncation_direction": "Left"})
    assert abs(left[0] - ours[0]) > 1e-6 and abs(left[1] - ours[1]) < 1e-6  # only the long pair loses its other end
    with pytest.raises(ValueError, match="over TEI's max input length 512"):
        local({**body, "truncate": False})
    strict = reference.LocalReference(pools_dir / "original", threads=1, auto_truncate=False)
    with pytest.raises(ValueError, match="TEI refuses"):
        strict(body)
    assert strict({**body, "truncate": True}) == pytest.approx(ours, abs=1e-6)


def test_a_guard_process_whose_reference_cannot_load_exits(tmp_path: Path) -> None:
    """In its pod the guard exits (CrashLoopBackOff, no verdict) rather than stay Ready and judge nothing."""
    config = {"namespace": "n", "model": "m", "pools": {"cpu": "http://127.0.0.1:9"}, "reference": LOCAL_REFERENCE,
              "reference_model": str(tmp_path / "missing")}
    path = tmp_path / "guard.json"
    path.write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "quality_guard.server", "--config", str(path), "--port", "0",
                           "--host", "127.0.0.1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "the FP32 reference could not be loaded" in proc.stderr and "missing" in proc.stderr
