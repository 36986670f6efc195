"""The node tier: the quantization Job's pod runs for real, under a real kubelet, next to the kwok nodes.

Everywhere else in tests/cluster, kwok fakes the pods and the tests write the quantizer's result into pod status.
Here the dev cluster's real node (containerd + runc + CNI + kubelet, :mod:`rerank_devcluster.realnode`) runs the
quantizer image (:mod:`rerank_devcluster.nodeimage`) as the operator wrote the pod: uid 65532 with fsGroup, a
read-only root filesystem, ``HOME``/``/tmp`` on an emptyDir, the model volume a local PersistentVolume the kubelet
mounts, the termination message the kubelet copies from the container's file, exit codes meeting the Job's
podFailurePolicy, memory limits enforced by the kernel, ``activeDeadlineSeconds``. The TEI pools still run on kwok
nodes (no TEI image here); only the quantizer's pods go to the real node, sent there by a MutatingAdmissionPolicy
for namespaces labelled ``rerank.io/quantize-on-real-node`` so the operator's pod spec stays its own.

Select with ``-m node``; the tier runs in the default suite (./hack/test).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from quantizer_job.steps.evaluation import evaldata
from quantizer_job.steps.storage import publish
from rerank_contracts import artifact_layout, guard, quantize_job
from rerank_devcluster import binaries, realnode
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.operator_release import OperatorRelease
from tests.cluster.rrm_harness import Env, Kube, _kubectl_apply, eventually

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.slow]

NAMESPACE_LABEL = "rerank.io/quantize-on-real-node"
MODEL_DIR = "sources/tiny-bert"
RUN_AS = 65532
CLAIM = "models"


@pytest.fixture(scope="session")
def real_node(cluster: Cluster) -> realnode.RealNode:
    """The real node, Ready, and the policy that sends quantizer pods of labelled namespaces to it."""
    node = cluster.add_real_node()
    _kubectl_apply(cluster, realnode.quantizer_placement_policy(NAMESPACE_LABEL))
    return node


def prepared_volume(root: Path) -> Path:
    """A volume directory as an admin hands it over: root-owned, 0755, a model under sources/. Only fsGroup
    (applied by the kubelet to local volumes) lets uid 65532 write its artifacts here."""
    from rerank_devcluster import devmodels

    root.mkdir(parents=True)
    root.chmod(0o755)
    devmodels.bert_cross_encoder(root / MODEL_DIR, seed=1)
    return root


class NodeEnv(Env):
    volume: Path
    image: str  # the quantizer image: in the dev cluster's registry, by digest, pulled by the real node
    release: OperatorRelease  # the operator: the chart's pod on the real node, from operator/Dockerfile's image

    def describe(self) -> str:
        models = self.cluster.kubectl_run("get", "rerankmodels", "-n", self.namespace, "-o", "yaml",
                                          check=False).stdout[-5000:]
        return f"{models}\n--- operator ---\n{self.release.describe()}"

    def model_body(self, name: str, quantization: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "apiVersion": "rerank.io/v1alpha1", "kind": "RerankModel",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "model": {"path": MODEL_DIR},
                "quantization": {"image": self.image, "backoffLimit": 0, "timeBudgetSeconds": 300,
                                 # a random tiny model: INT8 noise reorders more than on a trained reranker
                                 "qualityGate": {"minSpearman": 0.95, "minTopKAgreement": 0.8},
                                 **(quantization or {})},
                "storage": {"existingClaim": CLAIM},
                "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 2},
                          "gpu": {"minReplicas": 1, "maxReplicas": 1,
                                  "resources": {"limits": {"nvidia.com/gpu": 1}}}},
                "autoscaling": {"enabled": False},
            },
        }

    def quantizer_pods(self, name: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=quantizer"
        return self.kube.pods(self.namespace, selector)

    def terminated_quantizer(self, name: str, timeout: float = 240) -> dict[str, Any]:
        """The first quantizer pod of ``name`` whose container the kubelet reported as terminated."""
        def find() -> Any:
            for pod in self.quantizer_pods(name):
                for status in pod["status"].get("containerStatuses") or ():
                    if (status.get("state") or {}).get("terminated"):
                        return pod
            return None
        try:
            return eventually(find, timeout, f"a terminated quantizer pod of {name}", every=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}\n{self.cluster.log_tails(20)}") from None


@pytest.fixture
def node_env(cluster: Cluster, kube: client.ApiClient, real_node: realnode.RealNode, crds_installed: list[str],
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeEnv]:
    ns = f"n-{uuid.uuid4().hex[:8]}"
    cluster.kubectl_run("create", "namespace", ns)
    cluster.kubectl_run("label", "namespace", ns, f"{NAMESPACE_LABEL}=true")
    eventually(lambda: cluster.kubectl_run("get", "sa", "default", "-n", ns, check=False).returncode == 0,
               what="the namespace's default ServiceAccount")
    volume = prepared_volume(tmp_path_factory.mktemp("node-volume") / "v")
    nodes = [realnode.NAME, *(n for n in ("kwok-cpu-0", "kwok-cpu-1", "kwok-gpu-0"))]
    _kubectl_apply(cluster, [realnode.local_pv(f"pv-{ns}", ns, volume, nodes), {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": ns, "volumeName": f"pv-{ns}",
                 "resources": {"requests": {"storage": "1Gi"}}}}])
    # The operator as users run it: helm install of the chart, its pod on the real node (one replica: this node's
    # two CPUs also run the quantizer), watching this namespace only.
    release = OperatorRelease(cluster, ns, f"op-{ns}", real_node.images.operator.name, watch_namespaces=[ns],
                              extra_values={"tenantRoles": {"enabled": False}}, helm_flags=("--skip-crds",))
    release.install(tmp_path_factory.mktemp("release"))
    env = NodeEnv(cluster, Kube(cluster, kube), ns, ns, None)  # type: ignore[arg-type]  # no host process here
    env.volume, env.image, env.release = volume, real_node.images.quantizer_image, release
    try:
        yield env
    finally:
        # Models first, while the operator runs (it removes their finalizers), then the operator.
        cluster.kubectl_run("delete", "rerankmodels", "--all", "-n", ns, "--wait=true", "--timeout=60s", check=False)
        release.uninstall()
        cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
        cluster.kubectl_run("delete", "pv", f"pv-{ns}", "--wait=false", check=False)
        shutil.rmtree(volume, ignore_errors=True)


def quantizer_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in pod["status"]["containerStatuses"] if s["name"] == "quantizer")


def test_job_runs_on_the_real_node_and_the_pools_roll_to_its_artifact(node_env: NodeEnv) -> None:
    env, ns = node_env, node_env.namespace
    started = time.monotonic()
    env.kube.create_model(env.model_body("tiny"))
    pod = env.terminated_quantizer("tiny")
    assert pod["spec"]["nodeName"] == realnode.NAME
    term = quantizer_status(pod)["state"]["terminated"]
    if term["exitCode"] != 0:
        logs = env.cluster.kubectl_run("logs", "-n", ns, pod["metadata"]["name"], check=False).stdout[-3000:]
        pytest.fail(f"{term}\n{logs}")
    result = quantize_job.parse_result(term["message"])  # the kubelet copied the container's file into pod status
    assert result.ok and result.reason == "Published"
    aid = pod["metadata"]["labels"]["rerank.io/artifact"]
    assert result.artifact_id == aid
    assert result.path == artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, aid)

    # The artifact is really on the volume, written by uid 65532 with the fsGroup the kubelet applied.
    artifact = env.volume / artifact_layout.ARTIFACTS_DIR / aid
    onnx = artifact / artifact_layout.CPU_SUBDIR / "model.onnx"
    assert onnx.is_file() and onnx.stat().st_size > 0
    assert (onnx.stat().st_uid, onnx.stat().st_gid) == (RUN_AS, RUN_AS)
    assert env.volume.stat().st_gid == RUN_AS  # fsGroup: the kubelet gave the volume to the pod's group
    assert (artifact / artifact_layout.MANIFEST_FILE).is_file()
    staging = list((env.volume / artifact_layout.ARTIFACTS_DIR).glob(f"{publish.TMP_PREFIX}*"))
    assert not staging, "a staging dir was left"

    # The operator read the kubelet's termination message; the pools (kwok nodes) serve the artifact.
    env.kube.wait_condition(ns, "tiny", "Ready", "True", "Serving", timeout=90)
    status = env.kube.model(ns, "tiny")["status"]  # type: ignore[index]
    assert status["artifact"]["id"] == aid
    assert status["artifact"]["manifestSha256"] == result.manifest_sha256
    for pool in ("cpu", "gpu"):
        dep = env.kube.deployment(ns, f"tiny-{pool}")
        assert dep is not None and dep["status"].get("readyReplicas") == 1
        assert dep["spec"]["template"]["metadata"]["annotations"]["rerank.io/artifact"] == aid
        for p in env.kube.pods(ns, f"app.kubernetes.io/instance=tiny,app.kubernetes.io/component={pool}-pool"):
            assert p["spec"]["nodeName"].startswith("kwok-"), p["spec"]["nodeName"]
    print(f"\nNODE TIER: real quantization Job to Serving in {time.monotonic() - started:.1f}s")

    # A spec change that asks for a new artifact: a second real Job, then the pools roll to it; the first stays.
    env.kube.patch_spec(ns, "tiny", {"quantization": {"timeBudgetSeconds": 240}})
    second = eventually(lambda: next((p for p in env.quantizer_pods("tiny")
                                      if p["metadata"]["labels"]["rerank.io/artifact"] != aid), None),
                        60, "the second quantizer pod")
    new = second["metadata"]["labels"]["rerank.io/artifact"]

    def rolled() -> bool:
        deps = [env.kube.deployment(ns, f"tiny-{pool}") for pool in ("cpu", "gpu")]
        ready = env.kube.condition(ns, "tiny", "Ready")
        return ready.get("status") == "True" and all(
            d is not None and d["spec"]["template"]["metadata"]["annotations"]["rerank.io/artifact"] == new
            and d["status"].get("updatedReplicas") == 1 and d["status"].get("readyReplicas") == 1 for d in deps)
    eventually(rolled, 240, f"the pools to roll to artifact {new}", every=1)
    second = next(p for p in env.quantizer_pods("tiny") if p["metadata"]["labels"]["rerank.io/artifact"] == new)
    assert second["spec"]["nodeName"] == realnode.NAME
    assert quantizer_status(second)["state"]["terminated"]["exitCode"] == 0
    assert (env.volume / artifact_layout.ARTIFACTS_DIR / new / artifact_layout.CPU_SUBDIR / "model.onnx").is_file()
    assert onnx.is_file(), "the artifact the pools served before was touched"


def test_every_image_the_node_runs_is_pulled_from_the_registry_and_the_chart_comes_from_it(
        node_env: NodeEnv, real_node: realnode.RealNode) -> None:
    """The path every real cluster takes: the chart installed from the dev cluster's OCI registry, the operator's and
    the quantizer's images (and the pod sandbox's) named there by digest and pulled by the kubelet's containerd; no
    pod says ``imagePullPolicy: Never``, and nothing was imported behind the kubelet's back."""
    env, ns = node_env, node_env.namespace
    assert real_node.registry is not None
    host = real_node.registry.host
    env.kube.create_model(env.model_body("pulled"))
    env.terminated_quantizer("pulled")
    on_node = [p for p in env.kube.pods(ns, "") if p["spec"].get("nodeName") == realnode.NAME]
    kinds = {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in on_node}
    assert {"operator", "quantizer"} <= kinds, kinds
    images = set()
    for pod in on_node:
        for c in pod["spec"]["containers"]:
            assert c["image"].startswith(f"{host}/") and "@sha256:" in c["image"], c["image"]
            assert c.get("imagePullPolicy") != "Never", (pod["metadata"]["name"], c["name"])
            images.add(c["image"])
        named = {c["name"]: c["image"] for c in pod["spec"]["containers"]}
        for s in pod["status"].get("containerStatuses") or ():
            assert s["imageID"] == named[s["name"]], s  # what ran is the manifest the pod named, from the registry
    events = json.loads(env.cluster.kubectl_run("get", "events", "-n", ns, "-o", "json").stdout)["items"]
    pulled = {image for image in images
              for e in events if e.get("reason") == "Pulled" and f'"{image}"' in e.get("message", "")}
    assert pulled == images, f"no kubelet Pulled event for {images - pulled}"
    # containerd holds only what it pulled: the registry's references, the sandbox's included
    refs = real_node.image_refs()
    assert refs and all(r.startswith(f"{host}/") or r.startswith("sha256:") for r in refs), refs
    assert real_node.images.pause_image.startswith(f"{host}/")
    # the chart: an OCI artifact in the registry, installed from there (helm reports the chart it installed)
    version = real_node.registry.tags("charts/rerank-operator")
    assert version, "the chart was not pushed to the registry"
    helm = subprocess.run([str(binaries.ensure("helm")), "list", "-n", ns, "-o", "json"], env=env.cluster.env(),
                          capture_output=True, text=True, check=True, timeout=60)
    releases = json.loads(helm.stdout)
    assert [r["chart"] for r in releases] == [f"rerank-operator-{version[0]}"]
    assert env.release.chart(Path("/nonexistent"))[0] == f"oci://{host}/charts/rerank-operator"


def test_memory_limit_kills_the_quantizer_with_oomkilled(node_env: NodeEnv) -> None:
    env, ns = node_env, node_env.namespace
    env.kube.create_model(env.model_body("oom", {"resources": {"requests": {"memory": "160Mi", "cpu": "100m"},
                                                               "limits": {"memory": "160Mi"}}}))
    pod = env.terminated_quantizer("oom")
    term = quantizer_status(pod)["state"]["terminated"]
    assert term["reason"] == "OOMKilled", term
    cond = eventually(lambda: (c := env.kube.condition(ns, "oom", "ModelReady")).get("reason") not in
                      (None, "Quantizing", "JobPending") and c, 60, "the quantization to be reported failed")
    assert cond["status"] == "False" and cond["reason"] == "OOMKilled", cond
    assert env.kube.deployment(ns, "oom-cpu") is None


def test_permanent_failure_exit_code_ends_the_job_through_pod_failure_policy(node_env: NodeEnv) -> None:
    env, ns = node_env, node_env.namespace
    env.cluster.kubectl_run("create", "configmap", "bad-pairs", "-n", ns, "--from-literal=pairs.jsonl=not json\n")
    env.kube.create_model(env.model_body("bad", {
        "backoffLimit": 3,  # would retry three times without the policy
        "evaluationData": {"configMapRef": {"name": "bad-pairs", "key": "pairs.jsonl"}}}))
    pod = env.terminated_quantizer("bad")
    term = quantizer_status(pod)["state"]["terminated"]
    assert term["exitCode"] == quantize_job.EXIT_CODES["InvalidInput"], term

    def failed_job() -> Any:
        jobs = [j for j in env.kube.jobs(ns) if j["metadata"]["labels"].get("app.kubernetes.io/instance") == "bad"]
        return next((j for j in jobs for c in j["status"].get("conditions") or ()
                     if c["type"] == "Failed" and c["status"] == "True"), None)
    job = eventually(failed_job, 60, "the Job to fail")
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "PodFailurePolicy", failed
    assert job["status"].get("failed") == 1 and len(env.quantizer_pods("bad")) == 1
    cond = env.kube.wait_condition(ns, "bad", "ModelReady", "False", "InvalidInput", timeout=60)
    assert "pairs" in cond["message"], cond


def test_active_deadline_ends_a_quantizer_that_runs_too_long(node_env: NodeEnv) -> None:
    env, ns = node_env, node_env.namespace
    # A CPU quota far too small for the work: the kernel throttles the quantizer past its deadline.
    env.kube.create_model(env.model_body("slow", {"activeDeadlineSeconds": 61, "timeBudgetSeconds": 60,
                                                  "resources": {"requests": {"cpu": "10m"}, "limits": {"cpu": "10m"}}}))
    pod = eventually(lambda: next((p for p in env.quantizer_pods("slow") if p["status"].get("phase") == "Running"),
                                  None), 120, "the slow quantizer to run", every=1)
    assert pod["spec"]["nodeName"] == realnode.NAME

    def deadline_job() -> Any:
        jobs = [j for j in env.kube.jobs(ns) if j["metadata"]["labels"].get("app.kubernetes.io/instance") == "slow"]
        return next((j for j in jobs for c in j["status"].get("conditions") or ()
                     if c["type"] == "Failed" and c["status"] == "True" and c["reason"] == "DeadlineExceeded"), None)
    eventually(deadline_job, 120, "the Job to fail with DeadlineExceeded", every=1)
    cond = env.kube.wait_condition(ns, "slow", "ModelReady", "False", timeout=60)
    assert cond["reason"] == "DeadlineExceeded", cond
    eventually(lambda: not [p for p in env.quantizer_pods("slow") if p["status"].get("phase") == "Running"], 60,
               "the quantizer pod to be stopped", every=1)


def test_the_guard_pod_runs_from_the_image_and_keeps_its_live_sample_on_the_volume(
        node_env: NodeEnv, gateway_api_installed: list[str]) -> None:
    """The quality guard as the operator deploys it (its class turns it on; the tenant consents to re-quantization
    on drift), on the real node from the quantizer image: non-root, read-only root, no API token, the model volume's
    ``samples/<model>`` the kubelet creates for its subPath mount. Mirrored requests POSTed to the pod land in the
    sample file on the volume, in the format the Job reads, owned by the pod's user."""
    env, ns = node_env, node_env.namespace
    custom = client.CustomObjectsApi(env.kube.api)
    class_name = f"guarded-{ns}"
    custom.create_cluster_custom_object("rerank.io", "v1alpha1", "rerankclasses", {
        "apiVersion": "rerank.io/v1alpha1", "kind": "RerankClass", "metadata": {"name": class_name},
        "spec": {"qualityGuard": {"enabled": True, "sampleFraction": 0.5, "callsPerSecond": 2},
                 # this tier's model is a directory on the volume, its Job's image a local build
                 "modelSources": {"allowLocalPaths": True},
                 "quantization": {"images": {"allowed": [env.image.rsplit(":", 1)[0] + ":*"],
                                             "default": env.image}}}})
    try:
        # Resources of its own: the class's default (2 CPUs) would not fit next to the operator on this node.
        body = env.model_body("live", {"requantizeOnDrift": {"enabled": True, "maxPairs": 400},
                                       "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}}})
        body["spec"]["className"] = class_name
        body["spec"]["routing"] = {"gateway": {"parentRefs": [{"name": "edge", "namespace": ns}]}}
        env.kube.create_model(body)
        pod = env.terminated_quantizer("live")
        assert quantizer_status(pod)["state"]["terminated"]["exitCode"] == 0, quantizer_status(pod)

        def ready_guard() -> Any:
            pods = env.kube.pods(ns, "app.kubernetes.io/instance=live,app.kubernetes.io/component=quality-guard")
            return next((p for p in pods if p["status"].get("podIP") and any(
                c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or ())), None)
        try:
            guard_pod = eventually(ready_guard, 180, "the guard pod Ready on the real node", every=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{env.describe()}\n{env.cluster.log_tails(20)}") from None
        assert guard_pod["spec"]["nodeName"] == realnode.NAME
        assert guard_pod["spec"]["automountServiceAccountToken"] is False
        url = f"http://{guard_pod['status']['podIP']}:{guard_pod['spec']['containers'][0]['ports'][0]['containerPort']}"

        by_query: dict[str, list[str]] = {}
        for p in evaldata.builtin_pairs():
            by_query.setdefault(p.query, []).append(p.text)
        mirrored = [{"query": q, "texts": ts} for q, ts in by_query.items()]
        # What the route's RequestHeaderModifier sets on every copy it mirrors: the token the pod was given.
        token = next(e["value"] for e in guard_pod["spec"]["containers"][0]["env"]
                     if e["name"] == "RERANK_GUARD_MIRROR_TOKEN")
        unsigned = urllib.request.Request(url + "/rerank", data=json.dumps(mirrored[0]).encode(), method="POST",
                                          headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:  # the image's guard takes nothing else
            urllib.request.urlopen(unsigned, timeout=10)
        assert refused.value.code == 401
        for b in mirrored:
            req = urllib.request.Request(url + "/rerank", data=json.dumps(b).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  guard.MIRROR_TOKEN_HEADER: token})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 202
        expected = sum(len(ts) for ts in by_query.values())
        live = env.volume / artifact_layout.SAMPLES_DIR / "live" / artifact_layout.LIVE_SAMPLE_FILE

        def written() -> bool:
            with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
                page = resp.read().decode()
            return f'rerank_guard_live_sample_pairs{{namespace="{ns}",rerankmodel="live"}} {float(expected)}' in page
        eventually(written, 90, f"the guard to write {expected} pairs to its sample", every=1)
        pairs = evaldata.load_jsonl(str(live))  # the Job's reader, on the file the pod wrote to the volume
        assert len(pairs) == expected and {p.query for p in pairs} == set(by_query)
        assert (live.stat().st_uid, live.stat().st_mode & 0o777) == (RUN_AS, 0o640)
        logs = env.cluster.kubectl_run("logs", "-n", ns, guard_pod["metadata"]["name"], check=False).stdout
        assert "could not be written" not in logs and "Traceback" not in logs, logs[-2000:]
    finally:
        env.cluster.kubectl_run("delete", "rerankmodels", "live", "-n", ns, "--wait=true", "--timeout=60s",
                                check=False)
        with contextlib.suppress(client.exceptions.ApiException):
            custom.delete_cluster_custom_object("rerank.io", "v1alpha1", "rerankclasses", class_name)


def test_a_real_pod_fetches_a_shared_artifact_and_refuses_a_tampered_one(
        cluster: Cluster, kube: client.ApiClient, real_node: realnode.RealNode,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """Shared artifacts (RerankClass artifactStore): the pools' init container as the operator writes it
    (``builders/fetch.py``), in the operator image, under the kubelet (uid 65532, read-only root filesystem, the model
    volume an emptyDir), fetching from a registry the node's pods reach; then the same pod on a tampered store: the
    kubelet reports the fetcher's ChecksumMismatch, as the operator reads it (``fetch.failure``)."""
    from rerank_contracts import oci, shared_store
    from rerank_devcluster.operator_process import shared_artifact
    from rerank_devcluster.registry import standalone
    from rerank_operator.core.builders import fetch, pods

    ns = f"f-{uuid.uuid4().hex[:8]}"
    cluster.kubectl_run("create", "namespace", ns)
    eventually(lambda: cluster.kubectl_run("get", "sa", "default", "-n", ns, check=False).returncode == 0,
               what="the namespace's default ServiceAccount")
    bridge, _ = cluster.pod_api_endpoint
    root = tmp_path_factory.mktemp("real-store")
    with standalone(root / "registry", listen="0.0.0.0") as registry:
        reg = oci.Registry(registry.host, insecure=True)
        ref = shared_store.push(shared_artifact(root / "vol", "shared0"), "rerank/artifacts", "shared0", registry=reg,
                         scratch=root / "scratch")
        published = root / "vol" / artifact_layout.ARTIFACTS_DIR / "shared0"
        manifest_sha = oci.sha256_file(published / artifact_layout.MANIFEST_FILE)
        # The pods reach this machine at the node's bridge address.
        wanted = fetch.Fetch(ref=ref.replace(f"{registry.host}/", f"{bridge}:{registry.port}/"),
                             manifest_sha256=manifest_sha.split(":")[-1],
                             image=real_node.images.operator.name, insecure=True)

        def run(name: str) -> dict[str, Any]:
            init = fetch.init_container(wanted, "shared0", (artifact_layout.CPU_SUBDIR,))
            check = {"name": "serve", "image": wanted.image, "command": ["python", "-c", (
                "import pathlib,sys; d=pathlib.Path('/models/artifacts/shared0');"
                "sys.exit(0 if (d/'cpu-int8/model.onnx').read_bytes()==b'onnx'*1000 "
                "and not (d/'original').exists() else 3)")],
                "volumeMounts": [{"name": pods.MODEL_VOLUME, "mountPath": "/models", "readOnly": True}],
                "securityContext": pods.container_security_context()}
            _kubectl_apply(cluster, [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                                      "spec": {"nodeName": realnode.NAME, "restartPolicy": "Never",
                                               "automountServiceAccountToken": False,
                                               "securityContext": pods.pod_security_context(),
                                               "initContainers": [init], "containers": [check],
                                               "volumes": [*fetch.volumes(wanted), pods.scratch_volume()]}}])

            def done() -> Any:
                pod = Kube(cluster, kube).pods(ns, "")
                found = next((p for p in pod if p["metadata"]["name"] == name), None)
                phase = ((found or {}).get("status") or {}).get("phase")
                return found if phase in ("Succeeded", "Failed") else None
            return eventually(done, 180, f"pod {name} to finish", every=1)

        try:
            good = run("fetch-ok")
            assert good["status"]["phase"] == "Succeeded", good["status"]
            assert fetch.failure(good) is None
            layer = next(x for x in json.loads(reg.get_manifest("rerank/artifacts", ref.split("@")[1])[0])["layers"]
                         if x["annotations"]["org.opencontainers.image.title"] == artifact_layout.CPU_SUBDIR)
            digest = layer["digest"].split(":")[1]
            blob = registry.root / "storage" / "docker/registry/v2/blobs/sha256" / digest[:2] / digest / "data"
            data = bytearray(blob.read_bytes())
            data[-2000] ^= 0xFF
            blob.write_bytes(bytes(data))
            bad = run("fetch-tampered")
            assert bad["status"]["phase"] == "Failed", bad["status"]
            failed = fetch.failure(bad)
            assert failed is not None and failed[0] == "ChecksumMismatch", bad["status"]
            (serve,) = bad["status"]["containerStatuses"]
            assert not (serve.get("state") or {}).get("running") and not serve.get("started")
        finally:
            cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)
