"""The benchmarks' user anchors (issue 43): what a user would run instead of the CPU pool, on the same pairs.

The length-sorted PyTorch run must score each pair as the arrival-order run does (its scores come back in the pairs'
own order), and BF16 is an anchor only where the CPU has native BF16."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import tei_serving

pytestmark = pytest.mark.quantizer

GROUPS = [
    ("what is int8 quantization", ["weights stored as 8-bit integers with a scale", "a recipe for bread",
                                   "integer matrix multiplication on CPUs with VNNI, AMX or plain AVX2 kernels"]),
    ("kubernetes operator", ["a controller that reconciles custom resources", "ok"]),
    ("cross-encoder reranking", ["scores a query and a document together in one forward pass of the transformer",
                                 "a bi-encoder embeds them apart", "rerank", "the top-k agreement"]),
]


def test_length_sorted_batches_cover_every_pair_once_shortest_first():
    lengths = [30, 5, 17, 5, 90, 1, 44]
    order, spans = tei_serving.sorted_spans(lengths, 3)
    assert sorted(order) == list(range(len(lengths)))
    assert [lengths[i] for i in order] == sorted(lengths)
    assert spans == [(0, 3), (3, 6), (6, 7)]


def test_bf16_is_an_anchor_only_with_native_bf16():
    assert tei_serving.bf16_hardware("flags\t: fpu sse avx2 fma\n") is None
    assert tei_serving.bf16_hardware("flags\t: fpu avx512f avx512_bf16 avx512_vnni\n") == "avx512_bf16"
    assert tei_serving.bf16_hardware("flags\t: fpu amx_tile amx_bf16 amx_int8\n") == "amx_bf16"


def test_length_sorted_scores_come_back_in_the_pairs_order(bert_model):
    arrival = tei_serving.torch_fp32(bert_model, GROUPS, threads=1)
    pairs = [(q, t) for q, ts in GROUPS for t in ts]
    lengths = [len(q) + len(t) for q, t in pairs]
    order, spans = tei_serving.sorted_spans(lengths, 4)
    assert order != list(range(len(pairs)))  # the sorted run really feeds another order
    sorted_run = tei_serving.torch_fp32(bert_model, GROUPS, threads=1, spans=spans, order=order)
    assert sorted_run["scores"].shape == arrival["scores"].shape == (len(pairs),)
    # Padding differs between the two batchings; each pair's score must not (beyond float noise).
    np.testing.assert_allclose(sorted_run["scores"], arrival["scores"], atol=1e-4)
    assert len(set(np.round(arrival["scores"], 6))) > 1  # distinct scores, so a mixed-up order would show
