"""THE policy: one pure function from (spec, signals, current state, history, now) to a Decision.

Order of a tick, each step explained where it lives:
1. stale or missing metrics for a pool that has ready replicas -> hold replicas and split (safety overrides for
   pools without ready replicas still apply), record nothing, say why. A measurement that failed while the pool's
   last sample is younger than staleAfterSeconds is a miss, not stale data: replicas and split are kept the same
   way, but the decision is not marked held (`missed`);
2. judge each pool's load and refine its learned capacity (`load`);
3. size the GPU pool for *all* demand under gpu-first (spillover is a bridge, not a destination), with standing
   headroom for the next surge learned from the last ones (`surge`: a surge's onset is served only by what stands
   when it comes), or for the traffic's own tick-to-tick noise where that is larger (`bursts`), then apply
   HPA-like windows/steps/cooldowns (`scaling`; a pool whose scale-downs keep being undone within the window gets a
   longer one);
4. move the split (`routing`), knowing whether the GPU is still waiting for replicas;
5. size the CPU pool for the share it will carry (under GPU pressure: the GPU's excess and queue), so it starts scaling
   with the spill. That bridge may grow past scaleUp.maxStep, up to spillover.surgeMaxStep, when the excess is
   measured; once the route sends it nothing and the GPU has every replica it asked for ready, its replicas are
   released after the scale-down cooldown instead of being kept for the stabilization window. The bridge counts a
   rise at once only beyond the traffic's own tick-to-tick noise, and does not grow at all for traffic whose
   excursions end before a new CPU replica could start (`bursts`).
No I/O and no clock: `now` is an argument, so every behaviour is reproducible in tests and the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from rerank_operator.core import names
from rerank_operator.core.autoscale import bursts, scaling
from rerank_operator.core.autoscale import load as loads
from rerank_operator.core.autoscale import split as routing
from rerank_operator.core.autoscale import surge as surges
from rerank_operator.core.autoscale import zero as zeros
from rerank_operator.core.autoscale.config import AutoscalingSpec, Pool
from rerank_operator.core.autoscale.history import History, PoolHistory, ZeroState
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.names import ROUTED_TO_ACTIVATOR, ZeroPhase


@dataclass(frozen=True)
class Current:
    """What is in effect now: the Deployments' spec.replicas and the CPU share of the route."""

    gpu_replicas: int
    cpu_replicas: int
    cpu_percent: int = 0

    def replicas(self, pool: Pool) -> int:
        return self.gpu_replicas if pool == "gpu" else self.cpu_replicas


@dataclass(frozen=True)
class Event:
    reason: str   # Kubernetes Event reason: ScaledUp, ScaledDown, TrafficShifted
    message: str


@dataclass(frozen=True)
class Decision:
    gpu_replicas: int
    cpu_replicas: int
    cpu_percent: int
    reason: str
    held: bool = False            # True when metrics were stale/missing and the last decision was kept
    missed: bool = False          # True when a measurement failed within staleAfterSeconds (kept, not held)
    events: tuple[Event, ...] = ()
    history: History = field(default_factory=History)
    #: Scale to zero (``zero``): the phase, for a model that may go to zero; None for any other model.
    zero: ZeroPhase | None = None

    @property
    def to_activator(self) -> bool:
        """The model's HTTPRoute sends every request to the activator (the pools are going to, or at, zero)."""
        return self.zero in ROUTED_TO_ACTIVATOR

    @property
    def gpu_percent(self) -> int:
        return 100 - self.cpu_percent

    def replicas(self, pool: Pool) -> int:
        return self.gpu_replicas if pool == "gpu" else self.cpu_replicas


def decide(spec: AutoscalingSpec, signals: Signals, current: Current, history: History, now: float,
           tuning: routing.Tuning = routing.PRODUCTION) -> Decision:
    """Desired replicas per pool, CPU traffic share, and why. See the module docstring for the order.

    `tuning` is for the simulator's ablation only (production uses the defaults)."""
    if not spec.enabled:
        return _static(spec, signals, current, history, "autoscaling disabled")
    stale = {pool: why for pool in ("gpu", "cpu")
             if spec.bounds(pool).enabled
             and (why := signals.pool(pool).staleness(now, spec.stale_after_seconds)) is not None}
    # Scale to zero first: a model at zero has no pod to measure, and one going there keeps its replicas.
    sleeping = _scale_to_zero(spec, signals, current, history, now, measured=not stale)
    if isinstance(sleeping, Decision):
        return sleeping
    decision = _decide_awake(sleeping.spec, signals, current, sleeping.history, now, tuning, stale,
                             gpu_waits=zeros.gpu_waits(sleeping.history.zero, spec, current.gpu_replicas, now))
    return replace(decision, zero=sleeping.zero, events=decision.events + sleeping.events)


def _decide_awake(spec: AutoscalingSpec, signals: Signals, current: Current, history: History, now: float,
                  tuning: routing.Tuning, stale: Mapping[str, str], gpu_waits: bool = False) -> Decision:
    """``decide`` for a model whose pools serve (every model but one going to, or at, zero). ``gpu_waits``: a model
    just woken on its CPU pool starts no GPU replica unless the CPU pool is over target (``zero.gpu_waits``)."""
    if stale:
        # The pools measured this tick keep their sample time, so two pools missing in turn are not stale.
        history = _sampled(history, signals, [p for p in ("gpu", "cpu") if p not in stale])
        missed = {pool: age for pool in stale
                  if (age := _missed(spec, history.pool(pool), now)) is not None}
        why = "; ".join(f"{p} metrics: {w}" for p, w in stale.items())
        if len(missed) == len(stale):
            ages = ", ".join(f"{pool} {age:.0f}s" for pool, age in missed.items())
            return _static(spec, signals, current, history, f"keeping replicas and split: {why} (a miss: the last "
                           f"sample is younger than {spec.stale_after_seconds:.0f}s: {ages})", missed=True)
        return _static(spec, signals, current, history, f"holding last decision; {why}", held=True)
    history = _sampled(history, signals, ("gpu", "cpu"))

    gpu_load = loads.assess(spec, "gpu", signals.gpu)
    cpu_load = loads.assess(spec, "cpu", signals.cpu)
    history = replace(history, gpu=loads.learn_capacity(history.gpu, signals.gpu, gpu_load),
                      cpu=loads.learn_capacity(history.cpu, signals.cpu, cpu_load))
    policy = routing.effective_policy(spec, signals)
    external = spec.replica_management == "external"
    notes: list[str] = []

    # gpu-only: the spec's (the CPU pool gets nothing anyway) or the quality guard's (the GPU takes it all).
    for_all_demand = policy in ("gpu-first", "gpu-only")  # the GPU pool is sized for all the traffic
    gpu_demand = signals.total_request_rate if for_all_demand else (signals.gpu.request_rate or 0.0)
    if policy == "cpu-only" or (gpu_waits and not cpu_load.overloaded):
        gpu_demand = 0.0
    # Standing headroom for the next surge, learned from the surges seen (`surge`): the GPU pool is sized for it
    # whenever it is sized for all demand.
    history = surges.observe(history, signals.total_request_rate, now, spec.interval_seconds)
    served = signals.gpu.ready_replicas * history.gpu.capacity if history.gpu.capacity else None
    history = bursts.observe(history, signals.total_request_rate, served, now, spec.interval_seconds)
    reserve = surges.reserve(history, now) if tuning.reserve and for_all_demand else 0.0
    if tuning.noise_reserve and for_all_demand:
        reserve = max(reserve, bursts.noise_reserve(history, now))
    gpu_replicas, history = _size(spec, signals, "gpu", gpu_load, gpu_demand, current, history, now, external, notes,
                                  backoff=tuning.backoff, reserve=reserve)

    gpu_state = routing.GpuState(gpu_load, gpu_replicas, spec.gpu.max_replicas)
    split = routing.route(spec, signals, current.cpu_percent, gpu_state, cpu_load, history, now, tuning)
    if split.cpu_percent > current.cpu_percent:
        history = replace(history, last_spill=now)
    elif split.cpu_percent < current.cpu_percent:
        history = replace(history, last_recover=now)

    # The bridge is sized for a rise at once only beyond the traffic's own noise, and grows only for traffic whose
    # excursions last long enough for a new CPU replica to serve them (`bursts`).
    bridge_rate = bursts.bridge_rate(history, now, spec.interval_seconds) if tuning.noise_bridge else None
    cpu_demand = (signals.total_request_rate if bridge_rate is None else bridge_rate) * split.sizing_percent / 100
    if policy == "gpu-only":
        cpu_demand = 0.0
    # Shifting back: the CPU pool does not grow for a share it is losing (unless it is over target).
    shrinking = policy == "gpu-first" and split.cpu_percent < current.cpu_percent and not cpu_load.overloaded
    brief = (tuning.brief_bursts and policy == "gpu-first" and not cpu_load.overloaded
             and not bursts.bridge_worth(history, now, spec.interval_seconds))
    if brief and split.cpu_percent > 0:
        notes.append("cpu: not grown: this traffic's bursts end before a new replica would start")
    surge = spec.spillover.surge_max_step if split.surge else None
    release = (policy == "gpu-first" and cpu_demand <= 0 and signals.gpu.ready_replicas > 0
               and signals.gpu.ready_replicas >= gpu_replicas)
    cpu_replicas, history = _size(spec, signals, "cpu", cpu_load, cpu_demand, current, history, now, external, notes,
                                  surge, release, grow=not (shrinking or brief), backoff=tuning.backoff)

    reason = "; ".join([split.why, *notes, _loads_summary(signals, gpu_load, cpu_load)])
    decision = Decision(gpu_replicas, cpu_replicas, split.cpu_percent, reason, history=history)
    return replace(decision, events=_events(current, decision))


#: Events of the scale-to-zero phases, by the phase entered (from another one).
ZERO_EVENTS: dict[ZeroPhase, str] = {"draining": "ScalingToZero", "asleep": "ScaledToZero", "waking": "Waking",
                                     "awake": "Woken"}


@dataclass(frozen=True)
class Awake:
    """What ``_scale_to_zero`` hands the rest of the policy for a model whose pools serve."""

    spec: AutoscalingSpec          # with the wake pool kept at one replica (``zero.awake_bounds``)
    history: History
    events: tuple[Event, ...]      # "Woken", when the model just came back from the activator
    zero: ZeroPhase | None         # "awake" for a model that may go to zero, None otherwise


def _scale_to_zero(spec: AutoscalingSpec, signals: Signals, current: Current, history: History, now: float,
                   measured: bool) -> Decision | Awake:
    """A model that may go to zero (``zero``): its decision while the route points at the activator, else the spec
    the rest of the policy sizes an awake model with (the wake pool kept at one replica) and the updated memory.
    A model whose pools are all at minReplicas 0 but that cannot sleep (no activator) is kept awake the same way."""
    before = history.zero
    state = zeros.step(before, spec, signals, measured, now)
    history = replace(history, zero=state)
    phase_event: tuple[Event, ...] = ()
    if state.phase != before.phase and (before.phase != "awake" or state.phase != "awake"):
        phase_event = (Event(ZERO_EVENTS[state.phase], zeros.why(state.phase, spec, state, now)
                             if state.phase in ROUTED_TO_ACTIVATOR
                             else f"the {names.wake_pool(spec.cpu.enabled)} pool serves again"),)
    if state.phase in ROUTED_TO_ACTIVATOR:
        gpu, cpu = zeros.replicas(spec, state.phase, current.gpu_replicas, current.cpu_replicas)
        decision = Decision(gpu, cpu, current.cpu_percent, zeros.why(state.phase, spec, state, now),
                            history=history, zero=state.phase)
        return replace(decision, events=_events(current, decision) + phase_event)
    if zeros.may_sleep(spec):
        return Awake(zeros.awake_bounds(spec), history, phase_event, "awake")
    return Awake(zeros.awake_bounds(spec), replace(history, zero=ZeroState()), phase_event, None)


def _size(spec: AutoscalingSpec, signals: Signals, pool: Pool, load: loads.Load, demand: float,
          current: Current, history: History, now: float, external: bool,
          notes: list[str], surge_step: int | None = None, release: bool = False,
          grow: bool = True, backoff: bool = True, reserve: float = 0.0) -> tuple[int, History]:
    """Replicas for one pool this tick and the updated history (external management: leave replicas alone).
    `reserve`: standing headroom in requests/s on top of `demand` (`surge.reserve`)."""
    bounds = spec.bounds(pool)
    if external or not bounds.enabled:
        return (current.replicas(pool) if external else 0), history
    pool_history = history.pool(pool)
    wanted = loads.recommend(pool_history, signals.pool(pool), load, demand, current.replicas(pool), reserve)
    if not grow:
        wanted = min(wanted, current.replicas(pool))
    result = scaling.scale(bounds, spec.scale_up, spec.scale_down, current.replicas(pool), wanted,
                           pool_history, now, idle=demand <= 0, surge_step=surge_step, release=release,
                           backoff=backoff)
    if result.note:
        notes.append(f"{pool}: {result.note}")
    return result.replicas, history.with_pool(pool, result.history)


def _missed(spec: AutoscalingSpec, history: PoolHistory, now: float) -> float | None:
    """How old the pool's last acted-on sample is, when this tick could not measure it (one slow pod, one failed
    query, a replaced pod's first scrape) while that sample is younger than staleAfterSeconds; else None (stale, or
    no sample since the operator started).

    Why: staleAfterSeconds is the user's bound on how old the signals the policy acts on may be. Treating one failed
    scrape as stale marked the decision held and flipped MetricsAvailable to False and back on the next tick: four
    status writes (the autoscaler's and the reconcile loop's) per hiccup, at 1000 models a steady trickle of writes
    although nothing had changed. The decision is kept all the same (nothing is decided on old numbers)."""
    if history.sampled_at is None:
        return None
    age = now - history.sampled_at
    return age if age <= spec.stale_after_seconds else None


def _sampled(history: History, signals: Signals, pools: Iterable[Pool]) -> History:
    """Remember when each of ``pools``' samples was taken (for `_missed`)."""
    for pool in pools:
        taken = signals.pool(pool).sampled_at
        if taken is not None:
            history = history.with_pool(pool, replace(history.pool(pool), sampled_at=taken))
    return history


def _static(spec: AutoscalingSpec, signals: Signals, current: Current, history: History, why: str,
            held: bool = False, missed: bool = False) -> Decision:
    """Keep replicas (within bounds) and split, except where a pool without ready replicas forces the split."""
    external = spec.replica_management == "external"
    gpu = current.gpu_replicas if external else spec.gpu.clamp(current.gpu_replicas)
    cpu = current.cpu_replicas if external else spec.cpu.clamp(current.cpu_replicas)
    cpu_percent = _safe_split(spec, signals, current.cpu_percent)
    reasons = [why]
    if cpu_percent != current.cpu_percent:
        reasons.append(f"traffic to {'CPU' if cpu_percent == 100 else 'GPU'}: the other pool has no ready replica")
    decision = Decision(gpu, cpu, cpu_percent, "; ".join(reasons), held=held, missed=missed, history=history)
    return replace(decision, events=_events(current, decision))


def _safe_split(spec: AutoscalingSpec, signals: Signals, cpu_percent: int) -> int:
    policy = routing.effective_policy(spec, signals)
    if policy == "cpu-only":
        return 100
    if policy == "gpu-only":
        return 0
    if signals.gpu.ready_replicas <= 0 < signals.cpu.ready_replicas:
        return 100
    if signals.cpu.ready_replicas <= 0 < signals.gpu.ready_replicas:
        return 0
    return cpu_percent


def _events(current: Current, decision: Decision) -> tuple[Event, ...]:
    events = []
    for pool in ("gpu", "cpu"):
        before, after = current.replicas(pool), decision.replicas(pool)
        if after != before:
            events.append(Event("ScaledUp" if after > before else "ScaledDown",
                                f"{pool} pool {before} -> {after} replicas: {decision.reason}"))
    if decision.cpu_percent != current.cpu_percent:
        events.append(Event("TrafficShifted", f"gpu/cpu {100 - current.cpu_percent}/{current.cpu_percent} -> "
                                              f"{decision.gpu_percent}/{decision.cpu_percent}: {decision.reason}"))
    return tuple(events)


def _loads_summary(signals: Signals, gpu: loads.Load, cpu: loads.Load) -> str:
    parts = []
    for pool, load in (("gpu", gpu), ("cpu", cpu)):
        if signals.pool(pool).ready_replicas > 0:
            parts.append(f"{load.why} ({signals.pool(pool).ready_replicas} ready)")
    return ", ".join(parts) if parts else "no ready replicas"
