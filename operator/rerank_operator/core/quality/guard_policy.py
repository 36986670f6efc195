"""Which models get a quality guard, and what its verdicts do to routing: the policy the plan, the canary, the
re-quantization and both traffic splits (the reconcile's and the autoscaler's, ``autoscale/split.py``) follow.
The guard's Deployment and route filters are built by ``builders/guard.py``; its settings are
``platform.GuardSettings``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from rerank_operator.core import gateway, names
from rerank_operator.core.gateway import GatewayView
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


@dataclass(frozen=True)
class SampleSource:
    """Where a guarded model's guard gets its live requests from. ``mirror``: the HTTPRoute's RequestMirror filter
    copies ``sample_fraction`` of them (an Extended feature); ``sampler``: a sampler beside TEI in each pool pod copies
    them after answering (Core features only: nothing of it is in the route); ``replay``: no route at all, so the guard
    replays the artifact's evaluation pairs. ``instead``: why it is not the mirror, for the model's status (empty
    when it is, or when the class chose)."""

    mode: Literal["mirror", "sampler", "replay"]
    instead: str = ""


def sample_source(spec: RerankModelSpec, settings: GuardSettings, gateways: Sequence[GatewayView]) -> SampleSource:
    """The mirror only where every parent Gateway supports it (or the class says so), else the pools' sampler: a
    route with a filter its gateway lacks may be accepted and then fail every request."""
    if spec.routing.gateway is None:
        return SampleSource("replay")
    if settings.sampling == "Mirror":
        return SampleSource("mirror")
    if settings.sampling == "Sampler":
        return SampleSource("sampler")
    features = (gateway.REQUEST_MIRROR, gateway.REQUEST_PERCENTAGE_MIRROR)
    if all(gateway.support(gateways, f) == "supported" for f in features):
        return SampleSource("mirror")
    said = "; ".join(f"{g.display} " + ("was not found" if not g.found else "publishes no supportedFeatures"
                                          if g.features is None else f"does not list {' or '.join(missing)}")
                     for g, missing in gateway.lacking(gateways, *features)) or "no parent Gateway"
    return SampleSource("sampler", f"{said}: the route carries no RequestMirror; the quality guard's sample is "
                                   f"copied by a sampler beside TEI in the pool pods (qualityGuard.sampling: Auto)")
