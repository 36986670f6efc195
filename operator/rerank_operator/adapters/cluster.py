"""The RerankModel-shaped view of the API: ``ClusterAccess``, what the two loops need from the cluster, and ``Cluster``,
the real one (tests/unit/operator/fake_cluster.py is the one fake both loops' unit tests use, so a new need shows up in
one place). Every request goes through ``kube_api.Client`` (the only module that talks to the API).

Writes are server-side apply with field manager ``rerank-operator`` (so an HPA's replicas or a user's annotations
are never fought over), create-only for Jobs (their template is immutable), background deletes, and a merge patch
of the status. Not-found and already-exists are expected outcomes, not errors. Writes the API server refuses for
a reason retrying will not fix (422, 403, a missing Gateway API) are returned as typed ``writes.Refused`` for the
status; transient failures (connection, 5xx, 429) raise :class:`TransientApiError` so the caller can retry with
backoff; any other refusal of a read raises :class:`ApiError` (never the client library's own exception).
What to read is decided by pure functions (``observed.controlled_by``, ``observed.short_of_replicas``,
``job_outcome.waiting_for_pods``); this module only runs the requests, through the client. What it reads and writes are
the core's plain data: ``observed.Observed``/``PoolsView`` in, ``plan.Plan`` and ``writes.Executed`` out.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from rerank_operator.adapters.caches import Caches
from rerank_operator.adapters.event_sender import EventSender
from rerank_operator.adapters.kube_api import ApiError, Client, TransientApiError, api_path
from rerank_operator.core import gateway, names
from rerank_operator.core.artifacts import job_outcome
from rerank_operator.core.builders import fetch as fetching
from rerank_operator.core.reconcile.observed import (
    Obj,
    ObjectRef,
    Observed,
    PoolsView,
    controlled_by,
    owned_pods,
    pool_deployments,
    ref_of,
    short_of_replicas,
)
from rerank_operator.core.reconcile.plan import Plan, Scale
from rerank_operator.core.reconcile.writes import Executed, Refused
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status.events import Event

log = logging.getLogger(__name__)

#: How long a namespace's FailedCreate Events, once read, answer for it (``Cluster._failed_create_events``).
FAILED_CREATE_EVENTS_TTL = 5.0

__all__ = ["ApiError", "Cluster", "ClusterAccess", "TransientApiError"]


class ClusterAccess(Protocol):
    """One RerankModel's view of the API: read it and its class, observe and change its children, write its status,
    annotations and events. Reads raise ``TransientApiError`` for what a retry may fix."""

    def get_model(self, namespace: str, name: str) -> Obj | None:
        """The model as stored now; None when it is gone. Read-only: it may be the caches' own copy."""

    def list_classes(self) -> list[Obj]:
        """Every RerankClass; none when their CRD is not installed."""

    def observe(self, owner: names.Owner, spec: RerankModelSpec) -> Observed:
        """Everything the plan needs, filtered to children this model controls."""

    def execute(self, plan: Plan) -> Executed:
        """Run ``plan``; the objects written and the writes refused."""

    def observe_pools(self, owner: names.Owner) -> PoolsView:
        """The pools' Deployments, pods and route, as the autoscaler reads them every tick."""

    def patch_status(self, owner: names.Owner, patch: Mapping[str, Any]) -> None:
        """Merge ``patch`` into the model's status."""

    def post_event(self, owner: names.Owner, event: Event) -> None:
        """An Event on the model."""

    def annotate_model(self, owner: names.Owner, annotations: Mapping[str, str | None]) -> None:
        """Set (or, with None, remove) annotations of the model."""

    def remove_finalizer(self, namespace: str, name: str, finalizer: str, index: int) -> None:
        """Remove ``finalizer``, found at ``index`` of the model's finalizers (a no-op if it is no longer there)."""


def side_by_side(first: Callable[[], None], second: Callable[[], None]) -> None:
    """Run ``first`` on a thread while ``second`` runs here (two requests in flight instead of one after the
    other); both finish before this returns, and an exception of either is raised (``second``'s if both fail)."""
    failed: list[BaseException] = []

    def run_first() -> None:
        try:
            first()
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run_first, daemon=True, name="side-by-side")
    thread.start()
    try:
        second()
    except BaseException:
        thread.join()
        if failed:
            log.warning("the other of two writes side by side failed too: %s", failed[0])
        raise
    thread.join()
    if failed:
        raise failed[0]


def _refused(ref: ObjectRef, verb: str, exc: ApiError, text: str) -> Refused:
    return Refused(ref=ref, verb=verb, status=exc.status, message=exc.message, text=text)


class Cluster:
    """A RerankModel-shaped view of the API: observe one model's children, execute its plan, write its status.

    Reads come from ``caches`` (watch-fed, informer.py): observing a model costs no request. The only reads that
    still go to the API are the rare ones the caches do not hold: a user's own claim (``storage.existingClaim``:
    not labelled as ours) and the FailedCreate Events of a Job that has no pod. Every write's answer (the object as
    stored) goes back into the caches, so the next reconcile sees its own writes even before the watch does."""

    def __init__(self, client: Client, caches: Caches, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.caches = caches
        self.events: EventSender | None = None  # post_events_in_background; None: posted before post_event returns
        self._clock = clock
        self._failed_creates: dict[str, tuple[float, list[Obj]]] = {}  # namespace -> (read at, FailedCreate Events)
        self._failed_creates_lock = threading.Lock()
        self._granted: set[tuple[str, str]] = set()  # ReferenceGrants applied by this process (``_grant``)

    def post_events_in_background(self, capacity: int = 2000) -> EventSender:
        """From now on ``post_event`` queues the Event for a background thread (event_sender.py); the caller stops
        the sender (which posts what is queued) when the process stops."""
        self.events = EventSender(self._post_event, capacity)
        return self.events

    # --- reading ----------------------------------------------------------------------------------------------------

    def get_model(self, namespace: str, name: str) -> Obj | None:
        """The model as last seen (its watch, or our own last write of it): the caches' object, never to be changed
        (the core's functions copy what they change; the autoscaler reads every model every tick, so no copy)."""
        return self.caches.models.get(namespace, name)

    def list_classes(self) -> list[Obj]:
        """Every RerankClass (cluster-scoped); none when their CRD is not installed."""
        try:
            result = self.client.request("GET", f"/apis/{names.API_VERSION}/rerankclasses")
        except ApiError as exc:
            if exc.status == 404:
                return []
            raise
        return [dict(i) for i in result.get("items") or ()]

    def observe(self, owner: names.Owner, spec: RerankModelSpec) -> Observed:
        """Everything the plan needs, from the caches, filtered to children controlled by this very object."""
        ns, c = owner.namespace, self.caches
        jobs = [j for j in c.store("Job").controlled_by(owner.uid)
                if (j["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT) == names.COMPONENT_QUANTIZER]
        job_pods = [p for j in jobs for p in c.store("Pod").controlled_by(j["metadata"]["uid"])]
        deployments = pool_deployments(c.store("Deployment").controlled_by(owner.uid), owner.name)
        services = {s["metadata"]["name"]: s for s in c.store("Service").controlled_by(owner.uid)}
        route = next((r for r in c.store("HTTPRoute").controlled_by(owner.uid)
                      if r["metadata"]["name"] == names.route_name(owner.name)), None)
        policy = c.store("NetworkPolicy").get(ns, names.network_policy_name(owner.name))
        # Quota checks (tenancy.quota_blocked) look further only while something is missing: a pool short of ready
        # replicas (its ReplicaSets' ReplicaFailure), a Job without a pod (its FailedCreate Events).
        replica_sets: list[Obj] = []
        if short_of_replicas(deployments.values()):  # (and what their pods' fetch of a shared artifact said)
            replica_sets = [r for d in deployments.values()
                            for r in c.store("ReplicaSet").controlled_by(d["metadata"]["uid"])]
        job_events: list[Obj] = []
        if any(job_outcome.pod_long_missing(j, time.time()) for j in jobs):
            job_events = self._failed_create_events(ns)
        if spec.storage.existing_claim:  # the user's own claim carries none of our labels: read it
            claim = self.client.get("v1", "PersistentVolumeClaim", ns, spec.storage.existing_claim)
        else:
            claim = c.store("PersistentVolumeClaim").get(ns, names.pvc_name(owner.name))
        return Observed(
            claim=claim,
            jobs=tuple(jobs),
            job_pods=tuple(job_pods),
            deployments=deployments,
            services=services,
            route=route,
            route_api_available=c.available("HTTPRoute"),
            network_policy=policy if policy is not None and controlled_by(policy, owner.uid) else None,
            replica_sets=tuple(replica_sets),
            job_events=tuple(job_events),
            fetch_failures=tuple(fetching.failures(p for r in replica_sets
                                                   for p in c.store("Pod").controlled_by(r["metadata"]["uid"]))),
            gateways=gateway.views(spec.routing.gateway.parent_refs if spec.routing.gateway else (), ns,
                                   c.gateway, c.gateway_class),
        )

    def _failed_create_events(self, namespace: str) -> list[Obj]:
        """The namespace's FailedCreate Events of Jobs, read again only after ``FAILED_CREATE_EVENTS_TTL``
        seconds: inside a burst the Job controller is slow to create pods, every pod-less Job's model is reconciled
        again and again, and a read each (540 in a 300-model burst) loaded the API server; a quota refusal is seen
        a few seconds later at worst (the model is looked at again every ``JOB_WAIT_RECHECK_SECONDS`` anyway)."""
        with self._failed_creates_lock:
            found = self._failed_creates.get(namespace)
        if found is not None and self._clock() - found[0] < FAILED_CREATE_EVENTS_TTL:
            return found[1]
        # Read without a lock: workers of one namespace missing at the same moment may read twice, but a slow or
        # failing read never holds the others up one after another.
        events = self.client.request("GET", api_path("v1", "Event", namespace),
                                     field_selector="involvedObject.kind=Job,reason=FailedCreate")
        listed = [dict(e) for e in events.get("items") or ()]
        with self._failed_creates_lock:
            self._failed_creates[namespace] = (self._clock(), listed)
        return listed

    # --- writing ----------------------------------------------------------------------------------------------------

    def execute(self, plan: Plan) -> Executed:
        """Run ``plan``; returns the objects written and the writes refused."""
        done: list[ObjectRef] = []
        refused: list[Refused] = []
        # Existing Deployments are scaled before the applies: the scale write takes the field from any manager
        # that owned it (an older manifest that carried replicas), so the apply that omits it cannot reset it.
        self._scale([s for s in plan.scale if s.exists], done, refused)
        # The claim and the Job that mounts it first, side by side, then the rest: in a burst of new models each
        # build starts before its Services and policy are written (the pools wait for the artifact anyway), and
        # without waiting for the claim (its pod waits for the claim anyway, as the scheduler retries it when the
        # claim appears): on a busy API server a claim's apply took 0.75 s (p50) of every new model's apply -> Job.
        claims = [o for o in plan.apply if o["kind"] == "PersistentVolumeClaim"]
        claims_done: list[ObjectRef] = []
        if claims and plan.create:
            side_by_side(lambda: self._apply(claims, claims_done, refused),
                         lambda: self._create(plan.create, done, refused))
        else:
            self._apply(claims, claims_done, refused)
            self._create(plan.create, done, refused)
        done[:0] = claims_done
        self._grant(plan.grants, done, refused)
        self._apply([o for o in plan.apply if o["kind"] != "PersistentVolumeClaim"], done, refused)
        self._scale([s for s in plan.scale if not s.exists], done, refused)
        for ref in plan.delete:
            try:
                self.client.request("DELETE", api_path(ref.api_version, ref.kind, ref.namespace, ref.name),
                                    verb="delete", kind=ref.kind, propagation_policy="Background")
                done.append(ref)
            except ApiError as exc:
                if exc.status != 404:
                    refused.append(_refused(ref, "delete", exc, f"delete {ref}: {exc.status} {exc.message}"))
        return Executed(tuple(done), tuple(refused))

    def _grant(self, grants: Iterable[Obj], done: list[ObjectRef], refused: list[Refused]) -> None:
        """Apply each ReferenceGrant this process has not applied yet (one per model namespace: the first model
        there that may go to zero writes it, the others find it done), before the route that needs it."""
        for grant in grants:
            key = (grant["metadata"]["namespace"], grant["metadata"]["name"])
            if key in self._granted:
                continue
            failed = len(refused)
            self._apply([grant], done, refused)
            if len(refused) == failed:
                self._granted.add(key)

    def _create(self, objs: Iterable[Obj], done: list[ObjectRef], refused: list[Refused]) -> None:
        """Create each object (Jobs: their template is immutable); one that exists already is left as it is."""
        for obj in objs:
            kind, meta, ref = obj["kind"], obj["metadata"], ref_of(obj)
            try:
                self.caches.record(self.client.request(
                    "POST", api_path(obj["apiVersion"], kind, meta["namespace"]), verb="create", kind=kind, body=obj,
                    field_manager=names.FIELD_MANAGER), obj)
                done.append(ref)
            except ApiError as exc:
                if exc.status != 409:  # already exists: a previous run created it; nothing to do
                    refused.append(_refused(ref, "create", exc, f"{kind} {meta['name']}: {exc.status} {exc.message}"))

    def _apply(self, objs: list[Obj], done: list[ObjectRef], refused: list[Refused]) -> None:
        """Server-side apply of each object (force: the operator owns its fields)."""
        for obj in objs:
            kind, meta, ref = obj["kind"], obj["metadata"], ref_of(obj)
            try:
                self.caches.record(self.client.request(
                    "PATCH", api_path(obj["apiVersion"], kind, meta["namespace"], meta["name"]),
                    verb="apply", kind=kind, body=json.dumps(obj), content_type="application/apply-patch+yaml",
                    field_manager=names.FIELD_MANAGER, force_conflicts=True,
                ), obj)
                done.append(ref)
            except ApiError as exc:
                hint = " (are the Gateway API CRDs installed?)" if kind == "HTTPRoute" and exc.status == 404 else ""
                refused.append(_refused(ref, "apply", exc, f"{kind} {meta['name']}: {exc.status} {exc.message}{hint}"))

    def _scale(self, scales: list[Scale], done: list[ObjectRef], refused: list[Refused]) -> None:
        """Replicas through the Deployments' scale subresource (never in the applied manifest)."""
        for s in scales:
            ref = ObjectRef("apps/v1", "Deployment", s.namespace, s.name)
            try:
                self.client.request(
                    "PATCH", api_path("apps/v1", "Deployment", s.namespace, s.name, "scale"), verb="scale",
                    kind="Deployment", body={"spec": {"replicas": s.replicas}},
                    content_type="application/merge-patch+json", field_manager=names.FIELD_MANAGER,
                )
                done.append(ref)
            except ApiError as exc:
                text = f"scale Deployment {s.name} to {s.replicas}: {exc.status} {exc.message}"
                refused.append(_refused(ref, "scale", exc, text))

    def observe_pools(self, owner: names.Owner) -> PoolsView:
        """What the autoscaler needs, from the caches: the pool Deployments, their pods (only those the Deployments
        own: ``observed.owned_pods``), the HTTPRoute."""
        c = self.caches
        deployments = pool_deployments(c.store("Deployment").controlled_by(owner.uid), owner.name)
        labelled = [p for p in c.store("Pod").select(owner.namespace, {names.LABEL_INSTANCE: owner.name})
                    if ((p["metadata"].get("labels") or {}).get(names.LABEL_POOL)
                        or (p["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT) == names.COMPONENT_GUARD)
                    and not p["metadata"].get("deletionTimestamp")]
        replica_sets = [r for d in deployments.values()
                        for r in c.store("ReplicaSet").controlled_by(d["metadata"]["uid"])]
        pods, foreign = owned_pods(labelled, deployments.values(), replica_sets)
        route = next((r for r in c.store("HTTPRoute").controlled_by(owner.uid)
                      if r["metadata"]["name"] == names.route_name(owner.name)), None)
        return PoolsView(deployments=deployments, pods=tuple(pods), route=route,
                         route_api_available=c.available("HTTPRoute"),
                         foreign_pods=tuple(sorted(p["metadata"]["name"] for p in foreign)))

    def annotate_model(self, owner: names.Owner, annotations: Mapping[str, str | None]) -> None:
        """Merge ``annotations`` into the RerankModel's metadata (None removes one); kopf ignores metadata."""
        try:
            self.caches.record(self.client.request(
                "PATCH", api_path(names.API_VERSION, names.KIND, owner.namespace, owner.name), verb="patch",
                kind=names.KIND, body={"metadata": {"annotations": dict(annotations)}},
                content_type="application/merge-patch+json", field_manager=names.FIELD_MANAGER,
            ), {"apiVersion": names.API_VERSION, "kind": names.KIND})
        except ApiError as exc:
            if exc.status != 404:  # deleted meanwhile
                raise

    def remove_finalizer(self, namespace: str, name: str, finalizer: str, index: int) -> None:
        """A JSON patch that tests the finalizer is still at ``index`` before removing it, so a concurrent change of
        the list never removes someone else's (a failed test or a gone model: the next event looks again)."""
        path = f"/metadata/finalizers/{index}"
        try:
            self.caches.record(self.client.request(
                "PATCH", api_path(names.API_VERSION, names.KIND, namespace, name), verb="patch", kind=names.KIND,
                body=[{"op": "test", "path": path, "value": finalizer}, {"op": "remove", "path": path}],
                content_type="application/json-patch+json", field_manager=names.FIELD_MANAGER,
            ), {"apiVersion": names.API_VERSION, "kind": names.KIND})
        except ApiError as exc:
            if exc.status not in (404, 409, 422):  # gone, or the list changed meanwhile
                raise

    def patch_status(self, owner: names.Owner, patch: Mapping[str, Any]) -> None:
        try:
            self.caches.record(self.client.request(
                "PATCH", api_path(names.API_VERSION, names.KIND, owner.namespace, owner.name, "status"),
                verb="patch-status", kind=names.KIND, body={"status": patch},
                content_type="application/merge-patch+json", field_manager=names.FIELD_MANAGER,
            ), {"apiVersion": names.API_VERSION, "kind": names.KIND})
        except ApiError as exc:
            if exc.status != 404:  # deleted meanwhile
                raise

    def post_event(self, owner: names.Owner, event: Event) -> None:
        """A core/v1 Event on the RerankModel (what ``kubectl describe`` shows). Losing one is not worth a retry."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{owner.name}.", "namespace": owner.namespace},
            "involvedObject": {"apiVersion": names.API_VERSION, "kind": names.KIND, "name": owner.name,
                               "namespace": owner.namespace, "uid": owner.uid},
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "source": {"component": names.OPERATOR_NAME},
            "reportingComponent": names.OPERATOR_NAME,
            "reportingInstance": self.client.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        if self.events is not None:
            self.events.put(body)
        else:
            self._post_event(body)

    def _post_event(self, body: Mapping[str, Any]) -> None:
        involved = body["involvedObject"]
        try:
            self.client.request("POST", api_path("v1", "Event", involved["namespace"]), verb="create", kind="Event",
                                body=dict(body))
        except (ApiError, TransientApiError) as exc:
            log.warning("could not post event %s on %s/%s: %s", body.get("reason"), involved["namespace"],
                        involved["name"], exc)
