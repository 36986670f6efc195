"""Shared artifacts on the real control plane, with a real OCI registry as the store (issue 44).

A RerankClass names an artifact store: the dev cluster's distribution registry (deletes enabled) and a namespace for
its Jobs. The operator runs over all namespaces (the collector counts every model's use). The quantizer is played
by the test, as everywhere in this tier (kwok runs no container): it pushes a small artifact to the registry with
the quantizer's own push code, then ends the Job's pod with the result. The fetch is the real init container's
command line, run here against the real registry.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rerank_contracts import artifact_layout, oci, shared_store
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.operator_process import published_shared, shared_artifact
from rerank_devcluster.registry import LocalRegistry, standalone
from rerank_operator.adapters.artifact_store import RECENTLY_ASKED_SECONDS
from tests.cluster.rrm_harness import (
    GROUP,
    VERSION,
    Identity,
    OperatorProcess,
    eventually,
    rerank_model,
    static_pv,
)

pytestmark = pytest.mark.cluster

STORE_NS = "rerank-artifacts"
REPOSITORY = "rerank/artifacts"
CPU_ONLY = {"cpu": {"minReplicas": 1, "maxReplicas": 2}, "gpu": {"enabled": False}}
GRACE_SECONDS = 4


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRegistry]:
    with standalone(tmp_path_factory.mktemp("store"), delete=True) as running:
        yield running


@pytest.fixture
def world(cluster: Cluster, kube: client.ApiClient, operator_identity: Identity,
          registry: LocalRegistry) -> Iterator[dict[str, Any]]:
    """Two tenant namespaces, the store's namespace, a class with the store, an all-namespaces operator."""
    suffix = uuid.uuid4().hex[:6]
    tenants = [f"ta-{suffix}", f"tb-{suffix}"]
    for ns in [*tenants, STORE_NS]:
        cluster.kubectl_run("create", "namespace", ns, check=False)
    for ns in tenants:
        static_pv(cluster, f"pv-{ns}", ns)
    class_name = f"shared-{suffix}"
    api = client.CustomObjectsApi(kube)
    api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": class_name},
        "spec": {"artifactStore": {"repository": f"{registry.host}/{REPOSITORY}", "namespace": STORE_NS,
                                   "insecure": True, "unusedGraceSeconds": GRACE_SECONDS}}})
    operator = OperatorProcess(cluster, operator_identity, [], name=f"shared-{suffix}",
                               extra_args=["--artifact-gc-seconds", "1",
                                           "--artifact-fetcher-image", "registry.example.com/rerank-operator:1"])
    operator.start()
    try:
        yield {"tenants": tenants, "class": class_name, "api": api, "operator": operator}
    finally:
        for ns in tenants:
            cluster.kubectl_run("delete", "rerankmodels", "--all", "-n", ns, "--wait=true", "--timeout=60s",
                                check=False)
        operator.stop()
        api.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", class_name)
        cluster.kubectl_run("delete", "jobs", "--all", "-n", STORE_NS, "--wait=false", check=False)
        for ns in tenants:
            cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
            cluster.kubectl_run("delete", "pv", f"pv-{ns}", "--wait=false", check=False)


def shared_model(name: str, ns: str, class_name: str, **spec: Any) -> dict[str, Any]:
    body = rerank_model(name, ns, ns, pools=CPU_ONLY, **spec)
    body["spec"]["className"] = class_name
    body["spec"]["model"].pop("tokenSecretRef")  # a hub token makes an artifact private (sharing.private_reason)
    return body


def apply(cluster: Cluster, body: dict[str, Any]) -> None:
    cluster.apply([body])


def status_of(kube: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(kube).get_namespaced_custom_object(GROUP, VERSION, ns, "rerankmodels", name)
    return dict(obj.get("status") or {})


def store_jobs(kube: client.ApiClient) -> list[Any]:
    return list(client.BatchV1Api(kube).list_namespaced_job(STORE_NS, label_selector="rerank.io/shared=true").items)


def play_shared_quantizer(cluster: Cluster, kube: client.ApiClient, registry: LocalRegistry,
                          tmp: Path) -> tuple[str, str]:
    """The one shared Job's pod: push its artifact to the store, then end with the result. Returns (id, ref)."""
    def running() -> Any:
        pods = client.CoreV1Api(kube).list_namespaced_pod(STORE_NS, label_selector="rerank.io/shared=true").items
        live = [p for p in pods if p.status.phase == "Running"]
        return live[0] if len(live) == 1 else None
    pod = eventually(running, 60, "the shared Job's running pod")
    artifact_id = pod.metadata.labels["rerank.io/artifact"]
    args = pod.spec.containers[0].args
    assert args[args.index("--push-repository") + 1] == f"{registry.host}/{REPOSITORY}" and "--push-insecure" in args
    ref = shared_store.push(shared_artifact(tmp, artifact_id), REPOSITORY, artifact_id,
                     registry=oci.Registry(registry.host, insecure=True), scratch=tmp / "scratch")
    cluster.finish_pod(STORE_NS, pod.metadata.name, 0, published_shared(artifact_id, ref))
    return artifact_id, ref


def test_two_namespaces_share_one_job_and_one_artifact_and_a_tampered_store_refuses_to_serve(
        cluster: Cluster, kube: client.ApiClient, registry: LocalRegistry, world: dict[str, Any],
        tmp_path: Path) -> None:
    a, b = world["tenants"]
    apply(cluster, shared_model("m", a, world["class"]))
    apply(cluster, shared_model("m", b, world["class"]))
    artifact_id, ref = play_shared_quantizer(cluster, kube, registry, tmp_path)
    for ns in (a, b):
        def served(ns: str = ns) -> Any:
            art = status_of(kube, ns, "m").get("artifact") or {}
            return art if art.get("id") == artifact_id else None
        art = eventually(served, 60, f"{ns}/m served from the store")
        assert art["source"] == "shared" and art["ref"] == ref
        assert art["parts"] == [artifact_layout.CPU_SUBDIR, artifact_layout.ORIGINAL_SUBDIR]
        assert ref.startswith(f"{registry.host}/{REPOSITORY}@sha256:")
    jobs = store_jobs(kube)
    assert [j.metadata.name for j in jobs] == [f"rerank-artifact-{artifact_id}-1"], "one Job for both namespaces"
    for ns in (a, b):  # no Job and no claim of the tenant's own
        assert client.BatchV1Api(kube).list_namespaced_job(ns).items == []
        assert client.CoreV1Api(kube).list_namespaced_persistent_volume_claim(ns).items == []
    # The pools fetch it: the init container the operator wrote, run here against the real registry.
    deployment = client.AppsV1Api(kube).read_namespaced_deployment("m-cpu", a)
    pod_spec = deployment.spec.template.spec
    init = pod_spec.init_containers[0]
    assert init.name == "fetch-artifact" and init.image == "registry.example.com/rerank-operator:1"
    assert [v.empty_dir is not None for v in pod_spec.volumes if v.name == "models"] == [True]
    args = list(init.args)
    into = tmp_path / "pod" / "artifacts" / artifact_id
    args[args.index("--into") + 1] = str(into)
    log = tmp_path / "termination-log"
    assert shared_store.main([*args, "--termination-log", str(log)]) == 0
    assert (into / artifact_layout.CPU_SUBDIR / "model.onnx").read_bytes() == b"onnx" * 1000
    assert not (into / artifact_layout.ORIGINAL_SUBDIR).exists(), "the CPU pool fetches only its part"
    # A blob changed in the store's storage: the same init container refuses, and leaves nothing to serve.
    manifest = json.loads(oci.Registry(registry.host, insecure=True).get_manifest(REPOSITORY, ref.split("@")[1])[0])
    layer = next(x for x in manifest["layers"]
                 if x["annotations"]["org.opencontainers.image.title"] == artifact_layout.CPU_SUBDIR)
    digest = layer["digest"].split(":")[1]
    blob = registry.root / "storage" / "docker/registry/v2/blobs/sha256" / digest[:2] / digest / "data"
    data = bytearray(blob.read_bytes())
    data[-2000] ^= 0xFF  # inside the model's bytes, same size
    blob.write_bytes(bytes(data))
    into2 = tmp_path / "pod2" / "artifacts" / artifact_id
    args[args.index("--into") + 1] = str(into2)
    assert shared_store.main([*args, "--termination-log", str(log)]) == shared_store.EXIT_CODES["ChecksumMismatch"]
    assert json.loads(log.read_text())["reason"] == "ChecksumMismatch"
    assert not into2.exists() and list((tmp_path / "pod2" / "artifacts").iterdir()) == []
    # The pod whose init container said so is not ready, and the model's Ready says why (the fetcher's reason).
    core = client.CoreV1Api(kube)
    pod = core.list_namespaced_pod(a, label_selector="rerank.io/pool=cpu").items[0]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_namespaced_pod_status(pod.metadata.name, a, {"status": {
        "phase": "Pending",
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now},
                       {"type": "ContainersReady", "status": "False", "lastTransitionTime": now}],
        "initContainerStatuses": [{
            "name": "fetch-artifact", "image": init.image, "imageID": "", "ready": False, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 20, "reason": "Error", "message": log.read_text(),
                                         "startedAt": now, "finishedAt": now}}}]}})

    def refused() -> Any:
        ready = next((c for c in status_of(kube, a, "m").get("conditions") or () if c["type"] == "Ready"), {})
        return ready if ready.get("reason") == "ChecksumMismatch" else None
    ready = eventually(refused, 60, "Ready=False ChecksumMismatch on the model")
    assert ready["status"] == "False" and pod.metadata.name in ready["message"]


def test_a_tenant_private_evaluation_set_is_never_shared(cluster: Cluster, kube: client.ApiClient,
                                                         world: dict[str, Any]) -> None:
    a, _ = world["tenants"]
    cluster.kubectl_run("create", "configmap", "pairs", "-n", a, "--from-literal=pairs.jsonl={}")
    apply(cluster, shared_model("private", a, world["class"],
                                quantization={"evaluationData": {"configMapRef": {"name": "pairs",
                                                                                  "key": "pairs.jsonl"}}}))

    def own_job() -> Any:
        jobs = client.BatchV1Api(kube).list_namespaced_job(a).items
        return jobs[0] if jobs else None
    job = eventually(own_job, 60, "the private model's own Job")
    assert job.metadata.name.startswith("private-q-")
    assert store_jobs(kube) == [], "nothing of it reaches the store's namespace"
    volumes = {v.name for v in job.spec.template.spec.volumes}
    assert "evaluation-data" in volumes
    assert "--push-repository" not in job.spec.template.spec.containers[0].args
    pending = eventually(lambda: status_of(kube, a, "private").get("pendingArtifact"), 30, "pendingArtifact")
    assert pending["job"] == job.metadata.name


def test_the_last_users_deletion_frees_the_artifact_after_the_grace_period(
        cluster: Cluster, kube: client.ApiClient, registry: LocalRegistry, world: dict[str, Any],
        tmp_path: Path) -> None:
    a, b = world["tenants"]
    for ns in (a, b):
        # another gate: another artifact than the first test's
        apply(cluster, shared_model("g", ns, world["class"], quantization={"qualityGate": {"minSpearman": 0.98}}))
    artifact_id, _ = play_shared_quantizer(cluster, kube, registry, tmp_path)
    reg = oci.Registry(registry.host, insecure=True)
    for ns in (a, b):
        eventually(lambda ns=ns: (status_of(kube, ns, "g").get("artifact") or {}).get("id") == artifact_id, 60,
                   f"{ns}/g served")
    cluster.kubectl_run("delete", "rerankmodel", "g", "-n", a, "--wait=true", "--timeout=60s")
    # Past the grace and the collector's guard for recent lookups, with one user left: kept.
    time.sleep(max(GRACE_SECONDS, RECENTLY_ASKED_SECONDS) + 3)
    assert reg.resolve(REPOSITORY, artifact_id) is not None, "a model still serves it"
    cluster.kubectl_run("delete", "rerankmodel", "g", "-n", b, "--wait=true", "--timeout=60s")
    gone_at = time.monotonic()
    # The grace, and the collector's guard for artifacts a reconcile looked up moments ago (the last, at the serve).
    eventually(lambda: reg.resolve(REPOSITORY, artifact_id) is None, GRACE_SECONDS + 90, "the unused artifact deleted")
    assert time.monotonic() - gone_at >= GRACE_SECONDS - 1, "deleted before its grace period"
    assert artifact_id not in reg.tags(REPOSITORY)
    eventually(lambda: not [j for j in store_jobs(kube) if j.metadata.labels["rerank.io/artifact"] == artifact_id
                            and not j.metadata.deletion_timestamp], 30, "its Job deleted")


def test_classes_on_two_cpu_node_pools_build_two_shared_artifacts_each_on_its_pool(
        cluster: Cluster, kube: client.ApiClient, registry: LocalRegistry, world: dict[str, Any]) -> None:
    """The same hub model under a class whose CPU pool is on AVX2 nodes and one on AMX nodes: two shared ids, two
    Jobs, each on its class's node pool (the recipe is chosen and timed for the CPU that will serve it)."""
    a, b = world["tenants"]
    api = world["api"]
    classes = {}
    for tenant, pool in ((a, "avx2"), (b, "amx")):
        name = f"{world['class']}-{pool}"
        api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": name},
            "spec": {"artifactStore": {"repository": f"{registry.host}/{REPOSITORY}", "namespace": STORE_NS,
                                       "insecure": True},
                     "pools": {"cpu": {"nodeSelector": {"cpu-pool": pool}}}}})
        classes[tenant] = (name, pool)
    try:
        for tenant, (name, _) in classes.items():
            apply(cluster, shared_model("same-model", tenant, name))
        jobs = eventually(lambda: (j if len(j := store_jobs(kube)) == 2 else None), 60, "two shared Jobs")
        by_pool = {job.spec.template.spec.node_selector["cpu-pool"]: job.metadata.labels["rerank.io/artifact"]
                   for job in jobs}
        assert set(by_pool) == {"avx2", "amx"} and by_pool["avx2"] != by_pool["amx"]
        for tenant, (_, pool) in classes.items():
            pending = eventually(lambda t=tenant: status_of(kube, t, "same-model").get("pendingArtifact"), 30,
                                 "pendingArtifact")
            assert pending["id"] == by_pool[pool]
            assert {j.metadata.labels.get("rerank.io/built-for") for j in jobs} == {a, b}
    finally:
        for tenant in classes:
            cluster.kubectl_run("delete", "rerankmodel", "same-model", "-n", tenant, "--wait=true", "--timeout=60s",
                                check=False)
        for name, _ in classes.values():
            api.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)
