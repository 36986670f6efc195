"""Shared artifacts, the pure part (``core/artifacts/sharing.py``): the class's store, which specs may share, the
shared id, the record of a published artifact and the collector's lifecycle."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rerank_operator.core import platform
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.artifacts import sharing
from rerank_operator.core.spec.model import RerankModelSpec
from tests.unit.operator.rerankmodel_gen import Mod, model, replicas, revision, set_, spec_of, without

REPOSITORY = "registry.platform.svc:5000/rerank/artifacts"
STORE = platform.ArtifactStore(repository=REPOSITORY, namespace="rerank-artifacts", push_secret="artifact-push")
GATEWAY = {"parentRefs": [{"name": "edge", "namespace": "infra"}]}
#: The fixtures' base model reads the hub with a token: a model without one is the plain, shareable hub model.
PUBLIC = without("model.tokenSecretRef")


def shareable(*mods: Mod) -> RerankModelSpec:
    return spec_of(model(PUBLIC, *mods))


# --- the class's store ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("class_spec", [
    None,
    {},
    {"artifactStore": None},
    {"artifactStore": {"enabled": False, "repository": REPOSITORY, "namespace": "rerank-artifacts"}},
    {"artifactStore": {"namespace": "rerank-artifacts"}},  # no repository: nothing to share through
])
def test_a_class_without_an_enabled_store_has_none(class_spec: dict[str, Any] | None) -> None:
    assert platform.ArtifactStore.from_class(class_spec) is None


def test_the_store_is_read_from_the_class() -> None:
    store = platform.ArtifactStore.from_class({"artifactStore": {
        "enabled": True, "repository": REPOSITORY + "/", "namespace": "rerank-artifacts", "pushSecret": "push",
        "pullSecret": "pull", "insecure": True, "unusedGraceSeconds": 600}})
    assert store == platform.ArtifactStore(repository=REPOSITORY, namespace="rerank-artifacts", push_secret="push",
                                          pull_secret="pull", insecure=True, unused_grace_seconds=600)
    assert store.host == "registry.platform.svc:5000"
    assert store.path == "rerank/artifacts"


def test_the_stores_defaults() -> None:
    store = platform.ArtifactStore.from_class({"artifactStore": {"repository": "registry.example/a",
                                                                "namespace": "store"}})
    assert store is not None
    assert (store.push_secret, store.pull_secret, store.insecure) == (None, None, False)
    assert store.unused_grace_seconds == platform.DEFAULT_UNUSED_GRACE_SECONDS == 86400
    assert (store.host, store.path) == ("registry.example", "a")


# --- what may be shared --------------------------------------------------------------------------------------------

def test_a_plain_hub_model_may_be_shared() -> None:
    spec = shareable()
    assert sharing.private_reason(spec) is None
    assert sharing.store_for(spec, STORE) is STORE
    assert sharing.store_for(spec, None) is None


def test_tenants_on_different_cpus_get_different_shared_artifacts() -> None:
    """The shared Job chooses and times its recipe on the class's CPU node pool: two classes on different node pools
    (an AVX2 one, an AMX one) get artifacts of their own for the same hub model; a class without a placement keeps the
    id it had."""
    def store_on(pool: str | None) -> platform.ArtifactStore:
        klass: dict[str, Any] = {"artifactStore": {"repository": REPOSITORY, "namespace": "rerank-artifacts"}}
        if pool:
            klass["pools"] = {"cpu": {"nodeSelector": {"cpu-pool": pool}}}
        found = platform.ArtifactStore.from_class(klass)
        assert found is not None
        return found

    spec = shareable()
    avx2, amx, anywhere = (sharing.shared_id(spec, store_on(p)) for p in ("avx2", "amx", None))
    assert len({avx2, amx, anywhere}) == 3
    assert sharing.shared_id(spec, store_on("avx2")) == avx2  # stable
    assert anywhere == sharing.shared_id(spec, dataclasses.replace(STORE, push_secret=None))


PRIVATE: dict[str, tuple[tuple[Mod, ...], str]] = {
    "weights on the tenant's volume": ((set_("storage", {"existingClaim": "theirs"}),
                                        set_("model", {"path": "uploads/my-reranker"})), "spec.model.path"),
    "hub token": ((set_("model.tokenSecretRef", {"name": "hf", "key": "token"}),), "spec.model.tokenSecret"),
    "evaluation data": ((set_("quantization.evaluationData", {"configMapRef": {"name": "pairs", "key": "e.jsonl"}}),),
                        "spec.quantization.evaluationData"),
    "calibration data": ((set_("quantization", {"mode": "static",
                                                "calibrationData": {"configMapRef": {"name": "cal", "key": "c"}}}),),
                         "spec.quantization.calibrationData"),
    "re-quantization on drift": ((set_("routing", {"gateway": GATEWAY}),
                                  set_("quantization.requantizeOnDrift", {"enabled": True})),
                                 "spec.quantization.requantizeOnDrift"),
    "quantization disabled": ((set_("quantization.enabled", False),), "quantization is disabled"),
}


@pytest.mark.parametrize("case", PRIVATE)
def test_an_artifact_that_depends_on_the_tenant_is_never_shared(case: str) -> None:
    mods, field_name = PRIVATE[case]
    spec = shareable(*mods)
    reason = sharing.private_reason(spec)
    assert reason is not None and field_name in reason
    assert sharing.store_for(spec, STORE) is None


def test_a_tenant_with_remote_code_cannot_write_the_store() -> None:
    """A model whose export runs its repository's own Python (trustRemoteCode, where its class allows it) is built
    by a Job of its own, in its namespace: never by the shared Job, where the store's push credentials are mounted."""
    spec = shareable(set_("model.trustRemoteCode", True))
    reason = sharing.private_reason(spec)
    assert reason is not None and "spec.model.trustRemoteCode" in reason
    assert sharing.store_for(spec, STORE) is None


def test_a_re_quantization_round_on_the_live_sample_is_never_shared() -> None:
    spec = shareable()
    live = dataclasses.replace(spec, quantization=dataclasses.replace(spec.quantization, live_round="r3"))
    reason = sharing.private_reason(live)
    assert reason is not None and "requantizeOnDrift" in reason
    assert sharing.store_for(live, STORE) is None


# --- the shared id -------------------------------------------------------------------------------------------------

BASELINE = sharing.shared_id(shareable(), STORE)


def test_the_shared_id_is_an_artifact_id_of_its_own() -> None:
    spec = shareable()
    assert len(BASELINE) == artifact.ID_LENGTH
    assert int(BASELINE, 16) >= 0  # hex
    assert artifact.artifact_id(spec) != BASELINE
    assert sharing.shared_id(shareable(), STORE) == BASELINE  # deterministic


SAME_BYTES: dict[str, Mod] = {
    "cpu replicas": replicas("cpu", 5),
    "gpu max replicas": set_("pools.gpu.maxReplicas", 7),
    "quantizer resources": set_("quantization.resources", {"limits": {"memory": "64Gi"}}),
    "job deadline": set_("quantization.activeDeadlineSeconds", 7200),
    "routing": set_("routing", {"policy": "cpu-only"}),
    "storage size": set_("storage.size", "100Gi"),
}


@pytest.mark.parametrize("change", SAME_BYTES)
def test_changes_that_keep_the_bytes_keep_the_shared_id(change: str) -> None:
    assert sharing.shared_id(shareable(SAME_BYTES[change]), STORE) == BASELINE


def test_the_namespace_is_no_input_of_the_shared_id() -> None:
    body = model(PUBLIC)
    body["metadata"].update({"namespace": "another-tenant", "name": "other-name", "uid": "another-uid"})
    assert sharing.shared_id(spec_of(body), STORE) == BASELINE


NEW_BYTES: dict[str, Mod] = {
    "revision": revision("0123456789abcdef"),
    "quantizer image": set_("quantization.image", "registry.example/quantizer:0.2.0"),
    "quality gate": set_("quantization.qualityGate", {"minSpearman": 0.95}),
    "recipe": set_("quantization.recipe", "fixed"),
    # What the built id leaves out because it is the same for every model of one namespace:
    "hub endpoint": set_("model.hub", {"endpoint": "https://hub-mirror.internal"}),
    "hub proxy": set_("model.hub", {"proxy": "http://proxy.internal:3128"}),
    "trust remote code": set_("model.trustRemoteCode", True),
    "cpu pool batch tokens": set_("pools.cpu.tei.maxBatchTokens", 2048),
    "cpu pool threads": set_("pools.cpu.resources", {"limits": {"cpu": "6"}}),
}


@pytest.mark.parametrize("change", NEW_BYTES)
def test_changes_that_alter_the_bytes_change_the_shared_id(change: str) -> None:
    assert sharing.shared_id(shareable(NEW_BYTES[change]), STORE) != BASELINE


@pytest.mark.parametrize("change", ["hub endpoint", "trust remote code", "cpu pool batch tokens"])
def test_the_shared_id_covers_what_the_built_id_leaves_out(change: str) -> None:
    # The built id is per namespace: these do not change it, yet two namespaces can differ in them.
    assert artifact.artifact_id(shareable(NEW_BYTES[change])) == artifact.artifact_id(shareable())
    assert sharing.shared_id(shareable(NEW_BYTES[change]), STORE) != BASELINE


def test_each_byte_change_gives_its_own_shared_id() -> None:
    ids = {sharing.shared_id(shareable(m), STORE) for m in NEW_BYTES.values()}
    assert len(ids) == len(NEW_BYTES)


def test_another_store_gives_another_shared_id() -> None:
    other = dataclasses.replace(STORE, repository="registry.platform.svc:5000/rerank/other")
    assert sharing.shared_id(shareable(), other) != BASELINE
    # ... while the rest of the store (where Jobs run, credentials, grace) does not change the bytes.
    same = dataclasses.replace(STORE, namespace="elsewhere", push_secret=None, insecure=True, unused_grace_seconds=5)
    assert sharing.shared_id(shareable(), same) == BASELINE


def test_the_hub_endpoint_reaches_the_spec_as_the_class_sets_it() -> None:
    spec = shareable(NEW_BYTES["hub endpoint"])
    assert spec.model.hub.endpoint == "https://hub-mirror.internal"
    base = shareable()
    rebuilt = dataclasses.replace(base, model=dataclasses.replace(base.model, hub=spec.model.hub))
    assert sharing.shared_id(rebuilt, STORE) == sharing.shared_id(spec, STORE) != BASELINE


# --- the record of a published artifact ---------------------------------------------------------------------------

PUBLISHED = sharing.Published(
    ref=f"{REPOSITORY}@sha256:{'c' * 64}", manifest_sha256="d" * 64,
    manifest={"size_bytes": 581_000_000, "quality": {"spearman": 0.995, "topk_agreement": 1, "note": "fine",
                                                     "passed": True},
              "speed": {"int8_pairs_per_s": 120.0, "speedup": "3x"},
              "recipe": {"per_channel": True, "mode": "dynamic", "operators": ["MatMul"], "level": 99},
              "max_input_tokens": 512},
    parts=("cpu-int8", "original"),
)


def test_the_record_of_a_shared_artifact() -> None:
    record = sharing.record(PUBLISHED, "0123456789abcdef", "2026-01-01T00:00:00Z", "BAAI/bge@953dc6f6f85a")
    assert record == {
        "id": "0123456789abcdef",
        "source": "shared",
        "ref": PUBLISHED.ref,
        "parts": ["cpu-int8", "original"],
        "sizeBytes": 581_000_000,
        "manifestSha256": "d" * 64,
        "quality": {"spearman": 0.995, "topk_agreement": 1.0},  # text and booleans are no figures
        "speed": {"int8_pairs_per_s": 120.0},
        "recipe": {"per_channel": True, "mode": "dynamic", "level": 99},  # only scalars
        "maxInputTokens": 512,
        "publishedAt": "2026-01-01T00:00:00Z",
        "weights": "BAAI/bge@953dc6f6f85a",
    }
    assert sharing.is_shared(record)


def test_a_record_without_optional_figures() -> None:
    bare = sharing.Published(ref=f"{REPOSITORY}@sha256:{'e' * 64}", manifest_sha256="f" * 64, manifest={},
                             parts=("cpu-int8",))
    record = sharing.record(bare, "a" * 16, "now", "")
    assert "maxInputTokens" not in record and "weights" not in record
    assert (record["sizeBytes"], record["quality"], record["speed"], record["recipe"]) == (0, {}, {}, {})


@pytest.mark.parametrize("record,shared", [
    (None, False),
    ({}, False),
    ({"id": "a", "source": "built", "path": "/models/artifacts/a"}, False),
    ({"id": "a", "source": "shared"}, False),  # no reference: nothing to fetch
    ({"id": "a", "source": "shared", "ref": "r@sha256:0"}, True),
])
def test_is_shared(record: dict[str, Any] | None, shared: bool) -> None:
    assert sharing.is_shared(record) is shared


# --- lifecycle -----------------------------------------------------------------------------------------------------

def test_in_use_collects_served_pending_and_canary_ids() -> None:
    statuses: list[dict[str, Any]] = [
        {"artifact": {"id": "served"}, "pendingArtifact": {"id": "pending", "state": "Running"}},
        {"canary": {"artifact": {"id": "canary"}, "state": "Running"}},
        {"artifact": None, "pendingArtifact": None, "canary": None},
        {"canary": {"state": "RolledBack"}},
        {},
    ]
    assert sharing.in_use(statuses) == {"served", "pending", "canary"}
    assert sharing.in_use([]) == set()


def test_a_used_tag_is_never_deleted_and_its_clock_is_dropped() -> None:
    result = sharing.collect(["a"], {"a"}, {"a": 0.0}, now=1_000_000.0, grace_seconds=10)
    assert result.delete == ()
    assert dict(result.unused_since) == {}


def test_an_unused_tag_is_deleted_only_once_the_grace_has_passed() -> None:
    first = sharing.collect(["b"], set(), {}, now=100.0, grace_seconds=50)
    assert (dict(first.unused_since), first.delete) == ({"b": 100.0}, ())
    before = sharing.collect(["b"], set(), first.unused_since, now=149.9, grace_seconds=50)
    assert (dict(before.unused_since), before.delete) == ({"b": 100.0}, ())
    at = sharing.collect(["b"], set(), before.unused_since, now=150.0, grace_seconds=50)
    assert at.delete == ("b",)
    assert "b" not in at.unused_since


def test_grace_zero_deletes_at_once() -> None:
    result = sharing.collect(["x", "y", "x"], {"y"}, {}, now=5.0, grace_seconds=0)
    assert result.delete == ("x",)
    assert dict(result.unused_since) == {}


def test_a_tag_used_again_starts_a_new_clock() -> None:
    first = sharing.collect(["b"], set(), {}, now=100.0, grace_seconds=50)
    used = sharing.collect(["b"], {"b"}, first.unused_since, now=120.0, grace_seconds=50)
    assert "b" not in used.unused_since
    again = sharing.collect(["b"], set(), used.unused_since, now=1000.0, grace_seconds=50)
    assert (dict(again.unused_since), again.delete) == ({"b": 1000.0}, ())


def test_clocks_of_tags_no_longer_in_the_store_are_dropped_and_deletions_are_sorted() -> None:
    result = sharing.collect(["c", "a", "b"], set(), {"gone": 0.0, "a": 0.0, "c": 0.0}, now=100.0, grace_seconds=50)
    assert result.delete == ("a", "c")
    assert dict(result.unused_since) == {"b": 100.0}

