"""FP32 ONNX export, run in a child process so the torch model's memory is gone when it exits.

``python -m quantizer_job.steps.graph.export <spec.json> <result.json>``. The parent (``cli``) never imports torch:
the export child is the only process that holds the PyTorch weights, and the quantize/verify stages start after it
has exited, so at most one copy of the FP32 weights is alive at a time.

Uses optimum's ONNX export configuration for the model type (input/output names, dynamic axes, model patching),
which gives ``input_ids``/``attention_mask`` (+ ``token_type_ids`` where the family has token types) and
``logits``; then ``torch.onnx.export`` writes the graph directly, and tensors of models over 2 GB are gathered into one
``model.onnx_data`` next to ``model.onnx`` a tensor at a time (``external_data.consolidate``; optimum's own re-save
loads the whole model again while the torch weights are still alive, which is how the plain recipe reaches 13 GB on
bge-reranker-v2-m3).

The child also reports what only the loaded model knows, so the parent never keeps lists of model types
(:func:`describe`): the sizes TEI reads under the names transformers resolves them to (DistilBERT's ``dim`` is
``hidden_size``), and how many tokens the model's position table really takes (a position embedding with a padding
index, as RoBERTa's, starts after it).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from quantizer_job.steps.graph import external_data
from quantizer_job.steps.tei.layout import MODEL_FILE, SIZE_KEYS
from quantizer_job.steps.tei.textenc import uses_token_types

OPSET = 17  # LayerNormalization is a native op from 17; ORT 1.22 runs opsets up to 22.


def _die_with_parent(parent_pid: int) -> None:
    """A killed Job must not leave an orphan writing into the temp directory."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if os.getppid() != parent_pid:
        os._exit(1)


def _fast_tokenizer(src: Path, out_dir: Path, trust_remote_code: bool = False) -> Path:
    """``tokenizer.json`` of the model, converted from its slow tokenizer when it has none."""
    found = src / "tokenizer.json"
    if found.is_file():
        return found
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src), use_fast=True, trust_remote_code=trust_remote_code)
    except Exception as exc:  # transformers raises many types here
        raise RuntimeError(f"UnsupportedModel: cannot build a fast tokenizer: {exc}") from exc
    if not getattr(tok, "is_fast", False):
        raise RuntimeError("UnsupportedModel: the model has no fast tokenizer and none could be converted")
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out_dir))  # writes tokenizer.json and the other tokenizer files
    if not (out_dir / "tokenizer.json").is_file():
        tok.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    return out_dir / "tokenizer.json"


#: Sizes the Job itself reads (the ORT transformer optimizer's head count).
JOB_CONFIG_KEYS = ("num_attention_heads",)


def position_offset(model: Any) -> int:
    """Where the model's absolute position ids start: after the padding index of a position embedding that has one
    (RoBERTa, XLM-R, CamemBERT and their kin: ``create_position_ids_from_input_ids``), else 0 (BERT-style tables,
    relative or rotary positions)."""
    import torch

    for name, mod in model.named_modules():
        if (isinstance(mod, torch.nn.Embedding) and "position" in name.rsplit(".", 1)[-1]
                and mod.padding_idx is not None):
            return int(mod.padding_idx) + 1
    return 0


def describe(model: Any, raw_config: dict[str, Any], cap: int) -> dict[str, Any]:
    """What the parent needs of the loaded model: sizes under TEI's names (``resolved``: only those config.json does
    not already spell so), the tokens a pair may have (``max_positions``: the position table less its offset) and
    the Job's own max input length (``max_length``: that, capped at ``cap``)."""
    cfg = model.config
    resolved = {}
    for key in (*SIZE_KEYS, *JOB_CONFIG_KEYS):  # through transformers' attribute_map (DistilBERT's dim)
        value = getattr(cfg, key, None)
        if key not in raw_config and isinstance(value, int) and not isinstance(value, bool):
            resolved[key] = value
    mpe = getattr(cfg, "max_position_embeddings", None)
    offset = position_offset(model)
    max_positions = int(mpe) - offset if isinstance(mpe, int) else cap
    return {"resolved_config": resolved, "position_offset": offset, "max_positions": max_positions,
            "max_length": max(8, min(cap, max_positions)),
            "uses_token_types": uses_token_types(cfg.to_dict()),
            "pad_token_id": cfg.pad_token_id if isinstance(getattr(cfg, "pad_token_id", None), int) else None}


def _watch_activations(model: Any) -> tuple[dict[str, float], list[Any]]:
    """Forward hooks recording, per module, the largest magnitude of its floating-point output on the reference
    pairs; and the hooks, for removal. The GPU pool serves the original weights in float16 (TEI's
    CUDA path), where any intermediate beyond 65504 becomes inf: what overflows there is seen here in FP32, on CPU,
    without a GPU (the seeds' own pitfall: some rerankers' FFN activations exceed it)."""
    import torch

    peaks: dict[str, float] = {}

    def watch(name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            out = output[0] if isinstance(output, tuple) and output else output
            out = getattr(out, "logits", out)
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                peaks[name] = max(peaks.get(name, 0.0), float(out.detach().abs().max()))
        return hook

    return peaks, [m.register_forward_hook(watch(name or "model")) for name, m in model.named_modules()]


def torch_inputs(model: Any, feed: dict[str, Any], uses_token_types: bool) -> dict[str, Any]:
    """The inputs a user's transformers code gives the model: ids and mask, and token types only where the model
    has more than one (a RoBERTa table of one row would be indexed out of range by a WordPiece tokenizer's 1s)."""
    import inspect

    import torch

    params = inspect.signature(model.forward).parameters
    kwargs = {"input_ids": torch.from_numpy(feed["input_ids"]),
              "attention_mask": torch.from_numpy(feed["attention_mask"])}
    if uses_token_types and "token_type_ids" in params:
        kwargs["token_type_ids"] = torch.from_numpy(feed["token_type_ids"])
    return kwargs


def run(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForSequenceClassification

    from quantizer_job.steps.tei.textenc import encode_pairs, load_tokenizer

    torch.set_num_threads(int(spec.get("threads") or os.cpu_count() or 1))
    trust = bool(spec.get("trust_remote_code"))
    src = Path(spec["src_dir"])
    onnx_dir = Path(spec["onnx_dir"])
    onnx_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    result: dict[str, Any] = {}

    t0 = time.monotonic()
    tok_path = _fast_tokenizer(src, Path(spec["tokenizer_dir"]), trust)
    result["tokenizer_json"] = str(tok_path)
    result["tokenizer_converted"] = tok_path.parent != src
    timings["tokenizer_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    model = AutoModelForSequenceClassification.from_pretrained(str(src), dtype=torch.float32,
                                                               low_cpu_mem_usage=True, trust_remote_code=trust)
    model.eval()
    timings["load_s"] = time.monotonic() - t0
    if int(model.config.num_labels) != 1:
        raise RuntimeError(f"UnsupportedModel: {model.config.num_labels} labels; a reranker has exactly one")
    raw_config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    described = describe(model, raw_config, int(spec["max_length"]))
    result.update(described)

    # Reference logits from PyTorch for a few pairs, to prove the exported graph computes the same function.
    tok = load_tokenizer(str(tok_path), described["max_length"])
    # The parent's padding id when config.json or tokenizer.json names one, else the loaded config's (RoBERTa's 1).
    pad_id = spec["pad_id"] if spec.get("pad_id") is not None else (described["pad_token_id"] or 0)
    result["pad_id"] = int(pad_id)
    ref_pairs = [tuple(p) for p in spec.get("ref_pairs", [])]
    if ref_pairs:
        feed = encode_pairs(tok, ref_pairs, int(pad_id))
        peaks, handles = _watch_activations(model)  # the GPU pool's float16: each module's largest output
        with torch.no_grad():
            logits = model(**torch_inputs(model, feed, described["uses_token_types"])).logits
        for handle in handles:
            handle.remove()
        if tuple(logits.shape) != (len(ref_pairs), 1):
            raise RuntimeError(f"UnsupportedModel: logits shape {tuple(logits.shape)}, expected [batch, 1]")
        result["torch_ref_logits"] = logits[:, 0].tolist()
        if peaks:
            where = max(peaks, key=lambda k: peaks[k])
            result["fp16_peak_activation"] = peaks[where]
            result["fp16_peak_module"] = where

    if spec.get("original_dir"):
        # The GPU pool (Candle) needs model.safetensors; write it only when the source has no safetensors.
        od = Path(spec["original_dir"])
        od.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        model.save_pretrained(str(od), safe_serialization=True, max_shard_size="1000GB")
        timings["safetensors_s"] = time.monotonic() - t0

    t0 = time.monotonic()
    import optimum.exporters.onnx.model_configs  # noqa: F401 - registers the ONNX configs with TasksManager
    from optimum.exporters.tasks import TasksManager

    ctor = TasksManager.get_exporter_config_constructor(exporter="onnx", model=model, task="text-classification",
                                                        library_name="transformers")
    onnx_config = ctor(model.config)
    dummy = onnx_config.generate_dummy_inputs(framework="pt")
    out_path = onnx_dir / MODEL_FILE
    with torch.no_grad(), onnx_config.patch_model_for_export(model):
        inputs = onnx_config.ordered_inputs(model)
        input_names = list(inputs.keys())
        output_names = list(onnx_config.outputs.keys())
        axes = {**dict(inputs), **dict(onnx_config.outputs)}
        torch.onnx.export(model, (dummy,), str(out_path), input_names=input_names, output_names=output_names,
                          dynamic_axes=axes, do_constant_folding=True, opset_version=OPSET, dynamo=False)
    timings["export_s"] = time.monotonic() - t0
    del model, dummy
    gc.collect()

    t0 = time.monotonic()
    data_bytes = external_data.consolidate(out_path)
    timings["consolidate_s"] = time.monotonic() - t0
    result.update(input_names=input_names, output_names=output_names, onnx_path=str(out_path),
                  external_data_bytes=data_bytes, opset=OPSET, timings=timings,
                  torch_version=torch.__version__)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec_path, result_path = argv[0], argv[1]
    spec = json.loads(Path(spec_path).read_text())
    _die_with_parent(int(spec.get("parent_pid", os.getppid())))
    try:
        result = run(spec)
    except Exception as exc:  # reported to the parent as data
        msg = str(exc)
        reason = "ExportFailed"
        if msg.startswith("UnsupportedModel: "):
            reason, msg = "UnsupportedModel", msg[len("UnsupportedModel: "):]
        result = {"error": {"reason": reason, "message": f"{type(exc).__name__}: {msg}"[:2000]}}
        Path(result_path).write_text(json.dumps(result))
        return 2
    Path(result_path).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
