"""Dynamic INT8 quantization of a large model's MatMul weights, one tensor at a time.

Why: ONNX Runtime's Python quantizer (``quantize_dynamic``) loads the whole FP32 model, runs shape inference on a
second copy and holds the float and the int8 weights side by side: 7.6 GB peak on the 2.2 GB XLM-R large graph, past
the Job's 6 GiB, and about a minute of its time. A large model gets one kind of recipe (the unfused graph, MatMul
weights only, dynamic uint8 activations; ``recipe_trials.candidates``), and for it the result is simple:

- each MatMul whose B is a constant 2-D FP32 initializer becomes ``com.microsoft.DynamicQuantizeMatMul(A, B_int8,
  B_scale, B_zero_point)``: the node ONNX Runtime itself makes of ``quantize_dynamic``'s DynamicQuantizeLinear /
  MatMulInteger / Cast / Mul when a session loads that output (its DynamicQuantizeMatMulFusion), so TEI serves the
  same kernels;
- the weights follow ``quantize_dynamic``'s rule: symmetric int8, one scale per output column (``per_channel``) or per
  tensor, scale = absmax / 127 (/ 64 with ``reduce_range``), rounded half to even, zero point 0;
- the weights are read from the data file and written to the new one a tensor at a time (``external_data``:
  page-aligned; other tensors are copied in chunks), so memory holds one weight, not the model.

``tests/quantizer/test_matmul_int8.py`` holds the int8 weights and scales equal to ``quantize_dynamic``'s on the test
fixture and the scores within float rounding of its model's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantizer_job.steps.graph import external_data

MS_DOMAIN = "com.microsoft"


@dataclass(frozen=True)
class Quantized:
    """What :func:`quantize_matmuls` did, for the log."""

    matmuls: int
    kept_fp32: int
    weight_bytes: int


def int8_weights(w: np.ndarray, per_channel: bool, reduce_range: bool) -> tuple[np.ndarray, np.ndarray]:
    """``w`` [K, N] as int8 and its scale ([N] per output column, or a scalar): ``quantize_dynamic``'s rule."""
    qmax = np.float32(64.0 if reduce_range else 127.0)
    absmax = np.abs(w).max(axis=0) if per_channel else np.abs(w).max()
    scale = np.asarray(absmax / qmax, dtype=np.float32)
    scale = np.where(scale == 0, np.float32(1.0), scale).astype(np.float32)  # an all-zero column stays zero
    q = np.clip(np.rint(w / scale), -qmax, qmax).astype(np.int8)
    return q, scale


def quantize_matmuls(src: Path, dst: Path, *, per_channel: bool, reduce_range: bool,
                     exclude: Iterable[str] = ()) -> Quantized:
    """Write ``dst`` and ``<dst>_data``: ``src`` with its constant-weight MatMuls, except the nodes named in
    ``exclude``, as DynamicQuantizeMatMul; every other tensor copied as it is. (``quantize.build_int8`` then sets
    the IR version TEI reads, as for every graph it writes.)"""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(src), load_external_data=False)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    users: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            users[name] = users.get(name, 0) + 1
    # A weight that is also a graph input or output, or is read inside a subgraph, must keep its name and values.
    keep = {v.name for v in (*graph.input, *graph.output)} | _subgraph_inputs(graph)

    def weight_name(node: Any) -> str | None:
        t = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        ok = (t is not None and len(t.dims) == 2 and t.data_type == TensorProto.FLOAT and users[t.name] == 1
              and t.name not in keep)
        return t.name if ok and t is not None else None

    skip = set(exclude)
    nodes = list(graph.node)
    chosen = {i: w for i, n in enumerate(nodes) if (w := weight_name(n)) is not None and n.name not in skip}
    kept = sum(1 for n in nodes if weight_name(n) is not None and n.name in skip)
    dst.parent.mkdir(parents=True, exist_ok=True)
    new_inits: list[Any] = []
    weight_bytes = 0
    with (external_data.DataWriter(dst.with_name(external_data.data_file_name(dst))) as writer,
          external_data.TensorReader(src) as reader):
        for i, w in chosen.items():
            q, scale = int8_weights(reader.array(inits[w]), per_channel, reduce_range)
            tensors = [(w + "_quantized", q), (w + "_scale", scale),
                       (w + "_zero_point", np.zeros(scale.shape, dtype=np.int8))]
            new_inits += [writer.add(name, arr) for name, arr in tensors]
            weight_bytes += q.nbytes
            node = nodes[i]
            nodes[i] = helper.make_node("DynamicQuantizeMatMul", [node.input[0], *(n for n, _ in tensors)],
                                        list(node.output), name=(node.name or w) + "_quant", domain=MS_DOMAIN)
        dropped = set(chosen.values())
        new_inits += [writer.copy(t, reader) for t in graph.initializer if t.name not in dropped]
    del graph.node[:]
    graph.node.extend(nodes)
    del graph.initializer[:]
    graph.initializer.extend(new_inits)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    external_data.save_graph(model, dst)
    return Quantized(matmuls=len(chosen), kept_fp32=kept, weight_bytes=weight_bytes)


def _subgraph_inputs(graph: Any) -> set[str]:
    """Every name read by a node inside a subgraph (If/Loop/Scan bodies) of ``graph``, at any depth."""
    from onnx import AttributeProto

    found: set[str] = set()
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                found.update(n for inner in sub.node for n in inner.input)
                found |= _subgraph_inputs(sub)
    return found
