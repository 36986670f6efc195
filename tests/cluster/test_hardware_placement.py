"""Artifacts true to the hardware that serves them (issue 61): the quantization Job runs where the CPU pool runs.

With ``target: auto`` the Job chooses its INT8 recipe for the CPU of the node it runs on and reports the speedup it
measured there; the CPU pool's nodes may be another CPU generation, or vendor, than the rest of the cluster. Here two
kwok node pools with a ``cpu-pool`` label (as a platform labels its node groups), and a class whose CPU pool selects
one of them: the model's own Job and its CPU pool land on the same pool, never the other.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_contracts import artifact_layout, cpu_target, quantize_job
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.waiting import eventually
from tests.cluster.rrm_harness import GROUP, VERSION, Env

pytestmark = pytest.mark.cluster

NODE_POOLS = {"kwok-avx2-0": {"labels": {"cpu-pool": "avx2"}, "allocatable": {}},
              "kwok-avx2-1": {"labels": {"cpu-pool": "avx2"}, "allocatable": {}},
              "kwok-amx-0": {"labels": {"cpu-pool": "amx"}, "allocatable": {}}}


@pytest.fixture(scope="module")
def cpu_node_pools(cluster: Cluster) -> dict[str, str]:
    cluster.add_nodes(NODE_POOLS)
    return {name: spec["labels"]["cpu-pool"] for name, spec in NODE_POOLS.items()}


@contextlib.contextmanager
def avx2_class(kube: client.ApiClient) -> Iterator[str]:
    custom = client.CustomObjectsApi(kube)
    name = f"avx2-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": name},
        "spec": {"pools": {"cpu": {"nodeSelector": {"cpu-pool": "avx2"}}}}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)


def test_the_job_runs_on_the_cpu_pools_nodes(rrm_env: Env, kube: client.ApiClient,
                                             cpu_node_pools: dict[str, str]) -> None:
    env = rrm_env
    with avx2_class(kube) as class_name:
        env.kube.create_model(env.model(className=class_name))
        quantizer = env.running_quantizer()
        assert quantizer["spec"].get("nodeSelector") == {"cpu-pool": "avx2"}
        assert cpu_node_pools.get(quantizer["spec"]["nodeName"]) == "avx2", quantizer["spec"]["nodeName"]
        env.finish_quantizer(ok=True)

        def cpu_pods() -> list[dict[str, object]] | None:
            pods = [p for p in env.kube.pods(env.namespace, "app.kubernetes.io/instance=bge-m3,rerank.io/pool=cpu")
                    if p["spec"].get("nodeName")]
            return pods or None

        pods = eventually(cpu_pods, 60, f"a scheduled CPU pool pod\n{env.describe()}")
        assert {cpu_node_pools.get(str(p["spec"]["nodeName"])) for p in pods} == {"avx2"}  # type: ignore[index]


def vnni_artifact(artifact_id: str) -> str:
    """The termination message of a Job that chose full-range INT8 weights on a VNNI CPU."""
    return quantize_job.JobResult(
        ok=True, reason="Published", message="published", artifact_id=artifact_id,
        path=artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, artifact_id), manifest_sha256="cd" * 32,
        size_bytes=1000, quality={"spearman": 0.995}, speed={"speedup": 2.3},
        recipe={"name": "dynamic-per-channel", "target": "avx512_vnni", "reduce_range": False,
                "cpu": {"model": "Intel(R) Xeon(R) Platinum 8480+", "machine": "x86_64", "target": "avx512_vnni",
                        "flags": ["amx_int8", "avx2", "avx512_vnni"]}}).to_message()


def test_a_pool_refuses_an_artifact_built_for_another_cpu(rrm_env: Env) -> None:
    """The Job chose full-range weights on a VNNI node; the CPU pool's pods check their node first and, on one
    without VNNI, stop before TEI with ArtifactTargetMismatch (the init container's reason, played here on the kwok
    pod as the kubelet would report it): the model's Ready condition names the node and what to change."""
    env = rrm_env
    env.kube.create_model(env.model())
    quantizer = env.running_quantizer()
    env.finish_quantizer(message=vnni_artifact(quantizer["metadata"]["labels"]["rerank.io/artifact"]))

    def checked() -> dict[str, object] | None:
        dep = env.kube.deployment(env.namespace, "bge-m3-cpu") or {}
        inits = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("initContainers") or []
        return inits[0] if inits else None

    init = eventually(checked, 60, f"the CPU pool's check\n{env.describe()}")
    assert init["name"] == "check-cpu" and init["args"] == ["--check-cpu", "avx512_vnni"]
    pods = eventually(lambda: [p for p in env.kube.pods(env.namespace, "app.kubernetes.io/instance=bge-m3,"
                                                                      "rerank.io/pool=cpu")
                               if p["spec"].get("nodeName")] or None, 60, "a scheduled CPU pod")
    pod = pods[0]
    node = pod["spec"]["nodeName"]
    said = json.dumps({"reason": "ArtifactTargetMismatch",
                       "message": f"node {node}: {cpu_target.mismatch('avx512_vnni', False, '', 'x86_64')}"})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    env.cluster.kubectl_run("patch", "pod", "-n", env.namespace, pod["metadata"]["name"], "--subresource=status",
                            "--type=merge", "-p", json.dumps({"status": {
                                "phase": "Pending",
                                "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now},
                                               {"type": "ContainersReady", "status": "False",
                                                "lastTransitionTime": now}],
                                "initContainerStatuses": [{
                                    "name": "check-cpu", "image": init["image"], "imageID": "", "ready": False,
                                    "restartCount": 1, "state": {"terminated": {
                                        "exitCode": 23, "reason": "Error", "message": said,
                                        "startedAt": now, "finishedAt": now}}}]}}))
    cond = env.kube.wait_condition(env.namespace, "bge-m3", "Ready", "False", "ArtifactTargetMismatch", timeout=60)
    assert node in cond["message"] and "VNNI" in cond["message"], cond
