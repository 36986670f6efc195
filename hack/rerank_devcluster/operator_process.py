"""The operator as a real process on the dev cluster, under the chart's RBAC: shared by tests/cluster and benchmarks.

- :func:`create_identity`: a ServiceAccount bound to a ClusterRole made of exactly
  ``operator/rerank_operator/rbac_rules.yaml``, and a kubeconfig with its token. Every operator started here runs
  with it, so a missing permission fails a test (and the API server's audit log tells its calls apart by user).
- :func:`bind_leader_election`: the Role of ``rbac_leader_election.yaml`` (the Lease), bound in one namespace.
- :class:`OperatorProcess`: ``python -m rerank_operator.main`` (or a launcher that runs the same ``main()``, such as
  :mod:`rerank_devcluster.scrape_redirect`) with free metrics and health ports, its log under the cluster's logs.
- :func:`static_pv` / :func:`static_pvs`: the dev cluster has no provisioner; claims bind to these by class name.
- :func:`published`, :func:`refused`, :func:`publish_status`: how a quantizer pod ends, as the real Job would end it
  (phase, terminated state, and the termination message of the quantizer's contract).
"""

from __future__ import annotations

import copy
import hashlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rerank_contracts import artifact_layout, quantize_job
from rerank_devcluster.cluster import Cluster, finished_pod_status, free_port
from rerank_devcluster.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
RBAC_RULES = REPO / "operator" / "rerank_operator" / "rbac_rules.yaml"
LEADER_ELECTION_RULES = REPO / "operator" / "rerank_operator" / "rbac_leader_election.yaml"
OPERATOR_NS = "rerank-system"
OPERATOR_SA = "rerank-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
RESYNC_SECONDS = 2.0
GROUP, VERSION, PLURAL = "rerank.io", "v1alpha1", "rerankmodels"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
QUANTIZER_SELECTOR = "app.kubernetes.io/component=quantizer"
ARTIFACT_LABEL = "rerank.io/artifact"


# --- applying manifests -------------------------------------------------------------------------------------------

def kubectl_apply(cluster: Cluster, objs: Sequence[dict[str, Any]]) -> None:
    """Server-side apply of ``objs`` in one kubectl call, as the admin."""
    cluster.apply(list(objs))


def apply_and_wait_established(cluster: Cluster, files: Iterable[Path]) -> list[str]:
    """Apply manifest files server-side; wait until the CRDs among them are Established. Returns ``crd/<name>``s."""
    names: list[str] = []
    for f in files:
        out = cluster.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", str(f), "-o", "json")
        doc = json.loads(out.stdout)
        items = doc.get("items", [doc])
        names += [f"crd/{i['metadata']['name']}" for i in items if i.get("kind") == "CustomResourceDefinition"]
    if names:
        cluster.kubectl_run("wait", "--for=condition=Established", "--timeout=60s", *names)
    return names


def install_crds(cluster: Cluster) -> list[str]:
    """The project's CRDs from crds/, applied and Established."""
    files = sorted((REPO / "crds").glob("*.yaml"))
    if not files:
        raise FileNotFoundError(f"no CRDs in {REPO / 'crds'}")
    return apply_and_wait_established(cluster, files)


# --- identity -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Identity:
    kubeconfig: Path
    username: str


def create_identity(cluster: Cluster, cluster_role: str = "rerank-operator-test",
                    token_duration: str = "4h") -> Identity:
    """The operator's ServiceAccount, bound to exactly rbac_rules.yaml, and a kubeconfig with a token for it."""
    rules = yaml.safe_load(RBAC_RULES.read_text())
    kubectl_apply(cluster, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_SA, "namespace": OPERATOR_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": cluster_role}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": cluster_role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}]},
    ])
    eventually(lambda: cluster.kubectl_run("get", "sa", OPERATOR_SA, "-n", OPERATOR_NS, check=False).returncode == 0,
               what="the operator's ServiceAccount")
    token = cluster.kubectl_run("create", "token", OPERATOR_SA, "-n", OPERATOR_NS,
                                f"--duration={token_duration}").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    ca = admin["clusters"][0]["cluster"]["certificate-authority-data"]
    path = cluster.workdir / "operator-kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "dev", "cluster": {"server": cluster.server, "certificate-authority-data": ca}}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "dev", "user": "operator"}}],
    }))
    return Identity(path, OPERATOR_USER)


def bind_leader_election(cluster: Cluster, namespace: str) -> None:
    """A Role of exactly rbac_leader_election.yaml in ``namespace``, bound to the operator's ServiceAccount."""
    name = "rerank-operator-leader-election"
    kubectl_apply(cluster, [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": namespace},
         "rules": yaml.safe_load(LEADER_ELECTION_RULES.read_text())},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}]},
    ])


# --- the operator process ---------------------------------------------------------------------------------------------

@dataclass
class OperatorProcess:
    """One ``rerank-operator`` process. ``namespaces`` empty: all namespaces. ``extra_args`` go after the harness's
    own flags (e.g. ``--leader-election``); ``name`` labels its log file (default: the namespaces)."""

    cluster: Cluster
    identity: Identity
    namespaces: list[str]
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    starts: int = 0
    log: Path = field(default=Path("/dev/null"))
    extra_env: dict[str, str] = field(default_factory=dict)
    # How the operator is started; the autoscaling tests and the fleet benchmark use scrape_redirect, which runs the
    # same main().
    launcher: list[str] = field(default_factory=lambda: ["-m", "rerank_operator.main"])
    extra_args: list[str] = field(default_factory=list)
    resync_seconds: float | None = RESYNC_SECONDS  # None: the operator's own default
    name: str = ""
    start_timeout: float = 30.0

    def argv(self) -> list[str]:
        argv = [sys.executable, *self.launcher, "--log-format", "json", "--watch-server-timeout", "20",
                "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port)]
        if self.resync_seconds is not None:
            argv += ["--resync-seconds", str(self.resync_seconds)]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        return argv + list(self.extra_args)

    def start(self) -> OperatorProcess:
        self.metrics_port, self.health_port = free_port(), free_port()
        self.starts += 1
        label = self.name or ("-".join(self.namespaces) if self.namespaces else "all-namespaces")
        self.log = self.cluster.logs_dir / f"operator-{label[:120]}-{self.starts}.log"
        env = {**self.cluster.env(), "KUBECONFIG": str(self.identity.kubeconfig), **self.extra_env}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv(), env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        eventually(self.healthy, timeout=self.start_timeout, what=f"operator /healthz (log {self.log})")
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies or the OOM killer strikes."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as resp:
            text = resp.read().decode()
        return parse_exposition(text)

    def metric_sum(self, prefix: str) -> float:
        return sum(v for k, v in self.metrics().items() if k.startswith(prefix))

    def resyncs(self, count: int, timeout: float = 60) -> float:
        """Wait (the shared ``eventually`` loop) until the operator has run ``count`` more reconciles than now, its
        resync timer's included; returns how many it ran. Replaces sleeping for "a few resync periods"."""
        start = self.metric_sum("rerank_operator_reconciles_total")

        def more() -> float:
            return self.metric_sum("rerank_operator_reconciles_total") - start

        eventually(lambda: more() >= count, timeout, f"{count} more reconciles (log {self.log})")
        return more()

    def settle(self, quiet: float = 1.0, timeout: float = 60) -> None:
        """Wait until the operator has made no write request for ``quiet`` seconds (its own write counter): the last
        status and event writes of a transition have landed."""
        last = {"writes": self.metric_sum("rerank_operator_api_writes_total"), "since": time.monotonic()}

        def quiet_enough() -> bool:
            writes, now = self.metric_sum("rerank_operator_api_writes_total"), time.monotonic()
            if writes != last["writes"]:
                last.update(writes=writes, since=now)
            return now - last["since"] >= quiet

        eventually(quiet_enough, timeout, f"the operator's writes to settle (log {self.log})", every=0.2)


def parse_exposition(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{'name{labels}': value}`` (comments skipped)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                values[name] = float(value)
            except ValueError:
                continue
    return values


# --- storage ----------------------------------------------------------------------------------------------------------

def pv_manifest(name: str, storage_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "500Gi"}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                 "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Delete",
                 "hostPath": {"path": f"/tmp/{name}"}},
    }


def static_pv(cluster: Cluster, name: str, storage_class: str) -> None:
    kubectl_apply(cluster, [pv_manifest(name, storage_class)])


def static_pvs(cluster: Cluster, names: Sequence[str], storage_class: str, chunk: int = 200) -> None:
    """Many static PVs of one class, ``chunk`` to a kubectl call."""
    for i in range(0, len(names), chunk):
        kubectl_apply(cluster, [pv_manifest(n, storage_class) for n in names[i:i + chunk]])


# --- the quantizer's end ----------------------------------------------------------------------------------------------

def published(artifact_id: str) -> str:
    """The termination message of a quantizer that published ``artifact_id``."""
    return quantize_job.JobResult(
        ok=True, reason="Published", message="published", artifact_id=artifact_id,
        path=artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, artifact_id), manifest_sha256="cd" * 32,
        size_bytes=580_123_456, quality={"spearman": 0.994, "topk_agreement": 0.96},
        speed={"fp32_pairs_per_s": 41.0, "int8_pairs_per_s": 118.0, "speedup": 2.88},
        recipe={"per_channel": True, "operators": ["MatMul"]}).to_message()


def shared_artifact(root: Path, artifact_id: str) -> Path:
    """A small artifact directory as the quantizer publishes one under ``root`` (manifest.json lists every file with
    its sha256): what the tests and the fleet benchmark push to a store in place of a shared Job's real one."""
    final = root / artifact_layout.ARTIFACTS_DIR / artifact_id
    cpu, original = artifact_layout.CPU_SUBDIR, artifact_layout.ORIGINAL_SUBDIR
    files = {f"{cpu}/model.onnx": b"onnx" * 1000, f"{cpu}/config.json": b"{}", f"{cpu}/tokenizer.json": b'{"t": 1}',
             f"{original}/config.json": b"{}"}
    inventory: list[dict[str, Any]] = []
    for rel, data in sorted(files.items()):
        path = final / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        inventory.append({"path": rel, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"manifest_version": 1, "artifact_id": artifact_id, "files": inventory,
                "size_bytes": sum(f["size"] for f in inventory), "quality": {"spearman": 0.995},
                "speed": {"speedup": 2.5}, "recipe": {"name": "test"}, "max_input_tokens": 512}
    (final / artifact_layout.MANIFEST_FILE).write_text(json.dumps(manifest, sort_keys=True))
    return final


def published_shared(artifact_id: str, ref: str) -> str:
    """The termination message of a shared Job that published ``artifact_id`` and pushed it as ``ref``."""
    result = json.loads(published(artifact_id))
    result["ref"] = ref
    return json.dumps(result, separators=(",", ":"), sort_keys=True)


def refused(reason: str, message: str) -> str:
    return quantize_job.JobResult(ok=False, reason=reason, message=message).to_message()


def publish_status(pod: dict[str, Any]) -> dict[str, Any]:
    """The status patch (``cluster.finished_pod_status``) of a quantizer pod that published the artifact named by
    its ``rerank.io/artifact`` label."""
    return finished_pod_status(pod, 0, published(pod["metadata"]["labels"][ARTIFACT_LABEL]))


def rerank_model(name: str, ns: str, storage_class: str, **spec: Any) -> dict[str, Any]:
    """The issue's example, with a short Job backoff so failures show quickly, and test storage."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankModel", "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"id": "BAAI/bge-reranker-v2-m3", "revision": "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e",
                      "tokenSecretRef": {"name": "hf", "key": "token"}},
            "quantization": {"backoffLimit": 0},
            "storage": {"storageClassName": storage_class, "reclaimPolicy": "Delete"},
            "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 8},
                      "gpu": {"minReplicas": 1, "maxReplicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}}},
            "autoscaling": {"enabled": False},
        },
    }
    for key, value in spec.items():
        body["spec"][key] = {**body["spec"].get(key, {}), **value} if isinstance(value, dict) else value
    return copy.deepcopy(body)
