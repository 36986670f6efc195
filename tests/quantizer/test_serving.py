"""The served-like measurement (quantizer_job.steps.evaluation.serving): TEI's batches in arrival order, tokenization
ahead of inference on worker threads, models in turns, and a speed difference inside the spread being a tie that goes
to ranking quality. Fake sessions and a fake tokenizer stand in for ONNX Runtime, so what is checked is the harness's
bookkeeping; tests/quantizer/test_gate_and_publish.py runs it for real inside the Job."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quantizer_job.steps.evaluation import serving
from quantizer_job.steps.evaluation.evaldata import Pair
from quantizer_job.steps.recipe_search import search
from quantizer_job.steps.recipe_search.recipes import Recipe

pytestmark = pytest.mark.quantizer


def pairs(per_query: dict[str, int]) -> list[Pair]:
    return [Pair(q, f"{q}-t{i}") for q, n in per_query.items() for i in range(n)]


def test_batches_follow_arrival_order_with_at_most_eight_entries_and_no_length_sort() -> None:
    ps = pairs({"q1": 5, "q2": 15, "q3": 1})
    ps[1] = Pair("q1", "a much longer text " * 40)  # a long passage must stay where it arrived
    batches = serving.served_batches(ps)
    assert [len(b) for b in batches] == [8, 8, 5]
    assert [t for b in batches for _, t in b] == [p.text for p in ps]
    assert batches[0][:5] == [(p.query, p.text) for p in ps[:5]] and batches[0][5][0] == "q2"  # a request spans two


def test_a_token_budget_closes_a_batch_before_its_padding_would_exceed_it() -> None:
    """TEI's queue for a padded backend (core/src/queue.rs): an entry joins while max(longest, its tokens) x
    (entries + 1) <= --max-batch-tokens, and a batch is never empty. Budget 512 on a long-tail arrival order:
    100, 60 -> 2 x 100 = 200 fits; + 500 -> 3 x 500 = 1500 does not, so 500 starts the next batch alone (2 x 500);
    then 40 x 8 = 320 <= 512 for the next eight, and the ninth waits for a third batch."""
    lengths = [100, 60, 500, 40, 40, 40, 40, 40, 40, 40, 40, 40]
    assert serving.batch_spans(len(lengths), lengths, 512) == [(0, 2), (2, 3), (3, 11), (11, 12)]
    assert serving.batch_spans(len(lengths), lengths, 1000) == [(0, 2), (2, 4), (4, 12)]  # 2 x 500 fits
    assert serving.batch_spans(len(lengths), lengths, 1500) == [(0, 3), (3, 11), (11, 12)]  # 3 x 500 fits
    assert serving.batch_spans(len(lengths), lengths) == [(0, 8), (8, 12)]  # no budget: 8 at a time
    with pytest.raises(ValueError, match="11 token lengths for 12 entries"):
        serving.batch_spans(len(lengths), lengths[:-1], 512)
    ps = pairs({"q1": 3, "q2": 9})
    batches = serving.served_batches(ps, lengths, 512)
    assert [len(b) for b in batches] == [2, 1, 8, 1] and [t for b in batches for _, t in b] == [p.text for p in ps]
    # The budget bounds what a round costs: the same pairs pad to 4160 tokens in 8s, to 1060 within 512.
    assert sum(serving.padded_seconds(lengths, 1.0)) == 8 * 500 + 4 * 40
    assert sum(serving.padded_seconds(lengths, 1.0, 512)) == 200 + 500 + 320 + 40


def test_one_round_takes_about_the_timing_budget_and_at_least_two_batches() -> None:
    ps = pairs({f"q{i}": 8 for i in range(10)})
    assert serving.round_batches(ps, 16.0, 2.0 / serving.ROUND_UNITS) == serving.served_batches(ps)[:4]
    batches = [[("q", str(i))] * 8 for i in range(10)]
    assert len(serving.take_seconds(batches, pairs_per_s=16.0, seconds=2.0)) == 4  # 32 pairs wanted
    assert len(serving.take_seconds(batches, pairs_per_s=1.0, seconds=1.0)) == 2  # the minimum
    assert len(serving.take_seconds(batches, pairs_per_s=1000.0, seconds=5.0)) == 10  # all there is
    assert len(serving.take_seconds(batches, pairs_per_s=0.0, seconds=5.0)) == 10


def test_a_batch_that_alone_fills_the_round_is_the_round() -> None:
    """A 568M model: FP32 at 1.7 pairs/s (sorted), so the pair count asks for ~10 pairs, i.e. two batches; the
    first arrival-order batch pads 8 pairs to 512 tokens, ~12 s at the kernel's token rate, more than the round's
    6 s: one batch. A small model's first batch is a sliver of its round: the pair count decides, as before."""
    ps = pairs({f"q{i}": 8 for i in range(10)})
    lengths = [512 if i % 8 == 3 else 40 for i in range(len(ps))]
    tokens_per_s = 1.7 * 200  # pairs/s x padded tokens per pair of the sorted batches
    assert serving.padded_seconds(lengths[:8], tokens_per_s)[0] == pytest.approx(8 * 512 / tokens_per_s)
    assert len(serving.round_batches(ps, 1.7, 2.0)) == 2  # without lengths: the two-batch minimum
    assert serving.round_batches(ps, 1.7, 2.0, lengths, tokens_per_s) == serving.served_batches(ps)[:1]
    small = serving.round_batches(ps, 16.0, 2.0 / serving.ROUND_UNITS, lengths, kernel_tokens_per_s=16000.0)
    assert small == serving.round_batches(ps, 16.0, 2.0 / serving.ROUND_UNITS) == serving.served_batches(ps)[:4]


def test_inference_runs_in_arrival_order_while_workers_tokenize_ahead() -> None:
    batches = [[("q", str(i))] for i in range(12)]
    ran: list[int] = []
    encoders: set[str] = set()

    def encode(batch: serving.Batch) -> dict[str, np.ndarray]:
        encoders.add(threading.current_thread().name)
        time.sleep(0.002 * (int(batch[0][1]) % 3))  # out-of-order completion between workers
        return {"input_ids": np.array([[int(batch[0][1])]])}

    def run(feed: dict[str, np.ndarray]) -> object:
        ran.append(int(feed["input_ids"][0, 0]))
        return None

    seconds = serving.serve_pass(run, encode, batches, workers=3)
    assert ran == list(range(12)) and seconds > 0
    assert len(encoders) == 3 and threading.current_thread().name not in encoders  # tokenized off the main thread


def test_a_tokenizer_error_is_raised_not_waited_for() -> None:
    def encode(batch: serving.Batch) -> dict[str, np.ndarray]:
        if batch[0][1] == "3":
            raise ValueError("cannot tokenize 3")
        return {"input_ids": np.array([[0]])}

    with pytest.raises(ValueError, match="cannot tokenize 3"):
        serving.serve_pass(lambda feed: None, encode, [[("q", str(i))] for i in range(6)], workers=2)


def test_models_take_turns_in_a_rotating_order() -> None:
    order: list[str] = []

    def timed(name: str, secs: float) -> Callable[[], float]:
        def one() -> float:
            order.append(name)
            return secs
        return one

    seconds = serving.in_turns({"fp32": timed("fp32", 2.0), "int8": timed("int8", 1.0)}, rounds=3)
    assert order == ["fp32", "int8", "int8", "fp32", "fp32", "int8"]
    assert seconds == {"fp32": [2.0, 2.0, 2.0], "int8": [1.0, 1.0, 1.0]}


def test_speedups_are_per_round_ratios_with_their_range() -> None:
    s = serving.speedups({"fp32": [2.0, 3.0, 2.2], "int8": [1.0, 1.0, 1.1]})["int8"]
    assert (s.median, s.low, s.high) == (pytest.approx(2.0), pytest.approx(2.0), pytest.approx(3.0))
    f = serving.figures({"fp32": [2.0, 3.0, 2.2], "int8": [1.0, 1.0, 1.1]}, pairs=44)
    assert f["fp32_pairs_per_s"] == pytest.approx(20.0) and f["int8_pairs_per_s"] == pytest.approx(44.0)
    assert (f["speedup"], f["speedup_low"], f["speedup_high"]) == (s.median, s.low, s.high)


def test_a_speed_difference_inside_the_spread_goes_to_quality() -> None:
    fast_worse = (serving.Spread(2.05, 1.95, 2.15), (0.990, 0.90))
    tied_better = (serving.Spread(2.00, 1.90, 2.10), (0.997, 0.95))
    clearly_slower_best = (serving.Spread(1.50, 1.45, 1.55), (0.999, 1.00))
    assert serving.prefer({"a": fast_worse, "b": tied_better, "c": clearly_slower_best}) == "b"
    separated = (serving.Spread(2.50, 2.40, 2.60), (0.990, 0.90))
    assert serving.prefer({"a": separated, "b": tied_better}) == "a"


def test_a_wide_range_from_a_loaded_machine_does_not_make_a_slow_candidate_a_tie() -> None:
    # Seen under load: a slow candidate's range [1.17, 2.60] overlapped every other one and won on quality.
    noisy_slow_best = (serving.Spread(1.45, 1.17, 2.60), (0.998, 0.95))
    fast = (serving.Spread(1.91, 1.87, 1.97), (0.995, 0.95))
    assert serving.prefer({"slow": noisy_slow_best, "fast": fast}) == "fast"
    # Inside the fastest's range but more than 5% below its median: still not a tie (noise costs at most 5%).
    wide_fastest = serving.Spread(2.00, 1.70, 2.10)
    assert not serving.ties(wide_fastest, serving.Spread(1.85, 1.80, 1.90))
    assert serving.ties(wide_fastest, serving.Spread(1.92, 1.80, 2.00))


def test_the_search_chooses_by_the_served_spread() -> None:
    def trial(name: str, spearman: float, speed: tuple[float, float, float]) -> search.Trial:
        mid, low, high = speed
        return search.Trial(recipe=Recipe(name=name), path=Path(f"/work/{name}/model.onnx"),
                            quality={"spearman": spearman, "topk_agreement": 0.95},
                            speed={"int8_pairs_per_s": 100 * mid, "speedup": mid, "speedup_low": low,
                                   "speedup_high": high, "size_ratio": 0.26}, why=[])

    noisy_tie = [trial("fast", 0.991, (2.04, 1.99, 2.20)), trial("ranks-better", 0.996, (2.00, 1.85, 2.15))]
    chosen = search.choose(noisy_tie)
    assert chosen is not None and chosen.recipe.name == "ranks-better"
    line = search.tried_line(noisy_tie[0])
    assert line["spread"] == [1.99, 2.2] and line["speedup"] == 2.04
    for a, b in itertools.permutations(noisy_tie):  # the order tried does not matter
        got = search.choose([a, b])
        assert got is not None and got.recipe.name == "ranks-better"



@pytest.mark.parametrize("pool, job, expect", [(0, 4, 4), (2, 4, 2), (8, 4, 4), (1, 1, 1)])
def test_the_pool_thread_count_is_measured_within_the_jobs_own_cpus(pool: int, job: int, expect: int) -> None:
    from quantizer_job.stages import measurement, stage_data
    from rerank_contracts.quantize_job import JobRequest

    req = JobRequest(model="m", output_root="/v", artifact_id="a", serve_threads=pool)
    ctx = stage_data.Context(req=req, tmp=Path("/tmp/x"), threads=job, elapsed=lambda: 0.0)
    assert measurement.serve_threads(ctx) == expect
    assert serving.tokenization_workers(expect) == max(1, expect - 1)


def test_the_default_eval_set_is_sized_on_a_median_length_batch_after_a_one_pair_warm_up(bert_model: Path) -> None:
    """``fp32_reference._default_eval_size``: two runs only (the shortest pair to warm up, then 8 pairs around the
    median length, timed), and the set capped to what the FP32 speed allows in its share of the budget, never below
    74."""
    from quantizer_job.stages import fp32_reference
    from quantizer_job.steps.evaluation import evaldata
    from quantizer_job.steps.tei import textenc

    tok = textenc.load_tokenizer(str(bert_model / "tokenizer.json"), 128)
    pairs = evaldata.default_pairs()
    lengths = sorted(textenc.token_lengths(tok, [(p.query, p.text) for p in pairs]))

    class Session:
        def __init__(self, seconds_per_pair: float) -> None:
            self.rows: list[tuple[int, int]] = []
            self.seconds_per_pair = seconds_per_pair

        def get_inputs(self) -> list[Any]:
            return [type("I", (), {"name": n})() for n in ("input_ids", "attention_mask", "token_type_ids")]

        def run(self, _out: list[str], feed: dict[str, np.ndarray]) -> None:
            self.rows.append(feed["input_ids"].shape)
            time.sleep(self.seconds_per_pair * feed["input_ids"].shape[0])

    sess = Session(0.05)  # 20 pairs/s at most (sleeping is a floor on the time, so never faster)
    n = fp32_reference._default_eval_size(sess, tok, 0, pairs, 900)  # 36 s of the budget: ~720 pairs
    assert 400 < n <= 720, n
    (warm_rows, _), (probe_rows, probe_len) = sess.rows
    assert warm_rows == 1 and probe_rows == 8 and len(sess.rows) == 2
    assert lengths[len(lengths) // 2 - 8] <= probe_len <= lengths[len(lengths) // 2 + 8]
    assert fp32_reference._default_eval_size(sess, tok, 0, pairs, 9000) == len(pairs)  # all 840
    floor = fp32_reference.MIN_DEFAULT_EVAL_PAIRS
    assert fp32_reference._default_eval_size(sess, tok, 0, pairs, 90) == floor  # 72 -> floor


def test_only_a_one_batch_round_is_timed_fewer_times() -> None:
    """A MiniLM-size model on long-tail pairs: its multi-batch round pads to several times its intended seconds
    (arrival order), yet it keeps ``ROUNDS`` rounds; only a round that one batch fills may have fewer."""
    ps = pairs({f"q{i}": 8 for i in range(40)})
    lengths = [480 if i % 3 == 0 else 60 for i in range(len(ps))]  # most batches pad to 480 tokens
    small_rate, large_rate = 16.0 * 200, 1.7 * 200  # pairs/s x ~200 padded tokens per pair on sorted batches
    small = serving.round_batches(ps, 16.0, 2.0, lengths, small_rate)
    assert len(small) > 1 and sum(serving.padded_seconds(lengths[: 8 * len(small)], small_rate)) > 12.0
    assert serving.rounds_for(small, serving.first_batch_seconds(lengths, small_rate), 2.0) == serving.ROUNDS
    large = serving.round_batches(ps, 1.7, 2.0, lengths, large_rate)
    assert len(large) == 1
    assert serving.rounds_for(large, serving.first_batch_seconds(lengths, large_rate), 2.0) == 2


def test_a_round_longer_than_meant_counts_for_more_down_to_two_rounds() -> None:
    intended = serving.ROUND_UNITS * 2.0
    assert serving.round_count(intended, 2.0) == serving.ROUNDS  # as meant: 3 rounds
    assert serving.round_count(intended * 1.4, 2.0) == serving.ROUNDS  # ceil(3 / 1.4) = 3
    assert serving.round_count(intended * 1.6, 2.0) == 2  # a 568M model: one batch ~2-3x the round
    assert serving.round_count(intended * 50, 2.0) == 2  # never fewer than two: a spread needs two
