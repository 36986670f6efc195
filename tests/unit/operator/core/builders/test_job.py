"""The quantization Job: its command line read back through the quantizer's own parser, and its outcome."""

from __future__ import annotations

from typing import Any

import pytest

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import names
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.artifacts import job_outcome
from rerank_operator.core.builders import job
from tests.unit.operator.rerankmodel_gen import (
    Mod,
    finish,
    job_pod,
    model,
    owner_of,
    published,
    refused,
    set_,
    spec_of,
    without,
)


def build(*mods: Mod, attempt: int = 1) -> tuple[dict[str, Any], quantize_job.JobRequest]:
    body = model(*mods)
    spec = spec_of(body)
    artifact_id = artifact.artifact_id(spec)
    assert artifact_id
    manifest = job.build_job(owner_of(body), spec, artifact_id, attempt, "bge-m3-models")
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    return manifest, quantize_job.parse_args(container["args"])


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]["containers"][0]


def mounts(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container(manifest)["volumeMounts"]}


@pytest.mark.parametrize("mods,expect", [
    ((), {"model": "BAAI/bge-reranker-v2-m3", "revision": "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e",
          "mode": "dynamic", "per_channel": True, "operators": ("MatMul",), "eval_pairs": None}),
    ((set_("quantization", {"recipe": "fixed", "perChannel": False, "reduceRange": True,
                            "operators": ["MatMul", "Attention"], "optimizationLevel": 99, "target": "avx2"}),),
     {"recipe": "fixed", "per_channel": False, "reduce_range": True, "operators": ("MatMul", "Attention"),
      "optimization_level": 99, "target": "avx2"}),
    ((set_("quantization.qualityGate", {"minSpearman": 0.97, "minTopKAgreement": 0.8, "topK": 10}),),
     {"min_spearman": 0.97, "min_topk_agreement": 0.8, "topk": 10}),
    ((set_("quantization.evaluationData", {"configMapRef": {"name": "pairs", "key": "eval.jsonl"}}),),
     {"eval_pairs": "/etc/rerank/evaluation/pairs.jsonl"}),
    ((set_("storage", {"existingClaim": "shared"}), set_("quantization.evaluationData", {"path": "data/eval.jsonl"})),
     {"eval_pairs": "/models/data/eval.jsonl"}),
    ((set_("storage", {"existingClaim": "shared"}), set_("model", {"path": "uploads/my-reranker"})),
     {"model": "/models/uploads/my-reranker", "revision": None}),
    ((set_("quantization", {"mode": "static", "calibrationData": {"configMapRef": {"name": "cal", "key": "c"}}}),),
     {"mode": "static", "calibration_pairs": "/etc/rerank/calibration/pairs.jsonl"}),
    ((set_("quantization.timeBudgetSeconds", 300),), {"time_budget_seconds": 300}),
    # Speed is measured with the threads the CPU pool's TEI will have: its CPU limit (the default pool: 2 CPUs).
    ((), {"serve_threads": 2}),
    ((set_("pools.cpu.resources", {"requests": {"cpu": "3500m"}}),), {"serve_threads": 4}),
    ((set_("pools.cpu.resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "6"}}),), {"serve_threads": 6}),
    ((set_("pools.cpu.resources", {"limits": {"memory": "4Gi"}}),), {"serve_threads": 0}),
    ((set_("pools.cpu.enabled", False), set_("pools.gpu", {})), {"serve_threads": 0}),
    # ... and within its token budget: the pool's own, else the model's maximum input length, which the Job knows (0).
    ((), {"serve_batch_tokens": 0}),
    ((set_("pools.cpu.tei.maxBatchTokens", 2048),), {"serve_batch_tokens": 2048}),
    ((set_("pools.cpu.enabled", False), set_("pools.gpu", {})), {"serve_batch_tokens": 0}),
])
def test_args_round_trip_through_the_quantizers_parser(mods: tuple[Mod, ...], expect: dict[str, Any]) -> None:
    manifest, request = build(*mods)
    for key, value in expect.items():
        assert getattr(request, key) == value, key
    assert request.output_root == artifact_layout.VOLUME_MOUNT_PATH
    assert request.artifact_id == manifest["metadata"]["labels"][names.LABEL_ARTIFACT]
    assert request.keep_original is True


def test_config_map_data_is_mounted_where_the_args_point() -> None:
    manifest, request = build(set_("quantization.evaluationData",
                                   {"configMapRef": {"name": "pairs", "key": "e.jsonl"}}))
    assert request.eval_pairs is not None
    mount_dir, file_name = request.eval_pairs.rsplit("/", 1)
    mount = mounts(manifest)[mount_dir]
    volume = next(v for v in manifest["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"] == {"name": "pairs", "items": [{"key": "e.jsonl", "path": file_name}]}
    assert mount["readOnly"] is True


def test_volume_token_and_hardening() -> None:
    manifest, _ = build()
    pod = manifest["spec"]["template"]["spec"]
    model_mount = mounts(manifest)[artifact_layout.VOLUME_MOUNT_PATH]
    volume = next(v for v in pod["volumes"] if v["name"] == model_mount["name"])
    assert volume["persistentVolumeClaim"] == {"claimName": "bge-m3-models"}
    assert not model_mount.get("readOnly")
    env = {e["name"]: e for e in container(manifest)["env"]}
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "hf", "key": "token"}
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["restartPolicy"] == "Never"
    assert container(manifest)["securityContext"]["allowPrivilegeEscalation"] is False
    assert container(manifest)["terminationMessagePath"] == quantize_job.TERMINATION_MESSAGE_PATH
    assert container(manifest)["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_job_metadata() -> None:
    manifest, _ = build(set_("quantization", {"backoffLimit": 4, "activeDeadlineSeconds": 900,
                                              "timeBudgetSeconds": 600}), attempt=3)
    meta = manifest["metadata"]
    assert manifest["spec"]["backoffLimit"] == 4 and manifest["spec"]["activeDeadlineSeconds"] == 900
    assert meta["ownerReferences"][0]["uid"] == "0b1c-uid" and meta["ownerReferences"][0]["controller"] is True
    assert meta["annotations"][names.ANNOTATION_ATTEMPT] == "3"
    assert meta["name"].endswith("-3") and len(meta["name"]) <= 63
    pod_labels = manifest["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/component"] == "quantizer"  # the dev cluster holds these pods Running


def test_job_name_is_stable_and_short() -> None:
    a, _ = build()
    b, _ = build(set_("pools.cpu.minReplicas", 4))
    assert a["metadata"]["name"] == b["metadata"]["name"]
    long_name = names.job_name("m" * 50, "0123456789abcdef", 12)
    assert len(long_name) <= 63 and long_name.endswith("-q-01234567-12")


def test_no_token_no_env() -> None:
    manifest, _ = build(without("model.tokenSecretRef"))
    assert "HF_TOKEN" not in {e["name"] for e in container(manifest)["env"]}


# --- outcomes ------------------------------------------------------------------------------------------------------

JOB = {"metadata": {"name": "bge-m3-q-1-1", "namespace": "search", "uid": "job-uid"}}


def running(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**JOB, "status": {"active": 1, **(extra or {})}}


def waiting_pod(reason: str, message: str) -> dict[str, Any]:
    pod = job_pod(JOB, 0, "")
    pod["status"] = {"phase": "Pending", "containerStatuses": [
        {"name": "quantizer", "state": {"waiting": {"reason": reason, "message": message}}}]}
    return pod


@pytest.mark.parametrize("job_obj,pods,state,reason", [
    (running(), [], "Running", "Quantizing"),
    (finish(JOB, ok=True), [job_pod(JOB, 0, published("a" * 16))], "Succeeded", "Published"),
    (finish(JOB, ok=True), [job_pod(JOB, 0, "")], "Succeeded", "ResultLost"),
    (finish(JOB, ok=True), [], "Succeeded", "ResultLost"),  # the pod is gone: the result was only in it
    (finish(JOB, ok=False), [job_pod(JOB, 1, refused("QualityGateFailed", "spearman 0.91 < 0.99"))],
     "Failed", "QualityGateFailed"),
    (finish(JOB, ok=False), [job_pod(JOB, 1, refused("ModelNotFound", "401 gated"))], "Failed", "ModelNotFound"),
    (finish(JOB, ok=False), [job_pod(JOB, 137, "Traceback ... Killed")], "Failed", "QuantizerCrashed"),
    (finish(JOB, ok=False), [], "Failed", "BackoffLimitExceeded"),
    (running(), [waiting_pod("CreateContainerConfigError", 'secret "hf" not found')], "Running", "JobPodWaiting"),
    (running({"failed": 1}), [job_pod(JOB, 1, refused("ExportFailed", "onnx"))], "Running", "Retrying"),
])
def test_outcome(job_obj: dict[str, Any], pods: list[dict[str, Any]], state: str, reason: str) -> None:
    out = job_outcome.outcome(job_obj, pods)
    assert (out.state, out.reason) == (state, reason)


def test_outcome_of_deadline_names_the_deadline() -> None:
    failed = {**JOB, "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                                               "message": "Job was active longer than specified deadline"}]}}
    out = job_outcome.outcome(failed, [job_pod(JOB, 143, "terminated")])
    assert out.reason == "DeadlineExceeded" and "deadline" in out.message
    # What the real quantizer leaves when the kubelet stops it at the deadline: SIGTERM -> an InternalError result.
    stopped = job_pod(JOB, quantize_job.EXIT_CODES["InternalError"], refused("InternalError", "terminated (SIGTERM)"))
    assert job_outcome.outcome(failed, [stopped]).reason == "DeadlineExceeded"


def oom_killed(pod: dict[str, Any]) -> dict[str, Any]:
    pod["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    return pod


@pytest.mark.parametrize("exit_code,message", [
    # cgroup v1 (seen on the node tier): the kernel kills the torch export child; the parent reports it and exits 12.
    (quantize_job.EXIT_CODES["ExportFailed"],
     refused("ExportFailed", "export child killed by signal 9 (out of memory?)")),
    (137, ""),  # the whole container killed: no result, no log tail
])
def test_oom_killed_names_the_memory_limit_whatever_the_quantizer_reported(exit_code: int, message: str) -> None:
    out = job_outcome.outcome(finish(JOB, ok=False), [oom_killed(job_pod(JOB, exit_code, message))])
    assert (out.state, out.reason) == ("Failed", "OOMKilled")
    assert "resources.limits.memory" in out.message and f"exit code {exit_code}" in out.message
    retrying = job_outcome.outcome(running({"failed": 1}), [oom_killed(job_pod(JOB, exit_code, message))])
    assert retrying.reason == "Retrying" and "OOMKilled" in retrying.message


def test_outcome_reads_the_newest_pod() -> None:
    old = job_pod(JOB, 1, refused("ExportFailed", "first try"), created="2025-01-01T00:00:00Z")
    new = job_pod(JOB, 1, refused("QualityGateFailed", "second try"), created="2025-01-01T00:05:00Z")
    assert job_outcome.outcome(finish(JOB, ok=False), [old, new]).reason == "QualityGateFailed"
    assert job_outcome.outcome(finish(JOB, ok=False), [new, old]).reason == "QualityGateFailed"


def test_success_carries_the_result() -> None:
    out = job_outcome.outcome(finish(JOB, ok=True), [job_pod(JOB, 0, published("f" * 16))])
    assert out.result is not None and out.result.quality["spearman"] == 0.995


def test_permanent_failures_fail_the_job_at_once_and_others_retry() -> None:
    """The exit codes the quantizer uses for failures retrying cannot fix are exactly the FailJob rule's."""
    from rerank_operator.core.builders import job as job_module

    rules = job_module.pod_failure_policy()["rules"]
    fail_job = [r for r in rules if r["action"] == "FailJob"]
    assert len(fail_job) == 1
    codes = set(fail_job[0]["onExitCodes"]["values"])
    # The hub's 401/403/404 (ModelNotFound) and what the model is cannot change by retrying; an outage
    # (HubUnavailable) is retried by the operator with new Jobs after a backoff of minutes, not by the Job's pods.
    assert codes == {quantize_job.EXIT_CODES[r] for r in ("ModelNotFound", "UnsupportedModel", "QualityGateFailed",
                                                      "InvalidInput", "HubUnavailable")}
    assert quantize_job.EXIT_CODES["InternalError"] not in codes
    assert 0 not in codes and 1 not in codes
    assert fail_job[0]["onExitCodes"]["containerName"] == job_module.CONTAINER


def test_the_job_is_placed_where_the_cpu_pool_runs() -> None:
    """The Job picks and times its INT8 recipe on its own node's CPU: it gets the CPU pool's placement."""
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cpu-pool", "operator": "In", "values": ["avx2"]}]}]}}}
    toleration = {"key": "cpu-only", "operator": "Exists", "effect": "NoSchedule"}
    manifest, _ = build(set_("pools.cpu.nodeSelector", {"cpu-pool": "avx2"}),
                        set_("pools.cpu.tolerations", [toleration]), set_("pools.cpu.affinity", affinity))
    pod = manifest["spec"]["template"]["spec"]
    assert (pod["nodeSelector"], pod["tolerations"], pod["affinity"]) == ({"cpu-pool": "avx2"}, [toleration], affinity)
    bare, _ = build()
    assert not {"nodeSelector", "tolerations", "affinity"} & set(bare["spec"]["template"]["spec"])
