"""Opt-in self-healing: re-quantize on the model's own live traffic when the guard finds the CPU pool drifting. Pure.

With the tenant's consent (``quantization.requantizeOnDrift``, off by default) the model's quality guard keeps a
bounded, expiring sample of the mirrored live requests on the model's volume (``samples/<model>/live.jsonl``,
``quality_guard/sample.py``) and exports how many pairs it holds. When the guard finds the *stable* CPU artifact
ranking below the floor on live traffic (calibration drift: live queries no longer look like the data the artifact
was calibrated and judged on), :func:`decide` starts a new round: ``status.quality.requantization.count`` goes up.

:func:`effective` turns that round into the spec the reconcile loop plans from: the sample becomes the Job's
evaluation data (the auto recipe keeps the fastest candidate that passes the gate *on live queries*) and, in mode
static, its calibration data; the round is part of the artifact's identity (``artifact.inputs``), so exactly one
new Job runs, and its artifact goes through the canary like any other (``plan.py``). Nothing here reads the sample:
the guard counts it, the Job reads it.

A round needs enough pairs (``MIN_SAMPLE_PAIRS``) and no new artifact on its way (the last round's Job or canary);
after a round, ``minIntervalHours`` since its start and since its artifact was promoted or rolled back: an artifact
that still drifts, or a canary rolled back, waits that long before the next try, so a model whose drift no recipe
fixes re-quantizes once a day at most (by default), not in a loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from rerank_contracts import artifact_layout
from rerank_operator.core import platform
from rerank_operator.core.leadership import parse_micro_time
from rerank_operator.core.spec.model import DataSource, RequantizeOnDrift, RerankModelSpec
from rerank_operator.core.status import conditions
from rerank_operator.core.status.events import Event

#: The least sample a round quantizes on: the Job's gate needs enough pairs to be meaningful (its default
#: evaluation set has 840), and the canary's default needs 200 compared requests.
MIN_SAMPLE_PAIRS = 200


def sample_path(model: str) -> str:
    """Where the guard keeps the model's live sample, relative to the volume's root."""
    return f"{artifact_layout.SAMPLES_DIR}/{model}/{artifact_layout.LIVE_SAMPLE_FILE}"


def recorded(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """``status.quality.requantization`` ({} before the first round)."""
    found = (status.get("quality") or {}).get("requantization")
    return found if isinstance(found, Mapping) else {}


def round_of(status: Mapping[str, Any]) -> int:
    count = recorded(status).get("count", 0)
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def round_token(status: Mapping[str, Any]) -> str:
    """What names a round in the artifact's identity: its number and start. The start too, because a record can be
    lost (a status restored from a backup, a model re-created) and numbers reused: a reused id would find the old
    round's artifact published and serve it (``AlreadyPublished``) without re-quantizing on today's sample."""
    found = recorded(status)
    return f"{round_of(status)}@{found.get('since', '')}"


def effective(spec: RerankModelSpec, status: Mapping[str, Any], model: str) -> RerankModelSpec:
    """The spec the artifact is planned from: the model's own, or, after a round with consent still given, the same
    with the live sample as its evaluation (and, in mode static, calibration) data. Consent withdrawn: the spec's
    own data again (and the artifact it names)."""
    q = spec.quantization
    if not q.enabled or not q.requantize_on_drift.enabled or round_of(status) == 0:
        return spec
    sample = DataSource(path=sample_path(model))
    return replace(spec, quantization=replace(
        q, evaluation_data=sample, calibration_data=sample if q.mode == "static" else q.calibration_data,
        live_round=round_token(status)))


#: ``status.pendingArtifact.state`` while a new artifact is on its way (its Job, or serving as a canary).
SETTLING_STATES = frozenset({"Creating", "Running", "Canary"})


@dataclass(frozen=True)
class Look:
    """What one look at the guard and the model's status says, as far as a round is concerned."""

    below_floor: frozenset[str]  # a fresh verdict's pools below the floor
    sample_pairs: int  # pairs in the guard's sample file (0: none, or no consent)
    settling: bool  # a new artifact is on its way: its Job runs, or it serves as a canary
    served: str | None  # the stable artifact's id
    settled_at: datetime | None = None  # when the last new artifact was promoted or rolled back

    @classmethod
    def of(cls, status: Mapping[str, Any], below_floor: frozenset[str], sample_pairs: int) -> Look:
        """From ``status`` as the reconcile loop wrote it."""
        pending = status.get("pendingArtifact") or {}
        served = status.get("artifact") or {}
        times = [parse_micro_time(served.get("publishedAt"))]
        degraded = conditions.find(status.get("conditions") or [], conditions.DEGRADED) or {}
        if degraded.get("reason") == conditions.REASON_CANARY_ROLLED_BACK:
            times.append(parse_micro_time(degraded.get("lastTransitionTime")))
        known = [t for t in times if t is not None]
        return cls(below_floor=below_floor, sample_pairs=sample_pairs,
                   settling=pending.get("state") in SETTLING_STATES, served=served.get("id"),
                   settled_at=max(known) if known else None)


def decide(policy: RequantizeOnDrift, previous: Mapping[str, Any], look: Look,
           now: datetime) -> tuple[dict[str, Any] | None, Event | None]:
    """``status.quality.requantization`` after this look (None: none yet) and the Event when a round starts. Only the
    checked (INT8) pool below the floor counts: a GPU pool below it is not the artifact's doing. Never while a new
    artifact is on its way (the last round's Job or canary: a new round would replace its Job), and, after a round,
    never within ``minIntervalHours`` of its start or of the last artifact's promotion or rollback."""
    kept = dict(previous) or None
    if not policy.enabled or platform.CHECKED not in look.below_floor or look.settling or look.served is None:
        return kept, None
    if look.sample_pairs < MIN_SAMPLE_PAIRS:
        return kept, None
    # After a round: from its start, and from when its artifact (or any since) was promoted or rolled back.
    since = parse_micro_time(previous.get("since"))
    last = [t for t in (since, look.settled_at if previous else None) if t is not None]
    if last and now - max(last) < timedelta(hours=policy.min_interval_hours):
        return kept, None
    count = (previous.get("count") or 0) + 1
    record = {"count": count, "since": now.isoformat().replace("+00:00", "Z"), "fromArtifact": look.served,
              "samplePairs": look.sample_pairs,
              "reason": f"the CPU pool's artifact {look.served} ranks below the quality floor on live traffic"}
    return record, Event("Normal", conditions.REASON_REQUANTIZING, (
        f"re-quantizing on {look.sample_pairs} pairs of live traffic (round {count}): the CPU pool's artifact "
        f"{look.served} ranks below the quality floor on it; the new artifact serves as a canary first"))

