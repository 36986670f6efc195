"""Fake TEI ``/metrics`` for kwok pods, served on 127.0.0.1 (the operator reaches them through
:mod:`rerank_devcluster.scrape_redirect`).

- :class:`Histogram` and :class:`TeiCounters`: TEI's ``te_*`` series (counters, queue gauge, latency histograms),
  moved by a caller's traffic model (``TeiCounters.step``) and rendered in the text exposition format.
- :class:`MetricsServer`: an HTTP server whose every GET answers ``render()``, or 503 when that returns None (the
  endpoint is down). One server may stand for one pod (the autoscaling tests) or for a whole fleet (the benchmark).
- :class:`SteadyTei`: a pod under constant light load, for a fleet at rest: counters grow at ``rate`` requests/s
  from the server's start, every request takes ``latency`` seconds, the queue is empty.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = BUCKETS) -> None:
        self.bounds = buckets
        self.buckets = [0.0] * len(buckets)
        self.count = 0.0
        self.sum = 0.0

    def observe(self, value: float, n: float) -> None:
        for i, le in enumerate(self.bounds):
            if value <= le:
                self.buckets[i] += n
        self.count += n
        self.sum += value * n

    def render(self, name: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{le}"}} {n}' for le, n in zip(self.bounds, self.buckets, strict=True)]
        lines += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum}", f"{name}_count {self.count}"]
        return lines


class TeiCounters:
    """One pod's TEI series, moved by :meth:`step` (a fluid queue: capacity per second, a bounded backlog)."""

    def __init__(self, capacity: float, base_latency: float, max_backlog: float) -> None:
        self.capacity, self.base_latency, self.max_backlog = capacity, base_latency, max_backlog
        self.requests = self.success = self.failure = self.backlog = 0.0
        self.duration, self.queue_duration = Histogram(), Histogram()

    def step(self, rate: float, dt: float) -> None:
        """``rate`` requests/s arrive for ``dt`` seconds; serve what capacity allows, queue or drop the rest."""
        arrived = rate * dt
        self.requests += arrived
        served = min(self.backlog + arrived, self.capacity * dt)
        self.backlog += arrived - served
        dropped = max(0.0, self.backlog - self.max_backlog)
        self.backlog -= dropped
        self.failure += dropped
        self.success += served
        if served > 0:
            waited = self.backlog / self.capacity
            self.queue_duration.observe(waited, served)
            self.duration.observe(self.base_latency + waited, served)

    def render(self) -> str:
        return "\n".join([
            "# TYPE te_request_count counter", f'te_request_count{{method="batch"}} {self.requests}',
            "# TYPE te_request_success counter", f'te_request_success{{method="batch"}} {self.success}',
            "# TYPE te_request_failure counter", f'te_request_failure{{err="overloaded"}} {self.failure}',
            "# TYPE te_queue_size gauge", f"te_queue_size {self.backlog}",
            *self.duration.render("te_request_duration"),
            *self.queue_duration.render("te_request_queue_duration"), "",
        ])


class MetricsServer:
    """``GET <anything>`` -> ``render()`` as text/plain (503 when it returns None), on 127.0.0.1:<free port>."""

    def __init__(self, render: Callable[[], str | None]) -> None:
        self.requests = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name is http.server's API
                owner.requests += 1
                text = render()
                if text is None:
                    self.send_error(503)
                    return
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class SteadyTei:
    """A pod (or every pod of a fleet) under constant load: the same signals at every scrape, counters growing."""

    def __init__(self, rate: float = 1.0, latency: float = 0.03, clock: Callable[[], float] = time.time) -> None:
        self.rate, self.latency, self.clock = rate, latency, clock
        self.started = clock()
        self.up = True

    def render(self) -> str | None:
        if not self.up:
            return None
        n = self.rate * (self.clock() - self.started)
        latency = Histogram()
        latency.observe(self.latency, n)
        queue = Histogram()
        queue.observe(0.0, n)
        return "\n".join([
            "# TYPE te_request_count counter", f'te_request_count{{method="batch"}} {n}',
            "# TYPE te_request_success counter", f'te_request_success{{method="batch"}} {n}',
            "# TYPE te_request_failure counter", 'te_request_failure{err="overloaded"} 0',
            "# TYPE te_queue_size gauge", "te_queue_size 0",
            *latency.render("te_request_duration"), *queue.render("te_request_queue_duration"), "",
        ])


class TrafficLoop:
    """Requests at ``rate`` split between the pools by ``cpu_share``, evenly over each pool's Ready pods, fed to the
    fake pods every 0.2 s; what the pods and the split are is looked at again once a second (``refresh``, the
    subclass's: the cluster tests read pods and the HTTPRoute). The loop runs from ``start`` until ``stop``. A test
    that must see a change at once calls ``look_again``: never two refreshes at the same time (a refresh rewrites
    files another one reads)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.lock = threading.Lock()
        self.ready: dict[str, str] = {}  # Ready pod name -> pool
        self.cpu_share = 0.0
        self._stop = threading.Event()
        self._refreshing = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.look_again()
        self._thread.start()

    def look_again(self) -> None:
        """``refresh``, one at a time: the loop's thread and the test's may both ask."""
        with self._refreshing:
            self.refresh()

    def refresh(self) -> None:
        raise NotImplementedError

    def step_pod(self, name: str, rate: float, dt: float) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        last, refreshed = time.monotonic(), 0.0
        while not self._stop.wait(0.2):
            now = time.monotonic()
            if now - refreshed >= 1.0:
                with contextlib.suppress(Exception):  # a failed read: keep the last view
                    self.look_again()
                refreshed = now
            with self.lock:
                dt, last = now - last, now
                for pool, share in (("gpu", 1 - self.cpu_share), ("cpu", self.cpu_share)):
                    members = [n for n, p in self.ready.items() if p == pool]
                    for name in members:
                        self.step_pod(name, self.rate * share / len(members), dt)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
