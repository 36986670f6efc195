"""violations(): the operator's double-check of an effective spec against its class, one case per limit."""

from __future__ import annotations

from decimal import Decimal

import pytest

from rerank_operator.core import tenancy
from tests.unit.operator.core.tenancy.tenancy_helpers import Mod, at, model_spec, rclass

CLASS = rclass(
    at("pools.cpu.maxReplicas", 4),
    at("pools.cpu.maxResources", {"cpu": "4", "memory": "16Gi"}),
    at("pools.gpu.allowed", False),
    at("storage.maxSize", "50Gi"),
    at("storage.allowedStorageClassNames", ["fast", "standard"]),
    at("storage.allowExistingClaim", False),
    at("modelSources.hubOrganizations", ["BAAI", "mixedbread-ai"]),
    at("quantization.minimumQualityGate", {"minSpearman": 0.97, "minTopKAgreement": 0.85}),
    at("security.requireApiKey", True),
)["spec"]
KEY = at("pools.cpu.tei.apiKeySecretRef", {"name": "key", "key": "api-key"})


def effective(*mods: Mod) -> dict:
    return tenancy.resolve(model_spec(KEY, *mods), CLASS)


def test_a_model_within_the_class_has_no_violations() -> None:
    assert tenancy.violations(effective(at("model.id", "baai/bge-reranker-base")), CLASS, "standard") == []


@pytest.mark.parametrize(("mods", "expected"), [
    ((at("pools.cpu.maxReplicas", 10),),
     "pools.cpu replicas (minReplicas 1, maxReplicas 10) are above the limit of RerankClass standard: "
     "pools.cpu.maxReplicas is 4"),
    ((at("pools.cpu.minReplicas", 5), at("pools.cpu.maxReplicas", 5)), "pools.cpu.maxReplicas is 4"),
    ((at("pools.cpu.image", "docker.io/evil/tei:latest"),),
     "pools.cpu.image docker.io/evil/tei:latest is not allowed by RerankClass standard: pools.cpu.images.allowed is "
     "[ghcr.io/huggingface/text-embeddings-inference:cpu-*]"),
    ((at("pools.cpu.resources", {"requests": {"cpu": "8"}, "limits": {"memory": "16Gi"}}),),
     "pools.cpu.resources requests.cpu=8 exceed the limit of RerankClass standard: pools.cpu.maxResources is "
     "{cpu: 4, memory: 16Gi}"),
    ((at("pools.cpu.resources", {"limits": {"nvidia.com/gpu": 1}}),), "limits.nvidia.com/gpu=1 exceed the limit"),
    ((at("pools.gpu", {"enabled": True, "tei": {"apiKeySecretRef": {"name": "k", "key": "k"}}}),),
     "pools.gpu is enabled but RerankClass standard does not allow it (pools.gpu.allowed: false)"),
    ((at("pools.cpu.nodeSelector", {"pool": "gpu"}),), "pools.cpu.allowTenantPlacement: false"),
    ((at("pools.cpu.tolerations", [{"operator": "Exists"}]),), "pools.cpu.allowTenantPlacement: false"),
    ((at("pools.cpu.affinity", {"nodeAffinity": {}}),), "pools.cpu.allowTenantPlacement: false"),
    ((at("pools.cpu.tei", {}),), "pools.cpu.tei.apiKeySecretRef is required by RerankClass standard"),
    ((at("model.id", "evil/model"),),
     "model.id evil/model is not from a hub organisation RerankClass standard allows: "
     "modelSources.hubOrganizations is [BAAI, mixedbread-ai]"),
    ((at("model.id", "bert-base-uncased"),), "model.id bert-base-uncased is not from a hub organisation"),
    ((at("storage.size", "51Gi"),),
     "storage.size 51Gi is above the limit of RerankClass standard: storage.maxSize is 50Gi"),
    ((at("storage.storageClassName", "gold"),),
     "storage.storageClassName gold is not allowed by RerankClass standard: "
     "storage.allowedStorageClassNames is [fast, standard]"),
    ((at("storage", {"existingClaim": "data"}),), "storage.existingClaim is not allowed by RerankClass standard"),
    ((at("quantization.qualityGate.minSpearman", 0.9),),
     "quantization.qualityGate.minSpearman 0.9 is below the floor of RerankClass standard: "
     "quantization.minimumQualityGate.minSpearman is 0.97"),
    ((at("quantization.qualityGate.minTopKAgreement", 0.5),), "minimumQualityGate.minTopKAgreement is 0.85"),
    ((at("quantization.image", "evil/quantizer:1"),), "quantization.image evil/quantizer:1 is not allowed"),
    ((at("quantization.resources", {"limits": {"memory": "1Ti"}}),),
     "quantization.resources limits.memory=1Ti exceed the limit of RerankClass standard: quantization.maxResources is"),
])
def test_each_limit_is_reported_by_name(mods: tuple[Mod, ...], expected: str) -> None:
    found = tenancy.violations(effective(*mods), CLASS, "standard")
    assert len(found) == 1, found
    assert expected in found[0]


def test_a_local_path_needs_allow_local_paths() -> None:
    spec = {**CLASS, "storage": {**CLASS["storage"], "allowExistingClaim": True}}
    found = tenancy.violations(effective(at("model", {"path": "uploads/m"}), at("storage.existingClaim", "data")),
                               spec, "standard")
    assert found == ["model.path is not allowed by RerankClass standard (modelSources.allowLocalPaths: false): "
                     "use model.id from an allowed hub organisation"]


def test_disabled_quantization_skips_the_quality_floor() -> None:
    spec = effective(at("quantization", {"enabled": False, "qualityGate": {"minSpearman": 0.5}}))
    assert tenancy.violations(spec, CLASS, "standard") == []


def test_a_disabled_gpu_pool_is_not_checked() -> None:
    assert tenancy.violations(effective(at("pools.gpu", {"enabled": False, "maxReplicas": 99})), CLASS, "x") == []


@pytest.mark.parametrize(("image", "allowed", "ok"), [
    ("ghcr.io/x/tei:cpu-1.9", ["ghcr.io/x/tei:cpu-*"], True),
    ("ghcr.io/x/tei:cuda-1.9", ["ghcr.io/x/tei:cpu-*"], False),
    ("anything", ["*"], True),
    ("ghcr.io/x/tei:cpu-1.9", ["ghcr.io/x/tei:cpu-1.9"], True),
    ("ghcr.io/x/tei:cpu-1.9-evil", ["ghcr.io/x/tei:cpu-1.9"], False),
])
def test_image_allowed(image: str, allowed: list[str], ok: bool) -> None:
    assert tenancy.image_allowed(image, allowed) is ok


@pytest.mark.parametrize(("value", "expected"), [
    ("500m", Decimal("0.5")), (2, Decimal(2)), ("16Gi", Decimal(16 * 2**30)), ("1G", Decimal(10**9)),
    ("1.5", Decimal("1.5")), ("1e3", Decimal(1000)), ("+20Gi", Decimal(20 * 2**30)),
])
def test_parse_quantity(value: str | int, expected: Decimal) -> None:
    assert tenancy.parse_quantity(value) == expected


@pytest.mark.parametrize("bad", ["", "Gi", "1Zi", "one"])
def test_parse_quantity_refuses_garbage(bad: str) -> None:
    with pytest.raises(ValueError):
        tenancy.parse_quantity(bad)


def test_a_metrics_source_the_class_does_not_allow_is_reported() -> None:
    direct_only = {**CLASS, "metrics": {"allowedSources": ["direct"]}}
    found = tenancy.violations(tenancy.resolve(model_spec(KEY, at("autoscaling.metrics.source", "prometheus")),
                                               direct_only), direct_only, "standard")
    assert found == ["autoscaling.metrics.source prometheus is not allowed by RerankClass standard: "
                     "metrics.allowedSources is [direct]"]
    assert tenancy.violations(effective(at("autoscaling.metrics.source", "prometheus")), CLASS, "standard") == []


def test_scale_to_zero_defaults_for_objects_that_predate_the_fields() -> None:
    """A stored class without ``scaleToZero`` forbids it (the CRD's default); a model without ``idleSeconds`` is
    held to the class's bounds with the CRD's 900."""
    zero = {"model": {"id": "BAAI/m"}, "pools": {"cpu": {"enabled": True, "minReplicas": 0}}}
    assert tenancy.violations(zero, {}, "old") == [
        "scale to zero (minReplicas 0 on every enabled pool) is not allowed by RerankClass old: "
        "scaleToZero.allowed is false"]
    assert tenancy.violations(zero, {"scaleToZero": {"allowed": True}}, "c") == []
    assert tenancy.violations(zero, {"scaleToZero": {"allowed": True, "maxIdleSeconds": 600}}, "c") == [
        "autoscaling.idleSeconds 900 is outside the bounds of RerankClass c: scaleToZero allows 300-600"]
    kept = {**zero, "pools": {"cpu": {"enabled": True, "minReplicas": 0}, "gpu": {"enabled": True}}}
    assert tenancy.violations(kept, {}, "old") == []  # an unset minReplicas is the built-in 1: not at zero
