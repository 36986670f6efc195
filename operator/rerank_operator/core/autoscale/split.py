"""The traffic split: what share of requests the CPU pool gets, per routing policy.

gpu-first spills only what the GPU cannot serve, and recovers gradually:
- spill while the GPU is saturated and cannot absorb more now: over its targets and either at its max or still
  waiting for replicas it asked for, or its memory is at the watermark. Once the GPU's per-replica capacity is
  learned (`load.learn_capacity`; a lower bound will do, it only makes the spill generous), the CPU share goes
  straight to the GPU's measured excess, the share its ready replicas cannot serve within target, plus what lets
  it work off its queue beyond target within one interval; no fixed step. Before that, stepPercent at a time.
  The CPU pool is sized for that excess plus the queue's drain (`Split.wanted_cpu_percent`) and may grow to it in
  one step (`Split.surge`);
- never give the CPU pool more than its ready replicas can serve within its target, once that capacity is known:
  the first spill onto a small CPU pool is what it can take now, the rest follows as its replicas become ready.
  Before it is measured, what the CPU replicas served within target is a lower bound to go to, and beyond it the
  share probes upwards (1%, then doubling per tick, at most stepPercent more), never one blind step onto a single
  replica; when both pools are over target, hold, or shrink the CPU share to that capacity. One exception: while
  the GPU waits for replicas and its queue alone keeps its requests past target (late whatever the CPU does), the
  CPU pool may take up to DRAIN_ROOM x that share, as long as it completes what it gets, so the queue is worked off
  sooner;
- shift back (by at most recoverStepPercent per tick) once the GPU has headroom, but never below the share the GPU's
  ready replicas still cannot serve within target: the split settles where it is needed instead of swinging to 0
  and back (damping); not sooner than the scale-down cooldown after the last spill unless the GPU has every replica it
  asked for ready and a capacity learned at saturation, so the projection is measured.
Safety wins over all of it: no ready GPU replica means 100% CPU, no ready CPU replica means 0%
(``ready_pools_only``, the reconcile loop's rule too).
`Tuning` switches parts off for the simulator's ablation only; production always uses the defaults.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from rerank_operator.core.autoscale.config import AutoscalingSpec
from rerank_operator.core.autoscale.history import History
from rerank_operator.core.autoscale.load import UTILIZATION, Load, keeping_up
from rerank_operator.core.autoscale.recorded import RecordedDecision
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.builders.routing import Traffic
from rerank_operator.core.quality import guard_policy
from rerank_operator.core.spec.model import RerankModelSpec

RECOVER_RATIO = 0.8          # without a learned capacity, recover only if the GPU would stay under 80% of target
MEMORY_HYSTERESIS = 0.05     # recover from a memory spill only 5 points under the watermark
SETTLE_UTILIZATION = 0.95    # shifting back stops where the GPU's ready replicas run at 95% of their capacity
DRAIN_ROOM = 2.0             # CPU room multiplier while the GPU's queue alone is later than its target (drain_room)


@dataclass(frozen=True)
class Tuning:
    """Parts of gpu-first spillover, all on in production; benchmarks/autoscale_sim.py turns them off one at a time
    to measure what each buys (the ablation)."""

    exact_spill: bool = True   # spill the GPU's measured excess (not stepPercent steps) once any capacity is learned
    drain: bool = True         # add what works off the GPU's queue beyond target within one interval
    damping: bool = True       # shift back no lower than the share the GPU still cannot serve
    surge: bool = True         # the CPU pool may grow to the excess in one step (spillover.surgeMaxStep)
    probe: bool = True         # before the CPU's capacity is measured, double its share per tick from 1%
    bridge_drain: bool = True  # the CPU pool is sized for the excess plus the GPU queue's drain, not the excess alone
    drain_room: bool = True    # while the GPU's queue alone outlasts its target, the CPU may take DRAIN_ROOM x its room
    backoff: bool = True       # scale-downs that had to be undone lengthen the scale-down window (scaling.backed_off)
    reserve: bool = True       # keep standing GPU headroom for the next surge, learned from the last ones (surge)
    noise_bridge: bool = True  # size the CPU bridge for a rise at once only beyond the traffic's noise (bursts)
    brief_bursts: bool = True  # no bridge growth for traffic whose excursions end before a CPU replica starts (bursts)
    noise_reserve: bool = True  # keep GPU headroom for the traffic's own tick-to-tick noise (bursts.noise_reserve)


PRODUCTION = Tuning()  # every part on: what the operator runs


@dataclass(frozen=True)
class Split:
    cpu_percent: int
    why: str
    wanted_cpu_percent: int | None = None  # share the CPU pool should be sized for (the GPU's excess)
    surge: bool = False  # that share is the GPU's measured excess: the CPU pool may grow to it in one step

    @property
    def sizing_percent(self) -> int:
        return self.cpu_percent if self.wanted_cpu_percent is None else max(self.cpu_percent,
                                                                             self.wanted_cpu_percent)


@dataclass(frozen=True)
class GpuState:
    load: Load
    desired: int       # replicas decided this tick
    max_replicas: int


def route(spec: AutoscalingSpec, signals: Signals, cpu_percent: int, gpu: GpuState, cpu_load: Load,
          history: History, now: float, tuning: Tuning = Tuning()) -> Split:
    policy = effective_policy(spec, signals)
    gpu_ready, cpu_ready = signals.gpu.ready_replicas, signals.cpu.ready_replicas
    if policy != effective_policy(spec):  # the quality guard's exclusion, not the spec's policy
        if policy == "gpu-only":
            return Split(0, "the CPU pool ranks below the quality floor: all traffic to the GPU pool")
        return Split(100, "the GPU pool ranks below the quality floor: all traffic to the CPU pool")
    if policy == "cpu-only":
        return Split(100, "routing policy cpu-only")
    if policy == "gpu-only":
        return Split(0, "routing policy gpu-only")
    forced = ready_pools_only(gpu_ready, cpu_ready)  # the reconcile loop's rule too
    if forced is not None:
        return Split(*forced)
    if gpu_ready <= 0 or cpu_ready <= 0:
        return Split(cpu_percent, "no replica ready in any pool")
    if policy == "fixed":
        return Split(100 - spec.fixed_gpu_percent, "routing policy fixed")
    return _gpu_first(spec, signals, min(cpu_percent, spec.spillover.max_cpu_percent), gpu, cpu_load, history, now,
                      tuning)


def effective_policy(spec: AutoscalingSpec, signals: Signals | None = None) -> str:
    """The routing policy once disabled pools are taken into account and, given ``signals``, a pool the quality
    guard finds below the floor (``signals.below_floor``): the other pool takes everything while it has ready
    replicas, and is sized for it (a worse ranking beats a failed request, so not when it has none)."""
    if not spec.gpu.enabled:
        return "cpu-only"
    if not spec.cpu.enabled:
        return "gpu-only"
    if signals is not None:
        ready = {"gpu": signals.gpu.ready_replicas, "cpu": signals.cpu.ready_replicas}
        out = guard_policy.excluded(signals.below_floor, ready)
        if out is not None:
            return "gpu-only" if out == "cpu" else "cpu-only"
    return spec.routing_policy


def _gpu_first(spec: AutoscalingSpec, signals: Signals, cpu_percent: int, gpu: GpuState, cpu_load: Load,
               history: History, now: float, tuning: Tuning) -> Split:
    spill = spec.spillover
    pressure = _gpu_pressure(spec, signals, gpu)
    room = _cpu_room_percent(signals, history)
    if (room is not None and tuning.drain_room and gpu.desired > signals.gpu.ready_replicas
            and _gpu_queue_late(spec, signals, history) and keeping_up(signals.cpu)):
        # The GPU's queue alone keeps its requests past target: those seconds are lost whatever the CPU does, and
        # they end when the queue is worked off. While GPU replicas are on their way (the bridge: a GPU at its max
        # would only hand its overload to the CPU) and the CPU pool keeps up with what it gets, the CPU may run past
        # its own target, up to DRAIN_ROOM x its room, so the GPU drains sooner; fewer requests end up late overall
        # (the simulator's late_fraction). Back to its room once the queue is gone (the branch below shrinks the
        # share when the CPU is over target) or the CPU stops keeping up.
        room = min(100, int(room * DRAIN_ROOM))
    if pressure:
        # Straight to the GPU's measured excess (plus what works off its queue within a tick) once a capacity is
        # known, one step at a time before. The CPU pool is sized for both: a spike's queue builds on the GPU for as
        # long as new CPU replicas take to start, and it is their room that works it off once they are ready.
        excess = _gpu_excess_percent(signals, history, tuning) if gpu.load.overloaded else None
        drain = _drain_percent(spec, signals) if tuning.drain else 0
        if excess is not None and tuning.exact_spill:
            wanted = min(spill.max_cpu_percent, excess + drain)
        else:
            wanted = min(spill.max_cpu_percent, max(cpu_percent + spill.step_percent, (excess or 0) + drain))
        sizing = min(spill.max_cpu_percent, max(cpu_percent, excess + (drain if tuning.bridge_drain else 0))
                     if excess is not None else cpu_percent + spill.step_percent)
        surge = excess is not None and tuning.surge
        if cpu_load.overloaded:
            if room is not None and room < cpu_percent:
                return Split(room, f"{pressure}, but CPU pool is over target ({cpu_load.why}): "
                                   f"keeping only what its ready replicas can serve", sizing, surge)
            return Split(cpu_percent, f"{pressure}, but CPU pool is over target too ({cpu_load.why}): "
                                      f"holding split", sizing, surge)
        if room is None:
            # The CPU's capacity is not measured at saturation yet. What its ready replicas served within target
            # is a lower bound: go to it, or else probe, doubling the share each tick (at least 1%, at most one
            # stepPercent more), so a single CPU replica is never flooded with a step it cannot serve.
            lower = _cpu_room_percent(signals, history, measured=False) or 0
            probe = max(1, 2 * cpu_percent) if tuning.probe else cpu_percent + spill.step_percent
            ceiling = min(wanted, max(lower, probe), cpu_percent + spill.step_percent)
        else:                     # straight to what the ready CPU replicas serve within target
            ceiling = min(wanted, max(room, cpu_percent))
        if cpu_percent >= ceiling:
            return Split(cpu_percent, f"{pressure}; CPU share held at {cpu_percent}% (wanted {wanted}%)",
                         sizing, surge)
        return Split(ceiling, f"{pressure}: spilling to CPU ({cpu_percent}% -> {ceiling}% of {wanted}% wanted)",
                     sizing, surge)
    if cpu_percent <= 0:
        return Split(0, "GPU has headroom")
    # With a capacity measured at saturation, the share the GPU cannot serve replaces the one-step projection.
    need = (_gpu_excess_percent(signals, history, tuning, SETTLE_UTILIZATION)
            if tuning.damping and history.gpu.capacity_from_saturation else None)
    blocker = _recovery_blocker(spec, signals, cpu_percent, gpu, cpu_load, history, now, project=need is None)
    if blocker:
        return Split(cpu_percent, f"keeping {cpu_percent}% on CPU: {blocker}")
    after = max(cpu_percent - spill.recover_step_percent, 0)
    if need is not None and need > after:
        # Give back to the GPU what it can serve within target, no more, or the next tick spills it again.
        if need >= cpu_percent:
            return Split(cpu_percent, f"keeping {cpu_percent}% on CPU: the GPU's ready replicas serve "
                                      f"{100 - need}% within target")
        return Split(need, f"GPU has headroom: shifting back to the {need}% its ready replicas cannot serve")
    return Split(after, "GPU has headroom: shifting back")


def _gpu_excess_percent(signals: Signals, history: History, tuning: Tuning,
                        utilization: float = 1.0) -> int | None:
    """Share of all traffic beyond what the ready GPU replicas serve within target (at `utilization` of their
    learned capacity); None if unknown. A capacity seen only below target is a lower bound: with it the excess is
    an upper bound, which errs on the side of the SLO (and the CPU pool's room caps it anyway)."""
    capacity = history.gpu.capacity
    total = signals.total_request_rate
    if not capacity or total <= 0 or not (history.gpu.capacity_from_saturation or tuning.exact_spill):
        return None
    served = signals.gpu.ready_replicas * capacity * utilization
    return int(max(0.0, min(100.0, math.ceil(round(max(-1.0, min(1.0, 1 - served / total)) * 100, 6)))))


def _gpu_queue_late(spec: AutoscalingSpec, signals: Signals, history: History) -> bool:
    """Whether the GPU's queue alone takes longer than its latency target to serve at its learned capacity: every
    request it gets waits past target until that queue is worked off."""
    queue, capacity, ready = signals.gpu.queue_size, history.gpu.capacity, signals.gpu.ready_replicas
    if queue is None or not capacity or ready <= 0:
        return False
    return queue / (ready * capacity) > spec.targets.gpu_latency_p95_ms / 1000


def _drain_percent(spec: AutoscalingSpec, signals: Signals) -> int:
    """Extra share that lets the GPU work off its queue beyond target within one interval (0 if none)."""
    queue, total = signals.gpu.queue_size, signals.total_request_rate
    if queue is None or total <= 0:
        return 0
    beyond = queue - spec.targets.queue_per_replica * max(signals.gpu.ready_replicas, 1)
    if beyond <= 0:
        return 0
    return math.ceil(min(100.0, 100 * beyond / spec.interval_seconds / total))


def _cpu_room_percent(signals: Signals, history: History, measured: bool = True) -> int | None:
    """Share of all traffic the ready CPU replicas can serve within target; None before the capacity is known
    (`measured`: at saturation; otherwise a lower bound will do)."""
    capacity = history.cpu.capacity
    total = signals.total_request_rate
    if not capacity or (measured and not history.cpu.capacity_from_saturation) or total <= 0:
        return None
    return int(max(0.0, min(100.0, 100 * signals.cpu.ready_replicas * capacity / total)))


def _gpu_pressure(spec: AutoscalingSpec, signals: Signals, gpu: GpuState) -> str | None:
    memory = signals.gpu.gpu_memory_fraction
    if memory is not None and memory >= spec.targets.gpu_memory_watermark:
        return f"GPU memory {memory:.0%} at or above the {spec.targets.gpu_memory_watermark:.0%} watermark"
    if not gpu.load.overloaded:
        return None
    ready = signals.gpu.ready_replicas
    if ready >= gpu.max_replicas:
        return f"{gpu.load.why} at max replicas ({gpu.max_replicas})"
    if gpu.desired > ready:
        return f"{gpu.load.why} with {ready}/{gpu.desired} GPU replicas ready"
    return None


def _recovery_blocker(spec: AutoscalingSpec, signals: Signals, cpu_percent: int, gpu: GpuState, cpu_load: Load,
                      history: History, now: float, project: bool = True) -> str | None:
    memory = signals.gpu.gpu_memory_fraction
    if memory is not None and memory >= spec.targets.gpu_memory_watermark - MEMORY_HYSTERESIS:
        return f"GPU memory {memory:.0%} within {MEMORY_HYSTERESIS:.0%} of the watermark"
    if gpu.load.overloaded:
        return f"GPU is over target ({gpu.load.why})"
    cpu_in_trouble = cpu_load.overloaded
    hold = spec.scale_down.cooldown_seconds
    # The GPU has every replica it asked for and a capacity measured at saturation: the projection below is
    # the hysteresis, holding the split longer would only keep the CPU bridge (and its replicas) busy.
    settled = history.gpu.capacity_from_saturation and signals.gpu.ready_replicas >= gpu.desired
    if not cpu_in_trouble and not settled and history.last_spill is not None and now - history.last_spill < hold:
        return f"last spill {now - history.last_spill:.0f}s ago (< {hold:.0f}s)"
    gpu_percent = 100 - cpu_percent
    after = gpu_percent + min(spec.spillover.recover_step_percent, cpu_percent)
    projected = _projected_gpu_ratio(signals, gpu, history, gpu_percent, after) if project else None
    if projected is not None and projected > (UTILIZATION if history.gpu.capacity_from_saturation else
                                              RECOVER_RATIO) and not cpu_in_trouble:
        return f"GPU would be at {projected:.0%} of its capacity after the step"
    return None


def _projected_gpu_ratio(signals: Signals, gpu: GpuState, history: History, gpu_percent: int,
                         after_percent: int) -> float | None:
    """Load on the GPU if it took `after_percent` of traffic; None when nothing can be said (it got none)."""
    ready = signals.gpu.ready_replicas
    capacity = history.gpu.capacity
    if capacity and history.gpu.capacity_from_saturation and ready > 0:
        return signals.total_request_rate * after_percent / 100 / (ready * capacity)
    if gpu_percent <= 0:
        return None
    return gpu.load.ratio * after_percent / gpu_percent


# -- The reconcile loop's split: the spec's policy, the autoscaler's decision, the guard's exclusion, ready pools --
def _policy_split(spec: RerankModelSpec, gpu_ready: int, decision: RecordedDecision | None) -> Traffic:
    if not spec.gpu.enabled:
        return Traffic(0, 100, "only the CPU pool is enabled")
    if not spec.cpu.enabled:
        return Traffic(100, 0, "only the GPU pool is enabled")
    policy = spec.routing.policy
    if policy == "cpu-only":
        return Traffic(0, 100, "routing policy cpu-only")
    if policy == "gpu-only":
        return Traffic(100, 0, "routing policy gpu-only")
    if decision is not None and decision.gpu_percent is not None:
        gpu = max(0, min(100, decision.gpu_percent))
        return Traffic(gpu, 100 - gpu, f"autoscaler: {decision.reason or 'decision'}")
    if policy == "fixed" and spec.routing.weights is not None:
        w = spec.routing.weights
        return Traffic(w.gpu, w.cpu, "routing policy fixed")
    if gpu_ready > 0:
        return Traffic(100, 0, "routing policy gpu-first: the GPU pool has ready replicas")
    return Traffic(0, 100, "routing policy gpu-first: no GPU replica ready, serving from the CPU pool")


def split(
    spec: RerankModelSpec, gpu_ready: int, cpu_ready: int, decision: RecordedDecision | None = None,
    below_floor: Collection[str] = (),
) -> Traffic:
    """The split for ``spec`` given ready replicas per pool, with autoscaling on the autoscaler's decision, and the
    pools the quality guard finds below the floor."""
    traffic = _policy_split(spec, gpu_ready, decision)
    out = guard_policy.excluded(below_floor, {"gpu": gpu_ready, "cpu": cpu_ready})
    if out == "cpu" and traffic.cpu_percent > 0:
        traffic = Traffic(100, 0, "the CPU pool ranks below the quality floor: all traffic to the GPU pool")
    elif out == "gpu" and traffic.gpu_percent > 0:
        traffic = Traffic(0, 100, "the GPU pool ranks below the quality floor: all traffic to the CPU pool")
    forced = ready_pools_only(gpu_ready, cpu_ready, gpu_enabled=spec.gpu.enabled, cpu_enabled=spec.cpu.enabled)
    if forced is not None and forced[0] != traffic.cpu_percent:
        return Traffic(100 - forced[0], forced[0], forced[1])
    return traffic


def ready_pools_only(gpu_ready: int, cpu_ready: int, *, gpu_enabled: bool = True,
                     cpu_enabled: bool = True) -> tuple[int, str] | None:
    """The rule every split obeys, the reconcile loop's and the autoscaler's (``autoscale/split.route``): a pool with
    no ready replica gets no traffic while the other pool has ready ones. Returns the CPU share it forces and why, or
    None when both pools (or neither) have ready replicas."""
    if gpu_ready <= 0 and cpu_ready > 0 and cpu_enabled:
        return 100, "no GPU replica ready: all traffic to the CPU pool"
    if cpu_ready <= 0 and gpu_ready > 0 and gpu_enabled:
        return 0, "no CPU replica ready: all traffic to the GPU pool"
    return None
