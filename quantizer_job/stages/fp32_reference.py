"""The FP32 reference stage (part of verify): the scores every candidate is compared with, and the speed it is
measured against.

Scores the evaluation pairs with the exported FP32 graph, checks them against PyTorch's logits, forms the batches
every measurement shares (length-sorted for the kernel figures, in arrival order for the served ones) and the
calibration feeds. Separate because it also decides how many of the default evaluation pairs the time budget allows
(:func:`_default_eval_size`), which is a policy of its own.
"""

from __future__ import annotations

import time

import numpy as np

from quantizer_job.stages import measurement
from quantizer_job.stages.large_models import too_large_to_fuse
from quantizer_job.stages.measurement import BATCH_SIZE, serve_threads
from quantizer_job.stages.stage_data import Context, Exported, Inputs, Reference
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.logs import log, stage
from quantizer_job.steps.evaluation import evaldata, serving, verify
from quantizer_job.steps.tei import textenc

#: Share of the time budget the default evaluation set may take for the FP32 reference (see _default_eval_size).
EVAL_BUDGET_SHARE = 0.04
MIN_DEFAULT_EVAL_PAIRS = 74


def reference(ctx: Context, exported: Exported, inputs: Inputs, batch_tokens: int = 0) -> Reference:
    """Score the evaluation pairs with the FP32 graph (part of verify): the scores the gate compares with, and the
    throughput the speedup is measured against. Also prepares the calibration feeds. ``batch_tokens``: the CPU
    pool's ``--max-batch-tokens`` (``serve_batch_tokens``), which shapes the served batches timed."""
    req, tok, pad_id = ctx.req, exported.tokenizer, exported.pad_id
    fp32_sess = verify.make_session(exported.onnx, ctx.threads)
    eval_pairs = inputs.eval_pairs
    if not req.eval_pairs:
        n = _default_eval_size(fp32_sess, tok, pad_id, eval_pairs, req.time_budget_seconds)
        if n < len(eval_pairs):
            log("verify", "eval_set_capped", pairs=n, of=len(eval_pairs), reason="time budget")
        eval_pairs = eval_pairs[:n]
    pairs = [(p.query, p.text) for p in eval_pairs]
    # Batches of pairs of similar length (TEI batches whatever arrives; sorting only removes padding waste from
    # the measurement, which matters for 24-layer models on 2 cores). Scores are mapped back to input order.
    lengths = textenc.token_lengths(tok, pairs)
    order = np.argsort(lengths, kind="stable")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    batches = textenc.make_batches(tok, [pairs[i] for i in order], pad_id, batch_size=BATCH_SIZE)

    with stage("verify", ctx.timings, model="fp32", pairs=len(pairs)) as rec:
        ref = measurement.score(ctx, exported.onnx, batches, inverse, failure_reason="ExportFailed", sess=fp32_sess)
        if not np.all(np.isfinite(ref.scores)):
            raise JobError("ExportFailed", "the FP32 ONNX model gives non-finite scores")
        torch_ref = np.asarray(exported.info.get("torch_ref_logits", []), dtype=np.float64)
        export_diff = float(np.max(np.abs(torch_ref - ref.scores[: len(torch_ref)]))) if len(torch_ref) else 0.0
        scale = max(1.0, float(np.max(np.abs(torch_ref)))) if len(torch_ref) else 1.0
        if export_diff > 1e-3 * scale:
            raise JobError("ExportFailed", f"ONNX FP32 differs from PyTorch by {export_diff:.3g}")
        rec.update(fp32=ref.speed(), export_max_abs_diff=export_diff)
        padded_tokens = sum(int(b["input_ids"].size) for b in batches)
        tokens_per_s = ref.pairs_per_s * padded_tokens / max(1, len(pairs))
        served = serving.round_batches(eval_pairs, ref.pairs_per_s, measurement.timing_seconds(), lengths=lengths,
                                       kernel_tokens_per_s=tokens_per_s, budget=batch_tokens)
        rounds = serving.rounds_for(served, serving.first_batch_seconds(lengths, tokens_per_s, batch_tokens),
                                    measurement.timing_seconds())
        fp32_rounds = None
        large = too_large_to_fuse(exported.onnx)  # also too large to keep loaded beside each candidate
        if large and serve_threads(ctx) == ctx.threads:
            fp32_rounds = measurement.server(ctx, exported, fp32_sess, served).rounds(rounds)
        del fp32_sess
        if large and fp32_rounds is None:  # the pool's thread count differs: its own session, after freeing ours
            fp32_rounds = measurement.server(ctx, exported, exported.onnx, served).rounds(rounds)
        if fp32_rounds is not None:
            rec.update(fp32_served_s=[round(x, 3) for x in fp32_rounds])

    calib_feeds: list[dict[str, np.ndarray]] = []
    calib_pairs = inputs.calib_pairs
    if calib_pairs and (req.mode == "static" or req.recipe == "auto"):
        lengths = textenc.token_lengths(tok, [(p.query, p.text) for p in calib_pairs])
        chosen = evaldata.balance_by_length(lengths, n=min(len(calib_pairs), 256))
        chosen_pairs = [(calib_pairs[i].query, calib_pairs[i].text) for i in chosen]
        calib_feeds = textenc.make_batches(tok, chosen_pairs, pad_id, batch_size=BATCH_SIZE)
    return Reference(timed=ref, batches=batches, inverse=inverse, groups=[p.query for p in eval_pairs],
                     calib_feeds=calib_feeds, served=served, fp32_rounds=fp32_rounds, rounds=rounds)


def _default_eval_size(sess: verify.Session, tok: textenc.Tokenizer, pad_id: int, eval_pairs: list[evaldata.Pair],
                       time_budget_seconds: float) -> int:
    """How many of the default pairs to score: all of them (840) when the FP32 model is fast enough to score
    them in EVAL_BUDGET_SHARE of the time budget, else fewer (never fewer than the built-in 74): a 568M model
    on 2 cores scores about two pairs a second, and the gate has to leave time for quantizing.

    The speed is timed in tokens a second on one batch of the 8 pairs around the median length, after one run of
    the shortest pair (ONNX Runtime allocates and prepacks weights on a first run), and a pair costs the mean
    length's tokens (the reference scores length-sorted batches: little padding; at these lengths a transformer's
    time grows about linearly with tokens). Timing the first pairs as they come, padded to the longest, took 80 s
    of a 568M model's Job."""
    pairs = [(p.query, p.text) for p in eval_pairs]
    lengths = textenc.token_lengths(tok, pairs)
    order = np.argsort(lengths, kind="stable")
    mid = max(0, len(order) // 2 - BATCH_SIZE // 2)
    warm = textenc.make_batches(tok, [pairs[order[0]]], pad_id, batch_size=BATCH_SIZE)[0]
    probe = textenc.make_batches(tok, [pairs[i] for i in order[mid : mid + BATCH_SIZE]], pad_id,
                                 batch_size=BATCH_SIZE)[0]
    names = [i.name for i in sess.get_inputs()]
    sess.run(["logits"], {k: warm[k] for k in names})
    t0 = time.perf_counter()
    sess.run(["logits"], {k: probe[k] for k in names})
    tokens_per_s = probe["input_ids"].size / max(1e-6, time.perf_counter() - t0)
    n = int(tokens_per_s / max(1.0, float(np.mean(lengths))) * EVAL_BUDGET_SHARE * time_budget_seconds)
    return max(min(len(eval_pairs), MIN_DEFAULT_EVAL_PAIRS), min(len(eval_pairs), n))
