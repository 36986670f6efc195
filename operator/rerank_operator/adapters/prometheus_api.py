"""The PromQL source: the same per-pool signals from a Prometheus server's HTTP API (/api/v1/query).

Freshness comes from the scrape job's own `up` series: its timestamp is the last scrape, and `up == 1` counts pods
that answered, so a pool whose targets are down, or that Prometheus no longer scrapes, reads as missing rather
than as idle. Queries go out as HTTP POST (form-encoded ``query=``), so a selector naming thousands of pods fits.
Every request counts in ``rerank_operator_promql_queries_total``.

The fleet path, ``collect_many``, serves every model a tick is due for with one instant query per signal, however
many models there are (8, or 9 with GPU memory): each query selects all their pods at once
(``fleet_selector``: `{namespace=~"ns1|ns2",pod=~"p1|p2|..."}`) and keeps the pods apart
(`sum by (namespace, pod) (rate(te_request_count{...}[1m]))`, `count by (namespace, pod) (up{...} == 1)`, the
histograms `by (namespace, pod, le)`); the answer is grouped per model pool here: sums for rates and queue size,
the count of `up`, the newest `up` timestamp, and quantiles from the pool's summed buckets with PromQL's own
interpolation (``exposition.quantile``), which is what `histogram_quantile(q, sum by (le) (...))` gives. A series of
a (namespace, pod) pair that the regexes match but no model asked for is ignored. A query that fails marks every
pool that needed it with the error (the policy holds).

The single-pool path, ``collect``, takes a label selector per pool (any selector; for the usual Kubernetes scrape
configs `build_selector(namespace, pod_names)` gives `{namespace="ns",pod=~"a|b"}`) and asks 9 queries per pool.

GPU memory (optional) comes from two queries the platform writes, e.g. DCGM's `DCGM_FI_DEV_FB_USED$selector` and
`DCGM_FI_DEV_FB_USED$selector + DCGM_FI_DEV_FB_FREE$selector`: ``$selector`` becomes the pool's (or the fleet's)
selector. The single-pool path asks `max((used) / (total))`; the fleet path asks
`max by (namespace, pod) ((used) / (total))` and takes the max over each GPU pool's pods, so there the queries must
keep the `pod` label (`sum by (namespace, pod) (...)`, or no aggregation at all): a series without `namespace` is
matched by pod name alone, one without `pod` belongs to no pool (the fraction stays unmeasured).
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rerank_operator.adapters import operator_metrics
from rerank_operator.core.autoscale import exposition
from rerank_operator.core.autoscale.config import Pool
from rerank_operator.core.autoscale.signals import PoolSignals, Signals
from rerank_operator.core.names import ModelKey

#: POST url, form-encoded body, timeout -> response body.
Post = Callable[[str, bytes, float], bytes]
#: A RerankModel: (namespace, name).
#: One pool of a model for ``collect_many``: (ready replicas, names of the ready pods).
PoolPods = tuple[int, tuple[str, ...]]
#: One series of an instant vector: its labels and value.
Series = tuple[Mapping[str, str], float]

_POOLS: tuple[Pool, Pool] = ("gpu", "cpu")


class QueryError(RuntimeError):
    """Prometheus did not answer, or answered with an error."""


#: Replaced in the GPU-memory queries by the pool's selector (``build_selector``) or the fleet's (``fleet_selector``).
SELECTOR_PLACEHOLDER = "$selector"


@dataclass(frozen=True)
class ModelPods:
    """One model's part of ``collect_many``: its namespace and, per pool, the ready count and ready pods."""

    namespace: str
    pools: Mapping[Pool, PoolPods]


def build_selector(namespace: str, pod_names: Iterable[str]) -> str:
    """`{namespace="ns",pod=~"p1|p2"}` with regex metacharacters in names escaped."""
    return f'{{namespace="{_quote(namespace)}",pod=~"{_quote(_alternatives(pod_names))}"}}'


def fleet_selector(pods: Iterable[tuple[str, str]]) -> str:
    """`{namespace=~"ns1|ns2",pod=~"p1|p2|..."}` over (namespace, pod) pairs; it may match pairs not given (a name
    of one namespace in another), which the caller ignores."""
    pairs = list(pods)
    namespaces = _alternatives({namespace for namespace, _ in pairs})
    names = _alternatives({name for _, name in pairs})
    return f'{{namespace=~"{_quote(namespaces)}",pod=~"{_quote(names)}"}}'


def _alternatives(values: Iterable[str]) -> str:
    return "|".join(re.escape(value) for value in sorted(set(values))) or "$^"  # "$^" matches nothing


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def queries(selector: str, window: str) -> dict[str, str]:
    """The PromQL for each signal of one pool (rates over `window`, e.g. "1m")."""
    def quantile(q: float, name: str) -> str:
        return f"histogram_quantile({q}, sum by (le) (rate({name}_bucket{selector}[{window}])))"

    return {
        "scraped": f"count(up{selector} == 1)",
        "sampled_at": f"max(timestamp(up{selector}))",
        "request_rate": f"sum(rate(te_request_count{selector}[{window}]))",
        "success_rate": f"sum(rate(te_request_success{selector}[{window}]))",
        "failure_rate": f"sum(rate(te_request_failure{selector}[{window}]))",
        "queue_size": f"sum(te_queue_size{selector})",
        "pair_rate": f"sum(rate(te_batch_next_size_sum{selector}[{window}]))",
        "latency_p50": quantile(0.5, "te_request_duration"),
        "latency_p95": quantile(0.95, "te_request_duration"),
        "queue_time_p95": quantile(0.95, "te_request_queue_duration"),
    }


BY_POD = "by (namespace, pod)"


def fleet_queries(selector: str, window: str) -> dict[str, str]:
    """The PromQL for each signal of all pods `selector` matches, one series per (namespace, pod) (and `le`)."""
    def buckets(name: str) -> str:
        return f"sum by (namespace, pod, le) (rate({name}_bucket{selector}[{window}]))"

    return {
        "scraped": f"count {BY_POD} (up{selector} == 1)",
        "sampled_at": f"max {BY_POD} (timestamp(up{selector}))",
        "request_rate": f"sum {BY_POD} (rate(te_request_count{selector}[{window}]))",
        "success_rate": f"sum {BY_POD} (rate(te_request_success{selector}[{window}]))",
        "failure_rate": f"sum {BY_POD} (rate(te_request_failure{selector}[{window}]))",
        "queue_size": f"sum {BY_POD} (te_queue_size{selector})",
        "pair_rate": f"sum {BY_POD} (rate(te_batch_next_size_sum{selector}[{window}]))",
        "duration": buckets("te_request_duration"),
        "queue_duration": buckets("te_request_queue_duration"),
    }


def http_post(url: str, data: bytes, timeout: float) -> bytes:
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/x-www-form-urlencoded"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body: bytes = response.read()
        return body


@dataclass
class PrometheusSource:
    url: str
    window: str = "1m"
    timeout_seconds: float = 5.0
    gpu_memory_used_query: str | None = None
    gpu_memory_total_query: str | None = None
    post: Post = http_post
    clock: Callable[[], float] = time.time

    # --- the fleet: one query per signal for every model --------------------------------------------------------

    def collect_many(self, requests: Mapping[ModelKey, ModelPods]) -> dict[ModelKey, Signals]:
        """Per-pool signals of every requested model from one instant query per signal (see the module docstring).

        Pools without ready replicas need no query; when no pool needs one, nothing is asked.
        """
        needed = [(key, pool) for key, model in requests.items() for pool in _POOLS
                  if model.pools.get(pool, (0, ()))[0] > 0]
        answers: dict[str, list[Series] | QueryError] = {}
        memory: list[Series] | QueryError | None = None
        if needed:
            selector = fleet_selector((requests[key].namespace, pod) for key, pool in needed
                                      for pod in requests[key].pools[pool][1])
            for name, promql in fleet_queries(selector, self.window).items():
                answers[name] = self._try(promql)
            memory_query = self._gpu_memory_query(selector, by=BY_POD)
            if memory_query is not None and any(pool == "gpu" for _, pool in needed):
                memory = self._try(memory_query)
        by_pod = {name: _by_pod(answer) for name, answer in answers.items() if not isinstance(answer, QueryError)}
        buckets = {name: _buckets_by_pod(answer) for name, answer in answers.items()
                   if name in ("duration", "queue_duration") and not isinstance(answer, QueryError)}
        memory_by_pod = _by_pod(memory) if isinstance(memory, list) else {}
        result = {}
        for key, model in requests.items():
            pools = {}
            for pool in _POOLS:
                ready, names = model.pools.get(pool, (0, ()))
                if ready <= 0:
                    pools[pool] = PoolSignals(ready_replicas=ready)
                    continue
                failed = [a for a in answers.values() if isinstance(a, QueryError)]
                if pool == "gpu" and isinstance(memory, QueryError):
                    failed.append(memory)
                if failed:
                    pools[pool] = PoolSignals(ready_replicas=ready, error=str(failed[0])[:300])
                    continue
                pods = [(model.namespace, name) for name in names]
                gpu_memory = None
                if pool == "gpu" and memory is not None:
                    gpu_memory = _max(v for ns, pod in pods
                                      for v in memory_by_pod.get((ns, pod)) or memory_by_pod.get(("", pod), []))
                pools[pool] = _fleet_pool(ready, pods, by_pod, buckets, gpu_memory)
            result[key] = Signals(gpu=pools["gpu"], cpu=pools["cpu"])
        return result

    def _try(self, promql: str) -> list[Series] | QueryError:
        try:
            return self.query_vector(promql)
        except QueryError as exc:
            return exc

    # --- one model: 9 queries per pool --------------------------------------------------------------------------

    def collect(self, selectors: Mapping[Pool, str], ready: Mapping[Pool, int]) -> Signals:
        """Per-pool signals of one model, each pool by its own selector (any label selector)."""
        pools = {}
        for pool in _POOLS:
            pools[pool] = self._pool(pool, selectors.get(pool), ready.get(pool, 0))
        return Signals(gpu=pools["gpu"], cpu=pools["cpu"])

    def query(self, promql: str) -> float | None:
        """Value of an instant query that yields one sample (the first if several); None when empty or NaN."""
        result = self.query_vector(promql)
        if not result:
            return None
        value = result[0][1]
        return None if math.isnan(value) or math.isinf(value) else value

    def query_vector(self, promql: str) -> list[Series]:
        """All series of an instant query (a scalar reads as one series without labels); one HTTP POST."""
        url = f"{self.url.rstrip('/')}/api/v1/query"
        data = urllib.parse.urlencode({"query": promql}).encode()
        try:
            body = json.loads(self.post(url, data, self.timeout_seconds))
            if not isinstance(body, dict):
                raise ValueError(f"not an API response: {str(body)[:80]}")
            if body.get("status") != "success":
                raise QueryError(f"{promql[:200]}: {body.get('errorType')}: {body.get('error')}")
            series = _series(body.get("data") or {})
        except QueryError:
            operator_metrics.PROMQL_QUERIES.labels("error").inc()
            raise
        except (OSError, urllib.error.URLError, ValueError, KeyError, TypeError, IndexError) as exc:
            operator_metrics.PROMQL_QUERIES.labels("error").inc()
            raise QueryError(f"{self.url}: {exc}") from exc
        operator_metrics.PROMQL_QUERIES.labels("ok").inc()
        return series

    def _pool(self, pool: Pool, selector: str | None, ready: int) -> PoolSignals:
        if ready <= 0 or selector is None:
            return PoolSignals(ready_replicas=ready)
        try:
            values = {key: self.query(promql) for key, promql in queries(selector, self.window).items()}
            memory_query = self._gpu_memory_query(selector) if pool == "gpu" else None
            memory = None if memory_query is None else self.query(memory_query)
        except QueryError as exc:
            return PoolSignals(ready_replicas=ready, error=str(exc)[:300])
        scraped = int(values["scraped"] or 0)
        if scraped == 0:
            return PoolSignals(ready_replicas=ready, error=NO_SCRAPE)
        # Absent counters (TEI creates them on first use) of pods that are being scraped mean zero.
        return PoolSignals(
            ready_replicas=ready,
            scraped_replicas=scraped,
            request_rate=values["request_rate"] or 0.0,
            success_rate=values["success_rate"] or 0.0,
            failure_rate=values["failure_rate"] or 0.0,
            queue_size=values["queue_size"] or 0.0,
            latency_p50_ms=_ms(values["latency_p50"]),
            latency_p95_ms=_ms(values["latency_p95"]),
            queue_time_p95_ms=_ms(values["queue_time_p95"]),
            pair_rate=values["pair_rate"] or 0.0,
            gpu_memory_fraction=memory,
            sampled_at=values["sampled_at"],
        )

    def _gpu_memory_query(self, selector: str, by: str = "") -> str | None:
        """The platform's GPU-memory PromQL (class or operator setting, one for many models): ``$selector`` in it
        becomes the pool's ``{namespace="...",pod=~"..."}`` (or the fleet's), so one query serves every model."""
        if not (self.gpu_memory_used_query and self.gpu_memory_total_query):
            return None
        used = self.gpu_memory_used_query.replace(SELECTOR_PLACEHOLDER, selector)
        total = self.gpu_memory_total_query.replace(SELECTOR_PLACEHOLDER, selector)
        return f"max{' ' + by + ' ' if by else ''}(({used}) / ({total}))"


NO_SCRAPE = "Prometheus has no successful scrape of this pool"


def _series(data: Mapping[str, Any]) -> list[Series]:
    result = data.get("result")
    if data.get("resultType") == "scalar":
        return [({}, float(result[1]))] if result else []
    return [(dict(item.get("metric") or {}), float(item["value"][1])) for item in result or ()]


def _by_pod(series: Iterable[Series]) -> dict[tuple[str, str], list[float]]:
    """Finite values per (namespace, pod) label pair; a series without `pod` belongs to no pod."""
    found: dict[tuple[str, str], list[float]] = {}
    for labels, value in series:
        if "pod" in labels and math.isfinite(value):
            found.setdefault((labels.get("namespace", ""), labels["pod"]), []).append(value)
    return found


def _buckets_by_pod(series: Iterable[Series]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(upper bound, rate) per (namespace, pod) from `sum by (namespace, pod, le)` series."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for labels, value in series:
        try:
            bound = float(labels["le"])
        except (KeyError, ValueError):
            continue
        if "pod" in labels and not math.isnan(value):
            found.setdefault((labels.get("namespace", ""), labels["pod"]), []).append((bound, value))
    return found


def _fleet_pool(ready: int, pods: list[tuple[str, str]], by_pod: Mapping[str, Mapping[tuple[str, str], list[float]]],
                buckets: Mapping[str, Mapping[tuple[str, str], list[tuple[float, float]]]],
                gpu_memory: float | None) -> PoolSignals:
    """One pool's signals from the fleet queries' per-pod series, as `collect` would have them from its own."""
    def values(name: str) -> list[float]:
        return [v for pod in pods for v in by_pod[name].get(pod, ())]

    def summed(name: str) -> exposition.Histogram:
        by_le: dict[float, float] = {}  # sum by (le) over the pool's pods
        for pod in pods:
            for bound, rate in buckets[name].get(pod, ()):
                by_le[bound] = by_le.get(bound, 0.0) + rate
        return exposition.Histogram(by_le, by_le.get(math.inf, 0.0), 0.0)

    def quantile(q: float, name: str) -> float | None:
        return _ms(exposition.quantile(q, summed(name)))

    scraped = int(sum(values("scraped")))
    if scraped == 0:
        return PoolSignals(ready_replicas=ready, error=NO_SCRAPE)
    return PoolSignals(
        ready_replicas=ready,
        scraped_replicas=scraped,
        request_rate=sum(values("request_rate")),
        success_rate=sum(values("success_rate")),
        failure_rate=sum(values("failure_rate")),
        queue_size=sum(values("queue_size")),
        latency_p50_ms=quantile(0.5, "duration"),
        latency_p95_ms=quantile(0.95, "duration"),
        queue_time_p95_ms=quantile(0.95, "queue_duration"),
        pair_rate=sum(values("pair_rate")),
        latency=summed("duration"),
        gpu_memory_fraction=gpu_memory,
        sampled_at=_max(values("sampled_at")),
    )


def _max(values: Iterable[float]) -> float | None:
    return max(values, default=None)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
