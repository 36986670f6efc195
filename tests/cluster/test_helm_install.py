"""`helm install` of charts/rerank-operator into the real test control plane.

kwok fakes the kubelets, so the operator pod turns Ready without its container running: what is tested here is
what the chart gives the cluster (CRD served, objects accepted by the API server, RBAC granting exactly what the
rules file says in the right scope, the Deployment rolling out), not the operator's behaviour.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rerank_devcluster import binaries

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "rerank-operator"
CRD = "rerankmodels.rerank.io"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(binaries.ensure("helm"))


def run_helm(cluster, helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([helm, *args], env=cluster.env(), capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}")
    return out


@pytest.fixture
def release(cluster, helm: str, namespace: str) -> Iterator[str]:
    """A release name unique to the test (the chart's ClusterRole is named after it); uninstalled afterwards."""
    name = f"ro-{uuid.uuid4().hex[:6]}"
    yield name
    run_helm(cluster, helm, "uninstall", name, "-n", namespace, "--wait", "--timeout", "60s", check=False)


def can_i(cluster, sa: str, verb: str, resource: str, namespace: str) -> bool:
    out = cluster.kubectl_run("auth", "can-i", verb, resource, "-n", namespace, f"--as={sa}", check=False)
    return out.stdout.strip() == "yes"


def wait_operator_ready(cluster, namespace: str, release: str, replicas: int = 2) -> dict:
    """The chart's replicas (two by default: a leader and a standby) are Ready; the first of them."""
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/name=rerank-operator"
    cluster.kubectl_run("rollout", "status", f"deployment/{release}-rerank-operator", "-n", namespace,
                        "--timeout=120s")
    cluster.kubectl_run("wait", "--for=condition=Ready", "pod", "-l", selector, "-n", namespace, "--timeout=120s")
    pods = json.loads(cluster.kubectl_run("get", "pods", "-l", selector, "-n", namespace, "-o", "json").stdout)
    assert len(pods["items"]) == replicas
    return pods["items"][0]


def test_install_cluster_wide(cluster, helm: str, namespace: str, release: str) -> None:
    out = run_helm(cluster, helm, "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "180s")
    assert "rerank-operator" in out.stdout and "all namespaces" in out.stdout  # NOTES.txt

    # The CRD is installed (or already there) and served.
    cluster.kubectl_run("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    crd = json.loads(cluster.kubectl_run("get", "crd", CRD, "-o", "json").stdout)
    assert [v["name"] for v in crd["spec"]["versions"] if v["served"]] == ["v1alpha1"]
    assert json.loads(cluster.kubectl_run("get", "rerankmodels", "-A", "-o", "json").stdout)["kind"] == "List"

    pod = wait_operator_ready(cluster, namespace, release)
    (container,) = pod["spec"]["containers"]
    assert "--all-namespaces" in container["args"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

    # The ServiceAccount may manage RerankModels anywhere, and nothing it was not given.
    sa = f"system:serviceaccount:{namespace}:{release}-rerank-operator"
    assert can_i(cluster, sa, "watch", "rerankmodels.rerank.io", "default")
    assert can_i(cluster, sa, "patch", "rerankmodels.rerank.io/status", "kube-system")
    assert not can_i(cluster, sa, "delete", "nodes", "default")
    assert not can_i(cluster, sa, "create", "clusterrolebindings", "default")
    # Leader election: its Lease, in the release namespace only, and no more than get, create, update.
    assert "--leader-election" in container["args"]
    for verb in ("get", "create", "update"):
        assert can_i(cluster, sa, verb, "leases.coordination.k8s.io", namespace)
    assert not can_i(cluster, sa, "delete", "leases.coordination.k8s.io", namespace)
    assert not can_i(cluster, sa, "update", "leases.coordination.k8s.io", "kube-system")
    pdb = json.loads(cluster.kubectl_run("get", "pdb", f"{release}-rerank-operator", "-n", namespace,
                                         "-o", "json").stdout)
    assert pdb["spec"]["minAvailable"] == 1

    svc = json.loads(cluster.kubectl_run("get", "service", f"{release}-rerank-operator-metrics", "-n", namespace,
                                         "-o", "json").stdout)
    assert svc["spec"]["ports"][0]["port"] == 9090

    run_helm(cluster, helm, "uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")
    gone = cluster.kubectl_run("get", "deployment", f"{release}-rerank-operator", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert cluster.kubectl_run("get", "clusterrole", f"{release}-rerank-operator", check=False).returncode != 0
    # Helm never deletes CRDs (that would delete every RerankModel): the API stays served.
    cluster.kubectl_run("get", "crd", CRD)


def test_install_namespaced(cluster, helm: str, namespace: str, release: str) -> None:
    watched = f"w-{uuid.uuid4().hex[:6]}"
    cluster.kubectl_run("create", "namespace", watched)
    try:
        run_helm(cluster, helm, "install", release, str(CHART), "-n", namespace, "--wait", "--timeout", "180s",
                 "--set", f"watchNamespaces={{{watched}}}", "--set", "tenantRoles.enabled=false")
        pod = wait_operator_ready(cluster, namespace, release)
        assert f"--namespace={watched}" in pod["spec"]["containers"][0]["args"]
        sa = f"system:serviceaccount:{namespace}:{release}-rerank-operator"
        assert can_i(cluster, sa, "watch", "rerankmodels.rerank.io", watched)
        assert not can_i(cluster, sa, "watch", "rerankmodels.rerank.io", "default")
        # Cluster-wide it may only discover (CRDs, namespaces), nothing namespaced.
        assert can_i(cluster, sa, "list", "customresourcedefinitions.apiextensions.k8s.io", "default")
        assert not can_i(cluster, sa, "create", "deployments.apps", "default")
        assert can_i(cluster, sa, "patch", "deployments.apps", watched)
    finally:
        cluster.kubectl_run("delete", "namespace", watched, "--wait=false", check=False)
