"""Which MatMuls stay FP32 in a mixed-precision recipe: the FFN down-projections whose input has the heaviest
activation outliers.

Why these: per-operator sensitivity on the trained fixtures (each MatMul group kept FP32 alone, dynamic per-channel
INT8 everywhere else) put the FFN down-projection first by far: it reads the GELU output, whose few very large
channels set the per-tensor dynamic activation scale, so every other channel is quantized with a coarse step. On
the MiniLM fixture, keeping all six FP32 lifted Spearman 0.9950 -> 0.9979 and top-3 0.904 -> 0.963; keeping any
other group FP32 helped less and cost more. Layers differ a lot (there, the first two carried most of the error),
so the recipe keeps only the worst share of them, ranked by how coarse the dynamic step is relative to the signal:
``(max - min) / rms`` of the tensor the MatMul reads, measured on a few batches (see :func:`coarseness`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: Fused GELU forms (ORT transformer fusions) and the ops of an unfused erf/tanh GELU.
GELU_OPS = frozenset({"Gelu", "BiasGelu", "FastGelu", "QuickGelu"})
_GELU_PARTS = frozenset({"Erf", "Tanh"})
#: How far up an unfused GELU (x * 0.5 * (1 + erf(x / sqrt 2))) the erf may sit from the MatMul's input.
_UNFUSED_DEPTH = 3


def _is_gelu_output(tensor: str, producers: dict[str, Any], depth: int = _UNFUSED_DEPTH) -> bool:
    node = producers.get(tensor)
    if node is None:
        return False
    if node.op_type in GELU_OPS or node.op_type in _GELU_PARTS:
        return True
    if depth <= 0 or node.op_type not in ("Mul", "Add", "Div"):
        return False
    return any(_is_gelu_output(t, producers, depth - 1) for t in node.input)


def ffn_down_inputs(model: Any) -> dict[str, str]:
    """``{MatMul node name: the tensor it reads}`` for every FFN down-projection (a MatMul fed by a GELU), in graph
    order. Works on fused graphs (BiasGelu/FastGelu) and on plain exports (the erf chain)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    return {n.name: n.input[0] for n in model.graph.node
            if n.op_type == "MatMul" and n.input and _is_gelu_output(n.input[0], producers)}


def coarseness(values: Sequence[np.ndarray]) -> float:
    """``(max - min) / rms`` over all batches: the dynamic quantization step (range / 255) relative to the typical
    value. Larger means more of the signal is lost to rounding."""
    lo = min(float(v.min()) for v in values)
    hi = max(float(v.max()) for v in values)
    sq = sum(float(np.square(v, dtype=np.float64).sum()) for v in values)
    n = sum(v.size for v in values)
    rms = math.sqrt(sq / max(n, 1))
    return (hi - lo) / rms if rms > 0 else 0.0


def measure(model_path: Path, feeds: Sequence[dict[str, np.ndarray]], threads: int) -> dict[str, float]:
    """Coarseness of every FFN down-projection's input on ``feeds``."""
    import onnx

    targets = ffn_down_inputs(onnx.load(str(model_path), load_external_data=False))
    if not targets or not feeds:
        return {}
    seen = exposed(model_path, feeds, list(dict.fromkeys(targets.values())), threads)
    return {node: coarseness(seen[t]) for node, t in targets.items()}


def exposed(model_path: Path, feeds: Sequence[dict[str, np.ndarray]], tensors: Sequence[str],
            threads: int) -> dict[str, list[np.ndarray]]:
    """The values the intermediate ``tensors`` take on each of ``feeds``. The graph is run with them exposed as
    extra outputs, from a temporary copy next to it (so an external data file still resolves; removed whatever
    happens): the model itself is not touched."""
    import onnx

    from quantizer_job.steps.evaluation import verify

    m = onnx.load(str(model_path), load_external_data=False)
    known = {o.name for o in m.graph.output}
    for tensor in tensors:
        if tensor not in known:
            m.graph.output.append(onnx.helper.make_empty_tensor_value_info(tensor))
    probe = model_path.with_name(model_path.stem + ".probe.onnx")
    seen: dict[str, list[np.ndarray]] = {t: [] for t in tensors}
    try:
        probe.write_bytes(m.SerializeToString())
        sess = verify.make_session(probe, threads)
        names = [i.name for i in sess.get_inputs()]
        for f in feeds:
            for t, v in zip(tensors, sess.run(list(tensors), {k: f[k] for k in names}), strict=True):
                seen[t].append(np.asarray(v, dtype=np.float32))
    finally:
        probe.unlink(missing_ok=True)
    return seen


def spread(batches: Sequence[dict[str, np.ndarray]], n: int) -> list[dict[str, np.ndarray]]:
    """``n`` batches evenly spaced over ``batches`` (sorted by length, they then cover short and long pairs)."""
    step = max(1, len(batches) // max(1, n))
    return list(batches[::step][:n])


def keep_fp32(scores: dict[str, float], share: float) -> list[str]:
    """The ``share`` (0..1, at least one when positive) of FFN down-projections with the coarsest input."""
    if share <= 0 or not scores:
        return []
    k = min(len(scores), max(1, math.ceil(share * len(scores) - 1e-9)))
    return sorted(scores, key=lambda n: (-scores[n], n))[:k]
