"""A missed measurement is not stale data (`signals.carry_over`): the last tick's sample stands in for a pool its
source could not measure until that sample is older than staleAfterSeconds (default 60 s); then the policy holds.

The case behind it: at 1000 models one fake TEI endpoint answered a scrape after the 2 s timeout now and then; each
such miss held that model's decision, flipped MetricsAvailable to False and back on the next tick, and cost four
status writes (the autoscaler's two and the reconcile loop's two) while nothing had changed.
"""

from __future__ import annotations

from dataclasses import replace

from autoscale_helpers import NOW, pool, spec

from rerank_operator.core.autoscale import load as loads
from rerank_operator.core.autoscale.history import History, PoolHistory
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import PoolSignals, Signals, carry_over

STALE_AFTER = 60.0
GOOD = Signals(pool(1, rate=4.0, p95=49, at=NOW), pool(1, rate=0.0, p95=None, at=NOW))


def missed(ready: int = 1, why: str = "no pod answered /metrics (timed out)") -> PoolSignals:
    return PoolSignals(ready_replicas=ready, error=why)


def test_a_pool_missed_once_gets_the_last_sample_and_the_policy_acts_on_it():
    measured = replace(GOOD, cpu=missed())
    signals = carry_over(GOOD, measured, NOW + 15, STALE_AFTER)
    assert signals.gpu == GOOD.gpu                                     # the measured pool is untouched
    assert signals.cpu.request_rate == GOOD.cpu.request_rate and signals.cpu.sampled_at == NOW
    assert signals.cpu.error is None and "timed out" in (signals.cpu.carried or "")
    assert "15s ago" in (signals.cpu.carried or "")
    decision = decide(spec(), signals, Current(1, 1, 0), History(), NOW + 15)
    assert not decision.held
    assert decide(spec(), measured, Current(1, 1, 0), History(), NOW + 15).held   # what a miss did before


def test_the_stand_in_ages_from_when_it_was_measured_and_goes_stale_at_the_bound():
    signals = GOOD
    for t in (15, 30, 45, 60):
        signals = carry_over(signals, replace(GOOD, gpu=missed()), NOW + t, STALE_AFTER)
        assert signals.gpu.carried and signals.gpu.sampled_at == NOW
        assert not decide(spec(), signals, Current(1, 1, 0), History(), NOW + t).held
    signals = carry_over(signals, replace(GOOD, gpu=missed()), NOW + 75, STALE_AFTER)
    assert signals.gpu.error and not signals.gpu.carried
    decision = decide(spec(), signals, Current(1, 1, 0), History(), NOW + 75)
    assert decision.held and "no pod answered" in decision.reason
    # once stale, never revived by a later miss
    assert carry_over(signals, replace(GOOD, gpu=missed()), NOW + 76, STALE_AFTER).gpu.error


def test_nothing_stands_in_without_a_good_sample_or_for_a_pool_without_ready_replicas():
    measured = replace(GOOD, gpu=missed())
    assert carry_over(None, measured, NOW, STALE_AFTER) == measured
    assert carry_over(replace(GOOD, gpu=missed("earlier error")), measured, NOW, STALE_AFTER) == measured
    first = replace(GOOD, gpu=replace(GOOD.gpu, request_rate=None))   # priming: no rate yet
    assert carry_over(first, measured, NOW, STALE_AFTER) == measured
    gone = replace(GOOD, gpu=PoolSignals(ready_replicas=0))
    assert carry_over(GOOD, gone, NOW, STALE_AFTER) == gone
    assert carry_over(GOOD, GOOD, NOW + 15, STALE_AFTER) == GOOD     # measured pools are never replaced


def test_the_stand_in_takes_the_ready_count_of_now():
    signals = carry_over(GOOD, replace(GOOD, gpu=missed(ready=3)), NOW + 15, STALE_AFTER)
    assert signals.gpu.ready_replicas == 3 and signals.gpu.request_rate == GOOD.gpu.request_rate


def test_a_stand_in_teaches_the_capacity_estimate_nothing():
    hot = pool(1, rate=40.0, p95=900, queue=20)
    load = loads.assess(spec(), "gpu", hot)
    over_twice = PoolHistory(capacity=100.0, last_state=(1, True))   # over target at the last tick too
    learned = loads.learn_capacity(over_twice, hot, load)
    assert learned.capacity is not None and 40.0 < learned.capacity < 100.0   # lowered, by at most MAX_DECREASE
    assert loads.learn_capacity(learned, hot, load).capacity != learned.capacity  # the same sample again would
    assert loads.learn_capacity(learned, replace(hot, carried="missed"), load) == learned
