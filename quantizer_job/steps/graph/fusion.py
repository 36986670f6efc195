"""Graph optimization: ONNX Runtime's transformer fusions (Attention, SkipLayerNormalization, BiasGelu,
EmbedLayerNormalization) applied to the FP32 graph before it is quantized.

Separate from quantization because a fused graph is shared: several recipes quantize the same fused graph, so it is
made once per distinct fusion setting (:data:`GraphCache`, :func:`optimized_for`) and its fusion counts logged.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path

from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.graph.onnx_files import TWO_GB, finish_saved_model, model_bytes
from quantizer_job.steps.recipe_search.recipes import Recipe
from quantizer_job.steps.tei.layout import MODEL_FILE


@dataclass(frozen=True)
class Optimized:
    """A graph ready to quantize and the fusions that made it: ``fusions`` counts each fused operator ORT's
    transformer optimizer wrote into ``path`` (empty when no fusion pass ran), for the log."""

    path: Path
    fusions: dict[str, int] = field(default_factory=dict)


def optimize(src: Path, dst: Path, level: int, num_heads: int, hidden_size: int, embed_layer_norm: bool = True,
             fast_gelu: bool = False, multi_head_attention: bool = False) -> Optimized:
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
    opts.use_multi_head_attention = multi_head_attention
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
    finish_saved_model(dst)
    return Optimized(dst, {k: int(v) for k, v in stats.items() if v})


#: Fused graphs already written (with their fusion counts), by fusion setting (:func:`optimized_for`); one per Job,
#: shared between recipes.
GraphCache = dict[tuple[object, ...], Optimized]


def optimized_for(recipe: Recipe, fp32: Path, work: Path, num_heads: int, hidden_size: int,
                  cache: GraphCache) -> Optimized:
    """The graph ``recipe`` quantizes: the fused graph it asks for, made once per distinct fusion setting, with the
    fusion counts of that very graph (a cached graph keeps its own)."""
    lvl = recipe.optimization_level
    eln = recipe.embeddings != "int8"
    mha = recipe.multi_head_attention
    key: tuple[object, ...] = (lvl, eln, recipe.fast_gelu, mha) if lvl > 0 else (0,)
    if key not in cache:
        name = f"opt{lvl}{'' if eln else '-noeln'}{'-fastgelu' if recipe.fast_gelu else ''}{'-mha' if mha else ''}"
        cache[key] = optimize(fp32, work / name / MODEL_FILE, lvl, num_heads, hidden_size, embed_layer_norm=eln,
                              fast_gelu=recipe.fast_gelu, multi_head_attention=mha)
    return cache[key]

