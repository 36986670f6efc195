"""class_index.py and tenancy/tenant.py: the RerankClass wiring of the reconcile loop (class cache, re-enqueue,
effective spec, conditions)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rerank_contracts.guard import SAMPLER_PORT
from rerank_operator.controllers import class_index
from rerank_operator.core import names, tenancy
from rerank_operator.core.builders import deployment
from rerank_operator.core.reconcile import drift
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.reconcile.observed import ObjectRef, Observed
from rerank_operator.core.reconcile.writes import Executed, Refused
from rerank_operator.core.settings import DEFAULT_OPERATOR_POD_LABELS, Settings, operator_pod_labels
from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import parse as spec_parse
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions
from rerank_operator.core.status.conditions import Condition
from rerank_operator.core.tenancy import tenant
from tests.unit.operator import rerankmodel_gen
from tests.unit.operator.core.tenancy.tenancy_helpers import at, rclass

NOW, LATER = "2025-01-01T00:00:00Z", "2025-01-01T01:00:00Z"


def body(spec: dict[str, Any] | None = None, name: str = "bge", ns: str = "team-a") -> dict[str, Any]:
    return {"apiVersion": "rerank.io/v1alpha1", "kind": "RerankModel",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "generation": 1},
            "spec": spec if spec is not None else {"model": {"id": "BAAI/bge-reranker-v2-m3"}}}


STANDARD = rclass(at("pools.cpu.maxReplicas", 4), name="standard", default=True)


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return conditions.find(status.get("conditions") or [], kind) or {}


# -- which class, which spec ----------------------------------------------------------------------------------------
def test_no_class_at_all_means_built_in_defaults_and_no_condition() -> None:
    t = tenant.resolve_model(body(), [])
    assert t.rclass is None and t.not_found is None and t.condition() is None
    assert spec_parse.parse(t.effective).cpu.image == specs.TEI_CPU_IMAGE


@pytest.mark.parametrize(("class_name", "available", "fragment"), [
    ("gold", [STANDARD], "RerankClass gold (spec.className) does not exist"),
    (None, [rclass(name="plain")], "no RerankClass is annotated rerank.io/is-default-class"),
])
def test_a_missing_class_is_reported(class_name: str | None, available: list[dict[str, Any]], fragment: str) -> None:
    spec = {"model": {"id": "BAAI/x"}, **({"className": class_name} if class_name else {})}
    t = tenant.resolve_model(body(spec), available)
    assert t.not_found is not None and fragment in t.not_found
    assert t.condition() == Condition("ClassCompliant", "False", "ClassNotFound", t.not_found)


def test_the_default_class_fills_the_spec_and_the_model_complies() -> None:
    klass = rclass(at("pools.cpu.images.default", "registry.local/tei:cpu-1.9"),
                   at("pools.cpu.images.allowed", ["registry.local/*"]), name="standard", default=True)
    t = tenant.resolve_model(body(), [klass])
    parsed = spec_parse.parse(t.effective)
    assert parsed.cpu.image == "registry.local/tei:cpu-1.9"
    assert parsed.cpu.resources == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    assert t.condition() == Condition("ClassCompliant", "True", "Compliant",
                                      "within the limits of RerankClass standard")


def test_a_class_tightened_after_admission_is_a_violation_but_still_served() -> None:
    tight = rclass(at("pools.cpu.maxReplicas", 2), at("pools.cpu.defaultMaxReplicas", 2),
                   at("modelSources.hubOrganizations", ["mixedbread-ai"]), name="standard", default=True)
    t = tenant.resolve_model(body({"model": {"id": "BAAI/x"}, "pools": {"cpu": {"maxReplicas": 4}}}), [tight])
    c = t.condition()
    assert c is not None and (c.status, c.reason) == ("False", "ClassViolation")
    assert "pools.cpu.maxReplicas is 2" in c.message and "; model.id BAAI/x is not from a hub organisation" in c.message
    assert spec_parse.parse(t.effective).cpu.max_replicas == 4  # kept serving as admitted


def test_a_class_change_changes_the_pod_template() -> None:
    owner = names.Owner("bge", "team-a", "uid-bge", 1)

    def template_hash(klass: dict[str, Any]) -> str:
        spec = spec_parse.parse(tenant.resolve_model(body(), [klass]).effective)
        return drift.manifest_hash(deployment.build_deployment(owner, spec, spec.cpu, "a1", 1, "bge-models"))

    before = rclass(name="standard", default=True)
    after = rclass(at("pools.cpu.nodeSelector", {"pool": "cpu-b"}), name="standard", default=True)
    assert template_hash(before) != template_hash(after)
    assert template_hash(before) == template_hash(copy.deepcopy(before))


# -- class cache and re-enqueue ---------------------------------------------------------------------------------------
def test_the_cache_is_primed_once_and_the_watch_wins_over_the_listing() -> None:
    index = class_index.ClassIndex()
    calls: list[int] = []
    old = rclass(at("pools.cpu.maxReplicas", 4), name="a")
    new = rclass(at("pools.cpu.maxReplicas", 6), name="a")
    index.record("MODIFIED", new)
    index.record("DELETED", rclass(name="gone"))

    def lister() -> list[dict[str, Any]]:
        calls.append(1)
        return [old, rclass(name="gone"), rclass(name="b")]

    items = {c["metadata"]["name"]: c for c in index.items(lister)}
    assert set(items) == {"a", "b"} and items["a"]["spec"]["pools"]["cpu"]["maxReplicas"] == 6
    index.items(lister)
    assert calls == [1]


def test_class_events_reconcile_the_models_they_concern() -> None:
    index, models = class_index.ClassIndex(), class_index.ModelIndex()
    index.prime([])
    models.record("a", "uses-default", None)
    models.record("a", "uses-gold", "gold")
    standard = rclass(name="standard", default=True)
    gold = rclass(name="gold")
    # The first class of all: every model's situation changes (built-in defaults -> a class, or ClassNotFound).
    assert class_index.class_event("ADDED", standard, index, models) == [("a", "uses-default"), ("a", "uses-gold")]
    assert class_index.class_event("ADDED", gold, index, models) == [("a", "uses-gold")]
    changed = rclass(at("pools.cpu.maxReplicas", 2), at("pools.cpu.defaultMaxReplicas", 2), name="gold")
    assert class_index.class_event("MODIFIED", changed, index, models) == [("a", "uses-gold")]
    relabelled = copy.deepcopy(changed)
    relabelled["metadata"]["labels"] = {"team": "platform"}
    assert class_index.class_event("MODIFIED", relabelled, index, models) == []  # nothing a model uses changed
    assert class_index.class_event("DELETED", standard, index, models) == [("a", "uses-default")]
    assert class_index.class_event(None, standard, index, models) == []  # the watch's initial listing


# -- NetworkPolicy ----------------------------------------------------------------------------------------------------
def test_network_policy_admits_the_operator_and_drops_an_empty_ingress() -> None:
    t = tenant.resolve_model(body(), [rclass(name="standard", default=True)])
    policy = tenant.network_policy(body(), t, Settings.from_env({"POD_NAMESPACE": "rerank-system"}),
                                   spec_parse.parse(t.effective))
    assert policy is not None and policy["metadata"]["name"] == names.network_policy_name("bge") == "bge-tei"
    assert policy["spec"]["ingress"][0]["from"][-1]["podSelector"] == {"matchLabels": DEFAULT_OPERATOR_POD_LABELS}
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": names.TEI_PORT},
                                                     {"protocol": "TCP", "port": SAMPLER_PORT}]
    closed = rclass(at("network.allowSameNamespace", False), name="standard", default=True)
    t = tenant.resolve_model(body(), [closed])
    policy = tenant.network_policy(body(), t, Settings.from_env({}), spec_parse.parse(t.effective))
    assert policy is not None and "ingress" not in policy["spec"]  # deny all; the API server drops an empty list
    assert operator_pod_labels({"RERANK_OPERATOR_POD_LABELS": "app=op, tier=x"}) == {"app": "op", "tier": "x"}
    assert Settings.from_env({}).operator_namespace is None  # outside a pod: no operator peer


def test_the_plan_applies_the_policy_and_deletes_it_when_the_class_turns_it_off() -> None:
    owner = names.Owner("bge", "team-a", "uid-bge", 1)
    # Served from the source weights (no quantization): the pools, and with them the policy, are planned at once.
    served = body({"model": {"id": "BAAI/bge-reranker-v2-m3"}, "quantization": {"enabled": False}})
    t = tenant.resolve_model(served, [rclass(name="standard", default=True)])
    spec = spec_parse.parse(t.effective)
    policy = tenant.network_policy(served, t, Settings.from_env({}), spec)
    assert not [o for o in plans.compute(owner, spec_parse.parse(tenant.resolve_model(
        body(), [rclass(name="standard", default=True)]).effective), Observed(), {}, NOW,
        network_policy=policy).apply if o["kind"] == "NetworkPolicy"]  # before a first artifact: no pods to guard
    plan = plans.compute(owner, spec, Observed(), {}, NOW, network_policy=policy)
    [applied] = [o for o in plan.apply if o["kind"] == "NetworkPolicy"]
    live = copy.deepcopy(applied)
    again = plans.compute(owner, spec, Observed(network_policy=live), {}, NOW, network_policy=policy)
    assert not [o for o in again.apply if o["kind"] == "NetworkPolicy"]  # idle: no write
    off = plans.compute(owner, spec, Observed(network_policy=live), {}, NOW, network_policy=None)
    assert [(r.kind, r.name) for r in off.delete] == [("NetworkPolicy", "bge-tei")]


# -- quotas and status -------------------------------------------------------------------------------------------------
QUOTA_MESSAGE = ('persistentvolumeclaims "bge-models" is forbidden: exceeded quota: storage, requested: '
                 'requests.storage=20Gi, used: requests.storage=0, limited: requests.storage=1Gi')


def test_a_claim_refused_by_a_quota_is_a_quota_block() -> None:
    refusal = Refused(ObjectRef("v1", "PersistentVolumeClaim", "team-a", "bge-models"), "apply", 403, QUOTA_MESSAGE,
                      f"PersistentVolumeClaim bge-models: 403 {QUOTA_MESSAGE}")
    other = Refused(ObjectRef("v1", "Service", "team-a", "bge"), "apply", 422, "invalid", "Service bge: 422 invalid")
    assert tenant.is_quota_error(refusal) and not tenant.is_quota_error(other) and not tenant.is_quota_error("x")
    block = tenant.quota_block(Observed(), [other, refusal])
    assert block is not None and block.blocked == "PersistentVolumeClaim/bge-models"
    assert block.message.startswith("PersistentVolumeClaim/bge-models: exceeded quota: storage")
    executed = Executed(done=(), refused=(other, refusal))
    assert executed.quota_refusals == (refusal,) and [str(r) for r in executed.other_refusals] == [
        "Service bge: 422 invalid"]


def test_a_quota_refusing_a_scale_write_is_seen_and_blocks_the_pool() -> None:
    scale = Refused(ObjectRef("apps/v1", "Deployment", "team-a", "bge-cpu"), "scale", 403, QUOTA_MESSAGE,
                    f"scale Deployment bge-cpu to 9: 403 {QUOTA_MESSAGE}")
    assert tenant.is_quota_error(scale)
    block = tenant.quota_block(Observed(), [scale])
    assert block is not None and block.blocked == "Deployment/bge-cpu"
    world, serving = serving_world()
    status = statuses.compute(1, serving, NOW, world, quota=block)
    assert cond(status, "PoolsAvailable")["reason"] == "QuotaExceeded"
    assert cond(status, "ModelReady")["reason"] == "ArtifactPublished"


def serving_world() -> tuple[statuses.World, dict[str, Any]]:
    """A model whose first artifact is published and whose pools are ready in the fake API server: the world a
    reconcile acts on, and the status it last wrote (Ready)."""
    body = rerankmodel_gen.model()
    owner, spec, fake = rerankmodel_gen.owner_of(body), rerankmodel_gen.spec_of(body), rerankmodel_gen.FakeWorld()
    status: dict[str, Any] = {}

    def world() -> statuses.World:
        observed = fake.observed()
        return statuses.World(spec, observed, plans.compute(owner, spec, observed, status, NOW))

    for step in range(5):
        now = world()
        fake.run(now.plan)
        status = statuses.compute(owner.generation, status, NOW, now)
        if step == 0:
            [job] = fake.of_kind("Job")
            fake.objects[("Job", job["metadata"]["name"])] = rerankmodel_gen.finish(job, True)
            pod = rerankmodel_gen.job_pod(job, 0, rerankmodel_gen.published(job["metadata"]["labels"][
                names.LABEL_ARTIFACT]))
            fake.objects[("Pod", pod["metadata"]["name"])] = pod
    assert status["phase"] == "Ready"
    return world(), status


def test_quota_exceeded_replaces_the_reason_and_is_stable_across_reconciles() -> None:
    t = tenant.resolve_model(body(), [STANDARD])
    world, serving = serving_world()
    block = tenancy.QuotaBlock("QuotaExceeded", "ReplicaSet/bge-cpu-1: exceeded quota: q", "ReplicaSet/bge-cpu-1")
    first = statuses.compute(1, serving, NOW, world, compliance=t.condition(), quota=block)
    assert first["phase"] == "Progressing"
    for kind in ("PoolsAvailable", "Ready"):
        assert (cond(first, kind)["status"], cond(first, kind)["reason"]) == ("False", "QuotaExceeded")
        assert cond(first, kind)["message"] == "ReplicaSet/bge-cpu-1: exceeded quota: q"
    assert cond(first, "ClassCompliant")["reason"] == "Compliant"
    assert cond(first, "ModelReady")["reason"] == "ArtifactPublished"
    # Next reconcile: the world alone would say Ready again; nothing may move, not even a transition time.
    second = statuses.compute(1, first, LATER, world, compliance=t.condition(), quota=block)
    assert second == first
    job_block = tenancy.QuotaBlock("QuotaExceeded", "Job/bge-q-1: exceeded quota: q", "Job/bge-q-1")
    third = statuses.compute(1, first, LATER, world, compliance=t.condition(), quota=job_block)
    assert cond(third, "ModelReady")["reason"] == "QuotaExceeded"
    assert cond(third, "PoolsAvailable")["reason"] == "Available"
    # The quota lifted: Ready again, its transition time the moment it became True again.
    lifted = statuses.compute(1, third, LATER, world, compliance=t.condition())
    assert lifted["phase"] == "Ready" and cond(lifted, "Ready")["reason"] == "Serving"
    assert cond(lifted, "Ready")["lastTransitionTime"] == LATER


def test_without_classes_the_condition_goes_away() -> None:
    world, serving = serving_world()
    with_class = statuses.compute(1, serving, NOW, world,
                                  compliance=tenant.resolve_model(body(), [STANDARD]).condition())
    without = statuses.compute(1, with_class, LATER, world, compliance=tenant.resolve_model(body(), []).condition())
    assert cond(with_class, "ClassCompliant") and not cond(without, "ClassCompliant")


def test_class_not_found_status() -> None:
    t = tenant.resolve_model(body({"model": {"id": "BAAI/bge-reranker-v2-m3"}, "className": "gold"}), [STANDARD])
    assert t.not_found is not None
    refusal = statuses.Refusal(conditions.REASON_CLASS_NOT_FOUND, t.not_found)
    previous = {"pools": {"cpu": {"readyReplicas": 2}}}
    status = statuses.compute(3, previous, NOW, refusal, compliance=t.condition())
    assert status["phase"] == "Degraded" and status["observedGeneration"] == 3
    assert status["pools"] == previous["pools"]  # nothing applied: what runs is left alone
    assert {(c["type"], c["status"], c["reason"]) for c in status["conditions"]} == {
        ("Ready", "False", "ClassNotFound"), ("Degraded", "True", "ClassNotFound"),
        ("ClassCompliant", "False", "ClassNotFound")}
    assert statuses.compute(1, {}, NOW, refusal, compliance=t.condition())["phase"] == "Failed"


def test_an_invalid_spec_fails_the_model_and_keeps_the_rest_of_its_status() -> None:
    previous = {"pools": {"cpu": {"readyReplicas": 2}}, "phase": "Ready"}
    status = statuses.compute(2, previous, NOW, statuses.Refusal(conditions.REASON_INVALID_SPEC, "pools.cpu: bad"))
    assert status["phase"] == "Failed" and status["pools"] == previous["pools"]
    assert (cond(status, "Ready")["reason"], cond(status, "Degraded")["status"]) == ("InvalidSpec", "True")
    assert not cond(status, "ClassCompliant")




def test_workers_needing_the_classes_at_once_share_one_list() -> None:
    """A burst of applies: every worker's first model asks for the classes before any LIST has returned. One LIST
    is made (single flight), every caller gets its result; a failed LIST is tried again by the next caller."""
    import threading
    import time

    index = class_index.ClassIndex()
    calls: list[int] = []
    started = threading.Event()

    def lister() -> list[dict[str, Any]]:
        calls.append(1)
        started.set()
        time.sleep(0.2)  # the API server is busy
        return [rclass(name="standard", default=True)]

    got: list[list[str]] = []
    threads = [threading.Thread(target=lambda: got.append([c["metadata"]["name"] for c in index.items(lister)]))
               for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert started.is_set() and len(calls) == 1 and got == [["standard"]] * 16
    fresh = class_index.ClassIndex()

    def failing() -> list[dict[str, Any]]:
        raise ConnectionError("the API server is unreachable")

    with pytest.raises(ConnectionError):
        fresh.items(failing)
    assert not fresh.primed and fresh.items(lister) and fresh.primed


def test_workers_waiting_through_a_failed_class_list_get_its_error_not_a_retry_each() -> None:
    import threading
    import time

    index = class_index.ClassIndex()
    calls: list[int] = []

    def failing() -> list[dict[str, Any]]:
        calls.append(1)
        time.sleep(0.2)
        raise TimeoutError("the API server did not answer")

    errors: list[BaseException] = []

    def ask() -> None:
        try:
            index.items(failing)
        except TimeoutError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(calls) == 1 and len(errors) == 8 and not index.primed
    assert index.items(lambda: [rclass(name="standard")]) and index.primed  # the next caller lists again


def test_the_platforms_quantizer_image_is_the_default_of_models_without_a_class() -> None:
    """``--quantizer-image`` fills in last. A RerankClass always decides for its models: its
    ``quantization.images.default`` (the CRD defaults it to the release image) and ``allowed`` are the platform's
    per-class choice, so a platform that mirrors the image sets them there too (docs/platform-teams.md)."""
    platform = "registry.local/platform/rerank-quantizer@sha256:" + "1" * 64

    def image(t: tenant.Tenancy) -> str:
        return spec_parse.parse(t.effective).quantization.image

    assert image(tenant.resolve_model(body(), [])) == specs.QUANTIZER_IMAGE  # the built-in release image
    assert image(tenant.resolve_model(body(), [], platform)) == platform
    own = body({"model": {"id": "BAAI/x"}, "quantization": {"image": "registry.local/mine:1"}})
    assert image(tenant.resolve_model(own, [], platform)) == "registry.local/mine:1"
    by_class = rclass(at("quantization.images.default", "registry.local/class-q:1"),
                      at("quantization.images.allowed", ["registry.local/*"]), name="standard", default=True)
    assert image(tenant.resolve_model(body(), [by_class], platform)) == "registry.local/class-q:1"
    assert image(tenant.resolve_model(body(), [rclass(name="standard", default=True)], platform)) == \
        specs.QUANTIZER_IMAGE  # the class's CRD default, not the platform's flag
