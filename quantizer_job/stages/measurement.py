"""How the Job measures a model: as the CPU pool's TEI will run it, with the pool's threads and batch budget.

The FP32 reference and every candidate recipe are scored and timed the same way, so their speedup compares like
with like: a session built as TEI builds it (:func:`score`), served as TEI serves it (:func:`server`), with the
thread count (:func:`serve_threads`) and ``--max-batch-tokens`` (:func:`serve_batch_tokens`) the pool will have,
for as long as :func:`timing_seconds` says. Separate from the stages because two of them measure
(:mod:`.fp32_reference`, :mod:`.recipe_trials`) and the manifest records the same settings (:mod:`.artifact_assembly`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from quantizer_job.stages.stage_data import Context, Exported, Source
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.logs import trim_memory
from quantizer_job.steps.evaluation import serving, verify

#: TEI's CPU batch size, used for every measurement.
BATCH_SIZE = 8


def score(ctx: Context, model: Path, batches: list[dict[str, np.ndarray]], inverse: np.ndarray, *,
          failure_reason: str, sess: verify.Session | None = None) -> verify.Timed:
    """Score ``batches`` with ``model`` in a session built as TEI builds it, timed; scores come back in input
    order (``inverse`` undoes the length sort). A graph TEI could not serve raises ``failure_reason``."""
    sess = sess if sess is not None else verify.make_session(model, ctx.threads)
    problems = verify.check_output(sess)
    if problems:
        raise JobError(failure_reason, "; ".join(problems))
    timed = verify.score_timed(sess, batches, min_seconds=timing_seconds())
    timed.scores = timed.scores[inverse]
    del sess
    trim_memory()
    return timed


def serve_batch_tokens(ctx: Context, source: Source) -> int:
    """The CPU pool's ``--max-batch-tokens`` the Job times with: the pool's own when its spec sets one, else the
    operator's default for the CPU pool, TEI's maximum input length of this model (a batch pads to at most one
    longest pair's worth of tokens)."""
    return ctx.req.serve_batch_tokens or source.tei_max_length


def serve_threads(ctx: Context) -> int:
    """The threads TEI will give ONNX Runtime in the CPU pool (``--serve-threads``: the pool's CPUs), at most the
    Job's own CPUs (more threads than CPUs would measure contention, not the pool)."""
    return min(ctx.req.serve_threads or ctx.threads, ctx.threads)


def server(ctx: Context, exported: Exported, model: Path | verify.Session,
           batches: list[serving.Batch]) -> serving.Server:
    """``model`` (a path, or a session built with the serving thread count) served as TEI serves it. A new
    session is warmed up with one untimed batch; a session that has scored the evaluation batches already is warm
    (its weights are prepacked), and on a 568M model a batch costs 20 s of FP32."""
    threads = serve_threads(ctx)
    sess = verify.make_session(model, threads) if isinstance(model, Path) else model
    server = serving.Server(sess, serving.encoder(exported.tokenizer, exported.pad_id), batches,
                            serving.tokenization_workers(threads))
    if isinstance(model, Path):
        server.warm()
    return server


def timing_seconds() -> float:
    """How long to time each model (at least one pass over the eval batches is always made)."""
    return float(os.environ.get("RERANK_QUANTIZE_TIMING_SECONDS", "2.0"))
