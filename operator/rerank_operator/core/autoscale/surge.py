"""Standing GPU headroom for the next surge, sized from the surges this model's traffic has already had.

Why: on traffic with sudden surges, nothing asked for at a surge's onset is ready before a CPU pod starts (40 s and
more) and a GPU pod (minutes): only the capacity standing when it comes serves it, plus the CPU bridge later. Sizing
the GPU pool for demand at UTILIZATION keeps a headroom proportional to the load: large at the peak, where the
surges are no larger, and about one rounding at the trough, where every surge overruns it. A surge's size does not
scale with the load it lands on, so the headroom should not either: each tick the GPU pool is sized at least for
demand plus a reserve (`reserve`), the lower quartile of the recent surges' sizes, at full capacity
(`load.recommend`). A surge under way has used up the reserve kept for it: the reserve is less the rate's rise over
its lowest of the last NET_OF_RISE_S, so a surge's replicas are not sized for a second one on top (and then held for
the scale-down window). Nothing is configured: the reserve is learned from the arrival rate the policy already
reads each tick (`observe`), and on traffic without surges (ramps, diurnal swings, noise) it stays 0 and the sizing
is as before. The quantile is the cost lever: in the simulator the lower quartile was the largest whose cost the
baselines' sweep still covers (+10% on diurnal traffic with spikes), where the cost-matched ratio was best.

A surge is a rise of the total arrival rate, within SURGE_RISE_S, beyond what counting noise explains
(SURGE_NOISE standard deviations of a Poisson count over the interval, for the difference of two rates). One
surge spreads over a few ticks (its onset falls inside an interval): rises within SURGE_EPISODE_S of the last
recorded one are the same surge, and it keeps its largest rise. Surges older than SURGE_MEMORY_S are forgotten.
Only recurring surges keep a reserve: fewer than MIN_SURGES remembered, none is kept. One burst is an event, not a
pattern: a reserve learned from it would hold the GPU pool above demand for SURGE_MEMORY_S after it (a pool that
never shrinks after a single burst), and it says nothing of the next one.
Measured in `benchmarks/autoscale_sim` (docs/scaling.md, "Onset headroom").
"""

from __future__ import annotations

import math
from dataclasses import replace

from rerank_operator.core.autoscale.history import MAX_SURGES, History

SURGE_RISE_S = 15.0       # a rise is measured against the lowest arrival rate of this many seconds before
SURGE_NOISE = 4.0         # standard deviations of Poisson counting noise a rise must exceed to count as a surge
SURGE_EPISODE_S = 30.0    # rises this close to the last recorded surge are the same surge (it keeps the largest)
SURGE_MEMORY_S = 6 * 3600.0  # surges older than this no longer size the reserve
MIN_SURGES = 2           # surges remembered before any reserve is kept: one burst is not yet a pattern
RESERVE_QUANTILE = 0.25   # the reserve is this quantile of the remembered surges' sizes (the lower quartile)
NET_OF_RISE_S = 300.0     # a surge under way uses up the reserve: less its rise over the lowest rate of this long


def observe(history: History, total_rate: float, now: float, interval_seconds: float) -> History:
    """Remember this tick's total arrival rate and, if it rose like a surge, the surge (module docstring)."""
    kept = [(t, r) for t, r in history.arrivals if 0 < now - t <= max(SURGE_RISE_S, NET_OF_RISE_S)]
    window = [(t, r) for t, r in kept if now - t <= SURGE_RISE_S]
    arrivals = (*kept, (now, total_rate))
    surges = tuple((t, s) for t, s in history.surges if now - t <= SURGE_MEMORY_S)
    if window:
        low = min(r for _, r in window)
        rise = total_rate - low
        noise = SURGE_NOISE * math.sqrt(2 * max(total_rate, 1.0) / max(interval_seconds, 1.0))
        if rise > noise:
            if surges and now - surges[-1][0] <= SURGE_EPISODE_S:
                surges = (*surges[:-1], (now, max(surges[-1][1], rise)))
            else:
                surges = (*surges, (now, rise))
    return replace(history, arrivals=arrivals, surges=surges[-MAX_SURGES:])


def reserve(history: History, now: float) -> float:
    """Requests/s of standing headroom to keep on the GPU pool: the RESERVE_QUANTILE of the surges remembered
    (0 with fewer than MIN_SURGES: a single burst teaches no headroom), less what the arrival rate has risen above
    its lowest of the last NET_OF_RISE_S: a surge under way has used the headroom kept for it, and the pool is
    sized for it as demand, not again on top of it."""
    sizes = sorted(s for t, s in history.surges if now - t <= SURGE_MEMORY_S)
    if len(sizes) < MIN_SURGES:
        return 0.0
    size = sizes[min(len(sizes) - 1, int(RESERVE_QUANTILE * len(sizes)))]
    recent = [r for t, r in history.arrivals if now - t <= NET_OF_RISE_S]
    if NET_OF_RISE_S > 0 and recent:
        size -= max(0.0, recent[-1] - min(recent))
    return max(0.0, size)
