"""controllers/reconcile_loop.py, the shell of one reconcile, against the shared fake cluster (fake_cluster.py, the same
one the autoscaler's tests use): what it reads, executes, writes to the status and posts, and that a second run over
what the first wrote is idle."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from rerank_operator.controllers import class_index
from rerank_operator.controllers.reconcile_loop import reconcile
from rerank_operator.core.settings import Settings
from rerank_operator.core.status import conditions
from tests.unit.operator.fake_cluster import FakeCluster
from tests.unit.operator.rerankmodel_gen import model, set_

NOW = "2025-01-01T00:00:00Z"


def run(fake: FakeCluster, registry: class_index.Registry | None = None, others_waiting: bool = False) -> Any:
    body = fake.body or {"metadata": {"namespace": "search", "name": "bge-m3"}}
    return reconcile(fake, body["metadata"]["namespace"], body["metadata"]["name"], "test",
                     registry=registry or class_index.Registry(), settings=Settings(), now=lambda: NOW,
                     others_waiting=lambda: others_waiting)


def reason(fake: FakeCluster, kind: str) -> str:
    assert fake.body is not None
    found = conditions.find(fake.body["status"]["conditions"], kind)
    assert found is not None, fake.body["status"]
    return str(found["reason"])


def test_a_new_model_gets_its_claim_and_job_a_status_and_events_and_a_second_run_is_idle() -> None:
    fake = FakeCluster(model())
    result = run(fake)
    assert result is not None and result.ready is False
    kinds = sorted(k for k, _ in fake.world.objects)
    assert "PersistentVolumeClaim" in kinds and "Job" in kinds, kinds
    assert fake.body is not None and fake.body["status"]["observedGeneration"] == 1
    assert fake.events, "the Job's creation is announced"
    for _ in range(3):  # the Deployments it created report ready replicas: the status follows, then settles
        before = (fake.world.writes, len(fake.patches), len(fake.events))
        run(fake)
        if (fake.world.writes, len(fake.patches), len(fake.events)) == before:
            break
    else:
        raise AssertionError(f"still writing after 3 reconciles: {fake.patches[-1]}")


def test_in_a_burst_a_new_models_status_follows_its_job_in_a_second_reconcile() -> None:
    """Other new models waiting: the first reconcile writes the claim and the Job and announces the Job, but leaves
    the status (the dearest write) to a second reconcile, which writes only the status; two reconciles without a
    burst end with the same objects, status and Events."""
    fake = FakeCluster(model())
    first = run(fake, others_waiting=True)
    assert first is not None and first.status_deferred and first.writes == 3  # the claim, the Job, the Event
    assert sorted(k for k, _ in fake.world.objects) == ["Job", "PersistentVolumeClaim"]
    assert fake.patches == [] and [r for r, _ in fake.events] == ["QuantizationStarted"]
    second = run(fake, others_waiting=True)  # the Job exists now: nothing to start, so nothing to defer
    assert second is not None and not second.status_deferred
    assert fake.body is not None and fake.body["status"]["observedGeneration"] == 1
    assert len(fake.plans[1].create) == 0 and len(fake.patches) == 1

    calm = FakeCluster(model())
    assert not run(calm).status_deferred
    run(calm)
    assert sorted(calm.world.objects) == sorted(fake.world.objects)
    assert calm.body is not None and calm.body["status"] == fake.body["status"]
    assert sorted(calm.events) == sorted(fake.events)


def test_only_a_new_spec_whose_job_started_cleanly_leaves_its_status_for_later() -> None:
    from rerank_operator.controllers.reconcile_loop import status_can_wait
    from rerank_operator.core.reconcile.observed import ObjectRef, ref_of
    from rerank_operator.core.reconcile.writes import Executed, Refused

    fake = FakeCluster(model())
    run(fake)  # the plan of a new model, from a calm reconcile
    plan, body = fake.plans[0], model()
    job = ref_of(plan.create[0])
    started = Executed(done=(job,))
    assert status_can_wait(body, plan, started, others_waiting=True)
    assert not status_can_wait(body, plan, started, others_waiting=False)
    assert not status_can_wait(fake.body or {}, plan, started, others_waiting=True), "a spec already acted on"
    assert not status_can_wait(body, plan, Executed(), others_waiting=True), "no Job started"
    refused = Refused(ObjectRef("v1", "Service", "search", "x"), "apply", 422, "invalid", "Service x: 422 invalid")
    assert not status_can_wait(body, plan, Executed(done=(job,), refused=(refused,)), others_waiting=True), \
        "a refusal is reported at once"


def test_an_older_versions_finalizer_is_removed_and_only_it() -> None:
    body = model()
    body["metadata"]["finalizers"] = ["example.com/keep", "rerank.io/finalizer"]
    fake = FakeCluster(body)
    run(fake)
    assert fake.body is not None and fake.body["metadata"]["finalizers"] == ["example.com/keep"]
    fake.body["metadata"]["deletionTimestamp"] = NOW
    fake.body["metadata"]["finalizers"].append("rerank.io/finalizer")
    assert run(fake) is None, "a model being deleted is left to garbage collection, without the old finalizer"
    assert fake.body["metadata"]["finalizers"] == ["example.com/keep"]


def test_a_missing_model_is_forgotten() -> None:
    fake = FakeCluster(None)
    assert run(fake) is None
    assert fake.plans == [] and fake.patches == []


def test_a_missing_class_applies_nothing_and_says_why() -> None:
    other = {"apiVersion": "rerank.io/v1alpha1", "kind": "RerankClass",
             "metadata": {"name": "standard", "creationTimestamp": NOW}, "spec": {}}
    fake = FakeCluster(model(set_("className", "gold")), classes=[other])
    assert run(fake) is not None
    assert fake.plans == [] and fake.world.objects == {}
    assert reason(fake, conditions.READY) == conditions.REASON_CLASS_NOT_FOUND


def test_an_invalid_spec_is_reported_then_refused_for_good() -> None:
    fake = FakeCluster(model(set_("pools.cpu.maxReplicas", 0), set_("pools.cpu.minReplicas", 3)))
    with pytest.raises(kopf.PermanentError, match="invalid spec"):
        run(fake)
    assert fake.plans == []
    assert reason(fake, conditions.READY) == conditions.REASON_INVALID_SPEC
