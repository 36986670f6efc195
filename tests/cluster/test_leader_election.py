"""Leader election on the real API server: two in-process Electors under the operator's own RBAC (the Lease Role is
exactly operator/rerank_operator/rbac_leader_election.yaml), with short timings (lease 3 s, renew 2 s, retry 0.5 s).

A SIGKILL is stood for by stopping an Elector built with ``release_on_cancel=False``: it stops renewing and leaves
the Lease as it was, which is all the API server can see of a killed process.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from kubernetes import client, config

from rerank_devcluster.cluster import Cluster
from rerank_operator.adapters import kube_api
from rerank_operator.adapters.lease import LeaseStore
from rerank_operator.controllers.leader import Elector
from rerank_operator.core.leadership import LeaderElectionSettings, format_micro_time
from tests.cluster.rrm_harness import Identity, bind_leader_election, eventually

pytestmark = pytest.mark.cluster

LEASE, RENEW, RETRY = 3.0, 2.0, 0.5
#: Time for a few requests to a loaded test control plane on a 2-core machine, on top of the election's own timing.
SLACK = 1.5
Lease = tuple[LeaderElectionSettings, Identity]


@dataclass
class Candidate:
    """One Elector in its own daemon thread, as the operator runs it."""

    elector: Elector
    stop: threading.Event = field(default_factory=threading.Event)
    started: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def run(self) -> Candidate:
        self.thread = threading.Thread(target=self.elector.run, args=(self.stop, self.started.set, self.stopped.set),
                                       daemon=True, name=self.elector.identity)
        self.thread.start()
        return self

    def halt(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(timeout=10)
        assert not self.thread.is_alive()


@pytest.fixture
def lease(cluster: Cluster, namespace: str, operator_identity: Identity) -> Iterator[Lease]:
    """A fresh namespace with the lease Role bound for the operator's identity, once RBAC lets it read the Lease."""
    bind_leader_election(cluster, namespace)
    settings = LeaderElectionSettings(enabled=True, namespace=namespace, name=f"lease-{uuid.uuid4().hex[:6]}",
                                      lease_duration_seconds=LEASE, renew_deadline_seconds=RENEW,
                                      retry_period_seconds=RETRY)
    store = LeaseStore(operator_client(operator_identity), namespace, settings.name)

    def readable() -> bool:
        try:
            return store.read() is None
        except kube_api.ApiError as exc:
            if exc.status == 403:  # the RoleBinding is not in the authorizer's cache yet
                return False
            raise

    eventually(readable, timeout=30, what="the operator's identity may read Leases")
    yield settings, operator_identity


def operator_client(identity: Identity) -> kube_api.Client:
    """A client of its own per candidate, as two processes would have, authenticated as the operator."""
    return kube_api.Client(config.new_client_from_config(config_file=str(identity.kubeconfig)))


def candidate(settings: LeaderElectionSettings, identity: Identity, name: str, *, release: bool = True) -> Candidate:
    return Candidate(Elector(operator_client(identity), settings, f"{name}_{uuid.uuid4().hex[:4]}",
                             release_on_cancel=release)).run()


def lease_spec(kube: client.ApiClient, settings: LeaderElectionSettings) -> dict[str, object]:
    obj = client.CoordinationV1Api(kube).read_namespaced_lease(settings.name, settings.namespace)
    return dict(kube.sanitize_for_serialization(obj)["spec"])


def the_leader(*candidates: Candidate) -> Candidate | None:
    """The one candidate that leads (failing if two do), or None."""
    leaders = [c for c in candidates if c.elector.is_leader]
    assert len(leaders) <= 1, f"two leaders: {[c.elector.identity for c in leaders]}"
    return leaders[0] if leaders else None


def only_one_leads_for(seconds: float, *candidates: Candidate) -> Candidate:
    """Watch both for ``seconds`` (several lease durations): never two leaders, and the same one throughout."""
    first = eventually(lambda: the_leader(*candidates), timeout=LEASE + 10, what="a leader")
    end = time.monotonic() + seconds

    def watched() -> bool:
        assert the_leader(*candidates) is first
        return time.monotonic() >= end

    eventually(watched, timeout=seconds + 5, every=0.05, what=f"{seconds}s of one leader")
    return first


def test_exactly_one_leads_and_a_killed_leader_is_replaced_within_the_lease(
        lease: Lease, kube: client.ApiClient) -> None:
    settings, identity = lease
    a, b = candidate(settings, identity, "a", release=False), candidate(settings, identity, "b", release=False)
    try:
        leader = only_one_leads_for(2 * LEASE, a, b)
        standby = b if leader is a else a
        assert leader.started.is_set() and not standby.started.is_set()
        spec = lease_spec(kube, settings)
        assert spec["holderIdentity"] == leader.elector.identity and spec["leaseDurationSeconds"] == 3
        transitions = int(spec.get("leaseTransitions") or 0)

        killed_at = time.monotonic()
        leader.halt()  # SIGKILL: no release
        assert lease_spec(kube, settings)["holderIdentity"] == leader.elector.identity
        eventually(standby.started.is_set, timeout=LEASE + 2 * RETRY + SLACK + 5, every=0.05, what="the takeover")
        took = time.monotonic() - killed_at
        # Not before a live but slow leader would have given up (renew deadline), and not much after the lease.
        assert LEASE - RENEW <= took <= LEASE + 2 * RETRY + SLACK, took
        assert the_leader(a, b) is standby and not leader.stopped.is_set()
        spec = lease_spec(kube, settings)
        assert spec["holderIdentity"] == standby.elector.identity
        assert spec["leaseTransitions"] == transitions + 1
    finally:
        a.stop.set()
        b.stop.set()


def test_a_graceful_stop_releases_and_the_standby_takes_over_at_once(
        lease: Lease, kube: client.ApiClient) -> None:
    settings, identity = lease
    a, b = candidate(settings, identity, "a"), candidate(settings, identity, "b")
    try:
        leader = only_one_leads_for(LEASE, a, b)
        standby = b if leader is a else a
        leader.halt()  # returns once the Lease is released
        released_at = time.monotonic()
        assert not leader.elector.is_leader and not leader.stopped.is_set()  # on_stopped: only when lost
        eventually(standby.started.is_set, timeout=LEASE, every=0.05, what="the takeover after a release")
        assert time.monotonic() - released_at <= 1.1 * RETRY + SLACK
        assert lease_spec(kube, settings)["holderIdentity"] == standby.elector.identity
        # The new leader releases too, leaving a Lease that anyone may take at once.
        standby.halt()
        spec = lease_spec(kube, settings)
        assert spec.get("holderIdentity") in ("", None) and spec["leaseDurationSeconds"] == 1
    finally:
        a.stop.set()
        b.stop.set()


def test_a_leader_that_loses_the_lease_stops(lease: Lease,
                                             kube: client.ApiClient) -> None:
    settings, identity = lease
    a = candidate(settings, identity, "a")
    try:
        eventually(a.started.is_set, timeout=10, what="a leads")
        now = format_micro_time(datetime.now(UTC))
        client.CoordinationV1Api(kube).patch_namespaced_lease(
            settings.name, settings.namespace, {"spec": {"holderIdentity": "intruder", "renewTime": now}})
        eventually(a.stopped.is_set, timeout=RETRY + SLACK + 2, every=0.05, what="on_stopped after losing the Lease")
        assert not a.elector.is_leader
        assert a.thread is not None
        a.thread.join(timeout=5)
        assert not a.thread.is_alive()  # run() returned: the caller exits the process
        assert lease_spec(kube, settings)["holderIdentity"] == "intruder"  # a deposed leader writes nothing more
    finally:
        a.stop.set()


class Writer:
    """Stands for the operator's loops: writes (an Event) every few milliseconds whether or not its process leads,
    as the reconcile and autoscale loops do; only the client's fence (kube_api.Client.fence) holds it back."""

    def __init__(self, api: kube_api.Client, namespace: str, who: str) -> None:
        self.api, self.namespace, self.who = api, namespace, who
        self.sent = self.fenced = 0
        self.refused: list[str] = []  # by the API server (must stay empty)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"writer-{who}")
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            body = {"apiVersion": "v1", "kind": "Event",
                    "metadata": {"generateName": "fence-probe-", "namespace": self.namespace},
                    "involvedObject": {"kind": "Lease", "name": "fence-probe", "namespace": self.namespace,
                                       "apiVersion": "coordination.k8s.io/v1"},
                    "reason": "FenceProbe", "message": self.who, "type": "Normal"}
            try:
                self.api.request("POST", kube_api.api_path("v1", "Event", self.namespace), verb="create", kind="Event",
                                 body=body)
                self.sent += 1
            except kube_api.NotLeader:
                self.fenced += 1
            except kube_api.TransientApiError:
                continue
            except kube_api.ApiError as exc:
                self.refused.append(str(exc))

    def halt(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def test_a_stalled_leader_writes_nothing_after_the_standbys_first_write(
        lease: Lease, kube: client.ApiClient) -> None:
    """The leader's Lease requests hang (a network path that drops them, an overloaded API server for that one
    object) while its loops go on writing. Its writes stop at its renew deadline, before the standby can take
    over: the API server holds no write of the old leader after the new one's first (ordered by the revision the
    API server gave each object). The failover still comes within 15 s."""
    settings, identity = lease
    clients = {n: operator_client(identity) for n in ("a", "b")}
    electors = {n: Elector(c, settings, f"{n}_{uuid.uuid4().hex[:4]}", release_on_cancel=False)
                for n, c in clients.items()}
    for n, c in clients.items():
        c.fence = electors[n].term_left  # as controllers/handlers.py wires it
    a = Candidate(electors["a"]).run()
    eventually(a.started.is_set, timeout=LEASE + 10, what="a leads")
    b = Candidate(electors["b"]).run()
    writers = {n: Writer(c, settings.namespace or "", electors[n].identity) for n, c in clients.items()}
    stalled = threading.Event()
    store = electors["a"].store
    real = store._request

    def hanging(*args: object, **kwargs: object) -> object:
        while stalled.is_set():  # held, as a request that never gets an answer
            time.sleep(0.05)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    try:
        time.sleep(2 * RETRY)
        assert not writers["a"].refused, writers["a"].refused[:1]
        assert writers["a"].sent > 0 and writers["b"].sent == 0 and writers["b"].fenced > 0
        stalled.set()
        store._request = hanging  # type: ignore[method-assign]
        stalled_at = time.monotonic()
        eventually(b.started.is_set, timeout=15, every=0.05, what="the standby to take over from a stalled leader")
        took = time.monotonic() - stalled_at
        assert not a.elector.is_leader and a.thread is not None and a.thread.is_alive()  # still stuck in a request
        time.sleep(RENEW)  # both writers keep trying: only the new leader's writes are sent
        assert writers["a"].fenced > 0
    finally:
        for w in writers.values():
            w.halt()
        stalled.clear()
        a.stop.set()
        b.stop.set()
    events = client.CoreV1Api(kube).list_namespaced_event(settings.namespace).items
    revisions: dict[str, list[int]] = {e.identity: [] for e in electors.values()}
    for event in events:
        if event.reason == "FenceProbe":
            revisions[event.message].append(int(event.metadata.resource_version))
    old, new = revisions[electors["a"].identity], revisions[electors["b"].identity]
    assert old and new, revisions
    assert max(old) < min(new), (f"the stalled leader wrote {sum(r > min(new) for r in old)} times after the new "
                                 f"leader's first write")
    print(f"\nSTALLED LEADER: failover after {took:.1f}s; old leader {len(old)} writes, then {writers['a'].fenced} "
          f"refused by the fence; new leader {len(new)} writes")
