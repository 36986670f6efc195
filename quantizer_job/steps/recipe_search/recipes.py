"""Recipes: the ways the Job can produce an INT8 model, and the lists it and the benchmarks try.

A :class:`Recipe` is plain data (fusion level, which operators, per-channel, the embedding table's precision, the FFN
layers kept FP32, ...), kept apart from the code that carries one out (:func:`.quantize.build_int8`) so that the
recipe search (:mod:`.search`), the ``--recipe`` flags and the benchmarks can name and compare recipes without the
ML stack: this module imports none of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from quantizer_job.steps.common.isa import REDUCE_RANGE_REQUIRED


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
    #: per row (see :func:`.embedding_int8.quantize_embeddings`): the table is half of a MiniLM's bytes and most of
    #: an XLM-R's.
    embeddings: str = "fp32"
    #: Replace the exact (erf) GELU with ORT's FastGelu (tanh form) during the fusions: the FP32 GELU is ~16 % of
    #: an INT8 MiniLM's time at TEI's batch shapes (benchmarks/ort_profile.py); the approximation differs by < 1e-3.
    fast_gelu: bool = False
    #: Static mode only: activation type, "u8" (U8S8, asymmetric) or "s8" (S8S8, symmetric).
    activation: str = "u8"
    #: Share (0..1) of the FFN down-projections kept FP32: those whose input has the heaviest outliers, measured on
    #: a few batches (:mod:`.outliers`). They carry most of the INT8 ranking error; 1/3 of them costs ~7 % speed.
    fp32_ffn_down: float = 0.0
    #: Fuse attention into ``MultiHeadAttention`` (Q, K and V stay separate MatMuls, quantized as
    #: DynamicQuantizeMatMul; the attention core runs in MHA's CPU kernel) instead of ``Attention`` (which quantizes
    #: to QAttention, whose FP32 attention core is most of an INT8 graph's time). Needs optimization_level > 0.
    multi_head_attention: bool = False
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
        # (quantizer_job/steps/graph/outliers.py). On the fine-tuned MiniLM fixture it took Spearman 0.995 -> 0.997
        # and top-3 0.90 -> 0.95 for ~7 % of the speed; tried second so a strict gate still finds it within the budget.
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
        Recipe("fused-mha-matmul-perchannel-emb8-fastgelu", optimization_level=1, per_channel=True,
               operators=("MatMul",), embeddings="int8", fast_gelu=True, multi_head_attention=True, **b),
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
    """``--recipe fixed``. "Gather" among the operators means the word-embedding table
    (:func:`.embedding_int8.quantize_embeddings`: per-row int8, which ORT's own per-tensor Gather quantization does
    not offer)."""
    if mode == "static":
        optimization_level = 0  # see candidate_recipes: static QDQ quantizes the plain graph
    emb = "int8" if "Gather" in operators else "fp32"
    ops = tuple(o for o in operators if o != "Gather") or ("MatMul",)
    return Recipe(name="fixed", mode=mode, target=target, optimization_level=optimization_level,
                  per_channel=per_channel, reduce_range=reduce_range, operators=ops, embeddings=emb)
