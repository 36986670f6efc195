"""Helpers for the operator's integration tests: the operator as a real process under its real RBAC, and probes.

- ``operator_identity`` (session): a ServiceAccount bound to a ClusterRole made of exactly
  ``operator/rerank_operator/rbac_rules.yaml``, and a kubeconfig with its token. Every operator in these tests runs
  with it, so a missing permission fails a test.
- ``rrm_env`` (per test): a namespace, a static PersistentVolume for it (the dev cluster has no provisioner), and a
  ``rerank-operator`` subprocess watching that namespace; teardown deletes the RerankModels while the operator still
  runs, then stops it.
- Write calls are counted from the API server's audit log, by the operator's user: that includes kopf's own writes,
  which the operator's metric cannot see. (The audit log also has the operator's reads; ``operator_writes`` filters.)
- The identity, the operator process, static PVs and the quantizer's termination messages live in
  ``rerank_devcluster.operator_process``, shared with benchmarks/fleet/; they are re-exported here.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_devcluster.cluster import Cluster
from rerank_devcluster.operator_process import (
    GROUP,
    OPERATOR_NS,
    OPERATOR_SA,
    OPERATOR_USER,
    PLURAL,
    RBAC_RULES,
    REPO,
    RESYNC_SECONDS,
    VERSION,
    WRITE_VERBS,
    Identity,
    OperatorProcess,
    bind_leader_election,
    create_identity,
    published,
    refused,
    rerank_model,
    static_pv,
)
from rerank_devcluster.operator_process import kubectl_apply as _kubectl_apply
from rerank_devcluster.waiting import eventually

__all__ = ["GROUP", "OPERATOR_NS", "OPERATOR_SA", "OPERATOR_USER", "PLURAL", "RBAC_RULES", "REPO", "RESYNC_SECONDS",
           "VERSION", "WRITE_VERBS", "Env", "Identity", "Kube", "OperatorProcess", "_kubectl_apply", "audit_now",
           "bind_leader_election", "cleanup", "eventually", "operator_identity", "published", "refused",
           "rerank_model", "rrm_env", "static_pv"]


@pytest.fixture(scope="session")
def operator_identity(cluster: Cluster, crds_installed: list[str]) -> Identity:
    identity = create_identity(cluster)
    bind_leader_election(cluster, OPERATOR_NS)  # as the chart does: the Lease lives in the operator's namespace
    return identity


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

    def operator_requests(self, since: str) -> list[dict[str, Any]]:
        """Every call the operator made at or after ``since``, reads included, except opening its watches (the
        audit log keeps all of the operator's calls)."""
        return [e for e in self.cluster.audit_events()
                if e.get("user", {}).get("username") == self.operator.identity.username
                and e.get("verb") != "watch" and e.get("stageTimestamp", "") >= since]

    def operator_writes(self, since: str) -> list[dict[str, Any]]:
        """Write calls the operator (kopf included) made at or after ``since`` (RFC3339, from the audit log)."""
        return [e for e in self.cluster.audit_events()
                if e.get("user", {}).get("username") == self.operator.identity.username
                and e.get("verb") in WRITE_VERBS and e.get("stageTimestamp", "") >= since]


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
    """Delete every RerankModel while an operator runs (a model of an older version may carry its finalizer), then
    stop the operator."""
    if env.operator.proc is None or env.operator.proc.poll() is not None:
        env.operator.start()
    for ns in namespaces:
        env.cluster.kubectl_run("delete", "rerankmodels", "--all", "-n", ns, "--wait=true", "--timeout=60s",
                                check=False)
    env.operator.stop()
