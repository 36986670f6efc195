"""Shared pytest fixtures: a real control plane for the session, a fresh namespace per test.

Tests that use the cluster get the ``cluster`` marker automatically (select with ``-m cluster``). If the control
plane cannot start, those tests ERROR with the component logs; they are never skipped.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rerank_devcluster import binaries
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.operator_process import apply_and_wait_established, install_crds

REPO_ROOT = Path(__file__).resolve().parents[1]
CRDS_DIR = REPO_ROOT / "crds"
CLUSTER_FIXTURES = {"cluster", "kube", "namespace", "crds_installed", "gateway_api_installed"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    c = Cluster.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed and "cluster" in getattr(item, "fixturenames", ()):
        c = item.funcargs.get("cluster") if hasattr(item, "funcargs") else None
        if isinstance(c, Cluster):
            report.sections.append(("control plane logs", c.log_tails(30)))


@pytest.fixture(scope="session")
def kube(cluster: Cluster):  # -> kubernetes.client.ApiClient
    """A kubernetes ApiClient for the cluster's admin identity."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def crds_installed(cluster: Cluster) -> list[str]:
    """The project's CRDs from crds/, applied server-side and Established."""
    assert sorted(CRDS_DIR.glob("*.yaml")), f"no CRDs in {CRDS_DIR}"
    return install_crds(cluster)


@pytest.fixture(scope="session")
def gateway_api_installed(cluster: Cluster) -> list[str]:
    """Gateway API standard CRDs (HTTPRoute, Gateway, ...) from the sigs.k8s.io/gateway-api module zip."""
    return apply_and_wait_established(cluster, binaries.gateway_api_crds())


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting)."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl_run("create", "namespace", name)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # pods need the namespace's default ServiceAccount
        if cluster.kubectl_run("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0:
            break
        time.sleep(0.2)
    yield name
    cluster.kubectl_run("delete", "namespace", name, "--wait=false", check=False)
