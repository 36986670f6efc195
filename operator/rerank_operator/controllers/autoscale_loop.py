"""The autoscaler's loop: one thread for every RerankModel, each model every ``spec.autoscaling.intervalSeconds``.

Each round (``FleetAutoscaler.round``) takes the models that are due; models with the same interval are due together
(``aligned``), so their signals are collected in one batch (``adapters/signal_sources.Sources``: all direct scrapes
at once on one bounded pool with per-pod timeouts, or one PromQL query per signal for all of them), then each model
decides and records (``model_autoscaler.ModelAutoscaler``). A slow or dead pod costs at most the scrape deadline of
one round, never another model's decision.

Scale to zero: while some model's route points at the activator, each round (at least every ``WAKE_POLL_SECONDS``)
reads the activator's ``/pending`` once for the whole fleet; a sleeping model with requests waiting is due at once,
so a wake costs at most that second before its pool is scaled, not an interval, and every model's tick sees what
the activator says of it (``Signals.activator``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from rerank_operator.adapters import activator_pending
from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.cluster import ClusterAccess, TransientApiError
from rerank_operator.adapters.signal_sources import Sources
from rerank_operator.controllers import class_index
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.controllers.model_autoscaler import IDLE_POLL_SECONDS, ModelAutoscaler, Prepared
from rerank_operator.core.autoscale.signals import ActivatorDemand
from rerank_operator.core.names import ModelKey
from rerank_operator.core.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")
#: How often the activator's /pending is read while a model sleeps: the most a wake waits before its pool is scaled.
WAKE_POLL_SECONDS = 1.0


class FleetAutoscaler:
    """Every model's autoscaling in one loop (one thread, however many models): each round takes the models that
    are due, reads them from the caches, collects all their signals at once (``Sources``), then decides each.
    A slow or dead pod costs at most the scrape deadline of one round, never another model's decision."""

    def __init__(self, cluster: ClusterAccess, *, registry: class_index.Registry, settings: Settings,
                 handoff: Handoff, models: Any, after_decision: Callable[[ModelKey], Any],
                 sources: Sources | None = None, clock: Callable[[], float] = time.time,
                 pending: activator_pending.Fetch = activator_pending.fetch) -> None:
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
        self.pending_source = pending
        self.pending: dict[ModelKey, ActivatorDemand] = {}  # the activator's last answer
        self.polled_at: float | None = None

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
            self.registry.specs.forget(*gone)
        due: list[ModelAutoscaler] = []
        for key in keys:
            state = self.states.get(key)
            if state is None:
                state = self.states[key] = ModelAutoscaler(
                    self.cluster, key[0], key[1], registry=self.registry, settings=self.settings,
                    handoff=self.handoff, after_decision=functools.partial(self.after_decision, key),
                    sources=self.sources, clock=self.clock)
        self._poll_activator(now)
        for state in self.states.values():
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
            signals = self.sources.collect({k: p.wanted for k, p in batch.items()})
            for key in batch:
                if key in self.pending:
                    signals[key] = replace(signals[key], activator=self.pending[key])
            for key, prepared in batch.items():
                state = self.states[key]
                step = functools.partial(state.finish, prepared, signals[key], verdicts.get(key))
                state.schedule(now, self._safely(state, step))
            metrics.AUTOSCALER_ROUND.observe(self.clock() - now)
        upcoming = min((s.next_due for s in self.states.values()), default=now + IDLE_POLL_SECONDS)
        if self._watching_activator():
            upcoming = min(upcoming, (self.polled_at or now) + WAKE_POLL_SECONDS)
        return min(max(upcoming - self.clock(), 0.05), IDLE_POLL_SECONDS)

    def _watching_activator(self) -> bool:
        return self.settings.activator is not None and any(s.sleeping for s in self.states.values())

    def _poll_activator(self, now: float) -> None:
        """Read the activator's /pending while a model sleeps (at most every WAKE_POLL_SECONDS), and make each
        sleeping model with requests waiting due now."""
        activator = self.settings.activator
        if activator is None or not self._watching_activator():
            self.pending = {}
            return
        if self.polled_at is not None and now - self.polled_at < WAKE_POLL_SECONDS:
            return
        self.polled_at = now
        self.pending = dict(self.pending_source(activator) or {})
        for key, demand in self.pending.items():
            state = self.states.get(key)
            if state is not None and state.sleeping and demand.waiting > 0:
                state.next_due = min(state.next_due, now)

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

