"""Which answered requests are copied to the quality guard, and the one thread that sends the copies.

Why here and not in the route: the Gateway API's ``RequestMirror`` filter is an Extended feature, and a gateway
without it (Traefik) answers 500 to every request of a route that asks for it. The sampler needs only what every
gateway does (route to a Service): it sees each request as it passes to TEI, and copies a fraction of them itself.

What is copied: a ``POST`` to one of :data:`SAMPLED_PATHS` that TEI answered 2xx (a request TEI refused tells the
guard nothing about the model's quality) and not carrying the model's own mirror token (that is the guard's own
check of this pool, ``quality_guard/endpoints.py``: copied back it would feed the guard its own calls), drawn with
probability ``fraction`` (:class:`Draw`: independent draws, so no request pattern in the traffic can line up with the
sampling; seedable for tests). Only the body and its ``Content-Type`` go, with the model's mirror token in
:data:`rerank_contracts.guard.MIRROR_TOKEN_HEADER` (the guard drops a POST without it: ``quality_guard/intake.py``).

Why off the request path: a copy is offered only after the client's answer has been written, and offering is a
``put_nowait`` on a queue bounded in copies and in bytes (full: the copy is dropped and counted; the bytes bound keeps
a queue of large bodies from growing the sidecar past its memory limit), so the guard being slow, down or hanging
never adds a millisecond to serving. One :class:`Courier` thread drains the queue, one POST at a time with a
:data:`COPY_TIMEOUT_SECONDS` timeout, never retried (a lost copy is one fewer sample, and the guard's checks are
statistical); the guard's answer (202) is read and ignored but for its status.
"""

from __future__ import annotations

import http.client
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass

from rerank_contracts.guard import MIRROR_TOKEN_HEADER

from . import logs
from .metrics import Metrics
from .relay import address

#: The paths whose answered POSTs are sampled: TEI routes rerank at ``/rerank`` only (1.x has no ``/v1/rerank`` nor a
#: Cohere-style ``/v2/rerank``), and the guard reads TEI's request body (``{"query", "texts"}``) at its own
#: ``/rerank``. A copy goes to the guard at the path it was sampled from.
SAMPLED_PATHS = frozenset({"/rerank"})
#: The longest one copy may take to reach the guard and be answered (connect, then each read).
COPY_TIMEOUT_SECONDS = 2.0
#: Copies waiting for the courier at most; more are dropped.
QUEUE_SIZE = 64
#: The bodies waiting for the courier, in bytes, at most; a copy that would pass it is dropped.
QUEUE_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Copy:
    """One sampled request as it goes to the guard."""

    path: str
    content_type: str | None
    body: bytes


class Draw:
    """Whether to copy one request: True with probability ``fraction``, each draw independent (thread-safe)."""

    def __init__(self, fraction: float, seed: int | None = None) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"a fraction is between 0 and 1, not {fraction}")
        self.fraction = fraction
        self._random = random.Random(seed)
        self._lock = threading.Lock()

    def __call__(self) -> bool:
        if self.fraction <= 0.0:
            return False
        with self._lock:
            return self._random.random() < self.fraction  # random() < 1.0 always: fraction 1 copies all


_STOP = Copy("", None, b"")  # tells the courier to stop (compared by identity)


class Courier:
    """The bounded queue of copies and the thread that POSTs them to the guard at ``guard_url``."""

    def __init__(self, guard_url: str | None, token: str, metrics: Metrics, draw: Draw, *,
                 queue_size: int = QUEUE_SIZE, queue_bytes: int = QUEUE_BYTES,
                 timeout: float = COPY_TIMEOUT_SECONDS) -> None:
        """``guard_url`` None: an unguarded model's front, whose ``draw`` must never copy."""
        if guard_url is None and draw.fraction > 0:
            raise ValueError("copies drawn for no guard")
        self.host, self.port = address(guard_url) if guard_url else ("", 0)
        self.token, self.metrics, self.draw, self.timeout = token, metrics, draw, timeout
        self._queue: queue.Queue[Copy] = queue.Queue(maxsize=queue_size)
        self.queue_bytes = queue_bytes
        self._bytes = 0  # the queued bodies' bytes
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="sampler-courier", daemon=True)
        self._conn: http.client.HTTPConnection | None = None
        self._failing = False
        self._deadline: float | None = None  # monotonic: past it, what is still queued is dropped (stopping)

    def start(self) -> Courier:
        self._thread.start()
        return self

    def queued(self) -> int:
        return self._queue.qsize()

    def offer(self, path: str, content_type: str | None, body: bytes) -> bool:
        """Draw, and queue a copy when drawn (never blocks); whether one was queued."""
        if not self.draw():
            return False
        with self._lock:
            room = self._bytes + len(body) <= self.queue_bytes
            if room:
                self._bytes += len(body)
        try:
            if not room:
                raise queue.Full
            self._queue.put_nowait(Copy(path, content_type, body))
        except queue.Full:
            if room:
                self._taken(body)
            self.metrics.copy("dropped")
            return False
        return True

    def _taken(self, body: bytes) -> None:
        with self._lock:
            self._bytes -= len(body)

    def stop(self, grace: float) -> bool:
        """Send what is queued for up to ``grace`` s, drop the rest; whether the thread ended in time."""
        self._deadline = time.monotonic() + grace
        try:
            self._queue.put(_STOP, timeout=max(grace, 0.0))
        except queue.Full:  # the guard is hanging and the queue is full: the thread is a daemon, the process ends
            return False
        self._thread.join(max(self._deadline - time.monotonic(), 0.0))
        return not self._thread.is_alive()

    def _run(self) -> None:
        while (copy := self._queue.get()) is not _STOP:
            self._taken(copy.body)
            if self._deadline is not None and time.monotonic() > self._deadline:
                self.metrics.copy("dropped")
                continue
            self.metrics.copy("sent" if self._send(copy) else "failed")
        if self._conn is not None:
            self._conn.close()

    def _send(self, copy: Copy) -> bool:
        """POST one copy; whether the guard took it (2xx). One connection, kept while the guard keeps it open."""
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        headers = {MIRROR_TOKEN_HEADER: self.token}
        if copy.content_type is not None:
            headers["Content-Type"] = copy.content_type
        try:
            self._conn.request("POST", copy.path, body=copy.body, headers=headers)
            response = self._conn.getresponse()
            response.read()  # the guard's answer is {"sampled": ...}: nothing the sampler acts on
            taken = 200 <= response.status < 300
            error = "" if taken else f"the guard answered {response.status}"
        except (OSError, http.client.HTTPException) as exc:
            taken, error = False, f"{type(exc).__name__}: {exc}"
        if not taken:
            self._conn.close()  # a fresh connection for the next copy: this one's state is unknown
        self._note(taken, error)
        return taken

    def _note(self, taken: bool, error: str) -> None:
        """Log the guard becoming unreachable (or refusing) and reachable again: one line per change."""
        if taken and self._failing:
            logs.event("copies reach the guard again", guard=f"{self.host}:{self.port}")
        elif not taken and not self._failing:
            logs.event("copies do not reach the guard", level=logging.WARNING, guard=f"{self.host}:{self.port}",
                       error=error)
        self._failing = not taken
