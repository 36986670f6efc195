"""Quantization failures on the real control plane: they show with the Job's own reason, never take down running
pools, are retried with backoff up to the limit, and a fixed spec retries at once."""

from __future__ import annotations

from typing import Any

import pytest

from rerank_contracts import quantize_job
from tests.cluster.rrm_harness import Env, eventually, refused

pytestmark = pytest.mark.cluster


def serving_artifact(env: Env) -> str | None:
    dep = env.kube.deployment(env.namespace, "bge-m3-cpu")
    return (dep["spec"]["template"]["metadata"].get("annotations") or {}).get("rerank.io/artifact") if dep else None


def status(env: Env) -> dict[str, Any]:
    body = env.kube.model(env.namespace, "bge-m3")
    assert body is not None
    return dict(body["status"])


def test_crash_without_result_is_reported_and_nothing_serves(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model())
    env.finish_quantizer(ok=False, message="", exit_code=137)  # killed before writing a result
    cond = env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "QuantizerCrashed")
    assert "exit code 137" in cond["message"]
    env.kube.wait_condition(ns, "bge-m3", "Degraded", "True", "QuantizerCrashed")
    st = status(env)
    assert st["phase"] == "Failed" and st["pendingArtifact"]["state"] == "Failed"
    assert env.kube.condition(ns, "bge-m3", "Ready")["status"] == "False"
    assert env.kube.deployment(ns, "bge-m3-cpu") is None


def test_quality_gate_refusal_keeps_serving_then_a_fix_recovers(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model())
    first = env.finish_quantizer(ok=True)["metadata"]["labels"]["rerank.io/artifact"]
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True")

    env.kube.patch_spec(ns, "bge-m3", {"quantization": {"qualityGate": {"minSpearman": 0.999}}})
    env.finish_quantizer(ok=False, message=refused("QualityGateFailed", "spearman 0.9912 < 0.999 on 200 pairs"))
    cond = env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "QualityGateFailed")
    assert "0.9912 < 0.999" in cond["message"] and first in cond["message"]  # says the old artifact keeps serving
    env.kube.wait_condition(ns, "bge-m3", "Degraded", "True", "QualityGateFailed")
    st = status(env)
    assert st["phase"] == "Degraded" and st["artifact"]["id"] == first
    assert serving_artifact(env) == first
    dep = env.kube.deployment(ns, "bge-m3-cpu")
    assert dep is not None and dep["status"]["readyReplicas"] == 1  # the running pool was never touched
    events = env.cluster.kubectl_run("get", "events", "-n", ns, "--field-selector", "type=Warning").stdout
    assert "QualityGateFailed" in events

    env.kube.patch_spec(ns, "bge-m3", {"quantization": {"qualityGate": {"minSpearman": 0.98}}})
    pod = env.running_quantizer()  # the fix starts a new Job at once
    fixed = pod["metadata"]["labels"]["rerank.io/artifact"]
    assert fixed not in (first,)
    env.finish_quantizer(ok=True, artifact_id=fixed)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    env.kube.wait_condition(ns, "bge-m3", "Degraded", "False", "AsExpected")
    assert serving_artifact(env) == fixed and status(env)["phase"] == "Ready"


def test_failed_pod_is_retried_with_backoff_up_to_the_limit(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model(quantization={"backoffLimit": 1}))
    first = env.finish_quantizer(ok=False, message=refused("ExportFailed", "torch.onnx.export: unsupported op"))
    env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "Retrying", timeout=30)
    assert "ExportFailed" in env.kube.condition(ns, "bge-m3", "ModelReady")["message"]
    second = env.running_quantizer()  # the Job controller's retry, after its backoff
    assert second["metadata"]["name"] != first["metadata"]["name"]
    env.finish_quantizer(ok=False, message=refused("ExportFailed", "torch.onnx.export: unsupported op"))
    env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "ExportFailed")
    assert len(env.kube.jobs(ns)) == 1 and status(env)["pendingArtifact"]["attempts"] == 1


def test_a_spec_fix_that_keeps_the_artifact_still_retries(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model())
    env.finish_quantizer(ok=False, message=refused("ModelNotFound", "401: gated repository; is the token right?"))
    env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "ModelNotFound")
    env.kube.patch_spec(ns, "bge-m3", {"model": {"tokenSecretRef": {"name": "hf-fixed", "key": "token"}}})
    pod = env.running_quantizer()
    assert pod["metadata"]["labels"]["job-name"].endswith("-2")  # attempt 2 of the same artifact
    eventually(lambda: [j["metadata"]["annotations"]["rerank.io/attempt"] for j in env.kube.jobs(ns)] == ["2"],
               30, "the failed attempt to be cleaned up")
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")


def test_quality_gate_exit_code_fails_the_job_at_once_despite_retries_left(rrm_env: Env) -> None:
    """Retrying cannot change a quality verdict: the quantizer's exit code for it ends the Job (podFailurePolicy)."""

    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model(quantization={"backoffLimit": 3}))
    env.finish_quantizer(ok=False, message=refused("QualityGateFailed", "top-k agreement 0.889 < 0.9"),
                         exit_code=quantize_job.EXIT_CODES["QualityGateFailed"])
    env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "QualityGateFailed")

    def job_failed_by_policy() -> Any:
        jobs = env.kube.jobs(ns)
        conds = [c for j in jobs for c in (j["status"].get("conditions") or []) if c["type"] == "Failed"]
        return conds if conds and conds[0]["status"] == "True" else None

    conds = eventually(job_failed_by_policy, 60, "the Job to fail by its pod failure policy")
    assert conds[0]["reason"] == "PodFailurePolicy"
    pods = env.kube.pods(ns, "app.kubernetes.io/component=quantizer")
    assert len(pods) == 1  # no second attempt with backoff


def test_a_hub_outage_is_retried_by_new_jobs_until_the_hub_answers(rrm_env: Env) -> None:
    """HubUnavailable fails the Job at once (podFailurePolicy: the quantizer already retried within seconds); the
    operator starts the next attempt after its backoff, again and again, until one succeeds, with no spec edit."""
    env, ns = rrm_env, rrm_env.namespace
    env.operator.stop()
    env.operator.extra_args = [*env.operator.extra_args, "--hub-retry-seconds", "2", "--hub-retry-max-seconds", "4"]
    env.operator.start()
    env.kube.create_model(env.model())
    down = "https://huggingface.co did not answer for BAAI/bge-reranker-v2-m3 after 4 attempts (ConnectionError)"
    code = quantize_job.EXIT_CODES["HubUnavailable"]
    pods = []
    for _ in (1, 2):
        pods.append(env.finish_quantizer(ok=False, message=refused("HubUnavailable", down), exit_code=code))
        cond = env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "HubUnavailable", timeout=30)
        assert down in cond["message"] and "nothing in the spec needs to change" in cond["message"]
    assert status(env)["phase"] == "Quantizing"

    third = env.running_quantizer()  # the operator's own attempt 3, after the backoff
    # Each pod is a new Job's (the operator's attempts), never the Job controller's retry within the failed Job.
    assert len({p["metadata"]["labels"]["job-name"] for p in [*pods, third]}) == 3
    assert third["metadata"]["labels"]["job-name"].endswith("-3")
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    body = env.kube.model(ns, "bge-m3")
    assert body is not None and body["metadata"]["generation"] == 1  # nobody edited the spec
    assert status(env)["artifact"]["id"] == third["metadata"]["labels"]["rerank.io/artifact"]
    eventually(lambda: len(env.kube.jobs(ns)) == 1, 30, "the failed attempts' Jobs are cleaned up")
