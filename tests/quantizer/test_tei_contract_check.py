"""``layout.check_tei_dir`` reads a directory as TEI 1.9.3 reads it (docs/tei-contract.md): each problem TEI would
stop on is found and named, and a directory TEI serves has none. Small hand-made directories, one fault each."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from quantizer_job.steps.tei import layout

pytestmark = pytest.mark.quantizer

GOOD_CONFIG = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_size": 8,
               "num_hidden_layers": 1, "max_position_embeddings": 512, "id2label": {"0": "LABEL_0"},
               "label2id": {"LABEL_0": 0}, "pad_token_id": 0}


def _graph(path: Path, inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> None:
    """A graph with TEI's signature: int64 [batch, seq] inputs, float32 ``logits`` [batch, 1]."""
    import onnx
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs]
    out = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    nodes = [helper.make_node("Cast", [inputs[0]], ["f"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["f"], ["logits"], keepdims=1, axes=[1])]
    model = helper.make_model(helper.make_graph(nodes, "g", ins, [out]), opset_imports=[helper.make_opsetid("", 11)])
    onnx.save(model, str(path))


@pytest.fixture
def good_dir(tmp_path: Path) -> Path:
    from rerank_devcluster import devmodels

    d = tmp_path / "cpu"
    d.mkdir()
    _graph(d / layout.MODEL_FILE)
    (d / "config.json").write_text(json.dumps(GOOD_CONFIG))
    shutil.copyfile(devmodels.minilm_dir() / "tokenizer.json", d / "tokenizer.json")
    return d


def test_a_directory_tei_serves_has_no_problem(good_dir: Path) -> None:
    assert layout.check_tei_dir(good_dir, expect_inputs=("input_ids", "attention_mask"), max_positions=512) == []


def _config(d: Path, **changes: object) -> None:
    cfg = {**GOOD_CONFIG, **changes}
    (d / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))


@pytest.mark.parametrize(("changes", "problem"), [
    ({"hidden_size": None, "dim": 8}, "config.json lacks hidden_size"),
    ({"num_hidden_layers": None, "n_layers": 1}, "config.json lacks num_hidden_layers"),
    ({"max_position_embeddings": None}, "config.json lacks max_position_embeddings"),
    ({"hidden_size": "8"}, "config.json hidden_size is '8', TEI parses a non-negative integer"),
    ({"pad_token_id": -1}, "config.json pad_token_id is -1"),
    ({"architectures": ["BertModel"]}, "has no *Classification entry"),
    ({"id2label": {"0": "a", "1": "b"}}, "exactly one label"),
])
def test_config_faults_tei_stops_on_are_named(good_dir: Path, changes: dict, problem: str) -> None:
    _config(good_dir, **changes)
    found = layout.check_tei_dir(good_dir)
    assert any(problem in p for p in found), found


def test_gpt2_style_size_names_are_what_tei_accepts_too(good_dir: Path) -> None:
    """TEI's serde aliases: n_positions, n_embd and n_layer are read for the three sizes."""
    _config(good_dir, max_position_embeddings=None, hidden_size=None, num_hidden_layers=None, n_positions=512,
            n_embd=8, n_layer=1)
    assert layout.check_tei_dir(good_dir) == []


def test_a_maximum_input_length_beyond_the_models_positions_is_found(good_dir: Path) -> None:
    (good_dir / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 1024}))
    found = layout.check_tei_dir(good_dir, max_positions=512)
    assert found == ["TEI would accept 1024 tokens a pair; the model's positions take 512"]
    assert layout.cap_input_length(good_dir, GOOD_CONFIG, 512) == 512
    assert layout.check_tei_dir(good_dir, max_positions=512) == []
    assert layout.cap_input_length(good_dir, GOOD_CONFIG, 512) is None  # already within


def test_a_roberta_type_tei_does_not_list_gets_its_limit_written(good_dir: Path) -> None:
    """A type whose positions start after the padding index but that TEI's list misses would be given all of
    max_position_embeddings; the Job writes the limit TEI reads first."""
    cfg = {**GOOD_CONFIG, "model_type": "some-roberta-kin", "max_position_embeddings": 514, "pad_token_id": 1}
    (good_dir / "config.json").write_text(json.dumps(cfg))
    assert layout.check_tei_dir(good_dir, max_positions=512) == [
        "TEI would accept 514 tokens a pair; the model's positions take 512"]
    assert layout.cap_input_length(good_dir, cfg, 512) == 512
    assert json.loads((good_dir / "sentence_bert_config.json").read_text())["max_seq_length"] == 512


@pytest.mark.parametrize(("inputs", "expect", "offset", "problem"), [
    (("input_ids", "attention_mask", "past_key_values.0.key"), None, 0, "is not one TEI feeds"),
    (("attention_mask", "token_type_ids"), None, 0, "graph input input_ids missing"),
    (("input_ids", "attention_mask", "token_type_ids"), ("input_ids", "attention_mask"), 0,
     "differ from the verified export's"),
    (("input_ids", "attention_mask", "position_ids"), None, 2, "positions start at 2: TEI feeds 0..n"),
])
def test_graph_inputs_tei_would_not_feed_right_are_named(good_dir: Path, inputs: tuple[str, ...],
                                                         expect: tuple[str, ...] | None, offset: int,
                                                         problem: str) -> None:
    _graph(good_dir / layout.MODEL_FILE, inputs)
    found = layout.check_tei_dir(good_dir, expect_inputs=expect, position_offset=offset)
    assert any(problem in p for p in found), found


def test_position_ids_from_zero_are_fine(good_dir: Path) -> None:
    _graph(good_dir / layout.MODEL_FILE, ("input_ids", "attention_mask", "position_ids"))
    assert layout.check_tei_dir(good_dir, position_offset=0) == []


def test_tokenizer_faults_are_named(good_dir: Path) -> None:
    (good_dir / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    (good_dir / "tokenizer_config.json").write_text(json.dumps({"padding_side": "middle"}))
    found = layout.check_tei_dir(good_dir)
    assert any(p.startswith("tokenizer.json does not load") for p in found), found
    assert "tokenizer_config.json padding_side 'middle' is not left or right" in found


def test_distilbert_sizes_resolved_by_transformers_are_added_beside_the_originals() -> None:
    raw = {"architectures": ["DistilBertForSequenceClassification"], "model_type": "distilbert", "dim": 32,
           "n_layers": 2, "n_heads": 2, "max_position_embeddings": 512}
    out = layout.tei_config(raw, resolved={"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2})
    assert (out["hidden_size"], out["num_hidden_layers"], out["dim"], out["n_layers"]) == (32, 2, 32, 2)
    with pytest.raises(Exception, match="lacks"):
        layout.tei_config(raw)  # nothing resolved: refused, naming the keys
