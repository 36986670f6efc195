"""THE only module that talks to the Kubernetes API: transport, typed errors and the two generic reads.

A thin client over the dynamic client's generic ``request`` (no discovery). Transient failures (connection, 5xx,
429) raise :class:`TransientApiError` so the caller can retry with backoff; any other refusal raises
:class:`ApiError` with the HTTP status and the API server's own message (never the client library's exception).
Every write request increments ``metrics.API_WRITES``. What to read and write is cluster.py's business.

Writes are fenced by leadership (``Client.fence``: the seconds this process still leads, from the elector): a write
is refused before it is sent once the term is over (:class:`NotLeader`), and one that is sent may take no longer
than what is left of the term. So a leader whose Lease renewals hang stops writing at its renew deadline, before a
standby can take over (a standby waits the longer lease duration), even while its own loops still run. The Lease's
own writes are the elector's and are not fenced.
"""

from __future__ import annotations

import json
import math
import socket
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from kubernetes.watch.watch import iter_resp_lines

from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.core import names
from rerank_operator.core.reconcile.observed import Obj

_PLURALS = {
    "PersistentVolumeClaim": "persistentvolumeclaims",
    "Service": "services",
    "Pod": "pods",
    "Event": "events",
    "Deployment": "deployments",
    "Job": "jobs",
    "HTTPRoute": "httproutes",
    "Gateway": "gateways",
    "GatewayClass": "gatewayclasses",
    "ReferenceGrant": "referencegrants",
    "NetworkPolicy": "networkpolicies",
    "ReplicaSet": "replicasets",
    "Lease": "leases",
    names.KIND: names.PLURAL,
}
_TRANSIENT = {0, 429, 500, 502, 503, 504}


class TransientApiError(RuntimeError):
    """The API server could not be reached or asked us to come back later."""


class NotLeader(TransientApiError):
    """A write refused before it was sent: this process does not lead (any more). Transient for the callers, which
    retry with backoff; a deposed leader's process exits meanwhile (controllers/leader.py)."""


#: The kind whose writes are never fenced: the election's own Lease.
UNFENCED_KIND = "Lease"


def _bounded(timeout: Any, left: float) -> Any:
    """A request timeout no longer than ``left`` seconds (urllib3: a number is the total; a (connect, read) pair
    is bounded in both parts)."""
    if isinstance(timeout, tuple):
        return tuple(min(float(t), left) for t in timeout)
    return left if timeout is None else min(float(timeout), left)


class WatchExpired(RuntimeError):
    """The resourceVersion a watch resumes from is too old (410 Gone): list again."""


class ApiError(RuntimeError):
    """A request the API server refused for a reason a retry will not fix: its HTTP status and its own message."""

    def __init__(self, method: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{method} {path}: {status} {message}")
        self.status = status
        self.message = message


def api_path(api_version: str, kind: str, namespace: str | None, name: str | None = None,
             sub: str | None = None) -> str:
    """The REST path of a kind's collection (in ``namespace``; all namespaces for None) or of one object."""
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{prefix}/namespaces/{namespace}/{_PLURALS[kind]}" if namespace else f"{prefix}/{_PLURALS[kind]}"
    if name:
        path += f"/{name}"
    if sub:
        path += f"/{sub}"
    return path


def _as_dict(_client: Any, data: Any) -> Any:
    return data


class _NoDiscovery:
    """DynamicClient is used only for its generic ``request``; skip its API discovery and its cache file."""

    def __init__(self, client: Any, cache_file: Any) -> None:
        self.client = client


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


class Client:
    """Requests to the API server, with typed errors; one per operator process."""

    def __init__(self, api_client: ApiClient) -> None:
        self._api = DynamicClient(api_client, discoverer=_NoDiscovery)  # type: ignore[no-untyped-call]
        self.instance = socket.gethostname()  # reportingInstance of the Events this process posts
        #: Seconds this process may still write for (the elector's ``term_left``; unbounded without election).
        self.fence: Callable[[], float] = lambda: math.inf

    @classmethod
    def from_environment(cls, user_agent: str, connections: int = 64) -> Client:
        """In a pod: its ServiceAccount; elsewhere: $KUBECONFIG or ~/.kube/config. ``connections``: the connection
        pool's size, enough for every watch (each holds one) plus every worker; the client's default (5 per CPU)
        would open and close a TLS connection per request once the watches hold the pool."""
        try:
            kube_config.load_incluster_config()  # type: ignore[no-untyped-call]
        except kube_config.ConfigException:
            kube_config.load_kube_config()  # type: ignore[no-untyped-call]
        configuration = Configuration.get_default_copy()
        configuration.connection_pool_maxsize = connections
        api = ApiClient(configuration)
        api.user_agent = user_agent  # tells the operator's calls apart in audit logs
        return cls(api)

    def request(self, method: str, path: str, *, verb: str = "", kind: str = "", **params: Any) -> Any:
        if verb and kind != UNFENCED_KIND:
            left = self.fence()
            if left <= 0:
                metrics.FENCED_WRITES.labels(verb, kind).inc()
                raise NotLeader(f"{method} {path}: not sent, this process does not lead")
            if math.isfinite(left):
                params["_request_timeout"] = _bounded(params.get("_request_timeout"), left)
        if verb:
            metrics.API_WRITES.labels(verb, kind).inc()
        try:
            return self._api.request(method, path, serializer=_as_dict, **params)
        except ApiException as exc:
            if exc.status in _TRANSIENT:
                raise TransientApiError(f"{method} {path}: {exc.status} {_reason(exc)}") from exc
            raise ApiError(method, path, int(exc.status or 0), _reason(exc)) from exc
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # refused, reset, timed out: the server is unreachable
            raise TransientApiError(f"{method} {path}: {exc}") from exc

    def get(self, api_version: str, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            obj = self.request("GET", api_path(api_version, kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return dict(obj)

    def list_objects(self, api_version: str, kind: str, namespace: str, selector: str) -> list[Obj] | None:
        """Objects matching ``selector``; None when the API itself is absent (e.g. no Gateway API CRDs)."""
        try:
            result = self.request("GET", api_path(api_version, kind, namespace), label_selector=selector)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        items = [dict(i) for i in result.get("items") or ()]
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    def list_all(self, api_version: str, kind: str, namespace: str | None, selector: str) -> tuple[list[Obj], str]:
        """Every object matching ``selector`` (in ``namespace``, or all) and the list's resourceVersion, the point a
        watch resumes from (informer.py). Raises ApiError 404 when the API is absent."""
        result = self.request("GET", api_path(api_version, kind, namespace), label_selector=selector)
        items = [dict(i) for i in result.get("items") or ()]
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items, str((result.get("metadata") or {}).get("resourceVersion") or "")

    def watch(self, api_version: str, kind: str, namespace: str | None, selector: str, resource_version: str,
              seconds: int) -> Iterator[tuple[str, Obj]]:
        """(type, object) events after ``resource_version`` for ``seconds`` (BOOKMARKs included: they carry the
        newest resourceVersion); raises WatchExpired when the server no longer has that version."""
        path = api_path(api_version, kind, namespace)
        try:
            response = self._api.request("GET", path, serialize=False, watch=True, label_selector=selector,
                                         resource_version=resource_version, allow_watch_bookmarks=True,
                                         timeout_seconds=seconds, _request_timeout=(10, seconds + 30))
        except ApiException as exc:
            if exc.status == 410:
                raise WatchExpired(f"GET {path}: {exc.status} {_reason(exc)}") from exc
            if exc.status in _TRANSIENT:
                raise TransientApiError(f"GET {path}: {exc.status} {_reason(exc)}") from exc
            raise ApiError("GET", path, int(exc.status or 0), _reason(exc)) from exc
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            raise TransientApiError(f"GET {path}: {exc}") from exc
        try:
            for line in iter_resp_lines(response):  # type: ignore[no-untyped-call]
                event = json.loads(line)
                obj = dict(event.get("object") or {})
                if event.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired(f"watch {path}: {obj.get('message')}")
                    raise TransientApiError(f"watch {path}: {obj.get('code')} {obj.get('message')}")
                obj.setdefault("apiVersion", api_version)
                obj.setdefault("kind", kind)
                yield str(event.get("type")), obj
        except (OSError, urllib3.exceptions.HTTPError) as exc:  # broke mid-stream: resume from the last version seen
            raise TransientApiError(f"watch {path}: {exc}") from exc
        finally:
            response.close()
            response.release_conn()
