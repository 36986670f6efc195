"""The PromQL source: the same per-pool signals from a Prometheus server's HTTP API (/api/v1/query).

Pools are told apart by a label selector per pool (for the usual Kubernetes scrape configs:
`build_selector(namespace, pod_names)` gives `{namespace="ns",pod=~"a|b"}`). Freshness comes from the scrape
job's own `up` series: its timestamp is the last scrape, and `up == 1` counts pods that answered, so a pool
whose targets are down, or that Prometheus no longer scrapes, reads as missing rather than as idle.
GPU memory (optional) is `max((used) / (total))` over the two queries from the spec, e.g. DCGM's
`DCGM_FI_DEV_FB_USED{...}` and `DCGM_FI_DEV_FB_USED{...} + DCGM_FI_DEV_FB_FREE{...}`.
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

from rerank_operator.core.autoscale.config import Pool
from rerank_operator.core.autoscale.signals import PoolSignals, Signals

Get = Callable[[str, float], bytes]


class QueryError(RuntimeError):
    """Prometheus did not answer, or answered with an error."""


#: Replaced in the GPU-memory queries by the pool's selector (``build_selector``).
SELECTOR_PLACEHOLDER = "$selector"


def build_selector(namespace: str, pod_names: Iterable[str]) -> str:
    """`{namespace="ns",pod=~"p1|p2"}` with regex metacharacters in names escaped."""
    pods = "|".join(re.escape(name) for name in sorted(pod_names)) or "$^"  # matches nothing
    return f'{{namespace="{_quote(namespace)}",pod=~"{_quote(pods)}"}}'


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
        "latency_p50": quantile(0.5, "te_request_duration"),
        "latency_p95": quantile(0.95, "te_request_duration"),
        "queue_time_p95": quantile(0.95, "te_request_queue_duration"),
    }


def http_get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


@dataclass
class PrometheusSource:
    url: str
    window: str = "1m"
    timeout_seconds: float = 5.0
    gpu_memory_used_query: str | None = None
    gpu_memory_total_query: str | None = None
    get: Get = http_get
    clock: Callable[[], float] = time.time

    def collect(self, selectors: Mapping[Pool, str], ready: Mapping[Pool, int]) -> Signals:
        pools = {}
        for pool in ("gpu", "cpu"):
            pools[pool] = self._pool(pool, selectors.get(pool), ready.get(pool, 0))
        return Signals(gpu=pools["gpu"], cpu=pools["cpu"])

    def query(self, promql: str) -> float | None:
        """Value of an instant query that yields one sample (the first if several); None when empty or NaN."""
        url = f"{self.url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            body = json.loads(self.get(url, self.timeout_seconds))
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise QueryError(f"{self.url}: {exc}") from exc
        if body.get("status") != "success":
            raise QueryError(f"{promql}: {body.get('errorType')}: {body.get('error')}")
        data = body.get("data", {})
        result = data.get("result")
        if data.get("resultType") == "scalar":
            result = [{"value": result}]
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) or math.isinf(value) else value

    def _pool(self, pool: Pool, selector: str | None, ready: int) -> PoolSignals:
        if ready <= 0 or selector is None:
            return PoolSignals(ready_replicas=ready)
        try:
            values = {key: self.query(promql) for key, promql in queries(selector, self.window).items()}
            memory = self._gpu_memory(selector) if pool == "gpu" else None
        except QueryError as exc:
            return PoolSignals(ready_replicas=ready, error=str(exc)[:300])
        scraped = int(values["scraped"] or 0)
        if scraped == 0:
            return PoolSignals(ready_replicas=ready, error="Prometheus has no successful scrape of this pool")
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
            gpu_memory_fraction=memory,
            sampled_at=values["sampled_at"],
        )

    def _gpu_memory(self, selector: str) -> float | None:
        """The platform's GPU-memory PromQL (class or operator setting, one for many models): ``$selector`` in it
        becomes this pool's ``{namespace="...",pod=~"..."}``, so one query serves every model."""
        if not (self.gpu_memory_used_query and self.gpu_memory_total_query):
            return None
        used = self.gpu_memory_used_query.replace(SELECTOR_PLACEHOLDER, selector)
        total = self.gpu_memory_total_query.replace(SELECTOR_PLACEHOLDER, selector)
        return self.query(f"max(({used}) / ({total}))")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
