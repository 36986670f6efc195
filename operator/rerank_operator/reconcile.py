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
from typing import Any

import kopf

from . import classes, events, metrics, names
from . import plan as plans
from . import spec as specs
from . import status as statuses
from .access import ClusterAccess
from .apply import TransientApiError
from .conditions import READY, REASON_CLASS_NOT_FOUND, REASON_INVALID_SPEC
from .observed import ObjectRef, ref_of
from .settings import Settings

log = logging.getLogger(__name__)


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Result:
    writes: int  # write requests this reconcile made (0 for an idle one)
    ready: bool


def reconcile(cluster: ClusterAccess, namespace: str, name: str, trigger: str, *, registry: classes.Registry,
              settings: Settings, now: Callable[[], str] = utcnow) -> Result | None:
    """Converge one RerankModel; None when it is gone or being deleted (garbage collection does the rest).
    ``registry`` and ``settings`` are the process's, created once by handlers.py."""
    started = time.monotonic()
    before = metrics.total_writes()
    try:
        result = _reconcile(cluster, namespace, name, now, registry, settings)
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
        writes = int(metrics.total_writes() - before)
        log.debug("reconciled %s/%s (%s): %d writes", namespace, name, trigger, writes)
        return Result(writes, result)
    return None


def _reconcile(cluster: ClusterAccess, namespace: str, name: str, now: Callable[[], str], registry: classes.Registry,
               settings: Settings) -> bool | None:
    body = cluster.get_model(namespace, name)  # fresh: the watch's copy may predate our last status write
    if body is None or body["metadata"].get("deletionTimestamp"):
        metrics.forget_model(namespace, name)
        registry.models.forget(namespace, name)
        return None
    meta = body["metadata"]
    owner = names.Owner(name=name, namespace=namespace, uid=meta["uid"], generation=int(meta.get("generation", 1)))
    previous = body.get("status") or {}
    tenant = classes.for_model(body, cluster.list_classes, registry)  # the RerankClass, the effective spec
    if tenant.not_found is not None:  # apply nothing; a class created later re-triggers the model
        _refuse(cluster, owner, previous, tenant, statuses.Refusal(REASON_CLASS_NOT_FOUND, tenant.not_found), now())
        return False
    try:
        spec = specs.parse(tenant.effective)
    except specs.SpecError as exc:  # the CRD's validation should make this unreachable
        _refuse(cluster, owner, previous, tenant, statuses.Refusal(REASON_INVALID_SPEC, str(exc)), now())
        raise kopf.PermanentError(f"invalid spec: {exc}") from exc
    observed = cluster.observe(owner, spec)
    timestamp = now()
    plan = plans.compute(owner, spec, observed, previous, timestamp,
                         network_policy=classes.network_policy(body, tenant, settings))
    executed = cluster.execute(plan)
    for kind in {o["kind"] for o in plan.apply}:
        log.info("applied %s for %s/%s", kind, namespace, name)
    quota = classes.quota_block(observed, executed.refused)  # a ResourceQuota refusing a child: QuotaExceeded
    refused = tuple(str(r) for r in executed.other_refusals)
    new_status = statuses.compute(owner.generation, previous, timestamp, statuses.World(spec, observed, plan, refused),
                                  compliance=tenant.condition(), quota=quota)
    patch = statuses.merge_patch(previous, new_status)
    if patch:
        cluster.patch_status(owner, patch)
    for event in events.actions(plan, executed.done) + events.transitions(previous, new_status):
        cluster.post_event(owner, event)
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
    return ready


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


def _refuse(cluster: ClusterAccess, owner: names.Owner, previous: Mapping[str, Any], tenant: classes.Tenancy,
            refusal: statuses.Refusal, now: str) -> None:
    """Record why nothing was applied (children that already run are left alone) and post its transitions."""
    new_status = statuses.compute(owner.generation, previous, now, refusal, compliance=tenant.condition())
    patch = statuses.merge_patch(previous, new_status)
    if patch:
        cluster.patch_status(owner, patch)
    for event in events.transitions(previous, new_status):
        cluster.post_event(owner, event)
