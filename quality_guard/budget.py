"""What the guard may cost a model: a sampled fraction of its requests, and a budget of extra requests/s.

Every sampled request costs the pools (and a reference the guard does not compute itself) one extra ``/rerank``
call each. The budget is a token bucket: ``rate`` calls/s on average, at most ``burst`` at once; a sampled request
that would overdraw it is dropped (the guard skips it, serving is untouched). Over any interval of ``t`` seconds the
guard therefore makes at most ``burst + rate * t`` extra calls, whatever the traffic does.

Pure and deterministic: time is passed in (``now``, seconds on any monotonic clock) and the sampling draws come from
a seeded generator the caller owns.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class TokenBucket:
    """``rate`` tokens per second up to ``burst`` tokens; starts full at the first call."""

    rate: float
    burst: float
    tokens: float = 0.0
    last: float | None = None  # None: not used yet (full on first use)

    def __post_init__(self) -> None:
        if not self.rate >= 0.0:
            raise ValueError(f"rate must be >= 0, got {self.rate}")
        if not self.burst >= 1.0:
            raise ValueError(f"burst must be >= 1 (one call at least), got {self.burst}")

    def refill(self, now: float) -> float:
        """The tokens available at ``now`` (time never runs backwards here: an earlier ``now`` adds nothing)."""
        if self.last is None:
            self.tokens, self.last = self.burst, now
        elif now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
            self.last = now
        return self.tokens

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend ``cost`` tokens if there are that many; False (and nothing spent) otherwise."""
        if cost < 0:
            raise ValueError("cost must be >= 0")
        if self.refill(now) >= cost:
            self.tokens -= cost
            return True
        return False


@dataclass
class Sampler:
    """Which requests the guard samples: a ``fraction`` of them, within a per-model :class:`TokenBucket`.

    ``offer(now)`` is called once per request the guard sees (mirrored or replayed); ``cost`` is the number of extra
    calls sampling one makes (one per pool asked, plus the reference when that is another endpoint). Counters say
    what happened, so the figures can be exported."""

    fraction: float
    bucket: TokenBucket
    rng: random.Random
    cost: float = 1.0
    seen: int = 0
    sampled: int = 0
    over_budget: int = 0
    calls: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"fraction must be within [0, 1], got {self.fraction}")
        if not 0.0 < self.cost <= self.bucket.burst:
            raise ValueError(f"a sample costs {self.cost} calls: the burst ({self.bucket.burst}) must hold one")

    def offer(self, now: float) -> bool:
        """Sample this request? Drawn with probability ``fraction``, then only if the budget has ``cost`` left."""
        self.seen += 1
        if self.fraction < 1.0 and self.rng.random() >= self.fraction:
            return False
        if not self.bucket.take(now, self.cost):
            self.over_budget += 1
            return False
        self.sampled += 1
        self.calls += self.cost
        return True


def sampler(fraction: float, calls_per_second: float, calls_per_sample: float = 1.0, burst: float | None = None,
            seed: int = 0) -> Sampler:
    """A sampler within ``calls_per_second`` extra calls; burst by default two seconds' worth, at least one sample."""
    b = max(calls_per_sample, 2.0 * calls_per_second) if burst is None else burst
    return Sampler(fraction=fraction, bucket=TokenBucket(rate=calls_per_second, burst=b), rng=random.Random(seed),
                   cost=calls_per_sample)
