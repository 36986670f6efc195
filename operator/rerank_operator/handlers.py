"""kopf wiring. Every handler lands in the same idempotent reconcile; none carries logic of its own.

Triggers: create/update/resume of a RerankModel, a resync timer (drift, and Jobs whose pods are stuck without the
Job changing), and events of the Jobs and Deployments it owns (a Job finishing, a pool becoming ready).
Reconciles of one model never overlap: a trigger arriving while one runs makes it run once more instead
(coalescing), so a burst of Deployment status events costs at most two reconciles.

kopf's own bookkeeping is kept under the ``rerank.io`` prefix in annotations (the status schema is strict, so
kopf's default ``status.kopf`` would be pruned anyway). The timer makes kopf add a finalizer: deleting a
RerankModel needs the operator running, as for any kopf operator with timers.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import kopf

from . import autoscaler, classes, names
from .apply import Cluster
from .reconcile import Result, reconcile
from .settings import Settings

RESYNC_SECONDS = float(os.environ.get("RERANK_RESYNC_SECONDS", "30"))
WATCH_TIMEOUT = os.environ.get("RERANK_WATCH_SERVER_TIMEOUT")
USER_AGENT = f"{names.OPERATOR_NAME}/0.1.0"

#: The process's class registry and settings: created here, once, and passed to every reconcile and autoscaler.
REGISTRY = classes.Registry()
SETTINGS = Settings.from_env(os.environ)

_cluster: Cluster | None = None
_guard = threading.Lock()
_running: dict[tuple[str, str], bool] = {}  # key -> run again after the current reconcile


def cluster() -> Cluster:
    global _cluster
    with _guard:
        if _cluster is None:
            _cluster = Cluster.from_environment(USER_AGENT)
        return _cluster


def _coalesced(key: tuple[str, str], run: Callable[[], Result | None]) -> Result | None:
    with _guard:
        if key in _running:
            _running[key] = True
            return None
        _running[key] = False
    try:
        while True:
            result = run()
            with _guard:
                if not _running[key]:
                    return result
                _running[key] = False
    finally:
        with _guard:
            _running.pop(key, None)


def _reconcile(namespace: str, name: str, trigger: str) -> Result | None:
    def run() -> Result | None:
        with autoscaler.model_lock(namespace, name):  # status writes never interleave with the autoscaler's
            return reconcile(cluster(), namespace, name, trigger, registry=REGISTRY, settings=SETTINGS)
    return _coalesced((namespace, name), run)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = f"{names.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=names.GROUP)
    # Only the spec drives children: labels and annotations (an autoscaler's memory, a user's notes) must neither
    # trigger an update nor make kopf rewrite its diff base.
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=names.GROUP, key="last-handled-configuration", ignored_fields=["metadata"])
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 8
    if WATCH_TIMEOUT:
        settings.watching.server_timeout = int(WATCH_TIMEOUT)
        settings.watching.client_timeout = int(WATCH_TIMEOUT) + 5
    cluster()


@kopf.on.resume(names.GROUP, names.VERSION, names.PLURAL)
@kopf.on.create(names.GROUP, names.VERSION, names.PLURAL)
@kopf.on.update(names.GROUP, names.VERSION, names.PLURAL)
def on_change(*, namespace: str | None, name: str, reason: str, **_: Any) -> None:
    _reconcile(namespace or "", name, str(reason))


@kopf.timer(names.GROUP, names.VERSION, names.PLURAL, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
def resync(*, namespace: str | None, name: str, **_: Any) -> None:
    _reconcile(namespace or "", name, "timer")


@kopf.daemon(names.GROUP, names.VERSION, names.PLURAL, id="autoscaler", cancellation_backoff=1.0,
             cancellation_timeout=10.0)
async def autoscale(*, namespace: str | None, name: str, stopped: kopf.DaemonStopped, **_: Any) -> None:
    """The autoscaler's loop for one model (autoscaler.py); a changed decision is applied by a reconcile at once."""
    ns = namespace or ""

    def apply_decision() -> None:
        try:
            _reconcile(ns, name, "autoscaler")
        except (kopf.TemporaryError, kopf.PermanentError) as exc:  # the resync timer catches up
            logging.getLogger(__name__).warning("reconcile of %s/%s after a decision failed: %s", ns, name, exc)

    model = autoscaler.ModelAutoscaler(cluster(), ns, name, registry=REGISTRY, settings=SETTINGS,
                                       after_decision=apply_decision)
    await autoscaler.run(model, stopped)


_OWNED = {names.LABEL_MANAGED_BY: names.OPERATOR_NAME, names.LABEL_NAME: names.APP_NAME}


def _owner_name(body: kopf.Body) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or ():
        ours = ref.get("kind") == names.KIND and ref.get("apiVersion", "").startswith(f"{names.GROUP}/")
        if ours and ref.get("controller"):
            return str(ref["name"])
    return None


@kopf.on.event("batch", "v1", "jobs", labels=_OWNED)
@kopf.on.event("apps", "v1", "deployments", labels=_OWNED)
def on_child_event(*, body: kopf.Body, namespace: str | None, type: str, **_: Any) -> None:
    owner = _owner_name(body)
    if owner and namespace and type:  # no type: the initial listing, already covered by resume
        try:
            _reconcile(namespace, owner, "child")
        except kopf.TemporaryError as exc:  # event handlers are not retried: the timer will catch up
            logging.getLogger(__name__).warning("reconcile of %s/%s after a child event failed: %s",
                                                namespace, owner, exc)


@kopf.on.event(names.GROUP, names.VERSION, "rerankclasses")
def on_class_event(*, body: kopf.Body, type: str | None, **_: Any) -> None:
    """A RerankClass changed: reconcile now the models it concerns (classes.py). An event handler writes nothing on
    the class (on.create/update/delete would keep kopf's state and a finalizer on it)."""
    for namespace, owner in classes.class_event(type, body, REGISTRY.classes, REGISTRY.models):
        try:
            _reconcile(namespace, owner, "class")
        except (kopf.TemporaryError, kopf.PermanentError) as exc:  # the model's own timer will catch up
            logging.getLogger(__name__).warning("reconcile of %s/%s after a class change failed: %s",
                                                namespace, owner, exc)


@kopf.on.probe(id="reconciling")
def probe(**_: Any) -> int:
    """The liveness endpoint answers only while the operator's loop runs; reports models being reconciled."""
    with _guard:
        return len(_running)
