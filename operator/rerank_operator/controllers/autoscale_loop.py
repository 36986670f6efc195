"""The autoscaler's imperative shell: one loop per RerankModel, every ``spec.autoscaling.intervalSeconds``.

Each tick: read the model and its pools (Deployments, ready pods, HTTPRoute), collect the signals (direct scrape
or PromQL), let the pure policy (``core/autoscale/policy.decide``) decide, and record the decision in
``status.autoscaling`` with the autoscaler's two conditions, MetricsAvailable and TrafficEnforced. It never writes a
Deployment or an HTTPRoute: the reconcile loop applies ``status.autoscaling.lastDecision`` (replicas through the
Deployments' scale subresource, weights on the HTTPRoute), and is asked to run right after a decision changed.

Writes happen only when the decision changes (replicas, split, held or not) or a condition changes status or
reason: the raw signals (which move every tick) and the decision's reason and time are recorded with such a
change, never alone, so a model under steady load costs no write at all. The policy's memory (history) lives in
this process and is saved to an annotation when a pool was scaled or traffic shifted, so a restarted operator
keeps its cooldowns. The status it writes is built by ``status.autoscaler_part`` (the autoscaler's half of the status
pipeline; ``status.compute`` builds the reconcile loop's and carries this part over). Status writes are serialized
with the reconcile loop's (``handoff.Handoff.status_lock``): both replace the conditions list, so neither may write
between the other's read and write.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters import prometheus_api, tei_scrape
from rerank_operator.adapters.cluster import ClusterAccess, TransientApiError
from rerank_operator.controllers import class_index
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.core import conditions, events, names
from rerank_operator.core import spec as specs
from rerank_operator.core import status as statuses
from rerank_operator.core.autoscale import config, endpoints, history, policy, split
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.conditions import Condition
from rerank_operator.core.observed import PoolsView
from rerank_operator.core.settings import Settings
from rerank_operator.core.tenancy import tenant

log = logging.getLogger(__name__)

METRICS_AVAILABLE = conditions.METRICS_AVAILABLE
TRAFFIC_ENFORCED = conditions.TRAFFIC_ENFORCED
OWNED_CONDITIONS = conditions.AUTOSCALER_OWNED
HISTORY_ANNOTATION = f"autoscaler.{names.GROUP}/history"  # outside kopf's own rerank.io/ keys
IDLE_POLL_SECONDS = 15.0  # how often a model with autoscaling off (or not deployed yet) is looked at again
MAX_REASON = 1024

def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- pure helpers -----------------------------------------------------------------------------------------------------

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
        return Condition(METRICS_AVAILABLE, "False", conditions.REASON_METRICS_STALE, decision.reason[:MAX_REASON])
    return Condition(METRICS_AVAILABLE, "True", conditions.REASON_METRICS_FRESH,
                     f"{auto.source} metrics are fresh for every pool with ready replicas")


def traffic_enforced(auto: config.AutoscalingSpec, spec: Mapping[str, Any], view: PoolsView, model: str,
                     decision: policy.Decision) -> Condition:
    shares = f"gpu {decision.gpu_percent}% / cpu {decision.cpu_percent}%"
    policy_name = split.effective_policy(auto)
    if policy_name in ("cpu-only", "gpu-only"):
        return Condition(TRAFFIC_ENFORCED, "True", conditions.REASON_SINGLE_POOL,
                         f"one pool takes all traffic ({policy_name}): there is no split to enforce")
    gateway = (spec.get("routing") or {}).get("gateway") or {}
    if not gateway.get("parentRefs"):
        return Condition(TRAFFIC_ENFORCED, "False", conditions.REASON_NO_GATEWAY,
                         f"no routing.gateway.parentRefs: the split ({shares}) cannot be enforced; the model Service "
                         f"spreads requests over the pods of the pools that receive traffic; replicas are still scaled")
    if not view.route_api_available:
        return Condition(TRAFFIC_ENFORCED, "False", conditions.REASON_GATEWAY_API_MISSING,
                         f"routing.gateway is set but the Gateway API (HTTPRoute) is not installed: the split "
                         f"({shares}) cannot be enforced; replicas are still scaled")
    if view.route is None:
        return Condition(TRAFFIC_ENFORCED, "False", conditions.REASON_ROUTE_PENDING,
                         f"HTTPRoute {names.route_name(model)} does not exist yet")
    return Condition(TRAFFIC_ENFORCED, "True", conditions.REASON_HTTP_ROUTE,
                     f"HTTPRoute {names.route_name(model)} carries the split as backend weights ({shares})")


def decision_status(auto: config.AutoscalingSpec, decision: policy.Decision, now_iso: str) -> dict[str, Any]:
    """``status.autoscaling.lastDecision``: what the reconcile loop applies (replicas only when it manages them)."""
    record = dict(decision.to_status(now_iso))
    record["reason"] = str(record.get("reason", ""))[:MAX_REASON]
    if auto.replica_management == "operator":
        for pool in config.POOLS:
            if auto.bounds(pool).enabled:
                record[f"{pool}Replicas"] = decision.replicas(pool)
    record["gpuPercent"] = decision.gpu_percent
    record["cpuPercent"] = decision.cpu_percent
    return record


def changes(current: policy.Current, decision: policy.Decision, recorded: Mapping[str, Any]) -> list[events.Event]:
    """Events for a decision that is being recorded: the policy's (against what is in effect), plus a shift the
    reconcile loop already made on its own (no ready replica in a pool) that the autoscaler now takes over."""
    found = [events.Event("Normal", e.reason, e.message[:MAX_REASON]) for e in decision.events]
    before = recorded.get("cpuPercent")
    if (not any(e.reason == "TrafficShifted" for e in found) and isinstance(before, int)
            and before != decision.cpu_percent):
        found.append(events.Event("Normal", "TrafficShifted",
                                  f"gpu/cpu {100 - before}/{before} -> {decision.gpu_percent}/{decision.cpu_percent}: "
                                  f"{decision.reason}"[:MAX_REASON]))
    return found


def count(namespace: str, model: str, current: policy.Current, decision: policy.Decision,
          found: Sequence[events.Event]) -> None:
    """rerank_operator_scaling_decisions_total for the changes just recorded."""
    for pool in config.POOLS:
        before, after = current.replicas(pool), decision.replicas(pool)
        if after != before:
            direction = "ScaledUp" if after > before else "ScaledDown"
            metrics.SCALING_DECISIONS.labels(namespace, model, pool, direction).inc()
    if any(e.reason == "TrafficShifted" for e in found):
        gained = "cpu" if decision.cpu_percent > current.cpu_percent else "gpu"
        metrics.SCALING_DECISIONS.labels(namespace, model, gained, "TrafficShifted").inc()


# --- the loop ---------------------------------------------------------------------------------------------------------

class ModelAutoscaler:
    """State of one model's loop: its metrics source (the direct one remembers the previous scrape) and history."""

    def __init__(self, cluster: ClusterAccess, namespace: str, name: str, *,
                 registry: class_index.Registry | None = None, settings: Settings | None = None,
                 handoff: Handoff | None = None, after_decision: Callable[[], Any] = lambda: None,
                 fetch: tei_scrape.Fetch = tei_scrape.http_fetch,
                 clock: Callable[[], float] = time.time, now_iso: Callable[[], str] = utcnow) -> None:
        self.cluster = cluster
        self.registry = registry or class_index.Registry()  # the process's (handlers.py); a fresh one in unit tests
        self.settings = settings or Settings()
        self.handoff = handoff or Handoff()  # the process's (handlers.py): its status lock is the reconcile loop's
        self.namespace = namespace
        self.name = name
        self.after_decision = after_decision
        self.fetch = fetch
        self.clock = clock
        self.now_iso = now_iso
        self.source: tei_scrape.DirectSource | prometheus_api.PrometheusSource | None = None
        self.source_key: tuple[Any, ...] | None = None
        self.priming = False
        self.history: history.History | None = None

    def tick(self) -> float:
        """One evaluation; returns the seconds until the next."""
        body = self.cluster.get_model(self.namespace, self.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return IDLE_POLL_SECONDS
        meta = body["metadata"]
        owner = names.Owner(self.name, self.namespace, meta["uid"], int(meta.get("generation", 1)))
        # The spec as the reconcile loop sees it: the model's, with its RerankClass's defaults filled in.
        tenancy = tenant.resolve_model(body, self.registry.classes.items(self.cluster.list_classes))
        if tenancy.not_found is not None:
            return IDLE_POLL_SECONDS  # the reconcile loop reports it; nothing is served meanwhile
        spec = tenancy.effective
        try:
            parsed = specs.parse(spec)  # the one parser the reconcile loop uses too
            class_spec = (tenancy.rclass or {}).get("spec") if tenancy.rclass is not None else None
            server = endpoints.prometheus_for(parsed.autoscaling.source, class_spec, self.settings.prometheus)
            auto = config.AutoscalingSpec.from_model(parsed, prometheus=server)
        except (specs.SpecError, config.InvalidAutoscalingSpec) as exc:
            self._reset()
            self._write(owner, {}, [Condition(METRICS_AVAILABLE, "False", conditions.REASON_INVALID_SPEC, str(exc))])
            return IDLE_POLL_SECONDS
        if not auto.enabled:
            self._reset()
            self._write(owner, None, [])
            return IDLE_POLL_SECONDS
        interval = float(auto.interval_seconds)
        view = self.cluster.observe_pools(owner)
        if any(view.replicas(p) is None for p in config.POOLS if auto.bounds(p).enabled):
            return interval  # the pools are not deployed yet (first artifact): nothing to scale
        ready = {p: view.ready(p) for p in config.POOLS}
        signals = self._collect(auto, view, ready)
        if self.priming:  # the direct source's rates need a second scrape, one interval later
            self.priming = False
            return interval
        if self.history is None:
            self.history = _restore(meta)
        status = body.get("status") or {}
        current = policy.Current(gpu_replicas=view.replicas("gpu") or 0, cpu_replicas=view.replicas("cpu") or 0,
                                 cpu_percent=current_cpu_percent(view.route, self.name, status))
        decision = policy.decide(auto, signals, current, self.history, now=self.clock())
        self.history = decision.history
        record = {"signals": signals.to_status(), "fresh": not decision.held,
                  "lastDecision": decision_status(auto, decision, self.now_iso())}
        conds = [metrics_available(auto, decision), traffic_enforced(auto, spec, view, self.name, decision)]
        recorded = self._write(owner, record, conds)
        if recorded is None:
            return interval
        found = changes(current, decision, recorded)
        for event in found:
            self.cluster.post_event(owner, event)
        count(self.namespace, self.name, current, decision, found)
        if decision.events:
            self._save_history(owner)
        log.info("autoscaler %s/%s: gpu %s, cpu %s replicas, split %s/%s%s: %s", self.namespace, self.name,
                 decision.gpu_replicas, decision.cpu_replicas, decision.gpu_percent, decision.cpu_percent,
                 " (held)" if decision.held else "", decision.reason)
        self.after_decision()
        return interval

    def _write(self, owner: names.Owner, record: Mapping[str, Any] | None,
               conds: Sequence[Condition]) -> Mapping[str, Any] | None:
        """Write the autoscaler's status if something material changed; returns the lastDecision it replaced
        ({} when there was none), or None when nothing was written."""
        with self.handoff.status_lock(owner.namespace, owner.name):
            body = self.cluster.get_model(owner.namespace, owner.name)  # the latest: the reconcile loop writes too
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            previous = body.get("status") or {}
            generation = int(body["metadata"].get("generation", owner.generation))
            patch = statuses.autoscaler_patch(previous, record, conds, generation=generation, now=self.now_iso())
            if not patch:
                return None
            self.cluster.patch_status(owner, patch)
        return dict((previous.get("autoscaling") or {}).get("lastDecision") or {})

    def _collect(self, auto: config.AutoscalingSpec, view: PoolsView, ready: Mapping[config.Pool, int]) -> Signals:
        key = (auto.source, auto.prometheus)
        if self.source is None or key != self.source_key:
            self.source_key = key
            if auto.source == "prometheus":
                self.source = prometheus_api.PrometheusSource(
                    str(auto.prometheus.url), window="1m",
                    gpu_memory_used_query=auto.prometheus.gpu_memory_used_query,
                    gpu_memory_total_query=auto.prometheus.gpu_memory_total_query)
            else:
                self.source = tei_scrape.DirectSource(fetch=self.fetch, clock=self.clock)
                self.priming = True
        pods = {p: view.ready_pods(p) for p in config.POOLS if auto.bounds(p).enabled}
        if isinstance(self.source, prometheus_api.PrometheusSource):
            selectors = {p: prometheus_api.build_selector(self.namespace, [x["metadata"]["name"] for x in found])
                         for p, found in pods.items()}
            return self.source.collect(selectors, ready)
        targets = [tei_scrape.PodTarget(x["metadata"]["name"], p, x["status"]["podIP"], names.TEI_PORT)
                   for p, found in pods.items() for x in found]
        return self.source.collect(targets, ready)

    def _save_history(self, owner: names.Owner) -> None:
        assert self.history is not None
        text = json.dumps(self.history.to_dict(), separators=(",", ":"))
        try:
            self.cluster.annotate_model(owner, {HISTORY_ANNOTATION: text})
        except TransientApiError as exc:  # only a restart's memory is lost
            log.warning("could not save the autoscaler history of %s/%s: %s", owner.namespace, owner.name, exc)

    def _reset(self) -> None:
        self.source = self.source_key = self.history = None
        self.priming = False


def _restore(meta: Mapping[str, Any]) -> history.History:
    raw = (meta.get("annotations") or {}).get(HISTORY_ANNOTATION)
    try:
        return history.History.from_dict(json.loads(raw)) if raw else history.History()
    except ValueError:
        return history.History()


async def run(loop: ModelAutoscaler, stopped: Any) -> None:
    """The daemon's body: tick in a worker thread (scrapes and API calls block), sleep, until kopf stops it."""
    while not stopped:
        try:
            delay = await asyncio.to_thread(loop.tick)
        except TransientApiError as exc:
            log.warning("autoscaler %s/%s: %s", loop.namespace, loop.name, exc)
            delay = 5.0
        except Exception:
            log.exception("autoscaler %s/%s failed", loop.namespace, loop.name)
            delay = IDLE_POLL_SECONDS
        wait: Awaitable[Any] = stopped.wait(delay)
        await wait
