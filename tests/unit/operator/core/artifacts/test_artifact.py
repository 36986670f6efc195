"""The artifact id changes exactly when the bytes the Job would publish can change."""

from __future__ import annotations

import pytest

from rerank_operator.core.artifacts import identity as artifact
from tests.unit.operator.rerankmodel_gen import Mod, model, replicas, revision, set_, spec_of, without

BASELINE = artifact.artifact_id(spec_of(model()))

SAME_BYTES: dict[str, Mod] = {
    "cpu replicas": replicas("cpu", 5),
    "gpu max replicas": set_("pools.gpu.maxReplicas", 7),
    "cpu resources": set_("pools.cpu.resources", {"requests": {"cpu": "8"}}),
    "quantizer resources": set_("quantization.resources", {"limits": {"memory": "64Gi"}}),
    "job deadline": set_("quantization.activeDeadlineSeconds", 7200),
    "job retries": set_("quantization.backoffLimit", 5),
    "tei image": set_("pools.cpu.image", "ghcr.io/huggingface/text-embeddings-inference:cpu-1.9.3"),
    "tei settings": set_("pools.cpu.tei", {"maxBatchTokens": 4096}),
    "routing": set_("routing", {"policy": "cpu-only"}),
    "storage size": set_("storage.size", "100Gi"),
    "token secret": set_("model.tokenSecretRef", {"name": "other", "key": "k"}),
    "autoscaling": set_("autoscaling.enabled", True),
    "explicit defaults": set_("quantization", {"mode": "dynamic", "target": "auto", "operators": ["MatMul"]}),
}

NEW_BYTES: dict[str, Mod] = {
    "revision": revision("0123456789abcdef"),
    "model id": set_("model.id", "BAAI/bge-reranker-base"),
    "no revision": without("model.revision"),
    "mode static": set_("quantization", {"mode": "static", "calibrationData": {"path": "cal.jsonl"}}),
    "calibration data": set_("quantization", {"mode": "static", "calibrationData": {"path": "other.jsonl"}}),
    "target": set_("quantization.target", "avx2"),
    "recipe fixed": set_("quantization.recipe", "fixed"),
    "per channel": set_("quantization.perChannel", False),
    "reduce range": set_("quantization.reduceRange", True),
    "operators": set_("quantization.operators", ["MatMul", "Attention"]),
    "optimization level": set_("quantization.optimizationLevel", 2),
    "quality gate": set_("quantization.qualityGate", {"minSpearman": 0.95}),
    "top k": set_("quantization.qualityGate", {"topK": 5}),
    "evaluation data": set_("quantization.evaluationData", {"configMapRef": {"name": "pairs", "key": "a.jsonl"}}),
    "quantizer image": set_("quantization.image", "registry.example/quantizer:0.2.0"),
    "time budget": set_("quantization.timeBudgetSeconds", 120),
}


@pytest.mark.parametrize("change", SAME_BYTES)
def test_changes_that_keep_the_bytes_keep_the_id(change: str) -> None:
    assert artifact.artifact_id(spec_of(model(SAME_BYTES[change]))) == BASELINE


@pytest.mark.parametrize("change", NEW_BYTES)
def test_changes_that_alter_the_bytes_change_the_id(change: str) -> None:
    assert artifact.artifact_id(spec_of(model(NEW_BYTES[change]))) != BASELINE


def test_each_byte_change_gives_its_own_id() -> None:
    ids = {artifact.artifact_id(spec_of(model(m))) for m in NEW_BYTES.values()}
    assert len(ids) == len(NEW_BYTES)


def test_operator_order_does_not_matter() -> None:
    a = artifact.artifact_id(spec_of(model(set_("quantization.operators", ["MatMul", "Gather"]))))
    b = artifact.artifact_id(spec_of(model(set_("quantization.operators", ["Gather", "MatMul"]))))
    assert a == b


def test_id_is_a_label_value_and_directory_name() -> None:
    assert BASELINE is not None and len(BASELINE) == artifact.ID_LENGTH and BASELINE.isalnum() and BASELINE.islower()


def test_no_artifact_without_quantization() -> None:
    assert artifact.artifact_id(spec_of(model(set_("quantization.enabled", False)))) is None
