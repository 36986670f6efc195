"""The layout stage: the finished temp directory turned into the artifact the pools load.

The TEI-loadable CPU directory (the chosen INT8 graph, TEI's config.json and tokenizer), the GPU pool's original
weights, the evaluation pairs the quality guard replays, and the manifest written last with everything the operator
reports. Separate from :mod:`.layout` (the rules of a TEI directory, reused by tests and benchmarks) and from
:mod:`.publish` (the one rename that makes it visible): this is the Job's step that applies them to one run.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import time
from collections.abc import Sequence
from typing import Any

from quantizer_job.stages.measurement import BATCH_SIZE, serve_batch_tokens, serve_threads
from quantizer_job.stages.stage_data import Choice, Context, Exported, Source
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.logs import log
from quantizer_job.steps.common.results import finite_values
from quantizer_job.steps.evaluation import evaldata, serving
from quantizer_job.steps.graph import external_data
from quantizer_job.steps.tei import layout, textenc
from rerank_contracts import quantize_job
from rerank_contracts.artifact_layout import CPU_SUBDIR, EVALUATION_FILE, MANIFEST_FILE, ORIGINAL_SUBDIR

MANIFEST_VERSION = 1


def gpu_fp16(info: dict[str, Any]) -> dict[str, float]:
    """What the export child measured of the original weights for the GPU pool's float16: the largest activation
    on the reference pairs (``quantize_job.fp16_refusal`` decides); empty when it did not measure."""
    peak = info.get("fp16_peak_activation")
    if peak is None:
        return {}
    why = quantize_job.fp16_refusal({"fp16_peak_activation": float(peak)})
    if why is not None:
        log("verify", "fp16_overflow", peak=float(peak), module=info.get("fp16_peak_module"), reason=why)
    return {"fp16_peak_activation": float(peak)}


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
        # The INT8 model's figures, and the original weights' largest activation (the GPU pool's float16 check).
        "quality": finite_values({**best.quality, **gpu_fp16(info)}),
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


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for mod in ("onnxruntime", "onnx", "numpy", "tokenizers", "optimum", "transformers", "torch"):
        with contextlib.suppress(PackageNotFoundError):
            out[mod] = version(mod)
    return out
