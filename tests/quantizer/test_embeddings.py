"""The word-embedding table in INT8 (per-row scales): same lookups within the rounding bound, 1/4 of the bytes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantizer_job.steps.graph import embedding_int8
from quantizer_job.steps.recipe_search import recipes

pytestmark = pytest.mark.quantizer


def _lookup_model(path, table: np.ndarray, small: np.ndarray) -> None:
    g = helper.make_graph(
        [helper.make_node("Gather", ["W", "ids"], ["e"], axis=0), helper.make_node("Gather", ["P", "pos"], ["p"]),
         helper.make_node("Add", ["e", "p"], ["y"])], "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"]),
         helper.make_tensor_value_info("pos", TensorProto.INT64, ["b", "s"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(table, "W"), numpy_helper.from_array(small, "P")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(path))


def test_embedding_table_becomes_int8_rows_and_lookups_stay_within_half_a_step(tmp_path):
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    # Rows of very different scales: one scale for the table would flatten the small rows to zero.
    table = (rng.standard_normal((3000, 32)) * rng.uniform(1e-3, 1.0, (3000, 1))).astype(np.float32)
    small = rng.standard_normal((64, 32)).astype(np.float32)
    path = tmp_path / "model.onnx"
    _lookup_model(path, table, small)
    before = path.stat().st_size
    info = embedding_int8.quantize_embeddings(path)
    assert [t["table"] for t in info["tables"]] == ["W"]  # the 64-row table is left as it is
    m = onnx.load(str(path))
    inits = {t.name: t for t in m.graph.initializer}
    assert inits["W_int8"].data_type == TensorProto.INT8 and "W" not in inits and "P" in inits
    assert path.stat().st_size < before * 0.3
    ids = rng.integers(0, 3000, (4, 7)).astype(np.int64)
    pos = np.tile(np.arange(7), (4, 1)).astype(np.int64)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["y"], {"ids": ids, "pos": pos})[0]
    want = table[ids] + small[pos]
    step = np.abs(table[ids]).max(axis=-1, keepdims=True) / 127.0
    assert np.all(np.abs(got - want) <= step / 2 + 1e-6)


def test_gather_in_operators_means_the_embedding_table():
    r = recipes.fixed_recipe("dynamic", "avx512_vnni", 1, True, False, ["MatMul", "Gather"])
    assert r.embeddings == "int8" and r.operators == ("MatMul",)
    assert recipes.fixed_recipe("dynamic", "avx512_vnni", 1, True, False, ["MatMul"]).embeddings == "fp32"
