"""How a new artifact reaches traffic when the model's quality guard can judge it: as a canary, a third backend of
the model's HTTPRoute taking the class's share of requests, promoted after enough requests compared within the
quality floor, rolled back below it (the guard's verdict is ``status.quality.canary``; ``plan.decide_artifact`` acts
on it). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rerank_operator.core import platform
from rerank_operator.core.builders import guard
from rerank_operator.core.quality import guard_policy
from rerank_operator.core.spec.model import RerankModelSpec


@dataclass(frozen=True)
class CanaryPolicy:
    """How new artifacts reach traffic when the model's quality guard can judge them (``builders/guard.py``)."""

    percent: int
    requests: int


def policy(spec: RerankModelSpec, settings: platform.GuardSettings | None) -> CanaryPolicy | None:
    """The class's canary, for a guarded model with a Gateway (the canary is the route's third backend)."""
    if settings is None or settings.canary_percent <= 0 or guard.replays(spec):
        return None
    if not guard_policy.applies(spec, settings):
        return None
    return CanaryPolicy(settings.canary_percent, settings.canary_requests)


def starts(record: Mapping[str, Any], served: Mapping[str, Any] | None) -> bool:
    """A new artifact goes through a canary (when there is a policy) if the guard can judge it: a stable artifact
    serves, and both come from the same weights (the GPU pool, the guard's reference, serves the stable one's)."""
    return bool(served) and bool(weights(record)) and weights(served or {}) == weights(record)


def weights(record: Mapping[str, Any]) -> str:
    """The weights an artifact record was made from (``weights``; records older than shared artifacts kept them in
    ``source``, which now says built or shared)."""
    legacy = record.get("source")
    return str(record.get("weights") or (legacy if legacy not in (None, "built", "shared") else "") or "")


def message(desired: str, served: Mapping[str, Any], canary: CanaryPolicy,
                    verdict: Mapping[str, Any]) -> str:
    compared = verdict.get("comparedRequests") if verdict.get("id") == desired else None
    progress = f"{compared}/{canary.requests}" if compared is not None else f"0/{canary.requests}"
    return (f"artifact {desired} serves {canary.percent}% of the requests as a canary beside {served.get('id')}; "
            f"promoted after {canary.requests} requests compared within the quality floor ({progress} so far)")
