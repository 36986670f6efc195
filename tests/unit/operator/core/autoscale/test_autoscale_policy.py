"""The policy as a table of situations, each with the outcome a reviewer can check by reading the spec."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rerank_operator.core.autoscale.history import History, PoolHistory
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import Signals
from tests.unit.operator.core.autoscale.autoscale_helpers import NOW, pool, spec

CALM_GPU = pool(2, rate=100, p95=80, queue=0)       # far under 250 ms and 16/replica
CALM_CPU = pool(1, rate=0, p95=None, queue=0)
HOT_GPU = pool(2, rate=400, p95=900, queue=40)      # over both targets


def run(signals: Signals, current: Current, history: History | None = None, **spec_args):
    return decide(spec(**spec_args), signals, current, history or History(), NOW)


def test_calm_gpu_keeps_everything_and_all_traffic_on_gpu():
    decision = run(Signals(CALM_GPU, CALM_CPU), Current(2, 1, 0))
    assert (decision.gpu_replicas, decision.cpu_replicas, decision.cpu_percent) == (2, 1, 0)
    assert decision.events == ()
    assert not decision.held


def test_overloaded_gpu_below_max_scales_up_by_at_most_max_step_and_spills_meanwhile():
    decision = run(Signals(HOT_GPU, CALM_CPU), Current(2, 1, 0), gpu=(1, 10))
    assert decision.gpu_replicas == 2 + 2          # scaleUp.maxStep 2 (WORKED)
    assert decision.cpu_percent == 1               # GPU waits for replicas; the CPU's capacity is unknown: probe 1%
    reasons = {e.reason for e in decision.events}
    assert {"ScaledUp", "TrafficShifted"} <= reasons


def test_overloaded_gpu_at_max_spills_one_step_and_stays_at_max():
    decision = run(Signals(pool(4, rate=800, p95=600, queue=30), CALM_CPU), Current(4, 1, 25), gpu=(1, 4))
    assert decision.gpu_replicas == 4
    assert decision.cpu_percent == 50
    assert "max replicas" in decision.reason


def test_before_the_cpu_capacity_is_measured_the_share_probes_upwards():
    # GPU at max and over target; the CPU pool's capacity is unknown. Each tick doubles the share (1 -> 2 -> 4 ...)
    # while the CPU stays under target, never more than one stepPercent (25) at once.
    hot = pool(4, rate=800, p95=600, queue=30)
    shares = [1]
    for _ in range(6):
        cpu = pool(1, rate=800 * shares[-1] / 100, p95=200)
        shares.append(run(Signals(hot, cpu), Current(4, 1, shares[-1]), gpu=(1, 4)).cpu_percent)
    assert shares == [1, 2, 4, 8, 16, 32, 57]


def test_a_cpu_capacity_seen_below_target_is_a_floor_for_the_first_spill():
    # 2 CPU replicas once served 30 rps each within target (a lower bound, not measured at saturation): 60 of
    # 800 rps = 7.5% -> 7% is taken at once instead of the 1% probe.
    history = History(cpu=PoolHistory(capacity=30.0, capacity_from_saturation=False))
    decision = run(Signals(pool(4, rate=800, p95=600, queue=30), pool(2, rate=0, p95=None)), Current(4, 2, 0),
                   history, gpu=(1, 4))
    assert decision.cpu_percent == 7


def test_spill_never_exceeds_max_cpu_percent():
    decision = run(Signals(pool(4, rate=800, p95=600, queue=30), CALM_CPU), Current(4, 1, 30), gpu=(1, 4),
                   spillover={"maxCpuPercent": 40})
    assert decision.cpu_percent == 40


def test_gpu_memory_above_watermark_spills_even_with_low_latency():
    decision = run(Signals(replace(CALM_GPU, gpu_memory_fraction=0.95), CALM_CPU), Current(2, 1, 0))
    assert decision.cpu_percent == 1               # the CPU's capacity is unknown: a probe first
    assert "memory" in decision.reason


def test_no_ready_gpu_sends_everything_to_cpu_even_above_max_cpu_percent():
    decision = run(Signals(pool(0), pool(2, rate=20, p95=300)), Current(2, 2, 25),
                   spillover={"maxCpuPercent": 50})
    assert decision.cpu_percent == 100
    assert decision.gpu_replicas >= 1          # the GPU pool keeps what it is starting


def test_no_ready_cpu_sends_everything_to_gpu():
    decision = run(Signals(HOT_GPU, pool(0)), Current(2, 1, 25), gpu=(1, 2))
    assert decision.cpu_percent == 0


def test_both_pools_saturated_holds_the_split():
    decision = run(Signals(pool(4, rate=800, p95=600, queue=30), pool(2, rate=40, p95=2000, queue=30)),
                   Current(4, 2, 25), gpu=(1, 4))
    assert decision.cpu_percent == 25
    assert decision.cpu_replicas > 2           # the CPU pool grows instead


def test_headroom_shifts_back_by_recover_step_after_the_hold():
    history = History(last_spill=NOW - 600)
    decision = run(Signals(pool(4, rate=150, p95=70), pool(3, rate=50, p95=200)), Current(4, 3, 50), history)
    assert decision.cpu_percent == 40          # recoverStepPercent default 10


def test_no_shift_back_within_the_cooldown_after_a_spill():
    history = History(last_spill=NOW - 30)
    decision = run(Signals(pool(4, rate=150, p95=70), pool(3, rate=50, p95=200)), Current(4, 3, 50), history)
    assert decision.cpu_percent == 50
    assert "last spill" in decision.reason


@pytest.mark.parametrize("stale", [
    pool(2, at=NOW - 61),                                   # staleAfterSeconds default 60
    replace(pool(2), request_rate=None),                    # first scrape: no rate yet
    replace(pool(2), error="connection refused"),
])
def test_stale_or_missing_gpu_metrics_hold_replicas_and_split(stale):
    history = History(gpu=PoolHistory(recommendations=((NOW - 20, 3),)))
    decision = run(Signals(stale, pool(2, rate=10, p95=900, queue=50)), Current(3, 2, 25), history)
    assert (decision.gpu_replicas, decision.cpu_replicas, decision.cpu_percent) == (3, 2, 25)
    assert decision.held and "holding" in decision.reason and "gpu" in decision.reason
    assert decision.history.without_samples() == history   # nothing stale enters the windows
    assert decision.events == ()


def test_a_failed_measurement_within_stale_after_is_a_miss_not_a_hold():
    """One slow scrape: replicas and split are kept (nothing is decided on old numbers) but the decision is not
    held, so MetricsAvailable stays True and nothing is written (at 1000 models each such hiccup cost 4 writes)."""
    failed = replace(pool(2), error="no pod answered /metrics (timed out)")
    history = History(gpu=PoolHistory(recommendations=((NOW - 20, 3),), sampled_at=NOW - 15))
    decision = run(Signals(failed, HOT_GPU), Current(3, 2, 25), history)
    assert (decision.gpu_replicas, decision.cpu_replicas, decision.cpu_percent) == (3, 2, 25)
    assert not decision.held and decision.missed and "a miss" in decision.reason and "timed out" in decision.reason
    assert decision.history.without_samples() == history.without_samples() and decision.events == ()
    assert decision.history.gpu.sampled_at == NOW - 15   # the missed pool's sample time stays what it was
    assert decision.history.cpu.sampled_at == NOW        # the pool measured meanwhile keeps its own
    # a replaced pod's first scrape (no rate yet) is a miss too
    replaced = replace(pool(2), request_rate=None)
    assert run(Signals(replaced, HOT_GPU), Current(3, 2, 25), history).missed
    # at the bound it is stale: held, as without a sample
    old = replace(history, gpu=replace(history.gpu, sampled_at=NOW - 61))
    assert run(Signals(failed, HOT_GPU), Current(3, 2, 25), old).held
    # a miss of one pool and a pool never measured since the operator started: held
    first = replace(pool(2), request_rate=None)
    assert run(Signals(failed, first), Current(3, 2, 25), history).held
    # two pools missing in turn, each measured within the bound: misses, not holds
    turn = run(Signals(failed, HOT_GPU), Current(3, 2, 25), history)
    later = replace(pool(2, at=NOW + 15), error=None)
    assert run(Signals(later, replace(HOT_GPU, error="timed out")), Current(3, 2, 25), turn.history).missed


def test_a_measured_tick_remembers_when_its_samples_were_taken():
    decision = run(Signals(CALM_GPU, replace(CALM_CPU, sampled_at=NOW - 3)), Current(2, 1, 0))
    assert (decision.history.gpu.sampled_at, decision.history.cpu.sampled_at) == (NOW, NOW - 3)
    assert "sampled_at" not in str(decision.history.to_dict())   # not saved: a restarted operator has no sample


def test_hold_still_moves_traffic_off_a_pool_without_ready_replicas():
    decision = run(Signals(pool(0), replace(pool(2), sampled_at=None, request_rate=None)), Current(2, 2, 25))
    assert decision.held and decision.cpu_percent == 100


def test_fixed_weights_ignore_load():
    decision = run(Signals(HOT_GPU, CALM_CPU), Current(2, 1, 0), policy="fixed", weights={"gpu": 7, "cpu": 3})
    assert decision.cpu_percent == 30


def test_cpu_only_and_gpu_only_policies():
    assert run(Signals(HOT_GPU, pool(1)), Current(2, 1, 0), policy="cpu-only").cpu_percent == 100
    assert run(Signals(CALM_GPU, pool(1)), Current(2, 1, 40), policy="gpu-only").cpu_percent == 0


def test_single_pool_specs_scale_their_pool_and_zero_the_other():
    only_cpu = run(Signals(pool(0), pool(2, rate=40, p95=900, queue=30)), Current(0, 2, 100), gpu=None)
    assert (only_cpu.gpu_replicas, only_cpu.cpu_percent) == (0, 100) and only_cpu.cpu_replicas == 4
    only_gpu = run(Signals(HOT_GPU, pool(0)), Current(2, 0, 0), cpu=None, gpu=(1, 8))
    assert (only_gpu.cpu_replicas, only_gpu.cpu_percent) == (0, 0) and only_gpu.gpu_replicas == 4


def test_external_replica_management_only_shifts_traffic():
    decision = run(Signals(pool(4, rate=800, p95=600, queue=30), CALM_CPU), Current(4, 1, 0), gpu=(1, 4),
                   replicaManagement="external")
    assert (decision.gpu_replicas, decision.cpu_replicas) == (4, 1)
    assert decision.cpu_percent == 1


def test_scale_down_waits_for_the_stabilization_window_then_steps():
    def with_high_at(age: float) -> History:
        return History(gpu=PoolHistory(recommendations=((NOW - age, 4),), last_scale_up=NOW - 1000,
                                       capacity=100.0, capacity_from_saturation=True))
    light = Signals(pool(4, rate=50, p95=60), CALM_CPU)   # 50 rps fits one replica of 100 rps at 85%
    assert run(light, Current(4, 1, 0), with_high_at(100)).gpu_replicas == 4   # inside the 300 s window
    assert run(light, Current(4, 1, 0), with_high_at(400)).gpu_replicas == 3   # scaleDown.maxStep default 1


def test_a_pool_without_traffic_drops_to_min_in_one_step_after_the_window():
    idle = Signals(pool(4, rate=0, p95=None), CALM_CPU)
    old_high = History(gpu=PoolHistory(recommendations=((NOW - 400, 4),), last_scale_up=NOW - 1000))
    assert run(idle, Current(4, 1, 0), old_high, gpu=(1, 4)).gpu_replicas == 1
    recent_high = History(gpu=PoolHistory(recommendations=((NOW - 100, 4),), last_scale_up=NOW - 1000))
    assert run(idle, Current(4, 1, 0), recent_high, gpu=(1, 4)).gpu_replicas == 4


def test_spec_bounds_apply_at_once():
    decision = run(Signals(CALM_GPU, CALM_CPU), Current(9, 0, 0), gpu=(1, 4), cpu=(2, 6))
    assert (decision.gpu_replicas, decision.cpu_replicas) == (4, 2)


def test_disabled_autoscaling_keeps_replicas_within_bounds():
    decision = run(Signals(HOT_GPU, CALM_CPU), Current(2, 1, 0), enabled=False)
    assert (decision.gpu_replicas, decision.cpu_replicas, decision.cpu_percent) == (2, 1, 0)
