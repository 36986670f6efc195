"""What the activator exports on ``GET /metrics`` (Prometheus text format), in a registry of its own.

- ``rerank_activator_requests_total{outcome}``: every request to hold, by what became of it (:data:`OUTCOMES`),
  and every ``/pending`` refused for its token (``unauthenticated``);
- ``rerank_activator_waiting``: requests held now, all models together;
- ``rerank_activator_hold_seconds``: from a request's arrival to its connection to the woken pool.

No series carries a namespace or model: one activator serves every tenant, so a label per model would grow without
bound and tell one tenant's observers who else sleeps here. Who waits is on ``/pending``, behind the operator's token.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: forwarded: the pool answered (whatever it answered) and that answer was relayed; timeout: no connection within
#: the hold (503); unauthenticated: no or a wrong token (401, never forwarded); invalid: malformed headers, target or
#: body framing (400, 411, 413); upstream_error: connected, but no usable answer (502, or 504 after the read timeout);
#: overloaded: past its namespace's share of what the activator holds, or past the whole (503, never held).
OUTCOMES = ("forwarded", "timeout", "unauthenticated", "invalid", "upstream_error", "overloaded")
#: A cold TEI pod takes seconds to tens of seconds to start; the top buckets meet the longest holds.
HOLD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class Metrics:
    """The activator's series; ``waiting`` is read at each scrape (the board's count, never a copy that drifts)."""

    def __init__(self, waiting: Callable[[], int], held_bytes: Callable[[], int] = lambda: 0) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("rerank_activator_requests", "Requests to hold, by what became of them.",
                                ["outcome"], registry=self.registry)
        for outcome in OUTCOMES:  # every outcome exported from the start, so a rate over it is never absent
            self.requests.labels(outcome)
        self.waiting = Gauge("rerank_activator_waiting", "Requests held now for a pool to wake (all models).",
                             registry=self.registry)
        self.waiting.set_function(lambda: float(waiting()))
        self.held_bytes = Gauge("rerank_activator_held_bytes", "Bytes of request bodies held now (all models).",
                                registry=self.registry)
        self.held_bytes.set_function(lambda: float(held_bytes()))
        self.hold = Histogram("rerank_activator_hold_seconds", "Seconds from a request's arrival to its connection "
                              "to the woken pool.", buckets=HOLD_BUCKETS, registry=self.registry)

    def count(self, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}")
        self.requests.labels(outcome).inc()

    def held(self, seconds: float) -> None:
        self.hold.observe(seconds)

    def page(self) -> bytes:
        return generate_latest(self.registry)
