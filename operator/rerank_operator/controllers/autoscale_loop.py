"""The autoscaler's loop: one thread for every RerankModel, each model every ``spec.autoscaling.intervalSeconds``.

Each round (``FleetAutoscaler.round``) takes the models that are due; models with the same interval are due together
(``aligned``), so their signals are collected in one batch (``adapters/signal_sources.Sources``: all direct scrapes
at once on one bounded pool with per-pod timeouts, or one PromQL query per signal for all of them), then each model
decides and records (``model_autoscaler.ModelAutoscaler``). A slow or dead pod costs at most the scrape deadline of
one round, never another model's decision.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.adapters.cluster import ClusterAccess, TransientApiError
from rerank_operator.adapters.signal_sources import ModelKey, Sources
from rerank_operator.controllers import class_index
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.controllers.model_autoscaler import IDLE_POLL_SECONDS, ModelAutoscaler, Prepared
from rerank_operator.core.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")


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
            self.registry.specs.forget(*gone)
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
            signals = self.sources.collect({k: p.wanted for k, p in batch.items()})
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

