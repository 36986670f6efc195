"""The quantization Job as a pipeline of stages, each a function returning a small dataclass:

    fetch -> export (child process, torch) -> reference (FP32, part of verify) -> recipe search (optimize, quantize,
    verify per candidate; :mod:`.search`) -> layout (the TEI directories and the manifest) -> publish (one rename)

:class:`Job` runs them under the artifact's lock in a temp directory that a failure removes, so a crash never
leaves half a model and a published artifact is never overwritten. Every stage logs one structured JSON line per
event on stderr (:mod:`.logs`); :func:`execute` turns the outcome into the :class:`~quantizer_job.contract.JobResult`
and the exit code the operator reads.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import evaldata, external_data, isa, layout, outliers, publish, search, serving, textenc, verify
from . import quantize as Q
from .contract import CPU_SUBDIR, EVALUATION_FILE, MANIFEST_FILE, ORIGINAL_SUBDIR, JobRequest, JobResult
from .errors import EXIT_CODES, JobError
from .fetch import Fetched, fetch
from .logs import log, peak_rss_bytes, stage, trim_memory
from .quantize import Recipe, model_bytes
from .results import finite_values, rounded

MANIFEST_VERSION = 1
#: Pairs whose PyTorch logits the export child computes, to prove the ONNX graph matches the model.
EXPORT_CHECK_PAIRS = 6
#: Share of the time budget the default evaluation set may take for the FP32 reference (see _default_eval_size).
EVAL_BUDGET_SHARE = 0.04
MIN_DEFAULT_EVAL_PAIRS = 74
#: Models whose FP32 ONNX is larger than this skip the offline transformer fusions (memory; see candidates), unless
#: RERANK_QUANTIZE_FUSION_MAX_BYTES says otherwise (read when the Job runs: :func:`_fusion_max_bytes`).
DEFAULT_FUSION_MAX_BYTES = 1 << 30
#: TEI's CPU batch size, used for every measurement.
BATCH_SIZE = 8


class Terminated(BaseException):
    """SIGTERM (the Job's deadline or a deleted pod): unwinds the pipeline so the temp directory is removed."""


# -- what each stage hands on ---------------------------------------------------------------------------------------
@dataclass
class Context:
    """One run: the request, its temp directory (renamed into place by publish) and the stage timings."""

    req: JobRequest
    tmp: Path
    threads: int
    elapsed: Callable[[], float]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def work(self) -> Path:
        return self.tmp / "work"


@dataclass(frozen=True)
class Source:
    """The fetched model: its directory, its config.json, the cap on the Job's max input length (the export child
    lowers it to what the model's positions take: ``Exported.info["max_length"]``, used for verification and
    timing) and TEI's (``tei_max_length``: the token budget the Job times with by default; the published CPU
    directory's own figure, ``max_input_tokens`` in the manifest, is what the pool gets)."""

    fetched: Fetched
    config: dict[str, Any]
    max_length: int
    tei_max_length: int

    @property
    def path(self) -> Path:
        return self.fetched.path

    @property
    def model_type(self) -> str:
        return str(self.config["model_type"])


@dataclass(frozen=True)
class Inputs:
    """Evaluation pairs (the gate's) and calibration pairs (static quantization's; may be empty)."""

    eval_pairs: list[evaldata.Pair]
    calib_pairs: list[evaldata.Pair]


@dataclass(frozen=True)
class Exported:
    """The FP32 ONNX graph, the export child's report, and the tokenizer TEI will load.

    What the loaded model told the child (``export.describe``) replaces what the parent could only guess from
    config.json: the graph's inputs, the padding id, the tokens its position table takes and the sizes under TEI's
    names, whatever the family calls them."""

    onnx: Path
    info: dict[str, Any]
    tokenizer_json: Path
    tokenizer: textenc.Tokenizer
    pad_id: int
    #: Safetensors the export wrote for the GPU pool when the source had only .bin weights.
    original_weights: Path | None
    #: config.json with the sizes transformers resolved added under TEI's names (DistilBERT's ``dim`` as
    #: ``hidden_size``); every original key kept.
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def max_positions(self) -> int:
        """Tokens a pair may have: the position table less its offset (the child's ``max_positions``)."""
        return int(self.info["max_positions"])


@dataclass(frozen=True)
class Reference:
    """The FP32 scores every candidate is compared with, on batches shared by every measurement."""

    timed: verify.Timed
    batches: list[dict[str, np.ndarray]]
    #: Undoes the length sort of the batches: scores[inverse] is in evaluation-pair order.
    inverse: np.ndarray
    groups: list[str]
    calib_feeds: list[dict[str, np.ndarray]]
    #: One round of the served-like measurement: the evaluation requests in arrival order, as TEI batches them.
    served: list[serving.Batch] = field(default_factory=list)
    #: FP32's seconds per served round, measured here when the FP32 session is too large to keep loaded next to a
    #: candidate's (then candidates are not timed in turns with it); None: timed in turns.
    fp32_rounds: list[float] | None = None
    #: Rounds every model is timed for (``serving.rounds_for``).
    rounds: int = serving.ROUNDS


@dataclass(frozen=True)
class Choice:
    """The recipe search's winner, which passed the gate, with the recipe report for the manifest and result."""

    trial: search.Trial
    recipe_info: dict[str, Any]


# -- the stages -----------------------------------------------------------------------------------------------------
def fetch_source(ctx: Context) -> Source:
    req = ctx.req
    with stage("download", ctx.timings, model=req.model, revision=req.revision) as rec:
        fetched = fetch(req.model, req.revision, ctx.work / "src")
        src = fetched.path
        cfg = layout.read_config(src)
        layout.validate_source_config(cfg, req.trust_remote_code)
        rec.update(source=fetched.source, resolved_revision=fetched.revision, files=len(fetched.files),
                   bytes=sum(p.stat().st_size for p in src.iterdir() if p.is_file()), model_type=cfg["model_type"])
    return Source(fetched=fetched, config=cfg, max_length=textenc.max_input_length(cfg),
                  tei_max_length=textenc.tei_max_input_length(src, cfg))


def load_inputs(req: JobRequest) -> Inputs:
    """Evaluation (and calibration) pairs: bad input fails before any heavy work."""
    try:
        eval_pairs = evaldata.load_jsonl(req.eval_pairs) if req.eval_pairs else evaldata.default_pairs()
        calib_pairs = evaldata.load_jsonl(req.calibration_pairs, min_pairs=1) if req.calibration_pairs else []
    except evaldata.EvalDataError as exc:
        raise JobError("InvalidInput", str(exc)) from None
    return Inputs(eval_pairs=eval_pairs, calib_pairs=calib_pairs)


def export_model(ctx: Context, source: Source, inputs: Inputs) -> Exported:
    """FP32 ONNX export in a child process (the only one that imports torch), checked against PyTorch's logits."""
    src, cfg, work = source.path, source.config, ctx.work
    has_st = bool(layout.weight_files(src))
    orig_tmp = work / "original-weights" if (ctx.req.keep_original and not has_st) else None
    spec = {"src_dir": str(src), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tokenizer"),
            "original_dir": str(orig_tmp) if orig_tmp else None, "max_length": source.max_length,
            "pad_id": layout.declared_pad_token_id(cfg, src / "tokenizer.json"), "threads": ctx.threads,
            "trust_remote_code": ctx.req.trust_remote_code,
            "ref_pairs": [[p.query, p.text] for p in inputs.eval_pairs[:EXPORT_CHECK_PAIRS]],
            "parent_pid": os.getpid()}
    with stage("export", ctx.timings) as rec:
        info = _run_export(spec, work, timeout=ctx.req.time_budget_seconds)
        fp32 = Path(info["onnx_path"])
        rec.update(bytes=model_bytes(fp32), inputs=info["input_names"], outputs=info["output_names"],
                   opset=info["opset"], tokenizer_converted=info["tokenizer_converted"], child=info["timings"])
    tok_json = Path(info["tokenizer_json"])
    return Exported(onnx=fp32, info=info, tokenizer_json=tok_json,
                    tokenizer=textenc.load_tokenizer(str(tok_json), int(info["max_length"])),
                    pad_id=layout.pad_token_id(cfg, tok_json, info.get("pad_token_id")), original_weights=orig_tmp,
                    config={**cfg, **info.get("resolved_config", {})})


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
        ref = _score(ctx, exported.onnx, batches, inverse, failure_reason="ExportFailed", sess=fp32_sess)
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
        served = serving.round_batches(eval_pairs, ref.pairs_per_s, _timing_seconds(), lengths=lengths,
                                       kernel_tokens_per_s=tokens_per_s, budget=batch_tokens)
        rounds = serving.rounds_for(served, serving.first_batch_seconds(lengths, tokens_per_s, batch_tokens),
                                    _timing_seconds())
        fp32_rounds = None
        large = too_large_to_fuse(exported.onnx)  # also too large to keep loaded beside each candidate
        if large and serve_threads(ctx) == ctx.threads:
            fp32_rounds = _server(ctx, exported, fp32_sess, served).rounds(rounds)
        del fp32_sess
        if large and fp32_rounds is None:  # the pool's thread count differs: its own session, after freeing ours
            fp32_rounds = _server(ctx, exported, exported.onnx, served).rounds(rounds)
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


def candidates(req: JobRequest, fp32_bytes: int, has_calibration: bool) -> list[Recipe]:
    """The recipes to try: the auto search's list, or the one fixed recipe; unfused variants for large models.

    A large model's unfused variants run the same INT8 MatMul kernels and differ in the embedding table's precision
    (bytes, not speed) and in the FFN layers kept FP32 (slower): they are tried fastest first, and once one passes
    the gate the search skips those that could not serve faster (``search.not_faster``): on a 568M model each
    candidate costs about a minute."""
    target = isa.detect_local_target() if req.target == "auto" else req.target
    fixed = Q.fixed_recipe(req.mode, target, req.optimization_level, req.per_channel, req.reduce_range,
                           req.operators)
    found = (Q.candidate_recipes(target, req.mode, has_calibration=has_calibration)
             if req.recipe == "auto" else [fixed])
    limit = _fusion_max_bytes()
    if fp32_bytes <= limit:
        return found
    # ORT's Python transformer optimizer holds several copies of the weights (10.5 GiB peak on a 2.2 GB
    # XLM-R large); above this size the serving session's own ORT_ENABLE_ALL fusions have to do.
    unfused: list[Recipe] = []
    for r in found:
        ops = tuple(o for o in r.operators if o != "Attention") or ("MatMul",)  # no fused Attention nodes
        r2 = Q.replace(r, optimization_level=0, operators=ops, fast_gelu=False,
                       name=r.name if r.optimization_level == 0 else r.name + "-unfused")
        if all(Q.replace(u, name="") != Q.replace(r2, name="") for u in unfused):
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
    optimized: Q.GraphCache = {}
    fp32_server: list[serving.Server] = []  # FP32 served the TEI way, kept loaded between candidates

    def served(cand: Path | verify.Session) -> dict[str, float]:
        """The candidate (its path, or its session built with the pool's thread count) served the TEI way, in
        turns with FP32 (see serving.py): pairs/s and speedup spread."""
        server = _server(ctx, exported, cand, ref.served)
        if ref.fp32_rounds is None:
            if not fp32_server:
                fp32_server.append(_server(ctx, exported, fp32, ref.served))
            seconds = serving.in_turns({"fp32": fp32_server[0].timed, "int8": server.timed}, ref.rounds)
        else:
            seconds = {"fp32": ref.fp32_rounds, "int8": server.rounds(ref.rounds)}
        del server
        in_turns = 1.0 if ref.fp32_rounds is None else 0.0
        return {**serving.figures(seconds, sum(len(b) for b in ref.served)), "served_in_turns": in_turns,
                "served_rounds": float(ref.rounds)}

    def evaluate(i: int, recipe: Recipe) -> search.Trial:
        with stage("optimize", ctx.timings, level=recipe.optimization_level, recipe=recipe.name) as rec:
            graph = Q.optimized_for(recipe, fp32, work, heads, hidden, optimized)
            rec.update(bytes=model_bytes(graph.path), fusions=graph.fusions)  # empty when level 0
            trim_memory()
        cand_path = work / f"int8-{i}" / "model.onnx"
        with stage("quantize", ctx.timings, recipe=recipe.to_dict()) as rec:
            Q.build_int8(fp32, cand_path, recipe, work, heads, hidden, ref.calib_feeds, exported.info["input_names"],
                         cache=optimized, probe_feeds=probe_feeds(ref), stream_weights=large)
            rec.update(bytes=model_bytes(cand_path))
            trim_memory()
        with stage("verify", ctx.timings, model="int8", recipe=recipe.name) as rec:
            # One session for scoring and serving when the pool has the Job's thread count: loading a 568M
            # model's INT8 graph (ORT_ENABLE_ALL) takes tens of seconds.
            sess = verify.make_session(cand_path, ctx.threads)
            got = _score(ctx, cand_path, ref.batches, ref.inverse, failure_reason="QuantizationFailed", sess=sess)
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
    return outliers.spread(ref.batches, Q.PROBE_BATCHES)


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
    recipe_info = {**best.recipe.to_dict(), "tried": result.tried}
    if best.why:
        hint = isa.saturation_hint(best.recipe.target, best.recipe.reduce_range)
        raise JobError("QualityGateFailed", f"INT8 ranks too differently from FP32 ({best.recipe.name}): "
                                            + "; ".join(best.why + ([hint] if hint else [])),
                       quality=finite_values(best.quality), speed=finite_values(best.speed), recipe=recipe_info)
    return Choice(trial=best, recipe_info=recipe_info)


def lay_out(ctx: Context, source: Source, exported: Exported, choice: Choice,
            eval_pairs: Sequence[evaldata.Pair] = ()) -> dict[str, Any]:
    """Turn the temp directory into the artifact: the TEI-loadable CPU directory, the GPU pool's original weights,
    the evaluation pairs it was verified on (``contract.EVALUATION_FILE``, for the quality guard's replay) and the
    manifest (written last). Returns the manifest."""
    req, tmp, src, tok_json = ctx.req, ctx.tmp, source.path, exported.tokenizer_json
    tok_dirs = [tok_json.parent, src] if tok_json.parent != src else [src]
    cpu = tmp / CPU_SUBDIR
    cpu.mkdir()
    chosen = choice.trial.path
    os.replace(chosen, cpu / layout.MODEL_FILE)
    data = chosen.with_name(external_data.data_file_name(chosen))
    if data.exists():
        os.replace(data, cpu / layout.DATA_FILE)
    fixed_cfg = layout.tei_config(source.config, tok_json, resolved=exported.info.get("resolved_config"),
                                  pad_default=exported.pad_id)
    capped = layout.write_tei_metadata(cpu, fixed_cfg, tok_dirs, exported.max_positions)
    if capped is not None:
        log("publish", "max_input_length_capped", tokens=capped, reason="TEI's own rule would exceed the model's "
            "position table")
    problems = layout.check_tei_dir(cpu, expect_inputs=exported.info["input_names"],
                                    max_positions=exported.max_positions,
                                    position_offset=int(exported.info.get("position_offset", 0)))
    if problems:
        raise JobError("PublishFailed", "CPU directory is not TEI-loadable: " + "; ".join(problems))
    if req.keep_original:
        orig = tmp / ORIGINAL_SUBDIR
        orig.mkdir()
        wsrc = exported.original_weights if exported.original_weights is not None else src
        names = layout.weight_files(wsrc)
        if not names:
            raise JobError("PublishFailed", "no safetensors weights for the GPU pool")
        inside = tmp in wsrc.resolve().parents
        for name in names:
            if inside:  # written or downloaded by this run: move, do not copy gigabytes
                os.replace(wsrc / name, orig / name)
            else:  # the user's directory: copy (a hard link would change with it)
                shutil.copyfile(wsrc / name, orig / name)
        layout.write_tei_metadata(orig, fixed_cfg, tok_dirs, exported.max_positions)
    if eval_pairs and ctx.req.keep_eval_pairs:
        with open(tmp / EVALUATION_FILE, "w", encoding="utf-8") as f:
            for pair in eval_pairs:
                f.write(json.dumps({"query": pair.query, "text": pair.text}, ensure_ascii=False) + "\n")
    shutil.rmtree(ctx.work, ignore_errors=True)
    files = layout.file_inventory(tmp)
    info, best = exported.info, choice.trial
    manifest = {
        "manifest_version": MANIFEST_VERSION,
        "artifact_id": req.artifact_id,
        "model": req.model,
        "revision": source.fetched.revision or req.revision,
        "source": source.fetched.source,
        "model_type": source.model_type,
        "files": files,
        "size_bytes": sum(f["size"] for f in files),
        "recipe": choice.recipe_info,
        "quality": finite_values(best.quality),
        "gate": {"min_spearman": req.min_spearman, "min_topk_agreement": req.min_topk_agreement, "topk": req.topk},
        "speed": finite_values(best.speed),
        "max_input_tokens": textenc.tei_max_input_length(cpu, fixed_cfg),
        "speed_settings": {"measured": "served", "max_batch_entries": serving.MAX_BATCH_ENTRIES,
                           "max_batch_tokens": serve_batch_tokens(ctx, source),
                           "intra_op_threads": serve_threads(ctx), "job_threads": ctx.threads,
                           "pool_threads": req.serve_threads,
                           "tokenization_workers": serving.tokenization_workers(serve_threads(ctx)),
                           "rounds": int(best.speed.get("served_rounds", serving.ROUNDS)),
                           "graph_optimization_level": "ORT_ENABLE_ALL", "kernel_batch_size": BATCH_SIZE},
        "export": {"opset": info["opset"], "inputs": info["input_names"], "outputs": info["output_names"],
                   "tokenizer_converted": info["tokenizer_converted"]},
        "versions": _versions(),
        "timings": dict(ctx.timings),
        "created_unix": int(time.time()),
    }
    (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, sort_keys=True, ensure_ascii=False))
    return manifest


def publish_artifact(ctx: Context, choice: Choice, manifest: dict[str, Any]) -> JobResult:
    """Rename the finished temp directory into place; a run that lost the race reports the winner's artifact."""
    req = ctx.req
    try:
        final = publish.commit(ctx.tmp, req.output_root, req.artifact_id)
    except FileExistsError:
        return already_published(req, publish.read_published(req.output_root, req.artifact_id) or {})
    best = choice.trial
    return JobResult(ok=True, reason="Published",
                     message=f"published {best.recipe.name}: spearman {best.quality['spearman']:.4f}, "
                             f"{best.speed['speedup']:.2f}x FP32",
                     artifact_id=req.artifact_id, path=str(final),
                     manifest_sha256=layout.sha256_file(final / MANIFEST_FILE),
                     size_bytes=int(json.loads((final / MANIFEST_FILE).read_text())["size_bytes"]),
                     quality=rounded(best.quality), speed=rounded(best.speed, 3),
                     recipe=_result_recipe(choice.recipe_info), max_input_tokens=int(manifest["max_input_tokens"]))


def already_published(req: JobRequest, manifest: dict[str, Any]) -> JobResult:
    """The result of a run whose artifact exists: the manifest's figures, no second quantization."""
    final = publish.final_path(req.output_root, req.artifact_id)
    log("publish", "already_published", path=str(final))
    return JobResult(ok=True, reason="AlreadyPublished", message=f"artifact {req.artifact_id} already published",
                     artifact_id=req.artifact_id, path=str(final),
                     manifest_sha256=layout.sha256_file(final / MANIFEST_FILE),
                     size_bytes=int(manifest.get("size_bytes", 0)),
                     quality=rounded(manifest.get("quality", {})), speed=rounded(manifest.get("speed", {})),
                     recipe=_result_recipe(manifest.get("recipe", {})),
                     max_input_tokens=int(manifest.get("max_input_tokens") or 0))


# -- the run --------------------------------------------------------------------------------------------------------
def validate(req: JobRequest) -> None:
    """Flags the command line's types cannot check: refused before any work."""
    if not publish.valid_artifact_id(req.artifact_id):
        raise JobError("InvalidInput", f"artifact id {req.artifact_id!r}: use letters, digits, '.', '_', '-'")
    if req.topk < 1 or not (0.0 <= req.min_spearman <= 1.0) or not (0.0 <= req.min_topk_agreement <= 1.0):
        raise JobError("InvalidInput", "--topk must be >= 1 and the gate thresholds within [0, 1]")
    if req.mode == "static" and not req.calibration_pairs:
        raise JobError("InvalidInput", "--mode static needs --calibration-pairs")


class Job:
    """One quantization run: validation, then the stages under the artifact's lock in a temp directory."""

    def __init__(self, req: JobRequest):
        self.req = req
        self.timings: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.threads = isa.cpu_budget()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def run(self) -> JobResult:
        req = self.req
        validate(req)
        done = publish.read_published(req.output_root, req.artifact_id)
        if done is not None:
            return already_published(req, done)
        lock = publish.ArtifactLock(req.output_root, req.artifact_id)
        if not lock.acquire():
            raise JobError("PublishFailed", f"another run holds the lock of artifact {req.artifact_id}")
        try:
            done = publish.read_published(req.output_root, req.artifact_id)
            if done is not None:
                return already_published(req, done)
            stale = publish.clean_stale(req.output_root, req.artifact_id)
            if stale:
                log("publish", "cleaned_stale_temp_dirs", dirs=stale)
            tmp = publish.make_temp(req.output_root, req.artifact_id)
            try:
                return self._build(Context(req=req, tmp=tmp, threads=self.threads, elapsed=self.elapsed,
                                           timings=self.timings))
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        finally:
            lock.release()

    def _build(self, ctx: Context) -> JobResult:
        ctx.work.mkdir()
        source = fetch_source(ctx)
        inputs = load_inputs(ctx.req)
        exported = export_model(ctx, source, inputs)
        ref = reference(ctx, exported, inputs, serve_batch_tokens(ctx, source))
        choice = search_recipes(ctx, source, exported, ref)
        with stage("publish", ctx.timings) as rec:
            manifest = lay_out(ctx, source, exported, choice, inputs.eval_pairs)
            result = publish_artifact(ctx, choice, manifest)
            if result.reason == "Published":
                rec.update(path=result.path, bytes=result.size_bytes)
        return result


def execute(req: JobRequest) -> tuple[JobResult, int]:
    """Run the Job and map every outcome to its result and exit code (0, or the failure reason's)."""
    job = Job(req)
    log("job", "start", request=dict(req.__dict__), threads=job.threads, target=isa.detect_local_target())
    code = 0
    try:
        res = job.run()
    except JobError as exc:
        d = exc.details
        res = JobResult(ok=False, reason=exc.reason, message=exc.message, artifact_id=req.artifact_id,
                        quality=rounded(d.get("quality", {})), speed=rounded(d.get("speed", {})),
                        recipe=_result_recipe(d.get("recipe", {})))
        code = EXIT_CODES[exc.reason]
    except Terminated as exc:
        res = JobResult(ok=False, reason="InternalError", message=f"terminated ({exc})", artifact_id=req.artifact_id)
        code = EXIT_CODES["InternalError"]
    except Exception as exc:  # a bug: still a result the operator can read, never a bare traceback
        res = JobResult(ok=False, reason="InternalError", message=f"{type(exc).__name__}: {exc}",
                        artifact_id=req.artifact_id)
        code = EXIT_CODES["InternalError"]
    log("job", "end", ok=res.ok, reason=res.reason, seconds=round(job.elapsed(), 3), peak_rss_bytes=peak_rss_bytes(),
        timings=job.timings)
    return res, code


# -- helpers of the stages ------------------------------------------------------------------------------------------
def _result_recipe(recipe_info: dict[str, Any]) -> dict[str, Any]:
    """The recipe as the Job result reports it: without ``extra`` (the termination message holds 4 KB)."""
    return {k: v for k, v in recipe_info.items() if k != "extra"}


def _run_export(spec: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    spec_path, result_path = work / "export-spec.json", work / "export-result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "quantizer_job.export", str(spec_path), str(result_path)]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    try:
        proc = subprocess.run(cmd, env=env, timeout=max(60.0, timeout), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, check=False)
    except subprocess.TimeoutExpired:
        raise JobError("ExportFailed", f"export did not finish within {int(timeout)} s") from None
    res: dict[str, Any] | None = json.loads(result_path.read_text()) if result_path.is_file() else None
    if proc.returncode != 0 or res is None or "error" in res:
        if res and "error" in res:
            raise JobError(res["error"]["reason"], res["error"]["message"])
        tail = (proc.stdout or "")[-1500:]
        sig = -proc.returncode if proc.returncode < 0 else None
        what = f"killed by signal {sig} (out of memory?)" if sig else f"exit {proc.returncode}"
        raise JobError("ExportFailed", f"export child {what}: {tail}")
    return res


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


def _score(ctx: Context, model: Path, batches: list[dict[str, np.ndarray]], inverse: np.ndarray, *,
           failure_reason: str, sess: verify.Session | None = None) -> verify.Timed:
    """Score ``batches`` with ``model`` in a session built as TEI builds it, timed; scores come back in input
    order (``inverse`` undoes the length sort). A graph TEI could not serve raises ``failure_reason``."""
    sess = sess if sess is not None else verify.make_session(model, ctx.threads)
    problems = verify.check_output(sess)
    if problems:
        raise JobError(failure_reason, "; ".join(problems))
    timed = verify.score_timed(sess, batches, min_seconds=_timing_seconds())
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


def _server(ctx: Context, exported: Exported, model: Path | verify.Session,
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


def too_large_to_fuse(fp32: Path) -> bool:
    """A model above the fusion size limit: unfused candidates (``candidates``), weights quantized a tensor at a
    time, FP32 timed once rather than kept loaded beside each candidate, and after a candidate passes the search
    skipping those that could not serve faster (``search.not_faster``)."""
    return model_bytes(fp32) > _fusion_max_bytes()


def _fusion_max_bytes() -> int:
    """The FP32 size above which the offline transformer fusions are skipped (see :func:`candidates`)."""
    return int(os.environ.get("RERANK_QUANTIZE_FUSION_MAX_BYTES", str(DEFAULT_FUSION_MAX_BYTES)))


def _timing_seconds() -> float:
    """How long to time each model (at least one pass over the eval batches is always made)."""
    return float(os.environ.get("RERANK_QUANTIZE_TIMING_SECONDS", "2.0"))


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for mod in ("onnxruntime", "onnx", "numpy", "tokenizers", "optimum", "transformers", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            out[mod] = version(mod)
    return out
