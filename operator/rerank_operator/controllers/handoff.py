"""How the two loops of one process share a model: one home for their coordination.

The reconcile loop (``reconcile_loop.py``) and the autoscale loop (``autoscale_loop.py``) run in kopf's worker
threads and meet on the same RerankModel in three ways, all kept here:

- **Status writes never interleave.** Both write ``status.conditions`` with a merge patch, which replaces the whole
  list, so neither may write between the other's read and write: one lock per model (``status_lock``).
- **Reconciles of one model never overlap**: the reconcile queue (``workqueue.py``) never hands one key to two
  workers, and a trigger arriving while one runs makes it run once more.
- **The decision hand-off.** The autoscale loop never writes a Deployment or an HTTPRoute. It records its decision
  in ``status.autoscaling.lastDecision`` (under the status lock), then asks for a reconcile (its
  ``after_decision``); the reconcile loop's pure plan (``core/reconcile/plan.py``) reads the decision from the status
  and applies replicas and weights. The status is the only channel between the loops, so a restarted operator, or a
  second one taking over, finds every decision where the first left it.
"""

from __future__ import annotations

import threading

from rerank_operator.core.names import ModelKey


class Handoff:
    """The per-model status locks of one operator process (thread-safe)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[ModelKey, threading.Lock] = {}

    def status_lock(self, namespace: str, name: str) -> threading.Lock:
        """The lock around every status write of one model (both loops take it)."""
        with self._guard:
            return self._locks.setdefault((namespace, name), threading.Lock())

    def forget(self, namespace: str, name: str) -> None:
        """Drop the lock of a model that is gone."""
        with self._guard:
            self._locks.pop((namespace, name), None)
