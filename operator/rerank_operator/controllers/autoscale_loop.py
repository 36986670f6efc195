"""The autoscaler's imperative shell: one loop for every RerankModel, each model every
``spec.autoscaling.intervalSeconds``.

Each round (``FleetAutoscaler.round``) takes the models that are due; models with the same interval are due together
(``aligned``), so their signals are collected in one batch: all direct scrapes at once on one bounded pool with
per-pod timeouts, or one PromQL query per signal for all of them (``Sources``). Per model (``ModelAutoscaler``): read
the model and its pools (Deployments, ready pods, HTTPRoute) from the watch-fed caches, let the pure policy
(``core/autoscale/policy.decide``) decide, and record the decision in ``status.autoscaling`` with the autoscaler's
two conditions, MetricsAvailable and TrafficEnforced. It never writes a Deployment or an HTTPRoute: the reconcile
loop applies ``status.autoscaling.lastDecision`` (replicas through the Deployments' scale subresource, weights on the
HTTPRoute), and is asked to run right after a decision changed.

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

import functools
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from rerank_operator.adapters import guard_scrape, prometheus_api, tei_scrape
from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.cluster import ClusterAccess, TransientApiError
from rerank_operator.controllers import class_index
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.core import conditions, cost, events, leadership, names, quality, slo, spec_parse
from rerank_operator.core import spec as specs
from rerank_operator.core import status as statuses
from rerank_operator.core.autoscale import config, endpoints, history, policy, split
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.builders import guard
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
METER_GAP_TICKS = 3.0  # a metering interval longer than this many ticks (a pause, a new leader) is cut to it
MAX_REASON = 1024
T = TypeVar("T")

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
            metrics.count_decision(namespace, model, pool, direction)
    if any(e.reason == "TrafficShifted" for e in found):
        gained = "cpu" if decision.cpu_percent > current.cpu_percent else "gpu"
        metrics.count_decision(namespace, model, gained, "TrafficShifted")


# --- the loop ---------------------------------------------------------------------------------------------------------

ModelKey = tuple[str, str]
PrometheusKey = tuple[str, str | None, str | None]  # url, GPU memory used query, total query


@dataclass(frozen=True)
class Prepared:
    """One model's tick up to its signals: what the metrics sources are asked for, and what the decision needs."""

    owner: names.Owner
    body: Mapping[str, Any]
    spec: Mapping[str, Any]
    auto: config.AutoscalingSpec
    view: PoolsView
    ready: Mapping[config.Pool, int]
    pods: Mapping[config.Pool, list[Any]]
    guard: guard_scrape.GuardTarget | None = None  # the quality guard's ready pod, when the model is guarded


class Sources:
    """The metrics sources of one process, shared by every model: one scrape pool (bounded threads, per-pod
    timeouts and backoff), one PrometheusSource per server and GPU-memory queries."""

    def __init__(self, scrape: tei_scrape.ScrapePool | None = None, *,
                 prometheus: Callable[[PrometheusKey], prometheus_api.PrometheusSource] | None = None,
                 deadline_seconds: float = 3.0, guards: guard_scrape.GuardReader | None = None) -> None:
        self.scrape = scrape or tei_scrape.ScrapePool()
        self.guards = guards or guard_scrape.GuardReader()
        self._make = prometheus or (lambda k: prometheus_api.PrometheusSource(
            k[0], window="1m", gpu_memory_used_query=k[1], gpu_memory_total_query=k[2]))
        self._servers: dict[PrometheusKey, prometheus_api.PrometheusSource] = {}
        self.deadline_seconds = deadline_seconds

    def collect(self, batch: Mapping[ModelKey, Prepared]) -> dict[ModelKey, Signals]:
        """Signals of every model in ``batch``: all direct scrapes at once, one set of queries per server."""
        direct: dict[ModelKey, tei_scrape.ModelTargets] = {}
        servers: dict[PrometheusKey, dict[ModelKey, prometheus_api.ModelPods]] = {}
        for key, p in batch.items():
            if p.auto.source == "prometheus":
                server = (str(p.auto.prometheus.url), p.auto.prometheus.gpu_memory_used_query,
                          p.auto.prometheus.gpu_memory_total_query)
                servers.setdefault(server, {})[key] = prometheus_api.ModelPods(p.owner.namespace, {
                    pool: (p.ready.get(pool, 0), tuple(x["metadata"]["name"] for x in found))
                    for pool, found in p.pods.items()})
            else:
                direct[key] = tei_scrape.ModelTargets(tuple(
                    tei_scrape.PodTarget(x["metadata"]["name"], pool, x["status"]["podIP"], names.TEI_PORT)
                    for pool, found in p.pods.items() for x in found), dict(p.ready))
        found: dict[ModelKey, Signals] = {}
        if direct:
            found.update(self.scrape.collect(direct, self.deadline_seconds))
        for server, requests in servers.items():
            if server not in self._servers:
                self._servers[server] = self._make(server)
            found.update(self._servers[server].collect_many(requests))
        return found

    def verdicts(self, targets: Mapping[ModelKey, guard_scrape.GuardTarget | None]
                 ) -> dict[ModelKey, quality.Verdict | None]:
        """The quality guards' verdicts of the guarded models among ``targets`` (all read at once)."""
        return self.guards.read(targets) if targets else {}

    def forget(self, key: ModelKey) -> None:
        self.scrape.forget(key)


class ModelAutoscaler:
    """State of one model's autoscaling: which source it reads (a new one primes: rates need two scrapes) and the
    policy's history. ``tick`` runs one evaluation alone; the fleet loop runs ``prepare`` for every due model,
    collects all their signals at once, then ``finish`` for each."""

    def __init__(self, cluster: ClusterAccess, namespace: str, name: str, *,
                 registry: class_index.Registry | None = None, settings: Settings | None = None,
                 handoff: Handoff | None = None, after_decision: Callable[[], Any] = lambda: None,
                 fetch: tei_scrape.Fetch = tei_scrape.http_fetch, sources: Sources | None = None,
                 clock: Callable[[], float] = time.time, now_iso: Callable[[], str] = utcnow) -> None:
        self.cluster = cluster
        self.registry = registry or class_index.Registry()  # the process's (handlers.py); a fresh one in unit tests
        self.settings = settings or Settings()
        self.handoff = handoff or Handoff()  # the process's (handlers.py): its status lock is the reconcile loop's
        self.namespace = namespace
        self.name = name
        self.after_decision = after_decision
        self.sources = sources or Sources(tei_scrape.ScrapePool(fetch=fetch, clock=clock))
        self.clock = clock
        self.now_iso = now_iso
        self.source_key: tuple[Any, ...] | None = None
        self.priming = False
        self.history: history.History | None = None
        self.next_due = 0.0
        self._memo: tuple[tuple[Any, int], tuple[Mapping[str, Any], config.AutoscalingSpec]] | None = None
        self._unchanged: tuple[Any, ...] | None = None  # what the last tick that wrote nothing saw
        self.pricing: cost.Pricing | None = None  # the model's RerankClass's prices (set with the parsed spec)
        self.guard: guard.GuardSettings | None = None  # the class's quality guard, when it turns it on
        self.guard_why_not: str | None = None  # why this model cannot be checked although its class guards it
        self.guard_reference: str = guard.REFERENCE  # what its guard compares with (status.quality.reference)
        self.requantize_policy = specs.RequantizeOnDrift()  # the model's consent to re-quantize on drift
        self.class_name = ""
        self.metered_at: float | None = None
        self.primed_at: float | None = None  # when the direct source's first scrape was taken (rates need a second)
        self.foreign: tuple[str, ...] = ()  # look-alike pods last seen (observed.owned_pods), warned of once each

    @property
    def key(self) -> ModelKey:
        return self.namespace, self.name

    def tick(self) -> float:
        """One evaluation of this model alone; returns the seconds until the next."""
        prepared = self.prepare()
        if not isinstance(prepared, Prepared):
            return prepared
        verdicts = self.sources.verdicts({self.key: prepared.guard} if self.guarded else {})
        return self.finish(prepared, self.sources.collect({self.key: prepared})[self.key], verdicts.get(self.key))

    def schedule(self, now: float, delay: float) -> None:
        """The next tick: on the grid of ``delay`` (models with one interval tick together), but never less than half
        an interval after the priming scrape, whose rates would otherwise span a few milliseconds."""
        due = aligned(now, delay)
        if self.primed_at is not None and due - self.primed_at < delay / 2:
            due += delay
        self.next_due = due

    @property
    def guarded(self) -> bool:
        return self.guard is not None

    def prepare(self) -> Prepared | float:
        """Read the model and its pools (from the caches) and settle everything that needs no metrics; returns what
        to collect signals for, or the seconds until the next look (nothing to scale now)."""
        body = self.cluster.get_model(self.namespace, self.name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return IDLE_POLL_SECONDS
        meta = body["metadata"]
        owner = names.Owner(self.name, self.namespace, meta["uid"], int(meta.get("generation", 1)))
        understood = self._understand(body, owner)
        if isinstance(understood, float):
            return understood
        spec, auto = understood
        view = self.cluster.observe_pools(owner)
        self._note_foreign(view.foreign_pods)
        if any(view.replicas(p) is None for p in config.POOLS if auto.bounds(p).enabled):
            return float(auto.interval_seconds)  # the pools are not deployed yet (first artifact): nothing to scale
        key = (auto.source, auto.prometheus)
        if key != self.source_key:  # a new source: the direct one's rates need a second scrape, one interval later
            self.source_key = key
            self.priming = auto.source != "prometheus"
            if self.history is not None:  # the old source's samples say nothing about the new one's
                self.history = self.history.without_samples()
        return Prepared(owner, body, spec, auto, view, {p: view.ready(p) for p in config.POOLS},
                        {p: view.ready_pods(p) for p in config.POOLS if auto.bounds(p).enabled},
                        _guard_target(view) if self.guarded else None)

    def _understand(self, body: Mapping[str, Any],
                    owner: names.Owner) -> tuple[Mapping[str, Any], config.AutoscalingSpec] | float:
        """The effective spec and the autoscaling settings, parsed once per version of the model and of the classes
        (a fleet's ticks mostly see neither change); a float: the seconds until the next look (nothing to scale)."""
        memo_key = (body["metadata"].get("resourceVersion"), self.registry.classes.version)
        if self._memo is not None and self._memo[0] == memo_key and memo_key[0] is not None:
            return self._memo[1]
        # The spec as the reconcile loop sees it: the model's, with its RerankClass's defaults filled in.
        tenancy = tenant.resolve_model(dict(body), self.registry.classes.items(self.cluster.list_classes))
        if tenancy.not_found is not None:
            return IDLE_POLL_SECONDS  # the reconcile loop reports it; nothing is served meanwhile
        spec = tenancy.effective
        class_spec = tenancy.rclass.get("spec") if tenancy.rclass is not None else None
        self.pricing, self.class_name = cost.Pricing.from_class(class_spec), tenancy.class_name or ""
        self.guard = guard.GuardSettings.from_class(class_spec)
        try:
            parsed = spec_parse.parse(spec)  # the one parser the reconcile loop uses too
            self.guard_why_not = guard.unavailable(parsed)
            self.guard_reference = guard.reference_of(parsed)
            self.requantize_policy = parsed.quantization.requantize_on_drift
            server = endpoints.prometheus_for(parsed.autoscaling.source, class_spec, self.settings.prometheus)
            auto = config.AutoscalingSpec.from_model(parsed, prometheus=server)
        except (specs.SpecError, config.InvalidAutoscalingSpec) as exc:
            self._reset()
            self._write(owner, {}, [Condition(METRICS_AVAILABLE, "False", conditions.REASON_INVALID_SPEC, str(exc))])
            return IDLE_POLL_SECONDS
        if not auto.enabled:
            self._reset()
            view = self.cluster.observe_pools(owner)
            self._check_quality_only(owner, body, view)
            self._meter(auto, view, None)  # unscaled pools cost all the same
            return IDLE_POLL_SECONDS
        self._memo = (memo_key, (spec, auto))
        return spec, auto

    def _quality(self, body: Mapping[str, Any], view: PoolsView,
                 verdict: quality.Verdict | None) -> quality.Assessment | None:
        if self.guard is None:
            return None
        now = leadership.parse_micro_time(self.now_iso())
        return quality.assess(body.get("status") or {}, verdict, self.guard_why_not,
                              {pool: view.ready(pool) for pool in config.POOLS}, names.guard_name(self.name),
                              self.guard.canary_requests, self.guard_reference,
                              drift=(self.requantize_policy, now) if now is not None else None)

    def _check_quality_only(self, owner: names.Owner, body: Mapping[str, Any], view: PoolsView) -> None:
        """With autoscaling off: the quality guard's verdict alone (routing acts on it in the reconcile loop)."""
        verdict = None
        if self.guarded and self.guard_why_not is None:
            verdict = self.sources.verdicts({self.key: _guard_target(view)}).get(self.key)
        assessment = self._quality(body, view, verdict)
        recorded = self._write(owner, None, [assessment.condition] if assessment else [],
                               quality_record=assessment.record if assessment else None)
        if recorded is not None and assessment is not None:
            self._post_quality(owner, assessment)

    def _post_quality(self, owner: names.Owner, assessment: quality.Assessment) -> None:
        for event in assessment.events:
            self.cluster.post_event(owner, events.Event(event.type, event.reason, event.message[:MAX_REASON]))
        if assessment.events or assessment.canary_decided:
            # The reconcile loop moves the traffic (routing.split reads status.quality), or promotes or rolls back
            # the canary (plan.py reads status.quality.canary).
            self.after_decision()

    def finish(self, p: Prepared, signals: Signals, verdict: quality.Verdict | None = None) -> float:
        """Decide from ``signals`` (and the quality guard's ``verdict``) and record the decision if it changed;
        returns the seconds until the next tick."""
        interval = float(p.auto.interval_seconds)
        if self.priming:
            self.priming = False
            self.primed_at = self.clock()
            self._meter(p.auto, p.view, None)  # metering starts at the first look; rates at the next
            return interval
        self.primed_at = None
        if self.history is None:
            self.history = _restore(p.body["metadata"])
        status = p.body.get("status") or {}
        assessment = self._quality(p.body, p.view, verdict)
        if assessment is not None:
            signals = replace(signals, below_floor=assessment.below_floor)
        current = policy.Current(gpu_replicas=p.view.replicas("gpu") or 0, cpu_replicas=p.view.replicas("cpu") or 0,
                                 cpu_percent=current_cpu_percent(p.view.route, self.name, status))
        decision = policy.decide(p.auto, signals, current, self.history, now=self.clock())
        self.history = decision.history
        if decision.missed:  # nothing in the status says so (that is the point): the log does
            log.info("autoscaler %s/%s: %s", self.namespace, self.name, decision.reason)
        # A miss meters nothing: the next measured tick accrues the whole span (up to METER_GAP_TICKS).
        gpu_only = None if decision.missed else self._meter(p.auto, p.view, signals)
        record: dict[str, Any] = {"signals": signals.to_status(), "fresh": not decision.held,
                                  "lastDecision": decision_status(p.auto, decision, self.now_iso())}
        if self.pricing is not None:
            # As of the decision: the pools it asks for, priced (recorded only with a material change, like the
            # signals, so a steady model costs no write).
            record["cost"] = cost.summary(self.pricing, {pool: decision.replicas(pool) for pool in config.POOLS},
                                          gpu_only)
        conds = [metrics_available(p.auto, decision), traffic_enforced(p.auto, p.spec, p.view, self.name, decision)]
        if assessment is not None:
            conds.append(assessment.condition)
        metrics.record_conditions(self.namespace, self.name, [{"type": c.type, "status": c.status} for c in conds])
        recorded = self._write(p.owner, record, conds, quality_record=assessment.record if assessment else None)
        if recorded is None:
            return interval
        if assessment is not None:
            self._post_quality(p.owner, assessment)
        found = changes(current, decision, recorded)
        for event in found:
            self.cluster.post_event(p.owner, event)
        count(self.namespace, self.name, current, decision, found)
        if decision.events:
            self._save_history(p.owner)
        log.info("autoscaler %s/%s: gpu %s, cpu %s replicas, split %s/%s%s: %s", self.namespace, self.name,
                 decision.gpu_replicas, decision.cpu_replicas, decision.gpu_percent, decision.cpu_percent,
                 " (held)" if decision.held else "", decision.reason)
        self.after_decision()
        return interval

    def _meter(self, auto: config.AutoscalingSpec, view: PoolsView, signals: Signals | None) -> int | None:
        """Export this interval's pool gauges, SLO events and cost (``core/slo.py``, ``core/cost.py``); returns the
        GPU replicas the whole load would need alone (None: unknown). Intervals are measured between this
        process's own looks, cut to METER_GAP_TICKS ticks (a standby that just took over starts afresh)."""
        now = self.clock()
        last, self.metered_at = self.metered_at, now
        interval = max(float(auto.interval_seconds), IDLE_POLL_SECONDS if not auto.enabled else 0.0)
        seconds = 0.0 if last is None else min(max(now - last, 0.0), METER_GAP_TICKS * interval)
        replicas: dict[str, int] = {pool: view.billable(pool) for pool in config.POOLS}
        for pool in config.POOLS:
            bounds = auto.bounds(pool)
            if not bounds.enabled and not replicas[pool]:
                continue
            target = auto.latency_target_ms(pool) / 1000
            metrics.record_pool(self.namespace, self.name, pool, replicas=replicas[pool],
                                max_replicas=bounds.max_replicas, target_seconds=target)
            done = None if signals is None else slo.served(signals.pool(pool), target, seconds)
            if done is not None:
                metrics.count_served(self.namespace, self.name, pool, requests=done.requests, slow=done.slow,
                                     pairs=done.pairs)
        if self.pricing is None:
            return None
        gpu_only = None
        measured = signals is not None and all(signals.pool(pool).request_rate is not None for pool in config.POOLS
                                               if signals.pool(pool).ready_replicas > 0)
        if signals is not None and measured:
            gpu = self.history.gpu if self.history is not None else None
            capacity = cost.gpu_capacity(gpu.capacity if gpu else None, self.pricing,
                                         saturated=bool(gpu and gpu.capacity_from_saturation))
            gpu_only = cost.gpu_only_replicas(signals.total_request_rate, capacity, auto.gpu.min_replicas)
        if seconds > 0:
            accrued = cost.accrue(self.pricing, cost.Usage(seconds, replicas, gpu_only))
            metrics.count_cost(self.namespace, self.name, self.class_name, accrued.pools, accrued.gpu_only)
        return gpu_only

    def _write(self, owner: names.Owner, record: Mapping[str, Any] | None, conds: Sequence[Condition],
               quality_record: Mapping[str, Any] | None = None) -> Mapping[str, Any] | None:
        """Write the autoscaler's status if something material changed; returns the lastDecision it replaced
        ({} when there was none), or None when nothing was written."""
        with self.handoff.status_lock(owner.namespace, owner.name):
            body = self.cluster.get_model(owner.namespace, owner.name)  # the latest: the reconcile loop writes too
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            # The patch depends on the stored model and on the material part of the record (never on the signals,
            # the decision's reason or time, which are only recorded with a material change): the same as the last
            # tick's, which wrote nothing, means nothing to write again.
            seen = (body["metadata"].get("resourceVersion"), _material(record), conds,
                    json.dumps(quality_record, sort_keys=True))
            if seen[0] is not None and seen == self._unchanged:
                return None
            previous = body.get("status") or {}
            generation = int(body["metadata"].get("generation", owner.generation))
            patch = statuses.autoscaler_patch(previous, record, conds, generation=generation, now=self.now_iso(),
                                              quality=quality_record)
            if not patch:
                self._unchanged = seen
                return None
            self._unchanged = None
            self.cluster.patch_status(owner, patch)
        return dict((previous.get("autoscaling") or {}).get("lastDecision") or {})

    def _save_history(self, owner: names.Owner) -> None:
        assert self.history is not None
        text = json.dumps(self.history.to_dict(), separators=(",", ":"))
        try:
            self.cluster.annotate_model(owner, {HISTORY_ANNOTATION: text})
        except TransientApiError as exc:  # only a restart's memory is lost
            log.warning("could not save the autoscaler history of %s/%s: %s", owner.namespace, owner.name, exc)

    def _note_foreign(self, pods: tuple[str, ...]) -> None:
        """Count the model's look-alike pods (ignored: ``observed.owned_pods``), and log each new one once. A model
        that never had one has no series (a thousand models' /metrics stay short)."""
        if pods == self.foreign:
            return
        new = sorted(set(pods) - set(self.foreign))
        if new:
            log.warning("ignoring pods %s in %s: they carry the labels of %s's pools or guard but its "
                        "Deployments do not own them", ", ".join(new), self.namespace, self.name)
        self.foreign = pods
        metrics.record_foreign_pods(self.namespace, self.name, len(pods))

    def _reset(self) -> None:
        self.source_key = self.history = self._memo = None
        self.priming = False
        self.sources.forget(self.key)


def _guard_target(view: PoolsView) -> guard_scrape.GuardTarget | None:
    pods = view.guard_pods()
    if not pods:
        return None
    pod = sorted(pods, key=lambda x: str(x["metadata"]["name"]))[0]
    return guard_scrape.GuardTarget(pod["metadata"]["name"], pod["status"]["podIP"])


def _material(record: Mapping[str, Any] | None) -> str:
    """The part of an autoscaler record a write depends on: all but the signals and the decision's time and reason."""
    if record is None:
        return "none"
    decision = {k: v for k, v in (record.get("lastDecision") or {}).items() if k not in ("time", "reason")}
    return json.dumps({"fresh": record.get("fresh"), "lastDecision": decision}, sort_keys=True)


def _restore(meta: Mapping[str, Any]) -> history.History:
    raw = (meta.get("annotations") or {}).get(HISTORY_ANNOTATION)
    try:
        return history.History.from_dict(json.loads(raw)) if raw else history.History()
    except ValueError:
        return history.History()


def aligned(now: float, interval: float) -> float:
    """The next multiple of ``interval`` after ``now``: models with the same interval tick together, so their
    signals are collected in one batch (one PromQL query per signal for all of them)."""
    return (math.floor(now / interval) + 1) * interval


class FleetAutoscaler:
    """Every model's autoscaling in one loop (one thread, however many models): each round takes the models that
    are due, reads them from the caches, collects all their signals at once (``Sources``), then decides each.
    A slow or dead pod costs at most the scrape deadline of one round, never another model's decision."""

    def __init__(self, cluster: ClusterAccess, *, registry: class_index.Registry, settings: Settings,
                 handoff: Handoff, models: Any, after_decision: Callable[[ModelKey], Any],
                 sources: Sources | None = None, clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.registry = registry
        self.settings = settings
        self.handoff = handoff
        self.models = models  # anything with all_keys(): the caches' model store
        self.after_decision = after_decision
        self.sources = sources or Sources()
        self.clock = clock
        self.states: dict[ModelKey, ModelAutoscaler] = {}
        self._thread: threading.Thread | None = None

    def start(self, stop: threading.Event) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self.run, args=(stop,), daemon=True, name="autoscaler")
            self._thread.start()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                delay = self.round()
            except Exception:
                log.exception("autoscaler round failed")
                delay = 1.0
            stop.wait(delay)

    def round(self) -> float:
        """One round: tick every due model; returns the seconds until the next model is due."""
        now = self.clock()
        keys = set(self.models.all_keys())
        for gone in set(self.states) - keys:
            self.states.pop(gone)
            self.sources.forget(gone)
        due: list[ModelAutoscaler] = []
        for key in keys:
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = ModelAutoscaler(
                    self.cluster, key[0], key[1], registry=self.registry, settings=self.settings,
                    handoff=self.handoff, after_decision=functools.partial(self.after_decision, key),
                    sources=self.sources, clock=self.clock)
            if state.next_due <= now:
                due.append(state)
        batch: dict[ModelKey, Prepared] = {}
        for state in due:
            delay = self._safely(state, state.prepare)
            if isinstance(delay, Prepared):
                batch[state.key] = delay
            else:
                state.schedule(now, delay)
        if batch:
            verdicts = self.sources.verdicts({k: p.guard for k, p in batch.items() if self.states[k].guarded})
            signals = self.sources.collect(batch)
            for key, prepared in batch.items():
                state = self.states[key]
                step = functools.partial(state.finish, prepared, signals[key], verdicts.get(key))
                state.schedule(now, self._safely(state, step))
            metrics.AUTOSCALER_ROUND.observe(self.clock() - now)
        upcoming = min((s.next_due for s in self.states.values()), default=now + IDLE_POLL_SECONDS)
        return min(max(upcoming - self.clock(), 0.05), IDLE_POLL_SECONDS)

    @staticmethod
    def _safely(state: ModelAutoscaler, step: Callable[[], T]) -> T | float:
        try:
            return step()
        except TransientApiError as exc:
            log.warning("autoscaler %s/%s: %s", state.namespace, state.name, exc)
            return 5.0
        except Exception:
            log.exception("autoscaler %s/%s failed", state.namespace, state.name)
            return IDLE_POLL_SECONDS

