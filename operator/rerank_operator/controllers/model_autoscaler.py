"""One RerankModel's autoscaling tick (``ModelAutoscaler``): read the model and its pools from the watch-fed caches,
let the pure policy (``core/autoscale/policy.decide``) decide from the signals the fleet loop collected, and record the
decision in ``status.autoscaling`` with the autoscaler's two conditions, MetricsAvailable and TrafficEnforced
(``core/autoscale/record.py`` builds them), the quality guard's verdict (``core/quality/assessment.py``) and the tick's
metering (``core/cost.meter``). It never writes a Deployment or an HTTPRoute: the reconcile loop applies
``status.autoscaling.lastDecision`` (replicas through the Deployments' scale subresource, weights on the HTTPRoute),
and is asked to run right after a decision changed.

Writes happen only when the decision changes (replicas, split, held or not) or a condition changes status or
reason (``record.material``), so a model under steady load costs no write at all. The policy's memory (history) lives
in this process and is saved to an annotation when a pool was scaled or traffic shifted, so a restarted operator
keeps its cooldowns. The status it writes is built by ``status.autoscaler_patch`` (the autoscaler's half of the
status pipeline; ``status.compute`` builds the reconcile loop's and carries this part over). Status writes are
serialized with the reconcile loop's (``handoff.Handoff.status_lock``): both replace the conditions list, so neither
may write between the other's read and write.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from rerank_operator.adapters import guard_scrape, tei_scrape
from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.cluster import ClusterAccess, TransientApiError
from rerank_operator.adapters.signal_sources import Sources, Wanted
from rerank_operator.controllers import class_index
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.core import cost, leadership, names, platform
from rerank_operator.core.autoscale import config, endpoints, history, policy, record
from rerank_operator.core.autoscale import zero as zeros
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.builders import guard
from rerank_operator.core.names import ROUTED_TO_ACTIVATOR, ModelKey
from rerank_operator.core.quality import assessment as quality
from rerank_operator.core.quality import guard_policy
from rerank_operator.core.reconcile.observed import PoolsView
from rerank_operator.core.settings import Settings
from rerank_operator.core.spec import model as specs
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions, events
from rerank_operator.core.status.conditions import Condition

log = logging.getLogger(__name__)

IDLE_POLL_SECONDS = 15.0  # how often a model with autoscaling off (or not deployed yet) is looked at again
T = TypeVar("T")


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


def export(namespace: str, model: str, class_name: str, metered: cost.Metered) -> None:
    """One tick's metering (``cost.meter``) as the operator's Prometheus series."""
    for r in metered.pools:
        metrics.record_pool(namespace, model, r.pool, replicas=r.replicas, max_replicas=r.max_replicas,
                            target_seconds=r.target_seconds)
        if r.served is not None:
            metrics.count_served(namespace, model, r.pool, requests=r.served.requests, slow=r.served.slow,
                                 pairs=r.served.pairs)
    if metered.accrued is not None:
        metrics.count_cost(namespace, model, class_name, metered.accrued.pools, metered.accrued.gpu_only)


# --- the loop ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """One model's tick up to its signals: what the metrics sources are asked for, and what the decision needs."""

    owner: names.Owner
    body: Mapping[str, Any]
    spec: specs.RerankModelSpec
    auto: config.AutoscalingSpec
    view: PoolsView
    wanted: Wanted
    guard: guard_scrape.GuardTarget | None = None  # the quality guard's ready pod, when the model is guarded


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
        self._memo: tuple[class_index.Understood, config.AutoscalingSpec] | None = None
        self._unchanged: tuple[Any, ...] | None = None  # what the last tick that wrote nothing saw
        self.pricing: cost.Pricing | None = None  # the model's RerankClass's prices (set with the parsed spec)
        self.guard: platform.GuardSettings | None = None  # the class's quality guard, when it turns it on
        self.guard_why_not: str | None = None  # why this model cannot be checked although its class guards it
        self.guard_reference: str = platform.REFERENCE  # what its guard compares with (status.quality.reference)
        self.requantize_policy = specs.RequantizeOnDrift()  # the model's consent to re-quantize on drift
        self.class_name = ""
        self.metered_at: float | None = None
        self.metered_span = 0.0  # the seconds the last metering covered
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
        return self.finish(prepared, self.sources.collect({self.key: prepared.wanted})[self.key],
                           verdicts.get(self.key))

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

    @property
    def may_sleep(self) -> bool:
        """Whether this model may go to zero (its last parsed spec, with an activator to wake it)."""
        return self._memo is not None and zeros.may_sleep(self._memo[1])

    @property
    def sleeping(self) -> bool:
        """Whether its route points at the activator (going to, at or waking from zero): a request the activator
        holds for it is worth a tick now (``FleetAutoscaler``)."""
        return self.history is not None and self.history.zero.phase in ROUTED_TO_ACTIVATOR

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
        parsed, auto = understood
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
        wanted = Wanted(owner.namespace, auto, {p: view.ready(p) for p in config.POOLS},
                        {p: view.ready_pods(p) for p in config.POOLS if auto.bounds(p).enabled})
        return Prepared(owner, body, parsed, auto, view, wanted, guard_scrape.target_of(view) if self.guarded else None)

    def _understand(self, body: Mapping[str, Any],
                    owner: names.Owner) -> tuple[specs.RerankModelSpec, config.AutoscalingSpec] | float:
        """The parsed effective spec (``class_index.understand``: resolved and parsed once per version of the model
        and of the classes, for the reconcile loop too) and the autoscaling settings; a float: the seconds until the
        next look (nothing to scale)."""
        understood = class_index.understand(body, self.cluster.list_classes, self.registry,
                                            self.settings.quantizer_image)
        if self._memo is not None and self._memo[0] is understood and understood.spec is not None:
            return understood.spec, self._memo[1]
        if understood.tenancy.not_found is not None:
            return IDLE_POLL_SECONDS  # the reconcile loop reports it; nothing is served meanwhile
        tenancy, parsed = understood.tenancy, understood.spec
        class_spec = tenancy.rclass.get("spec") if tenancy.rclass is not None else None
        self.pricing, self.class_name = cost.Pricing.from_class(class_spec), tenancy.class_name or ""
        self.guard = platform.GuardSettings.from_class(class_spec)
        try:
            if parsed is None:
                raise specs.SpecError(str(understood.error))
            self.guard_why_not = guard_policy.unavailable(parsed)
            self.guard_reference = guard.reference_of(parsed)
            self.requantize_policy = parsed.quantization.requantize_on_drift
            server = endpoints.prometheus_for(parsed.autoscaling.source, class_spec, self.settings.prometheus)
            auto = config.AutoscalingSpec.from_model(parsed, prometheus=server)
            if self.settings.activator is None and auto.idle_seconds is not None:
                auto = replace(auto, idle_seconds=None)  # nothing could wake it: kept awake (zero.awake_bounds)
        except (specs.SpecError, config.InvalidAutoscalingSpec) as exc:
            self._reset()
            self._write(owner, {}, [Condition(conditions.METRICS_AVAILABLE, "False", conditions.REASON_INVALID_SPEC,
                                              str(exc))])
            return IDLE_POLL_SECONDS
        if not auto.enabled:
            self._reset()
            view = self.cluster.observe_pools(owner)
            self._check_quality_only(owner, body, view)
            self._meter(auto, view, None)  # unscaled pools cost all the same
            return IDLE_POLL_SECONDS
        self._memo = (understood, auto)
        return parsed, auto

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
            verdict = self.sources.verdicts({self.key: guard_scrape.target_of(view)}).get(self.key)
        assessment = self._quality(body, view, verdict)
        recorded = self._write(owner, None, [assessment.condition] if assessment else [],
                               quality_record=assessment.record if assessment else None)
        if recorded is not None and assessment is not None:
            self._post_quality(owner, assessment)

    def _post_quality(self, owner: names.Owner, assessment: quality.Assessment) -> None:
        for event in assessment.events:
            self.cluster.post_event(owner, events.Event(event.type, event.reason, event.message[:record.MAX_REASON]))
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
            self.history = record.saved_history(p.body["metadata"])
        status = p.body.get("status") or {}
        assessment = self._quality(p.body, p.view, verdict)
        if assessment is not None:
            signals = replace(signals, below_floor=assessment.below_floor)
        refused, _ = quality.refused_by_artifact(status.get("artifact"))
        if refused:  # the served artifact's original weights overflow in float16: no GPU traffic, whatever the load
            signals = replace(signals, below_floor=signals.below_floor | refused)
        current = policy.Current(gpu_replicas=p.view.replicas("gpu") or 0, cpu_replicas=p.view.replicas("cpu") or 0,
                                 cpu_percent=record.current_cpu_percent(p.view.route, self.name, status))
        decision = policy.decide(p.auto, signals, current, self.history, now=self.clock())
        self.history = decision.history
        if decision.missed:  # nothing in the status says so (that is the point): the log does
            log.info("autoscaler %s/%s: %s", self.namespace, self.name, decision.reason)
        # A miss meters nothing: the next measured tick accrues the whole span (up to METER_GAP_TICKS).
        gpu_only = None if decision.missed else self._meter(p.auto, p.view, signals)
        if decision.zero == "asleep" and not decision.missed:
            self._count_zero(p.auto)
        written: dict[str, Any] = {"signals": signals.to_status(), "fresh": not decision.held,
                                   "lastDecision": record.decision_status(p.auto, decision, self.now_iso())}
        if self.pricing is not None:
            # As of the decision: the pools it asks for, priced (recorded only with a material change, like the
            # signals, so a steady model costs no write).
            written["cost"] = cost.summary(self.pricing, {pool: decision.replicas(pool) for pool in config.POOLS},
                                          gpu_only)
        conds = [record.metrics_available(p.auto, decision),
                 record.traffic_enforced(p.auto, p.spec.routing, p.view, self.name, decision)]
        if assessment is not None:
            conds.append(assessment.condition)
        metrics.record_conditions(self.namespace, self.name, [{"type": c.type, "status": c.status} for c in conds])
        recorded = self._write(p.owner, written, conds, quality_record=assessment.record if assessment else None)
        if recorded is None:
            return interval
        if assessment is not None:
            self._post_quality(p.owner, assessment)
        found = record.changes(decision, recorded)
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

    def _count_zero(self, auto: config.AutoscalingSpec) -> None:
        """Time at zero, and what one replica of the wake pool would have cost meanwhile at the class's price: the
        least the model would have kept without scale to zero (its minReplicas 0 were 1 before)."""
        seconds = self.metered_span
        hourly = self.pricing.per_replica_hour(names.wake_pool(auto.cpu.enabled)) if self.pricing is not None else 0.0
        metrics.count_zero(self.namespace, self.name, self.class_name, seconds, seconds / 3600 * hourly)

    def _meter(self, auto: config.AutoscalingSpec, view: PoolsView, signals: Signals | None) -> int | None:
        """Meter this interval (``cost.meter``: pool gauges, SLO events, cost) and export it; returns the GPU replicas
        the whole load would need alone (None: unknown). Intervals are measured between this process's own looks."""
        now = self.clock()
        last, self.metered_at = self.metered_at, now
        interval = max(float(auto.interval_seconds), IDLE_POLL_SECONDS if not auto.enabled else 0.0)
        gpu = self.history.gpu if self.history is not None else None
        self.metered_span = cost.metered_seconds(last, now, interval)
        metered = cost.meter(auto, {pool: view.billable(pool) for pool in config.POOLS}, signals,
                             self.metered_span, self.pricing,
                             gpu.capacity if gpu else None, saturated=bool(gpu and gpu.capacity_from_saturation))
        export(self.namespace, self.name, self.class_name, metered)
        return metered.gpu_only

    def _write(self, owner: names.Owner, written: Mapping[str, Any] | None, conds: Sequence[Condition],
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
            seen = (body["metadata"].get("resourceVersion"), record.material(written), conds,
                    json.dumps(quality_record, sort_keys=True))
            if seen[0] is not None and seen == self._unchanged:
                return None
            previous = body.get("status") or {}
            generation = int(body["metadata"].get("generation", owner.generation))
            patch = statuses.autoscaler_patch(previous, written, conds, generation=generation, now=self.now_iso(),
                                              quality=quality_record)
            if not patch:
                self._unchanged = seen
                return None
            self._unchanged = None
            self.cluster.patch_status(owner, patch)
        return dict((previous.get("autoscaling") or {}).get("lastDecision") or {})

    def _save_history(self, owner: names.Owner) -> None:
        assert self.history is not None
        try:
            self.cluster.annotate_model(owner, record.history_annotation(self.history))
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


def aligned(now: float, interval: float) -> float:
    """The next multiple of ``interval`` after ``now``: models with the same interval tick together, so their
    signals are collected in one batch (one PromQL query per signal for all of them)."""
    return (math.floor(now / interval) + 1) * interval
