"""Which models get a quality guard, and what its verdicts do to routing: the policy the plan, the canary, the
re-quantization and both traffic splits (the reconcile's and the autoscaler's, ``autoscale/split.py``) follow.
The guard's Deployment and route filters are built by ``builders/guard.py``; its settings are
``platform.GuardSettings``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from rerank_operator.core import names
from rerank_operator.core.platform import CHECKED, REFERENCE, GuardSettings
from rerank_operator.core.spec.model import RerankModelSpec


def excluded(below_floor: Collection[str], ready: Mapping[str, int]) -> names.PoolName | None:
    """The pool routing keeps traffic away from: one the guard finds below the floor while the other pool is not and
    has ready replicas (a worse ranking beats a failed request, so not otherwise). Routing (``routing.split``) and the
    autoscaler's policy (``split.effective_policy``) both follow it."""
    for pool, other in ((CHECKED, REFERENCE), (REFERENCE, CHECKED)):
        if pool in below_floor and other not in below_floor and ready.get(other, 0) > 0:
            return pool
    return None


def unavailable(spec: RerankModelSpec) -> str | None:
    """Why a guarded class's model cannot be checked (the guard is then not deployed), or None if it can."""
    if not spec.cpu.enabled:
        return "the model has no CPU pool: the guard checks the INT8 pool against the original weights"
    if not spec.quantization.enabled:
        return "quantization is disabled: both pools serve the original weights"
    return None


def applies(spec: RerankModelSpec, settings: GuardSettings | None) -> bool:
    """Whether the model gets a guard: its class turns it on and the model can be checked."""
    return settings is not None and unavailable(spec) is None
