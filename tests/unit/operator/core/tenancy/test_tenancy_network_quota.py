"""build_network_policy() and quota_blocked()."""

from __future__ import annotations

from typing import Any

import pytest

from rerank_contracts.guard import SAMPLER_PORT
from rerank_operator.core import names, tenancy
from tests.unit.operator.core.tenancy.tenancy_helpers import at, rclass

MODEL = {"metadata": {"name": "bge", "namespace": "team-a", "uid": "u-1", "generation": 3}}


def peers(policy: dict[str, Any]) -> list[dict[str, Any]]:
    return policy["spec"]["ingress"][0]["from"]


def ns_in(peer: dict[str, Any]) -> list[str]:
    return peer["namespaceSelector"]["matchExpressions"][0]["values"]


def test_network_policy_selects_only_the_models_tei_pods_and_port() -> None:
    policy = tenancy.build_network_policy(MODEL, rclass())
    assert policy is not None
    assert policy["metadata"]["name"] == "bge-tei" and policy["metadata"]["namespace"] == "team-a"
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    selector = policy["spec"]["podSelector"]
    assert selector["matchLabels"] == {"app.kubernetes.io/name": "rerankmodel", "app.kubernetes.io/instance": "bge"}
    # A canary is TEI too; the quality guard is selected for its own port (test_the_guard_is_reached_only_...).
    assert selector["matchExpressions"][0]["values"] == ["cpu-pool", "gpu-pool", "cpu-canary", "quality-guard"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # TEI's port and the port of the pods' front (the rerank API, builders/sampler.py)
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": 8080},
                                                     {"protocol": "TCP", "port": 8082}]
    assert peers(policy) == [{"podSelector": {}}]  # default class: the model's own namespace only


@pytest.mark.parametrize(("mods", "operator_ns", "expected"), [
    ((at("network.routingNamespaces", ["gateway"]), at("network.routingPodLabels", {"app": "envoy"})), None,
     [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                   "values": ["gateway"]}]},
       "podSelector": {"matchLabels": {"app": "envoy"}}},
      {"podSelector": {}}]),
    ((at("network.allowedNamespaces", ["search", "ads"]), at("network.allowSameNamespace", False)), None,
     [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                   "values": ["ads", "search"]}]}}]),
    ((at("network.allowSameNamespace", False),), "rerank-system",
     [{"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                   "values": ["rerank-system"]}]},
       "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rerank-operator"}}}]),
])
def test_network_policy_peers(mods: tuple, operator_ns: str | None, expected: list[dict[str, Any]]) -> None:
    policy = tenancy.build_network_policy(MODEL, rclass(*mods), operator_namespace=operator_ns,
                                          operator_pod_labels={"app.kubernetes.io/name": "rerank-operator"})
    assert policy is not None and peers(policy) == expected


GATEWAY_PEER = {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                            "values": ["gateway"]}]},
                "podSelector": {"matchLabels": {"app": "envoy"}}}
OPERATOR_PEER = {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                             "values": ["rerank-system"]}]},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "rerank-operator"}}}


@pytest.mark.parametrize(("mods", "guard_peers"), [
    ((at("network.routingNamespaces", ["gateway"]), at("network.routingPodLabels", {"app": "envoy"}),
      at("network.allowedNamespaces", ["search"])), [GATEWAY_PEER, OPERATOR_PEER]),
    ((at("network.allowedNamespaces", ["search"]),), [OPERATOR_PEER]),  # no routing layer named: nothing mirrors
])
def test_the_guard_is_reached_only_by_the_routing_layer_and_the_operator(
        mods: tuple[Any, ...], guard_peers: list[dict[str, Any]]) -> None:
    """Not the model's own namespace, not the allowed client namespaces: only what mirrors and what reads verdicts
    reach the guard's port; TEI's port keeps its peers."""
    policy = tenancy.build_network_policy(MODEL, rclass(*mods), operator_namespace="rerank-system",
                                          operator_pod_labels={"app.kubernetes.io/name": "rerank-operator"})
    assert policy is not None
    tei, guard = policy["spec"]["ingress"]
    assert tei["ports"] == [{"protocol": "TCP", "port": names.TEI_PORT}, {"protocol": "TCP", "port": SAMPLER_PORT}]
    assert {"podSelector": {}} in tei["from"]
    assert guard["ports"] == [{"protocol": "TCP", "port": names.GUARD_PORT}] and names.GUARD_PORT != names.TEI_PORT
    assert guard["from"] == guard_peers


def test_network_policy_with_no_peer_denies_all_ingress() -> None:
    policy = tenancy.build_network_policy(MODEL, rclass(at("network.allowSameNamespace", False)))
    assert policy is not None and policy["spec"]["ingress"] == []


@pytest.mark.parametrize("klass", [None, rclass(at("network.enabled", False))])
def test_no_network_policy_without_class_or_when_disabled(klass: dict[str, Any] | None) -> None:
    assert tenancy.build_network_policy(MODEL, klass) is None


QUOTA_MSG = ('pods "bge-cpu-7d9f-x" is forbidden: exceeded quota: compute, requested: requests.cpu=2, '
             'used: requests.cpu=4, limited: requests.cpu=4')


def rs(name: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"conditions": list(conditions)}}


def job(name: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": status}


def event(kind: str, name: str, message: str, when: str = "2025-01-01T00:00:00Z",
          reason: str = "FailedCreate") -> dict[str, Any]:
    return {"involvedObject": {"kind": kind, "name": name}, "reason": reason, "message": message, "lastTimestamp": when}


FAILURE = {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": QUOTA_MSG}


@pytest.mark.parametrize(("inputs", "blocked", "message"), [
    ({"replica_sets": [rs("bge-cpu-7d9f", FAILURE)]}, "ReplicaSet/bge-cpu-7d9f",
     "ReplicaSet/bge-cpu-7d9f: exceeded quota: compute, requested: requests.cpu=2, used: requests.cpu=4, "
     "limited: requests.cpu=4"),
    ({"replica_sets": [rs("a", {**FAILURE, "message": "some other failure"})]}, None, None),
    ({"replica_sets": [rs("a", {**FAILURE, "status": "False"})]}, None, None),
    ({"jobs": [job("bge-q-1")], "events": [event("Job", "bge-q-1", QUOTA_MSG)]}, "Job/bge-q-1", None),
    ({"jobs": [job("bge-q-1", active=1)], "events": [event("Job", "bge-q-1", QUOTA_MSG)]}, None, None),
    ({"jobs": [job("bge-q-1", conditions=[{"type": "Complete", "status": "True"}])],
      "events": [event("Job", "bge-q-1", QUOTA_MSG)]}, None, None),
    ({"jobs": [job("bge-q-1")], "events": [event("Job", "other", QUOTA_MSG)]}, None, None),
    ({"api_errors": {"PersistentVolumeClaim/bge-models":
                     'persistentvolumeclaims "bge-models" is forbidden: exceeded quota: storage, requested: '
                     'requests.storage=20Gi, used: requests.storage=0, limited: requests.storage=10Gi'}},
     "PersistentVolumeClaim/bge-models",
     "PersistentVolumeClaim/bge-models: exceeded quota: storage, requested: requests.storage=20Gi, "
     "used: requests.storage=0, limited: requests.storage=10Gi"),
    ({"api_errors": {"PersistentVolumeClaim/bge-models": "forbidden: failed quota: q: must specify requests.storage"}},
     "PersistentVolumeClaim/bge-models", None),
    ({"api_errors": {"PersistentVolumeClaim/bge-models": "conflict"}}, None, None),
    ({}, None, None),
])
def test_quota_blocked(inputs: dict[str, Any], blocked: str | None, message: str | None) -> None:
    found = tenancy.quota_blocked(**inputs)
    assert (found.blocked if found else None) == blocked
    if found:
        assert found.reason == "QuotaExceeded"
    if message:
        assert found is not None and found.message == message
