"""HPA-like replica arithmetic, the history's persistence, and the spec's defaults and validation."""

from __future__ import annotations

import pytest

from rerank_operator.autoscale.config import (AutoscalingSpec, InvalidAutoscalingSpec, PoolBounds, PrometheusSettings,
                                              StepBehavior)
from rerank_operator.autoscale.history import MAX_RECOMMENDATIONS, History, PoolHistory
from rerank_operator.autoscale.scaling import scale

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
    history = History(gpu=PoolHistory(((1.0, 2), (2.0, 3)), 1.0, None, 87.5, True, (3, True)),
                      cpu=PoolHistory(), last_spill=5.0, last_recover=None)
    assert History.from_dict(history.to_dict()) == history
    for garbage in (None, "x", {"v": 2}, {"v": 1, "gpu": {"recs": [["a", "b"]]}}, {"v": 1, "gpu": 3}):
        assert isinstance(History.from_dict(garbage), History)


def test_history_is_bounded():
    pool = PoolHistory()
    for t in range(500):
        pool = pool.record(float(t), t % 7, keep_seconds=10_000)
    assert len(pool.recommendations) == MAX_RECOMMENDATIONS
    assert pool.record(1000.0, 1, keep_seconds=10).recommendations == ((1000.0, 1),)


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
