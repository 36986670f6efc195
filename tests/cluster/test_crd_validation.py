"""The API server refuses bad RerankModels with a message that says what to fix (schema + CEL in crds/).

Each case starts from the issue's valid example and breaks one thing; the refusal must carry that thing's own
message (not just "invalid"), and the unbroken example must be accepted, so a case cannot pass by accident.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.cluster

GPU = {"limits": {"nvidia.com/gpu": 1}}
VALID: dict[str, Any] = {
    "apiVersion": "rerank.io/v1alpha1", "kind": "RerankModel", "metadata": {"name": "bge-m3"},
    "spec": {
        "model": {"id": "BAAI/bge-reranker-v2-m3", "revision": "953dc6f6",
                  "tokenSecretRef": {"name": "hf", "key": "token"}},
        "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 8},
                  "gpu": {"minReplicas": 1, "maxReplicas": 2, "resources": GPU}},
    },
}


def spec(**changes: Any) -> Callable[[dict[str, Any]], None]:
    """Set spec fields by dotted path; None deletes."""
    def mod(body: dict[str, Any]) -> None:
        for path, value in changes.items():
            node = body["spec"]
            *parents, leaf = path.split("__")
            for key in parents:
                node = node.setdefault(key, {})
            if value is None:
                node.pop(leaf, None)
            else:
                node[leaf] = copy.deepcopy(value)
    return mod


def name(value: str) -> Callable[[dict[str, Any]], None]:
    return lambda body: body["metadata"].__setitem__("name", value)


CASES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "model id and path": (spec(model={"id": "a/b", "path": "m"}, storage={"existingClaim": "c"}),
                          "set exactly one of model.id"),
    "no model": (spec(model={}), "set exactly one of model.id"),
    "revision with a path": (spec(model={"path": "m", "revision": "x"}, storage={"existingClaim": "c"}),
                             "model.revision only applies to model.id"),
    "path without existing claim": (spec(model={"path": "m"}), "set storage.existingClaim to the claim that holds it"),
    "path escaping the volume": (spec(model={"path": "a/../../etc"}, storage={"existingClaim": "c"}),
                                 "must not contain '.' or '..' segments"),
    "malformed hub id": (spec(model={"id": "not a/valid/id"}), "spec.model.id"),
    "cpu min above max": (spec(pools__cpu={"minReplicas": 5, "maxReplicas": 2}),
                          "minReplicas must be less than or equal to maxReplicas"),
    "gpu min above max": (spec(pools__gpu={"minReplicas": 3, "maxReplicas": 2, "resources": GPU}),
                          "minReplicas must be less than or equal to maxReplicas"),
    "no pool enabled": (spec(pools={"cpu": {"enabled": False}}), "at least one pool must be enabled"),
    "zero with no way to wake it": (spec(pools={"cpu": {"minReplicas": 0},
                                                "gpu": {"minReplicas": 0, "resources": GPU}}),
                                    "every enabled pool at minReplicas 0 (scale to zero) needs autoscaling.enabled"),
    "negative replicas": (spec(pools__cpu={"minReplicas": -1}), "spec.pools.cpu.minReplicas"),
    "gpu pool without gpu": (spec(pools__gpu={"minReplicas": 1}), "pools.gpu needs a GPU in resources.limits"),
    "spearman zero": (spec(quantization={"qualityGate": {"minSpearman": 0}}), "minSpearman must be in (0, 1]"),
    "spearman above one": (spec(quantization={"qualityGate": {"minSpearman": 1.5}}), "minSpearman must be in (0, 1]"),
    "top-k agreement negative": (spec(quantization={"qualityGate": {"minTopKAgreement": -0.1}}),
                                 "minTopKAgreement must be in (0, 1]"),
    "gpu memory watermark zero": (spec(autoscaling={"targets": {"gpuMemoryWatermark": 0}}),
                                  "gpuMemoryWatermark must be in (0, 1]"),
    "ip address as route hostname": (spec(routing={"gateway": {"parentRefs": [{"name": "edge"}],
                                                              "hostnames": ["rerank.example.com", "10.0.0.1"]}}),
                                     "routing.gateway.hostnames entry 10.0.0.1 is an IP address"),
    "weights not 100": (spec(routing={"policy": "fixed", "weights": {"gpu": 60, "cpu": 30}}),
                        "routing.weights.gpu + routing.weights.cpu must be 100"),
    "weights with gpu-first": (spec(routing={"policy": "gpu-first", "weights": {"gpu": 50, "cpu": 50}}),
                               "routing.weights is required with policy fixed and not allowed with other policies"),
    "fixed without weights": (spec(routing={"policy": "fixed"}),
                              "routing.weights is required with policy fixed and not allowed with other policies"),
    "gpu weight without gpu pool": (spec(pools={"cpu": {}},
                                         routing={"policy": "fixed", "weights": {"gpu": 50, "cpu": 50}}),
                                    "routing.weights.gpu is above 0 but pools.gpu is not enabled"),
    "gpu-only without gpu pool": (spec(pools={"cpu": {}}, routing={"policy": "gpu-only"}),
                                  "routing.policy gpu-only needs pools.gpu enabled"),
    "unknown policy": (spec(routing={"policy": "round-robin"}),
                       "policy round-robin is not supported: use one of gpu-first"),
    "existing claim and size": (spec(storage={"existingClaim": "c", "size": "10Gi"}),
                                "storage.existingClaim cannot be combined with size"),
    "deleting a claim we did not create": (spec(storage={"existingClaim": "c", "reclaimPolicy": "Delete"}),
                                           "reclaimPolicy Delete is not allowed with storage.existingClaim"),
    "bad size": (spec(storage={"size": "lots"}), "spec.storage.size"),
    "static without calibration": (spec(quantization={"mode": "static"}),
                                   "quantization.mode static needs quantization.calibrationData"),
    "calibration with dynamic": (spec(quantization={"calibrationData": {"configMapRef": {"name": "c", "key": "k"}}}),
                                 "quantization.calibrationData is only used by mode static"),
    "evaluation data twice": (spec(quantization={"evaluationData": {"configMapRef": {"name": "c", "key": "k"},
                                                                    "path": "e.jsonl"}},
                                   storage={"existingClaim": "c"}),
                              "quantization.evaluationData needs exactly one of configMapRef or path"),
    "unknown target isa": (spec(quantization={"target": "avx9"}), "target avx9 is not supported: use one of auto"),
    "too many retries": (spec(quantization={"backoffLimit": 50}), "spec.quantization.backoffLimit"),
    "extra args repeating --model-id": (spec(pools__cpu={"tei": {"extraArgs": ["--model-id=/other"]}}),
                                        "flag --model-id is not allowed in tei.extraArgs"),
    "a tenant-chosen prometheus url": (spec(autoscaling={"metrics": {"source": "prometheus",
                                                                     "prometheus": {"url": "http://169.254.169.254"}}}),
                                       "autoscaling.metrics.prometheus is not accepted"),
    "no quantization, cpu pool, path model": (spec(model={"path": "m"}, storage={"existingClaim": "c"},
                                                   quantization={"enabled": False}),
                                              "with quantization disabled the CPU pool serves the model as it is"),
    "re-quantize on drift without a gateway": (spec(quantization={"requantizeOnDrift": {"enabled": True}}),
                                               "quantization.requantizeOnDrift samples live traffic through the "
                                               "route's mirror: set routing.gateway"),
    "a live sample too small to judge on": (spec(quantization={"requantizeOnDrift": {"maxPairs": 50}}),
                                            "spec.quantization.requantizeOnDrift.maxPairs"),
    "name too long": (name("r" * 51), "metadata.name must be at most 50 characters"),
    "name with a dot": (name("bge.m3"), "metadata.name bge.m3 must start with a letter"),
    "name starting with a digit": (name("3bge"), "metadata.name 3bge must start with a letter"),
}


def create(api: client.ApiClient, ns: str, body: dict[str, Any]) -> str | None:
    """Server-side dry-run create: the refusal's message, or None when accepted."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "rerank.io", "v1alpha1", ns, "rerankmodels", body, dry_run="All")
    except ApiException as exc:
        assert exc.status == 422, exc
        return str(json.loads(exc.body)["message"])
    return None


def test_the_issue_example_is_accepted(kube: client.ApiClient, namespace: str, crds_installed: list[str]) -> None:
    assert create(kube, namespace, VALID) is None


def test_consent_to_re_quantize_on_drift_with_a_gateway_is_accepted(kube: client.ApiClient, namespace: str,
                                                                     crds_installed: list[str]) -> None:
    body = copy.deepcopy(VALID)
    spec(routing={"gateway": {"parentRefs": [{"name": "edge", "namespace": "infra"}]}},
         quantization={"requantizeOnDrift": {"enabled": True, "maxPairs": 500}})(body)
    assert create(kube, namespace, body) is None


def test_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", CASES)
def test_invalid_manifest_is_refused_with_a_specific_message(case: str, kube: client.ApiClient, namespace: str,
                                                             crds_installed: list[str]) -> None:
    mod, expected = CASES[case]
    body = copy.deepcopy(VALID)
    mod(body)
    message = create(kube, namespace, body)
    assert message is not None, f"{case}: accepted"
    assert expected in message, f"{case}: {message}"
    # The field and the value, never a raw regex, the type in place of the value, or no path at all.
    for useless in ("should match '", 'Invalid value: "string"', 'Invalid value: "object"', "<nil>"):
        assert useless not in message, f"{case}: {message}"
