"""The one read of ``adapters/cluster.py`` that still goes to the API server in every reconcile of a pod-less Job's
model: its namespace's FailedCreate Events, read at most once per ``FAILED_CREATE_EVENTS_TTL`` per namespace."""

from __future__ import annotations

from typing import Any

from rerank_operator.adapters import cluster


class Client:
    """Answers the Events LIST with what the namespace holds now, counting the requests."""

    def __init__(self) -> None:
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, str, str]] = []

    def request(self, method: str, path: str, **params: Any) -> dict[str, Any]:
        self.requests.append((method, path, params.get("field_selector", "")))
        ns = path.split("/namespaces/")[1].split("/")[0]
        return {"items": list(self.events.get(ns, []))}


def test_failed_create_events_are_read_once_per_namespace_and_interval() -> None:
    now = [100.0]
    client = Client()
    c = cluster.Cluster(client, caches=None, clock=lambda: now[0])  # type: ignore[arg-type]
    refused = {"reason": "FailedCreate", "message": "exceeded quota: pods"}
    assert c._failed_create_events("team-a") == [] and c._failed_create_events("team-b") == []
    client.events["team-a"] = [refused]
    now[0] += cluster.FAILED_CREATE_EVENTS_TTL - 0.1
    assert c._failed_create_events("team-a") == []  # still the first read's answer
    now[0] += 0.2
    assert c._failed_create_events("team-a") == [refused]  # read again: the refusal is seen
    assert [(m, p.split("/namespaces/")[1].split("/")[0]) for m, p, _ in client.requests] == [
        ("GET", "team-a"), ("GET", "team-b"), ("GET", "team-a")]
    assert all(sel == "involvedObject.kind=Job,reason=FailedCreate" for _, _, sel in client.requests)


def test_side_by_side_runs_both_at_once_and_raises_what_either_raised() -> None:
    import threading

    import pytest

    both_in = threading.Barrier(2, timeout=5)  # each waits for the other: only passes if they overlap
    ran: list[str] = []

    def claim() -> None:
        both_in.wait()
        ran.append("claim")

    def job() -> None:
        both_in.wait()
        ran.append("job")

    cluster.side_by_side(claim, job)
    assert sorted(ran) == ["claim", "job"]

    def boom() -> None:
        raise TimeoutError("the API server did not answer")

    with pytest.raises(TimeoutError):
        cluster.side_by_side(boom, lambda: None)
    with pytest.raises(TimeoutError):
        cluster.side_by_side(lambda: None, boom)
