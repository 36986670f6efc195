"""INT8 quantization (dynamic or static), and :func:`build_int8`: one recipe carried out from end to end.

Uses ONNX Runtime's own quantizer (what optimum's ``ORTQuantizer`` wraps), called directly so every knob is
reachable: per-channel weights, which op types, reduce-range, MatMulConstBOnly, and external data for big models.
The output is always named ``model.onnx`` (optimum's ``model_quantized.onnx`` is never found by TEI).

:func:`build_int8` chains the steps a recipe (:mod:`.recipes`) asks for: the transformer fusions (:mod:`.fusion`),
the FFN layers a mixed recipe keeps FP32 (:mod:`.outliers`), this module's quantization (or, for a large model,
:mod:`.matmul_int8`'s a weight at a time) and the word-embedding table (:mod:`.embedding_int8`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.logs import log
from quantizer_job.steps.graph.embedding_int8 import quantize_embeddings
from quantizer_job.steps.graph.fusion import GraphCache, optimized_for
from quantizer_job.steps.graph.matmul_int8 import quantize_matmuls
from quantizer_job.steps.graph.onnx_files import TWO_GB, finish_saved_model, model_bytes
from quantizer_job.steps.recipe_search.recipes import Recipe

#: Batches the outlier ranking of a mixed recipe runs (a few suffice: the ranking is stable across batches).
PROBE_BATCHES = 4


def quantize_dynamic(src: Path, dst: Path, recipe: Recipe, exclude: Sequence[str] = ()) -> Path:
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    dst.parent.mkdir(parents=True, exist_ok=True)
    big = model_bytes(src) > TWO_GB * 0.9
    import onnx

    extra = {"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT, **recipe.extra}
    try:
        ort_quantize_dynamic(str(src), str(dst), op_types_to_quantize=list(recipe.operators),
                             per_channel=recipe.per_channel, reduce_range=recipe.reduce_range,
                             weight_type=QuantType.QInt8, use_external_data_format=big, extra_options=extra,
                             nodes_to_exclude=list(exclude))
    except Exception as exc:
        raise JobError("QuantizationFailed", f"dynamic quantization failed: {type(exc).__name__}: {exc}") from exc
    gc.collect()
    finish_saved_model(dst)
    return dst


class _FeedReader:
    """CalibrationDataReader over prepared feeds (a plain iterator; ORT only calls get_next)."""

    def __init__(self, feeds: Sequence[dict[str, np.ndarray]], input_names: Iterable[str]):
        names = set(input_names)
        self._it = iter([{k: v for k, v in f.items() if k in names} for f in feeds])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)

    def rewind(self) -> None:  # pragma: no cover - ORT >= 1.17 may call it
        pass


def quantize_static(src: Path, dst: Path, recipe: Recipe, calib_feeds: Sequence[dict[str, np.ndarray]],
                    input_names: Iterable[str], exclude: Sequence[str] = ()) -> Path:
    """Static QDQ quantization: activation ranges from calibration pairs (balanced across length buckets)."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static

    if not calib_feeds:
        raise JobError("InvalidInput", "static quantization needs calibration pairs")
    dst.parent.mkdir(parents=True, exist_ok=True)
    big = model_bytes(src) > TWO_GB * 0.9
    reader = _FeedReader(calib_feeds, input_names)
    # No CalibMaxIntermediateOutputs: in ONNX Runtime 1.22 the MinMax calibrator *drops* each full chunk of that many
    # batches without folding it into the ranges, so only the last partial chunk counted (and a multiple of the
    # chunk size failed with "No data is collected"). The collected outputs are per-tensor ReduceMin/ReduceMax
    # scalars, so keeping all of them costs nothing.
    extra = {"MatMulConstBOnly": True, "ActivationSymmetric": recipe.activation == "s8", "WeightSymmetric": True,
             "DefaultTensorType": onnx.TensorProto.FLOAT, **recipe.extra}
    try:
        ort_quantize_static(str(src), str(dst), reader, quant_format=QuantFormat.QDQ,
                            op_types_to_quantize=list(recipe.operators), per_channel=recipe.per_channel,
                            reduce_range=recipe.reduce_range,
                            activation_type=QuantType.QInt8 if recipe.activation == "s8" else QuantType.QUInt8,
                            weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax,
                            use_external_data_format=big, extra_options=extra, nodes_to_exclude=list(exclude))
    except JobError:
        raise
    except Exception as exc:
        raise JobError("QuantizationFailed", f"static quantization failed: {type(exc).__name__}: {exc}") from exc
    gc.collect()
    finish_saved_model(dst)
    return dst


def build_int8(fp32: Path, dst: Path, recipe: Recipe, work: Path, num_heads: int, hidden_size: int,
               calib_feeds: Sequence[dict[str, np.ndarray]] = (), input_names: Iterable[str] = (),
               cache: GraphCache | None = None, probe_feeds: Sequence[dict[str, np.ndarray]] = (),
               stream_weights: bool = False) -> Path:
    """The whole recipe: transformer fusions (shared through ``cache`` between recipes that need the same graph),
    INT8 quantization (minus the FFN down-projections a mixed recipe keeps FP32, chosen on ``probe_feeds``, else on
    the calibration batches), then the embedding table. Used by the Job and by the benchmarks alike.

    ``stream_weights`` (large models): an unfused dynamic MatMul recipe is quantized a weight at a time
    (:mod:`.matmul_int8`, the same weights and kernels as ORT's ``quantize_dynamic`` at a fraction of its memory)."""
    src = optimized_for(recipe, fp32, work, num_heads, hidden_size, {} if cache is None else cache).path
    exclude = fp32_nodes(src, recipe, probe_feeds or calib_feeds)
    if recipe.mode == "static":
        quantize_static(src, dst, recipe, calib_feeds, input_names, exclude)
    elif stream_weights and streamable(recipe):
        try:
            done = quantize_matmuls(src, dst, per_channel=recipe.per_channel, reduce_range=recipe.reduce_range,
                                    exclude=exclude)
        except Exception as exc:
            raise JobError("QuantizationFailed", f"MatMul quantization failed: {type(exc).__name__}: {exc}") from exc
        log("quantize", "matmuls_streamed", matmuls=done.matmuls, kept_fp32=done.kept_fp32,
            int8_weight_bytes=done.weight_bytes)
        finish_saved_model(dst)
    else:
        quantize_dynamic(src, dst, recipe, exclude)
    if recipe.embeddings == "int8":
        quantize_embeddings(dst)
    return dst


def streamable(recipe: Recipe) -> bool:
    """A recipe :mod:`.matmul_int8` makes exactly: dynamic, unfused, MatMul weights only, no ORT extra options."""
    return (recipe.mode == "dynamic" and recipe.optimization_level == 0 and recipe.operators == ("MatMul",)
            and not recipe.extra)


def fp32_nodes(graph: Path, recipe: Recipe, feeds: Sequence[dict[str, np.ndarray]]) -> list[str]:
    """The MatMuls ``recipe`` keeps FP32 in ``graph``; a mixed recipe without batches to measure on is an error."""
    if recipe.fp32_ffn_down <= 0:
        return []
    if not feeds:
        raise JobError("QuantizationFailed", f"recipe {recipe.name} needs batches to rank FFN outliers on")
    from quantizer_job.steps.graph import outliers

    if recipe.fp32_ffn_down >= 1.0:  # every one of them: no ranking to measure (a session over the whole FP32 graph)
        import onnx

        return list(outliers.ffn_down_inputs(onnx.load(str(graph), load_external_data=False)))
    from quantizer_job.steps.common.isa import cpu_budget

    return outliers.keep_fp32(outliers.measure(graph, feeds[:PROBE_BATCHES], cpu_budget()), recipe.fp32_ffn_down)
