"""The leader-election Lease (coordination.k8s.io/v1) through kube_api.Client: read it, create it, update it.

Writes are compare-and-swap: an update is a PUT carrying the ``metadata.resourceVersion`` that was read, so when two
replicas act on the same record the API server takes one write and refuses the other with 409 Conflict. Losing that
race is an ordinary outcome of an election, not an error, so it comes back as :data:`LOST_RACE` (a create that finds
the Lease already there is the same race). Unreachable or overloaded API servers raise
``kube_api.TransientApiError`` as every other adapter does; the elector decides how long it can go without a write.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from urllib3.exceptions import HTTPError

from rerank_operator.adapters.kube_api import ApiError, Client, TransientApiError, api_path

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"
#: The API server's answer to a write with a stale resourceVersion (or a create of an existing Lease).
LOST_RACE: Literal["lost race"] = "lost race"


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease as read: its spec, and the resourceVersion an update must carry."""

    spec: dict[str, Any]
    resource_version: str


class LeaseStore:
    """One Lease, named by namespace and name; every call is one request (no cache: the election reads fresh)."""

    def __init__(self, client: Client, namespace: str, name: str, *, timeout_seconds: float | None = None) -> None:
        self.client = client
        self.namespace = namespace
        self.name = name
        # A request that hangs must not outlive the renew deadline (client-go cancels it the same way).
        self._params: dict[str, Any] = {"_request_timeout": timeout_seconds} if timeout_seconds else {}

    def read(self) -> LeaseRecord | None:
        """The Lease, or None when there is none yet."""
        try:
            obj = self._request("GET", api_path(API_VERSION, KIND, self.namespace, self.name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return _record(obj)

    def create(self, spec: Mapping[str, Any]) -> LeaseRecord | Literal["lost race"]:
        body = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace}, "spec": dict(spec)}
        try:
            obj = self._request("POST", api_path(API_VERSION, KIND, self.namespace), verb="create", body=body)
        except ApiError as exc:
            if exc.status == 409:  # another replica created it first
                return LOST_RACE
            raise
        return _record(obj)

    def update(self, spec: Mapping[str, Any], resource_version: str) -> LeaseRecord | Literal["lost race"]:
        """Replace the spec if the Lease is still at ``resource_version``."""
        body = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": self.name, "namespace": self.namespace, "resourceVersion": resource_version},
                "spec": dict(spec)}
        try:
            obj = self._request("PUT", api_path(API_VERSION, KIND, self.namespace, self.name), verb="update",
                                body=body)
        except ApiError as exc:
            if exc.status in (409, 404):  # changed (or deleted) since we read it: someone else moved first
                return LOST_RACE
            raise
        return _record(obj)

    def _request(self, method: str, path: str, verb: str = "", **params: Any) -> Any:
        """kube_api.Client.request with this store's timeout; urllib3's own errors (a timeout, a refused
        connection after its retries) are not OSErrors, so they are made transient here."""
        try:
            return self.client.request(method, path, verb=verb, kind=KIND if verb else "", **self._params, **params)
        except HTTPError as exc:
            raise TransientApiError(f"{method} {path}: {exc}") from exc

    def write(self, spec: Mapping[str, Any], current: LeaseRecord | None) -> LeaseRecord | Literal["lost race"]:
        """Create when there was no Lease, else update the one that was read."""
        return self.create(spec) if current is None else self.update(spec, current.resource_version)


def _record(obj: Any) -> LeaseRecord:
    obj = dict(obj)
    return LeaseRecord(spec=dict(obj.get("spec") or {}),
                       resource_version=str((obj.get("metadata") or {}).get("resourceVersion") or ""))
