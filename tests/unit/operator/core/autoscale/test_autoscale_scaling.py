"""HPA-like replica arithmetic, the history's persistence, and the spec's defaults and validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rerank_operator.core.autoscale.config import (
    AutoscalingSpec,
    InvalidAutoscalingSpec,
    PoolBounds,
    PrometheusSettings,
    StepBehavior,
)
from rerank_operator.core.autoscale.history import MAX_RECOMMENDATIONS, History, PoolHistory
from rerank_operator.core.autoscale.scaling import MAX_BACKOFF, REVERSAL_MEMORY_S, backed_off, scale

BOUNDS = PoolBounds(True, 1, 10)
UP = StepBehavior(0, 2, 30)
DOWN = StepBehavior(300, 1, 120)


@pytest.mark.parametrize("current, recommended, history, expected", [
    (3, 3, PoolHistory(), 3),
    (3, 9, PoolHistory(), 5),                                          # step limit +2
    (3, 9, PoolHistory(last_scale_up=990), 3),                         # up cooldown 30 s
    (3, 9, PoolHistory(last_scale_up=960), 5),                         # cooldown over
    (5, 1, PoolHistory(recommendations=((800, 5),)), 5),              # 300 s window still sees 5
    (5, 1, PoolHistory(recommendations=((600, 5),)), 4),              # window passed, step limit -1
    (5, 1, PoolHistory(last_scale_up=950), 5),                         # down waits 120 s after any scale
    (5, 0, PoolHistory(), 4),                                          # recommendation clamped to min 1 first
    (12, 12, PoolHistory(last_scale_up=999), 10),                      # bounds win over cooldowns
])
def test_scale_table(current, recommended, history, expected):
    assert scale(BOUNDS, UP, DOWN, current, recommended, history, now=1000.0).replicas == expected


def test_idle_pool_skips_the_down_step_limit_but_not_the_window():
    assert scale(BOUNDS, UP, DOWN, 8, 1, PoolHistory(), 1000.0, idle=True).replicas == 1
    windowed = PoolHistory(recommendations=((900, 8),))
    assert scale(BOUNDS, UP, DOWN, 8, 1, windowed, 1000.0, idle=True).replicas == 8


def test_up_stabilization_takes_the_lowest_recent_recommendation():
    up = StepBehavior(60, 10, 0)
    history = PoolHistory(recommendations=((950, 4),))
    assert scale(BOUNDS, up, DOWN, 2, 9, history, 1000.0).replicas == 4


def test_history_round_trips_and_survives_garbage():
    history = History(gpu=PoolHistory(((1.0, 2), (2.0, 3)), 1.0, None, 87.5, True, (3, True), (0.5, 1.5)),
                      cpu=PoolHistory(), last_spill=5.0, last_recover=None)
    assert History.from_dict(history.to_dict()) == history
    for garbage in (None, "x", {"v": 2}, {"v": 1, "gpu": {"recs": [["a", "b"]]}}, {"v": 1, "gpu": 3}):
        assert isinstance(History.from_dict(garbage), History)


def test_history_keeps_only_what_a_window_can_need():
    pool = PoolHistory()
    for t in range(500):
        pool = pool.record(float(t), t % 7, keep_seconds=10_000)
    # Every window ends now: of a sawtooth 0..6 only the latest 6 and what came after it can still be a window's
    # highest or lowest (t = 496..499: 6, 0, 1, 2).
    assert pool.recommendations == ((496.0, 6), (497.0, 0), (498.0, 1), (499.0, 2))
    assert pool.record(1000.0, 1, keep_seconds=10).recommendations == ((1000.0, 1),)
    assert MAX_RECOMMENDATIONS >= 2 * 65  # two per replica count of a 64-replica pool fit under the safety cap


@given(st.lists(st.integers(0, 12), min_size=1, max_size=400), st.integers(1, 3600))
@settings(max_examples=200, deadline=None)
def test_windows_see_the_same_extremes_as_the_full_history(recommendations: list[int], window: int) -> None:
    """Whatever is forgotten, a window's highest and lowest are those of every tick in it (5 s ticks)."""
    pool = PoolHistory()
    for i, replicas in enumerate(recommendations):
        pool = pool.record(5.0 * i, replicas, keep_seconds=3600)
    now = 5.0 * (len(recommendations) - 1)
    full = [r for i, r in enumerate(recommendations) if now - 5.0 * i <= window]
    assert max(pool.within(now, window)) == max(full)
    assert min(pool.within(now, window)) == min(full)


def test_a_long_scale_down_window_is_not_cut_short():
    """A 600 s window at a 5 s interval (120 ticks) still holds a recommendation from 590 s ago."""
    pool = PoolHistory().record(0.0, 6, keep_seconds=600)
    for t in range(5, 595, 5):
        pool = pool.record(float(t), 2, keep_seconds=600)
    result = scale(BOUNDS, UP, StepBehavior(600, 1, 0), 6, 2, pool, 590.0)
    assert result.replicas == 6
    assert scale(BOUNDS, UP, StepBehavior(600, 1, 0), 6, 2, result.history, 605.0).replicas == 5


FAST_DOWN = StepBehavior(300, 1, 0)   # the default window, no cooldown: one replica per 5 s tick once it lapses


def _ticks(recommendations: list[tuple[int, int]], replicas: int, history: PoolHistory, start: float = 0.0,
           down: StepBehavior = FAST_DOWN, backoff: bool = True) -> tuple[list[int], PoolHistory, float]:
    """Drive one pool through (seconds, recommendation) phases at a 5 s interval; replicas after each tick."""
    seen, now = [], start
    for seconds, recommended in recommendations:
        for _ in range(seconds // 5):
            result = scale(BOUNDS, StepBehavior(0, 4, 0), down, replicas, recommended, history, now, backoff=backoff)
            replicas, history, now = result.replicas, result.history, now + 5
            seen.append(replicas)
    return seen, history, now


def test_a_scale_down_undone_within_the_window_lengthens_it():
    """Square-wave traffic whose lulls last as long as the window: the first lull costs a replica that is needed
    again at once (a reversal); after that the window is doubled and the next lull is held through."""
    seen, history, now = _ticks([(60, 6), (305, 2), (60, 6)], 6, PoolHistory())
    assert min(seen) == 5 and seen[-1] == 6               # removed at the end of the lull, back when load returned
    assert len(history.reversals) == 1
    assert backed_off(FAST_DOWN, history, now).stabilization_seconds == 600
    lull = scale(BOUNDS, StepBehavior(0, 4, 0), FAST_DOWN, 6, 2, history, now)
    assert "held by the 600s stabilization window" in lull.note   # what the decision's reason tells the user
    seen, history, now = _ticks([(305, 2), (60, 6)], 6, history, now)
    assert min(seen) == 6                                 # the same lull no longer removes anything
    assert len(history.reversals) == 2                    # ... and holding through it renews the lesson
    assert backed_off(FAST_DOWN, history, now).stabilization_seconds == 300 * (1 + MAX_BACKOFF)


def test_without_reversals_the_window_is_the_configured_one():
    # A lull longer than the window: replicas go, and come back only well after the window: nothing learned.
    seen, history, now = _ticks([(60, 6), (900, 2), (60, 6)], 6, PoolHistory())
    assert min(seen) == 2 and history.reversals == ()
    assert backed_off(FAST_DOWN, history, now) == FAST_DOWN
    # Switched off (the simulator's ablation), a reversal is still recorded but never lengthens the window.
    seen, history, now = _ticks([(60, 6), (305, 2), (60, 6), (305, 2)], 6, PoolHistory(), backoff=False)
    assert seen[-1] < 6


def test_the_lesson_lapses_when_the_traffic_stops_teaching_it():
    _, history, now = _ticks([(60, 6), (305, 2), (60, 6)], 6, PoolHistory())
    assert backed_off(FAST_DOWN, history, now + REVERSAL_MEMORY_S - 60).stabilization_seconds == 600
    assert backed_off(FAST_DOWN, history, now + REVERSAL_MEMORY_S + 1) == FAST_DOWN
    assert backed_off(StepBehavior(0, 1, 0), history, now).stabilization_seconds == 0  # no window: nothing to lengthen


def test_defaults_match_the_agreed_crd_defaults():
    s = AutoscalingSpec.from_spec({"pools": {"gpu": {}, "cpu": {}}})
    assert (s.enabled, s.interval_seconds, s.source, s.stale_after_seconds, s.replica_management) == \
        (True, 5, "direct", 60, "operator")
    t = s.targets
    assert (t.gpu_latency_p95_ms, t.cpu_latency_p95_ms, t.queue_per_replica, t.gpu_memory_watermark) == \
        (250, 500, 16, 0.9)
    assert s.scale_up == StepBehavior(0, 4, 0)
    assert s.scale_down == StepBehavior(300, 1, 120)
    sp = s.spillover
    assert (sp.step_percent, sp.recover_step_percent, sp.max_cpu_percent, sp.surge_max_step) == (25, 10, 100, 32)
    assert AutoscalingSpec() == AutoscalingSpec.from_spec({"pools": {"cpu": {}}})   # dataclass = parser defaults
    assert s.routing_policy == "gpu-first"
    assert (s.gpu, s.cpu) == (PoolBounds(True, 1, 2), PoolBounds(True, 1, 4))      # crds/rerankmodel.yaml
    assert not AutoscalingSpec.from_spec({}).gpu.enabled                            # no gpu section: no pool


def test_reads_what_the_spec_says():
    platform = PrometheusSettings(url="http://prometheus.monitoring:9090")
    s = AutoscalingSpec.from_spec({
        "pools": {"gpu": {"minReplicas": 0, "maxReplicas": 3}, "cpu": {"enabled": False}},
        "routing": {"policy": "fixed", "weights": {"gpu": 3, "cpu": 1}},
        # A URL in the model's spec (the CRD refuses it) is never read: the server is the platform's choice.
        "autoscaling": {"metrics": {"source": "prometheus", "prometheus": {"url": "http://169.254.169.254"}},
                        "scaleDown": {"maxStep": 4}, "spillover": {"maxCpuPercent": 60, "surgeMaxStep": 8}},
    }, prometheus=platform)
    assert s.gpu == PoolBounds(True, 0, 3) and not s.cpu.enabled
    assert s.fixed_gpu_percent == 75 and s.scale_down.max_step == 4 and s.scale_down.cooldown_seconds == 120
    assert s.prometheus == platform and s.spillover.max_cpu_percent == 60
    assert s.spillover.surge_max_step == 8


@pytest.mark.parametrize("bad", [
    {"pools": {"cpu": {"minReplicas": 3, "maxReplicas": 2}}},
    {"pools": {"cpu": {"enabled": False}}},
    {"routing": {"policy": "round-robin"}},
    {"autoscaling": {"metrics": {"source": "prometheus"}}},
    {"autoscaling": {"targets": {"gpuMemoryWatermark": 1.5}}},
    {"autoscaling": {"scaleUp": {"maxStep": 0}}},
    {"autoscaling": {"spillover": {"surgeMaxStep": 0}}},
    {"autoscaling": {"spillover": {"surgeMaxStep": 1001}}},
    {"autoscaling": {"intervalSeconds": "soon"}},
    {"routing": {"policy": "fixed", "weights": {"gpu": 0, "cpu": 0}}},
])
def test_invalid_specs_are_rejected_with_a_message(bad):
    with pytest.raises(InvalidAutoscalingSpec):
        AutoscalingSpec.from_spec(bad)


def test_surge_step_widens_only_the_scale_up_step():
    assert scale(BOUNDS, UP, DOWN, 2, 9, PoolHistory(), 1000.0, surge_step=5).replicas == 7        # +5, not +2
    assert scale(BOUNDS, UP, DOWN, 2, 9, PoolHistory(), 1000.0, surge_step=1).replicas == 4        # never below +2
    assert scale(BOUNDS, UP, DOWN, 2, 9, PoolHistory(last_scale_up=990), 1000.0, surge_step=5).replicas == 2
    assert scale(BOUNDS, UP, DOWN, 2, 40, PoolHistory(), 1000.0, surge_step=50).replicas == 10     # max 10


def test_release_skips_the_down_window_but_not_the_cooldown():
    windowed = PoolHistory(recommendations=((900, 8),))
    assert scale(BOUNDS, UP, DOWN, 8, 1, windowed, 1000.0, idle=True, release=True).replicas == 1
    cooling = PoolHistory(recommendations=((900, 8),), last_scale_up=950)
    assert scale(BOUNDS, UP, DOWN, 8, 1, cooling, 1000.0, idle=True, release=True).replicas == 8
