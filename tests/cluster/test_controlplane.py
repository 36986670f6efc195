"""Proof that the test control plane is a real Kubernetes: schedulers, controllers, GC, admission, kwok kubelets."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from rerank_devcluster.cluster import NODE_LABEL, NODES, Cluster
from rerank_devcluster.waiting import eventually

MANIFESTS = Path(__file__).with_name("manifests")




def test_kubeconfig_shows_ready_kwok_nodes(cluster: Cluster) -> None:
    out = json.loads(cluster.kubectl_run("--kubeconfig", str(cluster.kubeconfig), "get", "nodes", "-o", "json",
                                         "-l", f"{NODE_LABEL}=true").stdout)  # the kwok nodes (not the real one)
    ready = {n["metadata"]["name"] for n in out["items"]
             if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])}
    assert ready == set(NODES)
    version = json.loads(cluster.kubectl_run("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"].startswith("v1.3"), version
    assert int(version["minor"]) >= 34


def test_deployment_becomes_available_on_kwok_nodes(cluster: Cluster, kube: client.ApiClient, namespace: str) -> None:
    apps = client.AppsV1Api(kube)
    labels = {"app": "web"}
    apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": 3, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}},
    })

    def available() -> bool:
        d = apps.read_namespaced_deployment_status("web", namespace)
        conds = {c.type: c.status for c in (d.status.conditions or [])}
        return conds.get("Available") == "True" and d.status.ready_replicas == 3

    eventually(available, what="Deployment Available with 3 ready replicas")
    pods = client.CoreV1Api(kube).list_namespaced_pod(namespace, label_selector="app=web").items
    assert len(pods) == 3
    assert {p.spec.node_name for p in pods} <= set(NODES)
    assert all(p.status.phase == "Running" and p.status.pod_ip for p in pods)


def test_job_reaches_complete(cluster: Cluster, kube: client.ApiClient, namespace: str) -> None:
    batch = client.BatchV1Api(kube)
    batch.create_namespaced_job(namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "once"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]}}},
    })

    def complete() -> bool:
        j = batch.read_namespaced_job_status("once", namespace)
        return any(c.type == "Complete" and c.status == "True" for c in (j.status.conditions or []))

    eventually(complete, what="Job Complete")


def test_held_quantizer_pod_finishes_with_termination_message(cluster: Cluster, kube: client.ApiClient,
                                                               namespace: str) -> None:
    """Quantizer pods stay Running until finished like a real container; the Job then fails or completes."""
    batch, core = client.BatchV1Api(kube), client.CoreV1Api(kube)
    labels = {"app.kubernetes.io/component": "quantizer"}
    batch.create_namespaced_job(namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "quantize"},
        "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": {
            "restartPolicy": "Never", "containers": [{"name": "q", "image": "quantizer:dev"}]}}},
    })

    def running() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=quantize").items
        return next((p for p in pods if p.status.phase == "Running"), None)

    pod = eventually(running, what="quantizer pod Running")
    time.sleep(2)  # kwok must leave it Running
    assert core.read_namespaced_pod(pod.metadata.name, namespace).status.phase == "Running"

    cluster.finish_pod(namespace, pod.metadata.name, 3, '{"ok":false,"reason":"QualityGateFailed"}')
    finished = core.read_namespaced_pod(pod.metadata.name, namespace)
    assert finished.status.container_statuses[0].state.terminated.message == '{"ok":false,"reason":"QualityGateFailed"}'

    def failed() -> bool:
        j = batch.read_namespaced_job_status("quantize", namespace)
        return any(c.type == "Failed" and c.status == "True" for c in (j.status.conditions or []))

    eventually(failed, what="Job Failed")


def test_deleting_owner_garbage_collects_children(cluster: Cluster, kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "child", "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}]}})
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", namespace)
            return False
        except ApiException as e:
            return e.status == 404

    eventually(child_gone, what="garbage collection of the child")


@pytest.fixture(scope="module")
def widget_crd(cluster: Cluster) -> str:
    cluster.kubectl_run("apply", "--server-side", "-f", str(MANIFESTS / "widget-crd.yaml"))
    cluster.kubectl_run("wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.proof.rerank.io")
    return "widgets.proof.rerank.io"


def _create_widget(kube: client.ApiClient, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "proof.rerank.io", "v1", namespace, "widgets",
        {"apiVersion": "proof.rerank.io/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec})


def test_crd_schema_defaults_and_prunes(kube: client.ApiClient, namespace: str, widget_crd: str) -> None:
    obj = _create_widget(kube, namespace, {"size": "small", "unknownField": 1})
    assert obj["spec"] == {"size": "small", "minReplicas": 1, "maxReplicas": 3}


@pytest.mark.parametrize(("spec", "message"), [
    ({"size": "huge"}, 'Unsupported value: "huge"'),
    ({}, "spec.size: Required value"),
    ({"size": "small", "minReplicas": -1}, "should be greater than or equal to 0"),
    ({"size": "small", "minReplicas": 5, "maxReplicas": 2}, "minReplicas must not exceed maxReplicas"),
])
def test_crd_schema_and_cel_refuse_bad_objects(kube: client.ApiClient, namespace: str, widget_crd: str,
                                               spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ApiException) as err:
        _create_widget(kube, namespace, spec)
    assert err.value.status == 422
    assert message in json.loads(err.value.body)["message"]
