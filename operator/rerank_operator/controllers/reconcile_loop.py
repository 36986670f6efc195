"""One idempotent reconcile of one RerankModel: observe, plan, apply, write status once, post events.

It is the imperative shell around the pure core (spec -> plan -> status): every decision is made by those pure
functions; this module only sequences the I/O and turns failures into kopf's error model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import kopf

from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.cluster import ClusterAccess, TransientApiError
from rerank_operator.controllers import class_index
from rerank_operator.core import names, platform
from rerank_operator.core.artifacts import job_outcome, sharing
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.reconcile.observed import ObjectRef, ref_of
from rerank_operator.core.reconcile.writes import Executed
from rerank_operator.core.settings import Settings
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import events
from rerank_operator.core.status.conditions import READY, REASON_CLASS_NOT_FOUND, REASON_INVALID_SPEC
from rerank_operator.core.tenancy import tenant

log = logging.getLogger(__name__)
JOB_WAIT_RECHECK_SECONDS = 10.0


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Result:
    """What one reconcile did: its own write requests (applies, creates, scales, deletes, the status patch and
    Events; 0 for an idle one), counted here rather than from the process-wide counter other workers also move."""

    writes: int
    ready: bool
    requeue_after: float | None = None  # look again this soon even without an event (a state only time changes)
    status_deferred: bool = False  # the status was not written yet: reconcile again soon, as background work
    spec_changed: bool = False  # the model as last seen has a newer spec than this reconcile acted on: again, now
    waits_on: str | None = None  # the shared artifact whose Job the model waits for (its events queue the model)


def reconcile(cluster: ClusterAccess, namespace: str, name: str, trigger: str, *, registry: class_index.Registry,
              settings: Settings, now: Callable[[], str] = utcnow,
              others_waiting: Callable[[], bool] = lambda: False,
              shared: SharedLookup | None = None) -> Result | None:
    """Converge one RerankModel; None when it is gone or being deleted (garbage collection does the rest).
    ``registry`` and ``settings`` are the process's, created once by handlers.py. ``others_waiting``: whether other
    new models wait for a worker or are being reconciled now (a burst of applies; see ``status_can_wait``).
    ``shared``: what the artifact stores hold (adapters/artifact_store.py); None: models never share."""
    started = time.monotonic()
    try:
        result = _reconcile(cluster, namespace, name, now, registry, settings, others_waiting, shared)
    except TransientApiError as exc:
        metrics.RECONCILES.labels(trigger, "error").inc()
        metrics.ERRORS.labels("transient").inc()
        raise kopf.TemporaryError(str(exc), delay=10) from exc
    except kopf.PermanentError:
        metrics.RECONCILES.labels(trigger, "error").inc()
        metrics.ERRORS.labels("permanent").inc()
        raise
    finally:
        metrics.DURATION.observe(time.monotonic() - started)
    metrics.RECONCILES.labels(trigger, "success").inc()
    if result is not None:
        log.debug("reconciled %s/%s (%s): %d writes", namespace, name, trigger, result.writes)
    return result


def status_can_wait(body: Mapping[str, Any], plan: plans.Plan, executed: Executed, others_waiting: bool) -> bool:
    """Whether this reconcile may leave the status to a later one: it started the Job of a spec nobody had acted on,
    every write went through, and other new models wait for a worker or are being reconciled (a burst).

    In a burst of applies the API server is the bottleneck, and a RerankModel's status patch is the dearest write
    of a new model (schema and CEL validation of the whole object: ~10 ms of API-server CPU on the dev cluster, vs
    ~9 ms for its Job and ~5 ms for its claim; benchmarks/fleet/). Writing it after the burst's Jobs lets every
    Job start sooner; the status follows within seconds, from a background reconcile of the same model (its Job is
    in the caches by then, so that reconcile writes only the status; often once instead of twice, as its pod has
    started meanwhile). Outside a burst nothing changes."""
    started_job = any(ref_of(job) in executed.done for job in plan.create)
    return statuses.not_acted_on(body) and started_job and not executed.refused and others_waiting


def _reconcile(cluster: ClusterAccess, namespace: str, name: str, now: Callable[[], str],
               registry: class_index.Registry, settings: Settings,
               others_waiting: Callable[[], bool], shared: SharedLookup | None) -> Result | None:
    body = cluster.get_model(namespace, name)  # fresh: the watch's copy may predate our last status write
    finalizers = list((body or {}).get("metadata", {}).get("finalizers") or ())
    if names.LEGACY_FINALIZER in finalizers:  # an older version's: nothing needs it, and it would block deletion
        cluster.remove_finalizer(namespace, name, names.LEGACY_FINALIZER, finalizers.index(names.LEGACY_FINALIZER))
    if body is None or body["metadata"].get("deletionTimestamp"):
        metrics.forget_model(namespace, name)
        registry.forget(namespace, name)
        return None
    meta = body["metadata"]
    owner = names.Owner(name=name, namespace=namespace, uid=meta["uid"], generation=int(meta.get("generation", 1)))
    previous = body.get("status") or {}
    understood = class_index.for_model(body, cluster.list_classes, registry, settings.quantizer_image)
    tenancy = understood.tenancy
    metrics.record_class(namespace, name, tenancy.class_name or "")
    if tenancy.not_found is not None:  # apply nothing; a class created later re-triggers the model
        writes = _refuse(cluster, owner, previous, tenancy,
                         statuses.Refusal(REASON_CLASS_NOT_FOUND, tenancy.not_found), now())
        return Result(writes, ready=False)
    if understood.spec is None:  # the CRD's validation should make this unreachable
        _refuse(cluster, owner, previous, tenancy, statuses.Refusal(REASON_INVALID_SPEC, str(understood.error)), now())
        raise kopf.PermanentError(f"invalid spec: {understood.error}")
    spec = understood.spec
    observed = cluster.observe(owner, spec)
    timestamp = now()
    class_spec = tenancy.rclass.get("spec") if tenancy.rclass is not None else None
    store = platform.ArtifactStore.from_class(class_spec) if shared is not None else None
    plan = plans.compute(owner, spec, observed, previous, timestamp,
                         network_policy=tenant.network_policy(body, tenancy, settings, spec),
                         guard_settings=platform.GuardSettings.from_class(class_spec), backoff=settings.hub_retry,
                         pull_secrets=settings.image_pull_secrets, activator=settings.activator,
                         store=store, shared=_look_up(shared, spec, store, previous),
                         fetcher_image=settings.fetcher_image or "")
    executed = cluster.execute(plan)
    for kind in {o["kind"] for o in plan.apply}:
        log.info("applied %s for %s/%s", kind, namespace, name)
    if status_can_wait(body, plan, executed, others_waiting()):
        started = events.actions(plan.create, plan.delete, executed.done)
        for event in started:
            cluster.post_event(owner, event)
        _count_jobs(plan, executed.done, previous, previous)
        return Result(len(executed.done) + len(started), ready=False, status_deferred=True,
                      spec_changed=_spec_changed(cluster, owner))
    quota = tenant.quota_block(observed, executed.refused)  # a ResourceQuota refusing a child: QuotaExceeded
    refused = tuple(str(r) for r in executed.other_refusals)
    new_status = statuses.compute(owner.generation, previous, timestamp, statuses.World(spec, observed, plan, refused),
                                  compliance=tenancy.condition(), quota=quota)
    written = _write_status(cluster, owner, previous, new_status, events.actions(plan.create, plan.delete,
                                                                                 executed.done))
    writes = len(executed.done) + len(executed.refused) + written
    _count_jobs(plan, executed.done, previous, new_status)
    pools = new_status.get("pools") or {}
    metrics.record_model(
        namespace, name,
        traffic={p.name: plan.traffic.gpu_percent if p.name == "gpu" else plan.traffic.cpu_percent
                 for p in spec.enabled_pools},
        replicas={p: int(v.get("desiredReplicas", 0)) for p, v in pools.items()},
    )
    ready = any(c.get("type") == READY and c.get("status") == "True" for c in new_status.get("conditions", ()))
    if executed.quota_refusals:  # a write of ours (the claim): retried with backoff until the quota allows it
        raise TransientApiError(f"{quota.message if quota else 'refused by a ResourceQuota'}")
    # A Job without pods changes nothing we watch while a quota refuses them (their FailedCreate Events are read,
    # not watched): look again soon.
    waiting = any(job_outcome.waiting_for_pods(j) for j in observed.jobs)
    recheck = [t for t in (JOB_WAIT_RECHECK_SECONDS if waiting else None, plan.artifact.recheck_after) if t is not None]
    pending = plan.artifact.pending
    shared_pending = pending is not None and pending.state != "Failed" and sharing.store_for(spec, store) is not None
    waits_on = pending.id if shared_pending and pending is not None else None
    return Result(writes, ready, requeue_after=max(1.0, min(recheck)) if recheck else None,
                  spec_changed=_spec_changed(cluster, owner), waits_on=waits_on)


class SharedLookup(Protocol):
    def view(self, where: platform.ArtifactStore, artifact_id: str) -> sharing.SharedView: ...


def _look_up(shared: SharedLookup | None, spec: RerankModelSpec, store: platform.ArtifactStore | None,
             previous: Mapping[str, Any]) -> sharing.SharedView | None:
    """What the store holds of the model's shared id; no request when the model already serves it (at rest)."""
    where = sharing.store_for(spec, store)
    if shared is None or where is None:
        return None
    wanted = sharing.shared_id(spec, where)
    if (previous.get("artifact") or {}).get("id") == wanted:
        return None
    return shared.view(where, wanted)


def _spec_changed(cluster: ClusterAccess, owner: names.Owner) -> bool:
    """Whether the model as last seen has a newer generation than ``owner``'s. Our status patch's answer is stored as
    soon as it comes, and the watch's copies older than it are then dropped as stale, so a spec change the user made
    while this reconcile ran may reach the caches only inside that answer: nothing else would queue it."""
    latest = cluster.get_model(owner.namespace, owner.name)
    return latest is not None and int((latest.get("metadata") or {}).get("generation", 1)) > owner.generation


def _count_jobs(plan: plans.Plan, done: Sequence[ObjectRef], previous: Mapping[str, Any],
                new: Mapping[str, Any]) -> None:
    for job in plan.create:
        if ref_of(job) in done:
            metrics.JOBS.labels("created", "").inc()
    if plan.artifact.published:
        metrics.JOBS.labels("succeeded", "Published").inc()
    old_pending, new_pending = previous.get("pendingArtifact") or {}, new.get("pendingArtifact") or {}
    already_failed = (old_pending.get("state"), old_pending.get("job")) == ("Failed", new_pending.get("job"))
    if new_pending.get("state") == "Failed" and not already_failed:
        metrics.JOBS.labels("failed", str(new_pending.get("reason", ""))).inc()


def _refuse(cluster: ClusterAccess, owner: names.Owner, previous: Mapping[str, Any], tenancy: tenant.Tenancy,
            refusal: statuses.Refusal, now: str) -> int:
    """Record why nothing was applied (children that already run are left alone) and post its transitions; returns
    the writes made."""
    new_status = statuses.compute(owner.generation, previous, now, refusal, compliance=tenancy.condition())
    return _write_status(cluster, owner, previous, new_status)


def _write_status(cluster: ClusterAccess, owner: names.Owner, previous: Mapping[str, Any],
                  new_status: Mapping[str, Any], actions: Sequence[events.Event] = ()) -> int:
    """Patch the status if it changed, then post ``actions`` and the status's transitions; returns the writes."""
    patch = statuses.merge_patch(previous, new_status)
    if patch:
        cluster.patch_status(owner, patch)
    metrics.record_conditions(owner.namespace, owner.name, new_status.get("conditions") or ())
    posted = [*actions, *events.transitions(previous, new_status)]
    for event in posted:
        cluster.post_event(owner, event)
    return bool(patch) + len(posted)
