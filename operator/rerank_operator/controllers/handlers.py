"""kopf wiring. Every handler lands in the same idempotent reconcile; none carries logic of its own.

Triggers: create/update/resume of a RerankModel, a resync timer (drift, and Jobs whose pods are stuck without the
Job changing), and events of the Jobs and Deployments it owns (a Job finishing, a pool becoming ready).
Reconciles of one model never overlap and never write status between the autoscaler's read and write
(``handoff.py``, the one home of the two loops' coordination).

kopf's own bookkeeping is kept under the ``rerank.io`` prefix in annotations (the status schema is strict, so
kopf's default ``status.kopf`` would be pruned anyway). The timer makes kopf add a finalizer: deleting a
RerankModel needs the operator running, as for any kopf operator with timers.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import kopf

from rerank_operator import __version__
from rerank_operator.adapters.cluster import Cluster
from rerank_operator.controllers import autoscale_loop, class_index
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.controllers.reconcile_loop import Result, reconcile
from rerank_operator.core import names
from rerank_operator.core.settings import Settings

USER_AGENT = f"{names.OPERATOR_NAME}/{__version__}"


class Process:
    """What one operator process shares between its handlers: the settings it was started with, its class cache,
    API client and the loops' hand-off (created here, once, and passed to every reconcile and autoscaler)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.registry = class_index.Registry()
        self.handoff = Handoff()
        self._cluster: Cluster | None = None
        self._guard = threading.Lock()

    def cluster(self) -> Cluster:
        with self._guard:
            if self._cluster is None:
                self._cluster = Cluster.from_environment(USER_AGENT)
            return self._cluster

    def reconcile(self, namespace: str, name: str, trigger: str) -> Result | None:
        """One reconcile of the model, coalesced with any in progress, its status writes under the model's lock."""
        def run() -> Result | None:
            with self.handoff.status_lock(namespace, name):
                return reconcile(self.cluster(), namespace, name, trigger, registry=self.registry,
                                 settings=self.settings)
        return self.handoff.coalesce((namespace, name), run)


def install(settings: Settings) -> kopf.OperatorRegistry:
    """A kopf registry with every handler below bound to one ``Process`` built from ``settings`` (main.py passes it
    to ``kopf.operator``). Handler ids are the functions' names, as kopf stores them in annotations."""
    process = Process(settings)
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(kopf.login_via_client)  # kopf's default, from the kubernetes client's config
    rrm = (names.GROUP, names.VERSION, names.PLURAL)
    kopf.on.startup(registry=registry)(functools.partial(configure, process))
    for on in (kopf.on.resume, kopf.on.create, kopf.on.update):
        on(*rrm, registry=registry)(functools.partial(on_change, process))
    kopf.timer(*rrm, interval=settings.resync_seconds, initial_delay=settings.resync_seconds,
               registry=registry)(functools.partial(resync, process))
    kopf.daemon(*rrm, id="autoscaler", cancellation_backoff=1.0, cancellation_timeout=10.0,
                registry=registry)(functools.partial(autoscale, process))
    for group, version, plural in (("batch", "v1", "jobs"), ("apps", "v1", "deployments")):
        kopf.on.event(group, version, plural, labels=_OWNED, registry=registry)(
            functools.partial(on_child_event, process))
    kopf.on.event(names.GROUP, names.VERSION, "rerankclasses", registry=registry)(
        functools.partial(on_class_event, process))
    kopf.on.probe(id="reconciling", registry=registry)(functools.partial(probe, process))
    return registry


def configure(process: Process, settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{names.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    # Only the spec drives children: labels and annotations (an autoscaler's memory, a user's notes) must neither
    # trigger an update nor make kopf rewrite its diff base.
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration", ignored_fields=["metadata"])
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8
    if process.settings.watch_server_timeout:
        settings.watching.server_timeout = process.settings.watch_server_timeout
        settings.watching.client_timeout = process.settings.watch_server_timeout + 5
    process.cluster()


def on_change(process: Process, *, namespace: str | None, name: str, reason: str, **_: Any) -> None:
    process.reconcile(namespace or "", name, str(reason))


def resync(process: Process, *, namespace: str | None, name: str, **_: Any) -> None:
    process.reconcile(namespace or "", name, "timer")


async def autoscale(process: Process, *, namespace: str | None, name: str, stopped: kopf.DaemonStopped,
                    **_: Any) -> None:
    """The autoscaler's loop for one model (autoscale_loop.py); a changed decision is applied by a reconcile at once."""
    ns = namespace or ""

    def apply_decision() -> None:
        try:
            process.reconcile(ns, name, "autoscaler")
        except (kopf.TemporaryError, kopf.PermanentError) as exc:  # the resync timer catches up
            logging.getLogger(__name__).warning("reconcile of %s/%s after a decision failed: %s", ns, name, exc)

    model = autoscale_loop.ModelAutoscaler(process.cluster(), ns, name, registry=process.registry,
                                           settings=process.settings, handoff=process.handoff,
                                           after_decision=apply_decision)
    await autoscale_loop.run(model, stopped)


_OWNED = {names.LABEL_MANAGED_BY: names.OPERATOR_NAME, names.LABEL_NAME: names.APP_NAME}


def _owner_name(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or ():
        ours = ref.get("kind") == names.KIND and ref.get("apiVersion", "").startswith(f"{names.GROUP}/")
        if ours and ref.get("controller"):
            return str(ref["name"])
    return None


def on_child_event(process: Process, *, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    owner = _owner_name(body)
    if owner and namespace and type:  # no type: the initial listing, already covered by resume
        try:
            process.reconcile(namespace, owner, "child")
        except kopf.TemporaryError as exc:  # event handlers are not retried: the timer will catch up
            logging.getLogger(__name__).warning("reconcile of %s/%s after a child event failed: %s",
                                                namespace, owner, exc)


def on_class_event(process: Process, *, body: kopf.Body, type: str | None, **_: Any) -> None:
    """A RerankClass changed: reconcile now the models it concerns (class_index.py). An event handler writes nothing on
    the class (on.create/update/delete would keep kopf's state and a finalizer on it)."""
    for namespace, owner in class_index.class_event(type, body, process.registry.classes, process.registry.models):
        try:
            process.reconcile(namespace, owner, "class")
        except (kopf.TemporaryError, kopf.PermanentError) as exc:  # the model's own timer will catch up
            logging.getLogger(__name__).warning("reconcile of %s/%s after a class change failed: %s",
                                                namespace, owner, exc)


def probe(process: Process, **_: Any) -> int:
    """The liveness endpoint answers only while the operator's loop runs; reports models being reconciled."""
    return process.handoff.reconciling()
