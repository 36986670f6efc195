"""The holding core: who is waiting for which model (what ``GET /pending`` shows), and one request's hold.

A held request waits for a connection, not for a signal: the operator scales the pool up when ``/pending`` lists the
model, the pool's Service gets a ready endpoint, and from then on a connection to it succeeds. So each held request
looks up its Service's ready endpoints (:mod:`.endpoints`: shared between the requests for one Service) and tries to
connect to them (:data:`CONNECT_TIMEOUT_SECONDS` a try, :data:`PAUSE_SECONDS` asleep between rounds: none ready yet,
or refused) until its hold runs out, and the first connection it makes carries it.
Nothing is forwarded twice: once connected and sent, whatever the pool answers (or fails to) is the answer
(:mod:`.relay`); a request that never connects is answered 503 with ``Retry-After`` and was never sent.

The :class:`Board` remembers a model for ``remember_seconds`` after its last request even when none waits any more:
the operator polls every few seconds, and a burst shorter than its period must still wake the pool.
"""

from __future__ import annotations

import itertools
import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rerank_contracts import activator

from . import logs
from .endpoints import Address, LookupFailed
from .metrics import Metrics
from .relay import READ_TIMEOUT_SECONDS, Answer, Held, UpstreamError, exchange

CONNECT_TIMEOUT_SECONDS = 1.0
PAUSE_SECONDS = 0.25
#: What a client is told to wait before it tries again after a 503.
RETRY_AFTER_SECONDS = 5


@dataclass
class _Model:
    held: dict[int, float] = field(default_factory=dict)  # ticket -> arrival (epoch seconds)
    last: float = 0.0


class Board:
    """The models with requests held now or lately. Thread-safe; ``clock`` is wall time (epoch seconds, what
    ``/pending`` reports), injected for tests."""

    def __init__(self, remember_seconds: float, clock: Callable[[], float] = time.time) -> None:
        self.remember_seconds = remember_seconds
        self.clock = clock
        self._models: dict[str, _Model] = {}
        self._lock = threading.Lock()
        self._tickets = itertools.count()

    def arrive(self, model: str) -> int:
        """A request for ``model`` is held from now: its ticket, for :meth:`leave`."""
        now = self.clock()
        with self._lock:
            ticket = next(self._tickets)
            entry = self._models.setdefault(model, _Model())
            entry.held[ticket] = now
            entry.last = now
            self._forget(now)
            return ticket

    def leave(self, model: str, ticket: int) -> None:
        """The request of ``ticket`` is held no more (connected to its pool, or timed out)."""
        with self._lock:
            entry = self._models.get(model)
            if entry is not None:
                entry.held.pop(ticket, None)

    def waiting(self) -> int:
        """Requests held now, all models."""
        with self._lock:
            return sum(len(e.held) for e in self._models.values())

    def pending(self) -> dict[str, dict[str, float | int]]:
        """``{model: {"waiting", "first", "last"}}`` for the models waiting now or within ``remember_seconds``:
        ``first`` is the oldest held request's arrival (the last request's when none is held)."""
        now = self.clock()
        with self._lock:
            self._forget(now)
            return {model: {"waiting": len(e.held), "first": round(min(e.held.values(), default=e.last), 3),
                            "last": round(e.last, 3)}
                    for model, e in sorted(self._models.items())}

    def _forget(self, now: float) -> None:
        for model in [m for m, e in self._models.items() if not e.held and now - e.last > self.remember_seconds]:
            del self._models[model]


def refusal(status: int, outcome: str, error: str, headers: list[tuple[str, str]] | None = None) -> Answer:
    """An answer the activator gives itself: a short JSON error."""
    body = json.dumps({"error": error}).encode()
    return Answer(status, [("Content-Type", "application/json"), *(headers or [])], body, outcome)


class Holder:
    """Holds requests on ``board`` for up to ``hold_seconds`` each, forwarding each once its pool accepts."""

    def __init__(self, board: Board, metrics: Metrics, hold_seconds: float, *,
                 connect_timeout: float = CONNECT_TIMEOUT_SECONDS, pause: float = PAUSE_SECONDS,
                 read_timeout: float = READ_TIMEOUT_SECONDS,
                 locate: Callable[[str, str, int], list[Address]]) -> None:
        self.board, self.metrics, self.hold_seconds = board, metrics, hold_seconds
        self.connect_timeout, self.pause = connect_timeout, pause
        self.read_timeout = read_timeout
        #: The ready addresses of (namespace, Service, port): :meth:`.endpoints.Endpoints.locate` in a pod; tests
        #: name local listeners.
        self.locate = locate

    def handle(self, request: Held, arrived: float, max_answer_bytes: int) -> Answer:
        """Hold ``request`` (arrived at ``arrived``, monotonic seconds) until its pool accepts a connection, then
        forward it once (an answer over ``max_answer_bytes`` is a 502); the one answer for its client, counted and
        logged."""
        deadline = arrived + self.hold_seconds
        ticket = self.board.arrive(request.model)
        try:
            sock, why = self._connect(request.upstream, deadline)
        finally:
            self.board.leave(request.model, ticket)
        held = time.monotonic() - arrived
        if sock is None:
            answer = refusal(503, "timeout", f"the model did not wake within {self.hold_seconds:g} s"
                             + (f" ({why})" if why else ""), [("Retry-After", str(RETRY_AFTER_SECONDS))])
        else:
            self.metrics.held(held)
            answer = self._forward(sock, request, max_answer_bytes)
        self.metrics.count(answer.outcome)
        extra: dict[str, Any] = {"lookup_error": why} if why and sock is None else {}
        logs.event("held request answered", model=request.model, outcome=answer.outcome, status=answer.status,
                   held_seconds=round(held, 3), **extra)
        return answer

    def _connect(self, upstream: str, deadline: float) -> tuple[socket.socket | None, str | None]:
        """A connection to one of ``upstream``'s ready endpoints made before ``deadline`` (monotonic), or None; and
        why the endpoints could not be looked up the last time they could not (None: they always could)."""
        namespace, service, port = activator.upstream_service(upstream)
        why: str | None = None
        while deadline - time.monotonic() > 0:
            try:  # looked up again each round: the pool's pods come and go while it wakes
                addresses = self.locate(namespace, service, port)
            except LookupFailed as exc:
                why, addresses = str(exc), []
            random.shuffle(addresses)
            for address in addresses:
                if (left := deadline - time.monotonic()) <= 0:
                    break
                try:
                    return socket.create_connection(address, timeout=min(self.connect_timeout, left)), why
                except OSError:  # refused (a pod that is not listening yet or any more), or the try timed out
                    pass
            time.sleep(max(0.0, min(self.pause, deadline - time.monotonic())))
        return None, why

    def _forward(self, sock: socket.socket, request: Held, max_answer_bytes: int) -> Answer:
        try:
            return exchange(sock, request, self.read_timeout, max_answer_bytes)
        except UpstreamError as exc:
            return refusal(exc.status, "upstream_error", f"the model's pool gave no usable answer: {exc}")
        except Exception:  # a bug of ours: still one answer for the client, and the trace in the log
            logging.getLogger(logs.LOGGER).exception("forwarding failed")
            return refusal(502, "upstream_error", "the request could not be forwarded")
