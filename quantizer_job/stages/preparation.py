"""The stages before any quantization: the source model fetched and checked, the evaluation and calibration pairs
loaded, and the FP32 ONNX export run in its child process.

Separate from the export itself (:mod:`.export`, the child, the only process that imports torch): this is the
parent's side, which writes the child's spec, waits for it and turns its report or its failure into the Job's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from quantizer_job.stages.stage_data import Context, Exported, Inputs, Source
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.logs import stage
from quantizer_job.steps.evaluation import evaldata
from quantizer_job.steps.graph.onnx_files import model_bytes
from quantizer_job.steps.storage.fetch import fetch
from quantizer_job.steps.tei import layout, textenc
from rerank_contracts.quantize_job import JobRequest

#: Pairs whose PyTorch logits the export child computes, to prove the ONNX graph matches the model.
EXPORT_CHECK_PAIRS = 6


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


def _run_export(spec: dict[str, Any], work: Path, timeout: float) -> dict[str, Any]:
    spec_path, result_path = work / "export-spec.json", work / "export-result.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "quantizer_job.steps.graph.export", str(spec_path), str(result_path)]
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
