"""The whole status, computed in one place, and the merge patch that turns the previous status into it.

``compute`` is the only builder of the reconcile loop's status, phase included. It takes everything the status
depends on: the outcome of the reconcile (the ``World`` it acted on, or the ``Refusal`` that stopped it before it
applied anything), the model's RerankClass verdict (ClassCompliant) and a ResourceQuota blocking a child. Each
condition is decided once, overrides included, before ``conditions.set_conditions`` merges it into the previous
status, so a condition's lastTransitionTime only moves when its status does.

The reconcile loop owns every status field except ``status.autoscaling`` and the autoscaler's conditions
(MetricsAvailable, TrafficEnforced), which are carried over untouched. The patch is empty when nothing changed, and
then no write happens.

``autoscaler_part`` is the other half, the only builder of the autoscaler's fields: the previous status with
``status.autoscaling`` and the autoscaler's conditions replaced, everything else carried over untouched.
``autoscaler_patch`` turns it into a merge patch, empty unless something material changed (not the signals or the
decision's time and reason alone, which move every tick).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rerank_operator.core import gateway
from rerank_operator.core.builders import deployment
from rerank_operator.core.reconcile.observed import Observed
from rerank_operator.core.reconcile.plan import Plan
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status import conditions, readiness
from rerank_operator.core.status.conditions import Condition
from rerank_operator.core.tenancy import QuotaBlock

AUTOSCALER_KEYS = ("autoscaling", "quality")  # and the conditions in conditions.AUTOSCALER_OWNED
OWNED_KEYS = ("observedGeneration", "phase", "model", "artifact", "pendingArtifact", "canary", "pools", "traffic",
              "conditions")


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


def _canary(plan: Plan) -> dict[str, Any] | None:
    """``status.canary``: the desired artifact's record while it is a canary, or after it was rolled back (so the
    plan neither depends on its Job nor tries it again until the spec changes)."""
    decision, pending = plan.artifact, plan.artifact.pending
    if decision.canary is None or pending is None or pending.state not in ("Canary", "RolledBack"):
        return None
    return {"artifact": dict(decision.canary), "state": "Running" if pending.state == "Canary" else "RolledBack",
            "since": decision.canary_since, "message": pending.message}


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
        return Condition(conditions.MODEL_READY, "True", conditions.REASON_QUANTIZATION_DISABLED,
                         f"quantization is disabled: serving {spec.model.display} as published")
    if pending is None and decision.served:
        return Condition(conditions.MODEL_READY, "True", conditions.REASON_ARTIFACT_PUBLISHED,
                         _describe(decision.served))
    assert pending is not None
    if pending.state in ("Canary", "RolledBack"):
        return Condition(conditions.MODEL_READY, "False", pending.reason, pending.message)
    still = f"; artifact {decision.served['id']} keeps serving" if decision.served else ""
    if pending.state == "Failed":
        return Condition(conditions.MODEL_READY, "False", pending.reason,
                         f"Job {pending.job} (attempt {pending.attempts}) failed: {pending.message}{still}")
    if pending.state == "Waiting":
        return Condition(conditions.MODEL_READY, "False", pending.reason,
                         f"Job {pending.job} (attempt {pending.attempts}) failed transiently: {pending.message}{still}")
    return Condition(conditions.MODEL_READY, "False", pending.reason,
                     f"Job {pending.job} (attempt {pending.attempts}) is building artifact {pending.id}: "
                     f"{pending.message}{still}")


def pools_available(spec: RerankModelSpec, observed: Observed, plan: Plan) -> Condition:
    if not plan.pools_deployed:
        return Condition(conditions.POOLS_AVAILABLE, "False", conditions.REASON_AWAITING_ARTIFACT,
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
        return Condition(conditions.POOLS_AVAILABLE, "False", conditions.REASON_NO_READY_REPLICAS, ", ".join(counts))
    return Condition(conditions.POOLS_AVAILABLE, "True", conditions.REASON_AVAILABLE, ", ".join(counts))


def degraded(facts: readiness.Facts) -> Condition:
    problems = [v for v in (readiness.children_applied(facts), readiness.storage_available(facts)) if v]
    pending = facts.plan.artifact.pending
    if pending is not None and pending.state == "Failed":
        problems.append(readiness.Verdict(pending.reason, f"quantization Job {pending.job} failed: {pending.message}"))
    if pending is not None and pending.state == "RolledBack":
        problems.append(readiness.Verdict(pending.reason, pending.message))
    for pool, live in sorted(facts.observed.deployments.items()):
        for cond in live.get("status", {}).get("conditions") or ():
            if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
                message = f"{pool} pool: {cond.get('message', '')}"
                problems.append(readiness.Verdict(conditions.REASON_ROLLOUT_STUCK, message))
    if problems:
        return Condition(conditions.DEGRADED, "True", problems[0].reason, "; ".join(p.message for p in problems))
    return Condition(conditions.DEGRADED, "False", conditions.REASON_AS_EXPECTED, "nothing is failing")


# What a reconcile acted on: the parsed spec, the children it observed, its plan, the writes it had refused (quota
# refusals excluded: they arrive as ``quota``). The readiness chain judges exactly these facts, so it is one type.
World = readiness.Facts



def not_acted_on(model: Mapping[str, Any]) -> bool:
    """Whether the operator has not reconciled this generation of the model yet (just applied, or its spec changed):
    someone is waiting on it, unlike on the status churn of its children."""
    meta, status = model.get("metadata") or {}, model.get("status") or {}
    return bool(status.get("observedGeneration") != meta.get("generation"))

@dataclass(frozen=True)
class Refusal:
    """Why a reconcile applied nothing: the model's RerankClass does not exist (ClassNotFound), or the spec cannot be
    acted on (InvalidSpec). Children that already run are left alone, so the rest of the status stays as it was."""

    reason: str
    message: str

    def phase(self, previous: Mapping[str, Any]) -> str:
        """Degraded while a missing class leaves running pools serving; Failed otherwise."""
        pools = (previous.get("pools") or {}).values()
        serving = any(int((p or {}).get("readyReplicas") or 0) > 0 for p in pools)
        return "Degraded" if serving and self.reason == conditions.REASON_CLASS_NOT_FOUND else "Failed"


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


def _quota_overrides(quota: QuotaBlock | None) -> list[Condition]:
    """A quota blocking a child: the condition of that child (PoolsAvailable for a pool's ReplicaSet or Deployment,
    ModelReady for the quantization Job or the claim) and Ready say QuotaExceeded with the quota's own message."""
    if quota is None:
        return []
    pool = quota.blocked.startswith(("ReplicaSet/", "Deployment/"))
    target = conditions.POOLS_AVAILABLE if pool else conditions.MODEL_READY
    return [Condition(target, "False", conditions.REASON_QUOTA_EXCEEDED, quota.message),
            Condition(conditions.READY, "False", conditions.REASON_QUOTA_EXCEEDED, quota.message)]


def gateway_conditions(spec: RerankModelSpec, observed: Observed, plan: Plan) -> list[Condition]:
    """RouteAccepted and GatewayFeatures for a model with routing.gateway (none without: ``_merged`` drops them).
    A parentRef without a namespace names the route's own (the model's)."""
    if spec.routing.gateway is None:
        return []
    namespace = str(((observed.route or {}).get("metadata") or {}).get("namespace") or "")
    verdict = gateway.route_verdict(observed.route, gateway.parent_refs(spec.routing.gateway.parent_refs, namespace))
    states: dict[str, conditions.Status] = {"accepted": "True", "refused": "False", "pending": "Unknown"}
    status = states[verdict.state]
    accepted = Condition(conditions.ROUTE_ACCEPTED, status, verdict.reason, verdict.message)
    if plan.gateway_notes:
        features = Condition(conditions.GATEWAY_FEATURES, "False", conditions.REASON_FEATURE_UNSUPPORTED,
                             "; ".join(plan.gateway_notes))
    else:
        features = Condition(conditions.GATEWAY_FEATURES, "True", conditions.REASON_FEATURES_SUPPORTED,
                             "the HTTPRoute uses only features its parent Gateways support (or Core ones)")
    return [accepted, features]


def _merged(previous: Mapping[str, Any], decided: list[Condition], compliance: Condition | None, *,
            generation: int, now: str, gateway_known: bool = False) -> list[dict[str, Any]]:
    """The previous conditions with the decided ones set; ClassCompliant goes when no RerankClass applies, the
    gateway's conditions when the model is known to have no gateway (``gateway_known``: a spec was read)."""
    gone = {conditions.CLASS_COMPLIANT} if compliance is None else set()
    if gateway_known and not any(c.type in conditions.GATEWAY_OWNED for c in decided):
        gone |= set(conditions.GATEWAY_OWNED)
    kept = [c for c in previous.get("conditions") or () if c.get("type") not in gone]
    final = decided + ([compliance] if compliance is not None else [])
    return conditions.set_conditions(kept, final, generation=generation, now=now)


def compute(
    generation: int,
    previous: Mapping[str, Any],
    now: str,
    outcome: World | Refusal,
    *,
    compliance: Condition | None = None,
    quota: QuotaBlock | None = None,
) -> dict[str, Any]:
    """The complete new status (previous autoscaler-owned fields included).

    ``compliance`` is the ClassCompliant condition (None: no RerankClass exists, so there is none); ``quota`` a
    ResourceQuota blocking a child of the world the reconcile acted on."""
    if isinstance(outcome, Refusal):
        refused = [Condition(conditions.READY, "False", outcome.reason, outcome.message),
                   Condition(conditions.DEGRADED, "True", outcome.reason, outcome.message)]
        return {**copy.deepcopy(dict(previous)), "observedGeneration": generation, "phase": outcome.phase(previous),
                "conditions": _merged(previous, refused, compliance, generation=generation, now=now)}
    spec, observed, plan, facts = outcome.spec, outcome.observed, outcome.plan, outcome
    ready, verdict = readiness.evaluate(facts)
    deg = degraded(facts)
    decided = {c.type: c for c in (
        Condition(conditions.READY, "True" if ready else "False", verdict.reason, verdict.message),
        model_ready(spec, plan),
        pools_available(spec, observed, plan),
        deg,
        *gateway_conditions(spec, observed, plan),
    )}
    decided.update({c.type: c for c in _quota_overrides(quota)})
    serving = any(observed.ready(p.name) > 0 for p in spec.enabled_pools)
    phase = _phase(ready, deg.status == "True", serving, plan)
    if quota is not None and phase == "Ready":
        phase = "Progressing"
    pending = plan.artifact.pending
    result = {k: copy.deepcopy(v) for k, v in previous.items() if k not in OWNED_KEYS}
    owned: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": phase,
        "model": spec.model.display,
        "artifact": dict(plan.artifact.served) if plan.artifact.desired_id and plan.artifact.served else None,
        "pendingArtifact": {
            "id": pending.id, "job": pending.job, "attempts": pending.attempts, "state": pending.state,
            "reason": pending.reason, "message": pending.message,
        } if pending else None,
        "canary": _canary(plan),
        "pools": _pools(spec, observed, plan),
        "traffic": _traffic(spec, plan),
        "conditions": _merged(previous, list(decided.values()), compliance, generation=generation, now=now,
                              gateway_known=True),
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


# -- the autoscaler's part --------------------------------------------------------------------------------------------

def autoscaler_part(previous: Mapping[str, Any], autoscaling: Mapping[str, Any] | None,
                    decided: Sequence[Condition], *, generation: int, now: str,
                    quality: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The complete new status with the autoscaler's fields set: ``status.autoscaling`` (None: autoscaling is off,
    so it goes), ``status.quality`` (None: the model has no quality guard) and the conditions it owns, exactly
    ``decided`` (an owned condition not in it goes); the reconcile loop's fields carried over untouched."""
    result = {k: copy.deepcopy(v) for k, v in previous.items() if k not in AUTOSCALER_KEYS}
    if autoscaling is not None:
        result["autoscaling"] = copy.deepcopy(dict(autoscaling))
    if quality is not None:
        result["quality"] = copy.deepcopy(dict(quality))
    elif (previous.get("quality") or {}).get("requantization"):
        # The guard went (its class turned it off, the spec is unreadable for a moment): the round the artifact is
        # planned from stays, or the model would fall back to the artifact that drifted (requantize.effective).
        result["quality"] = {"requantization": copy.deepcopy(previous["quality"]["requantization"])}
    current = {c.type for c in decided}
    kept = [dict(c) for c in previous.get("conditions") or ()
            if c.get("type") not in conditions.AUTOSCALER_OWNED or c.get("type") in current]
    result["conditions"] = conditions.set_conditions(kept, list(decided), generation=generation, now=now)
    if not result["conditions"] and "conditions" not in previous:
        del result["conditions"]
    return result


def autoscaler_patch(previous: Mapping[str, Any], autoscaling: Mapping[str, Any] | None,
                     decided: Sequence[Condition], *, generation: int, now: str,
                     quality: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Merge patch for the autoscaler's part of the status; empty when nothing material changed."""
    new = autoscaler_part(previous, autoscaling, decided, generation=generation, now=now, quality=quality)
    if _autoscaler_material(previous) == _autoscaler_material(new) and all(
            (key in new) == (previous.get(key) is not None) for key in AUTOSCALER_KEYS):
        return {}
    return merge_patch(previous, new)


def _autoscaler_material(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must differ for the autoscaler to write: not the signals, the time, the reason or a stale message."""
    auto = status.get("autoscaling") or {}
    last = auto.get("lastDecision") or {}
    conds = []
    for cond in status.get("conditions") or ():
        kind = cond.get("type")
        if kind in conditions.AUTOSCALER_OWNED:
            message = cond.get("message") if kind == conditions.TRAFFIC_ENFORCED else None
            conds.append((kind, cond.get("status"), cond.get("reason"), cond.get("observedGeneration"), message))
    quality = status.get("quality") or {}
    return (auto.get("fresh"),
            tuple(last.get(k) for k in ("gpuReplicas", "cpuReplicas", "gpuPercent", "cpuPercent", "held",
                                        "scaleToZero")),
            tuple(sorted(conds, key=lambda c: str(c[0]))),
            quality.get("guard"), tuple(quality.get("belowFloor") or ()),
            tuple((quality.get("canary") or {}).get(k) for k in ("id", "verdict")),
            (quality.get("requantization") or {}).get("count"))
