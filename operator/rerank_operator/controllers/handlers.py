"""kopf wiring and the process's parts. Every trigger lands in the same idempotent reconcile; none carries logic.

The process (``Process``) holds, once: the API client, the watch-fed caches (``adapters/caches.py``), the reconcile
queue (``workqueue.py``), the fleet autoscaler (``autoscale_loop.py``) and the leader elector (``leader.py``).

- **Triggers are keys in one queue.** The models' informer (``adapters/caches.py``) queues a model that changed;
  the children's informers queue the model a child belongs to (a Job finishing, a pool becoming ready); a
  RerankClass change (kopf's watch: it writes nothing on the class) queues the models it concerns; each reconcile
  queues its model again after ``--resync-seconds`` (the safety net: watches see every change, so nothing waits
  for it). A model is never reconciled by two workers at once.
- **Reads come from memory.** A reconcile or an autoscaler tick of a model whose state did not change makes no API
  request.
- **Only the leader writes.** Both replicas run the informers (warm caches); the queue's workers and the autoscaler
  start when the Lease is won. A leader that cannot renew its Lease exits (as controller-runtime does), so two
  processes never write one model's status.

Status writes of the two loops never interleave (``handoff.py``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import kopf

from rerank_operator import __version__
from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.artifact_store import SharedArtifacts
from rerank_operator.adapters.caches import CHILD_KINDS, Caches
from rerank_operator.adapters.cluster import Cluster
from rerank_operator.adapters.event_sender import EventSender
from rerank_operator.adapters.kube_api import Client
from rerank_operator.controllers import artifact_gc, autoscale_loop, class_index, leader
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.controllers.reconcile_loop import reconcile
from rerank_operator.controllers.workqueue import RetryAfter, WorkQueue
from rerank_operator.core import names
from rerank_operator.core.builders import fetch as fetching
from rerank_operator.core.reconcile.observed import Obj
from rerank_operator.core.settings import Settings
from rerank_operator.core.status import compute as statuses

USER_AGENT = f"{names.OPERATOR_NAME}/{__version__}"
#: Requests block on the API server, not the CPU: in a burst of applies every worker waits on it. A new model's
#: reconcile holds a worker for its claim and Job (side by side; its status comes after the burst), ~0.3-0.5 s on a
#: busy 2-core dev cluster (benchmarks/fleet/): models/s ~ workers / 0.4, well above how fast 8 clients create
#: models there (~50/s). Each worker costs a thread and up to two pooled connections of memory.
RECONCILE_WORKERS = 64
#: While new models wait for their Jobs, other models' background reconciles (pool roll-outs after a Job finished,
#: status churn) use at most this many workers: their writes would compete with the new models' on the API server.
BACKGROUND_WORKERS_IN_A_BURST = 4
CACHE_SYNC_SECONDS = 120.0

log = logging.getLogger(__name__)


class Process:
    """What one operator process shares between its handlers (created by ``install``; started by kopf's startup)."""

    def __init__(self, settings: Settings, namespaces: Sequence[str] = ()) -> None:
        self.settings = settings
        self.namespaces = list(namespaces)
        self.registry = class_index.Registry()
        self.handoff = Handoff()
        self.queue: WorkQueue[names.ModelKey] = WorkQueue(self._reconcile, RECONCILE_WORKERS,
                                                    waited=metrics.QUEUE_WAIT.observe,
                                                    background_while_urgent=BACKGROUND_WORKERS_IN_A_BURST)
        self._triggers: dict[names.ModelKey, str] = {}  # why each queued model was queued first (the metrics' trigger)
        self._triggers_lock = threading.Lock()
        self.stop = threading.Event()
        self.client: Client | None = None
        self.caches: Caches | None = None
        self.cluster: Cluster | None = None
        self.events: EventSender | None = None
        self.autoscaler: autoscale_loop.FleetAutoscaler | None = None
        self.elector: leader.Elector | None = None
        self._electing: threading.Thread | None = None
        self.shared: SharedArtifacts | None = None
        self._waiting: dict[str, set[names.ModelKey]] = {}  # shared artifact id -> models waiting on its Job

    # --- starting and stopping ----------------------------------------------------------------------------------------

    def start(self) -> None:
        """Connect, fill the caches, then run for leadership; the workers and the autoscaler start when it is won."""
        watches = (len(CHILD_KINDS) + 1) * max(1, len(self.namespaces))  # the children's informers and the models'
        # Two requests per worker at most (a new model's claim and Job are written side by side: cluster.py).
        self.client = Client.from_environment(USER_AGENT, connections=watches + 2 * RECONCILE_WORKERS + 16)
        self.caches = Caches(self.client, self.namespaces, on_child=self.on_child_event,
                             on_model=self.on_model_event)
        self.cluster = Cluster(self.client, self.caches)
        self.shared = SharedArtifacts(self.client, self.settings.artifact_store_credentials)
        self.events = self.cluster.post_events_in_background()
        self.autoscaler = autoscale_loop.FleetAutoscaler(
            self.cluster, registry=self.registry, settings=self.settings, handoff=self.handoff,
            models=self.caches.models, after_decision=lambda key: self.enqueue(key, "autoscaler"))
        self.caches.start()
        missing = self.caches.wait_synced(CACHE_SYNC_SECONDS)
        if missing:  # a reconcile before the caches hold the children would create them twice
            raise kopf.PermanentError(f"the watches of {', '.join(missing)} did not list within "
                                      f"{CACHE_SYNC_SECONDS:.0f} s: check the operator's RBAC and the API server")
        metrics.QUEUE_DEPTH.set_function(self.queue.depth)
        self.elector = leader.Elector(self.client, self.settings.leader_election, leader.default_identity())
        self.client.fence = self.elector.term_left  # every write from here on is fenced by the term (kube_api.py)
        self._electing = threading.Thread(target=self.elector.run, args=(self.stop, self.lead, self.abdicate),
                                          daemon=True, name="leader-election")
        self._electing.start()

    def lead(self) -> None:
        """Won the Lease: work off the queue (every model is in it since the models' informer first listed them)
        and scale."""
        log.info("leading: reconciling %d models", len(self.caches.models) if self.caches else 0)
        self.queue.start()
        if self.autoscaler is not None:
            self.autoscaler.start(self.stop)
        if self.shared is not None and self.cluster is not None and self.caches is not None and not self.namespaces:
            models = self.caches.models
            elector = self.elector
            threading.Thread(target=artifact_gc.run, daemon=True, name="artifact-gc", args=(
                self.stop, self.shared, self.cluster.list_classes,
                lambda: [(models.get(*k) or {}).get("status") or {} for k in models.all_keys()],
                self.settings.artifact_gc_seconds),
                kwargs={"leading": (lambda: elector.is_leader) if elector is not None else (lambda: True)}).start()

    def abdicate(self) -> None:
        """Lost the Lease: exit at once, so that only the new leader writes (the pod restarts as a standby)."""
        log.error("lost the leader Lease: exiting so that only the new leader writes")
        logging.shutdown()
        os._exit(1)

    def shutdown(self) -> None:
        """A graceful stop: the workers finish what they hold, then the Lease is released so a standby leads at once
        (never while this process may still write)."""
        self.queue.stop(wait_seconds=20)
        if self.events is not None:
            self.events.stop(wait_seconds=5)  # still leading: the Events of the last reconciles go out first
        self.stop.set()
        if self._electing is not None:
            self._electing.join(timeout=5)
        if self.caches is not None:
            self.caches.stop()

    # --- the reconcile ------------------------------------------------------------------------------------------------

    def enqueue(self, key: names.ModelKey, trigger: str, urgent: bool = False) -> None:
        """Queue the model; the first trigger since its last reconcile names it in the metrics. ``urgent``: a spec
        nobody acted on yet, ahead of the background work (workqueue.py)."""
        with self._triggers_lock:
            self._triggers.setdefault(key, trigger)
        self.queue.add(key, urgent)

    def _reconcile(self, key: names.ModelKey) -> float | None:
        """One reconcile of the model, under its status lock; returns when to resync it."""
        namespace, name = key
        assert self.cluster is not None
        with self._triggers_lock:
            trigger = self._triggers.pop(key, "resync")
        try:
            with self.handoff.status_lock(namespace, name):
                result = reconcile(self.cluster, namespace, name, trigger, registry=self.registry,
                                   settings=self.settings,
                                   others_waiting=lambda: self.queue.urgent_pending(besides=key) > 0,
                                   shared=self.shared)
        except kopf.TemporaryError as exc:
            raise RetryAfter(str(exc), exc.delay) from exc
        except kopf.PermanentError as exc:  # the status says why; a change of the model queues it again
            log.warning("reconcile of %s/%s: %s", namespace, name, exc)
            return None
        for kind, held in self.caches.sizes().items() if self.caches else ():
            metrics.CACHED_OBJECTS.labels(kind).set(held)
        if result is None:  # gone
            self._wait_on(key, None)
            self.queue.forget(key)
            self.handoff.forget(namespace, name)
            return None
        self._wait_on(key, result.waits_on)
        if result.status_deferred:  # a burst: its Job is started, its status is background work (reconcile_loop.py)
            self.enqueue(key, "status")
        if result.spec_changed:  # a newer spec reached the caches with our own write's answer, not by the watch
            self.enqueue(key, "model", urgent=True)
        return result.requeue_after or self.settings.resync_seconds

    def _wait_on(self, key: names.ModelKey, artifact_id: str | None) -> None:
        """Record which shared artifact's Job ``key`` waits for (None: none), so that Job's events queue it."""
        with self._triggers_lock:
            for waiting in self._waiting.values():
                waiting.discard(key)
            if artifact_id is not None:
                self._waiting.setdefault(artifact_id, set()).add(key)
            self._waiting = {k: v for k, v in self._waiting.items() if v}

    # --- events -------------------------------------------------------------------------------------------------------

    def on_model_event(self, event_type: str, obj: Obj) -> None:
        """The models' informer (its thread): a model changed; queue it, ahead of the background work when nobody has
        acted on its spec yet. The informer has stored it (or dropped it, for DELETED) already."""
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event_type == "DELETED":
            self.registry.forget(*key)
            metrics.forget_model(*key)
        self.enqueue(key, "model", urgent=event_type != "DELETED" and statuses.not_acted_on(obj))

    def on_child_event(self, event_type: str, obj: Obj) -> None:
        """A child changed (an informer's thread): queue its model. Pool pods only matter to the autoscaler, which
        reads them every tick, so their many status changes queue nothing; but one whose shared artifact could not be
        fetched does (its reason goes to Ready: ``readiness.artifact_fetched``)."""
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(names.LABEL_SHARED) == "true":  # a shared artifact's Job or pod: every model waiting on it
            artifact_id = str(labels.get(names.LABEL_ARTIFACT))
            if self.shared is not None:
                self.shared.changed(artifact_id)
            with self._triggers_lock:
                waiting = sorted(self._waiting.get(artifact_id, ()))
            for key in waiting:
                self.enqueue(key, "shared")
            return
        if obj.get("kind") == "Pod" and names.LABEL_POOL in labels and fetching.failure(obj) is None:
            return
        model = labels.get(names.LABEL_INSTANCE)
        if model and meta.get("namespace"):
            self.enqueue((str(meta["namespace"]), str(model)), "child")

    def on_class_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """A RerankClass changed: queue the models it concerns (class_index.py)."""
        for key in class_index.class_event(event_type, dict(body), self.registry.classes, self.registry.models):
            self.enqueue(key, "class")

    def reconciling(self) -> dict[str, int]:
        return {"queued": self.queue.depth(), "reconciling": self.queue.processing(),
                "leader": int(bool(self.elector and self.elector.is_leader))}


def install(settings: Settings, namespaces: Sequence[str] = ()) -> kopf.OperatorRegistry:
    """A kopf registry with every handler below bound to one ``Process`` built from ``settings`` (main.py passes it
    to ``kopf.operator``)."""
    process = Process(settings, namespaces)
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_via_client)  # kopf's default, from the kubernetes client's config
    kopf.on.startup(registry=registry)(functools.partial(configure, process))
    kopf.on.cleanup(registry=registry)(functools.partial(cleanup, process))
    kopf.on.event(names.GROUP, names.VERSION, "rerankclasses", registry=registry)(
        functools.partial(on_class_event, process))
    kopf.on.probe(id="reconciling", registry=registry)(functools.partial(probe, process))
    return registry


def configure(process: Process, settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration", ignored_fields=["metadata"])
    settings.posting.level = logging.WARNING
    if process.settings.watch_server_timeout:
        settings.watching.server_timeout = process.settings.watch_server_timeout
        settings.watching.client_timeout = process.settings.watch_server_timeout + 5
    process.start()


def cleanup(process: Process, **_: Any) -> None:
    process.shutdown()


async def on_class_event(process: Process, *, body: kopf.Body, type: str | None, **_: Any) -> None:
    """An event handler writes nothing on the class (on.create/update/delete would keep kopf's state and a
    finalizer on it)."""
    process.on_class_event(type, body)


def probe(process: Process, **_: Any) -> dict[str, int]:
    """The liveness endpoint answers only while kopf's loop runs; reports the queue and leadership."""
    return process.reconciling()
