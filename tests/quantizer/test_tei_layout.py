"""The published directories load and run the way TEI 1.9 (ONNX Runtime 1.22.0, ORT_ENABLE_ALL) loads them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from quantizer_job.steps.evaluation import evaldata
from rerank_contracts import artifact_layout, quantize_job

pytestmark = pytest.mark.quantizer

REQUIRED_CONFIG = ("architectures", "model_type", "max_position_embeddings", "hidden_size", "num_hidden_layers",
                   "pad_token_id")


def _ort_session(path: Path):
    import onnxruntime as ort

    assert ort.__version__ == "1.22.0", "verify with the ONNX Runtime TEI 1.9 embeds"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = 2
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _tei_feed(d: Path, sess, pairs):
    """Tokenize as TEI does: tokenizer.json (fast tokenizer) on (query, text), pad to the longest in the batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.no_padding()  # TEI pads batches itself (tokenizer.json may carry a padding setting)
    tok.enable_truncation(512)
    cfg = json.loads((d / "config.json").read_text())
    encs = tok.encode_batch(pairs)
    n = max(len(e.ids) for e in encs)
    ids = np.full((len(pairs), n), cfg["pad_token_id"], dtype=np.int64)
    mask = np.zeros_like(ids)
    tt = np.zeros_like(ids)
    for i, e in enumerate(encs):
        ids[i, : len(e.ids)] = e.ids
        mask[i, : len(e.ids)] = 1
        tt[i, : len(e.ids)] = e.type_ids
    all_ = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}
    return {i.name: all_[i.name] for i in sess.get_inputs()}


def _torch_scores(model_dir: Path, tok_dir: Path, pairs):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir)).eval()
    enc = tok([q for q, _ in pairs], [t for _, t in pairs], padding=True, truncation=True, max_length=512,
              return_tensors="pt")
    with torch.no_grad():
        return model(**enc).logits[:, 0].numpy()


def _check_common(art: Path, run, source: Path, expect_token_type_ids: bool):
    import onnx

    cpu = art / artifact_layout.CPU_SUBDIR
    # Files with the exact names TEI looks for; no optimum leftovers.
    assert (cpu / "model.onnx").is_file()
    assert sorted(p.name for p in cpu.glob("*.onnx")) == ["model.onnx"]
    assert not (cpu / "model_quantized.onnx").exists()
    for name in ("config.json", "tokenizer.json"):
        assert (cpu / name).is_file()
    cfg = json.loads((cpu / "config.json").read_text())
    for k in REQUIRED_CONFIG:
        assert k in cfg, k
    assert cfg["architectures"][0].endswith("ForSequenceClassification")
    assert len(cfg["id2label"]) == 1 and len(cfg["label2id"]) == 1
    assert list(cfg["label2id"].values()) == [0] and list(cfg["id2label"]) == ["0"]

    # Graph signature.
    m = onnx.load(str(cpu / "model.onnx"), load_external_data=False)
    inputs = {i.name: i.type.tensor_type.elem_type for i in m.graph.input}
    want = {"input_ids", "attention_mask"} | ({"token_type_ids"} if expect_token_type_ids else set())
    assert set(inputs) == want
    assert all(t == onnx.TensorProto.INT64 for t in inputs.values())
    assert "position_ids" not in inputs
    outs = {o.name: o.type.tensor_type.elem_type for o in m.graph.output}
    assert outs == {"logits": onnx.TensorProto.FLOAT}
    ops = {n.op_type for n in m.graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "QAttention", "DynamicQuantizeLinear"}, ops
    assert m.ir_version <= 10

    # It runs under ONNX Runtime 1.22 with ORT_ENABLE_ALL and gives float32 [batch, 1].
    sess = _ort_session(cpu / "model.onnx")
    pairs = [(p.query, p.text) for p in evaldata.builtin_pairs()[:20]]
    out = sess.run(None, _tei_feed(cpu, sess, pairs[:3]))
    assert len(out) == 1
    assert out[0].dtype == np.float32 and out[0].shape == (3, 1)
    assert np.all(np.isfinite(out[0]))

    # INT8 ranks like the PyTorch FP32 model it came from (an independent check of the whole chain).
    int8 = sess.run(None, _tei_feed(cpu, sess, pairs))[0][:, 0]
    ref = _torch_scores(source, cpu, pairs)
    from quantizer_job.steps.evaluation.metrics import spearman

    assert spearman(ref, int8) > 0.9
    assert np.max(np.abs(ref - int8)) < 0.25 * (np.ptp(ref) + 1e-6)

    # original/ for the GPU pool: safetensors + same config/tokenizer, loads and computes the source's logits.
    orig = art / artifact_layout.ORIGINAL_SUBDIR
    assert (orig / "model.safetensors").is_file()
    assert json.loads((orig / "config.json").read_text()) == cfg
    assert (orig / "tokenizer.json").read_bytes() == (cpu / "tokenizer.json").read_bytes()
    np.testing.assert_allclose(_torch_scores(orig, orig, pairs[:4]), ref[:4], rtol=1e-5, atol=1e-5)

    # Manifest lists every file with size and sha256.
    man = json.loads((art / "manifest.json").read_text())
    listed = {f["path"]: f for f in man["files"]}
    actual = {p.relative_to(art).as_posix() for p in art.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(listed) == actual
    # The pairs it was verified on, for the quality guard's replay (a model without a Gateway to mirror from).
    replay = [json.loads(line) for line in (art / artifact_layout.EVALUATION_FILE).read_text().splitlines()]
    assert artifact_layout.EVALUATION_FILE in listed and len(replay) >= 2
    assert all(set(r) == {"query", "text"} and r["query"] and r["text"] for r in replay)
    f = listed["cpu-int8/model.onnx"]
    assert f["size"] == (cpu / "model.onnx").stat().st_size
    assert f["sha256"] == hashlib.sha256((cpu / "model.onnx").read_bytes()).hexdigest()
    assert man["artifact_id"] == art.name and man["quality"]["spearman"] >= man["gate"]["min_spearman"]
    for key in ("recipe", "speed", "versions", "timings"):
        assert man[key], key
    assert man["versions"]["onnxruntime"] == "1.22.0"

    # Result: termination message == last stdout line, compact, parseable by the operator.
    assert run.termination is not None and run.termination.strip() == run.stdout.strip().splitlines()[-1]
    assert len(run.termination.encode()) < quantize_job.MAX_MESSAGE_BYTES
    res = quantize_job.parse_result(run.termination)
    assert res.ok and res.reason == "Published" and res.path == str(art)
    assert res.manifest_sha256 == hashlib.sha256((art / "manifest.json").read_bytes()).hexdigest()
    assert set(res.speed) >= {"fp32_pairs_per_s", "int8_pairs_per_s", "speedup", "speedup_low", "speedup_high",
                              "kernel_speedup"}
    # The reported speed is the served-like one (serving.py), FP32 and INT8 in turns, with its range over rounds.
    assert man["speed_settings"]["measured"] == "served" and man["speed"]["served_in_turns"] == 1.0
    assert res.speed["speedup_low"] <= res.speed["speedup"] <= res.speed["speedup_high"]
    # TEI's maximum input length (its router: max_position_embeddings, less pad_token_id + 1 for XLM-R) is the CPU
    # pool's default --max-batch-tokens, and the served batches were timed within it.
    offset = cfg["pad_token_id"] + 1 if cfg["model_type"] == "xlm-roberta" else 0
    assert res.max_input_tokens == man["max_input_tokens"] == cfg["max_position_embeddings"] - offset
    assert man["speed_settings"]["max_batch_tokens"] == res.max_input_tokens
    # Stage logs are JSON lines with timings.
    stages = {json.loads(line)["stage"] for line in run.stderr.splitlines() if line.startswith("{")}
    assert stages >= {"download", "export", "optimize", "quantize", "verify", "publish"}
    return cfg


def test_bert_family_directory_is_tei_loadable(published_bert, bert_model):
    art, run = published_bert
    _check_common(art, run, bert_model, expect_token_type_ids=True)


def test_xlmr_family_directory_is_tei_loadable(published_xlmr, xlmr_model):
    art, run = published_xlmr
    cfg = _check_common(art, run, xlmr_model, expect_token_type_ids=False)
    assert cfg["model_type"] == "xlm-roberta" and cfg["pad_token_id"] == 1
    # The source had no tokenizer.json: a converted one with XLM-R's pair template (<s> A </s></s> B </s>).
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(art / "cpu-int8" / "tokenizer.json"))
    ids = tok.encode("query", "text").ids
    assert ids[0] == 0 and ids[-1] == 2 and ids.count(2) == 3
    man = json.loads((art / "manifest.json").read_text())
    assert man["export"]["tokenizer_converted"] is True
