"""The CPU bridge on bursty traffic (`core/autoscale/bursts.py`): a rise counts at once only beyond the traffic's own
tick-to-tick noise, and the bridge does not grow for traffic whose excursions above the ready GPU replicas end before
a new CPU replica could start.

The case behind it (benchmarks/autoscale_sim, a recorded LLM hour scaled to the pools): most of the policy's cost
beyond a plain HPA was CPU replicas asked for one-second clumps of requests, ready 40 s later and then kept through
the scale-down window.
"""

from __future__ import annotations

from dataclasses import replace

from rerank_operator.core.autoscale import bursts
from rerank_operator.core.autoscale.history import History
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


def test_a_bridge_is_worth_growing_only_for_excursions_that_outlast_a_replicas_start():
    served = 400.0
    brief = kept([300, 650, 300, 300, 650, 650, 300, 300, 650, 300, 300, 650])   # runs of 5-10 s, one under way
    assert not bursts.bridge_worth(brief, NOW, served, 5.0)
    lasting_once = kept([300, *[650] * 9, 300, 300, 650])                        # one 45 s run earlier
    assert bursts.bridge_worth(lasting_once, NOW, served, 5.0)
    under_way = kept([300, 650, 300, 300, *[650] * 8])                           # the current one: 40 s with this tick
    assert bursts.bridge_worth(under_way, NOW, served, 5.0)
    assert bursts.bridge_worth(kept([300, 300, 650]), NOW, served, 5.0)         # no earlier excursion: no evidence
    assert bursts.bridge_worth(brief, NOW, 0.0, 5.0)                             # no GPU capacity: nothing to judge


def _hot(history: History, tuning: Tuning = PRODUCTION) -> tuple[int, int]:
    """HOT_AT_MAX (650 rps on 4 GPU replicas serving 400) spilling onto 10 ready CPU replicas, ticks every 15 s."""
    decision = decide(spec(gpu=(1, 4), cpu=(1, 40)), Signals(HOT_AT_MAX, pool(10, rate=0, p95=None)),
                      Current(4, 10, 0), replace(LEARNED, arrivals=history.arrivals), NOW, tuning)
    return decision.cpu_percent, decision.cpu_replicas


def test_the_policy_does_not_grow_the_bridge_for_bursts_that_end_before_it_could_serve_them():
    # Earlier excursions above the 400 rps the GPU serves lasted one 15 s tick each: a CPU replica asked for now
    # (ready in 40 s) would miss this one too. The spill still goes to the 10 ready CPU replicas at once (15%, their
    # room); the pool stays at 10 instead of surging to 30 (test_spill_stops_at_what_the_ready_cpu_replicas_serve...).
    brief = kept([300, 650, 300, 300, 650, 300, 300, 650, 300, 300], interval=15.0, end=NOW - 15)
    assert _hot(brief) == (15, 10)
    assert _hot(brief, Tuning(brief_bursts=False, noise_bridge=False)) == (15, 30)
    # Without the brief-burst rule, the noise rule alone still sizes for the last tick's 300 rps: 650 is within the
    # noise of a stream that jumps by 350 every other tick, so the bridge waits for it to hold (share 39% of 300 rps
    # = 117 rps / 8.5 per replica -> 14 replicas).
    assert _hot(brief, Tuning(brief_bursts=False)) == (15, 14)
    # An excursion that has lasted a minute is worth a bridge: the pool surges to the excess, as before.
    lasting = kept([300, 300, 650, 650, 650, 650], interval=15.0, end=NOW - 15)
    assert _hot(lasting) == (15, 30)
