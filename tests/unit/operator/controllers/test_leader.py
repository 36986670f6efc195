"""controllers/leader.py's loop against an in-memory Lease with the API server's compare-and-swap (no cluster; the
real API server's version is tests/cluster/test_leader_election.py): what happens when renewing fails or hangs."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any, Literal, cast

import pytest

from rerank_devcluster.waiting import eventually
from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.kube_api import Client, TransientApiError
from rerank_operator.adapters.lease import LOST_RACE, LeaseRecord
from rerank_operator.controllers.leader import Elector, default_identity
from rerank_operator.core.leadership import LeaderElectionSettings

FAST = LeaderElectionSettings(enabled=True, namespace="ns", lease_duration_seconds=0.6, renew_deadline_seconds=0.4,
                              retry_period_seconds=0.05)


class MemoryLease:
    """LeaseStore's interface over one in-memory Lease, with a resourceVersion; ``fail`` makes every call raise,
    ``hang`` makes reads block until it is cleared."""

    def __init__(self) -> None:
        self.spec: dict[str, Any] | None = None
        self.version = 0
        self.fail = False
        self.hang = threading.Event()
        self.unhung = threading.Event()
        self.lock = threading.Lock()

    def read(self) -> LeaseRecord | None:
        if self.hang.is_set():
            self.unhung.wait(10)
        if self.fail:
            raise TransientApiError("GET lease: 503 unavailable")
        with self.lock:
            return None if self.spec is None else LeaseRecord(dict(self.spec), str(self.version))

    def write(self, spec: Mapping[str, Any], current: LeaseRecord | None) -> LeaseRecord | Literal["lost race"]:
        with self.lock:
            if (current is None) != (self.spec is None):
                return LOST_RACE
            if current is not None:
                return self.update(spec, current.resource_version)
            self.spec, self.version = dict(spec), self.version + 1
            return LeaseRecord(dict(spec), str(self.version))

    def update(self, spec: Mapping[str, Any], resource_version: str) -> LeaseRecord | Literal["lost race"]:
        if self.fail:
            raise TransientApiError("PUT lease: 503 unavailable")
        if resource_version != str(self.version):
            return LOST_RACE
        self.spec, self.version = dict(spec), self.version + 1
        return LeaseRecord(dict(spec), str(self.version))


class Run:
    def __init__(self, elector: Elector) -> None:
        self.elector = elector
        self.stop, self.started, self.stopped = threading.Event(), threading.Event(), threading.Event()
        self.thread = threading.Thread(target=elector.run, args=(self.stop, self.started.set, self.stopped.set),
                                       daemon=True)
        self.thread.start()


@pytest.fixture
def lease() -> Iterator[MemoryLease]:
    store = MemoryLease()
    yield store
    store.unhung.set()


def elector(store: MemoryLease, settings: LeaderElectionSettings = FAST, name: str = "a") -> Elector:
    e = Elector(cast(Client, None), settings, name)
    e.store = store  # type: ignore[assignment]
    return e


def test_without_election_it_leads_at_once_until_stopped() -> None:
    run = Run(Elector(cast(Client, None), LeaderElectionSettings(), "a"))
    eventually(run.started.is_set, timeout=5, what="on_started")
    assert run.elector.is_leader and metrics.LEADER._value.get() == 1
    run.stop.set()
    run.thread.join(5)
    assert not run.elector.is_leader and not run.stopped.is_set() and metrics.LEADER._value.get() == 0


def test_an_election_needs_a_namespace() -> None:
    with pytest.raises(ValueError, match="namespace"):
        Elector(cast(Client, None), LeaderElectionSettings(enabled=True), "a")


def test_identity_is_the_host_and_a_random_suffix() -> None:
    one, two = default_identity(), default_identity()
    assert one != two and one.rsplit("_", 1)[0] == two.rsplit("_", 1)[0]


def test_one_of_two_leads_and_a_graceful_stop_hands_over(lease: MemoryLease) -> None:
    a, b = Run(elector(lease, name="a")), Run(elector(lease, name="b"))
    first = eventually(lambda: a if a.started.is_set() else b if b.started.is_set() else None, timeout=5)
    other = b if first is a else a
    assert first.elector.is_leader and not other.elector.is_leader
    first.stop.set()
    first.thread.join(5)
    eventually(other.started.is_set, timeout=FAST.retry_period_seconds * 4 + 1, what="the takeover after release")
    assert lease.spec is not None and lease.spec["holderIdentity"] == other.elector.identity
    assert lease.spec["leaseTransitions"] == 1 and not first.stopped.is_set()
    other.stop.set()
    other.thread.join(5)
    assert lease.spec["holderIdentity"] == "" and lease.spec["leaseDurationSeconds"] == 1


def test_a_leader_that_cannot_renew_stops_at_the_deadline(lease: MemoryLease) -> None:
    run = Run(elector(lease))
    eventually(run.started.is_set, timeout=5, what="it leads")
    lease.fail = True
    eventually(run.stopped.is_set, timeout=FAST.renew_deadline_seconds + 2, what="on_stopped")
    assert not run.elector.is_leader
    run.thread.join(5)
    assert not run.thread.is_alive() and metrics.LEADER._value.get() == 0


def test_a_hung_request_does_not_stretch_the_term(lease: MemoryLease) -> None:
    """is_leader turns False at the renew deadline even while the loop is blocked in a request."""
    run = Run(elector(lease))
    eventually(run.started.is_set, timeout=5, what="it leads")
    assert lease.spec is not None
    lease.hang.set()
    eventually(lambda: not run.elector.is_leader, timeout=FAST.renew_deadline_seconds + 1, what="the term's end")
    renewed = lease.spec["renewTime"]
    assert run.thread.is_alive() and not run.stopped.is_set()  # still blocked in the read
    lease.hang.clear()
    lease.unhung.set()
    eventually(run.stopped.is_set, timeout=5, what="on_stopped once the request returns")
    assert lease.spec["renewTime"] == renewed  # the late round did not renew: a standby's wait is not reset


def test_a_foreign_holder_ends_the_term_at_once(lease: MemoryLease) -> None:
    run = Run(elector(lease))
    eventually(run.started.is_set, timeout=5, what="it leads")
    with lease.lock:
        assert lease.spec is not None
        lease.spec, lease.version = {**lease.spec, "holderIdentity": "intruder"}, lease.version + 1
    eventually(run.stopped.is_set, timeout=1, what="on_stopped")
    assert not run.elector.is_leader and lease.spec["holderIdentity"] == "intruder"
