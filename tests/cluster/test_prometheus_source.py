"""The PromQL source against a real Prometheus (Debian's `prometheus` package) scraping fake TEI pods.

Each fake pod is a local HTTP server whose te_* counters grow at a rate the test sets, with every request taking
0.2 s, so the expected signals follow from the setup, not from the code under test:
- request rate: 2 GPU pods x 10 requests/s = 20/s;
- p95 latency: all observations in the (0.1, 0.25] bucket -> 0.1 + 0.15 x 0.95 = 0.2425 s;
- queue: 3 + 5 = 8; GPU memory: 30000 / (30000 + 10000) = 0.75 on each pod (DCGM-style used/free series).
The CPU pod's server is stopped, so the CPU pool must read as missing (an error), never as idle.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from rerank_devcluster.processes import free_port
from rerank_devcluster.prometheus_server import PrometheusServer
from rerank_operator.adapters.prometheus_api import ModelPods, PrometheusSource
from rerank_operator.core.autoscale.signals import Signals

pytestmark = pytest.mark.prometheus

RATE_PER_POD = 10.0


class FakeTei:
    """A /metrics endpoint whose counters grow linearly from its start time."""

    def __init__(self, queue: float) -> None:
        self.started = time.time()
        self.queue = queue
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name is http.server's API
                body = owner.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def render(self) -> str:
        n = RATE_PER_POD * (time.time() - self.started)
        return "\n".join([
            "# TYPE te_request_count counter", f'te_request_count{{method="single"}} {n}',
            "# TYPE te_request_success counter", f'te_request_success{{method="single"}} {n}',
            "# TYPE te_queue_size gauge", f"te_queue_size {self.queue}",
            "# TYPE te_request_duration histogram",
            'te_request_duration_bucket{le="0.1"} 0', f'te_request_duration_bucket{{le="0.25"}} {n}',
            f'te_request_duration_bucket{{le="1"}} {n}', f'te_request_duration_bucket{{le="+Inf"}} {n}',
            f"te_request_duration_sum {0.2 * n}", f"te_request_duration_count {n}",
            "# TYPE DCGM_FI_DEV_FB_USED gauge", "DCGM_FI_DEV_FB_USED 30000",
            "# TYPE DCGM_FI_DEV_FB_FREE gauge", "DCGM_FI_DEV_FB_FREE 10000", "",
        ])

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def scrape_config(targets: dict[str, tuple[str, int]]) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
        "scrape_configs": [{"job_name": "tei", "static_configs": [
            {"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": "test", "pod": pod, "pool": pool}}
            for pod, (pool, port) in targets.items()]}],
    }


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, dict[str, FakeTei]]]:
    pods = {"m-gpu-0": FakeTei(3), "m-gpu-1": FakeTei(5), "m-cpu-0": FakeTei(1)}
    targets = {name: ("gpu" if "gpu" in name else "cpu", pod.port) for name, pod in pods.items()}
    pods["m-cpu-0"].stop()                                   # the CPU pool's metrics endpoint is down
    try:
        with PrometheusServer(tmp_path / "prometheus", scrape_config(targets)) as server:
            yield server.url, pods
    finally:
        for pod in pods.values():
            if pod is not pods["m-cpu-0"]:
                pod.stop()


def test_prometheus_source_reads_pool_signals_from_a_real_prometheus(prometheus):
    """Both paths against the same server: one model by label selectors, and the fleet's batched queries by pod name
    (what the autoscaler runs), each must read the setup's figures."""
    url, _ = prometheus
    source = PrometheusSource(
        url, window="10s",
        gpu_memory_used_query="DCGM_FI_DEV_FB_USED$selector",
        gpu_memory_total_query="DCGM_FI_DEV_FB_USED$selector + DCGM_FI_DEV_FB_FREE$selector")
    selectors = {"gpu": '{namespace="test",pool="gpu"}', "cpu": '{namespace="test",pool="cpu"}'}
    fleet = {("test", "m"): ModelPods("test", {"gpu": (2, ("m-gpu-0", "m-gpu-1")), "cpu": (1, ("m-cpu-0",))})}

    def read() -> list[Signals]:
        return [source.collect(selectors, {"gpu": 2, "cpu": 1}), source.collect_many(fleet)[("test", "m")]]

    def settled(signals: Signals) -> bool:
        gpu = signals.gpu
        return (gpu.scraped_replicas == 2 and gpu.request_rate is not None and
                abs(gpu.request_rate - 2 * RATE_PER_POD) < 1 and gpu.latency_p95_ms is not None)

    deadline = time.time() + 45
    while True:
        both = read()
        if all(settled(s) for s in both) or time.time() > deadline:
            break
        time.sleep(1)
    for signals in both:
        gpu = signals.gpu
        assert gpu.error is None, gpu.error
        assert gpu.scraped_replicas == 2
        assert gpu.request_rate == pytest.approx(2 * RATE_PER_POD, rel=0.05)
        assert gpu.success_rate == pytest.approx(2 * RATE_PER_POD, rel=0.05)
        assert gpu.failure_rate == 0.0
        assert gpu.latency_p95_ms == pytest.approx(242.5, rel=0.01)
        assert gpu.latency_p50_ms == pytest.approx(100 + 150 * 0.5, rel=0.01)
        assert gpu.queue_size == 8
        assert gpu.gpu_memory_fraction == pytest.approx(0.75)
        assert gpu.sampled_at is not None and time.time() - gpu.sampled_at < 5
        assert gpu.staleness(time.time(), 60) is None
        cpu = signals.cpu
        assert cpu.error is not None and cpu.staleness(time.time(), 60) is not None


def test_unreachable_prometheus_reads_as_missing():
    source = PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout_seconds=1)
    gpu = source.collect({"gpu": "{}"}, {"gpu": 1, "cpu": 0}).gpu
    assert gpu.error is not None and gpu.staleness(time.time(), 60) is not None
