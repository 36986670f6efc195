"""Where the autoscaler's signals come from: one set of metrics sources per process, shared by every model.

Direct scrapes of the pools' TEI pods go through one bounded scrape pool (per-pod timeouts, backoff); Prometheus is
asked once per signal for every model on the same server (``prometheus_api.PrometheusSource.collect_many``); the
quality guards' verdicts are read all at once (``guard_scrape.GuardReader``). The fleet loop hands a whole round's
models to ``Sources.collect`` so a round costs one batch, whatever the number of models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rerank_operator.adapters import guard_scrape, prometheus_api, tei_scrape
from rerank_operator.core import names
from rerank_operator.core.autoscale import config
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.quality import assessment as quality

PrometheusKey = tuple[str, str | None, str | None]  # url, GPU memory used query, total query


@dataclass(frozen=True)
class Wanted:
    """What one model's signals are collected from: its source settings and each pool's ready pods."""

    namespace: str
    auto: config.AutoscalingSpec
    ready: Mapping[config.Pool, int]
    pods: Mapping[config.Pool, list[Any]]


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

    def collect(self, batch: Mapping[names.ModelKey, Wanted]) -> dict[names.ModelKey, Signals]:
        """Signals of every model in ``batch``: all direct scrapes at once, one set of queries per server."""
        direct: dict[names.ModelKey, tei_scrape.ModelTargets] = {}
        servers: dict[PrometheusKey, dict[names.ModelKey, prometheus_api.ModelPods]] = {}
        for key, w in batch.items():
            if w.auto.source == "prometheus":
                server = (str(w.auto.prometheus.url), w.auto.prometheus.gpu_memory_used_query,
                          w.auto.prometheus.gpu_memory_total_query)
                servers.setdefault(server, {})[key] = prometheus_api.ModelPods(w.namespace, {
                    pool: (w.ready.get(pool, 0), tuple(x["metadata"]["name"] for x in found))
                    for pool, found in w.pods.items()})
            else:
                direct[key] = tei_scrape.ModelTargets(tuple(
                    tei_scrape.PodTarget(x["metadata"]["name"], pool, x["status"]["podIP"], names.TEI_PORT)
                    for pool, found in w.pods.items() for x in found), dict(w.ready))
        found: dict[names.ModelKey, Signals] = {}
        if direct:
            found.update(self.scrape.collect(direct, self.deadline_seconds))
        for server, requests in servers.items():
            if server not in self._servers:
                self._servers[server] = self._make(server)
            found.update(self._servers[server].collect_many(requests))
        return found

    def verdicts(self, targets: Mapping[names.ModelKey, guard_scrape.GuardTarget | None]
                 ) -> dict[names.ModelKey, quality.Verdict | None]:
        """The quality guards' verdicts of the guarded models among ``targets`` (all read at once)."""
        return self.guards.read(targets) if targets else {}

    def forget(self, key: names.ModelKey) -> None:
        self.scrape.forget(key)
