"""Sizing from a learned capacity (`core/autoscale/load.py`): a ceiling learned at saturation keeps UTILIZATION's
headroom; a lower bound seen only below target sizes a pool down to exactly what it has served within target.

The case behind it (the cluster test test_burst_scales_gpu_then_spills_to_cpu_then_recovers): one GPU replica
serves 4 req/s at a fifth of its latency target, a burst takes the pool to 3, the load falls back to 4 req/s. With
85% applied to the lower bound too, 4 req/s "needed" ceil(4 / 3.4) = 2 replicas, and the lower bound (4 per replica)
could never rise at 2 replicas (2 per replica), so the pool kept a GPU it did not need for as long as the load stayed.
"""

from __future__ import annotations

from rerank_operator.core.autoscale import load as loads
from rerank_operator.core.autoscale.history import History, PoolHistory
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import Signals
from tests.unit.operator.core.autoscale.autoscale_helpers import pool, spec

QUICK_DOWN = {"stabilizationSeconds": 0, "maxStep": 2, "cooldownSeconds": 0}
IDLE_CPU = pool(1, rate=0, p95=None)


def recommend(history: PoolHistory, ready: int, rate: float, current: int, p95: float = 49.0) -> int:
    signals = pool(ready, rate=rate, p95=p95)
    return loads.recommend(history, signals, loads.assess(spec(), "gpu", signals), rate, current)


def test_a_lower_bound_learned_before_a_burst_takes_the_pool_back_to_its_size_after_it():
    one = pool(1, rate=4.0, p95=49)
    learned = loads.learn_capacity(PoolHistory(), one, loads.assess(spec(), "gpu", one))
    assert (learned.capacity, learned.capacity_from_saturation) == (4.0, False)
    assert recommend(learned, ready=3, rate=4.0, current=3) == 1
    assert recommend(learned, ready=3, rate=6.0, current=3) == 2   # 3 per replica would be more than it served


def test_a_lower_bound_still_never_adds_replicas():
    floor = PoolHistory(capacity=4.0)
    assert recommend(floor, ready=1, rate=8.0, current=1) == 1        # under target: 8 per replica is fine
    assert recommend(floor, ready=2, rate=9.0, current=2) == 2


def test_a_capacity_learned_at_saturation_keeps_the_headroom():
    ceiling = PoolHistory(capacity=4.0, capacity_from_saturation=True)
    assert recommend(ceiling, ready=3, rate=4.0, current=3) == 2      # ceil(4 / (4 x 0.85))
    assert recommend(ceiling, ready=1, rate=4.0, current=1) == 2      # and it may add one


def test_an_overloaded_pool_still_grows_by_the_lower_bound_with_headroom():
    # Over target without a capacity from saturation: at least one more, and at least the lower bound's size at 85%.
    floor = PoolHistory(capacity=10.0)
    assert recommend(floor, ready=2, rate=40.0, current=2, p95=300.0) == 5  # ceil(40 / 8.5)


def test_the_policy_scales_the_gpu_pool_back_to_one_replica_after_the_burst():
    history = History(gpu=PoolHistory(capacity=4.0))
    decision = decide(spec(gpu=(1, 3), cpu=(1, 4), scaleDown=QUICK_DOWN), Signals(pool(3, rate=4.0, p95=49), IDLE_CPU),
                      Current(3, 1, 0), history, now=10_000.0)
    assert decision.gpu_replicas == 1, decision.reason
    assert decision.history.gpu.capacity == 4.0
