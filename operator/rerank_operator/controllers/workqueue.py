"""The reconcile queue: which models to reconcile, by how many workers, and when to try again.

client-go's rate-limited work queue, reduced to what the operator needs:

- **A key is never processed by two workers at once**, and a key added while it is being processed is processed
  once more afterwards: a burst of child events for one model costs at most two reconciles, and the reconciles of
  one model never overlap.
- **Keys, not events.** Adding a key that is already waiting does nothing, so the queue is never longer than the
  number of models, however many events arrive (a burst of a few hundred applies queues each model once).
- **Failures back off per key** (``retry_base`` doubling up to ``retry_max``), so one model failing never slows
  another; success forgets the backoff.
- **Delayed adds** (``add_after``): the periodic resync of each model and a retry after a transient failure;
  an earlier due time wins.
- **Urgent keys first** (``add(key, urgent=True)``): a model whose spec nobody has acted on yet (just applied, or
  its generation changed) goes ahead of the background work (child status churn, resyncs), so inside a burst of
  applies a new model's Job does not wait behind other models' pool roll-outs.
- **Background work yields to urgent work** (``background_while_urgent``): while urgent keys wait or are being
  processed, at most that many workers take background keys. In a burst the API server is the bottleneck, and
  every pool roll-out of a model whose Job already finished is a handful of writes competing with the next new
  model's claim and Job; capping it (not stopping it: nothing starves) leaves the API server to the new models.
- **Paused until started.** Keys accumulate while the process is a standby (leader election); the workers start
  when it leads, and then work off everything that happened meanwhile.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class RetryAfter(Exception):
    """Raised by a handler: process the key again after ``delay`` seconds (counts as a failure for backoff when
    ``delay`` is None)."""

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = delay


class WorkQueue(Generic[K]):
    """Keys to process by ``workers`` threads calling ``handle(key)``; it returns the seconds after which to process
    the key again (a resync), or None."""

    def __init__(self, handle: Callable[[K], float | None], workers: int, *, retry_base: float = 1.0,
                 retry_max: float = 60.0, clock: Callable[[], float] = time.monotonic, name: str = "reconcile",
                 waited: Callable[[float], None] = lambda seconds: None,
                 background_while_urgent: int | None = None) -> None:
        self._handle = handle
        self._workers = workers
        self._background_cap = workers if background_while_urgent is None else max(1, background_while_urgent)
        self._retry_base = retry_base
        self._retry_max = retry_max
        self._clock = clock
        self._name = name
        self._cond = threading.Condition()
        self._ready: deque[K] = deque()
        self._urgent: deque[K] = deque()  # taken before _ready
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()  # added while being processed: run again afterwards
        self._dirty_urgent: set[K] = set()  # ... and urgently
        self._urgent_processing: set[K] = set()  # taken from the urgent lane, being processed (the rest: background)
        self._due: dict[K, float] = {}  # key -> earliest time of its delayed add
        self._timers: list[tuple[float, int, K]] = []
        self._seq = itertools.count()
        self._failures: dict[K, int] = {}
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self._waited = waited  # told how long each key waited for a worker (the queue's latency)
        self._since: dict[K, float] = {}

    # --- adding -------------------------------------------------------------------------------------------------------

    def add(self, key: K, urgent: bool = False) -> None:
        with self._cond:
            self._add_locked(key, urgent)

    def add_after(self, key: K, delay: float) -> None:
        if delay <= 0:
            self.add(key)
            return
        with self._cond:
            due = self._clock() + delay
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._timers, (due, next(self._seq), key))
            self._cond.notify()

    def due(self, key: K) -> float | None:
        """When the key's delayed add falls due (clock time), if it has one."""
        with self._cond:
            return self._due.get(key)

    def forget(self, key: K) -> None:
        """Drop the key's backoff and pending resync (its model is gone)."""
        with self._cond:
            self._failures.pop(key, None)
            self._due.pop(key, None)

    def _add_locked(self, key: K, urgent: bool = False) -> None:
        if key in self._processing:
            self._dirty.add(key)
            if urgent:
                self._dirty_urgent.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            (self._urgent if urgent else self._ready).append(key)
            self._since[key] = self._clock()
            self._cond.notify()
        elif urgent and key not in self._urgent:  # waiting in the background lane: move it ahead
            self._ready.remove(key)
            self._urgent.append(key)
            self._cond.notify()  # idle workers may be held back by the background's cap: one can take it now

    # --- running ------------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the workers (once)."""
        with self._cond:
            if self._threads or self._stopped:
                return
            for i in range(self._workers):
                t = threading.Thread(target=self._work, daemon=True, name=f"{self._name}-{i}")
                self._threads.append(t)
                t.start()

    def stop(self, wait_seconds: float = 0.0) -> None:
        """No key is taken any more; waits up to ``wait_seconds`` for the ones being processed to finish."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            threads = list(self._threads)
        deadline = self._clock() + wait_seconds
        for t in threads:
            t.join(timeout=max(0.0, deadline - self._clock()))

    @property
    def started(self) -> bool:
        with self._cond:
            return bool(self._threads)

    def depth(self) -> int:
        """Keys waiting to be processed now."""
        with self._cond:
            return len(self._ready) + len(self._urgent)

    def processing(self) -> int:
        with self._cond:
            return len(self._processing)

    def urgent_pending(self, besides: K | None = None) -> int:
        """Urgent keys waiting or being processed, ``besides`` apart (a worker asking about the others)."""
        with self._cond:
            return len(self._urgent) + len(self._urgent_processing - {besides})

    def _next(self) -> K | None:
        with self._cond:
            while not self._stopped:
                now = self._clock()
                while self._timers and self._timers[0][0] <= now:
                    due, _, key = heapq.heappop(self._timers)
                    if self._due.get(key) == due:
                        del self._due[key]
                        self._add_locked(key)
                taken = self._take_locked()
                if taken is not None:
                    self._waited(now - self._since.pop(taken, now))
                    return taken
                wait = self._timers[0][0] - now if self._timers else None
                self._cond.wait(wait)
            return None

    def _take_locked(self) -> K | None:
        """The next key: an urgent one, else a background one unless urgent work holds the background's share."""
        if self._urgent:
            key = self._urgent.popleft()
            self._urgent_processing.add(key)
        elif self._ready and (len(self._processing) - len(self._urgent_processing) < self._background_cap
                              or not self._urgent_processing):
            key = self._ready.popleft()
        else:
            return None
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def _done_locked(self, key: K) -> None:
        """``key`` was processed: free its lane's place, waking the workers the background's cap held back."""
        self._processing.discard(key)
        if key in self._urgent_processing:
            self._urgent_processing.discard(key)
            if not self._urgent_processing and not self._urgent and self._ready:
                self._cond.notify_all()  # the burst is over: every idle worker may take background keys again
        elif self._ready:
            self._cond.notify()

    def _work(self) -> None:
        while (key := self._next()) is not None:
            again: float | None = None
            try:
                again = self._handle(key)
                with self._cond:
                    self._failures.pop(key, None)
            except RetryAfter as exc:
                again = exc.delay if exc.delay is not None else self._backoff(key)
                log.warning("%s of %s: %s; again in %.1f s", self._name, key, exc, again)
            except Exception:
                again = self._backoff(key)
                log.exception("%s of %s failed; again in %.1f s", self._name, key, again)
            finally:
                with self._cond:
                    self._done_locked(key)
                    if key in self._dirty:
                        self._dirty.discard(key)
                        self._add_locked(key, key in self._dirty_urgent)
                        self._dirty_urgent.discard(key)
            if again is not None:
                self.add_after(key, again)

    def _backoff(self, key: K) -> float:
        with self._cond:
            failures = self._failures[key] = self._failures.get(key, 0) + 1
        return float(min(self._retry_max, self._retry_base * 2 ** (failures - 1)))
