"""Static quantization with calibration pairs (balanced across length buckets) also yields a TEI-loadable model."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from quantizer_job.steps.evaluation import evaldata

from .conftest import run_quantize

pytestmark = pytest.mark.quantizer


def test_static_mode_publishes_qdq_model(bert_model, tmp_path):
    calib = tmp_path / "calib.jsonl"
    with calib.open("w", encoding="utf-8") as f:
        for p in evaldata.builtin_pairs()[::2]:
            f.write(json.dumps({"query": p.query, "text": p.text}, ensure_ascii=False) + "\n")
    vol = tmp_path / "vol"
    r = run_quantize(["--model", str(bert_model), "--output", str(vol), "--artifact-id", "static1", "--mode",
                      "static", "--calibration-pairs", str(calib), "--recipe", "fixed", "--min-spearman", "0.9",
                      "--min-topk-agreement", "0.6"], tmp_path)
    assert r.rc == 0, r.stderr[-3000:]
    model = vol / "artifacts" / "static1" / "cpu-int8" / "model.onnx"
    ops = {n.op_type for n in onnx.load(str(model)).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert r.result["recipe"]["mode"] == "static"
    assert np.isfinite(r.result["quality"]["spearman"])


def test_static_mode_requires_calibration_pairs(bert_model, tmp_path):
    r = run_quantize(["--model", str(bert_model), "--output", str(tmp_path / "vol"), "--artifact-id", "s2",
                      "--mode", "static"], tmp_path)
    assert r.rc != 0 and r.result["reason"] == "InvalidInput"
