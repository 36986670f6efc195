"""The serving SLO's events: how many requests a pool served in an interval and how many of them were bad. Pure.

The SLO is the autoscaler's own target read as an objective: 95% of a pool's requests within its p95 latency target
(``autoscaling.targets``), so the error budget is 5% and a burn rate of 1 spends exactly that. Bad events are the
requests slower than the target, estimated from TEI's ``te_request_duration`` buckets of the interval by linear
interpolation inside the bucket that holds the target (the inverse of ``histogram_quantile``), plus the failed ones
(a request refused with 429 missed its target too). Alerts burn on these counters (alerts/rerank-operator.rules.yaml):
per-model thresholds cannot be compared with TEI's fixed ``le`` labels in PromQL, the operator knows both.
"""

from __future__ import annotations

from dataclasses import dataclass

from rerank_operator.core.autoscale.exposition import fraction_above
from rerank_operator.core.autoscale.signals import PoolSignals


@dataclass(frozen=True)
class Served:
    """One pool's interval: requests ended (completed or failed), the bad ones, pairs scored."""

    requests: float
    slow: float
    pairs: float


def served(signals: PoolSignals, target_seconds: float, seconds: float) -> Served | None:
    """What ``signals`` (rates of one interval) say the pool served in ``seconds``; None when they say nothing (no
    rate measured: a pool without ready replicas, a failed scrape, the first scrape)."""
    if signals.request_rate is None or signals.error:
        return None
    failed = max(signals.failure_rate or 0.0, 0.0)
    completed = signals.success_rate if signals.success_rate is not None else signals.request_rate
    completed = max(completed, 0.0)
    share = fraction_above(target_seconds, signals.latency) if signals.latency is not None else None
    if share is None:  # no request finished in the interval, or a source without buckets: none was slow
        share = 0.0
    seconds = max(seconds, 0.0)
    return Served(requests=(completed + failed) * seconds, slow=(completed * share + failed) * seconds,
                  pairs=max(signals.pair_rate or 0.0, 0.0) * seconds)
