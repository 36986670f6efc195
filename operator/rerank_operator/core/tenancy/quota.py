"""The "exceeded quota" failures of ReplicaSets, Jobs and claims, turned into one reason and message. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rerank_operator.core.artifacts import job_outcome
from rerank_operator.core.status import conditions

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class QuotaBlock:
    """Creation of pods or claims refused by a ResourceQuota: what was blocked and the quota's own message."""

    reason: str
    message: str
    blocked: str  # e.g. "ReplicaSet/m-cpu-5d8f", "Job/m-q-1a2b3c4d-1", "PersistentVolumeClaim/m-models"


_QUOTA_MARKERS = ("exceeded quota", "failed quota")


def is_quota_message(message: str | None) -> bool:
    return bool(message) and any(m in str(message) for m in _QUOTA_MARKERS)


def quota_blocked(
    *,
    replica_sets: Iterable[Obj] = (),
    jobs: Iterable[Obj] = (),
    events: Iterable[Obj] = (),
    api_errors: Mapping[str, str] | None = None,
) -> QuotaBlock | None:
    """The first quota failure among a model's children, or None.

    - ReplicaSets: condition ReplicaFailure=True with reason FailedCreate (cleared by the controller on success).
    - Jobs: their FailedCreate events, counted only while the Job is unfinished and has no active pod.
    - Claims and other objects the operator creates itself: ``api_errors`` maps "Kind/name" to the message of the
      403 the API server answered.
    """
    for rs in replica_sets:
        for cond in (rs.get("status") or {}).get("conditions") or ():
            failing = cond.get("type") == "ReplicaFailure" and cond.get("status") == "True"
            if failing and is_quota_message(cond.get("message")):
                return _block(f"ReplicaSet/{rs['metadata']['name']}", cond["message"])
    stuck = {j["metadata"]["name"] for j in jobs if job_outcome.waiting_for_pods(j)}
    for event in sorted(events, key=_event_time, reverse=True):
        involved = event.get("involvedObject") or {}
        if (involved.get("kind") == "Job" and involved.get("name") in stuck
                and event.get("reason") == "FailedCreate" and is_quota_message(event.get("message"))):
            return _block(f"Job/{involved['name']}", event["message"])
    for blocked, message in (api_errors or {}).items():
        if is_quota_message(message):
            return _block(blocked, message)
    return None


def _block(blocked: str, message: str) -> QuotaBlock:
    quota = message.split("forbidden: ", 1)[-1].strip()  # "exceeded quota: q, requested: ..., used: ..., limited: ..."
    return QuotaBlock(reason=conditions.REASON_QUOTA_EXCEEDED, message=f"{blocked}: {quota}", blocked=blocked)


def _event_time(event: Obj) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")
