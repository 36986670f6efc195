"""What the model's own traffic says about its bursts: how much its arrival rate moves from one tick to the next
(`tick_noise`), how much GPU headroom that calls for (`noise_reserve`), which rise the CPU bridge should be sized for
at once (`bridge_rate`), and whether its excursions beyond the ready GPU replicas last long enough for a new CPU
replica to serve any of them (`observe`, `bridge_worth`).

Why: the policy was tuned on synthetic traffic, Poisson noise on a daily cycle with spikes of minutes, where every
rise worth noticing is the onset of a surge that lasts. Recorded request streams are far burstier (a recorded LLM
hour has 73% of its seconds empty and clumps of 67 requests in one): a tick's rate jumps and falls back within
seconds. Replayed through the simulator (docs/scaling.md, "Recorded traffic"), the policy asked the CPU bridge for
replicas at every jump; they were ready 40 s later, when it was over, and were then paid for through the scale-down
window: on a bursty LLM hour that was most of what it paid beyond a plain HPA, for a few violation-seconds. What
serves bursts shorter than any start-up is capacity that stands when they come, and GPU capacity is the cheaper
kind (one GPU replica serves ~26 CPU replicas' rate for the price of 5).
Three rules, learned from the arrival rates the policy already reads each tick, nothing configured:
- the GPU pool keeps standing headroom of NOISE_RESERVE of the traffic's tick-to-tick standard deviations when that
  exceeds the surge reserve (`surge`); on Poisson-like traffic it is a few requests/s and the surge reserve or
  UTILIZATION's headroom is larger;
- a rise counts at once for the CPU bridge only beyond SURGE_NOISE of those deviations; within them the bridge is
  sized for the previous tick's rate, and for the new one if it holds;
- the bridge grows only while the traffic's excursions above what the ready GPU replicas serve last: the one under
  way has lasted BRIDGE_WORTH_S, or at least a quarter of the requests beyond the GPU in those of the last
  EXCURSION_MEMORY_S came in ones that lasted that long (requests, not excursions: a rate that wobbles across the
  GPU's capacity makes many brief excursions of a few requests each). With none remembered (a new model, a
  restarted operator: excursions are not saved) it grows as before.
The route is unchanged: a spill still goes to the CPU pool's ready replicas at once.
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
WORTH_SHARE = 0.25       # the bridge grows if this share of the excursions' requests came in ones that lasted
NOISE_RESERVE = 2.0      # GPU headroom: this many standard deviations of the tick-to-tick change of the rate
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


def noise_reserve(history: History, now: float) -> float:
    """Requests/s of standing GPU headroom for the traffic's own noise: NOISE_RESERVE x `tick_noise` (module
    docstring). The policy keeps the larger of it and the surge reserve."""
    return NOISE_RESERVE * tick_noise(history, now)


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


def observe(history: History, total_rate: float, served: float | None, now: float,
            interval_seconds: float) -> History:
    """Remember this tick's excursion state: an excursion of the arrival rate above `served` (requests/s the ready
    GPU replicas serve; None when unknown, which ends none and starts none) begins, goes on (adding this interval's
    requests beyond that) or ends (its length and requests are remembered for EXCURSION_MEMORY_S, at most
    MAX_EXCURSIONS). Once begun, it is measured against what the GPU served at its start: on a ramp, GPU replicas
    becoming ready do not cut the rise into brief excursions."""
    excursions = tuple(e for e in history.excursions if now - e[0] <= EXCURSION_MEMORY_S)
    since, extra, start = history.excursion_since, history.excursion_requests, history.excursion_served
    if served is None:
        return replace(history, excursions=excursions)
    # An excursion lasts while the rate stays above what the GPU served when it began (or serves now, if less): new
    # GPU replicas catching up with a rising rate end no excursion, the rate falling back does.
    level = served if since is None else min(start, served)
    if total_rate > level:
        since, start = (now, served) if since is None else (since, start)
        extra += (total_rate - level) * interval_seconds
    elif since is not None:
        excursions, since, extra = (*excursions, (now, now - since, extra))[-MAX_EXCURSIONS:], None, 0.0
    return replace(history, excursions=excursions, excursion_since=since, excursion_requests=extra,
                   excursion_served=start)


def bridge_worth(history: History, now: float, interval_seconds: float) -> bool:
    """Whether growing the CPU bridge can serve any of this traffic's excursions above the ready GPU replicas: the
    one under way has lasted BRIDGE_WORTH_S (counting this tick), or at least WORTH_SHARE of the requests beyond the
    GPU in the remembered ones came in excursions that lasted that long, or none is remembered (no evidence: grow,
    as before). Requests, not excursions, are counted: a rate that wobbles across the GPU's capacity makes many
    brief excursions of a few requests each, and says nothing of the surges that bring most of them. Call after
    `observe`."""
    since = history.excursion_since
    if since is not None and now - since + interval_seconds >= BRIDGE_WORTH_S:
        return True
    total = sum(extra for _, _, extra in history.excursions)
    if total <= 0:
        return True
    lasting = sum(extra for _, length, extra in history.excursions if length >= BRIDGE_WORTH_S)
    return lasting >= WORTH_SHARE * total
