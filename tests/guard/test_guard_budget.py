"""quality_guard.budget: the token bucket and the sampler, on an injected clock."""

from __future__ import annotations

import random

import pytest

from quality_guard.budget import Sampler, TokenBucket, sampler


def test_bucket_starts_full_then_refills_at_its_rate() -> None:
    b = TokenBucket(rate=2.0, burst=4.0)
    assert [b.take(0.0) for _ in range(5)] == [True] * 4 + [False]
    assert not b.take(0.4)  # 0.8 tokens
    assert b.take(0.5)  # 1.0 token
    assert not b.take(0.5)
    assert b.take(10.0) and b.tokens == pytest.approx(3.0)  # refilled to the burst, not past it


def test_bucket_cost_and_time_going_backwards() -> None:
    b = TokenBucket(rate=1.0, burst=3.0)
    assert b.take(5.0, cost=3.0)
    assert not b.take(4.0, cost=1.0)  # an earlier time adds nothing
    assert not b.take(5.9, cost=1.0)
    assert b.take(6.0, cost=1.0)


def test_bucket_rejects_bad_settings() -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate=-1.0, burst=2.0)
    with pytest.raises(ValueError):
        TokenBucket(rate=1.0, burst=0.5)


@pytest.mark.parametrize("rate,burst", [(1.0, 2.0), (5.0, 10.0), (0.5, 3.0)])
def test_calls_never_exceed_burst_plus_rate_times_time(rate: float, burst: float) -> None:
    rng = random.Random(7)
    b = TokenBucket(rate=rate, burst=burst)
    t, granted = 0.0, []
    for _ in range(20000):  # bursty arrivals: many at once, then pauses
        t += rng.expovariate(50.0) if rng.random() < 0.9 else rng.uniform(0.5, 3.0)
        if b.take(t, 2.0):
            granted.append(t)
    assert granted
    # every interval between two grants [granted[i], granted[j]] holds at most burst + rate * length calls
    for i in range(0, len(granted), 97):
        for j in range(i, min(len(granted), i + 400)):
            calls = 2.0 * (j - i + 1)
            assert calls <= burst + rate * (granted[j] - granted[i]) + 1e-9
    assert 2.0 * len(granted) <= burst + rate * t + 1e-9


def test_sampler_takes_the_fraction_when_the_budget_is_large() -> None:
    s = sampler(fraction=0.1, calls_per_second=1e9, calls_per_sample=2.0, seed=3)
    for i in range(20000):
        s.offer(i * 0.001)
    assert s.seen == 20000
    assert 0.09 * 20000 < s.sampled < 0.11 * 20000
    assert s.over_budget == 0
    assert s.calls == 2.0 * s.sampled


def test_sampler_holds_the_budget_under_heavy_traffic() -> None:
    s = sampler(fraction=0.5, calls_per_second=3.0, calls_per_sample=3.0, seed=1)  # one sample a second
    seconds = 600.0
    for i in range(int(seconds * 200)):  # 200 requests/s
        s.offer(i / 200)
    assert s.calls <= s.bucket.burst + 3.0 * seconds
    assert s.calls >= 0.95 * 3.0 * seconds  # and it uses what it may
    assert s.over_budget > 0


def test_sampler_is_deterministic_for_a_seed() -> None:
    def run(seed: int) -> list[bool]:
        s = sampler(fraction=0.3, calls_per_second=2.0, seed=seed)
        return [s.offer(i * 0.1) for i in range(500)]

    assert run(4) == run(4)
    assert run(4) != run(5)


def test_sampler_needs_a_burst_that_holds_one_sample() -> None:
    with pytest.raises(ValueError):
        Sampler(fraction=1.0, bucket=TokenBucket(rate=10.0, burst=2.0), rng=random.Random(0), cost=3.0)
    with pytest.raises(ValueError):
        sampler(fraction=1.5, calls_per_second=1.0)
