"""Dynamic INT8 quantization of a large model's MatMul weights, one tensor at a time.

Why: ONNX Runtime's Python quantizer (``quantize_dynamic``) loads the whole FP32 model, runs shape inference on a
second copy and holds the float and the int8 weights side by side: 7.6 GB peak on the 2.2 GB XLM-R large graph, past
the Job's 6 GiB, and about a minute of its time. A large model gets one kind of recipe (the unfused graph, MatMul
weights only, dynamic uint8 activations; ``pipeline.candidates``), and for it the result is simple:

- each MatMul whose B is a constant 2-D FP32 initializer becomes ``com.microsoft.DynamicQuantizeMatMul(A, B_int8,
  B_scale, B_zero_point)``: the node ONNX Runtime itself makes of ``quantize_dynamic``'s DynamicQuantizeLinear /
  MatMulInteger / Cast / Mul when a session loads that output (its DynamicQuantizeMatMulFusion), so TEI serves the
  same kernels;
- the weights follow ``quantize_dynamic``'s rule: symmetric int8, one scale per output column (``per_channel``) or per
  tensor, scale = absmax / 127 (/ 64 with ``reduce_range``), rounded half to even, zero point 0;
- the weights are read from the data file and written to the new one a tensor at a time (page-aligned, as
  ``export.consolidate_external_data`` writes them; other tensors are copied in chunks), so memory holds one
  weight, not the model.

``tests/quantizer/test_matmul_int8.py`` holds the int8 weights and scales equal to ``quantize_dynamic``'s on the test
fixture and the scores within float rounding of its model's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

MS_DOMAIN = "com.microsoft"
#: Tensors are written at offsets aligned to this (ONNX Runtime maps page-aligned external data).
ALIGN = 4096
#: Tensors kept FP32 (the embedding table: 1 GB on XLM-R large) are copied in chunks of this size.
CHUNK = 64 * 1024 * 1024


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
    with _DataWriter(dst.with_name(dst.name + "_data")) as writer, _TensorReader(src) as reader:
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
    tmp = dst.with_name(dst.name + ".part")
    tmp.write_bytes(model.SerializeToString())
    os.replace(tmp, dst)
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


class _TensorReader:
    """Initializers of ``src``: inline ones decoded, external ones read from their file with positional reads (no
    memory map: its pages would count as the Job's memory)."""

    def __init__(self, src: Path) -> None:
        self.base = src.parent
        self._files: dict[str, BinaryIO] = {}

    def __enter__(self) -> _TensorReader:
        return self

    def __exit__(self, *exc: object) -> None:
        for f in self._files.values():
            f.close()

    def external(self, t: Any) -> tuple[str, int, int] | None:
        """(location, offset, length) of an external tensor, else None."""
        from onnx.external_data_helper import uses_external_data

        if not uses_external_data(t):
            return None
        info = {e.key: e.value for e in t.external_data}
        loc, off = info["location"], int(info.get("offset", 0))
        if "length" in info:
            return loc, off, int(info["length"])
        from onnx import helper

        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        return loc, off, int(np.prod(t.dims, dtype=np.int64)) * itemsize

    def read(self, loc: str, offset: int, length: int) -> bytes:
        if loc not in self._files:
            self._files[loc] = open(self.base / loc, "rb")  # noqa: SIM115 - closed by __exit__
        data = os.pread(self._files[loc].fileno(), length, offset)
        if len(data) != length:
            raise OSError(f"external data {loc} is shorter than recorded")
        return data

    def array(self, t: Any) -> np.ndarray:
        from onnx import numpy_helper

        ext = self.external(t)
        if ext is None:
            return np.asarray(numpy_helper.to_array(t), dtype=np.float32)
        return np.frombuffer(self.read(*ext), dtype=np.float32).reshape(tuple(t.dims))


class _DataWriter:
    """Appends tensors to one external data file, page-aligned; the file appears only when all of it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(path.name + ".part")
        self.offset = 0

    def __enter__(self) -> _DataWriter:
        self.out = open(self.tmp, "wb")  # closed by __exit__
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.out.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)

    def _start(self) -> None:
        pad = (-self.offset) % ALIGN
        if pad:
            self.out.write(b"\0" * pad)
            self.offset += pad

    def _point(self, t: Any, length: int) -> Any:
        """Make ``t`` refer to the ``length`` bytes just written at the current tensor's offset."""
        from onnx import TensorProto

        t.data_location = TensorProto.EXTERNAL
        t.ClearField("raw_data")
        del t.external_data[:]
        for k, v in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        self.offset += length
        return t

    def add(self, name: str, arr: np.ndarray) -> Any:
        from onnx import numpy_helper

        t = numpy_helper.from_array(arr, name)
        data = t.raw_data
        self._start()
        self.out.write(data)
        return self._point(t, len(data))

    def copy(self, t: Any, reader: _TensorReader) -> Any:
        """``t`` as it is: an inline tensor stays inline, an external one is copied here in chunks."""
        ext = reader.external(t)
        if ext is None:
            return t
        loc, offset, length = ext
        self._start()
        for at in range(0, length, CHUNK):
            self.out.write(reader.read(loc, offset + at, min(CHUNK, length - at)))
        return self._point(t, length)
