"""Events posted off the reconcile path: a reconcile hands its Events to one background thread and goes on.

An Event is what ``kubectl describe`` shows, never something the operator reads back, so a reconcile need not wait
for the API server to store it (client-go's EventBroadcaster is asynchronous for the same reason). Inside a burst of
applies, where every request waits on a busy API server, the worker that would have waited for the Event instead
takes the next model. Order is kept (one thread); a full queue drops the newest and says so (Events are best effort:
losing one never changes what is applied); a graceful stop sends what is queued first.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping
from typing import Any

log = logging.getLogger(__name__)

Post = Callable[[Mapping[str, Any]], None]


class EventSender:
    """Posts Event bodies in order on one daemon thread; ``post`` is the blocking call (it must not raise for a
    refused Event; anything it raises is logged and the next Event is posted)."""

    def __init__(self, post: Post, capacity: int = 2000) -> None:
        self._post = post
        self._queue: queue.Queue[Mapping[str, Any] | None] = queue.Queue(maxsize=capacity)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, body: Mapping[str, Any]) -> None:
        self._ensure_started()
        try:
            self._queue.put_nowait(body)
        except queue.Full:
            self.dropped += 1
            log.warning("dropped Event %s: %d Events already wait to be posted", body.get("reason"),
                        self._queue.maxsize)

    def pending(self) -> int:
        return self._queue.qsize()

    def stop(self, wait_seconds: float) -> None:
        """Post what is queued (up to ``wait_seconds``), then end the thread."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        try:
            self._queue.put(None, timeout=wait_seconds)
        except queue.Full:
            return
        thread.join(timeout=wait_seconds)

    def _ensure_started(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="events")
                self._thread.start()

    def _run(self) -> None:
        while (body := self._queue.get()) is not None:
            try:
                self._post(body)
            except Exception:
                log.exception("posting Event %s failed", body.get("reason"))
