"""How the two loops of one process share a model: one home for their coordination.

The reconcile loop (``reconcile_loop.py``) and the autoscale loop (``autoscale_loop.py``) run in kopf's worker
threads and meet on the same RerankModel in three ways, all kept here:

- **Status writes never interleave.** Both write ``status.conditions`` with a merge patch, which replaces the whole
  list, so neither may write between the other's read and write: one lock per model (``status_lock``).
- **Reconciles of one model never overlap.** A trigger arriving while one runs makes it run once more instead
  (``coalesce``), so a burst of Deployment status events costs at most two reconciles.
- **The decision hand-off.** The autoscale loop never writes a Deployment or an HTTPRoute. It records its decision
  in ``status.autoscaling.lastDecision`` (under the status lock), then asks for a reconcile (its
  ``after_decision``); the reconcile loop's pure plan (``core/plan.py``) reads the decision from the status and
  applies replicas and weights. The status is the only channel between the loops, so a restarted operator, or a
  second one taking over, finds every decision where the first left it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

ModelKey = tuple[str, str]  # (namespace, name)
T = TypeVar("T")


class Handoff:
    """The per-model locks and the coalescing of reconciles, for one operator process (thread-safe)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[ModelKey, threading.Lock] = {}
        self._running: dict[ModelKey, bool] = {}  # key -> run again after the current reconcile

    def status_lock(self, namespace: str, name: str) -> threading.Lock:
        """The lock around every status write of one model (both loops take it)."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def reconciling(self) -> int:
        """How many models are being reconciled right now (the liveness probe reports it)."""
        with self._guard:
            return len(self._running)

    def coalesce(self, key: ModelKey, run: Callable[[], T]) -> T | None:
        """Run ``run`` for ``key`` unless a run for it is in progress; then that run repeats once more when it ends
        (and this call returns None). Returns the result of the last run otherwise."""
        with self._guard:
            if key in self._running:
                self._running[key] = True
                return None
            self._running[key] = False
        try:
            while True:
                result = run()
                with self._guard:
                    if not self._running[key]:
                        return result
                    self._running[key] = False
        finally:
            with self._guard:
                self._running.pop(key, None)
