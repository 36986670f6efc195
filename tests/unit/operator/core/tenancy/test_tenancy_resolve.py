"""resolve() and select_class(): class defaults fill what the tenant left out; the tenant's values are kept."""

from __future__ import annotations

from typing import Any

import pytest

from rerank_operator.core import tenancy
from rerank_operator.core.spec import parse as spec_parse
from tests.unit.operator.core.tenancy.tenancy_helpers import at, model_spec, rclass

GPU_NODES = {"pool": "gpu"}
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
CLASS = rclass(
    at("pools.cpu.images.default", "registry.local/tei:cpu-1.9"),
    at("pools.cpu.images.allowed", ["registry.local/tei:cpu-*"]),
    at("pools.cpu.resourceProfiles", [
        {"name": "small", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}},
        {"name": "large", "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}]),
    at("pools.cpu.defaultResourceProfile", "small"),
    at("pools.gpu.nodeSelector", GPU_NODES),
    at("pools.gpu.tolerations", [GPU_TAINT]),
    at("storage.defaultStorageClassName", "fast"),
    at("storage.defaultSize", "30Gi"),
    at("quantization.defaults.qualityGate.minSpearman", 0.995),
)
CS = CLASS["spec"]


@pytest.mark.parametrize(("name", "tenant", "path", "expected"), [
    ("cpu image from class", model_spec(), "pools.cpu.image", "registry.local/tei:cpu-1.9"),
    ("cpu image kept", model_spec(at("pools.cpu.image", "registry.local/tei:cpu-1.8")), "pools.cpu.image",
     "registry.local/tei:cpu-1.8"),
    ("replicas from class", model_spec(), "pools.cpu.maxReplicas", 4),
    ("min replicas from class", model_spec(), "pools.cpu.minReplicas", 1),
    ("replicas kept", model_spec(at("pools.cpu.maxReplicas", 2)), "pools.cpu.maxReplicas", 2),
    ("default profile", model_spec(), "pools.cpu.resources", {"requests": {"cpu": "1", "memory": "2Gi"}}),
    ("named profile", model_spec(at("pools.cpu.resourceProfile", "large")), "pools.cpu.resources",
     {"requests": {"cpu": "4", "memory": "8Gi"}}),
    ("own resources win over profile", model_spec(at("pools.cpu.resources", {"requests": {"cpu": "3"}}),
                                                  at("pools.cpu.resourceProfile", "large")),
     "pools.cpu.resources", {"requests": {"cpu": "3"}}),
    ("gpu placement from class", model_spec(at("pools.gpu", {"enabled": True})), "pools.gpu.nodeSelector", GPU_NODES),
    ("gpu tolerations from class", model_spec(at("pools.gpu", {"enabled": True})), "pools.gpu.tolerations",
     [GPU_TAINT]),
    ("class selector wins", model_spec(at("pools.gpu.nodeSelector", {"pool": "cpu", "zone": "a"})),
     "pools.gpu.nodeSelector", {"pool": "gpu", "zone": "a"}),
    ("storage size from class", model_spec(), "storage.size", "30Gi"),
    ("storage class from class", model_spec(), "storage.storageClassName", "fast"),
    ("storage size kept", model_spec(at("storage.size", "5Gi")), "storage.size", "5Gi"),
    ("quantizer image from class", model_spec(), "quantization.image",
     "ghcr.io/rerank-operator/rerank-quantizer:0.1.0"),
    ("gate from class", model_spec(), "quantization.qualityGate.minSpearman", 0.995),
    ("gate kept", model_spec(at("quantization.qualityGate.minSpearman", 0.999)),
     "quantization.qualityGate.minSpearman", 0.999),
    ("topK from class", model_spec(), "quantization.qualityGate.topK", 3),
    ("mode from class", model_spec(), "quantization.mode", "dynamic"),
])
def test_resolve_fills_and_keeps(name: str, tenant: dict[str, Any], path: str, expected: Any) -> None:
    value: Any = tenancy.resolve(tenant, CS)
    for key in path.split("."):
        value = value[key]
    assert value == expected, name


def test_resolve_existing_claim_gets_no_size_or_class() -> None:
    spec = tenancy.resolve(model_spec(at("storage.existingClaim", "mine")), CS)
    assert spec["storage"] == {"existingClaim": "mine"}


def test_resolve_does_not_touch_its_input_and_drops_class_name() -> None:
    tenant = model_spec(at("className", "standard"), at("pools.cpu.resourceProfile", "large"))
    before = repr(tenant)
    spec = tenancy.resolve(tenant, CS)
    assert repr(tenant) == before
    assert "className" not in spec and "resourceProfile" not in spec["pools"]["cpu"]


def test_resolve_leaves_an_absent_gpu_pool_absent() -> None:
    assert "gpu" not in tenancy.resolve(model_spec(), CS)["pools"]


def test_resolve_keeps_an_unknown_profile_for_violations() -> None:
    spec = tenancy.resolve(model_spec(at("pools.cpu.resourceProfile", "huge")), CS)
    assert spec["pools"]["cpu"]["resourceProfile"] == "huge" and "resources" not in spec["pools"]["cpu"]
    assert any("resourceProfile huge is not a profile" in v for v in tenancy.violations(spec, CS, "standard"))


def test_resolve_without_class_is_the_spec_itself() -> None:
    tenant = model_spec(at("pools.cpu.maxReplicas", 3))
    assert tenancy.resolve(tenant, None) == tenant


def test_the_defaults_of_an_empty_class_pass_its_own_limits() -> None:
    empty = rclass()["spec"]
    assert tenancy.violations(tenancy.resolve(model_spec(), empty), empty) == []
    with_gpu = model_spec(at("pools.gpu", {"enabled": True}))
    assert tenancy.violations(tenancy.resolve(with_gpu, empty), empty) == []


A = rclass(name="a", default=True, created="2025-01-01T00:00:00Z")
B = rclass(name="b", default=True, created="2025-06-01T00:00:00Z")
C = rclass(name="c")


@pytest.mark.parametrize(("class_name", "classes", "expected", "not_found"), [
    ("c", [A, B, C], "c", None),
    (None, [A, B, C], "b", None),  # the newest default, as for StorageClasses
    ("", [A, C], "a", None),
    ("missing", [A, C], None, "RerankClass missing (spec.className) does not exist"),
    (None, [C], None, "spec.className is empty and no RerankClass is annotated rerank.io/is-default-class: \"true\""),
    (None, [], None, None),  # no classes at all: the operator's built-in defaults
])
def test_select_class(class_name: str | None, classes: list[dict[str, Any]], expected: str | None,
                      not_found: str | None) -> None:
    chosen = tenancy.select_class(class_name, classes)
    assert (chosen["metadata"]["name"] if chosen else None) == expected
    assert tenancy.class_not_found(class_name, classes) == not_found


@pytest.mark.parametrize(("model", "changed", "expected"), [
    ({"spec": {"className": "c"}}, C, True),
    ({"spec": {"className": "c"}}, B, False),
    ({"spec": {}}, B, True),
    ({"spec": {}}, A, False),  # A is a default class, but not the one in use
])
def test_uses_class(model: dict[str, Any], changed: dict[str, Any], expected: bool) -> None:
    assert tenancy.uses_class(model, changed, [A, B, C]) is expected


@pytest.mark.parametrize(("tenant_min", "expected_max"), [(1, 4), (4, 4), (6, 6)])
def test_a_default_maximum_never_falls_below_the_models_minimum(tenant_min: int, expected_max: int) -> None:
    """A class's defaultMaxReplicas (4 here) below the model's own minReplicas would make the effective spec
    contradict itself (minReplicas > maxReplicas); the default gives way to the minimum instead."""
    spec = tenancy.resolve(model_spec(at("pools.cpu.minReplicas", tenant_min)), CS)
    assert spec["pools"]["cpu"]["maxReplicas"] == expected_max
    parsed = spec_parse.parse(spec)
    assert parsed.cpu.min_replicas <= parsed.cpu.max_replicas == expected_max


def test_without_a_class_the_built_in_maximum_gives_way_too() -> None:
    parsed = spec_parse.parse({"model": {"id": "a/b"}, "pools": {"cpu": {"minReplicas": 7}, "gpu": {"minReplicas": 3}}})
    assert (parsed.cpu.max_replicas, parsed.gpu.max_replicas) == (7, 3)
