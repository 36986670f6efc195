"""The GPU pool is gated too (issue 61): the Job checks the original weights for float16 overflow, which the GPU pool
(TEI's CUDA path, FP16) would serve as inf/NaN scores. The fixture computes exactly the function of a tiny random
BERT, but with its first layer's queries scaled up and its keys scaled down by the same factor (QK^T unchanged): in
float32 nothing changes; in float16 the query projection's outputs (~1e5) overflow. The Job records the peak, the
operator reads it (``quantize_job.fp16_refusal``) and sends the GPU pool no traffic
(tests/unit/operator/core/reconcile/test_lifecycle.py::test_a_model_that_overflows_in_fp16_gets_no_gpu_traffic); the
INT8 artifact still passes its gate and serves the CPU pool."""

from __future__ import annotations

import json
from pathlib import Path

from rerank_contracts import quantize_job
from tests.quantizer.conftest import FIXED_RECIPE, run_quantize

SCALE = 1e5


def overflowing_bert(out: Path) -> Path:
    import torch
    from transformers import BertForSequenceClassification

    from rerank_devcluster import devmodels

    src = devmodels.bert_cross_encoder(out, seed=3)
    model = BertForSequenceClassification.from_pretrained(str(src))
    attention = model.bert.encoder.layer[0].attention.self
    with torch.no_grad():
        for linear, factor in ((attention.query, SCALE), (attention.key, 1 / SCALE)):
            linear.weight.mul_(factor)
            linear.bias.mul_(factor)
    model.save_pretrained(str(src), safe_serialization=True)
    return src


def test_an_fp16_overflow_is_recorded_for_the_gpu_pool_and_the_int8_artifact_still_serves(tmp_path: Path) -> None:
    src = overflowing_bert(tmp_path / "overflowing-bert")
    volume = tmp_path / "volume"
    r = run_quantize(["--model", str(src), "--output", str(volume), "--artifact-id", "fp16-overflow",
                      *FIXED_RECIPE, "--operators", "MatMul", "--optimization-level", "0",
                      "--min-spearman", "0.95", "--min-topk-agreement", "0.6"], tmp_path)
    assert r.rc == 0, r.stderr[-3000:]
    assert r.result["ok"] and r.result["reason"] == "Published"  # the CPU pool's INT8 artifact passed its gate
    peak = r.result["quality"]["fp16_peak_activation"]
    assert peak > quantize_job.FP16_MAX, peak
    why = quantize_job.fp16_refusal(r.result["quality"])
    assert why is not None and "float16" in why
    manifest = json.loads((volume / "artifacts" / "fp16-overflow" / "manifest.json").read_text())
    assert manifest["quality"]["fp16_peak_activation"] == peak
    assert '"event": "fp16_overflow"' in r.stdout or "fp16_overflow" in r.stderr


def test_a_model_within_float16_range_is_not_refused(published_bert: tuple[Path, object]) -> None:
    artifact, _ = published_bert
    quality = json.loads((artifact / "manifest.json").read_text())["quality"]
    assert 0 < quality["fp16_peak_activation"] <= quantize_job.FP16_MAX
    assert quantize_job.fp16_refusal(quality) is None


def test_the_manifest_names_the_target_and_cpu_and_a_pool_on_this_machine_is_checked_against_it(
        published_bert: tuple[Path, object], tmp_path: Path) -> None:
    """What an artifact records of the CPU it was built on, and the pool's check of this machine against a VNNI
    artifact (refused here when the CPU has no VNNI, as on the AVX2-only EPYC these tests run on; taken with it)."""
    from quantizer_job.steps.common import isa
    from rerank_contracts import cpu_target, shared_store

    artifact, _ = published_bert
    recipe = json.loads((artifact / "manifest.json").read_text())["recipe"]
    here = isa.describe_local_cpu()
    assert recipe["cpu"] == here and recipe["target"] == here["target"] == isa.detect_local_target()
    log = tmp_path / "termination-log"
    arm = cpu_target.is_arm(str(here["machine"]))
    has_vnni = bool(cpu_target.cpu_flags(Path("/proc/cpuinfo").read_text()) & cpu_target.VNNI_FLAGS)
    expected = 0 if has_vnni and not arm else shared_store.EXIT_CODES["ArtifactTargetMismatch"]
    assert shared_store.main(["--check-cpu", "avx512_vnni", "--termination-log", str(log)]) == expected
    if expected:
        assert json.loads(log.read_text())["reason"] == "ArtifactTargetMismatch"
    seven_bit = shared_store.main(["--check-cpu", "avx2", "--reduce-range", "--termination-log", str(log)])
    assert seven_bit == (shared_store.EXIT_CODES["ArtifactTargetMismatch"] if arm else 0)
