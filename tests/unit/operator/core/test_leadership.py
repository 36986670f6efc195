"""core/leadership.py: the election's decisions from plain data, and the timing rules that keep it to one writer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rerank_operator.core.leadership import (
    LeaderElectionSettings,
    Observation,
    format_micro_time,
    parse_micro_time,
    released,
    step,
)

SETTINGS = LeaderElectionSettings(enabled=True, namespace="rerank-system")
T0 = datetime(2026, 12, 2, 10, 0, 0, 123456, tzinfo=UTC)


def held_by(holder: str, *, renewed: datetime = T0, transitions: int = 3, duration: int = 10) -> dict[str, object]:
    stamp = format_micro_time(renewed)
    return {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": format_micro_time(T0),
            "renewTime": stamp, "leaseTransitions": transitions}


def test_micro_time_is_rfc3339_with_microseconds_and_z() -> None:
    assert format_micro_time(T0) == "2026-12-02T10:00:00.123456Z"
    assert format_micro_time(T0.astimezone(timezone(timedelta(hours=2)))) == "2026-12-02T10:00:00.123456Z"
    assert parse_micro_time("2026-12-02T10:00:00.123456Z") == T0
    assert parse_micro_time(None) is None and parse_micro_time("yesterday") is None


def test_no_lease_is_acquired_as_a_new_lease() -> None:
    s = step(None, "a", T0, SETTINGS)
    assert s.action == "acquire" and s.leads
    assert s.lease_spec == {"holderIdentity": "a", "leaseDurationSeconds": 10, "acquireTime": format_micro_time(T0),
                            "renewTime": format_micro_time(T0), "leaseTransitions": 0}


def test_an_empty_or_released_lease_is_acquired_at_once_counting_a_transition() -> None:
    now = T0 + timedelta(seconds=1)
    s = step(released(held_by("a"), T0), "b", now, SETTINGS)
    assert s.action == "acquire" and s.lease_spec["holderIdentity"] == "b"
    assert s.lease_spec["leaseTransitions"] == 4 and s.lease_spec["acquireTime"] == format_micro_time(now)
    assert step({}, "b", now, SETTINGS).lease_spec["leaseTransitions"] == 1


def test_our_own_lease_is_renewed_keeping_acquire_time_and_transitions() -> None:
    now = T0 + timedelta(seconds=2)
    s = step(held_by("a"), "a", now, SETTINGS)
    assert s.action == "renew" and s.leads
    assert s.lease_spec == {**held_by("a"), "renewTime": format_micro_time(now)}


def test_another_holders_live_lease_is_followed() -> None:
    s = step(held_by("b"), "a", T0, SETTINGS)
    assert s.action == "follow" and not s.leads and s.lease_spec == {}
    assert s.holder == "b" and s.expires_at == T0 + timedelta(seconds=10)


def test_an_unchanged_record_expires_a_lease_duration_after_we_first_saw_it() -> None:
    first = step(held_by("b"), "a", T0, SETTINGS)
    later = step(held_by("b"), "a", T0 + timedelta(seconds=9.9), SETTINGS, first.observed)
    assert later.action == "follow" and later.observed == first.observed
    taken = step(held_by("b"), "a", T0 + timedelta(seconds=10), SETTINGS, later.observed)
    assert taken.action == "acquire" and taken.lease_spec["holderIdentity"] == "a"
    assert taken.lease_spec["leaseTransitions"] == 4


def test_a_renewed_record_restarts_the_wait() -> None:
    first = step(held_by("b"), "a", T0, SETTINGS)
    renewed = held_by("b", renewed=T0 + timedelta(seconds=8))
    s = step(renewed, "a", T0 + timedelta(seconds=12), SETTINGS, first.observed)
    assert s.action == "follow" and s.expires_at == T0 + timedelta(seconds=22)


def test_the_holders_clock_is_never_trusted() -> None:
    """A holder whose clock runs an hour behind still leads while it renews: the follower measures on its own."""
    behind = held_by("b", renewed=T0 - timedelta(hours=1))
    assert step(behind, "a", T0, SETTINGS).action == "follow"
    # ...and one whose clock runs ahead cannot make us wait longer than the lease once it stops renewing.
    ahead = held_by("b", renewed=T0 + timedelta(hours=1))
    first = step(ahead, "a", T0, SETTINGS)
    assert step(ahead, "a", T0 + timedelta(seconds=10), SETTINGS, first.observed).action == "acquire"


def test_the_holders_lease_duration_counts_not_ours() -> None:
    first = step(held_by("b", duration=30), "a", T0, SETTINGS)
    assert first.expires_at == T0 + timedelta(seconds=30)


def test_release_keeps_the_count_and_leaves_a_one_second_lease() -> None:
    assert released(held_by("a"), T0) == {"holderIdentity": "", "leaseDurationSeconds": 1,
                                          "acquireTime": format_micro_time(T0), "renewTime": format_micro_time(T0),
                                          "leaseTransitions": 3}


def test_observation_of_a_different_record_is_replaced() -> None:
    stale = Observation(held_by("c"), T0 - timedelta(minutes=5))
    s = step(held_by("b"), "a", T0, SETTINGS, stale)
    assert s.action == "follow" and s.observed == Observation(held_by("b"), T0)


def test_lease_seconds_round_up_to_an_int() -> None:
    settings = LeaderElectionSettings(lease_duration_seconds=2.5, renew_deadline_seconds=2, retry_period_seconds=0.5)
    assert settings.lease_seconds == 3 and step(None, "a", T0, settings).lease_spec["leaseDurationSeconds"] == 3


def test_settings_defaults_fail_over_within_fifteen_seconds() -> None:
    s = LeaderElectionSettings()
    assert not s.enabled and s.namespace is None and s.name == "rerank-operator"
    assert s.lease_duration_seconds + 2 * s.retry_period_seconds <= 15


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"renew_deadline_seconds": 10}, "renew deadline (10s) must be shorter than the lease duration (10s)"),
    ({"retry_period_seconds": 7}, "retry period (7s) must be shorter than the renew deadline (7s)"),
    ({"retry_period_seconds": 0}, "must be positive"),
    ({"name": ""}, "must not be empty"),
])
def test_settings_refuse_inconsistent_timing(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        LeaderElectionSettings(**kwargs)  # type: ignore[arg-type]
