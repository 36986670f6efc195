"""The recipe search stage: which recipes to try, and how one is tried (optimize, quantize, verify against the FP32
reference, timed in turns with FP32 as the pool would serve it).

:mod:`.search` chooses among trials without the ML stack; this module makes the trials it chooses from (its
``evaluate``) and turns its choice into the Job's: a winner that passes the gate, or the failure the operator reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from quantizer_job.stages import measurement
from quantizer_job.stages.large_models import fusion_max_bytes, too_large_to_fuse
from quantizer_job.stages.measurement import serve_threads
from quantizer_job.stages.stage_data import Choice, Context, Exported, Reference, Source
from quantizer_job.steps.common import isa
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.logs import log, stage, trim_memory
from quantizer_job.steps.common.results import finite_values, rounded
from quantizer_job.steps.evaluation import serving, verify
from quantizer_job.steps.graph import fusion, outliers, quantize
from quantizer_job.steps.graph.onnx_files import model_bytes
from quantizer_job.steps.recipe_search import recipes, search
from quantizer_job.steps.recipe_search.recipes import Recipe
from quantizer_job.steps.tei.layout import MODEL_FILE
from rerank_contracts.quantize_job import JobRequest


def candidates(req: JobRequest, fp32_bytes: int, has_calibration: bool) -> list[Recipe]:
    """The recipes to try: the auto search's list, or the one fixed recipe; unfused variants for large models.

    A large model's unfused variants run the same INT8 MatMul kernels and differ in the embedding table's precision
    (bytes, not speed) and in the FFN layers kept FP32 (slower): they are tried fastest first, and once one passes
    the gate the search skips those that could not serve faster (``search.not_faster``): on a 568M model each
    candidate costs about a minute."""
    target = isa.detect_local_target() if req.target == "auto" else req.target
    fixed = recipes.fixed_recipe(req.mode, target, req.optimization_level, req.per_channel, req.reduce_range,
                                 req.operators)
    found = (recipes.candidate_recipes(target, req.mode, has_calibration=has_calibration)
             if req.recipe == "auto" else [fixed])
    limit = fusion_max_bytes()
    if fp32_bytes <= limit:
        return found
    # ORT's Python transformer optimizer holds several copies of the weights (10.5 GiB peak on a 2.2 GB
    # XLM-R large); above this size the serving session's own ORT_ENABLE_ALL fusions have to do.
    unfused: list[Recipe] = []
    for r in found:
        ops = tuple(o for o in r.operators if o != "Attention") or ("MatMul",)  # no fused Attention nodes
        r2 = replace(r, optimization_level=0, operators=ops, fast_gelu=False, multi_head_attention=False,
                     name=r.name if r.optimization_level == 0 else r.name + "-unfused")
        if all(replace(u, name="") != replace(r2, name="") for u in unfused):
            unfused.append(r2)
    if unfused != found:
        log("optimize", "skipped", reason="model too large for the offline fusion pass within the memory budget",
            fp32_bytes=fp32_bytes, limit_bytes=limit)
    # Fastest first: unfused, the candidates differ in the FFN layers they keep FP32 (slower) and in the embedding
    # table's precision (same speed), so the search can skip what could not serve faster than one that passed.
    return sorted(unfused, key=lambda r: r.fp32_ffn_down)


def evaluator(ctx: Context, source: Source, exported: Exported,
              ref: Reference) -> Callable[[int, Recipe], search.Trial]:
    """The search's ``evaluate``: optimize, quantize and verify one recipe (fused graphs shared between recipes)."""
    req, fp32, work = ctx.req, exported.onnx, ctx.work
    heads = int(exported.config.get("num_attention_heads") or 0)
    hidden = int(exported.config["hidden_size"])
    fp32_bytes = model_bytes(fp32)
    large = too_large_to_fuse(fp32)  # unfused recipes, quantized a weight at a time (quantize.build_int8)
    optimized: fusion.GraphCache = {}
    fp32_server: list[serving.Server] = []  # FP32 served the TEI way, kept loaded between candidates

    def served(cand: Path | verify.Session) -> dict[str, float]:
        """The candidate (its path, or its session built with the pool's thread count) served the TEI way, in
        turns with FP32 (see serving.py): pairs/s and speedup spread."""
        server = measurement.server(ctx, exported, cand, ref.served)
        if ref.fp32_rounds is None:
            if not fp32_server:
                fp32_server.append(measurement.server(ctx, exported, fp32, ref.served))
            seconds = serving.in_turns({"fp32": fp32_server[0].timed, "int8": server.timed}, ref.rounds)
        else:
            seconds = {"fp32": ref.fp32_rounds, "int8": server.rounds(ref.rounds)}
        del server
        in_turns = 1.0 if ref.fp32_rounds is None else 0.0
        return {**serving.figures(seconds, sum(len(b) for b in ref.served)), "served_in_turns": in_turns,
                "served_rounds": float(ref.rounds)}

    def evaluate(i: int, recipe: Recipe) -> search.Trial:
        with stage("optimize", ctx.timings, level=recipe.optimization_level, recipe=recipe.name) as rec:
            graph = fusion.optimized_for(recipe, fp32, work, heads, hidden, optimized)
            rec.update(bytes=model_bytes(graph.path), fusions=graph.fusions)  # empty when level 0
            trim_memory()
        cand_path = work / f"int8-{i}" / MODEL_FILE
        with stage("quantize", ctx.timings, recipe=recipe.to_dict()) as rec:
            quantize.build_int8(fp32, cand_path, recipe, work, heads, hidden, ref.calib_feeds,
                                exported.info["input_names"], cache=optimized, probe_feeds=probe_feeds(ref),
                                stream_weights=large)
            rec.update(bytes=model_bytes(cand_path))
            trim_memory()
        with stage("verify", ctx.timings, model="int8", recipe=recipe.name) as rec:
            # One session for scoring and serving when the pool has the Job's thread count: loading a 568M
            # model's INT8 graph (ORT_ENABLE_ALL) takes tens of seconds.
            sess = verify.make_session(cand_path, ctx.threads)
            got = measurement.score(ctx, cand_path, ref.batches, ref.inverse, failure_reason="QuantizationFailed",
                                    sess=sess)
            serve_with: Path | verify.Session = sess if serve_threads(ctx) == ctx.threads else cand_path
            del sess
            trim_memory()
            fp = ref.timed
            q = verify.quality(ref.groups, fp.scores, got.scores, req.topk)
            why = verify.gate(q, req.min_spearman, req.min_topk_agreement)
            # The figures the user sees and the search chooses by are the served-like ones; the kernel figures
            # (sorted, pre-tokenized batches) stay for the profile of where the time goes.
            speed = {**served(serve_with), "kernel_fp32_pairs_per_s": fp.pairs_per_s,
                     "kernel_int8_pairs_per_s": got.pairs_per_s, "kernel_speedup": got.pairs_per_s / fp.pairs_per_s,
                     "size_ratio": model_bytes(cand_path) / fp32_bytes, "fp32_p50_ms": fp.p50_ms,
                     "fp32_p95_ms": fp.p95_ms, "int8_p50_ms": got.p50_ms, "int8_p95_ms": got.p95_ms}
            rec.update(quality=rounded(q), speed=rounded(speed, 3), passed=not why, why=why)
        return search.Trial(recipe=recipe, path=cand_path, quality=q, speed=speed, why=why)

    return evaluate


def probe_feeds(ref: Reference) -> list[dict[str, np.ndarray]]:
    """Batches a mixed recipe ranks FFN outliers on: the calibration batches, else evaluation batches spread over
    the lengths (they are sorted by length). Only activation ranges are read, never the scores the gate compares."""
    if ref.calib_feeds:
        return ref.calib_feeds
    return outliers.spread(ref.batches, quantize.PROBE_BATCHES)


def search_recipes(ctx: Context, source: Source, exported: Exported, ref: Reference) -> Choice:
    """Run the recipe search within the time budget; the winner must pass the gate or the Job fails."""
    req = ctx.req
    large = too_large_to_fuse(exported.onnx)
    found = candidates(req, model_bytes(exported.onnx), has_calibration=bool(ref.calib_feeds))
    result = search.search(found, evaluator(ctx, source, exported, ref),
                           search.Budget(seconds=float(req.time_budget_seconds), elapsed=ctx.elapsed),
                           tolerate_failures=req.recipe == "auto", skip_slower_after_pass=large)
    for name, exc in result.failures:
        log("quantize", "recipe_failed", recipe=name, reason=exc.reason, error=exc.message[:500])
    if result.skipped:
        log("quantize", "skipped", recipes=result.skipped, reason=result.skipped_why)
    best = result.best
    if best is None:
        raise JobError("QuantizationFailed", f"no recipe produced a model: {result.tried}")
    # The CPU the recipe was chosen and timed on: the pool's node pool (the Job runs there), which the figures hold for.
    recipe_info = {**best.recipe.to_dict(), "tried": result.tried, "cpu": isa.describe_local_cpu()}
    if best.why:
        hint = isa.saturation_hint(best.recipe.target, best.recipe.reduce_range)
        raise JobError("QualityGateFailed", f"INT8 ranks too differently from FP32 ({best.recipe.name}): "
                                            + "; ".join(best.why + ([hint] if hint else [])),
                       quality=finite_values(best.quality), speed=finite_values(best.speed), recipe=recipe_info)
    return Choice(trial=best, recipe_info=recipe_info)
