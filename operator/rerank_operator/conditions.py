"""Status conditions, the Kubernetes way (metav1.Condition), through one pure helper.

``lastTransitionTime`` changes only when ``status`` changes (a new reason or message is not a transition), and
every condition carries the generation it was computed for, so kstatus, ``helm --wait`` style tools and Argo CD can
tell a stale True from a current one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

Status = Literal["True", "False", "Unknown"]

READY = "Ready"
MODEL_READY = "ModelReady"
POOLS_AVAILABLE = "PoolsAvailable"
DEGRADED = "Degraded"
CLASS_COMPLIANT = "ClassCompliant"  # the model's RerankClass: Compliant | ClassViolation | ClassNotFound (classes.py)
#: Conditions this loop owns; others on the object (MetricsAvailable, TrafficEnforced) belong to the autoscaler.
OWNED = (READY, MODEL_READY, POOLS_AVAILABLE, DEGRADED, CLASS_COMPLIANT)


@dataclass(frozen=True)
class Condition:
    type: str
    status: Status
    reason: str
    message: str


def set_condition(
    existing: Sequence[Mapping[str, Any]], new: Condition, *, generation: int, now: str
) -> list[dict[str, Any]]:
    """Return ``existing`` with ``new`` set; keeps lastTransitionTime when the status did not change."""
    result: list[dict[str, Any]] = []
    found = False
    for cond in existing:
        if cond.get("type") != new.type:
            result.append(dict(cond))
            continue
        found = True
        unchanged = cond.get("status") == new.status and cond.get("lastTransitionTime")
        result.append(_render(new, generation, str(cond["lastTransitionTime"]) if unchanged else now))
    if not found:
        result.append(_render(new, generation, now))
    return result


def set_conditions(
    existing: Sequence[Mapping[str, Any]], new: Sequence[Condition], *, generation: int, now: str
) -> list[dict[str, Any]]:
    conditions = [dict(c) for c in existing]
    for cond in new:
        conditions = set_condition(conditions, cond, generation=generation, now=now)
    return conditions


def find(conditions: Sequence[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    for cond in conditions:
        if cond.get("type") == kind:
            return cond
    return None


def _render(cond: Condition, generation: int, transition: str) -> dict[str, Any]:
    return {
        "type": cond.type,
        "status": cond.status,
        "observedGeneration": generation,
        "lastTransitionTime": transition,
        "reason": cond.reason,
        "message": cond.message,
    }
