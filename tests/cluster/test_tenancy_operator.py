"""The operator with RerankClasses on the real control plane: class defaults reach the children, a class change rolls
the model, a class tightened after admission is reported (ClassViolation) while the model keeps serving, a missing
class (ClassNotFound), the per-model NetworkPolicy, and ResourceQuotas reported as QuotaExceeded with their message.

The admission policy itself is tested in test_tenancy_admission.py; here only the operator's side, so the policy is
not installed. Every class is named per test and deleted afterwards (classes are cluster-scoped).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.rrm_harness import Env, audit_now, eventually

pytestmark = pytest.mark.cluster

GROUP, VERSION = "rerank.io", "v1alpha1"
IMAGE_A = "registry.example.com/tei:cpu-1.9"
IMAGE_B = "registry.example.com/tei:cpu-1.9.1"
CPU_ONLY = {"cpu": {"minReplicas": 1, "maxReplicas": 4}, "gpu": {"enabled": False}}


@pytest.fixture
def rclass(rrm_env: Env) -> Iterator[Callable[..., str]]:
    """Creates RerankClasses (``make(spec) -> name``) and deletes them after the test."""
    api = client.CustomObjectsApi(rrm_env.kube.api)
    made: list[str] = []

    def make(spec: dict[str, Any]) -> str:
        name = f"op-{uuid.uuid4().hex[:8]}"
        api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": name}, "spec": spec})
        made.append(name)
        return name

    yield make
    for name in made:
        with contextlib.suppress(ApiException):
            api.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)


def patch_class(env: Env, name: str, spec: dict[str, Any]) -> None:
    client.CustomObjectsApi(env.kube.api).patch_cluster_custom_object(GROUP, VERSION, "rerankclasses", name,
                                                                       {"spec": spec})


def cpu_container(env: Env) -> dict[str, Any]:
    dep = env.kube.deployment(env.namespace, "bge-m3-cpu")
    assert dep is not None
    return dict(dep["spec"]["template"]["spec"]["containers"][0])


def network_policy(env: Env) -> dict[str, Any] | None:
    try:
        return env.kube.api.sanitize_for_serialization(
            client.NetworkingV1Api(env.kube.api).read_namespaced_network_policy("bge-m3-tei", env.namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_model_within_its_class_gets_its_defaults_and_a_class_change_rolls_it(rrm_env: Env,
                                                                              rclass: Callable[..., str]) -> None:
    env, ns = rrm_env, rrm_env.namespace
    name = rclass({
        "pools": {"cpu": {"images": {"default": IMAGE_A, "allowed": ["registry.example.com/tei:*"]},
                          "resourceProfiles": [{"name": "small",
                                                "resources": {"requests": {"cpu": "1", "memory": "2Gi"},
                                                              "limits": {"memory": "4Gi"}}}],
                          "defaultResourceProfile": "small"}},
        "quantization": {"defaults": {"qualityGate": {"minSpearman": 0.995}}},
        "network": {"allowedNamespaces": ["search"]},
    })
    env.kube.create_model(env.model(className=name, pools=CPU_ONLY))
    [job] = eventually(lambda: env.kube.jobs(ns), what="the quantization Job")
    assert "0.995" in job["spec"]["template"]["spec"]["containers"][0]["args"]  # the class's quality gate
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    compliant = env.kube.wait_condition(ns, "bge-m3", "ClassCompliant", "True", "Compliant")
    assert name in compliant["message"]
    container = cpu_container(env)
    assert container["image"] == IMAGE_A
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "2Gi"}

    policy = eventually(lambda: network_policy(env), 30, "the NetworkPolicy bge-m3-tei")
    assert policy["metadata"]["ownerReferences"][0]["name"] == "bge-m3"
    assert policy["spec"]["ingress"][0]["ports"][0]["port"] == 8080
    peers = policy["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                        "values": ["search"]}]}} in peers

    # Idle with a class: not one write (the NetworkPolicy, ClassCompliant and the class cache are stable).
    env.operator.settle()
    since = audit_now()
    env.operator.resyncs(4)
    writes = env.operator_writes(since)
    assert writes == [], [(w["verb"], w["objectRef"]) for w in writes]

    # A class change rolls the pool (a new pod template), like a spec change, without re-quantizing.
    patch_class(env, name, {"pools": {"cpu": {"images": {"default": IMAGE_B}}}})
    eventually(lambda: cpu_container(env)["image"] == IMAGE_B, 30, "the pool to roll to the class's new image")
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    assert len(env.kube.jobs(ns)) == 1
    by_class = sum(v for k, v in env.operator.metrics().items()
                   if k.startswith("rerank_operator_reconciles_total") and 'trigger="class"' in k)
    assert by_class >= 1, "the class change did not trigger a reconcile of its model"

    # The class turns the NetworkPolicy off: the operator deletes it.
    patch_class(env, name, {"network": {"enabled": False}})
    eventually(lambda: network_policy(env) is None, 30, "the NetworkPolicy to be deleted")


def test_a_tightened_class_is_reported_while_the_model_keeps_serving(rrm_env: Env, rclass: Callable[..., str]) -> None:
    env, ns = rrm_env, rrm_env.namespace
    name = rclass({"pools": {"cpu": {"maxReplicas": 8}}})
    env.kube.create_model(env.model(className=name, pools=CPU_ONLY, quantization={"enabled": False}))
    env.kube.wait_condition(ns, "bge-m3", "Ready", "True", "Serving")
    env.kube.wait_condition(ns, "bge-m3", "ClassCompliant", "True", "Compliant")

    patch_class(env, name, {"pools": {"cpu": {"maxReplicas": 2, "defaultMaxReplicas": 2}}})
    violation = env.kube.wait_condition(ns, "bge-m3", "ClassCompliant", "False", "ClassViolation", timeout=30)
    assert f"are above the limit of RerankClass {name}: pools.cpu.maxReplicas is 2" in violation["message"]
    assert env.kube.condition(ns, "bge-m3", "Ready")["status"] == "True"  # still serving as admitted
    events = env.cluster.kubectl_run("get", "events", "-n", ns, "--field-selector",
                                     "involvedObject.name=bge-m3,reason=ClassViolation", "-o", "name").stdout
    assert events.strip(), "no ClassViolation event"

    # A class that does not exist: reported, nothing applied, what runs is left running.
    env.kube.patch_spec(ns, "bge-m3", {"className": "no-such-class"})
    cond = env.kube.wait_condition(ns, "bge-m3", "ClassCompliant", "False", "ClassNotFound", timeout=30)
    assert cond["message"] == "RerankClass no-such-class (spec.className) does not exist"
    assert env.kube.condition(ns, "bge-m3", "Ready")["reason"] == "ClassNotFound"
    assert env.kube.deployment(ns, "bge-m3-cpu") is not None


def quota(env: Env, name: str, hard: dict[str, str]) -> None:
    core = client.CoreV1Api(env.kube.api)
    core.create_namespaced_resource_quota(env.namespace, {"metadata": {"name": name}, "spec": {"hard": hard}})
    eventually(lambda: (core.read_namespaced_resource_quota(name, env.namespace).status.hard or {}) == hard,
               30, f"quota {name} to be observed")


def test_a_quota_blocking_the_pools_is_reported(rrm_env: Env, rclass: Callable[..., str]) -> None:
    env, ns = rrm_env, rrm_env.namespace
    name = rclass({})
    quota(env, "compute", {"requests.cpu": "1"})  # the class's default profile asks for 2 CPUs per TEI pod
    env.kube.create_model(env.model(className=name, pools=CPU_ONLY, quantization={"enabled": False}))
    cond = env.kube.wait_condition(ns, "bge-m3", "PoolsAvailable", "False", "QuotaExceeded")
    assert cond["message"].startswith("ReplicaSet/bge-m3-cpu-") and "exceeded quota: compute" in cond["message"], cond
    ready = env.kube.condition(ns, "bge-m3", "Ready")
    assert ((ready["status"], ready["reason"]) == ("False", "QuotaExceeded")
            and "limited: requests.cpu=1" in ready["message"])


def test_a_quota_refusing_the_claim_is_reported(rrm_env: Env, rclass: Callable[..., str]) -> None:
    env, ns = rrm_env, rrm_env.namespace
    name = rclass({})
    quota(env, "storage", {"requests.storage": "1Gi"})
    env.kube.create_model(env.model(className=name, pools=CPU_ONLY))
    cond = env.kube.wait_condition(ns, "bge-m3", "ModelReady", "False", "QuotaExceeded")
    assert cond["message"].startswith("PersistentVolumeClaim/bge-m3-models: exceeded quota: storage"), cond
    assert env.kube.condition(ns, "bge-m3", "Ready")["reason"] == "QuotaExceeded"
    assert env.operator.proc is not None and env.operator.proc.poll() is None  # a TemporaryError, not a crash


def test_a_quota_refusing_the_quantization_jobs_pod_is_reported(rrm_env: Env, rclass: Callable[..., str]) -> None:
    """A quota that leaves no room for a pod: the Job controller cannot create the quantizer's pod and says so only
    in a FailedCreate Event on the Job, which the operator reads once the Job has waited past its grace
    (job.FAILED_CREATE_GRACE_SECONDS) and reports as the Job's QuotaExceeded."""
    env, ns = rrm_env, rrm_env.namespace
    name = rclass({})
    quota(env, "no-pods", {"pods": "0"})
    env.kube.create_model(env.model(className=name, pools=CPU_ONLY))
    ready = env.kube.wait_condition(ns, "bge-m3", "Ready", "False", "QuotaExceeded", timeout=60)
    assert ready["message"].startswith("Job/bge-m3-") and "exceeded quota: no-pods" in ready["message"], ready
