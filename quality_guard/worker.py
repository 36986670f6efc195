"""The one thread that does the sampled checks, and the bounded queue that feeds it.

``POST /rerank`` (:mod:`.intake`) answers 202 at once and leaves the work here: the guard is never in the serving
path, so a slow pool or reference must not hold a mirrored request's connection. When the queue is full the copy is
dropped and counted (``outcome="queue_full"``): the guard must not queue without bound.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

from .checks import Guard

#: Copies waiting for the worker; beyond this they are dropped (the guard must not queue without bound).
QUEUE_SIZE = 64


class Worker:
    """The one thread that does the sampled checks, fed through a bounded queue."""

    def __init__(self, guard: Guard, size: int = QUEUE_SIZE) -> None:
        self.guard = guard
        self.queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(maxsize=size)
        self.thread = threading.Thread(target=self._run, name="guard-worker", daemon=True)
        self.done = 0

    def start(self) -> Worker:
        self.thread.start()
        return self

    def metrics(self) -> bytes:
        return self.guard.metrics()

    def count(self, outcome: str) -> None:
        self.guard.count(outcome)

    def receive(self, body: Any) -> bool:
        """A mirrored copy that passed :mod:`.intake`: kept in the live sample (the Replayer's bodies are not) and
        offered for a check."""
        self.guard.remember(body)
        return self.submit(body)

    def submit(self, body: Any) -> bool:
        if not self.guard.offer(body):
            return False
        try:
            self.queue.put_nowait(body)
        except queue.Full:
            self.guard.count("queue_full")
            return False
        return True

    def _run(self) -> None:
        while True:
            body = self.queue.get()
            if body is None:
                return
            try:
                self.guard.check(body)
            finally:
                self.done += 1
                self.queue.task_done()

    def stop(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=30)
