"""The CPU bridge on bursty traffic (`core/autoscale/bursts.py`): a rise counts at once only beyond the traffic's own
tick-to-tick noise, and the bridge does not grow for traffic whose excursions above the ready GPU replicas end before
a new CPU replica could start.

The case behind it (benchmarks/autoscale_sim, a recorded LLM hour scaled to the pools): most of the policy's cost
beyond a plain HPA was CPU replicas asked for one-second clumps of requests, ready 40 s later and then kept through
the scale-down window.
"""

from __future__ import annotations

import math
from dataclasses import replace

from rerank_operator.core.autoscale import bursts, surge
from rerank_operator.core.autoscale.history import History, PoolHistory
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.autoscale.split import PRODUCTION, Tuning
from tests.unit.operator.core.autoscale.autoscale_helpers import NOW, pool, spec
from tests.unit.operator.core.autoscale.test_autoscale_bridge import HOT_AT_MAX, LEARNED


def kept(rates: list[float], interval: float = 5.0, end: float = NOW) -> History:
    """A history whose kept arrival rates are `rates`, one per tick, the last at `end`."""
    start = end - interval * (len(rates) - 1)
    return History(arrivals=tuple((start + n * interval, rate) for n, rate in enumerate(rates)))


def test_the_noise_is_the_robust_spread_of_tick_to_tick_changes():
    assert bursts.tick_noise(kept([100.0] * 6), NOW) == 0.0                    # too few changes to say
    steady = kept([400, 410, 395, 405, 400, 408, 398, 404, 401, 409])
    assert 5 < bursts.tick_noise(steady, NOW) < 15                             # a Poisson-like wobble
    jumpy = kept([100, 500, 120, 80, 600, 90, 110, 450, 100, 90])
    assert bursts.tick_noise(jumpy, NOW) > 300                                 # clumps: changes of hundreds
    one_surge = kept([400, 410, 395, 405, 400, 408, 398, 404, 701, 709])
    assert bursts.tick_noise(one_surge, NOW) < 15                             # one jump barely moves a median
    old = kept([100, 500, 120, 80, 600, 90, 110, 450, 100, 90], end=NOW - 400)
    assert bursts.tick_noise(old, NOW) == 0.0                                 # out of the kept window


def test_a_rise_within_the_traffics_noise_is_counted_only_once_it_holds():
    jumpy = [100.0, 500, 120, 80, 600, 90, 110, 450, 100, 90]
    assert bursts.bridge_rate(kept([*jumpy, 400]), NOW, 5.0) == 90             # within 4 x ~380: the last tick's
    assert bursts.bridge_rate(kept([*jumpy, 400, 420]), NOW, 5.0) == 400       # it held: counted a tick later
    steady = [400.0, 410, 395, 405, 400, 408, 398, 404, 401, 409]
    assert bursts.bridge_rate(kept([*steady, 700]), NOW, 5.0) == 700           # far beyond a wobble: at once
    assert bursts.bridge_rate(kept([*steady, 300]), NOW, 5.0) == 300           # a fall is counted at once
    assert bursts.bridge_rate(kept([300.0]), NOW, 5.0) is None                 # no previous tick: the rate measured
    assert bursts.bridge_rate(History(arrivals=((NOW - 60, 100.0), (NOW, 300.0))), NOW, 5.0) is None


def test_excursions_above_what_the_gpu_serves_are_remembered_with_their_length_and_requests():
    history = History()
    for n, rate in enumerate([300, 650, 650, 300, 500, 300, 300]):
        history = bursts.observe(history, rate, 400.0, NOW + 5 * n, 5.0)
    # 650 for two 5 s ticks: 2 x 250 x 5 requests beyond the GPU; 500 for one: 100 x 5.
    assert history.excursions == ((NOW + 15, 10.0, 2500.0), (NOW + 25, 5.0, 500.0))
    assert history.excursion_since is None and history.excursion_requests == 0.0
    history = bursts.observe(history, 700, 400.0, NOW + 35, 5.0)
    assert (history.excursion_since, history.excursion_requests) == (NOW + 35, 1500.0)
    assert bursts.observe(history, 100, None, NOW + 40, 5.0).excursion_since == NOW + 35   # unknown: no verdict
    later = bursts.observe(history, 700, 400.0, NOW + 35 + bursts.EXCURSION_MEMORY_S, 5.0)
    assert later.excursions == ()                                                         # forgotten after 6 h
    many = History(excursions=tuple((NOW - n, 5.0, 10.0) for n in range(100, 0, -1)), excursion_since=NOW - 5,
                   excursion_served=400.0)
    assert len(bursts.observe(many, 100, 400.0, NOW, 5.0).excursions) == bursts.MAX_EXCURSIONS


def test_gpu_replicas_catching_up_with_a_rising_rate_end_no_excursion():
    # A ramp outrunning the GPU pool: each new replica lifts what it serves above the rate for a moment, but the rate
    # stays above the 400 rps served when the excursion began, so it is one excursion of 30 s, not three of 5 s.
    history = History()
    for n, (rate, served) in enumerate([(380, 400), (420, 400), (440, 500), (520, 500), (540, 600), (620, 600),
                                        (650, 700), (390, 700)]):
        history = bursts.observe(history, rate, served, NOW + 5 * n, 5.0)
    assert [length for _, length, _ in history.excursions] == [30.0]


def test_a_bridge_is_worth_growing_only_where_lasting_excursions_bring_the_requests():
    # Many brief excursions and one that lasted 45 s: worth it when that one brought a quarter of the requests beyond
    # the GPU (a rate wobbling across the GPU's capacity makes many small brief ones), not when it brought less.
    brief = [(NOW - 600 + 10 * n, 5.0, 100.0) for n in range(30)]          # 3000 requests in brief excursions
    assert bursts.bridge_worth(History(excursions=(*brief, (NOW - 100, 45.0, 1000.0))), NOW, 5.0)       # 1000 / 4000
    assert not bursts.bridge_worth(History(excursions=(*brief, (NOW - 100, 45.0, 900.0))), NOW, 5.0)    # 900 / 3900
    only_brief = History(excursions=tuple(brief))
    assert not bursts.bridge_worth(only_brief, NOW, 5.0)
    assert bursts.bridge_worth(replace(only_brief, excursion_since=NOW - 35), NOW, 5.0)   # 40 s with this tick
    assert not bursts.bridge_worth(replace(only_brief, excursion_since=NOW - 30), NOW, 5.0)
    assert bursts.bridge_worth(History(), NOW, 5.0)                                      # no evidence: grow, as before


def _hot(history: History, tuning: Tuning = PRODUCTION) -> tuple[int, int]:
    """HOT_AT_MAX (650 rps on 4 GPU replicas serving 400) spilling onto 10 ready CPU replicas, ticks every 15 s."""
    decision = decide(spec(gpu=(1, 4), cpu=(1, 40)), Signals(HOT_AT_MAX, pool(10, rate=0, p95=None)),
                      Current(4, 10, 0), replace(LEARNED, arrivals=history.arrivals, excursions=history.excursions),
                      NOW, tuning)
    return decision.cpu_percent, decision.cpu_replicas


def test_the_policy_does_not_grow_the_bridge_for_bursts_that_end_before_it_could_serve_them():
    # Every excursion above the 400 rps the GPU serves so far lasted one 15 s tick: a CPU replica asked for now
    # (ready in 40 s) would miss this one too. The spill still goes to the 10 ready CPU replicas at once (15%, their
    # room); the pool stays at 10 instead of surging to 30 (test_spill_stops_at_what_the_ready_cpu_replicas_serve...).
    rates = kept([300, 650, 300, 300, 650, 300, 300, 650, 300, 300], interval=15.0, end=NOW - 15)
    brief = replace(rates, excursions=tuple((NOW - 900 + 60 * n, 15.0, 3750.0) for n in range(8)))
    assert _hot(brief) == (15, 10)
    assert _hot(brief, Tuning(brief_bursts=False, noise_bridge=False)) == (15, 30)
    # Without the brief-burst rule, the noise rule alone still sizes for the last tick's 300 rps: 650 is within the
    # noise of a stream that jumps by 350 every other tick, so the bridge waits for it to hold (share 39% of 300 rps
    # = 117 rps / 8.5 per replica -> 14 replicas).
    assert _hot(brief, Tuning(brief_bursts=False)) == (15, 14)
    # Excursions that lasted minutes (and a rate that has held) are worth a bridge: the pool surges to the excess.
    lasting = replace(kept([300, 300, 650, 650, 650, 650], interval=15.0, end=NOW - 15),
                      excursions=((NOW - 900, 180.0, 30000.0), (NOW - 300, 120.0, 20000.0)))
    assert _hot(lasting) == (15, 30)


def test_the_gpu_pool_keeps_headroom_for_the_traffics_own_noise():
    # A stream that jumps by ~100 rps from one 5 s tick to the next, 80 rps now, no surge remembered: the GPU pool is
    # sized for demand plus two of its tick-to-tick standard deviations (~2 x 133) at full capacity (100 rps): 4.
    history = replace(kept([100, 200, 110, 90, 220, 95, 105, 190, 100, 90], end=NOW - 5),
                      gpu=PoolHistory(capacity=100.0, capacity_from_saturation=True),
                      cpu=PoolHistory(capacity=10.0, capacity_from_saturation=True))
    noise = bursts.tick_noise(surge.observe(history, 80.0, NOW, 5.0), NOW)
    signals = Signals(pool(1, rate=80.0, p95=49), pool(1, rate=0.0, p95=None))
    calm = spec(crd_defaults=True, gpu=(1, 20))
    assert decide(calm, signals, Current(1, 1, 0), history, NOW).gpu_replicas == math.ceil((80 + 2 * noise) / 100)
    assert decide(calm, signals, Current(1, 1, 0), history, NOW, Tuning(noise_reserve=0.0)).gpu_replicas == 1
    # A steady stream keeps next to nothing: 2 x ~3 rps on 80 still fits one replica.
    steady = replace(history, arrivals=kept([80, 82, 79, 81, 80, 83, 78, 81, 80, 79], end=NOW - 5).arrivals)
    assert decide(calm, signals, Current(1, 1, 0), steady, NOW).gpu_replicas == 1
