"""What the activator takes in to hold, so that no client, and no model's flood, can take it from the others.

The activator is shared by every tenant's sleeping models, and all it holds is in memory: each held request's body
(read whole before it is held, so it can be forwarded once) and, once the pool answers, that answer. Bounded here,
before a body is read, from the length the request states:

- one tenant (a namespace: its models together) holds at most ``max_requests`` requests at once, and of bodies
  larger than :data:`SMALL_BODY_BYTES` at most ``max_bytes // TENANT_SHARE``; all tenants together at most
  ``max_bytes`` of such bodies. A flood from one tenant is answered 503 (``overloaded``, with ``Retry-After``) past
  its share, at once, which frees its connections for the other tenants' requests instead of taking every slot
  until its holds run out;
- a small body (nearly every rerank request) is bounded by the count alone: however many large bodies fill the
  byte budget, another tenant's ordinary request is still held. Its memory is bounded by the connections
  (``max_connections`` x :data:`SMALL_BODY_BYTES`);
- all tenants together hold at most ``max_total`` requests (the server passes three quarters of its connections):
  the rest stay free for the operator's ``GET /pending`` (without which no sleeping model wakes), ``/metrics``, the
  probes, and the 503s themselves, however many tenants flood at once;
- an answer may be at most its request's body plus :data:`ANSWER_ALLOWANCE` (:func:`answer_limit`).

At the chart's defaults (256 connections, 32 MiB) that is at most 64 MiB of bodies and 96 MiB of answers, under
the chart's 256 MiB limit with the process's own 30 MiB (``tests/unit/activator/test_activator_memory.py``
measures a flood).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

#: How many tenants' worth of large bodies the whole budget is: one tenant gets a quarter.
TENANT_SHARE = 4
#: A body this size or smaller is bounded by the request count alone.
SMALL_BODY_BYTES = 128 * 1024
#: What an answer may add to its request's body (a rerank answer is an index and a score per text, and the texts
#: themselves only when the request asked for them back).
ANSWER_ALLOWANCE = 128 * 1024


def answer_limit(body_bytes: int) -> int:
    """The largest answer relayed for a request with a body of ``body_bytes`` (larger: 502)."""
    return body_bytes + ANSWER_ALLOWANCE


@dataclass(frozen=True)
class Ticket:
    """What one admitted request holds, given back once it is answered."""

    tenant: str
    body_bytes: int
    large: int  # the bytes counted against the budgets (0 for a small body)


class Admission:
    """The bounds above; thread-safe. A tenant is the namespace of ``<namespace>/<name>``."""

    def __init__(self, max_bytes: int, max_requests: int, max_total: int) -> None:
        self.max_bytes, self.max_requests, self.max_total = max_bytes, max_requests, max_total
        self._count = 0
        self.tenant_bytes = max(1, max_bytes // TENANT_SHARE)
        self._lock = threading.Lock()
        self._large = 0
        self._all = 0
        self._tenants: dict[str, tuple[int, int]] = {}  # tenant -> (requests, large body bytes)

    def take(self, model: str, body_bytes: int) -> Ticket | str:
        """Admit a request for ``model`` with a body of ``body_bytes``: its ticket, or why not."""
        tenant = model.partition("/")[0]
        large = body_bytes if body_bytes > SMALL_BODY_BYTES else 0
        with self._lock:
            requests, held = self._tenants.get(tenant, (0, 0))
            if requests >= self.max_requests:
                return f"{requests} requests are held for namespace {tenant} already (at most {self.max_requests})"
            if large and held + large > self.tenant_bytes:
                return f"namespace {tenant}'s held bodies would exceed {self.tenant_bytes} bytes"
            if large and self._large + large > self.max_bytes:
                return f"the activator's held bodies would exceed {self.max_bytes} bytes"
            if self._count >= self.max_total:
                return f"{self._count} requests are held in all (at most {self.max_total})"
            self._count += 1
            self._tenants[tenant] = (requests + 1, held + large)
            self._large += large
            self._all += body_bytes
            return Ticket(tenant, body_bytes, large)

    def give_back(self, ticket: Ticket) -> None:
        with self._lock:
            requests, held = self._tenants.pop(ticket.tenant, (1, ticket.large))
            if requests > 1:
                self._tenants[ticket.tenant] = (requests - 1, held - ticket.large)
            self._large -= ticket.large
            self._all -= ticket.body_bytes
            self._count -= 1

    def held_bytes(self) -> int:
        """Bodies held now, small and large."""
        with self._lock:
            return self._all
