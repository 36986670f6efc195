"""Where the INT8 ranking error comes from: each MatMul group (and each FFN down-projection alone) kept FP32 while
everything else is quantized as the fastest auto recipe does it. Prints JSON: Spearman and top-3 agreement vs the
FP32 graph, speed vs FP32 (ONNX Runtime set up as TEI sets it up, all pairs once, batches of 8 in arrival order),
and the outlier coarseness :mod:`quantizer_job.steps.graph.outliers` ranks FFN down-projections by.

    python -m benchmarks.int8_sensitivity --fixture minilm-ce [--per-layer]

This is what chose the mixed-precision recipe (``fp32_ffn_down``): the group whose FP32 copy buys the most quality
per speed lost, and whether the coarseness ranking picks the layers that matter.

``--smooth 0.5,0.7,0.8`` adds SmoothQuant rows (Xiao et al. 2022), the other answer to activation outliers: each FFN
down-projection reads ``x / s`` (one FP32 Mul) and its weight rows are multiplied by ``s``, with
``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)`` measured on calibration batches, so the graph computes the same
function while the per-tensor activation scale no longer follows a few huge channels. It did not beat all-INT8 on
the trained fixture (docs/quantization.md), so no recipe uses it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import trained_fixture
from quantizer_job.steps.common import isa
from quantizer_job.steps.evaluation import evaldata, metrics, verify
from quantizer_job.steps.graph import embedding_int8, export, fusion, outliers
from quantizer_job.steps.graph import quantize as Q
from quantizer_job.steps.recipe_search.recipes import Recipe
from quantizer_job.steps.tei import layout, textenc

BASE = Recipe(name="fused-attn-matmul-perchannel-emb8-fastgelu", optimization_level=1, per_channel=True,
              operators=("MatMul", "Attention"), embeddings="int8", fast_gelu=True)


def roles(model: Any) -> dict[str, str]:
    """Every quantizable node of a fused BERT-family graph by what it computes."""
    producers = {o: n for n in model.graph.node for o in n.output}
    down = outliers.ffn_down_inputs(model)
    out: dict[str, str] = {}
    for n in model.graph.node:
        if n.op_type == "Attention":
            out[n.name] = "qkv_projection"
        elif n.op_type == "MatMul" and n.name in down:
            out[n.name] = "ffn_down"
        elif n.op_type == "MatMul":
            p = producers.get(n.input[0])
            out[n.name] = "attention_output" if p is not None and p.op_type == "Attention" else "ffn_up_and_head"
    return out


def smoothed(graph: Path, dst: Path, feeds: list[dict[str, Any]], alpha: float, threads: int) -> Path:
    """``graph`` with SmoothQuant applied to every FFN down-projection (see the module docstring)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(graph))
    targets = outliers.ffn_down_inputs(m)
    seen = outliers.exposed(graph, feeds, list(dict.fromkeys(targets.values())), threads)
    act = {t: np.max([np.abs(v.reshape(-1, v.shape[-1])).max(axis=0) for v in vs], axis=0) for t, vs in seen.items()}
    inits = {t.name: t for t in m.graph.initializer}
    nodes = []
    for n in m.graph.node:
        if n.name in targets:
            w = numpy_helper.to_array(inits[n.input[1]]).astype(np.float32)
            a = np.maximum(act[n.input[0]], 1e-5)
            s = np.clip(a ** alpha / np.maximum(np.abs(w).max(axis=1), 1e-5) ** (1 - alpha), 1e-2, 1e4)
            inits[n.input[1]].CopyFrom(numpy_helper.from_array((w * s[:, None]).astype(np.float32), n.input[1]))
            m.graph.initializer.append(numpy_helper.from_array((1 / s).astype(np.float32), n.name + "_smooth"))
            nodes.append(helper.make_node("Mul", [n.input[0], n.name + "_smooth"], [n.name + "_smoothed"],
                                          name=n.name + "_smooth"))
            n.input[0] = n.name + "_smoothed"
        nodes.append(n)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    dst.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(dst))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="minilm-ce")
    ap.add_argument("--per-layer", action="store_true", help="also each FFN down-projection alone")
    ap.add_argument("--smooth", default="", help="SmoothQuant migration strengths to try, e.g. 0.5,0.7,0.8")
    a = ap.parse_args()
    import onnx

    threads = isa.cpu_budget()
    fx = trained_fixture.make_fixture(a.fixture, threads=threads)
    src = Path(fx["model_dir"])
    cfg = layout.read_config(src)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        exp = export.run({"src_dir": str(src), "onnx_dir": str(work / "fp32"), "tokenizer_dir": str(work / "tok"),
                          "max_length": textenc.max_input_length(cfg), "pad_id": layout.pad_token_id(cfg),
                          "threads": threads})
        fp32, tok_json = Path(exp["onnx_path"]), Path(exp["tokenizer_json"])
        tok = textenc.load_tokenizer(str(tok_json), textenc.max_input_length(cfg))
        pairs = [(p.query, p.text) for p in evaldata.load_jsonl(fx["eval_jsonl"])]
        keys = [q for q, _ in pairs]
        batches = textenc.make_batches(tok, pairs, layout.pad_token_id(cfg, tok_json), batch_size=8)

        def score(path: Path) -> verify.Timed:
            return verify.score_timed(verify.make_session(path, threads), batches, min_seconds=0.0, max_passes=1)

        ref = score(fp32)
        heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
        cache: fusion.GraphCache = {}
        graph = fusion.optimized_for(BASE, fp32, work, heads, hidden, cache).path
        by_role = roles(onnx.load(str(graph), load_external_data=False))
        coarse = outliers.measure(graph, outliers.spread(batches, Q.PROBE_BATCHES), threads)
        rows: dict[str, dict[str, Any]] = {}

        def trial(name: str, keep: list[str], src: Path = graph) -> None:
            dst = work / name / "model.onnx"
            Q.quantize_dynamic(src, dst, BASE, exclude=keep)
            embedding_int8.quantize_embeddings(dst)
            got = score(dst)
            rows[name] = {"kept_fp32": len(keep), "spearman": round(metrics.spearman(ref.scores, got.scores), 5),
                          "top3": round(metrics.topk_agreement(keys, ref.scores, got.scores, 3), 4),
                          "x_fp32": round(got.pairs_per_s / ref.pairs_per_s, 2)}
            print(name, rows[name], file=sys.stderr, flush=True)

        trial("all_int8", [])
        for role in sorted(set(by_role.values())):
            trial(f"fp32_{role}", [n for n, r in by_role.items() if r == role])
        downs = [n for n, r in by_role.items() if r == "ffn_down"]
        if a.per_layer:
            for i, n in enumerate(downs):
                trial(f"fp32_ffn_down_layer{i}", [n])
        for share in (1 / 3, 2 / 3):
            trial(f"fp32_ffn_down_coarsest_{round(share * 100)}pct", outliers.keep_fp32(coarse, share))
        calib = [(p.query, p.text) for p in evaldata.load_jsonl(fx["calib_jsonl"])]
        calib_batches = textenc.make_batches(tok, calib, layout.pad_token_id(cfg, tok_json), batch_size=8)
        for alpha in [float(x) for x in a.smooth.split(",") if x]:
            sm = smoothed(graph, work / f"smoothed-{alpha}" / "model.onnx", outliers.spread(calib_batches, 8), alpha,
                          threads)
            trial(f"smooth_ffn_down_alpha_{alpha}", [], sm)
    print(json.dumps({"fixture": a.fixture, "pairs": len(pairs), "threads": threads,
                      "fp32_pairs_per_s": round(ref.pairs_per_s, 2), "base_recipe": BASE.name,
                      "ffn_down_coarseness_in_layer_order": [round(coarse[n], 1) for n in downs],
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
