"""What the sampler exports on ``GET /metrics`` of its own port (Prometheus text format, written by hand).

Why a port of its own: every path of the serving port is TEI's (``/metrics`` included: the pod's TEI series), so the
sampler's page cannot share it. Why by hand: the sampler runs in every serving pod beside TEI, from the standard
library alone; three counters and two gauges do not need a client library.

- ``rerank_sampler_requests_total{outcome}``: every request on the serving port but the sampler's own probe, by what
  became of it (:data:`REQUEST_OUTCOMES`);
- ``rerank_sampler_copies_total{outcome}``: every copy drawn for the guard, by what became of it
  (:data:`COPY_OUTCOMES`); their sum over the proxied ``/rerank`` answers is the fraction actually sampled;
- ``rerank_sampler_copies_queued``: copies waiting to be sent now;
- ``rerank_sampler_fraction``: the configured fraction, so a dashboard can scale the guard's figures to the whole;
- ``rerank_api_requests_total{api,outcome}``: requests in the Cohere/Jina shapes (:mod:`.translation`), by shape
  (``v1``, ``v2``) and :data:`API_OUTCOMES`;
- ``rerank_api_documents_total{api}``, ``rerank_api_scored_texts_total{api}`` (windows count one each),
  ``rerank_api_tokens_total{api}`` (what TEI computed) and ``rerank_api_search_units_total{api}``: the usage of the
  answered ones, per pod; the namespace and model are the scrape's target labels.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rerank_contracts.rerank_api import Usage

#: proxied: TEI answered (whatever it answered) and the answer was relayed; upstream_error: TEI could not be reached or
#: gave no usable answer (502, or 504 after the read timeout; or it broke off an answer already under way);
#: invalid: the request was refused before forwarding (its body's framing or size: 400, 413, 501), or its client
#: left before its body arrived.
#: translated: a Cohere or Jina request, answered by the front itself through TEI (:mod:`.translation`; its own
#: outcome is in ``rerank_api_requests_total``).
REQUEST_OUTCOMES = ("proxied", "upstream_error", "invalid", "translated")
#: sent: the guard took the copy (2xx); dropped: the queue was full (the guard slower than the traffic), or the
#: sampler stopped before sending it; failed: the guard could not be reached, timed out, or refused it.
COPY_OUTCOMES = ("sent", "dropped", "failed")
#: answered: 200; invalid: refused with a 4xx (the request's fault, or TEI's refusal of it: its key, a text it will
#: not take); upstream_error: TEI could not be reached or broke its answer (502, 504).
API_OUTCOMES = ("answered", "invalid", "upstream_error")
API_SHAPES = ("v1", "v2")
USAGE = ("documents", "scored_texts", "tokens", "search_units")
#: The Prometheus text exposition format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """The sampler's counters (thread-safe); ``queued`` is read at each scrape (the queue's own size, never a copy
    that drifts)."""

    def __init__(self, fraction: float, queued: Callable[[], int] = lambda: 0) -> None:
        self.fraction = fraction
        self.queued = queued
        self._requests = dict.fromkeys(REQUEST_OUTCOMES, 0)
        self._copies = dict.fromkeys(COPY_OUTCOMES, 0)
        self._api = {(shape, outcome): 0 for shape in API_SHAPES for outcome in API_OUTCOMES}
        self._usage = {(shape, kind): 0 for shape in API_SHAPES for kind in USAGE}
        self._lock = threading.Lock()

    def request(self, outcome: str) -> None:
        if outcome not in self._requests:
            raise ValueError(f"unknown request outcome {outcome!r}")
        with self._lock:
            self._requests[outcome] += 1

    def copy(self, outcome: str) -> None:
        if outcome not in self._copies:
            raise ValueError(f"unknown copy outcome {outcome!r}")
        with self._lock:
            self._copies[outcome] += 1

    def api_request(self, shape: str, outcome: str) -> None:
        if (shape, outcome) not in self._api:
            raise ValueError(f"unknown rerank API shape or outcome {shape!r}, {outcome!r}")
        with self._lock:
            self._api[shape, outcome] += 1

    def api_usage(self, shape: str, usage: Usage) -> None:
        """One answered request and what it cost."""
        self.api_request(shape, "answered")
        with self._lock:
            for kind, amount in zip(USAGE, (usage.documents, usage.scored, usage.tokens, usage.search_units),
                                    strict=True):
                self._usage[shape, kind] += amount

    def api(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self._api), dict(self._usage)

    def requests(self) -> dict[str, int]:
        with self._lock:
            return dict(self._requests)

    def copies(self) -> dict[str, int]:
        with self._lock:
            return dict(self._copies)

    def page(self) -> bytes:
        """The page, every outcome present from the start (a rate over a series that does not exist yet is absent,
        not zero)."""
        requests, copies = self.requests(), self.copies()
        api, usage = self.api()
        lines = [
            "# HELP rerank_sampler_requests_total Requests on the serving port, by what became of them.",
            "# TYPE rerank_sampler_requests_total counter",
            *(f'rerank_sampler_requests_total{{outcome="{k}"}} {v}' for k, v in requests.items()),
            "# HELP rerank_sampler_copies_total Copies drawn for the quality guard, by what became of them.",
            "# TYPE rerank_sampler_copies_total counter",
            *(f'rerank_sampler_copies_total{{outcome="{k}"}} {v}' for k, v in copies.items()),
            "# HELP rerank_sampler_copies_queued Copies waiting to be sent to the quality guard.",
            "# TYPE rerank_sampler_copies_queued gauge",
            f"rerank_sampler_copies_queued {self.queued()}",
            "# HELP rerank_sampler_fraction The fraction of answered /rerank requests copied to the guard.",
            "# TYPE rerank_sampler_fraction gauge",
            f"rerank_sampler_fraction {self.fraction!r}",
            "# HELP rerank_api_requests_total Requests in the Cohere and Jina rerank shapes, by shape and outcome.",
            "# TYPE rerank_api_requests_total counter",
            *(f'rerank_api_requests_total{{api="{a}",outcome="{o}"}} {v}' for (a, o), v in api.items()),
        ]
        for kind in USAGE:
            lines += [f"# HELP rerank_api_{kind}_total Usage of the answered rerank API requests: {kind}.",
                      f"# TYPE rerank_api_{kind}_total counter",
                      *(f'rerank_api_{kind}_total{{api="{a}"}} {v}' for (a, k), v in usage.items() if k == kind)]
        return ("\n".join(lines) + "\n").encode()
