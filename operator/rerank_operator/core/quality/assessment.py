"""Serving-time ranking quality: what the operator makes of its quality guard's figures. Pure.

The guard (``quality_guard/``, deployed per model by ``builders/guard.py``) compares the CPU pool's rankings of
mirrored live requests with the GPU pool's (FP16, the reference) and decides, with statistical confidence and
hysteresis, whether the pool ranks below the model's quality floor (its quantization gate). That decision is the
guard's: this module only reads it from the guard's ``/metrics`` (``rerank_guard_below_floor`` and the figures
beside it), turns it into ``status.quality``, the ``QualityVerified`` condition and Events, and tells routing and the
autoscaler which pools are *below the floor* (routing gives such a pool weight 0 while the other pool has ready
replicas; the autoscaler sizes the other pool for all the traffic).

Why a per-model guard: a mirrored request carries no model identity (the gateway copies the request to one
backend), so the guard a route mirrors to must be the model's own; its detectors, floor and budget are the model's
too. It is opt-in per RerankClass (``spec.qualityGuard``), and its cost is bounded there: the mirrored fraction and the
extra calls per second. Who is guarded and how is ``builders/guard.py``'s ``GuardSettings`` and ``unavailable``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rerank_contracts import quantize_job
from rerank_operator.core import names, platform
from rerank_operator.core.autoscale import exposition
from rerank_operator.core.quality import requantize
from rerank_operator.core.spec.model import RequantizeOnDrift
from rerank_operator.core.status import conditions
from rerank_operator.core.status.conditions import Condition
from rerank_operator.core.status.events import Event

QUALITY_VERIFIED = conditions.QUALITY_VERIFIED
CHECKED, REFERENCE = platform.CHECKED, platform.REFERENCE


@dataclass(frozen=True)
class PoolQuality:
    """One pool's figures as the guard exports them (over its detection window)."""

    below_floor: bool
    window_requests: int
    compared_requests: int = 0  # since the guard process started
    spearman: float | None = None
    spearman_low: float | None = None
    topk_agreement: float | None = None
    topk_low: float | None = None
    failure_ratio: float | None = None
    reason: str = ""  # why the guard put the pool in its state (fixed until the next transition)

    def to_status(self) -> dict[str, Any]:
        values: dict[str, Any] = {"belowFloor": self.below_floor, "windowRequests": self.window_requests,
                                  "spearman": _round(self.spearman), "spearmanCi95Low": _round(self.spearman_low),
                                  "topKAgreement": _round(self.topk_agreement), "topKCi95Low": _round(self.topk_low),
                                  "failureRatio": _round(self.failure_ratio)}
        return {k: v for k, v in values.items() if v is not None}

    def summary(self) -> str:
        parts = [f"{self.window_requests} sampled requests"]
        if self.spearman is not None:
            low = f" (95% low {self.spearman_low:.4f})" if self.spearman_low is not None else ""
            parts.append(f"Spearman {self.spearman:.4f}{low}")
        if self.topk_agreement is not None:
            parts.append(f"top-k agreement {self.topk_agreement:.3f}")
        if self.failure_ratio:
            parts.append(f"broken scores in {100 * self.failure_ratio:.1f}%")
        return ", ".join(parts)

    def why(self) -> str:
        """The guard's own reason for the pool's state (the figures it decided on, fixed until the next transition,
        so a message recorded later still says why), else the live figures."""
        return self.reason or self.summary()


@dataclass(frozen=True)
class Verdict:
    """What the guard said at one look: per pool figures, or why it could not be read."""

    pools: Mapping[str, PoolQuality] = field(default_factory=dict)
    error: str | None = None
    #: Pairs in the guard's live sample on the volume (``quantization.requantizeOnDrift``; 0 without consent).
    live_pairs: int = 0

    @property
    def below_floor(self) -> frozenset[str]:
        """Serving pools (cpu, gpu) below the floor: what routing keeps traffic away from."""
        return frozenset(p for p, q in self.pools.items() if q.below_floor and p in names.POOLS)


LIVE_PAIRS_METRIC = "rerank_guard_live_sample_pairs"
_FIGURES = {"rerank_guard_below_floor": "below_floor", "rerank_guard_window_requests": "window_requests",
            "rerank_guard_compared_requests": "compared_requests",
            "rerank_guard_spearman": "spearman", "rerank_guard_spearman_ci95_low": "spearman_low",
            "rerank_guard_topk_agreement": "topk_agreement", "rerank_guard_topk_agreement_ci95_low": "topk_low",
            "rerank_guard_failure_ratio": "failure_ratio"}


def parse_metrics(text: str, namespace: str, model: str) -> Verdict:
    """The guard's ``/metrics`` for ``namespace/model`` (a guard labels every series with its model: a page about
    another model, e.g. a misrouted address, yields no pools rather than its numbers)."""
    try:
        samples = exposition.parse(text)
    except exposition.ExpositionError as exc:
        return Verdict(error=f"the guard's /metrics is not Prometheus text: {exc}")
    found: dict[str, dict[str, float]] = {}
    reasons: dict[str, str] = {}
    live_pairs = 0
    for sample in samples:
        key = _FIGURES.get(sample.name)
        labels = sample.labels
        if labels.get("namespace") != namespace or labels.get("rerankmodel") != model:
            continue
        if sample.name == LIVE_PAIRS_METRIC and math.isfinite(sample.value):
            live_pairs = max(0, int(sample.value))
        if sample.name == "rerank_guard_state_info" and sample.value >= 0.5:
            reasons[labels.get("pool", "")] = labels.get("reason", "")
        if key is None:
            continue
        found.setdefault(labels.get("pool", ""), {})[key] = sample.value
    pools: dict[str, PoolQuality] = {}
    for pool, values in found.items():
        if pool not in (*names.POOLS, names.CANARY) or "below_floor" not in values:
            continue
        pools[pool] = PoolQuality(
            below_floor=values["below_floor"] >= 0.5, window_requests=int(values.get("window_requests", 0)),
            compared_requests=int(values.get("compared_requests", 0)), reason=reasons.get(pool, ""),
            **{k: _finite(values.get(k)) for k in ("spearman", "spearman_low", "topk_agreement", "topk_low",
                                                   "failure_ratio")})
    if not pools:
        return Verdict(error="the guard exports no figures for this model yet", live_pairs=live_pairs)
    return Verdict(pools, live_pairs=live_pairs)


def below_floor_of(status: Mapping[str, Any]) -> frozenset[str]:
    """The pools ``status.quality`` records as below the floor (what routing keeps traffic away from)."""
    recorded = (status.get("quality") or {}).get("belowFloor") or ()
    return frozenset(str(p) for p in recorded if p in names.POOLS)


def refused_by_artifact(record: Mapping[str, Any] | None) -> tuple[frozenset[str], str | None]:
    """The pools the served artifact's own figures keep out of traffic, and why: the GPU pool when the Job found the
    original weights overflow in float16 (``quantize_job.fp16_refusal``). Routing and the autoscaler add them to the
    pools below the floor: the other pool takes everything while it has ready replicas."""
    why = quantize_job.fp16_refusal((record or {}).get("quality") or {})
    return (frozenset({"gpu"}), why) if why is not None else (frozenset(), None)


def against(reference: str) -> str:
    """How a message names the reference: a pool, or the FP32 scores the guard computes (no GPU pool)."""
    return f"the {reference.upper()} pool" if reference in names.POOLS else "FP32 of the original weights"


def status_record(verdict: Verdict | None, guard_name: str, why_not: str | None,
                  reference: str = REFERENCE) -> dict[str, Any]:
    """``status.quality`` without ``belowFloor``, which ``assess`` sets: the guard and each pool's figures. Without a
    fresh verdict (guard not ready or not answering) the recorded pools below the floor are kept, never cleared: a
    pool taken out for quality comes back on the guard's word, not because the guard went away."""
    if why_not is not None:
        return {"guard": None, "message": why_not}
    record: dict[str, Any] = {"guard": guard_name, "reference": reference}
    if verdict is not None and verdict.error is None:
        record["pools"] = {p: q.to_status() for p, q in sorted(verdict.pools.items())}
    elif verdict is not None:
        record["message"] = verdict.error
    return record


def condition(verdict: Verdict | None, why_not: str | None, kept_below: frozenset[str],
              other_ready: Mapping[str, int], reference: str = REFERENCE) -> Condition:
    """``QualityVerified``: True while every checked pool is within the floor, False while one is below it (with
    its figures and where its traffic went), Unknown while there is no verdict."""
    if why_not is not None:
        return Condition(QUALITY_VERIFIED, "Unknown", conditions.REASON_GUARD_NOT_APPLICABLE, why_not)
    if verdict is None or verdict.error is not None:
        detail = "the guard has no ready pod" if verdict is None else verdict.error
        if kept_below:
            return Condition(QUALITY_VERIFIED, "False", conditions.REASON_BELOW_FLOOR,
                             f"{detail}; pools still held below the floor from its last verdict: "
                             f"{', '.join(sorted(kept_below))}")
        return Condition(QUALITY_VERIFIED, "Unknown", conditions.REASON_GUARD_PENDING, str(detail))
    below = verdict.below_floor
    if below:
        parts = []
        for pool in sorted(below):
            other = REFERENCE if pool == CHECKED else CHECKED
            if other_ready.get(other, 0) > 0:
                where = f"its traffic goes to the {other.upper()} pool"
            elif reference in names.POOLS:
                where = f"it keeps serving: the {other.upper()} pool has no ready replica"
            else:
                where = "it keeps serving: the model has no other pool"
            parts.append(f"{pool} pool below the quality floor vs {against(reference)}: "
                         f"{verdict.pools[pool].why()}; {where}")
        return Condition(QUALITY_VERIFIED, "False", conditions.REASON_BELOW_FLOOR, "; ".join(parts))
    checked = verdict.pools.get(CHECKED)
    if checked is None or checked.window_requests == 0:
        return Condition(QUALITY_VERIFIED, "Unknown", conditions.REASON_GUARD_PENDING,
                         "the guard has not compared any sampled request yet")
    return Condition(QUALITY_VERIFIED, "True", conditions.REASON_WITHIN_FLOOR,
                     f"{CHECKED} pool within the quality floor vs {against(reference)}: {checked.summary()}")


def events(before: frozenset[str], after: frozenset[str], verdict: Verdict | None) -> list[Event]:
    """One Event per pool that went below the floor (Warning) or came back (Normal)."""
    found: list[Event] = []
    pools = verdict.pools if verdict is not None else {}
    for pool in sorted(after - before):
        figures = pools[pool].why() if pool in pools else "no figures"
        found.append(Event("Warning", conditions.REASON_BELOW_FLOOR,
                           f"{pool} pool ranks below the quality floor ({figures}): taken out of traffic while the "
                           f"other pool can serve"))
    for pool in sorted(before - after):
        figures = pools[pool].why() if pool in pools else "no figures"
        found.append(Event("Normal", conditions.REASON_QUALITY_RESTORED,
                           f"{pool} pool is back within the quality floor ({figures}): it takes traffic again"))
    return found


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(frozen=True)
class Assessment:
    """One look at a guarded model: what to record, the condition, the pools below the floor, the Events, and whether
    the guard just decided a canary (the reconcile loop then promotes or rolls it back at once)."""

    record: Mapping[str, Any]
    condition: Condition
    below_floor: frozenset[str]
    events: tuple[Event, ...]
    canary_decided: bool = False


def canary_verdict(status: Mapping[str, Any], verdict: Verdict | None,
                   min_requests: int) -> dict[str, Any] | None:
    """``status.quality.canary`` while a canary runs (``status.canary``): rollback as soon as the guard finds it below
    the floor, promote once it compared ``min_requests`` requests on it within the floor, else running. A decision
    sticks (the plan acts on it; a guard restarted meanwhile must not undo it)."""
    ongoing = status.get("canary") or {}
    if ongoing.get("state") != "Running":
        return None
    canary_id = (ongoing.get("artifact") or {}).get("id")
    before = (status.get("quality") or {}).get("canary") or {}
    if before.get("id") == canary_id and before.get("verdict") in ("promote", "rollback"):
        return dict(before)
    found = verdict.pools.get(names.CANARY) if verdict is not None and verdict.error is None else None
    if found is None:
        compared = int(before.get("comparedRequests", 0)) if before.get("id") == canary_id else 0
        return {"id": canary_id, "verdict": "running", "comparedRequests": compared,
                "message": "the guard has not compared the canary yet"}
    state = "running"
    if found.below_floor:
        state = "rollback"
    elif found.compared_requests >= min_requests:
        state = "promote"
    return {"id": canary_id, "verdict": state, "comparedRequests": found.compared_requests,
            "message": found.summary()}


def assess(status: Mapping[str, Any], verdict: Verdict | None, why_not: str | None,
           ready: Mapping[str, int], guard_name: str, canary_requests: int = 0,
           reference: str = REFERENCE, drift: tuple[RequantizeOnDrift, datetime] | None = None) -> Assessment:
    """From the model's recorded status and this look's verdict from its guard ``guard_name`` (None: no ready guard pod;
    ``why_not``: the model cannot be checked). Without a fresh verdict, the recorded pools below the floor stay so
    (``status_record``). ``canary_requests``: what a canary must show before it is promoted. ``reference``: what the
    guard compares with (``builders.guard.reference_of``). ``drift``: the model's ``requantizeOnDrift`` and the time
    now, to decide a re-quantization round (``requantize.decide``); its record is kept from look to look."""
    before = below_floor_of(status)
    fresh = verdict is not None and verdict.error is None
    below: frozenset[str] = frozenset()
    if why_not is None:
        below = verdict.below_floor if fresh and verdict is not None else before
    record = {**status_record(verdict, guard_name, why_not, reference), "belowFloor": sorted(below)}
    decided = False
    if why_not is None:
        canary = canary_verdict(status, verdict, canary_requests)
        if canary is not None:
            record["canary"] = canary
            previous = (status.get("quality") or {}).get("canary") or {}
            decided = canary["verdict"] != "running" and (previous.get("id"), previous.get("verdict")) != (
                canary["id"], canary["verdict"])
    found = list(events(before, below, verdict))
    previous_round = requantize.recorded(status)
    if previous_round:
        record["requantization"] = dict(previous_round)
    if fresh and verdict is not None and why_not is None:
        if verdict.live_pairs:
            record["livePairs"] = verdict.live_pairs
        if drift is not None:
            look = requantize.Look.of(status, below, verdict.live_pairs)
            new_round, event = requantize.decide(drift[0], previous_round, look, drift[1])
            if new_round is not None:
                record["requantization"] = new_round
            if event is not None:  # posted, it also wakes the reconcile loop, which plans the round's Job
                found.append(event)
    return Assessment(record, condition(verdict, why_not, below, ready, reference), below, tuple(found), decided)
