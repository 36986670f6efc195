"""controllers/handlers.py's ``Process``: how a reconcile's result is wired back into the queue (its reconcile and the
queue run for real; the cluster is the shared fake)."""

from __future__ import annotations

from rerank_operator.controllers import handlers
from rerank_operator.core.settings import Settings
from tests.unit.operator.fake_cluster import FakeCluster
from tests.unit.operator.rerankmodel_gen import model

KEY = ("search", "bge-m3")


def process_with(fake: FakeCluster) -> handlers.Process:
    process = handlers.Process(Settings())
    process.cluster = fake  # type: ignore[assignment]  # the ClusterAccess protocol, in memory
    return process


def test_a_deferred_status_is_queued_again_as_background_work() -> None:
    fake = FakeCluster(model())
    process = process_with(fake)
    process.enqueue(("search", "other-new-model"), "model", urgent=True)  # a burst: another new model waits
    process._reconcile(KEY)
    assert fake.patches == [] and fake.world.objects, "the claim and Job written, the status left for later"
    assert process.queue.depth() == 2 and process.queue.urgent_pending() == 1, "queued again, not urgently"
    process._reconcile(KEY)
    assert fake.body is not None and fake.body["status"]["observedGeneration"] == 1


def test_a_new_model_alone_gets_its_status_at_once() -> None:
    fake = FakeCluster(model())
    process = process_with(fake)
    process._reconcile(KEY)
    assert fake.body is not None and fake.body["status"]["observedGeneration"] == 1
    assert process.queue.depth() == 0


def test_a_newer_spec_seen_only_in_our_own_writes_answer_is_reconciled_again_urgently() -> None:
    """The user changed the spec while the reconcile ran: our status patch's answer carries it, and the watch's
    copies of it are older than that answer, so nothing else would queue the model."""
    fake = FakeCluster(model())
    original = fake.patch_status

    def patch_and_race(owner: object, patch: dict[str, object]) -> None:
        original(owner, patch)  # type: ignore[arg-type]
        assert fake.body is not None
        fake.body["metadata"]["generation"] = 2

    fake.patch_status = patch_and_race  # type: ignore[method-assign,assignment]
    process = process_with(fake)
    process._reconcile(KEY)
    assert process.queue.urgent_pending() == 1


def test_a_shared_jobs_events_queue_the_models_waiting_on_it_and_no_other() -> None:
    """A shared artifact's Job lives in the store's namespace and belongs to no model: its events are routed to the
    models a reconcile found waiting on it (and forgotten once they no longer wait)."""
    process = handlers.Process(Settings())
    waiting, other = ("a", "m"), ("b", "m")
    process._wait_on(waiting, "0123456789abcdef")
    process._wait_on(other, "fedcba9876543210")
    job = {"kind": "Job", "metadata": {"namespace": "rerank-artifacts", "name": "rerank-artifact-0123456789abcdef-1",
                                       "labels": {"rerank.io/shared": "true", "rerank.io/artifact": "0123456789abcdef",
                                                  "app.kubernetes.io/component": "quantizer"}}}
    process.on_child_event("MODIFIED", job)
    assert process.queue.depth() == 1 and process._triggers == {waiting: "shared"}
    process._wait_on(waiting, None)  # served now
    process._triggers.clear()
    process.on_child_event("MODIFIED", job)
    assert process._triggers == {} and process._waiting == {"fedcba9876543210": {other}}
