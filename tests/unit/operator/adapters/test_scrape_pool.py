"""The fleet's direct source, ``ScrapePool``: one executor for every model, a deadline per call, backoff per pod.

Fake pods answer from a table; hanging ones block on a ``threading.Event`` that the test releases at the end. The
assertions are on what each call returns and how often each pod was asked, never on how fast: the one bound on
time is a generous ceiling that only a call blocking on a hung pod would exceed.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from rerank_operator.adapters.tei_scrape import ModelTargets, PodTarget, ScrapePool
from rerank_operator.core.autoscale.config import Pool

A = ("team-a", "model")
B = ("team-b", "model")
SLACK = 20.0  # far above any deadline below: only a call that waits for a hung pod gets near it


def body(count: float, queue: float = 0.0) -> str:
    """A TEI /metrics body: `count` requests, all in the (0.1, 0.5] latency bucket."""
    return (f"te_request_count {count}\nte_request_success {count}\nte_queue_size {queue}\n"
            f'te_request_duration_bucket{{le="0.1"}} 0\nte_request_duration_bucket{{le="0.5"}} {count}\n'
            f'te_request_duration_bucket{{le="+Inf"}} {count}\nte_request_duration_count {count}\n'
            f"te_request_duration_sum {0.3 * count}\n")


class Pods:
    """Fake pods by IP: a counter each (`count`), or failing (`down`), or hanging until `release` is set."""

    def __init__(self) -> None:
        self.count: dict[str, float] = {}
        self.down: set[str] = set()
        self.hang: set[str] = set()
        self.release = threading.Event()
        self.calls: Counter[str] = Counter()
        self.threads: set[str] = set()
        self.now = 1000.0
        self.lock = threading.Lock()

    def fetch(self, url: str, timeout: float) -> str:
        ip = url.split("/")[2].split(":")[0]
        with self.lock:
            self.calls[ip] += 1
            self.threads.add(threading.current_thread().name)
        if ip in self.hang:
            self.release.wait(60)  # released by the test's teardown at the latest
        if ip in self.down:
            raise OSError("connection refused")
        return body(self.count.get(ip, 0.0))

    def clock(self) -> float:
        return self.now


@pytest.fixture
def pods() -> Iterator[Pods]:
    fake = Pods()
    yield fake
    fake.release.set()


def request(*targets: PodTarget) -> ModelTargets:
    ready: dict[Pool, int] = {}
    for t in targets:
        ready[t.pool] = ready.get(t.pool, 0) + 1
    return ModelTargets(tuple(targets), ready)


def gpu(name: str, ip: str) -> PodTarget:
    return PodTarget(name, "gpu", ip, 80)


def test_all_pods_of_all_models_are_scraped_together_on_one_persistent_pool(pods: Pods) -> None:
    # Four pods meet at a barrier: the scrapes succeed only if all four run at once.
    barrier = threading.Barrier(4, timeout=SLACK)
    plain = pods.fetch

    def fetch(url: str, timeout: float) -> str:
        barrier.wait()
        return plain(url, timeout)

    scraper = ScrapePool(max_workers=4, fetch=fetch, clock=pods.clock)
    try:
        models = {A: request(gpu("m-gpu-0", "10.0.0.1"), gpu("m-gpu-1", "10.0.0.2")),
                  B: request(gpu("m-gpu-0", "10.0.1.1"), PodTarget("m-cpu-0", "cpu", "10.0.1.2", 80))}
        for _ in range(3):
            pods.now += 5
            out = scraper.collect(models, deadline_seconds=SLACK)
            assert out[A].gpu.scraped_replicas == 2 and out[A].gpu.error is None
            assert out[B].gpu.scraped_replicas == 1 and out[B].cpu.scraped_replicas == 1
        assert sum(pods.calls.values()) == 12
        # The same (at most four) worker threads served every call: one executor, not one per call.
        assert len(pods.threads) <= 4 and all(name.startswith("tei-scrape") for name in pods.threads)
    finally:
        scraper.close()


def test_a_hanging_pod_costs_its_model_an_error_and_never_delays_another_model(pods: Pods) -> None:
    pods.hang.add("10.0.0.9")
    pods.count.update({"10.0.0.1": 100.0, "10.0.1.1": 50.0})
    scraper = ScrapePool(max_workers=4, fetch=pods.fetch, clock=pods.clock)
    models = {A: request(gpu("m-gpu-0", "10.0.0.1"), gpu("m-gpu-1", "10.0.0.9")),
              B: request(gpu("m-gpu-0", "10.0.1.1"))}
    try:
        started = time.monotonic()
        first = scraper.collect(models, deadline_seconds=0.5)
        assert time.monotonic() - started < SLACK  # the hung pod waits until the end of the test
        assert first[B].gpu.error is None and first[B].gpu.scraped_replicas == 1
        assert first[A].gpu.error is None and first[A].gpu.scraped_replicas == 1  # the other pod answered

        # Model A with only its hung pod: an error; its scrape still runs, so it is not asked again.
        only_hung = {A: request(gpu("m-gpu-1", "10.0.0.9")), B: models[B]}
        pods.now += 10
        pods.count["10.0.1.1"] = 150.0
        second = scraper.collect(only_hung, deadline_seconds=0.5)
        assert time.monotonic() - started < 2 * SLACK
        assert second[A].gpu.error and "no answer within 0.5s" in second[A].gpu.error
        assert second[B].gpu.request_rate == pytest.approx(10.0)  # (150 - 50) / 10 s
        assert pods.calls["10.0.0.9"] == 1 and pods.calls["10.0.1.1"] == 2

        # Released, its answer arrives (this tick or the next) and the pod is asked afresh.
        pods.release.set()
        pods.now += 10
        third = scraper.collect(only_hung, deadline_seconds=SLACK)
        assert third[A].gpu.error is None and third[A].gpu.scraped_replicas == 1
    finally:
        pods.release.set()
        scraper.close()


def test_scrapes_still_queued_at_the_deadline_are_cancelled_and_asked_again(pods: Pods) -> None:
    pods.hang.add("10.0.0.9")
    scraper = ScrapePool(max_workers=1, fetch=pods.fetch, clock=pods.clock)
    models = {A: request(gpu("m-gpu-0", "10.0.0.9")), B: request(gpu("m-gpu-0", "10.0.1.1"))}
    try:
        first = scraper.collect(models, deadline_seconds=0.3)  # B waits behind A's hung scrape on the one worker
        assert first[B].gpu.error and "scrape pool busy" in first[B].gpu.error
        assert pods.calls["10.0.1.1"] == 0
        pods.release.set()
        pods.now += 5
        second = scraper.collect(models, deadline_seconds=SLACK)
        assert second[B].gpu.error is None and pods.calls["10.0.1.1"] == 1
    finally:
        pods.release.set()
        scraper.close()


def test_a_failing_pod_backs_off_exponentially_without_requests_and_recovers(pods: Pods) -> None:
    pods.down.add("10.0.0.1")
    scraper = ScrapePool(fetch=pods.fetch, clock=pods.clock, backoff_max_seconds=5)
    model = {A: request(gpu("m-gpu-0", "10.0.0.1"))}

    def tick(at: float) -> str:
        pods.now = at
        return scraper.collect(model, deadline_seconds=SLACK)[A].gpu.error or ""

    try:
        assert "connection refused" in tick(0.0) and pods.calls["10.0.0.1"] == 1      # next try at 2
        assert "backing off after 1 failed" in tick(1.9) and pods.calls["10.0.0.1"] == 1
        assert "connection refused" in tick(2.0) and pods.calls["10.0.0.1"] == 2      # next try at 2 + 4
        assert "backing off after 2 failed" in tick(5.9) and pods.calls["10.0.0.1"] == 2
        assert "connection refused" in tick(6.0) and pods.calls["10.0.0.1"] == 3      # 8 s, capped at 5: at 11
        assert "backing off" in tick(10.9) and pods.calls["10.0.0.1"] == 3
        assert "connection refused" in tick(11.0) and pods.calls["10.0.0.1"] == 4     # capped again: at 16
        pods.down.clear()
        assert "backing off" in tick(15.9) and pods.calls["10.0.0.1"] == 4
        assert tick(16.0) == "" and pods.calls["10.0.0.1"] == 5                       # success resets
        pods.down.add("10.0.0.1")
        assert "connection refused" in tick(16.5) and pods.calls["10.0.0.1"] == 6     # asked at once again
        assert "backing off after 1 failed" in tick(17.0)                             # and back to 2 s
    finally:
        scraper.close()


def test_rates_come_from_two_ticks_per_pod_keyed_by_namespace(pods: Pods) -> None:
    # Same pod name in two namespaces: two pods, each with its own previous scrape.
    scraper = ScrapePool(fetch=pods.fetch, clock=pods.clock)
    models = {A: request(gpu("m-gpu-0", "10.0.0.1"), gpu("m-gpu-1", "10.0.0.2")),
              B: request(gpu("m-gpu-0", "10.0.1.1"))}
    try:
        pods.count.update({"10.0.0.1": 100.0, "10.0.0.2": 0.0, "10.0.1.1": 1000.0})
        first = scraper.collect(models, deadline_seconds=SLACK)
        assert first[A].gpu.request_rate is None and first[B].gpu.request_rate is None  # one scrape: no rate yet
        pods.now += 10
        pods.count.update({"10.0.0.1": 250.0, "10.0.0.2": 50.0, "10.0.1.1": 1020.0})
        second = scraper.collect(models, deadline_seconds=SLACK)
        assert second[A].gpu.request_rate == pytest.approx(20.0)  # (150 + 50) / 10 s
        assert second[B].gpu.request_rate == pytest.approx(2.0)   # 20 / 10 s
        assert second[A].gpu.latency_p95_ms == pytest.approx(100 + 400 * 0.95)
        assert second[A].gpu.sampled_at == pods.now
        # A model left out of a call keeps its state: B's next rate spans both intervals.
        pods.now += 10
        pods.count["10.0.0.1"] = 350.0
        scraper.collect({A: models[A]}, deadline_seconds=SLACK)
        pods.now += 10
        pods.count["10.0.1.1"] = 1080.0
        assert scraper.collect({B: models[B]}, deadline_seconds=SLACK)[B].gpu.request_rate == pytest.approx(3.0)
    finally:
        scraper.close()


def test_pods_a_model_drops_and_forgotten_models_start_over(pods: Pods) -> None:
    scraper = ScrapePool(fetch=pods.fetch, clock=pods.clock)
    both = request(gpu("m-gpu-0", "10.0.0.1"), gpu("m-gpu-1", "10.0.0.2"))
    one = request(gpu("m-gpu-0", "10.0.0.1"))
    try:
        scraper.collect({A: both}, deadline_seconds=SLACK)
        pods.now += 5
        assert scraper.collect({A: both}, deadline_seconds=SLACK)[A].gpu.request_rate is not None
        pods.now += 5
        scraper.collect({A: one}, deadline_seconds=SLACK)           # m-gpu-1 left the pool: its scrape is dropped
        pods.now += 5
        back = scraper.collect({A: request(gpu("m-gpu-1", "10.0.0.2"))}, deadline_seconds=SLACK)[A].gpu
        assert back.scraped_replicas == 1 and back.request_rate is None  # seen afresh: no rate until the next tick
        scraper.forget(A)
        pods.now += 5
        again = scraper.collect({A: request(gpu("m-gpu-1", "10.0.0.2"))}, deadline_seconds=SLACK)[A].gpu
        assert again.request_rate is None
        pods.now += 5
        assert scraper.collect({A: request(gpu("m-gpu-1", "10.0.0.2"))}, deadline_seconds=SLACK)[A].gpu.request_rate \
            is not None
        scraper.forget(B)  # never seen: nothing to drop
    finally:
        scraper.close()
