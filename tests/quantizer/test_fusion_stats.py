"""The optimize stage's log: the fusion counts of a recipe are those of the graph it quantizes, also when that graph
comes from the Job's cache; and the size above which fusions are skipped is read when the Job runs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from quantizer_job.stages import recipe_trials
from quantizer_job.steps.graph import export, fusion
from quantizer_job.steps.recipe_search.recipes import Recipe
from quantizer_job.steps.tei import layout, textenc
from rerank_contracts import quantize_job

pytestmark = pytest.mark.quantizer


def test_each_fused_graph_keeps_its_own_fusion_counts_through_the_cache(bert_model, tmp_path):
    cfg = layout.read_config(bert_model)
    info = export.run({"src_dir": str(bert_model), "onnx_dir": str(tmp_path / "fp32"),
                       "tokenizer_dir": str(tmp_path / "tok"), "max_length": textenc.max_input_length(cfg),
                       "pad_id": layout.pad_token_id(cfg), "threads": 1})
    fp32 = Path(info["onnx_path"])
    heads, hidden = int(cfg["num_attention_heads"]), int(cfg["hidden_size"])
    cache: fusion.GraphCache = {}

    def graph(recipe: Recipe) -> fusion.Optimized:
        return fusion.optimized_for(recipe, fp32, tmp_path / "work", heads, hidden, cache)

    erf = Recipe(name="erf-gelu", optimization_level=1, operators=("MatMul", "Attention"))
    tanh = replace(erf, name="fast-gelu", fast_gelu=True)
    first = graph(erf)
    second = graph(tanh)
    assert first.path != second.path and first.fusions and second.fusions
    assert first.fusions != second.fusions  # FastGelu replaces the exact GELU in the second graph only
    assert graph(replace(erf, name="same-graph")) == first  # from the cache, with its own counts, not the last's
    assert graph(Recipe(name="plain", optimization_level=0)) == fusion.Optimized(fp32, {})
    # MultiHeadAttention instead of Attention: its own graph, the Q/K/V MatMuls left to quantize on their own.
    mha = graph(replace(tanh, name="mha", operators=("MatMul",), multi_head_attention=True))
    assert mha.path not in (first.path, second.path)
    assert mha.fusions.get("MultiHeadAttention") and not mha.fusions.get("Attention"), mha.fusions
    assert second.fusions.get("Attention") and not second.fusions.get("MultiHeadAttention"), second.fusions
    assert len(cache) == 4


def test_the_fusion_size_limit_is_read_when_the_job_runs(monkeypatch):
    req = quantize_job.JobRequest(model="/m", output_root="/v", artifact_id="a", target="avx2")

    def fused(fp32_bytes: int) -> bool:
        return any(r.optimization_level > 0 for r in recipe_trials.candidates(req, fp32_bytes, has_calibration=False))

    monkeypatch.delenv("RERANK_QUANTIZE_FUSION_MAX_BYTES", raising=False)
    assert fused(1 << 30) and not fused((1 << 30) + 1)  # the default: 1 GiB
    monkeypatch.setenv("RERANK_QUANTIZE_FUSION_MAX_BYTES", "1000")  # after the import: still obeyed
    assert fused(1000) and not fused(1001)
