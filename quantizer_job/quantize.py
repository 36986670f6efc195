"""Graph optimization (ONNX Runtime transformer fusions) and INT8 quantization (dynamic or static).

Uses ONNX Runtime's own quantizer (what optimum's ``ORTQuantizer`` wraps), called directly so every knob is
reachable: per-channel weights, which op types, reduce-range, MatMulConstBOnly, and external data for big models.
The output is always named ``model.onnx`` (optimum's ``model_quantized.onnx`` is never found by TEI).
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import external_data
from .errors import JobError
from .isa import REDUCE_RANGE_REQUIRED
from .logs import log
from .matmul_int8 import quantize_matmuls

TWO_GB = 2 * 1024**3
#: Batches the outlier ranking of a mixed recipe runs (a few suffice: the ranking is stable across batches).
PROBE_BATCHES = 4
#: ONNX Runtime 1.22 loads IR versions up to 10 reliably; onnx >= 1.17 writes newer ones by default.
MAX_IR_VERSION = 10


@dataclass(frozen=True)
class Recipe:
    """One way to produce the INT8 model. ``name`` is informational."""

    name: str = "custom"
    mode: str = "dynamic"  # "dynamic" | "static"
    optimization_level: int = 1  # 0: no transformer fusions; 1/2/99: ORT level before the Python fusions
    per_channel: bool = True
    reduce_range: bool = False
    operators: tuple[str, ...] = ("MatMul",)
    target: str = "avx512_vnni"
    #: "fp32" keeps the embedding tables as exported; "int8" stores the word-embedding table as int8 with one scale
    #: per row (see :func:`quantize_embeddings`): the table is half of a MiniLM's bytes and most of an XLM-R's.
    embeddings: str = "fp32"
    #: Replace the exact (erf) GELU with ORT's FastGelu (tanh form) during the fusions: the FP32 GELU is ~16 % of
    #: an INT8 MiniLM's time at TEI's batch shapes (benchmarks/ort_profile.py); the approximation differs by < 1e-3.
    fast_gelu: bool = False
    #: Static mode only: activation type, "u8" (U8S8, asymmetric) or "s8" (S8S8, symmetric).
    activation: str = "u8"
    #: Share (0..1) of the FFN down-projections kept FP32: those whose input has the heaviest outliers, measured on
    #: a few batches (:mod:`.outliers`). They carry most of the INT8 ranking error; 1/3 of them costs ~7 % speed.
    fp32_ffn_down: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["operators"] = list(self.operators)
        return d


def candidate_recipes(target: str, mode: str, explicit: Recipe | None = None,
                      has_calibration: bool = False) -> list[Recipe]:
    """The recipes ``--recipe auto`` tries, most promising (fastest expected) first.

    Measured with trained fixtures on AVX-512 VNNI (benchmarks/tei_rerank.py, benchmarks/ort_profile.py): fusing
    attention/GELU/LayerNorm before quantization lets the INT8 graph use QAttention + DynamicQuantizeMatMul and
    keeps the FP32 glue small; per-channel weights keep Spearman >= 0.995 where per-tensor falls to ~0.98; the
    word-embedding table in INT8 (per-row scales) costs no measurable quality and brings the file to ~0.26x FP32.
    Static (calibrated) activation scales are tried too when calibration pairs exist.
    """
    rr = REDUCE_RANGE_REQUIRED.get(target, False)
    base: dict[str, Any] = {"target": target, "reduce_range": rr, "embeddings": "int8"}
    # Static QDQ needs shape inference through every node, which the com.microsoft fused ops defeat: quantize
    # the plain graph; the serving session (ORT_ENABLE_ALL) fuses the QDQ pairs into integer kernels.
    static = [Recipe(name="static-matmul-perchannel-emb8", mode="static", optimization_level=0, per_channel=True,
                     operators=("MatMul",), **base)]
    if mode == "static":
        out = [*static, Recipe(name="static-matmul-pertensor-emb8", mode="static", optimization_level=0,
                               per_channel=False, operators=("MatMul",), **base)]
        return out + ([explicit] if explicit is not None and explicit not in out else [])
    out = [
        # FastGelu: the FP32 GELU is 11-16 % of the fused INT8 graph's time; the tanh form cuts it by 40 % and
        # changed no ranking measurably on the trained fixtures (Spearman 0.9881 vs 0.9880).
        Recipe(name="fused-attn-matmul-perchannel-emb8-fastgelu", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), fast_gelu=True, **base),
        # Mixed precision: the third of the FFN down-projections with the heaviest input outliers stays FP32
        # (quantizer_job/outliers.py). On the fine-tuned MiniLM fixture it took Spearman 0.995 -> 0.997 and top-3
        # 0.90 -> 0.95 for ~7 % of the speed; tried second so a strict gate still finds it within the budget.
        Recipe(name="fused-attn-matmul-perchannel-emb8-fastgelu-ffn33", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), fast_gelu=True, fp32_ffn_down=1 / 3, **base),
        Recipe(name="fused-attn-matmul-perchannel-emb8", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), **base),
        Recipe(name="fused-matmul-perchannel-emb8", optimization_level=1, per_channel=True, operators=("MatMul",),
               **base),
        Recipe(name="plain-matmul-perchannel-emb8", optimization_level=0, per_channel=True, operators=("MatMul",),
               **base),
        # The embedding table kept FP32 (0.65x the bytes): where the INT8 table costs the gate its margin.
        Recipe(name="fused-attn-matmul-perchannel", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), **{**base, "embeddings": "fp32"}),
        # Every FFN down-projection FP32: the last resort of a strict gate (~1.7x FP32 instead of ~2x).
        Recipe(name="fused-attn-matmul-perchannel-emb8-ffn100", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), fp32_ffn_down=1.0, **base),
    ]
    if has_calibration:
        out += static
    if explicit is not None and explicit not in out:
        out.append(explicit)
    return out


def _set_ir_version(path: Path) -> None:
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    if m.ir_version > MAX_IR_VERSION:
        m.ir_version = MAX_IR_VERSION
        with open(path, "wb") as f:
            f.write(m.SerializeToString())


def model_bytes(path: Path) -> int:
    """Size of an ONNX graph with its external data file (``model.onnx_data``)."""
    total = path.stat().st_size
    data = path.with_name(external_data.data_file_name(path))
    if data.exists():
        total += data.stat().st_size
    return total


@dataclass(frozen=True)
class Optimized:
    """A graph ready to quantize and the fusions that made it: ``fusions`` counts each fused operator ORT's
    transformer optimizer wrote into ``path`` (empty when no fusion pass ran), for the log."""

    path: Path
    fusions: dict[str, int] = field(default_factory=dict)


def optimize(src: Path, dst: Path, level: int, num_heads: int, hidden_size: int, embed_layer_norm: bool = True,
             fast_gelu: bool = False) -> Optimized:
    """ORT transformer fusions (Attention, SkipLayerNormalization, BiasGelu, EmbedLayerNormalization).

    ``embed_layer_norm=False`` leaves the embedding lookups as plain Gathers, so the word table can be stored in INT8
    (the fused EmbedLayerNormalization takes the FP32 table as an input). Level 0 returns ``src`` itself, unfused."""
    if level <= 0:
        return Optimized(src)
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    dst.parent.mkdir(parents=True, exist_ok=True)
    opts = FusionOptions("bert")
    # Keep graph inputs int64 as TEI feeds them; the fused EmbedLayerNormalization casts internally.
    opts.enable_embed_layer_norm = embed_layer_norm
    opts.enable_gelu_approximation = fast_gelu
    try:
        # Python fusions on the exported graph (opt_level 0 means "no ORT pass first"): ORT's own offline pass
        # would bake CPU-specific layouts into the file, which the serving session re-derives anyway.
        m = optimize_model(str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                           optimization_options=opts, opt_level=0 if level in (1,) else level, use_gpu=False)
        big = model_bytes(src) > TWO_GB * 0.9
        m.save_model_to_file(str(dst), use_external_data_format=big, all_tensors_to_one_file=True)
        stats = m.get_fused_operator_statistics()
        del m
        gc.collect()
    except Exception as exc:
        raise JobError("QuantizationFailed", f"transformer optimization failed: {type(exc).__name__}: {exc}") from exc
    _finish_saved_model(dst)
    return Optimized(dst, {k: int(v) for k, v in stats.items() if v})


def _finish_saved_model(path: Path) -> None:
    """What every model this module writes needs before TEI can load it: the external data file (if any)
    named ``<graph>_data`` next to the graph, and an IR version TEI's ONNX Runtime reads."""
    external_data.name_data_file(path)
    _set_ir_version(path)


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
    _finish_saved_model(dst)
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
    _finish_saved_model(dst)
    return dst


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
        _finish_saved_model(path)
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


#: Fused graphs already written (with their fusion counts), by fusion setting (:func:`optimized_for`); one per Job,
#: shared between recipes.
GraphCache = dict[tuple[object, ...], Optimized]


def optimized_for(recipe: Recipe, fp32: Path, work: Path, num_heads: int, hidden_size: int,
                  cache: GraphCache) -> Optimized:
    """The graph ``recipe`` quantizes: the fused graph it asks for, made once per distinct fusion setting, with the
    fusion counts of that very graph (a cached graph keeps its own)."""
    lvl = recipe.optimization_level
    eln = recipe.embeddings != "int8"
    key: tuple[object, ...] = (lvl, eln, recipe.fast_gelu) if lvl > 0 else (0,)
    if key not in cache:
        name = f"opt{lvl}{'' if eln else '-noeln'}{'-fastgelu' if recipe.fast_gelu else ''}"
        cache[key] = optimize(fp32, work / name / "model.onnx", lvl, num_heads, hidden_size, embed_layer_norm=eln,
                              fast_gelu=recipe.fast_gelu)
    return cache[key]


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
        _finish_saved_model(dst)
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
    from . import outliers

    if recipe.fp32_ffn_down >= 1.0:  # every one of them: no ranking to measure (a session over the whole FP32 graph)
        import onnx

        return list(outliers.ffn_down_inputs(onnx.load(str(graph), load_external_data=False)))
    from .isa import cpu_budget

    return outliers.keep_fp32(outliers.measure(graph, feeds[:PROBE_BATCHES], cpu_budget()), recipe.fp32_ffn_down)


def benchmark_recipes(target: str) -> list[Recipe]:
    """Every recipe the benchmarks compare (the auto search tries a subset: :func:`candidate_recipes`)."""
    rr = REDUCE_RANGE_REQUIRED.get(target, False)
    b: dict[str, Any] = {"target": target, "reduce_range": rr}
    return [
        # The seeds' recipe: optimum AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False).
        Recipe("seed-plain-pertensor", optimization_level=0, per_channel=False, operators=("MatMul",), **b),
        Recipe("plain-perchannel", optimization_level=0, per_channel=True, operators=("MatMul",), **b),
        Recipe("fused-matmul-perchannel", optimization_level=1, per_channel=True, operators=("MatMul",), **b),
        Recipe("fused-attn-matmul-perchannel", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), **b),
        Recipe("fused-attn-matmul-perchannel-emb8", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), embeddings="int8", **b),
        Recipe("fused-attn-matmul-perchannel-emb8-fastgelu", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), embeddings="int8", fast_gelu=True, **b),
        Recipe("fused-matmul-perchannel-emb8", optimization_level=1, per_channel=True, operators=("MatMul",),
               embeddings="int8", **b),
        Recipe("fused-attn-matmul-perchannel-emb8-fastgelu-ffn33", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), embeddings="int8", fast_gelu=True, fp32_ffn_down=1 / 3, **b),
        Recipe("fused-attn-matmul-perchannel-emb8-fastgelu-ffn100", optimization_level=1, per_channel=True,
               operators=("MatMul", "Attention"), embeddings="int8", fast_gelu=True, fp32_ffn_down=1.0, **b),
        Recipe("plain-matmul-rr-perchannel", optimization_level=0, per_channel=True, operators=("MatMul",),
               target=target, reduce_range=True),
        Recipe("static-plain-perchannel", mode="static", optimization_level=0, per_channel=True,
               operators=("MatMul",), **b),
        Recipe("static-plain-perchannel-s8s8", mode="static", optimization_level=0, per_channel=True,
               operators=("MatMul",), activation="s8", **b),
        Recipe("static-plain-perchannel-emb8", mode="static", optimization_level=0, per_channel=True,
               operators=("MatMul",), embeddings="int8", **b),
    ]


def fixed_recipe(mode: str, target: str, optimization_level: int, per_channel: bool, reduce_range: bool,
                 operators: Sequence[str]) -> Recipe:
    """``--recipe fixed``. "Gather" among the operators means the word-embedding table (:func:`quantize_embeddings`:
    per-row int8, which ORT's own per-tensor Gather quantization does not offer)."""
    if mode == "static":
        optimization_level = 0  # see candidate_recipes: static QDQ quantizes the plain graph
    emb = "int8" if "Gather" in operators else "fp32"
    ops = tuple(o for o in operators if o != "Gather") or ("MatMul",)
    return Recipe(name="fixed", mode=mode, target=target, optimization_level=optimization_level,
                  per_channel=per_channel, reduce_range=reduce_range, operators=ops, embeddings=emb)


__all__ = [
    "Optimized",
    "Recipe",
    "benchmark_recipes",
    "build_int8",
    "candidate_recipes",
    "fixed_recipe",
    "optimize",
    "quantize_dynamic",
    "quantize_embeddings",
    "quantize_static",
    "replace",
]
