"""The guard's live sample (quality_guard/sample.py): bounded by pairs and by age, written atomically in the format the
quantization Job reads, taken up again by a restarted guard; and the guard process recording mirrored requests only
(never its replayed evaluation pairs), exporting the sample's size for the operator (core/quality/assessment.py reads
it)."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from quality_guard import sample, server
from quality_guard.checks import Guard
from quantizer_job.steps.evaluation import evaldata
from rerank_contracts.guard import MIRROR_TOKEN_HEADER, GuardConfig, LiveSampleSettings
from rerank_operator.core.quality import assessment as quality


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def body(i: int, n: int = 3) -> dict[str, Any]:
    return {"query": f"query {i}", "texts": [f"passage {i}.{j}" for j in range(n)]}


def settings(tmp_path: Path, max_pairs: int = 7, max_age: float = 100.0) -> LiveSampleSettings:
    return LiveSampleSettings(path=str(tmp_path / "samples" / "m" / "live.jsonl"), max_pairs=max_pairs,
                           max_age_seconds=max_age)


def test_the_sample_keeps_the_newest_requests_within_its_pairs(tmp_path: Path) -> None:
    live = sample.LiveSample(settings(tmp_path, max_pairs=7), Clock())
    for i in range(4):
        assert live.add(body(i))
    assert live.pairs == 6  # 12 pairs offered, 7 allowed: whole requests go, oldest first
    live.write()
    lines = [json.loads(x) for x in Path(live.settings.path).read_text().splitlines()]
    assert [x["query"] for x in lines] == ["query 2", "query 3"]
    # What is not a rerank request is not kept; one request larger than the sample is cut, not kept whole.
    assert not live.add({"query": "q"}) and not live.add({"query": " ", "texts": ["a"]}) and not live.add([1])
    assert live.add(body(9, n=10)) and live.pairs == 7


def test_pairs_older_than_the_age_leave_the_sample_even_without_new_traffic(tmp_path: Path) -> None:
    clock = Clock()
    live = sample.LiveSample(settings(tmp_path, max_pairs=100, max_age=100.0), clock)
    live.add(body(1))
    clock.now += 60
    live.add(body(2))
    assert live.write() == 6
    clock.now += 50  # body 1 is 110 s old, body 2 50 s
    assert live.write() == 3
    assert [json.loads(x)["query"] for x in Path(live.settings.path).read_text().splitlines()] == ["query 2"]
    clock.now += 100
    assert live.write() == 0 and Path(live.settings.path).read_text() == ""


def test_the_file_is_what_the_job_reads_and_is_replaced_whole(tmp_path: Path) -> None:
    live = sample.LiveSample(settings(tmp_path, max_pairs=100), Clock())
    for i in range(3):
        live.add(body(i, n=2))
    assert live.write() == 6
    path = Path(live.settings.path)
    pairs = evaldata.load_jsonl(str(path))  # the Job's own reader
    assert [(p.query, p.text) for p in pairs] == [(f"query {i}", f"passage {i}.{j}")
                                                  for i in range(3) for j in range(2)]
    assert os.listdir(path.parent) == ["live.jsonl"]  # no temporary file left behind
    assert path.stat().st_mode & 0o777 == 0o640
    before = path.stat().st_ino
    assert live.write() == 6 and path.stat().st_ino == before  # unchanged: not rewritten
    live.add(body(7))
    live.write()
    assert path.stat().st_ino != before  # a new file renamed over the old one, never written in place


def test_a_restarted_guard_takes_up_the_sample_minus_what_expired(tmp_path: Path) -> None:
    clock = Clock()
    first = sample.LiveSample(settings(tmp_path, max_pairs=100, max_age=100.0), clock)
    first.add(body(1))
    clock.now += 80
    first.add(body(2))
    first.write()
    with open(first.settings.path, "a", encoding="utf-8") as f:
        f.write("{not json\n" + json.dumps({"query": "no time", "texts": ["x"]}) + "\n")
    clock.now += 30  # body 1 has expired meanwhile
    again = sample.LiveSample(first.settings, clock)
    assert again.load() == 3 and again.pairs == 3
    assert again.write() == 3
    assert [json.loads(x)["query"] for x in Path(first.settings.path).read_text().splitlines()] == ["query 2"]
    assert sample.LiveSample(settings(tmp_path / "none"), clock).load() == 0


TOKEN_ENV, TOKEN = "RERANK_GUARD_MIRROR_TOKEN", "the-models-mirror-token"


def post(url: str, payload: Any) -> None:
    """As the route's mirror (or a pool's sampler) sends a copy: with the model's token."""
    req = urllib.request.Request(url + "/rerank", data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json", MIRROR_TOKEN_HEADER: TOKEN})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 202


def test_the_guard_keeps_mirrored_requests_only_and_tells_the_operator_how_many(tmp_path: Path) -> None:
    """Over HTTP as the mirror sends them, with a replay running beside (its pairs are not live traffic); the pools
    answer at once (what they say does not matter here)."""
    replay = tmp_path / "evaluation.jsonl"
    replay.write_text("".join(json.dumps({"query": p.query, "text": p.text}) + "\n" for p in evaldata.builtin_pairs()))
    live = settings(tmp_path, max_pairs=1000, max_age=3600)
    config = GuardConfig(namespace="ns", model="m", pools={"cpu": "http://cpu"}, reference="http://ref",
                           fraction=1.0, calls_per_second=1e6, replay=str(replay), replay_per_second=50.0,
                           live_sample=live, mirror_token_env=TOKEN_ENV)
    guard = Guard(config, post=lambda base, b: [float(i) for i in range(len(b["texts"]))],
                  environ={TOKEN_ENV: TOKEN})
    running = server.serve(guard, sample_every=0.1)
    try:
        for i in range(5):
            post(running.url, body(i, n=4))
        post(running.url, {"query": "not a rerank request"})
        assert running.replayer is not None

        def written() -> float | None:
            page = guard.metrics().decode()
            found = [line for line in page.splitlines() if line.startswith("rerank_guard_live_sample_pairs{")]
            return float(found[0].rsplit(" ", 1)[1]) if found else None

        deadline = time.monotonic() + 10
        while written() != 20.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert written() == 20.0
        assert running.worker.done > 5  # the replay was checked too...
    finally:
        running.stop()
    lines = [json.loads(x) for x in Path(live.path).read_text().splitlines()]
    assert [x["query"] for x in lines] == [f"query {i}" for i in range(5)]  # ...but never kept
    # The operator's reading of the same page (the metric's name and labels are the contract between the two).
    verdict = quality.parse_metrics(guard.metrics().decode(), "ns", "m")
    assert verdict.live_pairs == 20
    assert quality.parse_metrics(guard.metrics().decode(), "ns", "other").live_pairs == 0


def test_a_live_sample_config_is_checked() -> None:
    with pytest.raises(ValueError, match="max_pairs"):
        LiveSampleSettings(**{"path": "/x", "max_pairs": 0, "max_age_seconds": 1})
    config = GuardConfig.from_dict({"namespace": "n", "model": "m", "pools": {}, "reference": "http://r",
                                      "live_sample": {"path": "/s/live.jsonl", "max_pairs": 500,
                                                      "max_age_seconds": 3600}})
    assert config.live_sample == LiveSampleSettings("/s/live.jsonl", 500, 3600.0)


def test_long_passages_are_bounded_by_bytes_too(tmp_path: Path) -> None:
    live = sample.LiveSample(settings(tmp_path, max_pairs=1000), Clock(), max_bytes=10_000)
    for i in range(20):
        live.add({"query": f"q{i}", "texts": ["x" * 1000, "y" * 1000]})
    assert 0 < live.pairs <= 10  # 2 KB a request: at most 5 of them
    live.write()
    assert Path(live.settings.path).stat().st_size <= 10_000


def test_a_sample_that_cannot_be_written_is_counted_and_checks_go_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    live = LiveSampleSettings(path=str(blocker / "live.jsonl"), max_pairs=1000, max_age_seconds=60)
    guard = Guard(GuardConfig(namespace="ns", model="m", pools={"cpu": "http://cpu"},
                                       reference="http://ref", live_sample=live), post=lambda base, b: [0.0])
    guard.remember(body(1))
    guard.write_sample()
    page = guard.metrics().decode()
    assert 'rerank_guard_live_sample_write_errors_total{namespace="ns",rerankmodel="m"} 1.0' in page
    assert 'rerank_guard_live_sample_pairs{namespace="ns",rerankmodel="m"} 0.0' in page
