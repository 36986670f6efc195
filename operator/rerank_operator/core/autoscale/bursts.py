"""What the model's own traffic says about its bursts, for the CPU bridge: how much its arrival rate moves from one
tick to the next (`tick_noise`), which rise the bridge should be sized for at once (`bridge_rate`), and whether its
excursions beyond the ready GPU replicas last long enough for a new CPU replica to serve any of them
(`bridge_worth`).

Why: the CPU bridge (`policy` step 5) was sized for every tick's rate as measured, as if each rise were the onset
of a surge that lasts. On recorded traffic most rises are not: request streams are far burstier than Poisson (a
recorded LLM hour has 73% of its seconds empty and clumps of 67 requests in one), so a tick's rate jumps and falls
back within seconds. A CPU replica asked for such a jump is ready 40 s later, when it is long over, and is then
paid for through the scale-down window. In the simulator (docs/scaling.md, "Recorded traffic") that bridge was
most of what the policy paid beyond a plain HPA on a bursty LLM hour, for a few violation-seconds.
Two rules, both learned from the arrival rates the policy already keeps (`History.arrivals`, the last
`surge.NET_OF_RISE_S`), nothing configured:
- a rise counts at once only beyond the traffic's own tick-to-tick noise (SURGE_NOISE of its robust standard
  deviation); within it the bridge is sized for the previous tick's rate, and for the new one if it holds;
- the bridge grows only if, in that window, some excursion of the rate above what the ready GPU replicas serve has
  lasted BRIDGE_WORTH_S, or the current one has; with only shorter ones (bursts a replica started now would miss)
  the CPU pool serves the spill with the replicas it has. A model with no excursion in the window (a first surge,
  or a restarted operator) grows as before: no evidence is not evidence of brief bursts.
The route is unchanged: the spill still goes to the CPU pool's ready replicas at once.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from rerank_operator.core.autoscale.history import History
from rerank_operator.core.autoscale.surge import NET_OF_RISE_S, SURGE_NOISE

#: A new CPU replica's start-up (a TEI CPU pod loading its INT8 ONNX model; the simulator's CPU pools take 40-52 s):
#: an excursion shorter than this is over before a replica asked for at its onset serves any of it.
BRIDGE_WORTH_S = 40.0
EXCURSION_MEMORY_S = 6 * 3600.0   # excursions older than this no longer judge the bridge (as surges' memory)
MAX_EXCURSIONS = 64      # at most this many remembered (the latest)
WORTH_QUANTILE = 0.75    # the bridge grows if this quantile of the remembered excursions lasted BRIDGE_WORTH_S
MIN_TICKS = 6            # tick-to-tick changes needed before the noise is measured (else 0: every rise counts)
MAD_TO_STD = 1.4826      # a normal distribution's standard deviation per median absolute deviation


def tick_noise(history: History, now: float) -> float:
    """The robust standard deviation of the arrival rate's change from one tick to the next over the kept window
    (median absolute change x MAD_TO_STD): the few jumps of a real surge barely move a median, the steady jitter of
    a bursty stream sets it. 0 with fewer than MIN_TICKS changes."""
    rates = [r for t, r in history.arrivals if now - t <= NET_OF_RISE_S]
    if len(rates) <= MIN_TICKS:
        return 0.0
    changes = sorted(abs(b - a) for a, b in itertools.pairwise(rates))
    return MAD_TO_STD * changes[len(changes) // 2]


def bridge_rate(history: History, now: float, interval_seconds: float) -> float | None:
    """The total arrival rate the CPU bridge is sized for this tick: this tick's, unless it rose from the previous
    tick's by no more than the traffic's own noise (SURGE_NOISE x `tick_noise`), then the previous tick's (a rise
    that holds is counted one tick later). None without a previous tick within 2.5 intervals (use the measured
    rate). Call after `surge.observe` has recorded this tick."""
    recent = [r for t, r in history.arrivals if now - t <= 2.5 * interval_seconds]
    if len(recent) < 2:
        return None
    current, previous = recent[-1], recent[-2]
    if current - previous > SURGE_NOISE * tick_noise(history, now):
        return current
    return min(current, previous)


def observe(history: History, total_rate: float, served: float | None, now: float) -> History:
    """Remember this tick's excursion state: an excursion of the arrival rate above `served` (requests/s the ready
    GPU replicas serve; None when unknown, which ends none and starts none) begins, goes on or ends (its length
    is then remembered for EXCURSION_MEMORY_S, at most MAX_EXCURSIONS)."""
    excursions = tuple((t, d) for t, d in history.excursions if now - t <= EXCURSION_MEMORY_S)
    since = history.excursion_since
    if served is not None:
        if total_rate > served and since is None:
            since = now
        elif total_rate <= served and since is not None:
            excursions, since = (*excursions, (now, now - since))[-MAX_EXCURSIONS:], None
    return replace(history, excursions=excursions, excursion_since=since)


def bridge_worth(history: History, now: float, interval_seconds: float) -> bool:
    """Whether growing the CPU bridge can serve any of this traffic's excursions above the ready GPU replicas: the
    one under way has lasted BRIDGE_WORTH_S (counting this tick), or at least a quarter of the remembered ones did
    (WORTH_QUANTILE), or none is remembered (no evidence: grow, as before). Call after `observe`."""
    since = history.excursion_since
    if since is not None and now - since + interval_seconds >= BRIDGE_WORTH_S:
        return True
    lengths = sorted(d for _, d in history.excursions)
    if not lengths:
        return True
    return lengths[min(len(lengths) - 1, int(WORTH_QUANTILE * len(lengths)))] >= BRIDGE_WORTH_S
