"""What the activator takes in to hold, so that no client, and no model's flood, can take it from the others.

The activator is shared by every tenant's sleeping models, and all it holds is in memory: each held request's body
(read whole before it is held, so it can be forwarded once) and, once the pool answers, that answer. Bounded here,
before a body is read, from the length the request states:

- all models together hold at most ``max_bytes`` of bodies (the chart's memory limit is far above it: see
  ``docs/operations.md``, "The activator's memory"), and an answer may be at most its request's body plus
  :data:`ANSWER_ALLOWANCE` (:func:`answer_limit`), so answers cost at most the bodies again plus a small sum;
- one model holds at most ``max_bytes // MODEL_SHARE`` of them and ``max_requests`` requests at once: a flood on
  one sleeping model is answered 503 (``overloaded``, with ``Retry-After``) past its share, quickly, which frees its
  connections for the other models' requests instead of taking every slot until its holds run out.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

#: How many models' worth of bodies the whole budget is: one model gets a quarter.
MODEL_SHARE = 4
#: What an answer may add to its request's body (a rerank answer is an index and a score per text, and the texts
#: themselves only when the request asked for them back).
ANSWER_ALLOWANCE = 128 * 1024


def answer_limit(body_bytes: int) -> int:
    """The largest answer relayed for a request with a body of ``body_bytes`` (larger: 502)."""
    return body_bytes + ANSWER_ALLOWANCE


@dataclass(frozen=True)
class Ticket:
    """What one admitted request holds, given back once it is answered."""

    model: str
    body_bytes: int


class Admission:
    """The bounds above; thread-safe."""

    def __init__(self, max_bytes: int, max_requests: int) -> None:
        self.max_bytes, self.max_requests = max_bytes, max_requests
        self.model_bytes = max(1, max_bytes // MODEL_SHARE)
        self._lock = threading.Lock()
        self._bytes = 0
        self._models: dict[str, tuple[int, int]] = {}  # model -> (requests, body bytes)

    def take(self, model: str, body_bytes: int) -> Ticket | str:
        """Admit a request for ``model`` with a body of ``body_bytes``: its ticket, or why not."""
        with self._lock:
            requests, held = self._models.get(model, (0, 0))
            if requests >= self.max_requests:
                return f"{requests} requests are held for this model already (at most {self.max_requests})"
            if held + body_bytes > self.model_bytes:
                return f"this model's held requests would exceed {self.model_bytes} bytes"
            if self._bytes + body_bytes > self.max_bytes:
                return f"the activator's held requests would exceed {self.max_bytes} bytes"
            self._models[model] = (requests + 1, held + body_bytes)
            self._bytes += body_bytes
            return Ticket(model, body_bytes)

    def give_back(self, ticket: Ticket) -> None:
        with self._lock:
            requests, held = self._models.pop(ticket.model, (1, ticket.body_bytes))
            if requests > 1:
                self._models[ticket.model] = (requests - 1, held - ticket.body_bytes)
            self._bytes -= ticket.body_bytes

    def held_bytes(self) -> int:
        with self._lock:
            return self._bytes
