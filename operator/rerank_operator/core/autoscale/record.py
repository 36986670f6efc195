"""What the autoscaler records on a RerankModel: ``status.autoscaling.lastDecision``, its two conditions
(MetricsAvailable, TrafficEnforced), the events of a change, the split in effect and the policy's saved memory.
Pure: the per-model tick (controllers/model_autoscaler.py) reads the model and its pools, lets the policy decide, and
writes what these functions build (``status.autoscaler_patch`` merges it into the status).

A write depends only on the record's material part (``material``): the raw signals, which move every tick, and the
decision's reason and time are recorded with a material change, never alone, so a model under steady load costs no
write at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.autoscale import config, history, policy, split
from rerank_operator.core.autoscale.recorded import RecordedDecision
from rerank_operator.core.reconcile.observed import PoolsView
from rerank_operator.core.spec.model import Routing
from rerank_operator.core.status import conditions, events
from rerank_operator.core.status.conditions import Condition

HISTORY_ANNOTATION = f"autoscaler.{names.GROUP}/history"  # outside kopf's own rerank.io/ keys
MAX_REASON = 1024  # a reason or message longer than this is cut (a status and an Event stay small)


def current_cpu_percent(route: Mapping[str, Any] | None, model: str, status: Mapping[str, Any]) -> int:
    """The split in effect: the HTTPRoute's CPU weight share, else the last one the reconcile loop recorded."""
    if route:
        weights: dict[str, int] = {}
        for rule in route.get("spec", {}).get("rules") or ():
            for ref in rule.get("backendRefs") or ():
                weights[str(ref.get("name"))] = int(ref.get("weight", 1))
        gpu = weights.get(names.pool_service_name(model, "gpu"), 0)
        cpu = weights.get(names.pool_service_name(model, "cpu"), 0)
        if gpu + cpu > 0:
            return round(100 * cpu / (gpu + cpu))
    value = (status.get("traffic") or {}).get("cpuPercent")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else 0


def metrics_available(auto: config.AutoscalingSpec, decision: policy.Decision) -> Condition:
    if decision.held:
        return Condition(conditions.METRICS_AVAILABLE, "False", conditions.REASON_METRICS_STALE,
                         decision.reason[:MAX_REASON])
    return Condition(conditions.METRICS_AVAILABLE, "True", conditions.REASON_METRICS_FRESH,
                     f"{auto.source} metrics are fresh for every pool with ready replicas")


def traffic_enforced(auto: config.AutoscalingSpec, routing: Routing, view: PoolsView, model: str,
                     decision: policy.Decision) -> Condition:
    """Whether the split the decision asks for reaches the requests: only an HTTPRoute carries weights."""
    enforced = conditions.TRAFFIC_ENFORCED
    shares = f"gpu {decision.gpu_percent}% / cpu {decision.cpu_percent}%"
    policy_name = split.effective_policy(auto)
    if policy_name in ("cpu-only", "gpu-only"):
        return Condition(enforced, "True", conditions.REASON_SINGLE_POOL,
                         f"one pool takes all traffic ({policy_name}): there is no split to enforce")
    if routing.gateway is None or not routing.gateway.parent_refs:
        return Condition(enforced, "False", conditions.REASON_NO_GATEWAY,
                         f"no routing.gateway.parentRefs: the split ({shares}) cannot be enforced; the model Service "
                         f"spreads requests over the pods of the pools that receive traffic; replicas are still scaled")
    if not view.route_api_available:
        return Condition(enforced, "False", conditions.REASON_GATEWAY_API_MISSING,
                         f"routing.gateway is set but the Gateway API (HTTPRoute) is not installed: the split "
                         f"({shares}) cannot be enforced; replicas are still scaled")
    if view.route is None:
        return Condition(enforced, "False", conditions.REASON_ROUTE_PENDING,
                         f"HTTPRoute {names.route_name(model)} does not exist yet")
    if decision.to_activator:
        return Condition(enforced, "True", conditions.REASON_HTTP_ROUTE,
                         f"HTTPRoute {names.route_name(model)} sends every request to the activator (scale to zero: "
                         f"{decision.zero})")
    return Condition(enforced, "True", conditions.REASON_HTTP_ROUTE,
                     f"HTTPRoute {names.route_name(model)} carries the split as backend weights ({shares})")


def decision_status(auto: config.AutoscalingSpec, decision: policy.Decision, now_iso: str) -> dict[str, Any]:
    """``status.autoscaling.lastDecision``: what the reconcile loop applies (replicas only when it manages them)."""
    managed = auto.replica_management == "operator"
    replicas = {pool: decision.replicas(pool) for pool in config.POOLS if managed and auto.bounds(pool).enabled}
    return RecordedDecision(time=now_iso, reason=decision.reason[:MAX_REASON], held=decision.held,
                            gpu_percent=decision.gpu_percent, cpu_percent=decision.cpu_percent, replicas=replicas,
                            scale_to_zero=decision.zero).to_status()


def changes(decision: policy.Decision, recorded: Mapping[str, Any]) -> list[events.Event]:
    """Events for a decision that is being recorded: the policy's (against what is in effect), plus a shift the
    reconcile loop already made on its own (no ready replica in a pool) that the autoscaler now takes over."""
    found = [events.Event("Normal", e.reason, e.message[:MAX_REASON]) for e in decision.events]
    before = RecordedDecision.from_record(recorded).cpu_percent
    if (not any(e.reason == "TrafficShifted" for e in found) and before is not None
            and before != decision.cpu_percent):
        found.append(events.Event("Normal", "TrafficShifted",
                                  f"gpu/cpu {100 - before}/{before} -> {decision.gpu_percent}/{decision.cpu_percent}: "
                                  f"{decision.reason}"[:MAX_REASON]))
    return found


def material(record: Mapping[str, Any] | None) -> str:
    """The part of an autoscaler record a write depends on: all but the signals and the decision's time and reason."""
    if record is None:
        return "none"
    decision = {k: v for k, v in (record.get("lastDecision") or {}).items() if k not in ("time", "reason")}
    return json.dumps({"fresh": record.get("fresh"), "lastDecision": decision}, sort_keys=True)


def saved_history(meta: Mapping[str, Any]) -> history.History:
    """The policy's memory as a previous leader saved it on the model (cooldowns survive a restart); a missing or
    unreadable annotation is a fresh memory, never an error."""
    raw = (meta.get("annotations") or {}).get(HISTORY_ANNOTATION)
    try:
        return history.History.from_dict(json.loads(raw)) if raw else history.History()
    except ValueError:
        return history.History()


def history_annotation(memory: history.History) -> dict[str, str]:
    return {HISTORY_ANNOTATION: json.dumps(memory.to_dict(), separators=(",", ":"))}
