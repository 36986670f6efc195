"""Where a sleeping model's pool answers: the ready endpoints of its Service, read from the API server.

The activator does not connect to the Service's DNS name. A name needs cluster DNS and a Service proxy (kube-proxy or
its replacement) between the activator and the pool, where the gateway in front of it needs neither (Gateway API
implementations reach pods by their EndpointSlices too). And a name leads wherever the Service says: a tenant who can
edit its own namespace's Services can make the signed one an ExternalName aimed at another tenant or any host until
the operator's next reconcile. So the activator looks the way Knative's activator and KEDA's interceptor do:

- the Service must be one with a selector (not ExternalName, not selectorless): its slices are then the
  EndpointSlice controller's, which only ever lists pods of the Service's own namespace that its selector chose;
- only the slices that controller manages are read (tenants' ``edit`` role cannot write EndpointSlices since
  Kubernetes 1.22, CVE-2021-25740), and of them only the endpoints whose ``ready`` condition is not false: a pool
  has woken when one of its pods is Ready, exactly when a Service would start sending to it;
- the port is the Service port's target as the slice states it (``targetPort`` may be a name).

One lookup is shared by every request held for the same Service within ``ttl`` seconds: a burst of held requests for
one model costs the API server a couple of GETs every ``ttl``, not one per request.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

Address = tuple[str, int]
#: The ``managed-by`` label the EndpointSlice controller puts on the slices it writes for a Service.
CONTROLLER = "endpointslice-controller.k8s.io"
#: Where the kubelet mounts a pod's ServiceAccount token and the cluster's CA.
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


class LookupFailed(Exception):
    """The Service's endpoints could not be read, or the Service is not one the activator forwards to."""


@dataclass(frozen=True)
class ApiAccess:
    """How to reach the API server: its base URL, the CA that signed its certificate, and a bearer token (read at
    each request: the kubelet rotates projected tokens in place)."""

    server: str
    ca_file: str
    token_file: str

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] = os.environ) -> ApiAccess:
        """The pod's own: ``KUBERNETES_SERVICE_HOST``/``PORT`` and the mounted ServiceAccount (ValueError outside
        a pod, naming what is missing)."""
        host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ValueError("KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set (not in a pod): give "
                             "--api-server, --api-ca-file and --api-token-file")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", f"{SERVICE_ACCOUNT_DIR}/ca.crt", f"{SERVICE_ACCOUNT_DIR}/token")


def ready_addresses(service: Mapping[str, Any], slices: Sequence[Mapping[str, Any]], port: int) -> list[Address]:
    """The addresses to connect to for ``port`` of ``service``: each ready endpoint of the controller's ``slices``,
    at the port the slice states for that Service port. Pure; :class:`LookupFailed` when the Service is not one to
    forward to (ExternalName, no selector, no such port)."""
    spec = service.get("spec") or {}
    name = (service.get("metadata") or {}).get("name", "?")
    if spec.get("type") == "ExternalName":
        raise LookupFailed(f"Service {name} is of type ExternalName: the activator forwards only to a pool's pods")
    if not spec.get("selector"):
        raise LookupFailed(f"Service {name} has no selector: its endpoints are not the pool's pods")
    port_names = [p.get("name") or "" for p in spec.get("ports") or () if p.get("port") == port]
    if not port_names:
        raise LookupFailed(f"Service {name} has no port {port}")
    found: list[Address] = []
    for piece in slices:
        labels = (piece.get("metadata") or {}).get("labels") or {}
        if labels.get("endpointslice.kubernetes.io/managed-by") != CONTROLLER:
            continue
        if labels.get("kubernetes.io/service-name") != name:
            continue
        target = [p.get("port") for p in piece.get("ports") or () if (p.get("name") or "") == port_names[0]]
        if not target or not isinstance(target[0], int):
            continue
        for endpoint in piece.get("endpoints") or ():
            if (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            found.extend((address, target[0]) for address in (endpoint.get("addresses") or [])[:1])
    return sorted(set(found))


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    at: float = float("-inf")
    addresses: list[Address] = field(default_factory=list)
    error: LookupFailed | None = None


class Endpoints:
    """Looks up Services' ready endpoints through the API server, one lookup per Service per ``ttl`` seconds."""

    def __init__(self, api: ApiAccess, ttl: float = 0.25, timeout: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.ttl, self.timeout, self.clock = api, ttl, timeout, clock
        self._entries: dict[tuple[str, str, int], _Entry] = {}
        self._lock = threading.Lock()
        split = urlsplit(api.server)
        self._host, self._port = split.hostname or "", split.port or 443
        self._ssl = ssl.create_default_context(cafile=api.ca_file)

    def locate(self, namespace: str, service: str, port: int) -> list[Address]:
        """The ready addresses of ``namespace/service``'s ``port`` (:class:`LookupFailed` when there is no reading
        them, or the Service is not one to forward to)."""
        with self._lock:
            if len(self._entries) > 1024:  # Services no request has asked for lately
                stale = self.clock() - 60.0
                self._entries = {k: e for k, e in self._entries.items() if e.at > stale or e.lock.locked()}
            entry = self._entries.setdefault((namespace, service, port), _Entry())
        with entry.lock:  # the requests waiting for one Service share one lookup
            if self.clock() - entry.at >= self.ttl:
                try:
                    entry.addresses, entry.error = self._lookup(namespace, service, port), None
                except LookupFailed as exc:
                    entry.addresses, entry.error = [], exc
                entry.at = self.clock()
            if entry.error is not None:
                raise entry.error
            return list(entry.addresses)

    def _lookup(self, namespace: str, service: str, port: int) -> list[Address]:
        ns, svc = quote(namespace, safe=""), quote(service, safe="")
        found = self._get(f"/api/v1/namespaces/{ns}/services/{svc}")
        selector = quote(f"kubernetes.io/service-name={service},endpointslice.kubernetes.io/managed-by={CONTROLLER}")
        slices = self._get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector={selector}")
        return ready_addresses(found, list(slices.get("items") or ()), port)

    def _get(self, path: str) -> dict[str, Any]:
        try:
            with open(self.api.token_file, encoding="utf-8") as f:
                token = f.read().strip()
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self.timeout, context=self._ssl)
            try:
                conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
                response = conn.getresponse()
                body = response.read(16 * 1024 * 1024)
            finally:
                conn.close()
        except OSError as exc:
            raise LookupFailed(f"the API server could not be reached: {exc}") from exc
        if response.status != 200:
            raise LookupFailed(f"the API server answered {response.status} to GET {path.split('?')[0]}: "
                               f"{body[:200].decode(errors='replace')}")
        try:
            parsed = json.loads(body)
        except ValueError as exc:
            raise LookupFailed(f"the API server's answer to GET {path.split('?')[0]} is not JSON") from exc
        if not isinstance(parsed, dict):
            raise LookupFailed(f"the API server's answer to GET {path.split('?')[0]} is not an object")
        return parsed
