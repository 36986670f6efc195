"""Which addresses the activator forwards a held request to (rerank_activator/endpoints.py): the ready endpoints of
its pool's Service, from the slices the EndpointSlice controller wrote, never an ExternalName's or a hand-written
slice's; and one lookup shared by the requests held for a Service. Reading them from a real API server, with the
activator's own RBAC, is tests/cluster/test_gateway.py's wake test."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from rerank_activator import endpoints, main
from rerank_activator.endpoints import CONTROLLER, ApiAccess, Endpoints, LookupFailed, ready_addresses

SERVICE = {"metadata": {"name": "m1-cpu", "namespace": "tenant-a"},
           "spec": {"type": "ClusterIP", "selector": {"app": "m1"},
                    "ports": [{"name": "metrics", "port": 9000, "targetPort": 9000},
                              {"name": "http", "port": 8080, "targetPort": "http"}]}}


def piece(endpoints_: list[dict[str, Any]], *, service: str = "m1-cpu", managed_by: str = CONTROLLER,
          ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """An EndpointSlice as the API server returns it."""
    return {"metadata": {"name": f"{service}-x1", "labels": {"kubernetes.io/service-name": service,
                                                          "endpointslice.kubernetes.io/managed-by": managed_by}},
            "addressType": "IPv4", "endpoints": endpoints_,
            "ports": ports if ports is not None else [{"name": "http", "port": 8081, "protocol": "TCP"},
                                                      {"name": "metrics", "port": 9000, "protocol": "TCP"}]}


def endpoint(address: str, ready: bool | None) -> dict[str, Any]:
    conditions = {} if ready is None else {"ready": ready}
    return {"addresses": [address], "conditions": conditions, "targetRef": {"kind": "Pod", "name": address}}


def test_ready_endpoints_at_the_port_the_slice_states_for_the_service_port() -> None:
    slices = [piece([endpoint("10.244.0.7", True), endpoint("10.244.0.8", False), endpoint("10.244.0.9", None)]),
              piece([endpoint("10.244.1.3", True)])]
    # The Service's 8080 targets the container port named http, which the slice states as 8081; an unset ready
    # condition counts as ready (the API's own rule).
    assert ready_addresses(SERVICE, slices, 8080) == [("10.244.0.7", 8081), ("10.244.0.9", 8081),
                                                      ("10.244.1.3", 8081)]
    assert ready_addresses(SERVICE, slices, 9000) == [("10.244.0.7", 9000), ("10.244.0.9", 9000),
                                                      ("10.244.1.3", 9000)]


def test_no_ready_pod_no_address() -> None:
    assert ready_addresses(SERVICE, [], 8080) == []
    assert ready_addresses(SERVICE, [piece([endpoint("10.244.0.8", False)])], 8080) == []


def test_slices_not_written_by_the_controller_for_this_service_are_ignored() -> None:
    forged = piece([endpoint("10.9.9.9", True)], managed_by="someone")
    other = piece([endpoint("10.8.8.8", True)], service="other-tenants-pool")
    assert ready_addresses(SERVICE, [forged, other], 8080) == []


def test_an_external_name_upstream_is_refused() -> None:
    """A tenant who can edit its Services makes the signed one an ExternalName aimed at another tenant's pool: the
    activator forwards nowhere, whatever endpoints are listed."""
    external = {"metadata": {"name": "m1-cpu"},
                "spec": {"type": "ExternalName", "externalName": "pool.other-tenant.svc.cluster.local",
                         "selector": {"app": "m1"}, "ports": [{"name": "http", "port": 8080}]}}
    with pytest.raises(LookupFailed, match="ExternalName"):
        ready_addresses(external, [piece([endpoint("10.244.9.9", True)])], 8080)


@pytest.mark.parametrize(("spec", "says"), [
    ({"type": "ClusterIP", "ports": [{"name": "http", "port": 8080}]}, "no selector"),
    ({"type": "ClusterIP", "selector": {"app": "m1"}, "ports": [{"name": "http", "port": 80}]}, "no port 8080"),
])
def test_a_service_that_does_not_lead_to_the_pools_pods_is_refused(spec: dict[str, Any], says: str) -> None:
    with pytest.raises(LookupFailed, match=says):
        ready_addresses({"metadata": {"name": "m1-cpu"}, "spec": spec}, [piece([endpoint("10.244.0.7", True)])], 8080)


class Counting(Endpoints):
    """Endpoints whose lookups are counted and answer ``answer`` (the API server is the cluster tests')."""

    def __init__(self, answer: list[tuple[str, int]] | LookupFailed, ttl: float) -> None:
        super().__init__(ApiAccess("https://127.0.0.1:1", "", ""), ttl=ttl)
        self.answer, self.lookups = answer, 0

    def _lookup(self, namespace: str, service: str, port: int) -> list[tuple[str, int]]:
        self.lookups += 1
        time.sleep(0.05)  # a round trip, during which other held requests ask too
        if isinstance(self.answer, LookupFailed):
            raise self.answer
        return list(self.answer)


def test_the_requests_held_for_one_service_share_one_lookup() -> None:
    seen = Counting([("10.244.0.7", 8081)], ttl=5.0)
    results: list[list[tuple[str, int]]] = []
    threads = [threading.Thread(target=lambda: results.append(seen.locate("tenant-a", "m1-cpu", 8080)))
               for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [[("10.244.0.7", 8081)]] * 50 and seen.lookups == 1
    seen.locate("tenant-a", "m1-cpu", 9000)  # another port, another lookup
    assert seen.lookups == 2


def test_a_lookup_is_repeated_after_its_ttl_and_its_failure_is_kept_as_long() -> None:
    seen = Counting(LookupFailed("the API server answered 403"), ttl=0.2)
    for _ in range(3):
        with pytest.raises(LookupFailed, match="403"):
            seen.locate("tenant-a", "m1-cpu", 8080)
    assert seen.lookups == 1
    time.sleep(0.25)
    seen.answer = [("10.244.0.7", 8081)]
    assert seen.locate("tenant-a", "m1-cpu", 8080) == [("10.244.0.7", 8081)] and seen.lookups == 2


def test_in_a_pod_the_service_account_outside_one_the_flags() -> None:
    access = ApiAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"})
    assert access == ApiAccess("https://10.96.0.1:443", f"{endpoints.SERVICE_ACCOUNT_DIR}/ca.crt",
                               f"{endpoints.SERVICE_ACCOUNT_DIR}/token")
    assert ApiAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}).server == \
        "https://[fd00::1]:443"
    with pytest.raises(ValueError, match=r"not in a pod.*--api-server"):
        ApiAccess.in_cluster({})
    given = main.parse_args(["--api-server", "https://h:6443", "--api-ca-file", "/ca", "--api-token-file", "/t"])
    assert main._api_access(given) == ApiAccess("https://h:6443", "/ca", "/t")
    with pytest.raises(ValueError, match="go together"):
        main._api_access(main.parse_args(["--api-server", "https://h:6443"]))
