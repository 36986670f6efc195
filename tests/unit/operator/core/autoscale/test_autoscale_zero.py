"""Scale to zero in the policy (``core/autoscale/zero.py``): idle -> the route to the activator first -> zero after
the drain -> a waiting request wakes the CPU pool -> its first ready replica takes the route back."""

from __future__ import annotations

from dataclasses import replace

from rerank_operator.core import names
from rerank_operator.core.autoscale import record, zero
from rerank_operator.core.autoscale.history import History, ZeroState
from rerank_operator.core.autoscale.policy import Current, Decision, decide
from rerank_operator.core.autoscale.recorded import RecordedDecision
from rerank_operator.core.autoscale.signals import ActivatorDemand, PoolSignals, Signals
from tests.unit.operator.core.autoscale.autoscale_helpers import NOW, pool, spec

IDLE = 60
SLEEPY = replace(spec(gpu=None, cpu=(0, 4), idleSeconds=IDLE), idle_seconds=float(IDLE))


def idle_cpu(ready: int, at: float) -> Signals:
    """Fresh signals of a CPU pool serving nothing (none at all without a replica)."""
    return Signals(cpu=pool(ready, rate=0.0, p95=None, at=at)) if ready else Signals()


def run(history: History, current: Current, now: float, signals: Signals) -> tuple[Decision, Current, History]:
    d = decide(SLEEPY, signals, current, history, now)
    return d, Current(d.gpu_replicas, d.cpu_replicas, d.cpu_percent), d.history


def reasons(d: Decision) -> list[str]:
    return [e.reason for e in d.events]


def test_an_idle_model_drains_to_the_activator_before_its_pods_go_and_a_request_wakes_the_cpu_pool() -> None:
    h, cur = History(), Current(0, 1, 100)
    d, cur, h = run(h, cur, NOW, Signals(cpu=pool(1, rate=3.0)))
    assert (d.zero, d.cpu_replicas, d.to_activator) == ("awake", 1, False)
    # Idle for less than idleSeconds: awake, and the policy's own scale-down never empties the pool.
    d, cur, h = run(h, cur, NOW + IDLE - 5, idle_cpu(1, NOW + IDLE - 5))
    assert (d.zero, d.cpu_replicas) == ("awake", 1)
    # idleSeconds without a request: the route goes to the activator, the replica stays for the drain.
    d, cur, h = run(h, cur, NOW + IDLE + 1, idle_cpu(1, NOW + IDLE + 1))
    assert (d.zero, d.to_activator, d.cpu_replicas) == ("draining", True, 1)
    assert reasons(d) == ["ScalingToZero"]
    t = NOW + IDLE + 1 + zero.DRAIN_SECONDS - zero.TICK_SLACK_SECONDS - 0.5
    d, cur, h = run(h, cur, t, idle_cpu(1, t))
    assert (d.zero, d.cpu_replicas) == ("draining", 1)
    # The drain is over: zero pods, the route still on the activator.
    # A tick a hair before the drain's end (ticks drift by their own duration) ends it, not the next one.
    t = NOW + IDLE + 1 + zero.DRAIN_SECONDS - 0.01
    d, cur, h = run(h, cur, t, idle_cpu(1, t))
    assert (d.zero, d.to_activator, d.cpu_replicas, d.held) == ("asleep", True, 0, False)
    assert set(reasons(d)) == {"ScaledDown", "ScaledToZero"}
    # Asleep: no pod, so nothing to measure: neither stale nor held, and it stays asleep.
    t = NOW + 600
    d, cur, h = run(h, cur, t, Signals())
    assert (d.zero, d.cpu_replicas, d.held) == ("asleep", 0, False) and d.events == ()
    # The activator holds requests: one CPU replica, the route stays on the activator until it is ready.
    d, cur, h = run(h, cur, t + 1, Signals(activator=ActivatorDemand(waiting=3, last=t + 0.5)))
    assert (d.zero, d.to_activator, d.cpu_replicas, d.gpu_replicas) == ("waking", True, 1, 0)
    assert set(reasons(d)) == {"ScaledUp", "Waking"}
    d, cur, h = run(h, cur, t + 3, Signals(activator=ActivatorDemand(waiting=3, last=t + 2)))
    assert (d.zero, d.cpu_replicas) == ("waking", 1)
    # Its replica is ready: the route points at the pool again (awake), and the pool keeps serving.
    d, cur, h = run(h, cur, t + 6, Signals(cpu=pool(1, rate=2.0, at=t + 6), activator=ActivatorDemand(0, t + 5)))
    assert (d.zero, d.to_activator, d.cpu_replicas) == ("awake", False, 1)
    assert reasons(d) == ["Woken"]


def test_a_request_during_the_drain_keeps_the_model_awake() -> None:
    h = History(zero=ZeroState("draining", NOW, NOW - IDLE))
    d, _, h = run(h, Current(0, 2, 100), NOW + 5, Signals(cpu=pool(2, rate=0.0, p95=None, at=NOW + 5),
                                                           activator=ActivatorDemand(waiting=1, last=NOW + 4)))
    assert (d.zero, d.to_activator) == ("awake", False) and d.cpu_replicas >= 1
    assert "Woken" in reasons(d)
    # and a pool that served requests (the activator forwarded them) counts as well
    h = History(zero=ZeroState("draining", NOW, NOW - IDLE))
    assert run(h, Current(0, 2, 100), NOW + 5, Signals(cpu=pool(2, rate=0.5, at=NOW + 5)))[0].zero == "awake"


def test_stale_metrics_are_not_idle_time() -> None:
    h = History(zero=ZeroState("awake", NOW, NOW))
    stale = Signals(cpu=replace(pool(1, rate=0.0), sampled_at=NOW - 10_000))
    d, _, h = run(h, Current(0, 1, 100), NOW + 10 * IDLE, stale)
    assert d.zero == "awake" and d.held and h.zero.last_request == NOW + 10 * IDLE


def test_without_an_activator_a_model_at_min_zero_keeps_one_replica() -> None:
    awake_only = replace(SLEEPY, idle_seconds=None)
    assert not zero.may_sleep(awake_only)
    h, cur = History(), Current(0, 2, 100)
    for tick in range(0, 4000, 5):
        d = decide(awake_only, idle_cpu(cur.cpu_replicas, NOW + tick), cur, h, NOW + tick)
        cur, h = Current(d.gpu_replicas, d.cpu_replicas, d.cpu_percent), d.history
        assert d.zero is None and d.cpu_replicas >= 1
    assert cur.cpu_replicas == 1


def test_only_a_model_whose_every_enabled_pool_is_at_min_zero_may_sleep() -> None:
    assert zero.may_sleep(SLEEPY)
    gpu_kept = replace(spec(gpu=(1, 2), cpu=(0, 4)), idle_seconds=60.0)
    assert not zero.may_sleep(gpu_kept)
    both = replace(spec(gpu=(0, 2), cpu=(0, 4)), idle_seconds=60.0)
    assert zero.may_sleep(both) and names.wake_pool(both.cpu.enabled) == "cpu"
    gpu_only = replace(spec(gpu=(0, 2), cpu=None, policy="gpu-only"), idle_seconds=60.0)
    assert names.wake_pool(gpu_only.cpu.enabled) == "gpu" and zero.awake_bounds(gpu_only).gpu.min_replicas == 1
    assert not zero.may_sleep(replace(SLEEPY, replica_management="external"))


def test_the_phase_is_saved_so_a_restart_keeps_a_sleeping_model_asleep() -> None:
    h = History(zero=ZeroState("asleep", NOW, NOW - 100))
    restored = History.from_dict(h.to_dict())
    assert restored.zero == h.zero
    assert "zero" not in History().to_dict()  # models that never slept keep their annotation as it was
    d = decide(SLEEPY, Signals(), Current(0, 0, 100), restored, NOW + 50)
    assert (d.zero, d.cpu_replicas) == ("asleep", 0)


def test_the_decision_record_names_the_phase() -> None:
    d = decide(SLEEPY, Signals(), Current(0, 0, 100), History(zero=ZeroState("asleep", NOW, NOW)), NOW + 1)
    written = record.decision_status(SLEEPY, d, "t")
    assert written["scaleToZero"] == "asleep"
    assert RecordedDecision.from_status({"autoscaling": {"lastDecision": written}}) == RecordedDecision(
        time="t", reason=d.reason, held=d.held, gpu_percent=d.gpu_percent, cpu_percent=d.cpu_percent,
        replicas={"cpu": 0}, scale_to_zero="asleep")  # SLEEPY has no GPU pool
    assert zero.recorded_phase(RecordedDecision.from_record(written)) == "asleep"
    normal = decide(spec(), Signals(gpu=pool(1), cpu=pool(1)), Current(1, 1, 0), History(), NOW)
    written = record.decision_status(spec(), normal, "t")
    assert normal.zero is None and "scaleToZero" not in written
    assert zero.recorded_phase(RecordedDecision.from_record(written)) is None


def test_a_recorded_decision_reads_a_hand_edited_key_as_absent() -> None:
    bad = RecordedDecision.from_record({"gpuPercent": "60", "cpuReplicas": True, "gpuReplicas": 3, "held": "yes",
                                        "scaleToZero": 1})
    assert (bad.gpu_percent, bad.replicas, bad.held, bad.scale_to_zero) == (None, {"gpu": 3}, False, None)
    assert RecordedDecision.from_status({}) is None and RecordedDecision.from_status({"autoscaling": {}}) is None


def test_waking_a_model_without_cpu_pool_wakes_the_gpu_pool() -> None:
    gpu_only = replace(spec(gpu=(0, 2), cpu=None, policy="gpu-only"), idle_seconds=60.0)
    h = History(zero=ZeroState("asleep", NOW, NOW - 100))
    d = decide(gpu_only, Signals(activator=ActivatorDemand(1, NOW)), Current(0, 0, 0), h, NOW + 1)
    assert (d.zero, d.gpu_replicas, d.cpu_replicas) == ("waking", 1, 0)
    ready = Signals(gpu=PoolSignals(ready_replicas=1, scraped_replicas=1, request_rate=1.0, success_rate=1.0,
                                    latency_p95_ms=50.0, sampled_at=NOW + 5))
    assert decide(gpu_only, ready, Current(1, 0, 0), d.history, NOW + 5).zero == "awake"


def test_a_woken_model_starts_its_gpu_pool_only_when_the_load_persists_or_the_cpu_pool_is_over_target() -> None:
    both = replace(spec(gpu=(0, 2), cpu=(0, 4), idleSeconds=IDLE), idle_seconds=float(IDLE))
    woken = History(zero=ZeroState("awake", NOW, NOW))  # the CPU replica just took the route back

    def at(t: float, cpu: PoolSignals) -> Decision:
        return decide(both, Signals(cpu=cpu), Current(0, 1, 100), woken, NOW + t)

    calm = at(10, pool(1, rate=3.0, p95=100, at=NOW + 10))
    assert (calm.gpu_replicas, calm.cpu_replicas) == (0, 1)       # one query after a night: the CPU pool serves it
    over = at(10, pool(1, rate=30.0, p95=2000, queue=40, at=NOW + 10))
    assert over.gpu_replicas >= 1                                  # the CPU pool cannot: spillover from nothing
    later = at(zero.GPU_WAKE_AFTER_SECONDS + 1, pool(1, rate=3.0, p95=100, at=NOW + zero.GPU_WAKE_AFTER_SECONDS + 1))
    assert later.gpu_replicas >= 1                                 # the load persisted: gpu-first as for any model


def test_a_terminating_pods_failed_scrape_never_wakes_a_sleeping_model_nor_ends_a_drain() -> None:
    # Seen with a thousand models going to zero at once: the pod of a model just put to sleep was still listed
    # Ready and its scrape failed; that read as a request and woke it.
    failed = Signals(cpu=replace(pool(1, rate=0.0), error="connection refused", sampled_at=None))
    asleep = History(zero=ZeroState("asleep", NOW, NOW - 100))
    d = decide(SLEEPY, failed, Current(0, 0, 100), asleep, NOW + 5)
    assert (d.zero, d.cpu_replicas) == ("asleep", 0)
    # A drain with unreadable metrics neither wakes nor goes to zero until the pool is measured again.
    draining = History(zero=ZeroState("draining", NOW - 2 * zero.DRAIN_SECONDS, NOW - 100))
    d = decide(SLEEPY, failed, Current(0, 1, 100), draining, NOW)
    assert (d.zero, d.cpu_replicas) == ("draining", 1)
    d = decide(SLEEPY, idle_cpu(1, NOW + 5), Current(0, 1, 100), d.history, NOW + 5)
    assert (d.zero, d.cpu_replicas) == ("asleep", 0)
    # The activator's last request, older than what was already known, is no new request either.
    old = Signals(activator=ActivatorDemand(waiting=0, last=NOW - 200))
    assert decide(SLEEPY, old, Current(0, 0, 100), asleep, NOW + 5).zero == "asleep"
