"""The whole status, computed in one place, and the merge patch that turns the previous status into it.

The reconcile loop owns every status field except ``status.autoscaling`` and the autoscaler's conditions
(MetricsAvailable, TrafficEnforced), which are carried over untouched. The patch is empty when nothing changed, and
then no write happens.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from . import conditions, deployment, readiness
from .conditions import Condition
from .observed import Observed
from .plan import Plan
from .spec import RerankModelSpec

OWNED_KEYS = ("observedGeneration", "phase", "model", "artifact", "pendingArtifact", "pools", "traffic", "conditions")


def _pools(spec: RerankModelSpec, observed: Observed, plan: Plan) -> dict[str, Any] | None:
    pools: dict[str, Any] = {}
    for pool in spec.enabled_pools:
        live = observed.deployments.get(pool.name) or {}
        st = live.get("status", {})
        desired = plan.replicas.get(pool.name)
        entry: dict[str, Any] = {
            "replicas": int(st.get("replicas") or 0),
            "readyReplicas": int(st.get("readyReplicas") or 0),
            "updatedReplicas": int(st.get("updatedReplicas") or 0),
            "desiredReplicas": int(desired if desired is not None else live.get("spec", {}).get("replicas") or 0),
        }
        served = deployment.served_artifact(live)
        if served:
            entry["artifact"] = served
        pools[pool.name] = entry
    return pools or None


def _traffic(spec: RerankModelSpec, plan: Plan) -> dict[str, Any]:
    t = plan.traffic
    single = len(t.receiving) == 1
    enforced = spec.routing.gateway is not None or single
    reason = t.reason if enforced else f"{t.reason}; without gateway.parentRefs the model Service balances by pod count"
    return {"gpuPercent": t.gpu_percent, "cpuPercent": t.cpu_percent, "enforced": enforced, "reason": reason}


def _describe(record: Mapping[str, Any]) -> str:
    quality = record.get("quality") or {}
    speed = record.get("speed") or {}
    figures = [f"{k}={v:g}" for k, v in sorted(quality.items())] + [f"{k}={v:g}" for k, v in sorted(speed.items())]
    return f"artifact {record.get('id')} published" + (f" ({', '.join(figures)})" if figures else "")


def model_ready(spec: RerankModelSpec, plan: Plan) -> Condition:
    decision = plan.artifact
    pending = decision.pending
    if decision.desired_id is None:
        return Condition(conditions.MODEL_READY, "True", "QuantizationDisabled",
                         f"quantization is disabled: serving {spec.model.display} as published")
    if pending is None and decision.served:
        return Condition(conditions.MODEL_READY, "True", "ArtifactPublished", _describe(decision.served))
    assert pending is not None
    still = f"; artifact {decision.served['id']} keeps serving" if decision.served else ""
    if pending.state == "Failed":
        return Condition(conditions.MODEL_READY, "False", pending.reason,
                         f"Job {pending.job} (attempt {pending.attempts}) failed: {pending.message}{still}")
    return Condition(conditions.MODEL_READY, "False", pending.reason,
                     f"Job {pending.job} (attempt {pending.attempts}) is building artifact {pending.id}: "
                     f"{pending.message}{still}")


def pools_available(spec: RerankModelSpec, observed: Observed, plan: Plan) -> Condition:
    if not plan.pools_deployed:
        return Condition(conditions.POOLS_AVAILABLE, "False", "AwaitingArtifact",
                         "the pools start once the first artifact is published")
    counts = []
    missing = []
    for pool in spec.enabled_pools:
        live = observed.deployments.get(pool.name) or {}
        wanted = live.get("spec", {}).get("replicas", plan.replicas.get(pool.name) or 0)
        ready = observed.ready(pool.name)
        counts.append(f"{pool.name} {ready}/{wanted} ready")
        if wanted > 0 and ready == 0:
            missing.append(pool.name)
    if missing:
        return Condition(conditions.POOLS_AVAILABLE, "False", "NoReadyReplicas", ", ".join(counts))
    return Condition(conditions.POOLS_AVAILABLE, "True", "Available", ", ".join(counts))


def degraded(facts: readiness.Facts) -> Condition:
    problems = [v for v in (readiness.children_applied(facts), readiness.storage_available(facts)) if v]
    pending = facts.plan.artifact.pending
    if pending is not None and pending.state == "Failed":
        problems.append(readiness.Verdict(pending.reason, f"quantization Job {pending.job} failed: {pending.message}"))
    for pool, live in sorted(facts.observed.deployments.items()):
        for cond in live.get("status", {}).get("conditions") or ():
            if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
                problems.append(readiness.Verdict("RolloutStuck", f"{pool} pool: {cond.get('message', '')}"))
    if problems:
        return Condition(conditions.DEGRADED, "True", problems[0].reason, "; ".join(p.message for p in problems))
    return Condition(conditions.DEGRADED, "False", "AsExpected", "nothing is failing")


def _phase(ready: bool, is_degraded: bool, serving: bool, plan: Plan) -> str:
    if ready:
        return "Ready"
    if is_degraded:
        return "Degraded" if serving else "Failed"
    if serving:
        return "Progressing"
    if plan.artifact.pending is not None and not plan.artifact.served:
        return "Quantizing"
    return "Pending"


def compute(
    generation: int,
    spec: RerankModelSpec,
    observed: Observed,
    plan: Plan,
    previous: Mapping[str, Any],
    now: str,
    apply_errors: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The complete new status (previous autoscaler-owned fields included)."""
    facts = readiness.Facts(spec, observed, plan, apply_errors)
    ready, verdict = readiness.evaluate(facts)
    deg = degraded(facts)
    new_conditions = [
        Condition(conditions.READY, "True" if ready else "False", verdict.reason, verdict.message),
        model_ready(spec, plan),
        pools_available(spec, observed, plan),
        deg,
    ]
    serving = any(observed.ready(p.name) > 0 for p in spec.enabled_pools)
    pending = plan.artifact.pending
    result = {k: copy.deepcopy(v) for k, v in previous.items() if k not in OWNED_KEYS}
    owned: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": _phase(ready, deg.status == "True", serving, plan),
        "model": spec.model.display,
        "artifact": dict(plan.artifact.served) if plan.artifact.desired_id and plan.artifact.served else None,
        "pendingArtifact": {
            "id": pending.id, "job": pending.job, "attempts": pending.attempts, "state": pending.state,
            "reason": pending.reason, "message": pending.message,
        } if pending else None,
        "pools": _pools(spec, observed, plan),
        "traffic": _traffic(spec, plan),
        "conditions": conditions.set_conditions(previous.get("conditions") or [], new_conditions,
                                                generation=generation, now=now),
    }
    result.update({k: v for k, v in owned.items() if v is not None})
    return result


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch turning ``old`` into ``new`` (lists are replaced whole); empty when they are equal."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = copy.deepcopy(value)
    return patch
