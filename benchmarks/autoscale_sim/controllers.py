"""The controllers compared: the real policy behind an adapter (`policy_controller`), the HPA- and KEDA-style
baselines that read Prometheus, and the bounds that read the true trace. `BASELINES` and `BOUNDS` register them
with their default tuning factor and the sweep that cost-matching interpolates along."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from rerank_operator.core.autoscale import policy as autoscale_policy
from rerank_operator.core.autoscale import split as routing
from rerank_operator.core.autoscale.config import AutoscalingSpec
from rerank_operator.core.autoscale.history import History
from rerank_operator.core.autoscale.signals import Signals

from .observation import Action, Controller, View
from .world import PoolModel


def policy_controller(spec: AutoscalingSpec, tuning: routing.Tuning = routing.PRODUCTION) -> Controller:
    memory = {"history": History()}

    def control(view: View) -> Action:
        signals = Signals(gpu=view.direct(0), cpu=view.direct(1))
        current = autoscale_policy.Current(view.intent[0], view.intent[1], round(view.cpu_share * 100))
        decision = autoscale_policy.decide(spec, signals, current, memory["history"], float(view.now), tuning)
        memory["history"] = decision.history
        return decision.gpu_replicas, decision.cpu_replicas, decision.cpu_percent / 100

    return control


class Hpa:
    """One pool's HPA v2: max over metrics of ceil(ratio x ready), tolerance, unready pods at 0 for scale-up,
    default scale-up policies (100% or 4 pods per 15 s, whichever is more), a scale-down stabilization window."""

    #: The default scale-up policies' period (100% or 4 pods per 15 s): a limit over time, not per sync, so an HPA
    #: synced every 5 s grows no faster than one synced every 15 s.
    UP_PERIOD_S = 15

    def __init__(self, model: PoolModel, down_window_s: float = 300, tolerance: float = 0.1) -> None:
        self.model = model
        self.window = down_window_s
        self.tolerance = tolerance
        self.recommendations: deque[tuple[int, int]] = deque()
        self.replicas: deque[tuple[int, int]] = deque()  # (time, replicas) at each sync within the period

    def desired(self, now: int, current: int, ready: int, ratios: Sequence[float | None]) -> int:
        valid = [r for r in ratios if r is not None]
        if ready <= 0 or not valid:
            return current
        recs = []
        for ratio in valid:
            if abs(ratio - 1) <= self.tolerance:
                recs.append(current)
            elif ratio > 1 and current > ready:
                adjusted = ratio * ready / current         # unready pods count as 0% busy
                recs.append(current if adjusted <= 1 + self.tolerance else math.ceil(adjusted * current))
            else:
                recs.append(math.ceil(ratio * ready))
        rec = max(self.model.min_replicas, min(self.model.max_replicas, max(recs)))
        # The window's highest recommendation: a deque kept decreasing, so its head is the maximum.
        while self.recommendations and self.recommendations[-1][1] <= rec:
            self.recommendations.pop()
        self.recommendations.append((now, rec))
        while now - self.recommendations[0][0] > self.window:
            self.recommendations.popleft()
        # The replicas at the period's start: the fewest seen at a sync within it (only now's at a 15 s sync).
        self.replicas.append((now, current))
        while now - self.replicas[0][0] >= self.UP_PERIOD_S:
            self.replicas.popleft()
        base = min(r for _, r in self.replicas)
        if rec > current:
            return max(current, min(rec, max(base * 2, base + 4)))
        return min(current, self.recommendations[0][1])


def _per_pod(value: float | None, ready: int) -> float | None:
    return None if value is None or ready <= 0 else value / ready


def hpa_util_controller(gpu: PoolModel, cpu: PoolModel, f: float = 0.7) -> Controller:
    hpas = (Hpa(gpu), Hpa(cpu))

    def control(view: View) -> Action:
        out = []
        for p, model in enumerate((gpu, cpu)):
            per_pod = _per_pod(view.prom_rate(p), view.ready[p])
            util = None if per_pod is None else min(per_pod / model.throughput, 1.0) / f
            out.append(hpas[p].desired(view.now, view.intent[p], view.ready[p], [util]))
        return out[0], out[1], 0.0

    return control


def hpa_rps_controller(gpu: PoolModel, cpu: PoolModel, f: float = 0.7) -> Controller:
    hpas = (Hpa(gpu), Hpa(cpu))

    def control(view: View) -> Action:
        out = []
        for p, model in enumerate((gpu, cpu)):
            per_pod = _per_pod(view.prom_rate(p), view.ready[p])
            out.append(hpas[p].desired(view.now, view.intent[p], view.ready[p],
                                       [None if per_pod is None else per_pod / (f * model.throughput)]))
        return out[0], out[1], 0.0

    return control


def hpa_queue_controller(gpu: PoolModel, cpu: PoolModel, f: float = 2.0) -> Controller:
    hpas = (Hpa(gpu), Hpa(cpu))

    def control(view: View) -> Action:
        out = []
        for p in (0, 1):
            per_pod = _per_pod(view.prom_queue(p), view.ready[p])
            out.append(hpas[p].desired(view.now, view.intent[p], view.ready[p],
                                       [None if per_pod is None else per_pod / f]))
        return out[0], out[1], 0.0

    return control


def keda_controller(gpu: PoolModel, cpu: PoolModel, f: float = 0.7, queue_target: float = 4.0) -> Controller:
    hpas = (Hpa(gpu, down_window_s=0), Hpa(cpu, down_window_s=0))

    def control(view: View) -> Action:
        out = []
        for p, model in enumerate((gpu, cpu)):
            rate = _per_pod(view.prom_rate(p), view.ready[p])
            queue = _per_pod(view.prom_queue(p), view.ready[p])
            out.append(hpas[p].desired(view.now, view.intent[p], view.ready[p], [
                None if rate is None else rate / (f * model.throughput),
                None if queue is None else queue / queue_target]))
        return out[0], out[1], 0.0

    return control


def fixed_cpu_controller(gpu: PoolModel, cpu: PoolModel, slo: float, f: float = 0.7,
                         cpu_share: float = 0.1) -> Controller:
    hpas = (Hpa(gpu), Hpa(cpu))
    targets = (f * gpu.throughput, 0.9 * cpu.capacity_at(slo))

    def control(view: View) -> Action:
        out = []
        for p in (0, 1):
            per_pod = _per_pod(view.prom_rate(p), view.ready[p])
            out.append(hpas[p].desired(view.now, view.intent[p], view.ready[p],
                                       [None if per_pod is None else per_pod / targets[p]]))
        return out[0], out[1], cpu_share

    return control


def cap_spill_controller(gpu: PoolModel, cpu: PoolModel, slo: float, f: float = 0.8) -> Controller:
    """Given each pod's true capacity at the SLO: size the GPU for all demand at utilization f, spill what the
    ready GPUs cannot serve to the CPU pool (as far as its ready pods can take it), size the CPU for the spill."""
    gpu_cap, cpu_cap = gpu.capacity_at(slo), cpu.capacity_at(slo)
    gpu_hpa = Hpa(gpu)
    cpu_recs: deque[tuple[int, int]] = deque()
    last = {"demand": 0.0}

    def control(view: View) -> Action:
        rates = [view.prom_rate(0), view.prom_rate(1)]
        if rates[0] is None and rates[1] is None:
            return view.intent[0], view.intent[1], view.cpu_share
        demand = (rates[0] or 0.0) + (rates[1] or 0.0)
        last["demand"] = demand
        gpu_want = gpu_hpa.desired(view.now, view.intent[0], max(view.ready[0], 1),
                                   [demand / (f * gpu_cap * max(view.ready[0], 1))])
        excess = max(0.0, demand - view.ready[0] * gpu_cap * 0.95)
        cpu_need = min(cpu.max_replicas, max(cpu.min_replicas, math.ceil(excess / (0.9 * cpu_cap))))
        cpu_recs.append((view.now, cpu_need))
        while cpu_recs and view.now - cpu_recs[0][0] > 120:
            cpu_recs.popleft()
        cpu_want = max(r for _, r in cpu_recs)
        share = 0.0 if demand <= 0 else min(excess, view.ready[1] * 0.9 * cpu_cap) / demand
        if view.ready[0] <= 0:
            share = 1.0
        return gpu_want, cpu_want, round(share, 2)

    return control


def oracle_controller(gpu: PoolModel, cpu: PoolModel, slo: float, f: float = 0.85,
                      lookahead_s: int = 0) -> Controller:
    """The bound: every second, the true arrival rate and GPU backlog (and with `lookahead_s`, the coming peak) and
    each pod's true capacity at the SLO; sizes the GPU for demand at utilization f, spills what the ready GPUs
    cannot serve plus what works off their backlog within 5 s, as far as the ready CPU pods can take it, sizes
    the CPU pool for the excess, and releases both after 120 s. With lookahead 0 it stands for a reactive
    controller with perfect, instant information: only start-up times hurt it."""
    gpu_cap, cpu_cap = gpu.capacity_at(slo), cpu.capacity_at(slo)
    recs: tuple[deque, deque] = (deque(), deque())
    MARGIN = 0.9

    def held(p: int, now: int, want: int) -> int:
        recs[p].append((now, want))
        while now - recs[p][0][0] > 120:
            recs[p].popleft()
        return max(r for _, r in recs[p])

    def control(view: View) -> Action:
        assert view.trace is not None
        now = view.now
        demand = float(view.trace[max(0, now - 4):now + 1].mean())
        peak = float(view.trace[now:now + lookahead_s + 1].max()) if lookahead_s else demand
        gpu_want = held(0, now, max(gpu.min_replicas, math.ceil(max(demand, peak) / (f * gpu_cap))))
        excess = max(0.0, demand - view.ready[0] * gpu_cap * MARGIN)
        future = max(0.0, peak - (view.ready[0] + view.starting[0]) * gpu_cap * MARGIN) if lookahead_s else excess
        cpu_want = held(1, now, max(cpu.min_replicas, math.ceil(max(excess, future) / (cpu_cap * MARGIN))))
        drain = view.backlog[0] / 5.0          # work off the GPU's backlog within 5 s, as far as the CPU can
        share = 1.0 if view.ready[0] <= 0 else (
            min(excess + drain, view.ready[1] * cpu_cap * MARGIN) / demand if demand > 0 else 0.0)
        return gpu_want, cpu_want, min(share, 1.0)

    return control


BASELINES: dict[str, dict[str, Any]] = {
    # name: default tuning factor, sweep for cost-matching
    "hpa_rps": {"f": 0.7, "sweep": (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9)},
    "hpa_queue": {"f": 2.0, "sweep": (0.06, 0.12, 0.25, 0.5, 1.0, 4.0)},
    "keda": {"f": 0.7, "sweep": (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9)},
    "fixed_cpu": {"f": 0.7, "sweep": (0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9)},
    "cap_spill": {"f": 0.8, "sweep": (0.3, 0.4, 0.5, 0.6, 0.7, 0.9, 1.0)},
}
# Not baselines: bounds that know the true rate (and, foresight, the next 3 minutes); ticks every second.
BOUNDS: dict[str, dict[str, Any]] = {
    "oracle": {"f": 0.8, "sweep": (0.6, 0.7, 0.9)},
    "foresight": {"f": 0.85, "sweep": (0.7, 0.95)},
}


def make_baseline(name: str, gpu: PoolModel, cpu: PoolModel, slo: float, f: float) -> Callable[[], Controller]:
    factories: dict[str, Callable[[], Controller]] = {
        "hpa_util": lambda: hpa_util_controller(gpu, cpu, f),
        "hpa_rps": lambda: hpa_rps_controller(gpu, cpu, f),
        "hpa_queue": lambda: hpa_queue_controller(gpu, cpu, f),
        "keda": lambda: keda_controller(gpu, cpu, f),
        "fixed_cpu": lambda: fixed_cpu_controller(gpu, cpu, slo, f),
        "cap_spill": lambda: cap_spill_controller(gpu, cpu, slo, f),
        "oracle": lambda: oracle_controller(gpu, cpu, slo, f),
        "foresight": lambda: oracle_controller(gpu, cpu, slo, f, lookahead_s=180),
    }
    return factories[name]
