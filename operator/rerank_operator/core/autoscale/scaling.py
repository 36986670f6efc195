"""One pool's replica arithmetic: from a raw recommendation to the replicas to set now.

Same semantics as the HPA's `behavior` so operators can reason about it with what they know: a scale-up takes
the lowest recommendation of its stabilization window, a scale-down the highest of its (so a single quiet sample
cannot remove replicas), then the step is limited and cooldowns are applied. Bounds come last and win over
everything, so a spec change to min/max takes effect at once. One addition to the HPA: a pool whose scale-downs keep
being undone within the window (traffic with lulls about as long as the window) gets a longer window, up to 3x
(`backed_off`); without reversals it behaves exactly as configured.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rerank_operator.core.autoscale.config import PoolBounds, StepBehavior
from rerank_operator.core.autoscale.history import MAX_REVERSALS, PoolHistory

REVERSAL_MEMORY_S = 3600.0  # reversals older than this no longer lengthen the scale-down window
MAX_BACKOFF = 2             # at most this many extra window lengths


@dataclass(frozen=True)
class PoolScale:
    replicas: int
    history: PoolHistory
    note: str = ""  # why the result differs from the recommendation (cooldown, step limit, window)


def scale(bounds: PoolBounds, up: StepBehavior, down: StepBehavior, current: int, recommended: int,
          history: PoolHistory, now: float, idle: bool = False, surge_step: int | None = None,
          release: bool = False, backoff: bool = True) -> PoolScale:
    """Replicas for one pool given the current count and this tick's recommendation.

    `idle`: the route sends this pool nothing, so the scale-down step limit (which protects capacity that
    serves traffic) does not apply; the window and the cooldown still do, so a returning spill finds it warm.
    `surge_step`: a larger scale-up step for this decision (the CPU pool sized for a spill the GPU needs now);
    the up window and cooldown still apply.
    `release`: the pool's replicas were a bridge that is no longer needed (an idle CPU pool once the GPU pool has
    every replica it asked for): the down window does not keep them, the scale-down cooldown still does.
    `backoff`: lengthen the down window after reversals (`backed_off`); off only in the simulator's ablation.
    """
    recommended = bounds.clamp(recommended)
    base_down = down.stabilization_seconds
    down = backed_off(down, history, now) if backoff else down
    if down.stabilization_seconds > base_down and _held_through_a_lull(history, base_down, current, recommended,
                                                                       now):
        history = _reversal(history, now)
    history = history.record(now, recommended, max(up.stabilization_seconds, down.stabilization_seconds))
    clamped = bounds.clamp(current)
    if clamped != current:
        return _moved(history, current, clamped, now, f"brought within bounds [{bounds.min_replicas}, "
                                                      f"{bounds.max_replicas}]")
    up_limit = min(history.within(now, up.stabilization_seconds))
    down_limit = recommended if release else max(history.within(now, down.stabilization_seconds))
    if current < up_limit:
        step = up.max_step if surge_step is None else max(up.max_step, surge_step)
        return _up(replace(up, max_step=step), current, up_limit, recommended, history, now, base_down)
    if current > down_limit:
        return _down(down, current, down_limit, history, now, idle)
    note = "" if recommended == current else (
        f"recommendation {recommended} held by the {down.stabilization_seconds:.0f}s stabilization window"
        if recommended < current else
        f"recommendation {recommended} held by the {up.stabilization_seconds:.0f}s stabilization window")
    return PoolScale(current, history, note)


def backed_off(down: StepBehavior, history: PoolHistory, now: float) -> StepBehavior:
    """The scale-down behaviour with its window lengthened after scale-downs that had to be undone.

    A scale-up within the scale-down window after a scale-down (a reversal) means the window was shorter than the
    lulls of this traffic: the replica removed was needed again before the window would even have let it go, and a
    GPU replica takes minutes to come back, bridged by the CPU pool and late requests meanwhile. Each reversal in the
    last REVERSAL_MEMORY_S adds one window length, up to MAX_BACKOFF more, so a pool on periodic traffic holds its
    replicas through lulls as long as the window it has been caught out by; traffic without reversals is unaffected.
    """
    recent = sum(1 for t in history.reversals if now - t <= REVERSAL_MEMORY_S)
    if not recent or down.stabilization_seconds <= 0:
        return down
    return replace(down, stabilization_seconds=down.stabilization_seconds * (1 + min(recent, MAX_BACKOFF)))


def _held_through_a_lull(history: PoolHistory, base_window: float, current: int, recommended: int,
                         now: float) -> bool:
    """Whether the lengthened window just paid off: every recommendation of the configured window before this tick
    was below the replicas kept (the configured window alone would have removed one), and now they are needed
    again. That counts as a reversal avoided, so the lesson lasts as long as the traffic keeps teaching it instead
    of lapsing after REVERSAL_MEMORY_S and being paid for again."""
    if recommended < current:
        return False
    earlier = [r for t, r in history.recommendations if 0 < now - t <= base_window]
    return bool(earlier) and max(earlier) < current


def _reversal(history: PoolHistory, now: float) -> PoolHistory:
    return replace(history, reversals=(*history.reversals, now)[-MAX_REVERSALS:])


def _up(up: StepBehavior, current: int, target: int, recommended: int, history: PoolHistory,
        now: float, down_window: float) -> PoolScale:
    since = None if history.last_scale_up is None else now - history.last_scale_up
    if since is not None and since < up.cooldown_seconds:
        return PoolScale(current, history, f"scale-up to {target} waits for cooldown "
                                           f"({up.cooldown_seconds - since:.0f}s left)")
    limited = min(target, current + up.max_step)
    note = f"limited to +{up.max_step} per step (recommended {recommended})" if limited < target else ""
    if history.last_scale_down is not None and now - history.last_scale_down <= down_window:
        history = _reversal(history, now)   # undoing a scale-down the window should have prevented
    return _moved(history, current, limited, now, note)


def _down(down: StepBehavior, current: int, target: int, history: PoolHistory, now: float,
          idle: bool) -> PoolScale:
    last = max((t for t in (history.last_scale_up, history.last_scale_down) if t is not None), default=None)
    if last is not None and now - last < down.cooldown_seconds:
        return PoolScale(current, history, f"scale-down to {target} waits for cooldown "
                                           f"({down.cooldown_seconds - (now - last):.0f}s left)")
    limited = target if idle else max(target, current - down.max_step)
    note = f"limited to -{down.max_step} per step" if limited > target else ""
    return _moved(history, current, limited, now, note)


def _moved(history: PoolHistory, current: int, replicas: int, now: float, note: str) -> PoolScale:
    if replicas > current:
        history = replace(history, last_scale_up=now)
    elif replicas < current:
        history = replace(history, last_scale_down=now)
    return PoolScale(replicas, history, note)
