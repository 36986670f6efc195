"""The GPU pool's numbers on a real GPU: FP16 of the original weights against FP32, and against the CPU emulation of
FP16 that the quality guard's benchmark (and its caveat) rests on. Prints JSON.

The GPU pool serves the original weights in FP16 (TEI's CUDA path) and nothing in the Job checks them: the Job's gate
is for the CPU pool's INT8 artifact. This measures, on a trained fixture's held-out pairs, what FP16 does to the
ranking, how close the CPU emulation (``benchmarks.guard_detection``: every weight and activation rounded through
float16, arithmetic in FP32) comes to real FP16 kernels, whether the emulated overflow fault overflows on the same
pairs on a GPU, how much headroom each layer's activations leave below float16's 65504, and FP16 vs FP32 speed.

Two steps, because the GPU machine reaches no network and takes only a small working tree:

    python -m benchmarks.gpu_fp16 prepare [--fixtures minilm-ce,xlmr-ce] [--out .gpu-prep]    # here, on CPU
    python -m benchmarks.gpu_fp16 measure [--prepared .gpu-prep] [--large]                      # on a CUDA machine

``prepare`` (CPU; the fixtures of ``benchmarks/trained_fixture.py``): the quality guard benchmark's cached scores for
``reference`` (the FP32 ONNX export, TEI's batches of 8 in arrival order), ``healthy-fp16`` and ``fp16-overflow``
(the emulations), the same batches as token ids, and the weights in float16 (what TEI loads onto the GPU: a weight
rounded once more to float16 is unchanged). The word-embedding table keeps only the rows these pairs use (the ids
are renumbered; an embedding lookup is exact, so the scores are those of the whole table), which keeps a fixture
near 25 MB. ``measure`` (PyTorch on CUDA, TF32 off) scores every pair:

- ``fp32-on-fp16-weights``: FP32 arithmetic on the rounded weights (how much is the weights' rounding alone);
- ``fp16-padded``: FP16, batches of 8 padded to their longest (the emulation's batches), PyTorch's SDPA attention;
- ``fp16-unpadded``: FP16, every pair alone: what TEI's CUDA path computes (its flash attention packs a batch's
  sequences without padding, so no padded position exists to overflow);
- ``fp16-padded-eager``: as ``fp16-padded`` with the eager attention (softmax of FP16 scores);
- ``bf16-unpadded``: bfloat16, for comparison;
- ``fp16-overflow-padded`` / ``-unpadded``: FP16 with the emulated fault made real: the input of the same
  LayerNorm multiplied by the same scale (LayerNorm is scale-invariant, so FP32 would not change).

Each is compared with the FP32 ONNX reference as the quality guard compares a pool (pooled Spearman, top-3 agreement,
largest logit and sigmoid difference, pairs not finite) and, for FP16, with the emulation (largest difference, and
how well the emulation's per-pair error predicts the real one). ``--large`` adds the XLM-R large shape
(bge-reranker-v2-m3's: 568M parameters, random weights, seeded) for speed and FP16-vs-FP32 logit differences at
TEI's 512- and 8192-token shapes. Speeds are PyTorch's, not TEI's candle kernels: a ratio, not a pool's capacity.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

# numpy only: `measure` runs from a bare checkout on the GPU machine
from quantizer_job.steps.evaluation import metrics
from quantizer_job.steps.tei import textenc

ROOT = Path(__file__).resolve().parents[1]

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
FP16_MAX = 65504.0
TOPK = 3


# --- prepare (CPU, where the fixtures and the quantizer's stack are) ------------------------------------------------
def overflow_site(onnx_path: Path, tensor: str) -> dict[str, Any]:
    """Which encoder layer's LayerNorm the emulated fault scales, from the ONNX graph (embeddings' LayerNorm first,
    then two a layer: attention output, FFN output), checked against the tensor the emulation scaled."""
    import onnx

    lns = [n for n in onnx.load(str(onnx_path), load_external_data=False).graph.node
           if n.op_type == "LayerNormalization"]
    index = next(i for i, n in enumerate(lns) if n.input[0] == tensor)
    if index == 0:
        raise SystemExit("the fault scales the embeddings' LayerNorm: not an encoder layer's")
    return {"layer": (index - 1) // 2, "block": "attention" if index % 2 else "output", "layernorm_index": index}


def compact_vocabulary(batches: list[dict[str, np.ndarray]], pad_id: int) -> tuple[np.ndarray, int]:
    """The token ids the batches use (the pad id always among them), sorted; and the pad id's new number."""
    used = np.unique(np.concatenate([b["input_ids"].ravel() for b in batches] + [np.array([pad_id])]))
    return used, int(np.searchsorted(used, pad_id))


def prepare_fixture(name: str, out: Path, threads: int) -> dict[str, Any]:
    import tempfile

    import torch
    from safetensors.torch import load_file, save_file

    from benchmarks import guard_detection  # the quantizer's ML stack: prepare only, never on the GPU machine

    with tempfile.TemporaryDirectory(prefix="gpu-fp16-") as tmp:
        lab = guard_detection.Lab(name, threads, Path(tmp), rescore=False)
        scores = {v: lab.logits(v) for v in ("reference", "healthy-fp16", "fp16-overflow")}
        fault = lab.notes["fp16-overflow"]
        site = overflow_site(lab.fp32, fault["scaled_tensor"])
        batches = lab.batches()
    used, pad_new = compact_vocabulary(batches, lab.pad_id)
    dst = out / name
    dst.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for i, b in enumerate(batches):
        for k in INPUTS:
            if k in b:
                v = np.asarray(b[k], dtype=np.int64)
                arrays[f"{i}/{k}"] = np.searchsorted(used, v) if k == "input_ids" else v
    np.savez_compressed(dst / "batches.npz", **arrays)
    np.savez_compressed(dst / "scores.npz", reference=scores["reference"], emulated_fp16=scores["healthy-fp16"],
                        emulated_overflow=scores["fp16-overflow"])
    src = Path(lab.fx["model_dir"])
    weights = load_file(str(src / "model.safetensors"))
    table = next(k for k in weights if k.endswith("word_embeddings.weight"))
    weights[table] = weights[table][torch.from_numpy(used)]
    save_file({k: v.to(torch.float16).contiguous() for k, v in weights.items()}, str(dst / "model.safetensors"))
    cfg = json.loads((src / "config.json").read_text())
    vocab_size = int(cfg["vocab_size"])
    cfg.update(vocab_size=len(used), pad_token_id=pad_new)
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    meta = {"fixture": name, "pairs": len(lab.pairs), "batches": len(batches),
            "query_of_pair": [lab.groups.index(q) for q in lab.groups], "overflow": {**site, **fault},
            "vocabulary_rows_kept": len(used), "original_vocab_size": vocab_size}
    (dst / "meta.json").write_text(json.dumps(meta))
    return {"fixture": name, "dir": str(dst), "pairs": meta["pairs"], "vocabulary_rows_kept": len(used),
            "bytes": sum(p.stat().st_size for p in dst.iterdir())}


# --- measure (a CUDA machine with PyTorch and transformers) ---------------------------------------------------------
def compare(groups: list[int], ref: np.ndarray, got: np.ndarray) -> dict[str, Any]:
    """As the quality guard compares a pool with its reference, over all pairs pooled."""
    finite = np.isfinite(got)
    out: dict[str, Any] = {"pairs_not_finite": int((~finite).sum())}
    if finite.all():
        sig = lambda z: 1.0 / (1.0 + np.exp(-z))  # noqa: E731
        out.update(spearman=round(metrics.spearman(ref, got), 6),
                   top3=round(metrics.topk_agreement(groups, ref, got, TOPK), 4),
                   max_abs_logit=float(np.max(np.abs(got - ref))),
                   max_abs_sigmoid=float(np.max(np.abs(sig(got) - sig(ref)))),
                   top1_changed_queries=int(sum(np.argmax(ref[m]) != np.argmax(got[m])
                                                for m in _query_masks(groups))))
    return out


def _query_masks(groups: list[int]) -> list[np.ndarray]:
    g = np.asarray(groups)
    return [g == q for q in np.unique(g)]


def versus_emulation(ref: np.ndarray, real: np.ndarray, emulated: np.ndarray) -> dict[str, Any]:
    """How close the CPU emulation is to real FP16: largest difference, and whether its per-pair error (vs FP32)
    predicts the real one (correlation of the two errors, and their sizes)."""
    e_real, e_emul = real - ref, emulated - ref
    ok = np.isfinite(e_real) & np.isfinite(e_emul)
    return {"max_abs_real_minus_emulated": float(np.max(np.abs(real[ok] - emulated[ok]))),
            "error_rms_real": float(np.sqrt(np.mean(e_real[ok] ** 2))),
            "error_rms_emulated": float(np.sqrt(np.mean(e_emul[ok] ** 2))),
            "error_correlation": round(float(np.corrcoef(e_real[ok], e_emul[ok])[0, 1]), 4)}


class Scorer:
    """One prepared fixture on the GPU: its batches, and a model in a given dtype and attention."""

    def __init__(self, prepared: Path, device: str, limit: int | None = None) -> None:
        import torch

        self.torch, self.device = torch, device
        self.dir = prepared
        z = np.load(prepared / "batches.npz")
        n = 1 + max(int(k.split("/")[0]) for k in z.files)
        self.batches = [{k: z[f"{i}/{k}"] for k in INPUTS if f"{i}/{k}" in z.files} for i in range(n)][:limit]
        self.meta = json.loads((prepared / "meta.json").read_text())
        if not textenc.uses_token_types(json.loads((prepared / "config.json").read_text())):
            for b in self.batches:  # one token type or none (XLM-R, DistilBERT, ...): the model takes none
                b.pop("token_type_ids", None)
        self.pairs = sum(b["input_ids"].shape[0] for b in self.batches)

    def model(self, dtype: Any, attention: str) -> Any:
        from transformers import AutoModelForSequenceClassification

        m = AutoModelForSequenceClassification.from_pretrained(str(self.dir), attn_implementation=attention)
        return m.to(device=self.device, dtype=dtype).eval()

    def _feeds(self, batch: dict[str, np.ndarray], row: int | None) -> dict[str, Any]:
        t = self.torch
        if row is None:
            return {k: t.from_numpy(v).to(self.device) for k, v in batch.items()}
        n = int(batch["attention_mask"][row].sum())  # a pair alone: its real tokens, no padding
        return {k: t.from_numpy(np.ascontiguousarray(v[row : row + 1, :n])).to(self.device) for k, v in batch.items()}

    def scores(self, model: Any, padded: bool) -> np.ndarray:
        out: list[np.ndarray] = []
        with self.torch.inference_mode():
            for b in self.batches:
                rows: list[int | None] = [None] if padded else list(range(b["input_ids"].shape[0]))
                for r in rows:
                    logits = model(**self._feeds(b, r)).logits.float().reshape(-1)
                    out.append(logits.cpu().numpy())
        return np.concatenate(out).astype(np.float64)

    def scores_and_peaks(self, model: Any) -> tuple[np.ndarray, list[dict[str, float]]]:
        """Unpadded scores, and per encoder layer the largest |value| seen while computing them of what FP16 could
        overflow: the attention block's and the FFN's residual sums (LayerNorm inputs) and the FFN's intermediate
        activation."""
        layers = model.base_model.encoder.layer
        found: list[dict[str, float]] = [{} for _ in layers]
        hooks = []

        def record(i: int, key: str, pre: bool) -> Any:
            def hook(_m: Any, args: Any, output: Any = None) -> None:
                x = args[0] if pre else output
                v = float(x.detach().abs().float().max())
                found[i][key] = max(found[i].get(key, 0.0), v)
            return hook

        for i, layer in enumerate(layers):
            hooks.append(layer.attention.output.LayerNorm.register_forward_pre_hook(record(i, "attention_sum", True)))
            hooks.append(layer.output.LayerNorm.register_forward_pre_hook(record(i, "ffn_sum", True)))
            hooks.append(layer.intermediate.register_forward_hook(record(i, "ffn_activation", False)))
        try:
            return self.scores(model, padded=False), found
        finally:
            for h in hooks:
                h.remove()

    def with_fault(self, model: Any) -> Any:
        """The emulated overflow made real: the chosen LayerNorm's input times the emulation's scale."""
        o = self.meta["overflow"]
        layer = model.base_model.encoder.layer[o["layer"]]
        ln = layer.attention.output.LayerNorm if o["block"] == "attention" else layer.output.LayerNorm
        scale = float(o["scale"])
        return ln.register_forward_pre_hook(lambda _m, args: (args[0] * scale, *args[1:]))

    def pairs_per_s(self, model: Any, padded: bool, min_seconds: float = 1.0) -> float:
        self.scores(model, padded)  # warm-up (scores() copies every result to the host: no pending work after it)
        n, t0 = 0, time.perf_counter()
        while True:
            self.scores(model, padded)
            n += self.pairs
            if time.perf_counter() - t0 >= min_seconds:
                return n / (time.perf_counter() - t0)


def measure_fixture(prepared: Path, device: str, limit: int | None) -> dict[str, Any]:
    import torch

    s = Scorer(prepared, device, limit)
    z = np.load(prepared / "scores.npz")
    ref, emul, emul_over = (z[k][: s.pairs] for k in ("reference", "emulated_fp16", "emulated_overflow"))
    groups = s.meta["query_of_pair"][: s.pairs]
    runs: dict[str, Any] = {}
    got: dict[str, np.ndarray] = {}
    plan = [("fp32-on-fp16-weights", torch.float32, "sdpa", True), ("fp16-padded", torch.float16, "sdpa", True),
            ("fp16-unpadded", torch.float16, "sdpa", False), ("fp16-padded-eager", torch.float16, "eager", True),
            ("bf16-unpadded", torch.bfloat16, "sdpa", False)]
    for name, dtype, attention, padded in plan:
        m = s.model(dtype, attention)
        peaks = None
        if name == "fp16-unpadded":
            got[name], peaks = s.scores_and_peaks(m)
        else:
            got[name] = s.scores(m, padded)
        runs[name] = {"vs_fp32_onnx": compare(groups, ref, got[name])}
        if dtype == torch.float16:
            runs[name]["vs_cpu_emulation"] = versus_emulation(ref, got[name], emul)
        if peaks is not None:
            runs[name]["activation_peaks"] = peaks
        if name in ("fp32-on-fp16-weights", "fp16-padded"):
            runs[name]["pairs_per_s_batches_of_8"] = round(s.pairs_per_s(m, padded=True), 1)
        if name == "fp16-padded":
            h = s.with_fault(m)
            for padded_fault in (True, False):
                key = "fp16-overflow-" + ("padded" if padded_fault else "unpadded")
                got[key] = s.scores(m, padded_fault)
                runs[key] = {"vs_fp32_onnx": compare(groups, ref, got[key]),
                             "overflow_sets": overflow_sets(groups, emul_over, got[key])}
            h.remove()
        del m
        if device == "cuda":
            torch.cuda.empty_cache()
    peaks = runs["fp16-unpadded"]["activation_peaks"]
    top = max(max(p.values()) for p in peaks)
    return {"fixture": s.meta["fixture"], "pairs": s.pairs, "fault": s.meta["overflow"],
            "emulation_vs_fp32_onnx": compare(groups, ref, emul), "runs": runs,
            "largest_activation": top, "fp16_headroom": round(FP16_MAX / top, 1)}


def overflow_sets(groups: list[int], emulated: np.ndarray, real: np.ndarray) -> dict[str, Any]:
    """Which pairs (and requests) the emulated fault and the real one make not finite."""
    e, r = ~np.isfinite(emulated), ~np.isfinite(real)
    req = lambda bad: {q for q, b in zip(groups, bad, strict=True) if b}  # noqa: E731
    return {"emulated_pairs": int(e.sum()), "real_pairs": int(r.sum()), "both": int((e & r).sum()),
            "emulated_requests": len(req(e)), "real_requests": len(req(r)),
            "requests_both": len(req(e) & req(r))}


def measure_large(device: str, seed: int = 0) -> dict[str, Any]:
    """XLM-R large's shape (bge-reranker-v2-m3's), random weights: FP16 vs FP32 speed and logit differences."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    torch.manual_seed(seed)
    cfg = XLMRobertaConfig(vocab_size=250002, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                           intermediate_size=4096, max_position_embeddings=8194, num_labels=1)
    fp32 = XLMRobertaForSequenceClassification(cfg).to(device).eval()
    fp16 = XLMRobertaForSequenceClassification(cfg).to(device).eval()
    fp16.load_state_dict(fp32.state_dict())
    fp16.half()
    g = torch.Generator(device="cpu").manual_seed(seed)
    out: dict[str, Any] = {"parameters": sum(p.numel() for p in fp32.parameters())}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for batch, length in ((8, 512), (32, 512), (1, 8192)):
        ids = torch.randint(5, 250000, (batch, length), generator=g).to(device)
        ids[:, 0] = 0
        mask = torch.ones_like(ids)
        row: dict[str, Any] = {}
        with torch.inference_mode():
            a = fp32(input_ids=ids, attention_mask=mask).logits.float().reshape(-1)
            b = fp16(input_ids=ids, attention_mask=mask).logits.float().reshape(-1)
            row["max_abs_logit_fp16_vs_fp32"] = float((a - b).abs().max())
            row["fp32_logit_std"] = float(a.std()) if batch > 1 else None
            row["finite_fp16"] = bool(torch.isfinite(b).all())
            for name, m in (("fp32", fp32), ("fp16", fp16)):
                m(input_ids=ids, attention_mask=mask)
                sync()
                n, t0 = 0, time.perf_counter()
                while time.perf_counter() - t0 < 1.0:
                    m(input_ids=ids, attention_mask=mask)
                    sync()
                    n += batch
                row[f"{name}_pairs_per_s"] = round(n / (time.perf_counter() - t0), 1)
        row["fp16_speedup"] = round(row["fp16_pairs_per_s"] / row["fp32_pairs_per_s"], 2)
        out[f"{batch}x{length}"] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--fixtures", default="minilm-ce,xlmr-ce")
    p.add_argument("--out", default=str(ROOT / ".gpu-prep"))
    p.add_argument("--threads", type=int, default=2)
    m = sub.add_parser("measure")
    m.add_argument("--prepared", default=str(ROOT / ".gpu-prep"))
    m.add_argument("--large", action="store_true")
    m.add_argument("--device", default="cuda", help="cpu: a dry run of the code paths (no GPU figures)")
    m.add_argument("--batches", type=int, default=None, help="only the first N batches (a dry run)")
    a = ap.parse_args()
    if a.step == "prepare":
        out = [prepare_fixture(f, Path(a.out), a.threads) for f in a.fixtures.split(",")]
        print(json.dumps(out, indent=1))
        return
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.monotonic()
    name = torch.cuda.get_device_name(0) if a.device == "cuda" else a.device
    prepared = sorted(d for d in Path(a.prepared).iterdir() if (d / "meta.json").is_file())
    result: dict[str, Any] = {"device": name, "torch": torch.__version__,
                              "fixtures": [measure_fixture(d, a.device, a.batches) for d in prepared]}
    if a.large:
        result["xlmr_large_shape"] = measure_large(a.device)
    result["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
