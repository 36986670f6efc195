"""kube_api.Client's write fence: a process that no longer leads sends no write, and a write takes no longer than
what is left of its term (the cluster test: test_leader_election.py::test_a_stalled_leader_...)."""

from __future__ import annotations

import math

import pytest
from kubernetes.client import ApiClient, Configuration

from rerank_operator.adapters import kube_api
from rerank_operator.adapters import operator_metrics as metrics


def client_to_nowhere() -> kube_api.Client:
    configuration = Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard: nothing answers
    return kube_api.Client(ApiClient(configuration))


def test_a_write_after_the_term_is_not_sent() -> None:
    c = client_to_nowhere()
    c.fence = lambda: -0.5
    before = metrics.FENCED_WRITES.labels("create", "Job")._value.get()
    with pytest.raises(kube_api.NotLeader, match="not sent"):
        c.request("POST", "/apis/batch/v1/namespaces/ns/jobs", verb="create", kind="Job", body={})
    assert metrics.FENCED_WRITES.labels("create", "Job")._value.get() == before + 1
    assert isinstance(kube_api.NotLeader("x"), kube_api.TransientApiError)  # the loops retry; the process exits


def test_reads_and_the_lease_itself_are_not_fenced() -> None:
    c = client_to_nowhere()
    c.fence = lambda: -math.inf
    for method, kwargs in (("GET", {}), ("PUT", {"verb": "update", "kind": "Lease"})):
        with pytest.raises(kube_api.TransientApiError) as caught:  # sent, and nobody answered
            c.request(method, "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", **kwargs)
        assert not isinstance(caught.value, kube_api.NotLeader)


@pytest.mark.parametrize(("timeout", "left", "bounded"), [
    (None, 1.5, 1.5), (10, 1.5, 1.5), (0.5, 1.5, 0.5), ((10, 30), 2.0, (2.0, 2.0)), ((1, 30), 2.0, (1.0, 2.0)),
])
def test_a_write_takes_no_longer_than_the_term_left(timeout: object, left: float, bounded: object) -> None:
    assert kube_api._bounded(timeout, left) == bounded
