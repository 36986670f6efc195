"""The direct source (fake and real HTTP) and the Prometheus source's query handling (fake HTTP API)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from rerank_operator.adapters import tei_scrape as direct
from rerank_operator.adapters.prometheus_api import PrometheusSource, build_selector
from rerank_operator.adapters.tei_scrape import ModelTargets, PodTarget, ScrapePool
from rerank_operator.core.autoscale.signals import Signals


def one_model(pool: ScrapePool, targets: list[PodTarget], ready: dict[Any, int]) -> Signals:
    """The shared scrape pool asked for one model's pods, as the autoscaler's fleet loop asks for each."""
    key = ("ns", "m")
    return pool.collect({key: ModelTargets(tuple(targets), dict(ready))}, deadline_seconds=5.0)[key]


def tei_text(count: float, success: float, failure: float, queue: float, buckets: dict[str, float]) -> str:
    lines = [f'te_request_count{{method="single"}} {count}', f'te_request_success{{method="single"}} {success}',
             f'te_request_failure{{err="overloaded"}} {failure}', f"te_queue_size {queue}"]
    lines += [f'te_request_duration_bucket{{le="{le}"}} {n}' for le, n in buckets.items()]
    lines += [f"te_request_duration_count {buckets['+Inf']}", "te_request_duration_sum 1"]
    return "\n".join(lines) + "\n"


SCRAPES = {  # (pod, scrape number) -> body
    ("a", 1): tei_text(100, 90, 1, 2, {"0.1": 50, "0.5": 90, "+Inf": 100}),
    ("a", 2): tei_text(250, 225, 4, 6, {"0.1": 80, "0.5": 200, "+Inf": 250}),
    ("b", 1): tei_text(0, 0, 0, 0, {"0.1": 0, "0.5": 0, "+Inf": 0}),
    ("b", 2): tei_text(150, 150, 0, 10, {"0.1": 0, "0.5": 120, "+Inf": 150}),
}
TARGETS = [PodTarget("a", "gpu", "10.0.0.1", 80), PodTarget("b", "gpu", "10.0.0.2", 80)]


class FakePods:
    def __init__(self) -> None:
        self.scrape = 1
        self.now = 100.0
        self.down: set[str] = set()

    def fetch(self, url: str, timeout: float) -> str:
        pod = {"10.0.0.1:80": "a", "10.0.0.2:80": "b"}[url.split("/")[2]]
        if pod in self.down:
            raise OSError("connection refused")
        return SCRAPES[(pod, self.scrape)]


def test_direct_source_aggregates_two_scrapes_per_pool():
    pods = FakePods()
    source = ScrapePool(fetch=pods.fetch, clock=lambda: pods.now)
    first = one_model(source, TARGETS, {"gpu": 2, "cpu": 0})
    assert first.gpu.request_rate is None and first.gpu.queue_size == 2   # one scrape: gauge only
    pods.scrape, pods.now = 2, 115.0
    gpu = one_model(source, TARGETS, {"gpu": 2, "cpu": 0}).gpu
    # a: +150 requests, b: +150 in 15 s -> 20/s; successes +135 and +150 -> 19/s; failures +3 -> 0.2/s.
    assert gpu.request_rate == pytest.approx(20) and gpu.success_rate == pytest.approx(19)
    assert gpu.failure_rate == pytest.approx(0.2)
    assert gpu.queue_size == 16 and gpu.queue_per_replica == 8 and gpu.sampled_at == 115.0
    # Summed deltas: <=0.1: 30, <=0.5: 230, all: 300. p50 rank 150 -> 0.1 + 0.4 * 120 / 200 = 0.34 s;
    # p95 rank 285 is above 0.5 -> highest finite bound, 0.5 s.
    assert gpu.latency_p50_ms == pytest.approx(340) and gpu.latency_p95_ms == pytest.approx(500)
    assert gpu.staleness(115.0, 60) is None


def test_direct_source_reports_a_pool_whose_pods_do_not_answer():
    pods = FakePods()
    pods.down = {"a", "b"}
    gpu = one_model(ScrapePool(fetch=pods.fetch, clock=lambda: pods.now), TARGETS, {"gpu": 2}).gpu
    assert gpu.error and "connection refused" in gpu.error
    assert gpu.staleness(100.0, 60) is not None


def test_direct_source_scrapes_real_http_at_the_address_it_is_given():
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name is http.server's API
            body = SCRAPES[("b", 2)].encode() if self.path == "/metrics" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        local = {"b": f"127.0.0.1:{server.server_address[1]}"}
        source = ScrapePool(timeout_seconds=2, address_of=lambda t: local.get(t.name, direct.pod_address(t)))
        cpu = one_model(source, [PodTarget("b", "cpu", "10.255.255.1", 80)], {"gpu": 0, "cpu": 1}).cpu
        assert cpu.error is None and cpu.scraped_replicas == 1 and cpu.queue_size == 10
    finally:
        server.shutdown()


def test_selector_escapes_pod_names():
    assert build_selector("ns", ["m-cpu-1.a", "m-cpu-0"]) == r'{namespace="ns",pod=~"m\\-cpu\\-0|m\\-cpu\\-1\\.a"}'
    assert build_selector("ns", []) == '{namespace="ns",pod=~"$^"}'


def fake_api(answers: dict[str, object]):
    """A Prometheus HTTP API answering instant queries by the start of their PromQL."""
    asked: list[str] = []

    def post(url: str, data: bytes, timeout: float) -> bytes:
        assert url == "http://prom:9090/api/v1/query"
        query = urllib.parse.parse_qs(data.decode())["query"][0]
        asked.append(query)
        for prefix, value in answers.items():
            if query.startswith(prefix):
                result = [] if value is None else [{"metric": {}, "value": [1.0, str(value)]}]
                return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}}).encode()

    return post, asked


def test_prometheus_source_maps_queries_to_signals():
    post, asked = fake_api({"count(up": 2, "max(timestamp(up": 990.0, "sum(rate(te_request_count": 12.5,
                           "sum(te_queue_size": 7, "histogram_quantile(0.95, sum by (le) (rate(te_request_duration":
                           0.3, "histogram_quantile(0.5, sum by (le) (rate(te_request_duration": "NaN",
                           "max((used)": 0.42})
    source = PrometheusSource("http://prom:9090/", post=post, gpu_memory_used_query="used",
                              gpu_memory_total_query="total")
    signals = source.collect({"gpu": '{pool="gpu"}'}, {"gpu": 2, "cpu": 0})
    gpu = signals.gpu
    assert (gpu.scraped_replicas, gpu.sampled_at, gpu.request_rate, gpu.queue_size) == (2, 990.0, 12.5, 7)
    assert gpu.latency_p95_ms == pytest.approx(300) and gpu.latency_p50_ms is None
    assert gpu.success_rate == 0.0 and gpu.failure_rate == 0.0        # absent counters of scraped pods
    assert gpu.gpu_memory_fraction == 0.42
    assert all('{pool="gpu"}' in q for q in asked if "used" not in q)
    assert signals.cpu.ready_replicas == 0 and signals.cpu.error is None


def test_prometheus_source_without_successful_scrapes_is_missing_not_idle():
    post, _ = fake_api({"count(up": None})
    gpu = PrometheusSource("http://prom:9090", post=post).collect({"gpu": "{}"}, {"gpu": 1}).gpu
    assert gpu.error and gpu.staleness(0, 60) is not None


def test_prometheus_source_reports_an_unreachable_server():
    def post(url: str, data: bytes, timeout: float) -> bytes:
        raise OSError("connection refused")

    gpu = PrometheusSource("http://prom:9090", post=post).collect({"gpu": "{}"}, {"gpu": 1}).gpu
    assert gpu.error and "connection refused" in gpu.error


def test_platform_gpu_memory_queries_get_each_pools_selector():
    """The GPU-memory PromQL is the platform's (one per class or operator), so ``$selector`` makes it per model."""
    post, asked = fake_api({"count(up": 1, "max((sum(used{": 0.5})
    source = PrometheusSource("http://prom:9090", post=post, gpu_memory_used_query="sum(used$selector)",
                              gpu_memory_total_query="sum(total$selector)")
    gpu = source.collect({"gpu": '{namespace="a",pod=~"m-gpu-1"}'}, {"gpu": 1}).gpu
    assert gpu.gpu_memory_fraction == 0.5
    [memory] = [q for q in asked if "used" in q]
    assert 'sum(used{namespace="a",pod=~"m-gpu-1"})' in memory and 'sum(total{namespace="a",pod=~"m-gpu-1"})' in memory
