"""Events off the reconcile path (adapters/event_sender.py): in order, never blocking the caller, flushed on stop."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from rerank_devcluster.waiting import eventually
from rerank_operator.adapters.event_sender import EventSender
from rerank_operator.core.artifacts import job_outcome


def test_events_are_posted_in_order_without_blocking_the_caller_and_flushed_on_stop() -> None:
    gate = threading.Event()
    posted: list[str] = []

    def post(body: Mapping[str, Any]) -> None:
        gate.wait(5)  # an API server that takes its time
        posted.append(str(body["reason"]))

    sender = EventSender(post, capacity=10)
    for i in range(5):
        sender.put({"reason": f"R{i}"})   # returns at once although nothing is posted yet
    assert posted == [] and sender.pending() >= 4
    gate.set()
    sender.stop(wait_seconds=5)
    assert posted == [f"R{i}" for i in range(5)]


def test_a_full_queue_drops_and_a_failing_post_does_not_stop_the_rest() -> None:
    gate = threading.Event()
    posted: list[str] = []

    def post(body: Mapping[str, Any]) -> None:
        gate.wait(5)
        if body["reason"] == "Bad":
            raise RuntimeError("refused")
        posted.append(str(body["reason"]))

    sender = EventSender(post, capacity=2)
    sender.put({"reason": "Bad"})
    eventually(lambda: sender.pending() == 0, 5, "the first Event taken by the thread")
    for reason in ("A", "B", "C"):
        sender.put({"reason": reason})
    assert sender.dropped == 1                         # C: two already waiting
    gate.set()
    sender.stop(wait_seconds=5)
    assert posted == ["A", "B"]


def test_failed_create_events_are_read_only_for_a_job_pod_less_beyond_the_grace() -> None:
    created = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}, "status": {}}
    born = 1767225600.0  # 2026-01-01T00:00:00Z
    assert not job_outcome.pod_long_missing(created, born + 1)                       # the Job controller is still at it
    assert job_outcome.pod_long_missing(created, born + job_outcome.FAILED_CREATE_GRACE_SECONDS)
    assert not job_outcome.pod_long_missing({**created, "status": {"active": 1}}, born + 60)  # its pod exists
    assert job_outcome.pod_long_missing({"status": {}}, born)                        # no timestamp: treated as old
