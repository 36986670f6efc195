"""The streaming MatMul quantizer of large models (quantizer_job/steps/graph/matmul_int8.py) against ONNX Runtime's own
``quantize_dynamic`` on the same graph: the same int8 weights (scales within float rounding), the same scores,
excluded nodes and weights the graph exposes left FP32, and its external data page-aligned."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantizer_job.steps.common import isa
from quantizer_job.steps.graph import external_data, matmul_int8

pytestmark = pytest.mark.quantizer

HIDDEN, FFN = 48, 96
#: Full-range (8-bit) weights saturate the integer kernels of CPUs without VNNI (AVX2 only: many AMD EPYC), so the
#: closeness to FP32 is a property of this machine's kernels there, not of the quantizer; reduce_range (7-bit
#: weights) is what such a CPU needs, as the Job's auto search and the fixtures' FIXED_RECIPE choose.
KERNELS_SATURATE = isa.REDUCE_RANGE_REQUIRED[isa.detect_local_target()]


def _ffn_model(path: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """x -> MatMul(W1) + b1 -> Relu -> MatMul(W2) -> MatMul(W3), weights in an external data file. W1's columns
    differ in scale by 1000x (a per-tensor scale would flatten the small ones); one column of W3 is all zero."""
    w1 = (rng.standard_normal((HIDDEN, FFN)) * rng.uniform(1e-3, 1.0, (1, FFN))).astype(np.float32)
    w2 = rng.standard_normal((FFN, HIDDEN)).astype(np.float32) * 0.1
    w3 = rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32)
    w3[:, 5] = 0.0
    b1 = rng.standard_normal(FFN).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"], name="ffn_up"),
         helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
         helper.make_node("Relu", ["hb"], ["r"], name="act"),
         helper.make_node("MatMul", ["r", "W2"], ["d"], name="ffn_down"),
         helper.make_node("MatMul", ["d", "W3"], ["y"], name="out")], "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", HIDDEN])],
        [numpy_helper.from_array(w, n) for n, w in (("W1", w1), ("b1", b1), ("W2", w2), ("W3", w3))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=path.name + "_data", size_threshold=0)
    return {"W1": w1, "W2": w2, "W3": w3}


def _ort_quantized(src: Path, dst: Path, per_channel: bool, reduce_range: bool, exclude: list[str]) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst.parent.mkdir(parents=True)
    quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul"], per_channel=per_channel,
                     reduce_range=reduce_range, weight_type=QuantType.QInt8, nodes_to_exclude=exclude,
                     extra_options={"MatMulConstBOnly": True})
    return dst


def _inits(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t, base_dir=str(path.parent)) for t in onnx.load(str(path)).graph.initializer}


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return np.asarray(ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0])


@pytest.mark.parametrize(("per_channel", "reduce_range"), [(True, False), (False, False), (True, True)])
def test_same_weights_and_scores_as_onnx_runtimes_quantizer(tmp_path: Path, per_channel: bool,
                                                             reduce_range: bool) -> None:
    rng = np.random.default_rng(7)
    src = tmp_path / "fp32" / "model.onnx"
    weights = _ffn_model(src, rng)
    ours = tmp_path / "ours" / "model.onnx"
    done = matmul_int8.quantize_matmuls(src, ours, per_channel=per_channel, reduce_range=reduce_range,
                                        exclude=["ffn_down"])
    assert (done.matmuls, done.kept_fp32) == (2, 1)
    theirs = _ort_quantized(src, tmp_path / "ort" / "model.onnx", per_channel, reduce_range, ["ffn_down"])
    got, want = _inits(ours), _inits(theirs)
    for w in ("W1", "W3"):
        assert got[w + "_quantized"].dtype == np.int8
        np.testing.assert_array_equal(got[w + "_quantized"], want[w + "_quantized"])
        np.testing.assert_allclose(got[w + "_scale"], want[w + "_scale"], rtol=1e-6)
        np.testing.assert_array_equal(got[w + "_zero_point"], want[w + "_zero_point"])
        assert w not in got
    np.testing.assert_array_equal(got["W2"], weights["W2"])  # excluded: FP32, unchanged
    ops = [n.op_type for n in onnx.load(str(ours), load_external_data=False).graph.node]
    assert ops.count("DynamicQuantizeMatMul") == 2 and ops.count("MatMul") == 1
    x = rng.standard_normal((2, 5, HIDDEN)).astype(np.float32)
    ref, mine, ort_q = _run(src, x), _run(ours, x), _run(theirs, x)
    np.testing.assert_allclose(mine, ort_q, rtol=1e-5, atol=1e-5)
    assert np.abs(mine - ref).max() > 0  # it is quantized, and close: within a few % of the output's range
    if reduce_range or not KERNELS_SATURATE:  # (equal to ORT's own quantizer's output on every CPU, above)
        assert np.abs(mine - ref).max() < 0.05 * np.abs(ref).max()


def test_external_data_is_page_aligned_and_nothing_is_left_half_written(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    src = tmp_path / "fp32" / "model.onnx"
    _ffn_model(src, rng)
    out = tmp_path / "int8" / "model.onnx"
    matmul_int8.quantize_matmuls(src, out, per_channel=True, reduce_range=False)
    m = onnx.load(str(out), load_external_data=False)
    offsets = [int({e.key: e.value for e in t.external_data}["offset"]) for t in m.graph.initializer
               if t.data_location == TensorProto.EXTERNAL]
    assert offsets and all(o % external_data.ALIGN == 0 for o in offsets)
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx", "model.onnx_data"]
    broken = tmp_path / "broken" / "model.onnx"
    (src.parent / "model.onnx_data").write_bytes(b"")  # the weights are gone: reading fails half-way
    with pytest.raises(OSError, match="shorter than recorded"):
        matmul_int8.quantize_matmuls(src, broken, per_channel=True, reduce_range=False)
    assert list(broken.parent.iterdir()) == []


def test_a_weight_that_is_also_a_graph_input_or_output_stays_fp32(tmp_path: Path) -> None:
    """Older exports list initializers as graph inputs (overridable defaults), and a weight may be a graph output:
    quantizing it would drop a name the graph still exposes."""
    rng = np.random.default_rng(5)
    src = tmp_path / "fp32" / "model.onnx"
    _ffn_model(src, rng)
    m = onnx.load(str(src), load_external_data=False)
    m.graph.input.append(helper.make_tensor_value_info("W3", TensorProto.FLOAT, [HIDDEN, HIDDEN]))
    m.graph.output.append(helper.make_tensor_value_info("W2", TensorProto.FLOAT, [FFN, HIDDEN]))
    onnx.save_model(m, str(src))  # the graph only: the data file stays as it is
    out = tmp_path / "int8" / "model.onnx"
    done = matmul_int8.quantize_matmuls(src, out, per_channel=True, reduce_range=KERNELS_SATURATE)
    assert done.matmuls == 1
    got = _inits(out)
    assert "W1_quantized" in got and "W2" in got and "W3" in got
    x = rng.standard_normal((1, 3, HIDDEN)).astype(np.float32)
    np.testing.assert_allclose(_run(out, x), _run(src, x), atol=0.05 * float(np.abs(_run(src, x)).max()))
