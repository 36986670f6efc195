"""Where the time goes: ONNX Runtime's per-operator profile of FP32 vs INT8 at TEI's batch shapes. Prints JSON.

    python -m benchmarks.ort_profile --fixture minilm-ce [--variants fused-attn-matmul-perchannel-emb8,...]
        [--batches 40]

Each variant's directory (made as ``benchmarks.tei_rerank`` makes them: ``tei_serving.prepare``) is loaded in TEI's
session (ORT_ENABLE_ALL, intra-op threads = CPUs, sequential) with ``enable_profiling``; the fixture's held-out
pairs are fed in arrival order as batches of 8 padded to their longest (what TEI's queue does). Node events are
summed per op type: milliseconds per batch and share of the total, per variant, plus the session's op census after
ORT's own fusions.

Also a GEMM probe: one FP32 MatMul vs the INT8 kernels ORT uses for it (MatMulInteger, DynamicQuantizeMatMul,
QLinearMatMul-free static form MatMulIntegerToFloat) at a BERT FFN shape. The INT8/FP32 ratio of the bare kernels
bounds what quantizing the MatMuls alone can give, and says whether MLAS's VNNI kernels are in use (VNNI: INT8
GEMM runs ~3-4x FP32 GEMM; without: ~1.5-2x).

``bound`` (with the probe): how fast each INT8 variant could be with these kernels, every weight GEMM of the FP32
graph at the probe's DynamicQuantizeMatMul/FP32 ratio and the rest (attention core, GELU, LayerNorm) as the variant's
own profile shows it, and how close the variant is (``of_bound``). Only variants whose profile splits into GEMMs and
the rest: the MultiHeadAttention form, not QAttention (which holds both).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import tei_serving, trained_fixture
from quantizer_job.steps.common import isa
from quantizer_job.steps.tei import layout, textenc


def tei_batches(model_dir: Path, groups, n_batches: int) -> list[dict[str, np.ndarray]]:
    cfg = layout.read_config(model_dir)
    tok = textenc.load_tokenizer(str(model_dir / "tokenizer.json"), textenc.max_input_length(cfg))
    pairs = [(q, t) for q, ts in groups for t in ts]
    return textenc.make_batches(tok, pairs, layout.pad_token_id(cfg, model_dir / "tokenizer.json"), 8)[:n_batches]


def profile(model_path: Path, batches, threads: int, work: Path) -> dict:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(work / (model_path.parent.name + "-optimized.onnx"))
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    for b in batches[:2]:
        sess.run(["logits"], {k: b[k] for k in names})
    so.enable_profiling = True
    so.profile_file_prefix = str(work / model_path.parent.name)
    so.optimized_model_filepath = ""
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    sess.run(["logits"], {k: batches[0][k] for k in names})
    t0 = time.perf_counter()
    for b in batches:
        sess.run(["logits"], {k: b[k] for k in names})
    wall = time.perf_counter() - t0
    trace = json.loads(Path(sess.end_profiling()).read_text())
    per_op: dict[str, float] = defaultdict(float)
    per_node: dict[str, float] = defaultdict(float)
    runs = 0
    for ev in trace:
        if ev.get("cat") == "Session" and ev.get("name") == "model_run":
            runs += 1
        if ev.get("cat") == "Node" and ev.get("name", "").endswith("_kernel_time"):
            per_op[ev["args"]["op_name"]] += ev["dur"] / 1e3
            per_node[ev["name"].removesuffix("_kernel_time")] += ev["dur"] / 1e3
    nb = len(batches)
    total = sum(per_op.values()) * (nb / max(1, runs))  # the warm-up run is in the trace too
    scale = nb / max(1, runs)
    ops = sorted(((k, v * scale / nb) for k, v in per_op.items()), key=lambda kv: -kv[1])
    import onnx

    census: dict[str, int] = defaultdict(int)
    graph = onnx.load(str(work / (model_path.parent.name + "-optimized.onnx"))).graph
    weights = {i.name for i in graph.initializer}
    weight_gemms = set()
    for n in graph.node:
        census[n.op_type] += 1
        if n.op_type in FP32_GEMMS and len(n.input) > 1 and n.input[1] in weights:
            weight_gemms.add(n.name)
    return {"ms_per_batch_wall": round(wall / nb * 1e3, 2), "ms_per_batch_ops": round(total / nb, 2),
            "ops": {k: {"ms_per_batch": round(v, 3), "share": round(v / (total / nb), 4)} for k, v in ops},
            "weight_gemm_ms_per_batch": round(sum(per_node[n] for n in weight_gemms) * scale / nb, 3),
            "optimized_graph_ops": dict(sorted(census.items(), key=lambda kv: -kv[1]))}


#: FP32 operators that multiply by a weight matrix when their second input is an initializer (the projections and
#: FFN layers; the attention core's MatMuls multiply two activations).
FP32_GEMMS = ("MatMul", "Gemm", "FusedGemm", "FusedMatMul")
#: INT8 operators that are weight GEMMs and nothing else. QAttention is not: it holds the Q/K/V projection *and* the
#: FP32 attention core, so a variant with QAttention cannot be split (the MultiHeadAttention form can).
INT8_GEMMS = ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "DynamicQuantizeLinear",
              "QLinearMatMul")


def bound(fp32: dict, int8: dict, gemm_ratio: float) -> dict | None:
    """How fast INT8 could be with the kernels measured: every weight GEMM of the FP32 graph at the bare kernels'
    INT8/FP32 ratio (``gemm_probe``), everything else as the INT8 profile shows it (attention core, GELU,
    LayerNorm: FP32 in both). None when the INT8 profile cannot be split (QAttention). ``x_fp32``: the bound,
    ``achieved_x_fp32``: the variant, ``of_bound``: how close it is."""
    if "QAttention" in int8["ops"]:
        return None
    gemm = sum(v["ms_per_batch"] for k, v in int8["ops"].items() if k in INT8_GEMMS)
    rest = int8["ms_per_batch_ops"] - gemm
    ms = fp32["weight_gemm_ms_per_batch"] / gemm_ratio + rest
    achieved = fp32["ms_per_batch_ops"] / int8["ms_per_batch_ops"]
    limit = fp32["ms_per_batch_ops"] / ms
    return {"gemm_ratio": gemm_ratio, "fp32_weight_gemm_ms": fp32["weight_gemm_ms_per_batch"],
            "int8_gemm_ms": round(gemm, 3), "int8_rest_ms": round(rest, 3), "ms_per_batch": round(ms, 3),
            "x_fp32": round(limit, 3), "achieved_x_fp32": round(achieved, 3), "of_bound": round(achieved / limit, 3)}


def gemm_probe(threads: int, m: int = 8 * 96, k: int = 384, n: int = 1536, reps: int = 200) -> dict:
    """Bare kernels at one FFN shape: FP32 MatMul vs MatMulInteger (u8s8) vs DynamicQuantizeMatMul."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((k, n)).astype(np.float32)
    wq = rng.integers(-127, 127, (k, n)).astype(np.int8)
    x = rng.standard_normal((m, k)).astype(np.float32)
    xq = rng.integers(0, 255, (m, k)).astype(np.uint8)
    xqs = rng.integers(-127, 127, (m, k)).astype(np.int8)

    def model(nodes, inputs, inits, out_type):
        g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", out_type, None)], inits)
        return helper.make_model(g, ir_version=9, opset_imports=[helper.make_opsetid("", 17),
                                                                 helper.make_opsetid("com.microsoft", 1)])

    fi = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])]
    cases = {
        "fp32_matmul": (model([helper.make_node("MatMul", ["x", "w"], ["y"])], fi, [numpy_helper.from_array(w, "w")],
                              TensorProto.FLOAT), {"x": x}),
        "u8s8_matmulinteger": (model([helper.make_node("MatMulInteger", ["x", "w"], ["y"])],
                                     [helper.make_tensor_value_info("x", TensorProto.UINT8, [m, k])],
                                     [numpy_helper.from_array(wq, "w")], TensorProto.INT32), {"x": xq}),
        "s8s8_matmulinteger": (model([helper.make_node("MatMulInteger", ["x", "w"], ["y"])],
                                     [helper.make_tensor_value_info("x", TensorProto.INT8, [m, k])],
                                     [numpy_helper.from_array(wq, "w")], TensorProto.INT32), {"x": xqs}),
        "dynamic_quantize_matmul": (model([helper.make_node("DynamicQuantizeMatMul", ["x", "w", "s", "", "b"], ["y"],
                                                            domain="com.microsoft")], fi,
                                          [numpy_helper.from_array(wq, "w"),
                                           numpy_helper.from_array(np.full((n,), 0.01, np.float32), "s"),
                                           numpy_helper.from_array(np.zeros((n,), np.float32), "b")],
                                          TensorProto.FLOAT), {"x": x}),
        "dynamic_quantize_linear_only": (model([helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])],
                                               fi, [], TensorProto.UINT8), {"x": x}),
        # Block-wise 8-bit weights with int8 activations quantized per block of 32 (accuracy_level 4): finer
        # activation scales than DynamicQuantizeMatMul's one per tensor, so a candidate against outlier channels;
        # ORT 1.22 runs it at about half DynamicQuantizeMatMul's speed (and has no 8-bit kernel without level 4).
        "matmul_nbits8_block32_acc4": (_nbits_model(model([helper.make_node("MatMul", ["x", "w"], ["y"])], fi,
                                                          [numpy_helper.from_array(w, "w")], TensorProto.FLOAT)),
                                       {"x": x}),
    }
    out = {"shape_mkn": [m, k, n]}
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    for name, (mdl, feed) in cases.items():
        s = ort.InferenceSession(mdl.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(5):
            s.run(None, feed)
        best = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                s.run(None, feed)
            best.append((time.perf_counter() - t0) / reps)
        sec = min(best)
        out[name] = {"ms": round(sec * 1e3, 3), "gops": round(2 * m * k * n / sec / 1e9, 1)}
    f = out["fp32_matmul"]["ms"]
    for name in cases:
        if name != "fp32_matmul":
            out[name]["x_vs_fp32"] = round(f / out[name]["ms"], 2)
    return out


def _nbits_model(fp32: Any, bits: int = 8, block: int = 32, accuracy_level: int = 4) -> Any:
    """``fp32``'s MatMul as MatMulNBits, quantized by ONNX Runtime's own weight-only quantizer."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    q = MatMulNBitsQuantizer(fp32, algo_config=DefaultWeightOnlyQuantConfig(
        block_size=block, is_symmetric=True, accuracy_level=accuracy_level, bits=bits))
    q.process()
    return q.model.model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fixture", default="minilm-ce")
    ap.add_argument("--variants", default="fused-attn-matmul-perchannel-emb8")
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--no-gemm", action="store_true")
    a = ap.parse_args()
    threads = isa.cpu_budget()
    out: dict = {"fixture": a.fixture, "threads": threads, "target": isa.detect_local_target()}
    fx = trained_fixture.make_fixture(a.fixture, threads=threads)
    groups = [(p["query"], p["texts"]) for p in map(json.loads, Path(fx["eval_jsonl"]).read_text().splitlines())]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dirs, _ = tei_serving.prepare(fx, work, [v for v in a.variants.split(",") if v and v != "fp32"], threads)
        batches = tei_batches(dirs["fp32"], groups, a.batches)
        out["batch_shapes"] = {"batches": len(batches), "median_padded_len": int(np.median([b["input_ids"].shape[1]
                                                                                           for b in batches]))}
        (work / "prof").mkdir()
        out["variants"] = {v: profile(d / layout.MODEL_FILE, batches, threads, work / "prof") for v, d in dirs.items()}
    if not a.no_gemm:
        out["gemm_probe"] = gemm_probe(threads)
        ratio = out["gemm_probe"]["dynamic_quantize_matmul"]["x_vs_fp32"]
        bounds = {v: bound(out["variants"]["fp32"], p, ratio) for v, p in out["variants"].items() if v != "fp32"}
        out["bound"] = {v: b for v, b in bounds.items() if b is not None}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
