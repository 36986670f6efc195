"""Mixed precision: the FFN down-projections with the heaviest input outliers stay FP32, and that is what pays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantizer_job.steps.common import isa
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.graph import outliers
from quantizer_job.steps.graph import quantize as Q
from quantizer_job.steps.recipe_search.recipes import Recipe

pytestmark = pytest.mark.quantizer

HIDDEN, INNER = 32, 128


def _erf_gelu(x: str, out: str, tag: str) -> list[onnx.NodeProto]:
    """x * 0.5 * (1 + erf(x / sqrt 2)), as torch.onnx exports it."""
    return [helper.make_node("Div", [x, "sqrt2"], [f"{tag}_d"]), helper.make_node("Erf", [f"{tag}_d"], [f"{tag}_e"]),
            helper.make_node("Add", [f"{tag}_e", "one"], [f"{tag}_a"]),
            helper.make_node("Mul", [x, f"{tag}_a"], [f"{tag}_m"]),
            helper.make_node("Mul", [f"{tag}_m", "half"], [out])]


def two_ffn_layers(path, outlier_gain: float, seed: int = 0) -> None:
    """x -> FFN a (unfused erf GELU) -> FFN b (fused com.microsoft Gelu) -> y. ``outlier_gain`` scales a few of
    FFN b's up-projection columns, so b's GELU output has a few huge channels (what real encoders show)."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * gain / np.sqrt(shape[0])).astype(np.float32)

    up_b = w(HIDDEN, INNER)
    up_b[:, :3] *= outlier_gain
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("up_a", w(HIDDEN, INNER)), ("down_a", w(INNER, HIDDEN)), ("up_b", up_b), ("down_b", w(INNER, HIDDEN)),
        ("sqrt2", np.array(np.sqrt(2.0), np.float32)), ("one", np.array(1.0, np.float32)),
        ("half", np.array(0.5, np.float32))]]
    nodes = [helper.make_node("MatMul", ["x", "up_a"], ["ha"], name="up_a"), *_erf_gelu("ha", "ga", "a"),
             helper.make_node("MatMul", ["ga", "down_a"], ["oa"], name="down_a"),
             helper.make_node("MatMul", ["oa", "up_b"], ["hb"], name="up_b"),
             helper.make_node("Gelu", ["hb"], ["gb"], name="gelu_b", domain="com.microsoft"),
             helper.make_node("MatMul", ["gb", "down_b"], ["y"], name="down_b")]
    g = helper.make_graph(nodes, "ffn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", HIDDEN])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=9)
    onnx.save(m, str(path))


def _run(path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]


def test_finds_down_projections_after_fused_and_unfused_gelu_only(tmp_path):
    path = tmp_path / "m.onnx"
    two_ffn_layers(path, outlier_gain=1.0)
    assert outliers.ffn_down_inputs(onnx.load(str(path))) == {"down_a": "ga", "down_b": "gb"}


def test_coarseness_is_range_over_rms():
    assert outliers.coarseness([np.array([1.0, -1.0]), np.array([1.0, -1.0])]) == pytest.approx(2.0)
    # One outlier among many small values: a far coarser step relative to the signal.
    spiky = np.concatenate([np.full(999, 0.1), [50.0]])
    assert outliers.coarseness([spiky]) > 10 * outliers.coarseness([np.full(1000, 0.1), np.array([-0.1])])


def test_keep_fp32_takes_the_coarsest_share_at_least_one():
    scores = {"a": 3.0, "b": 9.0, "c": 1.0, "d": 5.0, "e": 2.0, "f": 4.0}
    assert outliers.keep_fp32(scores, 1 / 3) == ["b", "d"]
    assert outliers.keep_fp32(scores, 0.01) == ["b"]
    assert outliers.keep_fp32(scores, 1.0) == ["b", "d", "f", "a", "e", "c"]
    assert outliers.keep_fp32(scores, 0.0) == [] and outliers.keep_fp32({}, 0.5) == []


def test_outlier_layer_is_ranked_first_kept_fp32_and_that_cuts_the_int8_error(tmp_path):
    src, mixed, full = tmp_path / "src.onnx", tmp_path / "mixed" / "model.onnx", tmp_path / "full" / "model.onnx"
    two_ffn_layers(src, outlier_gain=40.0)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((64, HIDDEN)).astype(np.float32)} for _ in range(3)]
    scores = outliers.measure(src, feeds, threads=1)
    assert set(scores) == {"down_a", "down_b"} and scores["down_b"] > scores["down_a"]
    assert not list(tmp_path.glob("*probe*"))  # the probe copy is gone

    # Quantized as this CPU's kernels need (reduce_range on AVX2 without VNNI), or saturation in every layer
    # would drown the one outlier layer this test is about.
    target = isa.detect_local_target()
    recipe = Recipe(name="mixed", optimization_level=0, fp32_ffn_down=0.5, target=target,
                    reduce_range=isa.REDUCE_RANGE_REQUIRED[target])
    assert Q.fp32_nodes(src, recipe, feeds) == ["down_b"]
    Q.quantize_dynamic(src, mixed, recipe, exclude=["down_b"])
    Q.quantize_dynamic(src, full, replace(recipe, fp32_ffn_down=0.0))
    kept = {n.name for n in onnx.load(str(mixed)).graph.node if n.op_type == "MatMul"}
    assert kept == {"down_b"}  # every other MatMul was quantized
    assert not {n.name for n in onnx.load(str(full)).graph.node if n.op_type == "MatMul"}

    x = rng.standard_normal((256, HIDDEN)).astype(np.float32)
    ref = _run(src, x)
    err_mixed = float(np.abs(_run(mixed, x) - ref).mean())
    err_full = float(np.abs(_run(full, x) - ref).mean())
    assert err_mixed < 0.5 * err_full, (err_mixed, err_full)


def test_spread_takes_evenly_spaced_batches():
    batches = [{"i": np.array([i])} for i in range(10)]
    assert [int(b["i"][0]) for b in outliers.spread(batches, 4)] == [0, 2, 4, 6]
    assert [int(b["i"][0]) for b in outliers.spread(batches[:3], 4)] == [0, 1, 2]


def test_share_one_keeps_every_down_projection(tmp_path):
    src = tmp_path / "src.onnx"
    two_ffn_layers(src, outlier_gain=40.0)
    feeds = [{"x": np.ones((4, HIDDEN), np.float32)}]
    assert sorted(Q.fp32_nodes(src, Recipe(name="all", fp32_ffn_down=1.0), feeds)) == ["down_a", "down_b"]


def test_mixed_recipe_without_batches_to_measure_is_an_error(tmp_path):
    src = tmp_path / "src.onnx"
    two_ffn_layers(src, outlier_gain=1.0)
    with pytest.raises(JobError, match="needs batches"):
        Q.fp32_nodes(src, Recipe(name="mixed", fp32_ffn_down=0.34), [])
    assert Q.fp32_nodes(src, Recipe(name="plain"), []) == []
