"""Helpers for the operator's integration tests: the operator as a real process under its real RBAC, and probes.

- ``operator_identity`` (session): a ServiceAccount bound to a ClusterRole made of exactly
  ``operator/rerank_operator/rbac_rules.yaml``, and a kubeconfig with its token. Every operator in these tests runs
  with it, so a missing permission fails a test.
- ``rrm_env`` (per test): a namespace, a static PersistentVolume for it (the dev cluster has no provisioner), and a
  ``rerank-operator`` subprocess watching that namespace; teardown deletes the RerankModels while the operator still
  runs (kopf's finalizer), then stops it.
- Write calls are counted from the API server's audit log, by the operator's user: that includes kopf's own writes,
  which the operator's metric cannot see.
"""

from __future__ import annotations

import copy
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from quantizer_job import contract
from rerank_devcluster.cluster import Cluster, free_port
from rerank_devcluster.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
RBAC_RULES = REPO / "operator" / "rerank_operator" / "rbac_rules.yaml"
OPERATOR_NS = "rerank-system"
OPERATOR_SA = "rerank-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
RESYNC_SECONDS = 2.0
GROUP, VERSION, PLURAL = "rerank.io", "v1alpha1", "rerankmodels"
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}




# --- identity -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Identity:
    kubeconfig: Path
    username: str


def _kubectl_apply(cluster: Cluster, objs: list[dict[str, Any]]) -> None:
    cluster.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", "-",
                        input="\n---\n".join(yaml.safe_dump(o) for o in objs))


@pytest.fixture(scope="session")
def operator_identity(cluster: Cluster, crds_installed: list[str]) -> Identity:
    rules = yaml.safe_load(RBAC_RULES.read_text())
    _kubectl_apply(cluster, [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OPERATOR_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": OPERATOR_SA, "namespace": OPERATOR_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "rerank-operator-test"}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "rerank-operator-test"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rerank-operator-test"},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}]},
    ])
    eventually(lambda: cluster.kubectl_run("get", "sa", OPERATOR_SA, "-n", OPERATOR_NS, check=False).returncode == 0,
               what="the operator's ServiceAccount")
    token = cluster.kubectl_run("create", "token", OPERATOR_SA, "-n", OPERATOR_NS, "--duration=4h").stdout.strip()
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


# --- the operator process ---------------------------------------------------------------------------------------------

@dataclass
class OperatorProcess:
    cluster: Cluster
    identity: Identity
    namespaces: list[str]
    proc: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    health_port: int = 0
    starts: int = 0
    log: Path = field(default=Path("/dev/null"))
    extra_env: dict[str, str] = field(default_factory=dict)
    # How the operator is started; test_autoscaling.py uses scrape_redirect.py, which runs the same main().
    launcher: list[str] = field(default_factory=lambda: ["-m", "rerank_operator.main"])

    def start(self) -> OperatorProcess:
        self.metrics_port, self.health_port = free_port(), free_port()
        self.starts += 1
        self.log = self.cluster.logs_dir / f"operator-{'-'.join(self.namespaces)}-{self.starts}.log"
        env = {**self.cluster.env(), "KUBECONFIG": str(self.identity.kubeconfig), **self.extra_env}
        argv = [sys.executable, *self.launcher, "--log-format", "json", "--watch-server-timeout", "20",
                "--metrics-port", str(self.metrics_port), "--health-port", str(self.health_port),
                "--resync-seconds", str(RESYNC_SECONDS)]
        for ns in self.namespaces:
            argv += ["--namespace", ns]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        eventually(self.healthy, timeout=30, what=f"operator /healthz (log {self.log})")
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=1) as resp:
                return resp.status == 200
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
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

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


# --- the test's view of the cluster -----------------------------------------------------------------------------------

class Kube:
    """Admin-side reads and writes for assertions (never through the operator's code)."""

    def __init__(self, cluster: Cluster, api: client.ApiClient) -> None:
        self.cluster = cluster
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)

    def _plain(self, obj: Any) -> Any:
        return self.api.sanitize_for_serialization(obj)

    def create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        ns = body["metadata"]["namespace"]
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def model(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def patch_spec(self, ns: str, name: str, spec_patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec_patch})

    def delete_model(self, ns: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)

    def condition(self, ns: str, name: str, kind: str) -> dict[str, Any]:
        body = self.model(ns, name) or {}
        for cond in body.get("status", {}).get("conditions") or ():
            if cond["type"] == kind:
                return cond
        return {}

    def wait_condition(self, ns: str, name: str, kind: str, status: str, reason: str | None = None,
                       timeout: float = 60) -> dict[str, Any]:
        def check() -> Any:
            body = self.model(ns, name) or {}
            cond = self.condition(ns, name, kind)
            current = body.get("status", {}).get("observedGeneration") == body.get("metadata", {}).get("generation")
            ok = current and cond.get("status") == status and (reason is None or cond.get("reason") == reason)
            return cond if ok else None
        return eventually(check, timeout, f"{name} {kind}={status} {reason or ''}")

    def jobs(self, ns: str) -> list[dict[str, Any]]:
        return self._plain(self.batch.list_namespaced_job(ns).items)

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return self._plain(self.core.list_namespaced_pod(ns, label_selector=selector).items)

    def deployment(self, ns: str, name: str) -> dict[str, Any] | None:
        try:
            return self._plain(self.apps.read_namespaced_deployment(name, ns))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def exists(self, kind: str, ns: str, name: str) -> bool:
        read = {"Service": self.core.read_namespaced_service, "PersistentVolumeClaim":
                self.core.read_namespaced_persistent_volume_claim, "Deployment": self.apps.read_namespaced_deployment,
                "Job": self.batch.read_namespaced_job}[kind]
        try:
            read(name, ns)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise


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


def published(artifact_id: str) -> str:
    return contract.JobResult(
        ok=True, reason="Published", message="published", artifact_id=artifact_id,
        path=contract.artifact_dir(contract.VOLUME_MOUNT_PATH, artifact_id), manifest_sha256="cd" * 32,
        size_bytes=580_123_456, quality={"spearman": 0.994, "topk_agreement": 0.96},
        speed={"fp32_pairs_per_s": 41.0, "int8_pairs_per_s": 118.0, "speedup": 2.88},
        recipe={"per_channel": True, "operators": ["MatMul"]}).to_message()


def refused(reason: str, message: str) -> str:
    return contract.JobResult(ok=False, reason=reason, message=message).to_message()


@dataclass
class Env:
    cluster: Cluster
    kube: Kube
    namespace: str
    storage_class: str
    operator: OperatorProcess

    def model(self, name: str = "bge-m3", **spec: Any) -> dict[str, Any]:
        return rerank_model(name, self.namespace, self.storage_class, **spec)

    def running_quantizer(self, artifact_id: str | None = None) -> dict[str, Any]:
        """The one quantizer pod still running (for ``artifact_id`` if given), once it is Running."""
        selector = "app.kubernetes.io/component=quantizer" + (
            f",rerank.io/artifact={artifact_id}" if artifact_id else "")

        def find() -> Any:
            running = [p for p in self.kube.pods(self.namespace, selector) if p["status"].get("phase") == "Running"]
            return running[0] if len(running) == 1 else None
        try:
            return eventually(find, 60, f"a running quantizer pod {selector}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.describe()}") from None

    def describe(self) -> str:
        """The models' status and the operator's log tail, for failure messages."""
        models = self.cluster.kubectl_run("get", "rerankmodels", "-n", self.namespace, "-o",
                                          "jsonpath={range .items[*]}{.metadata.name}: {.status}{\"\\n\"}{end}",
                                          check=False).stdout
        others = self.cluster.kubectl_run("get", "jobs,pods,pvc,deploy,svc", "-n", self.namespace, check=False).stdout
        return f"{models[-5000:]}\n{others}\n--- operator log ---\n{self.operator.log.read_text()[-3000:]}"

    def finish_quantizer(self, ok: bool = True, message: str | None = None, artifact_id: str | None = None,
                         exit_code: int | None = None) -> dict[str, Any]:
        pod = self.running_quantizer(artifact_id)
        aid = pod["metadata"]["labels"]["rerank.io/artifact"]
        text = message if message is not None else (published(aid) if ok else refused("InternalError", "boom"))
        code = exit_code if exit_code is not None else (0 if ok else 1)
        self.cluster.finish_pod(self.namespace, pod["metadata"]["name"], code, text)
        return pod

    def operator_writes(self, since: str) -> list[dict[str, Any]]:
        """Write calls the operator (kopf included) made at or after ``since`` (RFC3339, from the audit log)."""
        return [e for e in self.cluster.audit_events()
                if e.get("user", {}).get("username") == self.operator.identity.username
                and e.get("verb") in WRITE_VERBS and e.get("stageTimestamp", "") >= since]


def static_pv(cluster: Cluster, name: str, storage_class: str) -> None:
    _kubectl_apply(cluster, [{
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": "500Gi"}, "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
                 "storageClassName": storage_class, "persistentVolumeReclaimPolicy": "Delete",
                 "hostPath": {"path": f"/tmp/{name}"}},
    }])


def audit_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000000Z"


@pytest.fixture
def rrm_env(cluster: Cluster, kube: client.ApiClient, namespace: str, operator_identity: Identity) -> Iterator[Env]:
    static_pv(cluster, f"pv-{namespace}", namespace)
    static_pv(cluster, f"pv-{namespace}-2", namespace)
    operator = OperatorProcess(cluster, operator_identity, [namespace]).start()
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, operator)
    try:
        yield env
    finally:
        cleanup(env, [namespace])
        cluster.kubectl_run("delete", "pv", f"pv-{namespace}", f"pv-{namespace}-2", "--wait=false", check=False)


def cleanup(env: Env, namespaces: list[str]) -> None:
    """Delete every RerankModel while an operator runs (kopf's finalizer), then stop the operator."""
    if env.operator.proc is None or env.operator.proc.poll() is not None:
        env.operator.start()
    for ns in namespaces:
        env.cluster.kubectl_run("delete", "rerankmodels", "--all", "-n", ns, "--wait=true", "--timeout=60s",
                                check=False)
    env.operator.stop()
