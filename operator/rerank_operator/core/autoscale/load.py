"""How loaded a pool is, and what it can serve: the two judgements the policy builds on.

Latency and queue depth tell us *whether* a pool is over its targets but not by how much load: p95 stays flat
until saturation and then explodes. Sizing therefore uses a learned capacity (requests/s one replica serves
within the targets), observed from the pool itself, so nothing about hardware has to be configured:
- at or above target, what a replica is serving is at least what it can serve within target: lower the
  estimate towards it, by at most 20% per tick, so one bursty interval (a backlog left from before a scale-up,
  a spike that began just before the scrape) cannot collapse it;
- below target, a replica demonstrably serves what it is serving: the estimate never drops below that.
A capacity seen only below target is a lower bound, good for removing replicas but never for adding them. It is a
rate a replica has already served within target, so a pool sized from it needs no headroom on top: with UTILIZATION
applied to it too, the demand that n replicas served before a burst would ask for ceil(n / 0.85) > n after it, and
a lower bound only rises with more per replica than it, which the larger pool never sees: the pool would keep
replicas it does not need for as long as the demand stays.
An interval in which the pool completed more than arrived (working off a backlog) teaches nothing: the backlog may
have emptied part-way through, and the latency is the backlog's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from rerank_operator.core.autoscale.config import AutoscalingSpec, Pool
from rerank_operator.core.autoscale.history import PoolHistory
from rerank_operator.core.autoscale.signals import PoolSignals

UTILIZATION = 0.85     # size pools for this fraction of the learned capacity
BACKLOG_EVIDENCE = 0.05  # completions this far (relative) from arrivals: the pool works at its ceiling
MAX_REPLICAS = 10_000   # recommendations are clamped by the pool bounds anyway; this keeps arithmetic finite
MAX_DECREASE = 0.8       # one over-target tick lowers the capacity estimate by at most 20%
# Arrivals below this (requests/s: one per ~17 minutes) are no traffic, whatever the latency says: a rate that small
# is what a counter's float arithmetic leaves, and learning from it walked the capacity down 20% a tick for
# hours (to 1e-20 requests/s per replica) and then grew the pool to its maximum (found by the property tests).
MIN_LEARNING_RATE = 1e-3


@dataclass(frozen=True)
class Load:
    ratio: float  # max(p95 / target, queue per replica / target); 1.0 is exactly at target
    why: str      # the dominant signal, in words

    @property
    def overloaded(self) -> bool:
        return self.ratio >= 1.0


def assess(spec: AutoscalingSpec, pool: Pool, signals: PoolSignals) -> Load:
    """Load ratio of a pool from its latency and queue signals (0 when it has no ready replica)."""
    if signals.ready_replicas <= 0:
        return Load(0.0, f"{pool}: no ready replica")
    target_ms = spec.latency_target_ms(pool)
    latency = (signals.latency_p95_ms or 0.0) / target_ms
    queue = (signals.queue_per_replica or 0.0) / spec.targets.queue_per_replica
    if latency >= queue:
        return Load(latency, f"{pool} p95 {signals.latency_p95_ms or 0:.0f}ms vs {target_ms:.0f}ms target")
    return Load(queue, f"{pool} queue {signals.queue_per_replica:.1f}/replica vs "
                       f"{spec.targets.queue_per_replica:.0f} target")


def learn_capacity(history: PoolHistory, signals: PoolSignals, load: Load) -> PoolHistory:
    """Update the per-replica capacity estimate from one fresh observation (see module docstring)."""
    arrived = signals.request_rate or 0.0
    served = signals.success_rate if signals.success_rate is not None else arrived
    replicas = signals.scraped_replicas or signals.ready_replicas
    if arrived < MIN_LEARNING_RATE or replicas <= 0:
        return history
    if not load.overloaded:
        history = replace(history, last_state=(signals.ready_replicas, False))
        if history.capacity is None or arrived / replicas > history.capacity:
            return replace(history, capacity=arrived / replicas)
        return history
    # Over target. Only trust it if it was over target at the previous tick too, with the same replicas: a
    # backlog left from before a scale-up, or a spike that began just before the scrape, says nothing about
    # what a replica can serve. Completions that differ from arrivals (a backlog growing or draining) show
    # the ceiling itself; otherwise what arrives per replica is more than it serves within target.
    state = (signals.ready_replicas, True)
    if history.last_state != state:
        return replace(history, last_state=state)
    if served > arrived * (1 + BACKLOG_EVIDENCE):
        # Working off a backlog: it may have emptied part-way through the interval, so what was served is
        # not the ceiling, and the latency is the backlog's, not the arrival rate's. Nothing to learn.
        return replace(history, last_state=state)
    busy = arrived - served > BACKLOG_EVIDENCE * arrived
    observed = (served if busy else arrived) / replicas
    if history.capacity is None:
        return replace(history, capacity=observed, capacity_from_saturation=True)
    lowered = min(history.capacity, max(observed, history.capacity * MAX_DECREASE))
    return replace(history, capacity=lowered, capacity_from_saturation=True)


def recommend(history: PoolHistory, signals: PoolSignals, load: Load, demand: float, current: int,
              reserve: float = 0.0) -> int:
    """Replicas this pool should have for `demand` requests/s (before bounds, windows, steps, cooldowns).

    Overloaded: to the size learned at saturation, and by one more than ready while the backlog grows; without
    such a capacity, grow at least by one and at most doubling the ready count per tick.
    Otherwise: the learned size; from a lower bound (not learned at saturation) only downwards, and without
    UTILIZATION's headroom (module docstring); idle: nothing; unknown: hold.
    `reserve`: requests/s of standing headroom for the next surge (`surge.reserve`): the learned size is at least
    what serves demand plus it at the full capacity, so the headroom a surge finds does not depend on the load it
    lands on (UTILIZATION's alone grows and shrinks with it). Demand alone keeps UTILIZATION: sizing it at 95-100%
    under a reserve saved under 0.5% of the cost for 3-10% more violations in the simulator.
    """
    ready = signals.ready_replicas
    sized = None
    if history.capacity and demand > 0:
        need = max(demand / (history.capacity * UTILIZATION), (demand + reserve) / history.capacity)
        sized = math.ceil(min(need, MAX_REPLICAS))
    if ready <= 0:
        if sized is not None and history.capacity_from_saturation:
            return max(sized, 1)
        return max(current, 1 if demand > 0 else 0)
    if load.overloaded:
        if sized is not None and history.capacity_from_saturation:
            # The learned size says how many replicas the demand needs; a pool that completes what arrives
            # is only working off a backlog and needs no extra replica for it, one that does not needs one.
            return max(sized, ready if keeping_up(signals) else ready + 1, current)
        grown = max(ready + 1, math.ceil(ready * min(load.ratio, 2.0)))
        return max(grown, sized or 0, current)
    if demand <= 0:
        return 0
    if sized is None or history.capacity is None:
        return current
    if history.capacity_from_saturation:
        return sized
    # A floor is itself a rate served within target: no headroom on top of it (module docstring).
    return min(math.ceil(min((demand + reserve) / history.capacity, MAX_REPLICAS)), current)


def keeping_up(signals: PoolSignals) -> bool:
    """Whether the pool completed at least what arrived in the last interval (its backlog is not growing)."""
    arrived = signals.request_rate or 0.0
    served = signals.success_rate if signals.success_rate is not None else arrived
    return served >= arrived * (1 - BACKLOG_EVIDENCE)
