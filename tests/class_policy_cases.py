"""One table of RerankClass limits cases, run against both enforcers so they cannot drift apart.

The class limits are written twice: as CEL in policies/rerankmodel-class-policy.yaml (the API server refuses a model
beyond its class) and in Python in ``rerank_operator.core.tenancy.violations`` (the operator reports ``ClassViolation``
for a stored model whose class was tightened later). Each case is a class spec and a model spec as a user writes
them (the API server adds the CRDs' defaults) and what both must do with it: ``refused`` is a fragment both the
policy's refusal and the single violation the operator finds must carry (``{cls}`` stands for the class's name),
or None when both must accept the model.

tests/unit/operator/core/tenancy/test_tenancy_class_policy_cases.py runs the Python side (with the CRDs' defaults
applied from crds/); tests/cluster/test_class_policy_cases.py runs the policy on the real API server. A case is added
here, once.

Known difference kept out of the fragments: the replicas message quotes ``minReplicas`` as the tenant wrote it in
the policy (0 when unset) and as resolved from the class's ``defaultMinReplicas`` in the operator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# A class with every limit tightened below the CRD's defaults (and above what the model CRD defaults to).
LIMITS: dict[str, Any] = {
    "pools": {"cpu": {"maxReplicas": 4, "maxResources": {"cpu": "4", "memory": "16Gi"}}, "gpu": {"allowed": False}},
    "storage": {"maxSize": "50Gi", "allowedStorageClassNames": ["fast", "standard"], "allowExistingClaim": False},
    "modelSources": {"hubOrganizations": ["BAAI", "mixedbread-ai"]},
    "quantization": {"minimumQualityGate": {"minSpearman": 0.97, "minTopKAgreement": 0.85}},
}
DEFAULTS: dict[str, Any] = {}  # the CRD's defaults only (the chart's default class)
SECURE: dict[str, Any] = {"security": {"requireApiKey": True}}
DIRECT_ONLY: dict[str, Any] = {"metrics": {"allowedSources": ["direct"]}}
PLACEMENT: dict[str, Any] = {"pools": {"cpu": {"allowTenantPlacement": True}}}
GPU_ONLY: dict[str, Any] = {"pools": {"cpu": {"allowed": False}}}
REMOTE_CODE: dict[str, Any] = {"modelSources": {"allowRemoteCode": True}}
SCALE_TO_ZERO: dict[str, Any] = {"scaleToZero": {"allowed": True, "minIdleSeconds": 600, "maxIdleSeconds": 3600}}
LONG_IDLE: dict[str, Any] = {"scaleToZero": {"allowed": True, "minIdleSeconds": 1800}}  # above the model's 900
ZERO_DEFAULT: dict[str, Any] = {"pools": {"cpu": {"defaultMinReplicas": 0}}}  # scale to zero itself not allowed

# Every class a case names, by a short key; the cluster test creates one RerankClass per key.
CLASSES: dict[str, dict[str, Any]] = {"limits": LIMITS, "defaults": DEFAULTS, "secure": SECURE,
                                      "direct-only": DIRECT_ONLY, "placement": PLACEMENT, "gpu-only": GPU_ONLY,
                                      "remote-code": REMOTE_CODE, "scale-to-zero": SCALE_TO_ZERO,
                                      "long-idle": LONG_IDLE, "zero-default": ZERO_DEFAULT}

GPU_POOL: dict[str, Any] = {"enabled": True, "resources": {"limits": {"nvidia.com/gpu": 1}}}
API_KEY: dict[str, Any] = {"tei": {"apiKeySecretRef": {"name": "tei", "key": "api-key"}}}
# A model at zero pods is woken through its HTTPRoute (the CRD refuses every enabled pool at 0 without a gateway).
ROUTED: dict[str, Any] = {"gateway": {"parentRefs": [{"name": "edge"}]}}
AT_ZERO: dict[str, Any] = {"pools": {"cpu": {"minReplicas": 0}}, "routing": ROUTED}


@dataclass(frozen=True)
class Case:
    name: str
    class_key: str  # a key of CLASSES
    spec: dict[str, Any] = field(default_factory=dict)  # merged over BASE_SPEC (top-level keys replaced)
    refused: str | None = None  # a fragment of both refusals, {cls} for the class name; None: both accept

    def model_spec(self) -> dict[str, Any]:
        return {"model": {"id": "BAAI/bge-reranker-v2-m3"}, **self.spec}

    def fragment(self, class_name: str) -> str:
        assert self.refused is not None
        return self.refused.replace("{cls}", class_name)


CASES: list[Case] = [
    # -- replicas ----------------------------------------------------------------------------------------------------
    Case("within every limit", "limits", {
        "pools": {"cpu": {"maxReplicas": 3, "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}},
        "storage": {"size": "40Gi", "storageClassName": "fast"},
        "quantization": {"qualityGate": {"minSpearman": 0.98, "minTopKAgreement": 0.9}}}),
    Case("replicas above the class", "limits", {"pools": {"cpu": {"maxReplicas": 10}}},
         "maxReplicas 10) are above the limit of RerankClass {cls}: pools.cpu.maxReplicas is 4"),
    Case("minimum above the class", "limits", {"pools": {"cpu": {"minReplicas": 5, "maxReplicas": 5}}},
         "pools.cpu replicas (minReplicas 5, maxReplicas 5) are above the limit of RerankClass {cls}: "
         "pools.cpu.maxReplicas is 4"),
    Case("replicas at the class limit", "limits", {"pools": {"cpu": {"minReplicas": 4, "maxReplicas": 4}}}),
    # -- images ------------------------------------------------------------------------------------------------------
    Case("image outside the class", "limits", {"pools": {"cpu": {"image": "docker.io/evil/tei:1"}}},
         "pools.cpu.image docker.io/evil/tei:1 is not allowed by RerankClass {cls}: pools.cpu.images.allowed is "
         "[ghcr.io/huggingface/text-embeddings-inference:cpu-*]"),
    Case("image matching a prefix entry", "limits",
         {"pools": {"cpu": {"image": "ghcr.io/huggingface/text-embeddings-inference:cpu-1.8"}}}),
    Case("a gpu image on the cpu pool", "defaults",
         {"pools": {"cpu": {"image": "ghcr.io/huggingface/text-embeddings-inference:cuda-1.9"}}},
         "pools.cpu.image ghcr.io/huggingface/text-embeddings-inference:cuda-1.9 is not allowed by RerankClass {cls}"),
    # -- resources ---------------------------------------------------------------------------------------------------
    Case("cpu above maxResources", "limits", {"pools": {"cpu": {"resources": {"requests": {"cpu": "8"}}}}},
         "pools.cpu.resources requests.cpu=8 exceed the limit of RerankClass {cls}: pools.cpu.maxResources is {"),
    Case("resources at the limit in other units", "limits",
         {"pools": {"cpu": {"resources": {"requests": {"cpu": "4000m"}, "limits": {"memory": "16384Mi"}}}}}),
    Case("memory just above the limit", "limits", {"pools": {"cpu": {"resources": {"limits": {"memory": "16385Mi"}}}}},
         "pools.cpu.resources limits.memory=16385Mi exceed the limit of RerankClass {cls}"),
    Case("a resource the class does not name", "limits",
         {"pools": {"cpu": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}},
         "pools.cpu.resources limits.nvidia.com/gpu=1 exceed the limit of RerankClass {cls}"),
    Case("unknown resource profile", "limits", {"pools": {"cpu": {"resourceProfile": "huge"}}},
         "pools.cpu.resourceProfile huge is not a profile of RerankClass {cls}: "
         "pools.cpu.resourceProfiles are [default]"),
    Case("known resource profile", "limits", {"pools": {"cpu": {"resourceProfile": "default"}}}),
    # -- pools -------------------------------------------------------------------------------------------------------
    Case("gpu pool the class forbids", "limits", {"pools": {"gpu": GPU_POOL}},
         "pools.gpu is enabled but RerankClass {cls} does not allow it (pools.gpu.allowed: false)"),
    Case("a disabled gpu pool is not checked", "limits", {"pools": {"gpu": {"enabled": False, "maxReplicas": 9}}}),
    Case("cpu pool the class forbids", "gpu-only", {},
         "pools.cpu is enabled but RerankClass {cls} does not allow it (pools.cpu.allowed: false)"),
    Case("gpu only where cpu is forbidden", "gpu-only", {"pools": {"cpu": {"enabled": False}, "gpu": GPU_POOL}}),
    # -- placement ---------------------------------------------------------------------------------------------------
    Case("own nodeSelector", "limits", {"pools": {"cpu": {"nodeSelector": {"pool": "gpu"}}}},
         "pools.cpu.nodeSelector, tolerations and affinity come from RerankClass {cls} "
         "(pools.cpu.allowTenantPlacement: false): remove them from the RerankModel"),
    Case("own tolerations", "limits", {"pools": {"cpu": {"tolerations": [{"operator": "Exists"}]}}},
         "(pools.cpu.allowTenantPlacement: false)"),
    Case("own placement where the class allows it", "placement",
         {"pools": {"cpu": {"nodeSelector": {"pool": "gpu"}, "tolerations": [{"operator": "Exists"}]}}}),
    # -- API key -----------------------------------------------------------------------------------------------------
    Case("no API key where one is required", "secure", {},
         "pools.cpu.tei.apiKeySecretRef is required by RerankClass {cls} (security.requireApiKey: true)"),
    Case("an API key where one is required", "secure", {"pools": {"cpu": API_KEY}}),
    # -- model sources -----------------------------------------------------------------------------------------------
    Case("hub organisation outside the class", "limits", {"model": {"id": "evil/reranker"}},
         "model.id evil/reranker is not from a hub organisation RerankClass {cls} allows: "
         "modelSources.hubOrganizations is [BAAI, mixedbread-ai]"),
    Case("hub organisation in another case", "limits", {"model": {"id": "baai/bge-reranker-base"}}),
    Case("local path not allowed", "defaults", {"model": {"path": "uploads/m"}, "storage": {"existingClaim": "data"}},
         "model.path is not allowed by RerankClass {cls} (modelSources.allowLocalPaths: false)"),
    Case("remote code not allowed", "limits", {"model": {"id": "BAAI/jina-like", "trustRemoteCode": True}},
         "model.trustRemoteCode is not allowed by RerankClass {cls} (modelSources.allowRemoteCode: false)"),
    Case("remote code where the class allows it", "remote-code",
         {"model": {"id": "BAAI/jina-like", "trustRemoteCode": True}}),
    Case("remote code off needs no permission", "limits", {"model": {"id": "BAAI/x", "trustRemoteCode": False}}),
    # -- storage -----------------------------------------------------------------------------------------------------
    Case("storage above the class", "limits", {"storage": {"size": "51Gi"}},
         "storage.size 51Gi is above the limit of RerankClass {cls}: storage.maxSize is 50Gi"),
    Case("storage at the limit in other units", "limits", {"storage": {"size": "51200Mi"}}),
    Case("storage class outside the class", "limits", {"storage": {"storageClassName": "gold"}},
         "storage.storageClassName gold is not allowed by RerankClass {cls}: "
         "storage.allowedStorageClassNames is [fast, standard]"),
    Case("existing claim not allowed", "limits", {"storage": {"existingClaim": "data"}},
         "storage.existingClaim is not allowed by RerankClass {cls} (storage.allowExistingClaim: false)"),
    Case("existing claim allowed", "defaults", {"storage": {"existingClaim": "data"}}),
    # -- quantization ------------------------------------------------------------------------------------------------
    Case("spearman below the floor", "limits", {"quantization": {"qualityGate": {"minSpearman": 0.9}}},
         "quantization.qualityGate.minSpearman 0.9 is below the floor of RerankClass {cls}: "
         "quantization.minimumQualityGate.minSpearman is 0.97"),
    Case("top-k agreement below the floor", "limits", {"quantization": {"qualityGate": {"minTopKAgreement": 0.5}}},
         "quantization.qualityGate.minTopKAgreement 0.5 is below the floor of RerankClass {cls}: "
         "quantization.minimumQualityGate.minTopKAgreement is 0.85"),
    Case("gate at the floor", "limits",
         {"quantization": {"qualityGate": {"minSpearman": 0.97, "minTopKAgreement": 0.85}}}),
    Case("disabled quantization skips the floor", "limits",
         {"quantization": {"enabled": False, "qualityGate": {"minSpearman": 0.5}}}),
    Case("quantizer image outside the class", "defaults", {"quantization": {"image": "evil/quantizer:1"}},
         "quantization.image evil/quantizer:1 is not allowed by RerankClass {cls}: "
         "quantization.images.allowed is [ghcr.io/rerank-operator/rerank-quantizer:*]"),
    Case("quantizer above maxResources", "defaults", {"quantization": {"resources": {"limits": {"memory": "1Ti"}}}},
         "quantization.resources limits.memory=1Ti exceed the limit of RerankClass {cls}: "
         "quantization.maxResources is {"),
    # -- metrics sources ---------------------------------------------------------------------------------------------
    Case("metrics source the class forbids", "direct-only", {"autoscaling": {"metrics": {"source": "prometheus"}}},
         "autoscaling.metrics.source prometheus is not allowed by RerankClass {cls}: "
         "metrics.allowedSources is [direct]"),
    Case("metrics source the class allows", "direct-only", {"autoscaling": {"metrics": {"source": "direct"}}}),
    # -- scale to zero (every enabled pool's minReplicas, the model's or the class's default, at 0) -------------------
    Case("scale to zero where the class allows it", "scale-to-zero", AT_ZERO),
    Case("scale to zero the default class forbids", "defaults", AT_ZERO,
         "scale to zero (minReplicas 0 on every enabled pool) is not allowed by RerankClass {cls}: "
         "scaleToZero.allowed is false"),
    Case("both pools at zero", "scale-to-zero", {
        "pools": {"cpu": {"minReplicas": 0}, "gpu": {**GPU_POOL, "minReplicas": 0}}, "routing": ROUTED,
        "autoscaling": {"idleSeconds": 3600}}),
    Case("idle time below the class's bounds", "scale-to-zero", {**AT_ZERO, "autoscaling": {"idleSeconds": 60}},
         "autoscaling.idleSeconds 60 is outside the bounds of RerankClass {cls}: scaleToZero allows 600-3600"),
    Case("idle time above the class's bounds", "scale-to-zero", {**AT_ZERO, "autoscaling": {"idleSeconds": 7200}},
         "autoscaling.idleSeconds 7200 is outside the bounds of RerankClass {cls}: scaleToZero allows 600-3600"),
    Case("the default idle time outside the class's bounds", "long-idle", AT_ZERO,
         "autoscaling.idleSeconds 900 is outside the bounds of RerankClass {cls}: scaleToZero allows 1800-86400"),
    Case("idle time is not bounded without scale to zero", "scale-to-zero", {"autoscaling": {"idleSeconds": 60}}),
    Case("only the gpu pool at zero is not scale to zero", "defaults",
         {"pools": {"cpu": {"minReplicas": 1}, "gpu": {**GPU_POOL, "minReplicas": 0}}}),
    Case("a class default of minReplicas 0 scales to zero too", "zero-default", {"routing": ROUTED},
         "scale to zero (minReplicas 0 on every enabled pool) is not allowed by RerankClass {cls}: "
         "scaleToZero.allowed is false"),
]
