"""Properties of decide() over generated situations: bounds, steadiness, monotonicity, holding on stale data."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from rerank_operator.core.autoscale.history import History
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import PoolSignals, Signals
from tests.unit.operator.core.autoscale.autoscale_helpers import NOW, spec

SPEC = spec(gpu=(1, 6), cpu=(1, 8), crd_defaults=True)  # the shipped defaults
settings.register_profile("autoscale", max_examples=150, deadline=None)
settings.load_profile("autoscale")


@st.composite
def pool_signals(draw, max_ready: int = 8) -> PoolSignals:
    ready = draw(st.integers(0, max_ready))
    return PoolSignals(
        ready_replicas=ready, scraped_replicas=ready,
        request_rate=draw(st.floats(0, 2000)), success_rate=draw(st.floats(0, 2000)), failure_rate=0.0,
        queue_size=draw(st.floats(0, 500)), latency_p95_ms=draw(st.one_of(st.none(), st.floats(1, 20000))),
        gpu_memory_fraction=draw(st.one_of(st.none(), st.floats(0, 1))),
        sampled_at=NOW - draw(st.floats(0, 120)))


currents = st.builds(Current, st.integers(0, 12), st.integers(0, 12), st.integers(0, 100))


@given(pool_signals(), pool_signals(), currents)
def test_bounds_and_step_limits_always_hold(gpu, cpu, current):
    decision = decide(SPEC, Signals(gpu, cpu), current, History(), NOW)
    for name, bounds, before in (("gpu", SPEC.gpu, current.gpu_replicas), ("cpu", SPEC.cpu, current.cpu_replicas)):
        after = decision.replicas(name)
        assert bounds.min_replicas <= after <= bounds.max_replicas
        if bounds.min_replicas <= before <= bounds.max_replicas:
            assert after - before <= SPEC.scale_up.max_step
    assert 0 <= decision.cpu_percent <= 100
    if gpu.ready_replicas > 0 and cpu.ready_replicas > 0:
        assert decision.cpu_percent <= SPEC.spillover.max_cpu_percent
    if gpu.ready_replicas == 0 and cpu.ready_replicas > 0:
        assert decision.cpu_percent == 100


@given(pool_signals(), pool_signals(), currents, st.floats(61, 10_000))
def test_stale_signals_hold_everything(gpu, cpu, current, age):
    gpu = replace(gpu, ready_replicas=max(gpu.ready_replicas, 1), sampled_at=NOW - age)
    history = History(last_spill=NOW - 5)
    decision = decide(SPEC, Signals(gpu, cpu), current, history, NOW)
    assert decision.held
    assert decision.gpu_replicas == SPEC.gpu.clamp(current.gpu_replicas)
    assert decision.cpu_replicas == SPEC.cpu.clamp(current.cpu_replicas)
    assert decision.history.without_samples() == history
    if cpu.ready_replicas > 0:
        assert decision.cpu_percent == current.cpu_percent


@given(pool_signals(max_ready=6), pool_signals(max_ready=8), st.integers(1, 6), st.integers(1, 8),
       st.integers(0, 100))
def test_steady_signal_never_oscillates(gpu, cpu, gpu_replicas, cpu_replicas, cpu_percent):
    """Replaying identical signals, each pool and the split move in one direction only, then settle."""
    signals = Signals(gpu, cpu)
    current, history = Current(gpu_replicas, cpu_replicas, cpu_percent), History()
    seen: list[Current] = [current]
    for tick in range(60):                       # 15 minutes at 15 s
        now = NOW + 15 * tick
        signals = Signals(replace(gpu, sampled_at=now), replace(cpu, sampled_at=now))
        decision = decide(SPEC, signals, current, history, now)
        current = Current(decision.gpu_replicas, decision.cpu_replicas, decision.cpu_percent)
        history = decision.history
        seen.append(current)
    for series in ([c.gpu_replicas for c in seen[1:]], [c.cpu_replicas for c in seen[1:]],
                   [c.cpu_percent for c in seen[1:]]):
        assert series == sorted(series) or series == sorted(series, reverse=True), series
    assert seen[-1] == seen[-2]


@given(st.integers(1, 6), st.floats(10, 2000), st.floats(0, 2000), st.floats(0, 2000), st.floats(0, 60),
       st.floats(0, 60), st.integers(0, 100))
def test_more_load_never_means_fewer_gpu_replicas_or_less_spill(ready, rate, p95_low, p95_extra, queue_low,
                                                                queue_extra, cpu_percent):
    def outcome(p95: float, queue: float):
        gpu = PoolSignals(ready_replicas=ready, scraped_replicas=ready, request_rate=rate, success_rate=rate,
                          queue_size=queue * ready, latency_p95_ms=p95, sampled_at=NOW)
        cpu = PoolSignals(ready_replicas=2, scraped_replicas=2, request_rate=5, success_rate=5, queue_size=0,
                          latency_p95_ms=100, sampled_at=NOW)
        decision = decide(SPEC, Signals(gpu, cpu), Current(ready, 2, cpu_percent), History(), NOW)
        return decision.gpu_replicas, decision.cpu_percent

    low = outcome(p95_low, queue_low)
    high = outcome(p95_low + p95_extra, queue_low + queue_extra)
    assert high[0] >= low[0]
    assert high[1] >= low[1]
