"""The operator on the real control plane: a RerankModel from apply to serving, spec changes, idle reconciles.

The operator runs as a subprocess of ``rerank-operator`` under exactly the RBAC of rbac_rules.yaml; kwok runs the
pods; the quantizer's pod is finished by the test with the termination message the real Job would write.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rerank_contracts import artifact_layout, quantize_job
from tests.cluster.rrm_harness import Env, audit_now, eventually

pytestmark = pytest.mark.cluster


def template(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]


def artifact_of(dep: dict[str, Any] | None) -> str | None:
    return (template(dep)["metadata"].get("annotations") or {}).get("rerank.io/artifact") if dep else None


def ready_pods(env: Env, component: str) -> int:
    pods = env.kube.pods(env.namespace, f"app.kubernetes.io/instance=bge-m3,app.kubernetes.io/component={component}")
    return sum(1 for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                      for c in p["status"].get("conditions") or ()))


def serve(env: Env, **spec: Any) -> str:
    """Create bge-m3, finish its first Job, wait until Ready; returns the artifact id."""
    env.kube.create_model(env.model(**spec))
    pod = env.finish_quantizer(ok=True)
    env.kube.wait_condition(env.namespace, "bge-m3", "Ready", "True", "Serving")
    return str(pod["metadata"]["labels"]["rerank.io/artifact"])


def test_full_lifecycle_and_idle_reconcile_makes_no_writes(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    env.kube.create_model(env.model())

    # The Job: the quantizer's command line (read back with the quantizer's own parser) and the volume.
    [job] = eventually(lambda: env.kube.jobs(ns), what="the quantization Job")
    pod_spec = job["spec"]["template"]["spec"]
    container = pod_spec["containers"][0]
    request = quantize_job.parse_args(container["args"])
    assert (request.model, request.revision) == ("BAAI/bge-reranker-v2-m3", "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e")
    assert request.artifact_id == job["metadata"]["labels"]["rerank.io/artifact"]
    assert request.output_root == artifact_layout.VOLUME_MOUNT_PATH
    volume = next(v for v in pod_spec["volumes"] if v.get("persistentVolumeClaim"))
    assert volume["persistentVolumeClaim"]["claimName"] == "bge-m3-models"
    assert any(m["mountPath"] == artifact_layout.VOLUME_MOUNT_PATH and m["name"] == volume["name"]
               for m in container["volumeMounts"])
    assert job["metadata"]["ownerReferences"][0]["kind"] == "RerankModel"
    env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "Quantizing")
    assert env.kube.deployment(ns, "bge-m3-cpu") is None  # nothing to serve before the artifact exists

    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    body = env.kube.model(ns, "bge-m3")
    assert body is not None
    status = body["status"]
    artifact = status["artifact"]
    assert artifact["id"] == request.artifact_id and artifact["quality"]["spearman"] == 0.994
    assert artifact["manifestSha256"] == "cd" * 32 and artifact["sizeBytes"] == 580_123_456
    assert status["phase"] == "Ready" and status["traffic"]["gpuPercent"] == 100
    for pool, subdir in (("cpu", artifact_layout.CPU_SUBDIR), ("gpu", artifact_layout.ORIGINAL_SUBDIR)):
        dep = env.kube.deployment(ns, f"bge-m3-{pool}")
        assert dep is not None and dep["status"]["readyReplicas"] == 1
        mount = next(m for m in template(dep)["spec"]["containers"][0]["volumeMounts"] if m.get("subPath"))
        assert mount["subPath"] == f"artifacts/{artifact['id']}/{subdir}" and mount["readOnly"]
        assert env.kube.exists("Service", ns, f"bge-m3-{pool}")
        assert status["pools"][pool]["readyReplicas"] == 1
    assert env.kube.exists("Service", ns, "bge-m3")
    assert ready_pods(env, "cpu-pool") == 1 and ready_pods(env, "gpu-pool") == 1

    printed = env.cluster.kubectl_run("get", "rrm", "bge-m3", "-n", ns).stdout.split("\n")
    assert printed[0].split() == ["NAME", "READY", "PHASE", "MODEL", "CPU", "GPU", "GPU%", "ARTIFACT", "AGE"]
    assert printed[1].split()[:8] == ["bge-m3", "True", "Ready", "BAAI/bge-reranker-v2-m3@953dc6f6f85a",
                                      "1", "1", "100", "built"]
    events = json.loads(env.cluster.kubectl_run("get", "events", "-n", ns, "-o", "json",
                                                "--field-selector", "involvedObject.name=bge-m3").stdout)["items"]
    assert {"QuantizationStarted", "ArtifactPublished", "Ready"} <= {e["reason"] for e in events}

    # Idle: several resyncs later, not one call by the operator (kopf included), reads included: everything a
    # reconcile reads comes from the watches (per the audit log, which keeps all of the operator's calls).
    env.operator.settle()  # the last status/event writes of the transition have landed
    since = audit_now()
    writes_before = env.operator.metric_sum("rerank_operator_api_writes_total")
    reconciles = env.operator.resyncs(5)
    writes = env.operator_writes(since)
    requests = env.operator_requests(since)
    assert reconciles >= 4, "the resync timer did not run"
    assert writes == [], [(w["verb"], w["objectRef"]) for w in writes]
    assert requests == [], [(r["verb"], r["requestURI"]) for r in requests]
    assert env.operator.metric_sum("rerank_operator_api_writes_total") == writes_before
    print(f"\nIDLE RECONCILE: {reconciles:.0f} reconciles, {len(requests)} API calls (audit log)")


def test_scaling_does_not_requantize(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    artifact_id = serve(env)
    env.kube.patch_spec(ns, "bge-m3", {"pools": {"cpu": {"minReplicas": 3}},
                                       "quantization": {"resources": {"requests": {"cpu": "4"}}}})
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    dep = env.kube.deployment(ns, "bge-m3-cpu")
    assert dep is not None and dep["spec"]["replicas"] == 3 and artifact_of(dep) == artifact_id
    assert len(env.kube.jobs(ns)) == 1
    assert env.kube.model(ns, "bge-m3")["status"]["pools"]["cpu"]["readyReplicas"] == 3  # type: ignore[index]


def test_new_revision_builds_one_job_and_rolls_without_downtime(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    old = serve(env, pools={"cpu": {"minReplicas": 2, "maxReplicas": 8}})
    env.kube.patch_spec(ns, "bge-m3", {"model": {"revision": "a3f2b1c0d9e8"}})
    env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "Quantizing")
    new_pod = env.running_quantizer()
    new = new_pod["metadata"]["labels"]["rerank.io/artifact"]
    assert new != old
    env.operator.resyncs(2)  # a few resyncs: still exactly one Job for the new artifact, old one still serving
    assert [j["metadata"]["labels"]["rerank.io/artifact"] for j in env.kube.jobs(ns)].count(new) == 1
    assert artifact_of(env.kube.deployment(ns, "bge-m3-cpu")) == old
    assert env.kube.condition(ns, "bge-m3", "PoolsAvailable")["status"] == "True"
    assert env.kube.model(ns, "bge-m3")["status"]["phase"] == "Progressing"  # type: ignore[index]

    env.finish_quantizer(ok=True, artifact_id=new)
    lowest = 2

    def rolled() -> bool:
        nonlocal lowest
        lowest = min(lowest, ready_pods(env, "cpu-pool"))
        dep = env.kube.deployment(ns, "bge-m3-cpu")
        ready = env.kube.condition(ns, "bge-m3", "Ready")
        return artifact_of(dep) == new and ready.get("status") == "True"
    eventually(rolled, 60, "the CPU pool to roll to the new artifact", every=0.1)
    dep = env.kube.deployment(ns, "bge-m3-cpu")
    assert dep is not None and dep["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert lowest >= 2, f"ready CPU replicas dropped to {lowest} during the rollout"
    assert env.kube.model(ns, "bge-m3")["status"]["artifact"]["id"] == new  # type: ignore[index]
    eventually(lambda: [j["metadata"]["labels"]["rerank.io/artifact"] for j in env.kube.jobs(ns)] == [new],
               30, "the superseded Job to be cleaned up")


def test_disabling_the_gpu_pool_removes_it(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    serve(env)
    env.kube.patch_spec(ns, "bge-m3", {"pools": {"gpu": {"enabled": False}}})
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True")
    eventually(lambda: not env.kube.exists("Deployment", ns, "bge-m3-gpu")
               and not env.kube.exists("Service", ns, "bge-m3-gpu"), 30, "the GPU pool's children to go")
    status = env.kube.model(ns, "bge-m3")["status"]  # type: ignore[index]
    assert status["traffic"]["cpuPercent"] == 100 and "gpu" not in status["pools"]


def test_other_managers_fields_are_not_fought_over(rrm_env: Env) -> None:
    env, ns = rrm_env, rrm_env.namespace
    serve(env, autoscaling={"enabled": True, "replicaManagement": "external"})
    env.operator.settle()
    since = audit_now()
    env.cluster.kubectl_run("scale", "deployment", "bge-m3-cpu", "-n", ns, "--replicas=3")  # as an HPA would
    env.cluster.kubectl_run("annotate", "deployment", "bge-m3-cpu", "-n", ns, "team.example.com/owner=search")
    env.cluster.kubectl_run("annotate", "rerankmodel", "bge-m3", "-n", ns, "team.example.com/ticket=SRCH-42")
    env.cluster.kubectl_run("label", "rerankmodel", "bge-m3", "-n", ns, "tier=gold")
    eventually(lambda: (env.kube.deployment(ns, "bge-m3-cpu") or {}).get("status", {}).get("readyReplicas") == 3,
               30, "3 ready CPU replicas")
    env.operator.resyncs(4)
    dep = env.kube.deployment(ns, "bge-m3-cpu")
    assert dep is not None and dep["spec"]["replicas"] == 3
    assert dep["metadata"]["annotations"]["team.example.com/owner"] == "search"
    own = [w for w in env.operator_writes(since) if w["objectRef"]["resource"] != "events"]
    # Only status updates noticing the new replica counts; no write to the Deployment, none to the model itself
    # (kopf ignores annotation and label changes: its diff base is the spec).
    assert {(w["verb"], w["objectRef"]["resource"], w["objectRef"].get("subresource")) for w in own} <= {
        ("patch", "rerankmodels", "status")}
    status = env.kube.model(ns, "bge-m3")["status"]  # type: ignore[index]
    assert status["pools"]["cpu"]["readyReplicas"] == 3
