"""Pure pieces: metrics, length-bucket balancing, ISA detection, eval data parsing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantizer_job.steps.common import isa
from quantizer_job.steps.evaluation import evaldata, metrics

pytestmark = pytest.mark.quantizer


# --- Spearman ---------------------------------------------------------------------------------------------------------
def _spearman_no_ties(a, b):
    """Textbook formula 1 - 6 sum d^2 / (n (n^2 - 1)), valid without ties: an independent reference."""
    ra = np.argsort(np.argsort(a))
    rb = np.argsort(np.argsort(b))
    n = len(a)
    d = (ra - rb).astype(float)
    return 1 - 6 * (d * d).sum() / (n * (n * n - 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(-1e6, 1e6), st.floats(-1e6, 1e6)), min_size=3, max_size=40,
                unique_by=(lambda t: t[0], lambda t: t[1])))
def test_spearman_matches_textbook_formula_without_ties(pairs):
    a = [p[0] for p in pairs]
    b = [p[1] for p in pairs]
    assert metrics.spearman(a, b) == pytest.approx(_spearman_no_ties(a, b), abs=1e-9)


def test_spearman_edges():
    x = [0.1, 0.5, 0.3, 0.9]
    assert metrics.spearman(x, x) == pytest.approx(1.0)
    assert metrics.spearman(x, [-v for v in x]) == pytest.approx(-1.0)
    assert metrics.spearman(x, np.exp(np.array(x) * 7)) == pytest.approx(1.0)  # monotone transform
    assert np.isnan(metrics.spearman(x, [1, 1, 1, 1]))  # constant: nothing proven
    assert np.isnan(metrics.spearman(x, [1, 2, float("nan"), 4]))
    assert np.isnan(metrics.spearman([1.0], [1.0]))


def test_rankdata_ties_average():
    assert metrics.rankdata([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]


# --- top-k agreement --------------------------------------------------------------------------------------------------
def test_topk_agreement_per_query():
    groups = ["q1"] * 5 + ["q2"] * 5
    ref = [5, 4, 3, 2, 1, 1, 2, 3, 4, 5]
    same = list(ref)
    assert metrics.topk_agreement(groups, ref, same, 3) == 1.0
    # q1: top-3 {0,1,2} vs {0,1,3} -> 2/3; q2 unchanged -> 1
    cand = [5, 4, 1, 3, 2, *ref[5:]]
    assert metrics.topk_agreement(groups, ref, cand, 3) == pytest.approx((2 / 3 + 1) / 2)
    # reversed ranking of q1: top-2 disjoint
    rev = [1, 2, 3, 4, 5, *ref[5:]]
    assert metrics.topk_agreement(groups, ref, rev, 2) == pytest.approx((0 + 1) / 2)


def test_topk_skips_queries_without_enough_texts():
    assert np.isnan(metrics.topk_agreement(["a", "a", "b"], [1, 2, 3], [3, 2, 1], 3))


# --- length buckets ---------------------------------------------------------------------------------------------------
def test_bucket_of():
    edges = (32, 64, 128)
    assert [evaldata.bucket_of(n, edges) for n in (0, 31, 32, 63, 64, 127, 128, 5000)] == [0, 0, 1, 1, 2, 2, 3, 3]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 600), min_size=0, max_size=120), st.integers(0, 150))
def test_balance_by_length_is_balanced(lengths, n):
    chosen = evaldata.balance_by_length(lengths, n)
    assert len(chosen) == min(n, len(lengths))
    assert len(set(chosen)) == len(chosen)
    avail: dict[int, int] = {}
    for ln in lengths:
        b = evaldata.bucket_of(ln)
        avail[b] = avail.get(b, 0) + 1
    got: dict[int, int] = {}
    for i in chosen:
        b = evaldata.bucket_of(lengths[i])
        got[b] = got.get(b, 0) + 1
    # Every bucket either got everything it had, or at least as many as any other bucket minus one.
    most = max(got.values(), default=0)
    for b, have in avail.items():
        assert got.get(b, 0) == have or got.get(b, 0) >= most - 1


def test_balance_prefers_rare_long_pairs():
    lengths = [10] * 100 + [300] * 5
    chosen = evaldata.balance_by_length(lengths, 10)
    assert sum(1 for i in chosen if lengths[i] == 300) == 5


# --- ISA --------------------------------------------------------------------------------------------------------------
ZEN4 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\n"
        "flags\t\t: fpu sse2 avx avx2 avx512f avx512bw avx512_vnni avx512_bf16\n")
HASWELL = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
ADL = "flags\t\t: sse2 avx avx2 avx_vnni\n"
GRAVITON = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics asimddp\n"


def test_detect_target():
    assert isa.detect_target(ZEN4, "x86_64") == "avx512_vnni"
    assert isa.detect_target(HASWELL, "x86_64") == "avx2"
    assert isa.detect_target(ADL, "x86_64") == "avx512_vnni"
    assert isa.detect_target(GRAVITON, "aarch64") == "arm64"
    assert isa.detect_target("", "x86_64") == "avx2"
    assert isa.parse_cpu_flags(GRAVITON) >= {"asimd", "asimddp"}
    assert isa.REDUCE_RANGE_REQUIRED["avx2"] and not isa.REDUCE_RANGE_REQUIRED["avx512_vnni"]


def test_an_artifact_records_the_cpu_it_was_built_on():
    sapphire = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
                "flags\t\t: fpu avx2 avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n")
    assert isa.describe_cpu(sapphire, "x86_64") == {
        "model": "Intel(R) Xeon(R) Platinum 8480+", "machine": "x86_64", "target": "avx512_vnni",
        "flags": ["amx_bf16", "amx_int8", "amx_tile", "avx2", "avx512_vnni", "avx512f"]}
    assert isa.describe_cpu(HASWELL, "x86_64")["flags"] == ["avx2"]
    assert isa.describe_cpu(HASWELL, "x86_64")["target"] == "avx2"
    graviton = isa.describe_cpu("CPU part\t: 0xd40\n" + GRAVITON, "aarch64")
    assert (graviton["model"], graviton["target"], graviton["flags"]) == ("CPU part 0xd40", "arm64", ["asimddp"])
    here = isa.describe_local_cpu()
    assert here["target"] == isa.detect_local_target() and here["model"]


def test_cgroup_cpu_max():
    assert isa.parse_cgroup_cpu_max("200000 100000\n") == 2.0
    assert isa.parse_cgroup_cpu_max("150000 100000") == 1.5
    assert isa.parse_cgroup_cpu_max("max 100000") is None
    assert isa.parse_cgroup_cpu_max("garbage") is None
    assert isa.cpu_budget() >= 1


# --- eval data --------------------------------------------------------------------------------------------------------
def test_builtin_set_is_multilingual_with_short_and_long_texts():
    pairs = evaldata.builtin_pairs()
    scripts = {
        "latin": r"[A-Za-z]", "cjk": r"[\u4e00-\u9fff]", "kana": r"[\u3040-\u30ff]",
        "cyrillic": r"[\u0400-\u04ff]", "arabic": r"[\u0600-\u06ff]",
    }
    seen = {name for name, rx in scripts.items() if any(re.search(rx, p.query) for p in pairs)}
    assert seen == set(scripts)
    lengths = [len(p.text) for p in pairs]
    assert min(lengths) < 40 and max(lengths) > 600
    per_query: dict[str, int] = {}
    for p in pairs:
        per_query[p.query] = per_query.get(p.query, 0) + 1
    assert len(per_query) >= 10 and min(per_query.values()) > 3  # top-3 agreement is defined for every query


def test_parse_jsonl_and_errors(tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text("\n".join([json.dumps({"query": "q", "text": "t", "label": 1}),
                            "", json.dumps({"query": "q2", "texts": ["a", "b"]})]), encoding="utf-8")
    pairs = evaldata.load_jsonl(str(f))
    assert [(p.query, p.text, p.label) for p in pairs] == [("q", "t", 1.0), ("q2", "a", None), ("q2", "b", None)]
    for bad, msg in [("{", "not JSON"), ('{"query": ""}', "query"), ('{"query": "q"}', "text"),
                     ('{"query": "q", "text": "t", "label": "x"}', "label"), ("[1]", "object")]:
        with pytest.raises(evaldata.EvalDataError, match=msg):
            evaldata.parse_jsonl([bad])
    with pytest.raises(evaldata.EvalDataError, match="cannot read"):
        evaldata.load_jsonl(str(tmp_path / "missing.jsonl"))


def test_default_set_starts_with_the_builtin_pairs_and_pairs_every_query_with_other_texts():
    base = evaldata.builtin_pairs()
    full = evaldata.default_pairs()
    assert full[: len(base)] == base
    own = {(p.query, p.text) for p in base}
    cross = full[len(base):]
    assert cross and all((p.query, p.text) not in own and p.label == 0.0 for p in cross)
    assert len({(p.query, p.text) for p in full}) == len(full)  # no pair twice
    queries = {p.query for p in base}
    texts = {p.text for p in base}
    assert len(full) == len({(q, t) for q in queries for t in texts})
    assert evaldata.default_pairs() == full  # deterministic order (a prefix is what a capped Job scores)


# --- bootstrap interval -----------------------------------------------------------------------------------------------
def test_bootstrap_interval_contains_the_estimate_and_narrows_with_more_pairs():
    rng = np.random.default_rng(3)

    def width(n):
        ref = rng.standard_normal(n)
        cand = ref + 0.1 * rng.standard_normal(n)
        lo, hi = metrics.bootstrap_ci(metrics.spearman, ref, cand, n_boot=300)
        assert lo <= metrics.spearman(ref, cand) <= hi
        return hi - lo

    small, large = width(74), width(1200)
    assert large < small / 2.5  # ~1/sqrt(n): 74 -> 1200 pairs is 4x narrower
    assert large < 0.005 < small  # what the default set size is for


def test_bootstrap_interval_is_nan_when_the_statistic_never_is_defined():
    lo, hi = metrics.bootstrap_ci(metrics.spearman, [1.0] * 10, [2.0] * 10, n_boot=20)
    assert np.isnan(lo) and np.isnan(hi)


def test_saturation_hint_only_where_full_range_weights_saturate():
    hint = isa.saturation_hint("avx2", reduce_range=False)
    assert hint is not None and "reduceRange: true" in hint and "avx2" in hint
    assert isa.saturation_hint("avx2", reduce_range=True) is None
    assert isa.saturation_hint("avx512_vnni", reduce_range=False) is None
    assert isa.saturation_hint("arm64", reduce_range=False) is None


@pytest.mark.parametrize("name", ["sentence_bert_config.json", "sentence_xlm-roberta_config.json"])
def test_the_published_directory_keeps_the_max_input_length_tei_reads(tmp_path, name):
    """TEI takes a Sentence Transformers config's max_seq_length over max_position_embeddings: the CPU and GPU
    directories carry every such config the source has, so the length the Job reports for them (the CPU pool's token
    budget) is the one TEI finds there. An XLM-R source with sentence_xlm-roberta_config.json said 256 here; without
    the file TEI would read 8192 from max_position_embeddings (8194, less the position offset)."""
    from quantizer_job.steps.tei import layout, textenc

    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "tokenizer.json").write_text("{}")
    (src / name).write_text(json.dumps({"max_seq_length": 256, "do_lower_case": False}))
    assert name in layout.copy_tokenizer([src], dst)
    cfg = {"model_type": "xlm-roberta", "max_position_embeddings": 8194, "pad_token_id": 1}
    assert textenc.tei_max_input_length(dst, cfg) == textenc.tei_max_input_length(src, cfg) == 256
    (dst / name).unlink()
    assert textenc.tei_max_input_length(dst, cfg) == 8192
