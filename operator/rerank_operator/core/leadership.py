"""Lease-based leader election, decided from plain data: client-go's leaderelection, one step at a time.

Two operator replicas share one ``coordination.k8s.io/v1`` Lease; the one named in ``spec.holderIdentity`` writes
(reconciles, status), the other keeps its caches warm and waits. controllers/leader.py reads the Lease, calls
:func:`step` and writes what it says through adapters/lease.py; the write is guarded by the Lease's
``metadata.resourceVersion``, so of two replicas acting on the same record only one wins (the other gets a 409 and
follows). Everything here is pure so the timing rules, which are the whole of the safety argument, are unit-tested.

Why expiry is measured on the follower's own clock, never from the holder's ``renewTime``:
a follower takes over only after it has seen the *same* record (holder, renewTime, durations: the whole spec)
unchanged for ``leaseDurationSeconds``, timed from when *it* first saw that record (:class:`Observation`). The
holder wrote that record before the follower could read it, so on any clock running at the true rate the follower's
takeover comes at least ``leaseDurationSeconds`` after the holder's last successful renew. The holder, for its part,
stops acting as leader when ``renew_deadline`` has passed on *its* clock since it sent its last successful renew
(controllers/leader.py), and ``renew_deadline < lease_duration``. Both are durations measured locally, so an offset
between two machines' wall clocks (the usual skew: minutes, even hours) changes nothing; only a difference in clock
*rates* could, and the margin ``lease_duration - renew_deadline`` (3 s of 10 by default) absorbs any real drift.
Had the follower compared the holder's ``renewTime`` with its own wall clock, a follower running a few seconds ahead
would take over a live leader: two writers of one model's status. The timestamps written (``acquireTime``,
``renewTime``) are for people and ``kubectl``; the decision never trusts another machine's clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

DEFAULT_LEASE_NAME = "rerank-operator"
Action = Literal["acquire", "renew", "follow"]


@dataclass(frozen=True)
class LeaderElectionSettings:
    """``--leader-election*``: whether two replicas elect one writer, which Lease they share, and its timing.

    ``lease_duration_seconds``: how long a follower waits, after it last saw the record change, before it takes
    over. ``renew_deadline_seconds``: how long the leader keeps leading without a successful renew; it must be
    shorter than the lease duration, or a leader could still write after a follower took over.
    ``retry_period_seconds``: how often both try (to acquire, to renew); shorter than the deadline so a leader gets
    more than one try before it gives up. The defaults are controller-runtime's ratios scaled to fail over within
    15 s of a leader's death (10 + 2 s at worst, plus one request).
    """

    enabled: bool = False
    namespace: str | None = None
    name: str = DEFAULT_LEASE_NAME
    lease_duration_seconds: float = 10
    renew_deadline_seconds: float = 7
    retry_period_seconds: float = 2

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("leader election: the Lease name (--leader-election-id) must not be empty")
        if min(self.lease_duration_seconds, self.renew_deadline_seconds, self.retry_period_seconds) <= 0:
            raise ValueError("leader election: lease duration, renew deadline and retry period must be positive")
        if not self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                f"leader election: the renew deadline ({self.renew_deadline_seconds:g}s) must be shorter than the "
                f"lease duration ({self.lease_duration_seconds:g}s), or a leader that cannot renew would still "
                "write after a standby took over")
        if not self.retry_period_seconds < self.renew_deadline_seconds:
            raise ValueError(
                f"leader election: the retry period ({self.retry_period_seconds:g}s) must be shorter than the renew "
                f"deadline ({self.renew_deadline_seconds:g}s), or a leader gets no second try before it gives up")

    @property
    def lease_seconds(self) -> int:
        """``spec.leaseDurationSeconds`` is an int32: rounded up, which only makes followers wait longer."""
        return max(1, math.ceil(self.lease_duration_seconds))


@dataclass(frozen=True)
class Observation:
    """A Lease spec as this process last saw it, and when (its own clock) it first saw it that way."""

    record: Mapping[str, Any]
    at: datetime


@dataclass(frozen=True)
class Step:
    """What to do now. ``acquire``/``renew``: write ``lease_spec`` (guarded by the resourceVersion that was read);
    ``follow``: ``holder`` leads until ``expires_at`` (our clock) unless its record changes before then. ``observed``
    goes into the next call of :func:`step`."""

    action: Action
    observed: Observation | None
    lease_spec: dict[str, Any] = field(default_factory=dict)
    holder: str = ""
    expires_at: datetime | None = None

    @property
    def leads(self) -> bool:
        return self.action != "follow"


def format_micro_time(when: datetime) -> str:
    """A MicroTime as the API server writes one: RFC 3339, six fractional digits, UTC ``Z``."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_micro_time(text: str | None) -> datetime | None:
    """A MicroTime (or a plain RFC 3339 Time) back to an aware datetime; None when absent or malformed."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def step(lease_spec: Mapping[str, Any] | None, identity: str, now: datetime, settings: LeaderElectionSettings,
         observed: Observation | None = None) -> Step:
    """The next move for ``identity`` given the Lease's spec as just read (None: there is no Lease yet).

    - no Lease, or no holder (never held, or released): acquire;
    - held by us: renew (acquireTime and leaseTransitions kept);
    - held by someone else: follow until the record has stayed unchanged for its ``leaseDurationSeconds`` since we
      first saw it (``observed``, our clock: see the module docstring), then acquire, counting one transition.
    """
    record = dict(lease_spec or {})
    holder = str(record.get("holderIdentity") or "")
    if holder == identity:
        return Step("renew", Observation(record, now), _spec(identity, now, settings, record, takeover=False))
    if holder:
        seen = observed if observed is not None and observed.record == record else Observation(record, now)
        duration = record.get("leaseDurationSeconds") or settings.lease_seconds
        expires_at = seen.at + timedelta(seconds=float(duration))
        if now < expires_at:
            return Step("follow", seen, holder=holder, expires_at=expires_at)
    return Step("acquire", Observation(record, now),
                _spec(identity, now, settings, record, takeover=lease_spec is not None))


def released(lease_spec: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The spec a leader writes when it stops on purpose (client-go's ReleaseOnCancel): no holder and a one-second
    lease, so a standby acquires at its next try instead of waiting out the lease."""
    stamp = format_micro_time(now)
    return {"holderIdentity": "", "leaseDurationSeconds": 1, "acquireTime": stamp, "renewTime": stamp,
            "leaseTransitions": int(lease_spec.get("leaseTransitions") or 0)}


def _spec(identity: str, now: datetime, settings: LeaderElectionSettings, old: Mapping[str, Any], *,
          takeover: bool) -> dict[str, Any]:
    """A renew keeps acquireTime and the transition count; acquiring an existing Lease counts one transition (a
    new Lease starts at 0, as client-go's does)."""
    stamp = format_micro_time(now)
    transitions = int(old.get("leaseTransitions") or 0)
    if takeover:
        return {"holderIdentity": identity, "leaseDurationSeconds": settings.lease_seconds, "acquireTime": stamp,
                "renewTime": stamp, "leaseTransitions": transitions + 1}
    if not old:
        return {"holderIdentity": identity, "leaseDurationSeconds": settings.lease_seconds, "acquireTime": stamp,
                "renewTime": stamp, "leaseTransitions": 0}
    return {"holderIdentity": identity, "leaseDurationSeconds": settings.lease_seconds,
            "acquireTime": old.get("acquireTime") or stamp, "renewTime": stamp, "leaseTransitions": transitions}
