"""Quality gate refusal, crash safety of publication, idempotence, and input errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantizer_job.steps.recipe_search import search
from quantizer_job.steps.storage import publish
from rerank_contracts import artifact_layout, quantize_job

from .conftest import FIXED_RECIPE, REPO, run_quantize

pytestmark = pytest.mark.quantizer


def _leftovers(volume: Path, artifact_id: str) -> list[str]:
    return sorted(p.name for p in (volume / "artifacts").glob(f".tmp-{artifact_id}-*"))


@pytest.fixture(scope="module")
def int8_hostile_model(models_dir) -> Path:
    """FP32 is fine, any INT8 weight quantization destroys it.

    Hidden dimension 0 of every LayerNorm output is exactly zero (gamma = beta = 0), and the weights that read that
    dimension (Q, K, V and the first FFN matrix) hold 1e4 there. In FP32 those products are exactly 0, so the model
    computes what it did before; in INT8 the 1e4 sets the weight scale of every column, and all the real weights
    round to zero. (Outlier weights like these are what makes naive INT8 fail on real models.)
    """
    import torch

    from rerank_devcluster import devmodels

    d = devmodels.bert_cross_encoder(models_dir / "int8-hostile", seed=3)
    from transformers import BertForSequenceClassification

    m = BertForSequenceClassification.from_pretrained(str(d)).eval()
    with torch.no_grad():
        lns = [m.bert.embeddings.LayerNorm]
        for layer in m.bert.encoder.layer:
            lns += [layer.attention.output.LayerNorm, layer.output.LayerNorm]
            for lin in (layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                        layer.intermediate.dense):
                lin.weight[:, 0] = 1e4
        for ln in lns:
            ln.weight[0] = 0.0
            ln.bias[0] = 0.0
    m.save_pretrained(str(d), safe_serialization=True)
    return d


def test_quality_gate_refuses_int8_destroyed_model(int8_hostile_model, tmp_path):
    vol = tmp_path / "vol"
    r = run_quantize(["--model", str(int8_hostile_model), "--output", str(vol), "--artifact-id", "hostile"], tmp_path)
    assert r.rc != 0
    assert r.result["reason"] == "QualityGateFailed", r.stderr[-2000:]
    assert not r.result["ok"]
    assert r.result["quality"]["spearman"] < 0.99
    assert "spearman" in r.result["message"]
    # every recipe of the automatic search was tried and none passed
    assert r.result["recipe"]["tried"] and not any(t["passed"] for t in r.result["recipe"]["tried"])
    assert r.termination == r.stdout.strip().splitlines()[-1]
    assert not (vol / "artifacts" / "hostile").exists()
    assert _leftovers(vol, "hostile") == []


def test_quality_gate_uses_the_threshold(bert_model, tmp_path):
    """Same model, same recipe: an unreachable threshold fails, and only the threshold changed."""
    vol = tmp_path / "vol"
    args = ["--model", str(bert_model), "--output", str(vol), "--recipe", "fixed"]
    r = run_quantize([*args, "--artifact-id", "strict", "--min-spearman", "1.0", "--min-topk-agreement", "1.0"],
                     tmp_path)
    if r.result.get("quality", {}).get("spearman") == 1.0 and r.result["quality"].get("topk_agreement") == 1.0:
        pytest.skip("INT8 happened to rank every pair exactly like FP32")
    assert r.rc != 0 and r.result["reason"] == "QualityGateFailed"
    assert not (vol / "artifacts" / "strict").exists()


def test_a_gate_failure_with_full_range_weights_on_avx2_says_to_reduce_the_range(bert_model, tmp_path):
    """The fixed recipe takes reduceRange as given; on an AVX2-only target the failure names the fix. An unreachable
    threshold makes the gate fail on any machine, so the message is what is tested, not this CPU's kernels."""
    vol = tmp_path / "vol"
    r = run_quantize(["--model", str(bert_model), "--output", str(vol), "--artifact-id", "sat", "--recipe", "fixed",
                      "--target", "avx2", "--no-reduce-range", "--min-spearman", "1.0", "--min-topk-agreement",
                      "1.0"], tmp_path)
    assert r.rc != 0 and r.result["reason"] == "QualityGateFailed", r.stderr[-2000:]
    assert "spec.quantization.reduceRange: true" in r.result["message"]
    assert r.result["recipe"]["target"] == "avx2" and r.result["recipe"]["reduce_range"] is False
    assert not (vol / "artifacts" / "sat").exists()


def test_killed_run_leaves_nothing_then_rerun_publishes_then_already_published(bert_model, tmp_path):
    vol = tmp_path / "vol"
    args = [sys.executable, "-m", "quantizer_job", "--model", str(bert_model), "--output", str(vol),
            "--artifact-id", "killme", *FIXED_RECIPE]
    env = dict(os.environ, RERANK_QUANTIZE_TIMING_SECONDS="0.2", TERMINATION_MESSAGE_PATH=str(tmp_path / "t.log"))
    p = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=str(REPO))
    killed_at = None
    try:
        for line in p.stderr:
            if line.startswith("{"):
                rec = json.loads(line)
                if rec["stage"] == "quantize" and rec["event"] == "start":
                    p.send_signal(signal.SIGKILL)
                    killed_at = rec["stage"]
                    break
    finally:
        p.wait(timeout=60)
    assert killed_at == "quantize" and p.returncode == -signal.SIGKILL
    final = vol / "artifacts" / "killme"
    assert not final.exists()
    assert len(_leftovers(vol, "killme")) == 1  # the dead run's work, never at the final path

    r = run_quantize(args[3:], tmp_path)
    assert r.rc == 0 and r.result["reason"] == "Published", r.stderr[-2000:]
    assert final.is_dir() and (final / "manifest.json").is_file()
    assert _leftovers(vol, "killme") == []  # stale temp dir cleaned
    manifest_before = (final / "manifest.json").read_bytes()

    t0 = time.monotonic()
    r2 = run_quantize(args[3:], tmp_path)
    took = time.monotonic() - t0
    assert r2.rc == 0 and r2.result["reason"] == "AlreadyPublished"
    assert r2.result["manifest_sha256"] == r.result["manifest_sha256"]
    assert took < 15, took
    assert '"stage":"export"' not in r2.stderr
    assert (final / "manifest.json").read_bytes() == manifest_before


def test_commit_never_overwrites(tmp_path):
    root = str(tmp_path)
    final = publish.final_path(root, "a1")
    final.mkdir(parents=True)
    (final / "manifest.json").write_text("{}")
    tmp = publish.make_temp(root, "a1")
    (tmp / "manifest.json").write_text('{"new": true}')
    with pytest.raises(FileExistsError):
        publish.commit(tmp, root, "a1")
    assert (final / "manifest.json").read_text() == "{}"
    lock = publish.ArtifactLock(root, "a1")
    assert lock.acquire()
    assert publish.clean_stale(root, "a1") == [tmp.name]
    assert not tmp.exists()
    lock.release()


@pytest.mark.parametrize("case", ["missing", "two-labels", "not-classifier", "bad-id", "bad-eval"])
def test_input_errors_are_reported_with_reasons(case, tmp_path, bert_model):
    model = tmp_path / "m"
    model.mkdir()
    cfg = {"architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_size": 8,
           "num_hidden_layers": 1, "max_position_embeddings": 512, "id2label": {"0": "a"}}
    args_id = "x1"
    extra: list[str] = []
    expect = "UnsupportedModel"
    if case == "missing":
        model = tmp_path / "does-not-exist"
        expect = "ModelNotFound"
    elif case == "two-labels":
        cfg["id2label"] = {"0": "neg", "1": "pos"}
    elif case == "not-classifier":
        cfg["architectures"] = ["BertModel"]
    elif case == "bad-id":
        args_id = "../escape"
        expect = "InvalidInput"
    elif case == "bad-eval":
        model = bert_model
        bad = tmp_path / "eval.jsonl"
        bad.write_text('{"query": "q"}\n')
        extra = ["--eval-pairs", str(bad)]
        expect = "InvalidInput"
    if model.is_dir() and model != bert_model:
        (model / "config.json").write_text(json.dumps(cfg))
    r = run_quantize(["--model", str(model), "--output", str(tmp_path / "vol"), "--artifact-id", args_id, *extra],
                     tmp_path)
    assert r.rc != 0
    assert r.result["reason"] == expect, r.result
    assert not r.result["ok"]
    res = quantize_job.parse_result(r.termination)
    assert res.reason == expect
    arts = tmp_path / "vol" / "artifacts"
    if arts.exists():  # nothing published, no temp dir left behind
        assert [p.name for p in arts.iterdir() if not p.name.startswith(".lock-")] == []


def test_a_job_on_live_queries_does_not_keep_them_beside_the_artifact(bert_model: Path, tmp_path: Path) -> None:
    """A re-quantization on drift is judged on the tenant's live sample (``--no-keep-eval-pairs``, what the operator
    passes for such a round): the queries expire with the sample, so the artifact must not keep a copy."""
    live = tmp_path / "live.jsonl"
    live.write_text("".join(json.dumps({"query": f"live query {i}", "texts": [f"passage {i}.{j}" for j in range(6)],
                                        "t": 1.0}) + "\n" for i in range(12)))
    vol = tmp_path / "vol"
    r = run_quantize(["--model", str(bert_model), "--output", str(vol), "--artifact-id", "live-round",
                      *FIXED_RECIPE, "--eval-pairs", str(live), "--no-keep-eval-pairs",
                      "--min-spearman", "0.8", "--min-topk-agreement", "0.5"], tmp_path)
    assert r.rc == 0, r.stderr[-3000:]
    art = vol / artifact_layout.ARTIFACTS_DIR / "live-round"
    assert (art / artifact_layout.MANIFEST_FILE).is_file()
    assert not (art / artifact_layout.EVALUATION_FILE).exists()
    assert "live query" not in "".join(p.read_text(errors="ignore") for p in art.rglob("*.json"))


def test_a_model_above_the_fusion_limit_is_quantized_a_weight_at_a_time_and_skips_slower_candidates(
        bert_model: Path, tmp_path: Path) -> None:
    """The large-model path, on the tiny model with the fusion limit set below its size: unfused candidates, the
    MatMul weights written by matmul_int8 (DynamicQuantizeMatMul nodes, no ORT quantizer), the search skipping what
    could not serve faster than the first candidate that passes, and a TEI-loadable artifact."""
    import onnx

    from quantizer_job.steps.tei import layout

    vol = tmp_path / "vol"
    r = run_quantize(["--model", str(bert_model), "--output", str(vol), "--artifact-id", "large-path",
                      "--recipe", "auto", "--min-spearman", "0.8", "--min-topk-agreement", "0.5"], tmp_path,
                     env={"RERANK_QUANTIZE_FUSION_MAX_BYTES": "1000"})
    assert r.rc == 0, r.stderr[-3000:]
    tried = r.result["recipe"]["tried"]
    assert len(tried) == 1 and tried[0]["passed"] and tried[0]["name"].endswith("-unfused"), tried
    logs = [json.loads(line) for line in r.stderr.splitlines() if line.startswith("{")]
    skipped = [e for e in logs if e.get("event") == "skipped" and e.get("stage") == "quantize"]
    assert skipped and skipped[0]["reason"].startswith(search.SLOWER) and len(skipped[0]["recipes"]) >= 2
    streamed = [e for e in logs if e.get("event") == "matmuls_streamed"]
    assert len(streamed) == 1 and streamed[0]["matmuls"] >= 12 and streamed[0]["kept_fp32"] == 0, streamed
    cpu = vol / artifact_layout.ARTIFACTS_DIR / "large-path" / artifact_layout.CPU_SUBDIR
    ops = {n.op_type for n in onnx.load(str(cpu / layout.MODEL_FILE), load_external_data=False).graph.node}
    assert "DynamicQuantizeMatMul" in ops and "MatMulInteger" not in ops and "Attention" not in ops, ops
    assert not layout.check_tei_dir(cpu, expect_inputs=("input_ids", "attention_mask", "token_type_ids"))


@pytest.fixture(scope="module")
def store_registry(tmp_path_factory: pytest.TempPathFactory):
    from rerank_devcluster.registry import standalone

    with standalone(tmp_path_factory.mktemp("store")) as running:
        yield running


def test_a_shared_artifact_is_pushed_once_published_and_fetches_byte_for_byte(bert_model, tmp_path, store_registry):
    """The shared Job's end (RerankClass artifactStore): publish on its volume, push to the store, tag last; the
    pods' fetcher gets exactly the published files back. A re-run (AlreadyPublished) pushes the same digest."""
    from rerank_contracts import oci, shared_store

    vol = tmp_path / "vol"
    repository = f"{store_registry.host}/rerank/artifacts"
    args = ["--model", str(bert_model), "--output", str(vol), "--artifact-id", "shared0", *FIXED_RECIPE,
            "--push-repository", repository, "--push-insecure"]
    r = run_quantize(args, tmp_path)
    assert r.rc == 0 and r.result["reason"] == "Published", r.stderr[-2000:]
    ref = r.result["ref"]
    registry = oci.Registry(store_registry.host, insecure=True)
    assert ref == f"{repository}@{registry.resolve('rerank/artifacts', 'shared0')}"
    into = tmp_path / "pod" / "artifacts" / "shared0"
    parts = [artifact_layout.CPU_SUBDIR, artifact_layout.ORIGINAL_SUBDIR]
    shared_store.fetch(ref, r.result["manifest_sha256"], parts, into, registry=registry)
    published = vol / "artifacts" / "shared0"
    for part in (artifact_layout.CPU_SUBDIR, artifact_layout.ORIGINAL_SUBDIR):
        names = sorted(p.relative_to(published) for p in (published / part).rglob("*") if p.is_file())
        assert names and names == sorted(p.relative_to(into) for p in (into / part).rglob("*") if p.is_file())
        for name in names:
            assert (into / name).read_bytes() == (published / name).read_bytes()
    again = run_quantize(args, tmp_path)
    assert again.rc == 0 and again.result["reason"] == "AlreadyPublished" and again.result["ref"] == ref


def test_a_shared_artifact_the_store_refuses_fails_the_job_as_publish_failed(bert_model, tmp_path):
    """No store to push to (nothing listens): the Job fails PublishFailed, so no model is told it was shared."""
    from rerank_devcluster.processes import free_port

    args = ["--model", str(bert_model), "--output", str(tmp_path / "vol"), "--artifact-id", "shared1", *FIXED_RECIPE,
            "--push-repository", f"127.0.0.1:{free_port()}/rerank/artifacts", "--push-insecure"]
    r = run_quantize(args, tmp_path)
    assert r.rc == quantize_job.EXIT_CODES["PublishFailed"], r.stderr[-2000:]
    assert r.result["reason"] == "PublishFailed" and "pushing to 127.0.0.1:" in r.result["message"]
