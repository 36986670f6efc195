"""The policy's memory between ticks: recommendations, last scale/shift times, learned per-replica capacity.

It is a value (frozen, replaced by each decision) small enough for an annotation, so an operator restart can
resume with its stabilization windows and cooldowns intact instead of acting on one fresh sample.
`from_dict` never raises: a damaged or foreign annotation just means starting without memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rerank_operator.core.names import ZERO_PHASES, ZeroPhase

# Per pool, a safety cap only: `record` keeps just the recommendations that can still be some window's highest or
# lowest, at most two per distinct replica count, so any window (up to the CRD's 3600 s) at any interval fits.
MAX_RECOMMENDATIONS = 256
MAX_REVERSALS = 8
MAX_SURGES = 32  # remembered surges of the arrival rate (`surge.observe`); a day of hourly surges fits


@dataclass(frozen=True)
class PoolHistory:
    recommendations: tuple[tuple[float, int], ...] = ()  # (time, replicas), oldest first
    last_scale_up: float | None = None
    last_scale_down: float | None = None
    # Requests/s one ready replica serves within the targets. Learned, see policy.learn_capacity.
    capacity: float | None = None
    capacity_from_saturation: bool = False
    last_state: tuple[int, bool] | None = None  # (ready replicas, over target) at the previous fresh tick
    # Scale-ups that undid a scale-down within its stabilization window (`scaling.scale`), newest last.
    reversals: tuple[float, ...] = ()
    # When the newest sample the policy acted on was taken (unix seconds): a tick whose measurement fails while it
    # is younger than staleAfterSeconds is a miss, not stale data (policy.decide). Not saved in the annotation: a
    # restarted operator has no sample yet.
    sampled_at: float | None = None

    def record(self, now: float, replicas: int, keep_seconds: float) -> PoolHistory:
        """Add this tick's recommendation; forget what no window up to `keep_seconds` can need.

        Windows only ask for the highest (scale-down) or lowest (scale-up) recommendation since some time, and such
        a window always ends now. A recommendation with a later one at least as high can never be a window's
        highest, nor one with a later one at least as low its lowest: dropping those keeps every answer exact and
        the history at most two entries per distinct replica count, however long the window or short the interval
        (a plain list of the last N ticks silently shortened windows longer than N intervals)."""
        recent = [(t, r) for t, r in self.recommendations if now - t <= keep_seconds and t <= now]
        kept = [(now, replicas)]              # the newest always answers the shortest window
        highest = lowest = replicas
        for t, r in reversed(recent):
            if r > highest or r < lowest:
                kept.append((t, r))
                highest, lowest = max(highest, r), min(lowest, r)
        return replace(self, recommendations=tuple(reversed(kept))[-MAX_RECOMMENDATIONS:])

    def within(self, now: float, seconds: float) -> list[int]:
        return [r for t, r in self.recommendations if now - t <= seconds]

    def to_dict(self) -> dict[str, Any]:
        return {
            "recs": [[round(t, 3), r] for t, r in self.recommendations],
            "up": self.last_scale_up,
            "down": self.last_scale_down,
            "capacity": None if self.capacity is None else round(self.capacity, 4),
            "saturated": self.capacity_from_saturation,
            "last": None if self.last_state is None else list(self.last_state),
            "rev": [round(t, 3) for t in self.reversals],
        }

    @classmethod
    def from_dict(cls, data: Any) -> PoolHistory:
        if not isinstance(data, Mapping):
            return cls()
        try:
            recs = tuple((float(t), int(r)) for t, r in data.get("recs") or ())
            capacity = data.get("capacity")
            last = data.get("last")
            return cls(
                recommendations=recs[-MAX_RECOMMENDATIONS:],
                last_scale_up=_optional_float(data.get("up")),
                last_scale_down=_optional_float(data.get("down")),
                capacity=_optional_float(capacity) if capacity and float(capacity) > 0 else None,
                capacity_from_saturation=bool(data.get("saturated", False)),
                last_state=None if not last else (int(last[0]), bool(last[1])),
                reversals=tuple(float(t) for t in data.get("rev") or ())[-MAX_REVERSALS:],
            )
        except (TypeError, ValueError):
            return cls()




@dataclass(frozen=True)
class ZeroState:
    """Where a model that may scale to zero stands (``zero.step``): the phase, since when, and the last time a
    request was seen (by a pool or by the activator). Saved, so a restarted operator keeps a sleeping model asleep
    instead of waking it by forgetting."""

    phase: ZeroPhase = "awake"
    since: float | None = None
    last_request: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"phase": self.phase, "since": self.since, "last": self.last_request}

    @classmethod
    def from_dict(cls, data: Any) -> ZeroState:
        if not isinstance(data, Mapping) or data.get("phase") not in ZERO_PHASES:
            return cls()
        return cls(data["phase"], _optional_float(data.get("since")), _optional_float(data.get("last")))


@dataclass(frozen=True)
class History:
    gpu: PoolHistory = field(default_factory=PoolHistory)
    cpu: PoolHistory = field(default_factory=PoolHistory)
    last_spill: float | None = None    # last time the CPU share was raised
    last_recover: float | None = None  # last time the CPU share was lowered
    # The total arrival rate at the fresh ticks of the last `surge.NET_OF_RISE_S` (time, requests/s), oldest first:
    # what a rise is measured against. Not saved in the annotation (a restarted operator measures afresh).
    arrivals: tuple[tuple[float, float], ...] = ()
    # Recent surges of the arrival rate, (time, rise in requests/s), oldest first: what `surge.reserve` sizes the
    # GPU pool's standing headroom from. Saved, so a restart keeps the headroom the traffic has taught.
    surges: tuple[tuple[float, float], ...] = ()
    zero: ZeroState = field(default_factory=ZeroState)  # scale to zero (`zero.step`); awake for other models
    # The arrival rate's recent excursions above what the ready GPU replicas serve, (end time, seconds, requests
    # beyond what they serve), oldest first, and the one under way (its start, requests so far, and what the GPU
    # served when it began): whether a CPU bridge can serve this traffic's bursts (`bursts.bridge_worth`). Not saved
    # (a restarted operator has no evidence, and grows the bridge as before).
    excursions: tuple[tuple[float, float, float], ...] = ()
    excursion_since: float | None = None
    excursion_requests: float = 0.0
    excursion_served: float = 0.0      # what the ready GPU replicas served when the one under way began

    def pool(self, name: str) -> PoolHistory:
        return self.gpu if name == "gpu" else self.cpu

    def without_samples(self) -> History:
        """This memory with no sample times: what a new metrics source starts from (its first failure holds)."""
        return replace(self, gpu=replace(self.gpu, sampled_at=None), cpu=replace(self.cpu, sampled_at=None))

    def with_pool(self, name: str, pool: PoolHistory) -> History:
        return replace(self, gpu=pool) if name == "gpu" else replace(self, cpu=pool)

    def to_dict(self) -> dict[str, Any]:
        return {"v": 1, "gpu": self.gpu.to_dict(), "cpu": self.cpu.to_dict(), "spill": self.last_spill,
                "recover": self.last_recover, "surges": [[round(t, 3), round(s, 2)] for t, s in self.surges],
                **({"zero": self.zero.to_dict()} if self.zero != ZeroState() else {})}

    @classmethod
    def from_dict(cls, data: Any) -> History:
        if not isinstance(data, Mapping) or data.get("v") != 1:
            return cls()
        try:
            return cls(PoolHistory.from_dict(data.get("gpu")), PoolHistory.from_dict(data.get("cpu")),
                       _optional_float(data.get("spill")), _optional_float(data.get("recover")),
                       surges=tuple((float(t), float(s)) for t, s in data.get("surges") or ())[-MAX_SURGES:],
                       zero=ZeroState.from_dict(data.get("zero")))
        except (TypeError, ValueError):
            return cls()


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
