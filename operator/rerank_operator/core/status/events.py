"""Kubernetes Events for transitions, computed from (previous status, new status, plan). Pure.

Events are derived from status changes, which are persisted, so a restarted operator does not repeat them; the
actions (a Job created or deleted) come from the plan and are posted once, when the write happened.
One event per fact: a publication is the ModelReady transition to ArtifactPublished (not also an action), and a
failure that changes several conditions with the same reason (ModelReady=False and Degraded=True, both
QualityGateFailed) is posted once. Events were half of the operator's writes in a 100-model rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rerank_contracts import quantize_job
from rerank_operator.core.reconcile.observed import ObjectRef, ref_of
from rerank_operator.core.status import conditions

EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


def _cond(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return conditions.find(status.get("conditions") or [], kind) or {}


def transitions(previous: Mapping[str, Any], new: Mapping[str, Any]) -> list[Event]:
    """One Event per owned condition whose status or reason changed (a first value only when it is a failure: a
    burst of new models would otherwise post five Events each before their first Job)."""
    events: list[Event] = []
    posted: set[str] = set()
    for kind in (conditions.MODEL_READY, conditions.POOLS_AVAILABLE, conditions.DEGRADED, conditions.CLASS_COMPLIANT,
                 *conditions.GATEWAY_OWNED, conditions.READY):
        before, after = _cond(previous, kind), _cond(new, kind)
        if not after or (before.get("status"), before.get("reason")) == (after.get("status"), after.get("reason")):
            continue
        if kind != conditions.READY and after.get("reason") in posted:
            continue  # the same fact, already posted through a more specific condition
        posted.add(str(after.get("reason")))
        bad = (after["status"] == "True") == (kind == conditions.DEGRADED)
        # Waiting (quantizing, rolling out, awaiting the artifact) is not a warning; failing is (a class violation,
        # a quota refusing pods, the hub not answering the Job).
        # A gateway that refused the route, or lacks a feature the model would use, is news (a route no gateway has
        # reported on yet is not: a cluster may have no controller for it).
        failing = (after["status"] == "False" if kind in conditions.GATEWAY_OWNED else bad and (
            kind in (conditions.DEGRADED, conditions.CLASS_COMPLIANT)
                           or after.get("reason") in ("QuotaExceeded", *quantize_job.TRANSIENT_FAILURES)
                           or _cond(new, conditions.DEGRADED).get("status") == "True"))
        if not before and not failing:
            continue  # a condition's first value is in the status; only a change, or a failure, is news
        if kind in conditions.GATEWAY_OWNED and not failing and before.get("status") != "False":
            continue  # a route accepted once its gateway reports on it is no news either; a recovery is
        reason = after["reason"] if kind != conditions.READY else ("Ready" if after["status"] == "True" else "NotReady")
        message = f"{kind}={after['status']}: {after['message']}"
        events.append(Event("Warning" if failing else "Normal", reason, message))
    return events


def actions(created: Sequence[Mapping[str, Any]], deleted: Sequence[ObjectRef],
            done: Sequence[ObjectRef]) -> list[Event]:
    """Events for a plan's creations (Jobs) and deletions that ``apply`` reports as done."""
    events: list[Event] = []
    for job in created:
        name = job["metadata"]["name"]
        if ref_of(job) in done:
            artifact_id = job["metadata"]["labels"].get("rerank.io/artifact", "")
            events.append(Event("Normal", "QuantizationStarted", f"created Job {name} to build artifact {artifact_id}"))
    for ref in deleted:
        if ref in done:
            events.append(Event("Normal", "Deleted", f"deleted {ref.kind} {ref.name}: no longer needed"))
    return events
