"""External data of graphs over 2 GB (quantizer_job/steps/graph/external_data.py), on a small graph saved the ways
the export and ONNX Runtime's savers leave it: one file per tensor (torch.onnx.export) or one file under another name.
After ``consolidate``/``name_data_file`` the graph's data is one page-aligned ``<graph>_data``, the scores are the
same, the old files are gone, and a failure leaves the graph as it was and no file half-written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quantizer_job.steps.graph import external_data

pytestmark = pytest.mark.quantizer

HIDDEN = 40


def _graph(path: Path, *, one_file: str | None) -> np.ndarray:
    """x -> MatMul(W1) + b -> MatMul(W2); every tensor but the 4-byte scale external: one file per tensor
    (``one_file=None``) or all in ``one_file``. Returns the input the scores are compared on."""
    rng = np.random.default_rng(11)
    w1 = rng.standard_normal((HIDDEN, 3 * HIDDEN)).astype(np.float32)
    w2 = rng.standard_normal((3 * HIDDEN, HIDDEN)).astype(np.float32)
    b = rng.standard_normal(3 * HIDDEN).astype(np.float32)
    scale = np.asarray(0.5, dtype=np.float32)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
         helper.make_node("MatMul", ["hb", "W2"], ["d"]), helper.make_node("Mul", ["d", "scale"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", HIDDEN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", HIDDEN])],
        [numpy_helper.from_array(a, n) for n, a in (("W1", w1), ("b", b), ("W2", w2), ("scale", scale))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=one_file is not None,
                    location=one_file, size_threshold=64)
    return rng.standard_normal((3, HIDDEN)).astype(np.float32)


def _scores(path: Path, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["y"], {"x": x})[0])


def _external(path: Path) -> dict[str, dict[str, str]]:
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer
            if t.data_location == TensorProto.EXTERNAL}


def test_consolidate_gathers_one_file_per_tensor_into_one_aligned_file(tmp_path: Path) -> None:
    graph = tmp_path / "model.onnx"
    x = _graph(graph, one_file=None)
    before = _scores(graph, x)
    assert len({e["location"] for e in _external(graph).values()}) == 3   # W1, b, W2; the scale stays inline
    size = external_data.consolidate(graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx_data"]
    found = _external(graph)
    assert set(found) == {"W1", "b", "W2"}
    assert {e["location"] for e in found.values()} == {"model.onnx_data"}
    assert all(int(e["offset"]) % external_data.ALIGN == 0 for e in found.values())
    assert size == max(int(e["offset"]) + int(e["length"]) for e in found.values())
    assert size == (tmp_path / "model.onnx_data").stat().st_size
    np.testing.assert_array_equal(_scores(graph, x), before)


def test_a_graph_without_external_data_is_left_alone(tmp_path: Path) -> None:
    graph = tmp_path / "model.onnx"
    x = _graph(graph, one_file="w.bin")
    onnx.save_model(onnx.load(str(graph)), str(graph))  # all inline again
    (tmp_path / "w.bin").unlink()
    text = graph.read_bytes()
    assert external_data.consolidate(graph) == 0
    external_data.name_data_file(graph)
    assert graph.read_bytes() == text and [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
    assert _scores(graph, x).shape == (3, HIDDEN)


def test_name_data_file_renames_a_single_file_and_consolidates_several(tmp_path: Path) -> None:
    one = tmp_path / "one" / "model.onnx"
    x = _graph(one, one_file="weights.bin")
    before = _scores(one, x)
    external_data.name_data_file(one)
    assert sorted(p.name for p in one.parent.iterdir()) == ["model.onnx", "model.onnx_data"]
    np.testing.assert_array_equal(_scores(one, x), before)
    many = tmp_path / "many" / "model.onnx"
    _graph(many, one_file=None)
    external_data.name_data_file(many)
    assert sorted(p.name for p in many.parent.iterdir()) == ["model.onnx", "model.onnx_data"]
    np.testing.assert_array_equal(_scores(many, x), before)


def test_a_failed_consolidation_leaves_the_graph_as_it_was(tmp_path: Path) -> None:
    graph = tmp_path / "model.onnx"
    _graph(graph, one_file=None)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    w2 = tmp_path / _external(graph)["W2"]["location"]
    w2.write_bytes(w2.read_bytes()[:100])   # a tensor file shorter than the graph records
    files[w2.name] = w2.read_bytes()
    with pytest.raises(OSError, match="shorter than recorded"):
        external_data.consolidate(graph)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files   # no .part, nothing removed or rewritten


def test_many_source_files_are_read_with_few_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(external_data, "MAX_OPEN_FILES", 1)   # three tensor files, one open at a time
    graph = tmp_path / "model.onnx"
    x = _graph(graph, one_file=None)
    before = _scores(graph, x)
    external_data.consolidate(graph)
    np.testing.assert_array_equal(_scores(graph, x), before)


def test_a_full_disk_at_the_sync_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    graph = tmp_path / "model.onnx"
    _graph(graph, one_file=None)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(external_data.os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        external_data.consolidate(graph)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_renaming_falls_back_where_the_volume_has_no_hard_links(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    graph = tmp_path / "model.onnx"
    x = _graph(graph, one_file="weights.bin")
    before = _scores(graph, x)

    def no_links(src: object, dst: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(external_data.os, "link", no_links)
    external_data.name_data_file(graph)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx_data"]
    np.testing.assert_array_equal(_scores(graph, x), before)
