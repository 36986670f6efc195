"""Every family of reranker tenants bring goes through the Job into a directory TEI serves, and what TEI will not
serve is refused by name.

Each family is a tiny random one-label model made with its own family's tokenizer and config keys, as its hub
repositories ship them (``devmodels.family_cross_encoder``): DeBERTa-v2 with no token types and relative positions
(mxbai-rerank-*-v1's shape), ModernBERT with 8192 positions and local/global attention, DistilBERT whose config
names its sizes ``dim``/``n_layers``. The published CPU directory is then read and fed the way TEI 1.9.3 reads and
feeds it, written out here from docs/tei-quantize_job.md rather than taken from the Job's own code, and its INT8
scores are compared with PyTorch FP32 of the same weights as a user's transformers code computes them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quantizer_job.steps.evaluation import evaldata
from quantizer_job.steps.evaluation.metrics import spearman
from quantizer_job.steps.tei import layout
from rerank_contracts import artifact_layout, quantize_job

from .conftest import FIXED_RECIPE, run_quantize

pytestmark = pytest.mark.quantizer

#: Every family with what its graph must declare (TEI feeds token_type_ids only to a graph that declares it).
FAMILIES = {
    "bert": {"input_ids", "attention_mask", "token_type_ids"},
    "xlm-roberta": {"input_ids", "attention_mask"},
    "roberta": {"input_ids", "attention_mask"},
    "camembert": {"input_ids", "attention_mask"},
    "electra": {"input_ids", "attention_mask", "token_type_ids"},
    "deberta-v2": {"input_ids", "attention_mask"},
    "modernbert": {"input_ids", "attention_mask"},
    "distilbert": {"input_ids", "attention_mask"},
}
#: TEI's position offset (router/src/lib.rs): pad_token_id + 1 for these types, 0 for the others.
TEI_OFFSET_TYPES = ("xlm-roberta", "camembert", "roberta")


def _tei_max_input_length(d: Path, cfg: dict) -> int:
    """TEI's router: a Sentence Transformers config's max_seq_length, else max_position_embeddings less the offset."""
    st = d / "sentence_bert_config.json"
    if st.is_file():
        return int(json.loads(st.read_text())["max_seq_length"])
    offset = cfg["pad_token_id"] + 1 if cfg["model_type"] in TEI_OFFSET_TYPES else 0
    return int(cfg["max_position_embeddings"]) - offset


def _tei_scores(d: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Logits of the published CPU directory as TEI's ORT backend computes them: config.json parsed with the keys TEI
    requires, tokenizer.json truncated to TEI's max input length, batches of 8 right-padded with pad_token_id,
    token_type_ids and position_ids (0..n-1) fed only if the graph declares them, ORT_ENABLE_ALL."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    cfg = json.loads((d / "config.json").read_text())
    for key in ("architectures", "model_type", "max_position_embeddings", "hidden_size", "num_hidden_layers"):
        assert key in cfg, f"TEI cannot parse config.json without {key}"
    assert len(cfg["id2label"]) == 1 and any(a.endswith("Classification") for a in cfg["architectures"])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(d / "model.onnx"), so, providers=["CPUExecutionProvider"])
    declared = {i.name for i in sess.get_inputs()}
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(_tei_max_input_length(d, cfg))
    out = []
    for i in range(0, len(pairs), 8):
        encs = tok.encode_batch(pairs[i : i + 8])
        n = max(len(e.ids) for e in encs)
        feed = {"input_ids": np.full((len(encs), n), cfg.get("pad_token_id") or 0, dtype=np.int64),
                "attention_mask": np.zeros((len(encs), n), dtype=np.int64),
                "token_type_ids": np.zeros((len(encs), n), dtype=np.int64),
                "position_ids": np.tile(np.arange(n, dtype=np.int64), (len(encs), 1))}
        for j, e in enumerate(encs):
            feed["input_ids"][j, : len(e.ids)] = e.ids
            feed["attention_mask"][j, : len(e.ids)] = 1
            feed["token_type_ids"][j, : len(e.ids)] = e.type_ids
        (logits,) = sess.run(["logits"], {k: v for k, v in feed.items() if k in declared})
        assert logits.dtype == np.float32 and logits.shape == (len(encs), 1)
        out.append(logits[:, 0])
    return np.concatenate(out)


def _torch_scores(source: Path, pairs: list[tuple[str, str]]) -> np.ndarray:
    """What a user's transformers code gives: the source's own tokenizer, padding and truncation, every input the
    tokenizer returns that the model's forward takes."""
    import inspect

    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    model = AutoModelForSequenceClassification.from_pretrained(str(source)).eval()
    enc = tok([q for q, _ in pairs], [t for _, t in pairs], padding=True, truncation=True, max_length=512,
              return_tensors="pt")
    takes = inspect.signature(model.forward).parameters
    with torch.no_grad():
        return model(**{k: v for k, v in enc.items() if k in takes}).logits[:, 0].numpy()


@pytest.fixture(scope="module")
def families_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("families")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_is_published_and_served_as_tei_serves_it(family: str, families_dir: Path, tmp_path: Path) -> None:
    import onnx

    from rerank_devcluster import devmodels

    source = devmodels.family_cross_encoder(family, families_dir / family, seed=3)
    volume = families_dir / f"{family}-volume"
    # Random weights: the gate is not what this test is about (tests/quantizer/test_gate_and_publish.py is).
    run = run_quantize(["--model", str(source), "--output", str(volume), "--artifact-id", f"{family}-1",
                        *FIXED_RECIPE, "--min-spearman", "0", "--min-topk-agreement", "0"], tmp_path)
    assert run.rc == 0, run.stderr[-4000:]
    assert run.result["reason"] == "Published", run.result
    art = volume / "artifacts" / f"{family}-1"
    cpu = art / artifact_layout.CPU_SUBDIR

    graph = onnx.load(str(cpu / "model.onnx"), load_external_data=False)
    assert {i.name for i in graph.graph.input} == FAMILIES[family]
    assert layout.check_tei_dir(cpu) == []

    cfg = json.loads((cpu / "config.json").read_text())
    raw = json.loads((source / "config.json").read_text())
    assert {k: cfg[k] for k in raw if k not in ("id2label", "label2id", "architectures", "pad_token_id")} == {
        k: v for k, v in raw.items() if k not in ("id2label", "label2id", "architectures", "pad_token_id")}, \
        "every original config.json key is kept"
    assert cfg["hidden_size"] == 64 and cfg["num_hidden_layers"] in (2, 3)

    # TEI's maximum input length fits the model's positions, and the manifest reports what TEI will use.
    man = json.loads((art / artifact_layout.MANIFEST_FILE).read_text())
    tei_max = _tei_max_input_length(cpu, cfg)
    assert man["max_input_tokens"] == tei_max == run.result["max_input_tokens"]
    positions = raw.get("max_position_embeddings", 512)
    assert tei_max <= positions

    # INT8 served as TEI serves it ranks like PyTorch FP32 of the same weights, on pairs of every length, including
    # one at TEI's limit for models that have a position table of 512.
    pairs = [(p.query, p.text) for p in evaldata.builtin_pairs()[:24]]
    long_text = " ".join(p.text for p in evaldata.builtin_pairs()[:40])
    pairs.append((pairs[0][0], long_text))
    served = _tei_scores(cpu, pairs)
    ref = _torch_scores(source, pairs[:-1])
    assert np.all(np.isfinite(served))
    assert spearman(ref, served[:-1]) > 0.8, (ref, served)
    assert np.max(np.abs(ref - served[:-1])) < 0.3 * (np.ptp(ref) + 1e-6)

    # The GPU pool's directory: the original weights with the same config, loadable by transformers.
    orig = art / artifact_layout.ORIGINAL_SUBDIR
    assert json.loads((orig / "config.json").read_text()) == cfg
    np.testing.assert_allclose(_torch_scores(orig, pairs[:4]), ref[:4], rtol=1e-4, atol=1e-4)


def test_distilbert_config_gets_the_sizes_tei_parses_under_tei_names(families_dir: Path, tmp_path: Path) -> None:
    """DistilBERT names its sizes dim/n_layers/n_heads; TEI's ORT backend refuses a config.json without hidden_size
    and num_hidden_layers. The Job adds them, resolved by transformers, beside the originals."""
    from rerank_devcluster import devmodels

    source = devmodels.family_cross_encoder("distilbert", families_dir / "distil-cfg", hidden=32, layers=2, heads=2,
                                            intermediate=64, seed=4)
    raw = json.loads((source / "config.json").read_text())
    assert "hidden_size" not in raw and raw["dim"] == 32 and raw["n_layers"] == 2
    volume = tmp_path / "volume"
    run = run_quantize(["--model", str(source), "--output", str(volume), "--artifact-id", "distil-cfg",
                        *FIXED_RECIPE, "--min-spearman", "0", "--min-topk-agreement", "0"], tmp_path)
    assert run.rc == 0, run.stderr[-3000:]
    cfg = json.loads((volume / "artifacts" / "distil-cfg" / artifact_layout.CPU_SUBDIR / "config.json").read_text())
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"]) == (32, 2, 2)
    assert (cfg["dim"], cfg["n_layers"], cfg["n_heads"]) == (32, 2, 2)


# -- what TEI cannot serve is refused by name ------------------------------------------------------------------------
def _config_only(d: Path, cfg: dict) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


REFUSALS = {
    "remote code": (
        {"architectures": ["JinaBertForSequenceClassification"], "model_type": "bert", "num_labels": 1,
         "auto_map": {"AutoModelForSequenceClassification": "jinaai/jina-bert-implementation--modeling_bert."
                                                             "JinaBertForSequenceClassification"}},
        "JinaBertForSequenceClassification needs the repository's own Python code"),
    "decoder reranker": (
        {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"},
        "Qwen3ForCausalLM is a decoder reranker (scored by a token's logit)"),
    "several labels": (
        {"architectures": ["BertForSequenceClassification"], "model_type": "bert",
         "id2label": {"0": "neg", "1": "neutral", "2": "pos"}},
        "the classifier has 3 labels"),
    "an encoder without a head": (
        {"architectures": ["BertModel"], "model_type": "bert"},
        "has no *ForSequenceClassification"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_tei_cannot_serve_is_refused_permanently_by_name(case: str, tmp_path: Path) -> None:
    cfg, fragment = REFUSALS[case]
    source = _config_only(tmp_path / "model", cfg)
    run = run_quantize(["--model", str(source), "--output", str(tmp_path / "volume"), "--artifact-id", "refused"],
                       tmp_path)
    assert run.rc == quantize_job.EXIT_CODES["UnsupportedModel"], run.stderr[-2000:]
    assert "UnsupportedModel" in quantize_job.PERMANENT_FAILURES
    res = quantize_job.parse_result(run.termination or "")
    assert res.reason == "UnsupportedModel" and fragment in res.message, res.message
    if case != "remote code":
        assert "TEI's /rerank serves a cross-encoder" in res.message
    assert not (tmp_path / "volume" / "artifacts" / "refused").exists()


def test_an_auto_map_naming_only_a_tokenizer_needs_no_remote_code(tmp_path: Path) -> None:
    cfg = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "num_labels": 1,
           "auto_map": {"AutoTokenizer": ["org/repo--tokenization.MyTokenizer", None]}}
    source = _config_only(tmp_path / "model", cfg)
    run = run_quantize(["--model", str(source), "--output", str(tmp_path / "volume"), "--artifact-id", "tok-only"],
                       tmp_path)
    res = quantize_job.parse_result(run.termination or "")
    assert not res.ok and "needs the repository's own Python code" not in res.message, res


def test_remote_code_runs_only_with_the_flag(tmp_path: Path) -> None:
    """With --trust-remote-code (the class allowed it, the model asked) the auto_map check passes and the Job goes
    on to load the model: here the repository's code is missing, which is the loader's error, not the refusal."""
    cfg, _ = REFUSALS["remote code"]
    source = _config_only(tmp_path / "model", cfg)
    run = run_quantize(["--model", str(source), "--output", str(tmp_path / "volume"), "--artifact-id", "trusted",
                        "--trust-remote-code"], tmp_path)
    res = quantize_job.parse_result(run.termination or "")
    assert "needs the repository's own Python code" not in res.message
    assert res.reason in ("UnsupportedModel", "ExportFailed"), res
