"""The word-embedding table stored as int8 with one scale per row, rewritten in place in a graph.

ONNX Runtime's quantizers have no per-row form for a ``Gather`` table (its own Gather quantization uses one scale
for the whole table), so this graph rewrite is the Job's own, as :mod:`.matmul_int8` is for large models' MatMuls.
It runs after a recipe's quantization, on the quantized graph (:func:`.quantize.build_int8`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from quantizer_job.steps.graph import external_data
from quantizer_job.steps.graph.onnx_files import TWO_GB, finish_saved_model

#: Tables with at least this many rows count as word embeddings (position / token-type tables stay FP32: small).
MIN_EMBEDDING_ROWS = 1000


def quantize_embeddings(path: Path) -> dict[str, Any]:
    """Store every large ``Gather`` table (the word embeddings) as int8 with one symmetric scale per row, in place.

    ``Gather(W, ids)`` becomes ``Mul(Cast(Gather(W_int8, ids)), Gather(scale, ids))``: only the looked-up rows are
    dequantized (a few hundred per batch), so the serving cost is nil, and a per-row scale keeps each token's vector
    within 0.4 % of its largest component (ORT's own Gather quantization uses one scale for the whole table).
    Returns what it did, for the log.
    """
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(path))
    inits = {t.name: t for t in m.graph.initializer}
    done = []
    new_nodes = []
    for node in m.graph.node:
        t = inits.get(node.input[0]) if node.op_type == "Gather" and node.input else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if t is None or len(t.dims) != 2 or t.dims[0] < MIN_EMBEDDING_ROWS or axis != 0 or t.data_type != 1:
            new_nodes.append(node)
            continue
        w = numpy_helper.to_array(t).astype(np.float32, copy=False)
        q, scale, max_err = _int8_rows(w)
        base = t.name
        m.graph.initializer.remove(t)
        m.graph.initializer.extend([numpy_helper.from_array(q, base + "_int8"),
                                    numpy_helper.from_array(scale.astype(np.float32), base + "_row_scale")])
        ids, out = node.input[1], node.output[0]
        new_nodes += [
            helper.make_node("Gather", [base + "_int8", ids], [out + "_q"], name=node.name + "_q", axis=0),
            helper.make_node("Cast", [out + "_q"], [out + "_qf"], name=node.name + "_cast", to=1),
            helper.make_node("Gather", [base + "_row_scale", ids], [out + "_s"], name=node.name + "_scale", axis=0),
            helper.make_node("Mul", [out + "_qf", out + "_s"], [out], name=node.name + "_dq"),
        ]
        done.append({"table": base, "rows": int(t.dims[0]), "cols": int(t.dims[1]), "max_row_error": max_err})
        del w
    if done:
        del m.graph.node[:]
        m.graph.node.extend(new_nodes)
        big = sum(t.ByteSize() for t in m.graph.initializer) > TWO_GB * 0.9
        if big:
            onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=external_data.data_file_name(path), size_threshold=1024)
        else:
            stale = path.with_name(external_data.data_file_name(path))
            onnx.save_model(m, str(path))
            stale.unlink(missing_ok=True)
        finish_saved_model(path)
    return {"tables": done}


def _int8_rows(w: np.ndarray, rows_at_once: int = 16384) -> tuple[np.ndarray, np.ndarray, float]:
    """``w`` as int8 with one symmetric scale per row, and the largest error; in slices of rows, so a 1 GB table
    (XLM-R large) needs no float temporaries of its own size."""
    q = np.empty(w.shape, dtype=np.int8)
    scale = np.empty((w.shape[0], 1), dtype=np.float32)
    max_err = 0.0
    for i in range(0, w.shape[0], rows_at_once):
        part = w[i : i + rows_at_once]
        s = np.maximum(np.abs(part).max(axis=1, keepdims=True), 1e-12) / 127.0
        q[i : i + rows_at_once] = np.clip(np.rint(part / s), -127, 127)
        scale[i : i + rows_at_once] = s
        max_err = max(max_err, float(np.abs(q[i : i + rows_at_once] * s - part).max()))
    return q, scale, max_err
