"""Throughput as TEI's ONNX Runtime backend serves it, measured inside the Job, FP32 and INT8 in turns.

Why: the Job used to time each model on its evaluation batches sorted by length, one pre-tokenized batch after the
other. Served through a real TEI router, the artifact it chose that way reached 1.3-1.5x FP32 where the Job
reported 2.0-2.2x, and candidates the Job called tied ranked differently through the router (docs/quantization.md).
What the sorted timing hides, and this harness keeps, is how TEI serves a CPU pod:

- **Arrival order, TEI's batches.** Each query of the evaluation set is one ``/rerank`` request with its texts;
  TEI's queue holds one entry per (query, text) pair and the ORT backend takes at most 8 entries a batch (its
  ``max_batch_size``, which overrides ``--max-batch-requests``), in arrival order, padded to the longest pair in the
  batch, and only while the padded batch stays within ``--max-batch-tokens`` (``batch_spans``: TEI's queue rule for
  a padded backend). Nothing sorts by length, so a long passage pads the short ones batched with it: INT8 and FP32
  pay that padding differently, and the CPU pool's token budget decides how much of it there is.
- **Tokenization on the same cores.** TEI tokenizes in ``tokenization_workers`` threads (cores - 1, at least one)
  while the backend runs the previous batch, on the pod's CPUs. Here worker threads tokenize ahead of the inference
  thread through the same fast tokenizer (it releases the GIL), so its cost competes with ONNX Runtime's threads as
  it does in the pod.
- **TEI's session.** ``verify.make_session``: ``ORT_ENABLE_ALL`` applied online at load, intra-op threads = the
  CPU pool's CPUs (``--serve-threads``, at most the Job's own), one inference at a time.
- **A full queue.** Requests are always waiting (what matters for capacity under load), so the figure is
  throughput, pairs per second.
- **Turns, not one long run each.** The models take turns over the same requests for several rounds, in a rotating
  order, so a busy neighbour slows all of them alike; the per-round ratios to FP32 give the spread, and a candidate
  whose median is inside the fastest's range (and within 5% of it) ties with it: the search then prefers the better
  ranking (``prefer``).
"""

from __future__ import annotations

import math
import queue
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantizer_job.steps.evaluation.evaldata import Pair
from quantizer_job.steps.tei import textenc

#: TEI's ORT backend forms batches of at most this many (query, text) entries.
MAX_BATCH_ENTRIES = 8
#: Rounds of turns: enough for a spread; each round is one pass of every model over the same requests.
ROUNDS = 3
#: One round's work, in multiples of the Job's timing unit (RERANK_QUANTIZE_TIMING_SECONDS, 2 s) of FP32 kernel time.
#: Measured against a real TEI router, rounds of 2 s (about 120 pairs of a MiniLM-size model) put two runs of the same
#: Job up to 7% apart, more than their own ranges said; 3x as many pairs keeps the figure stable.
ROUND_UNITS = 3.0
#: A candidate ties with the fastest only if its median is inside the fastest's range and at most this much below
#: its median: wide ranges from a loaded machine must not let a slow candidate win on quality.
TIE_TOLERANCE = 0.05

Session = Any  # onnxruntime.InferenceSession (no type information shipped)
Batch = list[tuple[str, str]]


def batch_spans(count: int, lengths: Sequence[int] = (), budget: int = 0,
                max_entries: int = MAX_BATCH_ENTRIES) -> list[tuple[int, int]]:
    """The [start, end) entries of each batch TEI's queue forms, in arrival order (its core/src/queue.rs for a padded
    backend such as ONNX Runtime): an entry joins the batch while the batch has fewer than ``max_entries`` and, with
    a ``budget`` (``--max-batch-tokens``) and the entries' token ``lengths``, while ``max(longest, its length) x
    (entries + 1)`` stays within the budget; an entry is never left out, so a batch holds at least one.

    Why it matters on CPUs: a batch costs its entries times its longest pair. With the budget at the model's maximum
    input length, one long passage no longer pads seven short ones: on the long-tail profile FP32 and INT8 served
    about 2.4x more pairs a second than with the 16384 default (docs/quantization.md)."""
    if budget > 0 and lengths and len(lengths) < count:
        raise ValueError(f"{len(lengths)} token lengths for {count} entries")
    spans: list[tuple[int, int]] = []
    start, longest = 0, 0
    for i in range(count):
        n = lengths[i] if budget and lengths else 0
        full = i - start == max_entries or (budget > 0 and max(longest, n) * (i - start + 1) > budget)
        if i > start and full:
            spans.append((start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if count > start:
        spans.append((start, count))
    return spans


def served_batches(pairs: Sequence[Pair], lengths: Sequence[int] = (), budget: int = 0,
                   max_entries: int = MAX_BATCH_ENTRIES) -> list[Batch]:
    """The batches TEI's queue forms from ``pairs`` in arrival order (``batch_spans``; a request's texts are
    consecutive entries, so one request may span two batches, as in TEI)."""
    flat = [(p.query, p.text) for p in pairs]
    return [flat[a:b] for a, b in batch_spans(len(flat), lengths, budget, max_entries)]


def round_batches(pairs: Sequence[Pair], kernel_pairs_per_s: float, timing_seconds: float,
                  lengths: Sequence[int] = (), kernel_tokens_per_s: float = 0.0, budget: int = 0) -> list[Batch]:
    """One round's requests: the first served batches worth ``ROUND_UNITS`` x ``timing_seconds`` of FP32 work at its
    kernel speed (the Job's and the benchmarks' one rule, so a benchmark can time exactly what the Job timed), and at
    least two batches, unless the first alone is worth that much already (``first_batch_seconds``). ``budget``: the
    CPU pool's ``--max-batch-tokens`` (0: none), which needs the pairs' token ``lengths``."""
    seconds = ROUND_UNITS * timing_seconds
    batches = served_batches(pairs, lengths, budget)
    one_fills = first_batch_seconds(lengths, kernel_tokens_per_s, budget) >= seconds
    return batches[:1] if one_fills else take_seconds(batches, kernel_pairs_per_s, seconds)


def first_batch_seconds(lengths: Sequence[int], kernel_tokens_per_s: float, budget: int = 0) -> float:
    """The first served batch's FP32 seconds, estimated from its padded tokens (0 without lengths or a rate).

    The pair count does not see that arrival-order batches pad to their longest pair: with the pairs' token
    ``lengths`` and FP32's ``kernel_tokens_per_s`` (padded tokens a second on sorted batches) the first batch's
    padded work is estimated. On a 568M model two batches took 41 s of FP32 a round where 6 s were meant (three
    rounds: 2 minutes of a 5-minute Job); a MiniLM-size model's batch is a fraction of its round."""
    if not lengths or kernel_tokens_per_s <= 0:
        return 0.0
    return padded_seconds(lengths[:MAX_BATCH_ENTRIES], kernel_tokens_per_s, budget)[0]


def rounds_for(served: Sequence[Batch], first_seconds: float, timing_seconds: float) -> int:
    """``ROUNDS``, unless the round is one batch that alone takes longer than a round is meant to: then
    ``round_count`` (fewer, longer rounds of the same timed work)."""
    return round_count(first_seconds, timing_seconds) if len(served) == 1 else ROUNDS


def round_count(round_seconds: float, timing_seconds: float) -> int:
    """How many rounds to time: ``ROUNDS`` of ``ROUND_UNITS`` x ``timing_seconds`` each; a round estimated to take
    longer (``round_seconds``: a single batch that fills it, see ``round_batches``) is worth more than one, so
    fewer of them make the same timed work, never fewer than two (a spread needs two). A 568M model's one-batch
    round took 20 s of FP32: two rounds, not three."""
    intended = ROUND_UNITS * timing_seconds
    if round_seconds <= intended:
        return ROUNDS
    return max(2, min(ROUNDS, math.ceil(ROUNDS * intended / round_seconds)))


def padded_seconds(lengths: Sequence[int], tokens_per_s: float, budget: int = 0,
                   max_entries: int = MAX_BATCH_ENTRIES) -> list[float]:
    """Each served batch's estimated seconds: its entries times its longest pair's tokens, at ``tokens_per_s``."""
    return [(b - a) * max(lengths[a:b]) / tokens_per_s for a, b in batch_spans(len(lengths), lengths, budget,
                                                                                max_entries)]


def take_seconds(batches: Sequence[Batch], pairs_per_s: float, seconds: float, min_batches: int = 2) -> list[Batch]:
    """The first batches that take about ``seconds`` at ``pairs_per_s`` (at least ``min_batches``, at most all):
    one round's work, sized so a round of every model stays within the Job's timing budget."""
    if pairs_per_s <= 0:
        return list(batches)
    wanted, pairs = max(1.0, pairs_per_s * seconds), 0
    taken: list[Batch] = []
    for b in batches:
        if pairs >= wanted and len(taken) >= min_batches:
            break
        taken.append(b)
        pairs += len(b)
    return taken


def serve_pass(run: Callable[[dict[str, np.ndarray]], object], encode: Callable[[Batch], dict[str, np.ndarray]],
               batches: Sequence[Batch], workers: int) -> float:
    """Serve ``batches`` once as TEI does, tokenizing in ``workers`` threads ahead of inference; returns seconds.

    The queue between tokenizers and the inference thread is bounded (two batches per worker ahead), as TEI's
    tokenization keeps pace with arrivals rather than tokenizing the whole backlog at once."""
    ready: queue.Queue[tuple[int, dict[str, np.ndarray] | BaseException]] = queue.Queue(maxsize=2 * max(1, workers))
    todo: queue.Queue[int] = queue.Queue()
    for i in range(len(batches)):
        todo.put(i)

    def tokenize() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                ready.put((i, encode(batches[i])))
            except Exception as exc:  # handed to the inference thread, which would otherwise wait for it forever
                ready.put((i, exc))
                return

    threads = [threading.Thread(target=tokenize, daemon=True) for _ in range(max(1, workers))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    waiting: dict[int, dict[str, np.ndarray]] = {}
    for nxt in range(len(batches)):  # inference in arrival order, one batch at a time
        while nxt not in waiting:
            i, got = ready.get()
            if isinstance(got, BaseException):
                raise got
            waiting[i] = got
        run(waiting.pop(nxt))
    elapsed = time.perf_counter() - started
    for t in threads:
        t.join()
    return elapsed


@dataclass(frozen=True)
class Spread:
    """A candidate's served speedup over FP32: the median of its per-round ratios and their range."""

    median: float
    low: float
    high: float


def spread(ratios: Sequence[float]) -> Spread:
    if not ratios:
        raise ValueError("no rounds")
    return Spread(statistics.median(ratios), min(ratios), max(ratios))


def in_turns(passes: Mapping[str, Callable[[], float]], rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Run every model's pass once a round, the order rotating each round; returns each model's seconds per round."""
    names = list(passes)
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[: r % len(names)]:
            seconds[n].append(passes[n]())
    return seconds


def speedups(seconds: Mapping[str, Sequence[float]], baseline: str = "fp32") -> dict[str, Spread]:
    """Per-round speedup of every model over ``baseline`` (same round, same requests), as a spread."""
    base = seconds[baseline]
    return {n: spread([b / s for b, s in zip(base, secs, strict=True) if s > 0])
            for n, secs in seconds.items() if n != baseline}


def ties(fastest: Spread, other: Spread, tolerance: float = TIE_TOLERANCE) -> bool:
    """``other`` is as fast as ``fastest`` within the measurement: its median inside the fastest's range, and no
    more than ``tolerance`` below the fastest's median (so noise costs at most that much speed)."""
    return other.median >= max(fastest.low, fastest.median * (1.0 - tolerance))


def prefer(found: Mapping[str, tuple[Spread, tuple[float, ...]]]) -> str:
    """The fastest served candidate, unless another one ties with it (``ties``): then the best ranking wins.

    ``found`` maps a candidate to (its served speedup, its quality key, larger is better, e.g. (spearman, top-k)).
    Speed differences inside the measurement's own spread are noise; ranking differences are what users see."""
    if not found:
        raise ValueError("no candidates")
    fastest = max(found, key=lambda n: found[n][0].median)
    tied = [n for n in found if ties(found[fastest][0], found[n][0])]
    return max(tied, key=lambda n: (found[n][1], found[n][0].median))


def figures(seconds: Mapping[str, Sequence[float]], pairs: int) -> dict[str, float]:
    """What the Job reports for a candidate timed against FP32 (``seconds`` has "fp32" and "int8" rounds over the
    same ``pairs``): served pairs/s (median round) and the speedup's median and range over rounds."""
    s = speedups(seconds)["int8"]
    return {"fp32_pairs_per_s": pairs / statistics.median(seconds["fp32"]),
            "int8_pairs_per_s": pairs / statistics.median(seconds["int8"]),
            "speedup": s.median, "speedup_low": s.low, "speedup_high": s.high}


def of_speed(speed: Mapping[str, float]) -> Spread:
    """A reported speed dict's spread (a figure without a range is its own range)."""
    mid = speed["speedup"]
    return Spread(mid, speed.get("speedup_low", mid), speed.get("speedup_high", mid))


class Server:
    """One model served the TEI way, ready for ``in_turns``: its session and the batches of one round."""

    def __init__(self, session: Session, encode: Callable[[Batch], dict[str, np.ndarray]], batches: Sequence[Batch],
                 workers: int) -> None:
        self.session = session
        self.encode = encode
        self.batches = batches
        self.workers = workers
        self._names = [i.name for i in session.get_inputs()]

    def _run(self, feed: dict[str, np.ndarray]) -> object:
        return self.session.run(["logits"], {n: feed[n] for n in self._names})

    def warm(self) -> None:
        """One batch untimed: ONNX Runtime allocates and prepacks weights on a session's first run."""
        if self.batches:
            self._run(self.encode(self.batches[0]))

    def timed(self) -> float:
        """Seconds to serve one round."""
        return serve_pass(self._run, self.encode, self.batches, self.workers)

    def rounds(self, n: int = ROUNDS) -> list[float]:
        return [self.timed() for _ in range(n)]


def encoder(tok: textenc.Tokenizer, pad_id: int) -> Callable[[Batch], dict[str, np.ndarray]]:
    """Tokenize one batch as TEI does for ``/rerank``: pair encoding, padded to the batch's longest pair."""
    return lambda batch: textenc.encode_pairs(tok, batch, pad_id)


def tokenization_workers(threads: int) -> int:
    """TEI's default: one tokenization worker per core minus one, at least one."""
    return max(1, threads - 1)
