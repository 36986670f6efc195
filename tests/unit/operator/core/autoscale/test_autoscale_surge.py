"""Standing GPU headroom for the next surge (`core/autoscale/surge.py`): surges are learned from the total arrival
rate the policy reads each tick, and the GPU pool is sized for demand plus the lower quartile of the recent surges
(less what a surge under way has already used) at full capacity.

The case behind it (benchmarks/autoscale_sim, diurnal traffic with spikes of 80-300 rps): sized at 85% of its
capacity only, a GPU pool at the trough (100 rps, capacity ~114 rps per replica) keeps ~30 rps of headroom and every
spike overruns it for the 40+ s before any new pod is ready; at the peak it keeps ~120 rps for the same spikes.
"""

from __future__ import annotations

from dataclasses import replace

from rerank_operator.core.autoscale import load as loads
from rerank_operator.core.autoscale import surge
from rerank_operator.core.autoscale.history import History, PoolHistory
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.autoscale.split import Tuning
from tests.unit.operator.core.autoscale.autoscale_helpers import NOW, pool, spec


def feed(rates: list[float], history: History | None = None, start: float = NOW, interval: float = 5.0) -> History:
    history = history or History()
    for n, rate in enumerate(rates):
        history = surge.observe(history, rate, start + n * interval, interval)
    return history


def test_a_step_in_the_arrival_rate_is_one_surge_of_its_full_size():
    # 100 -> 160 (onset inside a tick) -> 250: one surge, its rise over the 15 s before: 150 rps.
    history = feed([100, 100, 100, 160, 250, 250, 250])
    assert [size for _, size in history.surges] == [150]


def test_one_burst_keeps_no_reserve_and_a_second_one_does():
    calm = int(surge.NET_OF_RISE_S) // 5 + 1
    once = feed([100, 100, 100, 160, 250, 250, 250] + [100] * calm)
    end = NOW + 5 * (7 + calm - 1)
    # One burst is not a pattern: once the rate is back, no headroom is kept for another (the pool may shrink).
    assert len(once.surges) == 1 and surge.reserve(once, end) == 0
    twice = feed([100, 100, 100, 300, 300] + [100] * calm, once, start=end + 5)
    end += 5 * (5 + calm)
    assert [size for _, size in twice.surges] == [150, 200]
    assert surge.reserve(twice, end) == 150          # the lower quartile of [150, 200]
    # While a surge is under way it has used up the reserve kept for it (250 - 100 >= 150).
    during = feed([100, 100, 250, 250], twice, start=end + 5)
    assert surge.reserve(during, end + 20) == 0


def test_a_surge_under_way_uses_up_only_its_own_rise():
    # +20 rps is within the counting noise at 120 rps (4 sigma ~28): no new surge, but it is in use.
    history = feed([100, 100, 100, 120], History(surges=((NOW - 900, 200.0), (NOW - 600, 250.0))))
    assert history.surges == ((NOW - 900, 200.0), (NOW - 600, 250.0))
    assert surge.reserve(history, NOW + 15) == 180   # 200 kept, 20 of it in use


def test_noise_and_slow_ramps_are_not_surges():
    # +-10 rps wobble at 400 rps (4 sigma of a 5 s Poisson count's difference is ~51 rps), a 1 rps/s ramp.
    assert feed([400, 410, 392, 405, 398, 409, 400]).surges == ()
    assert feed([200 + 5 * n for n in range(40)]).surges == ()
    assert surge.reserve(History(), NOW) == 0.0


def test_the_reserve_is_the_lower_quartile_of_recent_surges_and_old_ones_are_forgotten():
    history = History(surges=((NOW - 3600, 300.0), (NOW - 1800, 80.0), (NOW - 1200, 200.0), (NOW - 600, 150.0)))
    assert surge.reserve(history, NOW) == 150.0                                  # 80, [150], 200, 300
    assert surge.reserve(history, NOW + surge.SURGE_MEMORY_S - 1500) == 150.0   # 200 and 150 left: [150], 200
    assert surge.reserve(history, NOW + surge.SURGE_MEMORY_S - 900) == 0.0      # 150 alone: not recurring
    assert surge.reserve(history, NOW + surge.SURGE_MEMORY_S + 1) == 0.0


def test_the_surges_are_saved_and_the_arrivals_are_not():
    history = feed([100, 100, 100, 250, 250])
    restored = History.from_dict(history.to_dict())
    assert restored.surges == history.surges and restored.arrivals == ()


def test_the_reserve_sizes_for_demand_plus_it_at_full_capacity():
    learned = PoolHistory(capacity=100.0, capacity_from_saturation=True)
    signals = pool(2, rate=100.0, p95=49)
    load = loads.assess(spec(), "gpu", signals)
    assert loads.recommend(learned, signals, load, 100.0, 2) == 2                  # ceil(100 / 85)
    assert loads.recommend(learned, signals, load, 100.0, 2, reserve=150.0) == 3   # ceil((100 + 150) / 100)
    assert loads.recommend(learned, signals, load, 400.0, 5, reserve=50.0) == 5    # 85% asks more: ceil(400 / 85)


def test_the_policy_keeps_headroom_for_the_surges_it_has_seen():
    history = History(gpu=PoolHistory(capacity=100.0, capacity_from_saturation=True),
                      cpu=PoolHistory(capacity=10.0, capacity_from_saturation=True),
                      surges=((NOW - 1800, 150.0), (NOW - 900, 150.0)))
    signals = Signals(pool(1, rate=80.0, p95=49), pool(1, rate=0.0, p95=None))
    calm = spec(crd_defaults=True)
    assert decide(calm, signals, Current(1, 1, 0), history, NOW).gpu_replicas == 3   # ceil((80 + 150) / 100)
    without = decide(calm, signals, Current(1, 1, 0), history, NOW, Tuning(reserve=False))
    assert without.gpu_replicas == 1                                                  # ceil(80 / 85)
    assert decide(calm, signals, Current(1, 1, 0), replace(history, surges=()), NOW).gpu_replicas == 1
