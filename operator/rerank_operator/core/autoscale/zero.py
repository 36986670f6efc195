"""Scale to zero: an idle model's pools go to zero pods, and the first request wakes the CPU INT8 pool. Pure.

A model may go to zero when every enabled pool has minReplicas 0 (the class allows it) and the operator knows an
activator (``--activator-url``): a shared proxy that holds requests while the model has no pod, tells the operator
(``GET /pending``), and forwards each held request as soon as the woken pool accepts it. Waking is spillover from
nothing: the CPU pool starts in seconds, so it is the one woken; the GPU pool follows only if load persists, as the
policy decides for any awake model.

The phases (``History.zero``), and why each step is ordered so that no request meets a backend with no pod:

- ``awake``: the pools serve, and the pool that wakes (CPU, else GPU: ``wake_pool``) keeps at least one replica
  (``awake_bounds``), so the policy's own scale-down never empties the model behind the activator's back.
- ``draining``: no request for ``idleSeconds``. The HTTPRoute points at the activator *first*, and the replicas stay
  as they were for ``DRAIN_SECONDS``, so the Gateway has switched before a pod goes: a request that still reaches a
  pool is served, one that reaches the activator is forwarded to the same pool (which is still up). Any request
  seen (a pool's rate, or the activator's) makes the model ``awake`` again.
- ``asleep``: every pool at zero; the route stays on the activator, which holds what arrives.
- ``waking``: the activator holds requests for the model: the wake pool gets one replica. The route stays on the
  activator until that replica is ready (the activator forwards to it meanwhile), then points at the pools again
  (``awake``), so a request never meets a pool that has no ready pod. The GPU pool stays at zero for
  GPU_WAKE_AFTER_SECONDS after the wake unless the CPU pool is over target (``gpu_waits``).

Idle time is counted from the last request a pool or the activator saw; with stale metrics it is not counted at all
(no rate is not no traffic), and counting starts when the operator first looks at the model. Only a request wakes a
sleeping model: stale metrics of its terminating pods do not (``step``).
"""

from __future__ import annotations

from dataclasses import replace

from rerank_operator.core import names, platform
from rerank_operator.core.autoscale.config import AutoscalingSpec, PoolBounds
from rerank_operator.core.autoscale.history import ZeroState
from rerank_operator.core.autoscale.recorded import RecordedDecision
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.names import ZeroPhase
from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec.model import RerankModelSpec

#: How long the route points at the activator before the pools go: one tick to apply the route plus the time a
#: Gateway takes to program it (seconds for Envoy-based ones); requests meanwhile are served either way.
DRAIN_SECONDS = 15.0
#: Ticks come every intervalSeconds, give or take their own duration: a drain that ends "at" a tick must not wait for
#: the next one (at 15 s ticks a 15 s drain took 30 s in benchmarks/fleet/).
TICK_SLACK_SECONDS = 1.0
#: After a wake, how long the load must persist before the GPU pool is started (unless the CPU pool is over target):
#: one query after a night asleep is served by the CPU pool alone, not by a GPU replica that takes minutes to start
#: and then idles for the scale-down window.
GPU_WAKE_AFTER_SECONDS = 60.0


def may_sleep(spec: AutoscalingSpec) -> bool:
    """Whether the policy may take this model to zero: every enabled pool at minReplicas 0, an idle period set
    (``AutoscalingSpec.idle_seconds``: None when the spec or the operator rules it out), replicas the operator's."""
    return (spec.idle_seconds is not None and spec.replica_management == "operator"
            and specs.all_at_zero(spec.cpu, spec.gpu))


def awake_bounds(spec: AutoscalingSpec) -> AutoscalingSpec:
    """``spec`` with the wake pool kept at one replica or more: an awake model goes to zero only through the
    phases above (the activator first), never by the policy's scale-down of an idle pool."""
    pool = names.wake_pool(spec.cpu.enabled)
    bounds = spec.bounds(pool)
    if bounds.min_replicas >= 1:
        return spec
    kept = PoolBounds(bounds.enabled, 1, max(1, bounds.max_replicas))
    return replace(spec, cpu=kept) if pool == "cpu" else replace(spec, gpu=kept)


def requested(state: ZeroState, signals: Signals) -> float | None:
    """The time of the newest request this tick shows (None: none): held at the activator now, or newer at the
    activator than any seen (its ``last``), or served by a pool this interval (a measured rate above zero). Metrics
    that could not be read are no request: that is for the awake model's idle count alone (``step``)."""
    demand = signals.activator
    if demand is not None and demand.waiting > 0:
        return float("inf")
    newest = None
    if demand is not None and demand.last is not None and (state.last_request is None
                                                          or demand.last > state.last_request):
        newest = demand.last
    if signals.total_request_rate > 0:
        newest = float("inf")
    return newest


def step(state: ZeroState, spec: AutoscalingSpec, signals: Signals, measured: bool, now: float) -> ZeroState:
    """The phase after this tick (module docstring). ``measured``: every pool with ready replicas had fresh metrics.

    Unreadable metrics keep an awake model's idle count at zero (no rate is not no traffic) and hold a draining one
    where it is, but never wake a sleeping one: its pods are going or gone, and a terminating pod's failed scrape is
    no request (a thousand models going to zero at once showed nine such phantom wakes)."""
    if not may_sleep(spec):
        return ZeroState() if state.phase == "awake" else ZeroState("awake", now, now)
    seen = requested(state, signals)
    last = state.last_request if seen is None else min(seen, now)
    if last is None:  # the first look: idle time counts from here
        last = now
    phase = state.phase
    if phase == "awake":
        if not measured:
            last = now
        idle_seconds = spec.idle_seconds if spec.idle_seconds is not None else float("inf")
        if now - last >= idle_seconds:
            return ZeroState("draining", now, last)
        return ZeroState("awake", state.since, last)
    if phase == "draining":
        if seen is not None:
            return ZeroState("awake", now, last)
        if measured and (state.since is None or now - state.since >= DRAIN_SECONDS - TICK_SLACK_SECONDS):
            return ZeroState("asleep", now, last)
        return ZeroState("draining", state.since, last)
    if phase == "asleep":
        if seen is not None:
            return ZeroState("waking", now, now)
        return ZeroState("asleep", state.since, last)
    # waking: until the wake pool has a ready replica
    if signals.pool(names.wake_pool(spec.cpu.enabled)).ready_replicas > 0:
        return ZeroState("awake", now, last)
    return ZeroState("waking", state.since, last)


def gpu_waits(state: ZeroState, spec: AutoscalingSpec, gpu_replicas: int, now: float) -> bool:
    """Whether a model woken on its CPU pool less than GPU_WAKE_AFTER_SECONDS ago keeps its GPU pool at zero
    (the policy still starts it when the CPU pool is over target): waking is spillover from nothing."""
    woken = state.phase == "awake" and state.since is not None and now - state.since < GPU_WAKE_AFTER_SECONDS
    return (woken and may_sleep(spec) and names.wake_pool(spec.cpu.enabled) == "cpu" and spec.gpu.enabled
            and gpu_replicas == 0)


def replicas(spec: AutoscalingSpec, phase: ZeroPhase, gpu: int, cpu: int) -> tuple[int, int]:
    """(gpu, cpu) replicas a phase routed to the activator asks for: draining keeps them, asleep none, waking one
    replica of the wake pool (and whatever is still up of the other, which the next awake ticks size)."""
    if phase == "draining":
        return gpu, cpu
    if phase == "asleep":
        return 0, 0
    if names.wake_pool(spec.cpu.enabled) == "cpu":
        return gpu, max(cpu, 1)
    return max(gpu, 1), cpu


def why(phase: ZeroPhase, spec: AutoscalingSpec, state: ZeroState, now: float) -> str:
    """The decision's reason in a phase routed to the activator."""
    pool = names.wake_pool(spec.cpu.enabled)
    if phase == "draining":
        idle = now - state.last_request if state.last_request is not None else 0.0
        return (f"scale to zero: no request for {idle:.0f}s (idleSeconds {spec.idle_seconds:.0f}): traffic to the "
                f"activator, the pools go to zero in {DRAIN_SECONDS:.0f}s")
    if phase == "asleep":
        return f"scaled to zero: the activator holds requests and wakes the {pool} pool"
    return f"waking: requests wait at the activator until the {pool} pool has a ready replica"


def recorded_phase(decision: RecordedDecision | None) -> str | None:
    """The scale-to-zero phase the autoscaler recorded (``lastDecision.scaleToZero``), None for other models."""
    return decision.scale_to_zero if decision is not None else None


def routing_to(spec: RerankModelSpec, decision: RecordedDecision | None,
               activator: platform.Activator | None) -> platform.Activator | None:
    """The activator the model's route must point at now, or None (it routes to its pools): the autoscaler took
    it towards zero, the operator knows an activator, and the model has a route to change."""
    if activator is None or spec.routing.gateway is None or recorded_phase(decision) not in names.ROUTED_TO_ACTIVATOR:
        return None
    return activator
