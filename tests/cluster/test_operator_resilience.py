"""Restarts, deletion and garbage collection, several models at once, and Gateway API routing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from kubernetes import client

from rerank_devcluster.cluster import Cluster
from tests.cluster.rrm_harness import (
    Env,
    Identity,
    Kube,
    OperatorProcess,
    cleanup,
    eventually,
    published,
    static_pv,
)

pytestmark = pytest.mark.cluster


def test_operator_killed_mid_flow_creates_no_duplicates(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model())
    env.running_quantizer()
    env.operator.kill()
    env.operator.start()
    env.operator.resyncs(3)  # resume + resyncs
    assert len(env.kube.jobs(ns)) == 1
    env.finish_quantizer(ok=True)
    env.operator.kill()  # the Job finished while the operator was down
    time.sleep(1)
    env.operator.start()
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    assert len(env.kube.jobs(ns)) == 1
    for kind, name in (("Deployment", "bge-m3-cpu"), ("Deployment", "bge-m3-gpu"), ("Service", "bge-m3"),
                       ("PersistentVolumeClaim", "bge-m3-models")):
        assert env.kube.exists(kind, ns, name)
    assert len(env.kube.pods(ns, "app.kubernetes.io/component=cpu-pool")) == 1


@pytest.mark.parametrize("policy,claim_survives", [("Delete", False), ("Retain", True)])
def test_deletion_garbage_collects_children_honouring_reclaim_policy(rrm_env: Env, policy: str,
                                                                     claim_survives: bool) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model(storage={"reclaimPolicy": policy}))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True")
    job = env.kube.jobs(ns)[0]["metadata"]["name"]  # named now: garbage collection may take it any moment after
    env.kube.delete_model(ns, "bge-m3")
    eventually(lambda: env.kube.model(ns, "bge-m3") is None, 30, "the RerankModel to go (no finalizer holds it)")
    children = [("Deployment", "bge-m3-cpu"), ("Deployment", "bge-m3-gpu"), ("Service", "bge-m3"),
                ("Service", "bge-m3-cpu"), ("Job", job)]
    eventually(lambda: not any(env.kube.exists(k, ns, n) for k, n in children), 60, "garbage collection")
    time.sleep(2)
    assert env.kube.exists("PersistentVolumeClaim", ns, "bge-m3-models") is claim_survives


@pytest.fixture
def two_namespaces(cluster: Cluster, kube: client.ApiClient, operator_identity: Identity) -> Iterator[list[Env]]:
    names = []
    for i in range(2):
        ns = f"t-multi-{int(time.time() * 1000) % 10**8}-{i}"
        cluster.kubectl_run("create", "namespace", ns)
        static_pv(cluster, f"pv-{ns}", ns)
        names.append(ns)
    operator = OperatorProcess(cluster, operator_identity, names).start()
    envs = [Env(cluster, Kube(cluster, kube), ns, ns, operator) for ns in names]
    try:
        yield envs
    finally:
        cleanup(envs[0], names)
        for ns in names:
            cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
            cluster.kubectl_run("delete", "pv", f"pv-{ns}", "--wait=false", check=False)


def test_two_models_in_two_namespaces(two_namespaces: list[Env]) -> None:
    a, b = two_namespaces
    a.kube.create_model(a.model())
    b.kube.create_model(b.model(pools={"gpu": {"enabled": False}}, routing={"policy": "cpu-only"}))
    pod_a, pod_b = a.running_quantizer(), b.running_quantizer()
    # Same model and recipe: the same artifact id, but each namespace builds on its own volume.
    assert pod_a["metadata"]["labels"]["rerank.io/artifact"] == pod_b["metadata"]["labels"]["rerank.io/artifact"]
    b.finish_quantizer(ok=True)
    b.kube.wait_condition(b.namespace, "bge-m3", "Ready", "True")
    assert a.kube.condition(a.namespace, "bge-m3", "Ready")["reason"] == "Quantizing"
    a.finish_quantizer(ok=True)
    a.kube.wait_condition(a.namespace, "bge-m3", "Ready", "True")
    assert a.kube.deployment(a.namespace, "bge-m3-gpu") is not None
    assert b.kube.deployment(b.namespace, "bge-m3-gpu") is None
    assert [len(e.kube.jobs(e.namespace)) for e in (a, b)] == [1, 1]


def route_weights(env: Env) -> dict[str, int]:
    route = client.CustomObjectsApi(env.kube.api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", env.namespace, "httproutes", "bge-m3")
    return {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}


def test_httproute_carries_the_policy_weights(rrm_env: Env, gateway_api_installed: list[str]) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model(routing={"policy": "fixed", "weights": {"gpu": 70, "cpu": 30},
                                             "gateway": {"parentRefs": [{"name": "edge"}],
                                                         "hostnames": ["rerank.example.com"]}}))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True")
    eventually(lambda: route_weights(env) == {"bge-m3-gpu": 70, "bge-m3-cpu": 30}, 30, "weights 70/30")
    traffic = env.kube.model(ns, "bge-m3")["status"]["traffic"]  # type: ignore[index]
    assert traffic == {**traffic, "gpuPercent": 70, "cpuPercent": 30, "enforced": True}

    env.kube.patch_spec(ns, "bge-m3", {"routing": {"policy": "cpu-only", "weights": None}})
    eventually(lambda: route_weights(env) == {"bge-m3-gpu": 0, "bge-m3-cpu": 100}, 30, "weights 0/100")
    env.kube.patch_spec(ns, "bge-m3", {"routing": {"gateway": None}})
    eventually(lambda: not client.CustomObjectsApi(env.kube.api).list_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", ns, "httproutes")["items"], 30, "the HTTPRoute to be removed")


def test_a_result_lost_with_its_pod_is_recovered_without_a_second_quantization(rrm_env: Env) -> None:
    """The Job succeeds while the operator is down and its pod is removed before the operator returns (a node scaled
    away, pod garbage collection): the result lived only in the pod's termination message. The operator starts the
    next attempt of the same artifact, which finds it published on the volume and answers at once with the
    manifest's figures (AlreadyPublished; tests/quantizer/test_gate_and_publish.py shows the real quantizer does so
    without exporting again); the model converges to Ready instead of failing for good."""
    from rerank_contracts import artifact_layout, quantize_job

    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model())
    first = env.running_quantizer()
    artifact_id = first["metadata"]["labels"]["rerank.io/artifact"]
    first_job = env.kube.jobs(ns)[0]
    env.operator.kill()
    env.cluster.finish_pod(ns, first["metadata"]["name"], 0, published(artifact_id))
    eventually(lambda: any(c["type"] == "Complete" and c["status"] == "True"
                           for c in (env.kube.jobs(ns)[0]["status"].get("conditions") or [])),
               60, "the Job to complete")
    env.cluster.kubectl_run("delete", "pod", "-n", ns, first["metadata"]["name"], "--grace-period=0", "--force")
    eventually(lambda: not env.kube.pods(ns, "app.kubernetes.io/component=quantizer"), 30, "the pod to be gone")
    env.operator.start()

    second = env.running_quantizer(artifact_id)
    assert second["metadata"]["labels"]["job-name"].endswith("-2")  # attempt 2 of the same artifact
    [second_job] = [j for j in env.kube.jobs(ns) if j["metadata"]["name"] == second["metadata"]["labels"]["job-name"]]
    container = second_job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == first_job["spec"]["template"]["spec"]["containers"][0]["args"]
    cond = env.kube.condition(ns, "bge-m3", "ModelReady")
    assert (cond["status"], cond["reason"]) == ("False", "RecoveringResult"), cond
    already = quantize_job.JobResult(ok=True, reason="AlreadyPublished",
                                 message=f"artifact {artifact_id} already published", artifact_id=artifact_id,
                                 path=artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, artifact_id),
                                 manifest_sha256="cd" * 32, size_bytes=580_123_456,
                                 quality={"spearman": 0.994}, speed={"speedup": 2.88}).to_message()
    env.finish_quantizer(ok=True, message=already, artifact_id=artifact_id)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    status = env.kube.model(ns, "bge-m3")["status"]  # type: ignore[index]
    assert status["artifact"]["id"] == artifact_id and status["artifact"]["quality"] == {"spearman": 0.994}
    assert "pendingArtifact" not in status or not status["pendingArtifact"]
    eventually(lambda: [j["metadata"]["name"] for j in env.kube.jobs(ns)] == [second_job["metadata"]["name"]], 30,
               "the recovered attempt 1 to be cleaned up")
    events = env.cluster.kubectl_run("get", "events", "-n", ns, "-o", "json").stdout
    assert events.count('"reason": "ArtifactPublished"') == 1  # one event per fact


def test_a_model_holding_an_older_versions_finalizer_is_released_on_deletion(rrm_env: Env) -> None:
    """Older versions kept kopf's finalizer ``rerank.io/finalizer`` on every model; this one needs none, and its
    reconcile removes it (a JSON patch), so deleting such a model is not blocked forever."""
    env, ns = rrm_env, rrm_env.namespace
    body = env.model()
    body["metadata"]["finalizers"] = ["rerank.io/finalizer"]
    env.kube.create_model(body)
    eventually(lambda: not (env.kube.model(ns, "bge-m3") or {}).get("metadata", {}).get("finalizers"), 30,
               "the old finalizer to be removed")
    env.kube.delete_model(ns, "bge-m3")
    eventually(lambda: env.kube.model(ns, "bge-m3") is None, 30, "the RerankModel to go")
