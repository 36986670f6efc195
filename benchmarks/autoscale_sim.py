"""Replay a bursty trace through a GPU + CPU-INT8 queueing model, driven by the real policy; compare with HPA.

Model (1 s steps):
- demand: diurnal sinusoid plus sudden spikes (seeded; onset is instant, 2-10 minutes of extra requests/s);
- each pool: replicas with a per-replica throughput and a start-up delay; requests are spread evenly over ready
  replicas, each an M/M/1 queue (TEI serves one batch at a time) whose p95 latency is
  base + ln(rho / 0.05) / (mu - lambda); overload builds a fluid backlog that drains when capacity returns, and
  each replica rejects beyond TEI's --max-concurrent-requests (512);
- the service p95 each second is the p95 of the mixture of both pools' latency distributions, weighted by the
  traffic each receives; a second counts as an SLO violation when that p95 exceeds the SLO.
The candidate is `rerank_operator.autoscale.policy.decide` itself, fed PoolSignals computed from the model the
way the direct source computes them (rates and histogram p95 over the last interval, queue gauge at the tick).
The baseline is a per-pool Kubernetes HPA on utilization (target 70%, 15 s sync, tolerance 10%, default
behaviour: up 100% or 4 pods per 15 s, down after a 300 s stabilization window, unready pods counted at 0%),
with a fixed traffic split and no spillover.

Run: python benchmarks/autoscale_sim.py [--hours 24] [--seed 7]   (prints JSON)
Sensitivity: --interval-s, --scale-up-max-step, --scale-up-cooldown-s, --surge-max-step and --autoscaling JSON change
only the policy's spec; the model's flags (--gpu-startup-s, --cpu-max, ...) change both runs alike.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

from rerank_operator.autoscale import policy as autoscale_policy  # noqa: E402
from rerank_operator.autoscale.config import AutoscalingSpec  # noqa: E402
from rerank_operator.autoscale.history import History  # noqa: E402
from rerank_operator.autoscale.signals import PoolSignals, Signals  # noqa: E402

MAX_CONCURRENT = 512
HPA_SYNC_SECONDS = 15   # kube-controller-manager --horizontal-pod-autoscaler-sync-period default
TAIL = 0.05


@dataclass(frozen=True)
class PoolModel:
    name: str
    throughput: float      # requests/s one replica completes when busy
    base_latency: float    # seconds, p95 at zero load
    startup: float         # seconds from scale-up to ready
    min_replicas: int
    max_replicas: int
    price_per_hour: float


@dataclass
class PoolState:
    model: PoolModel
    ready: int
    starting: list[float] = field(default_factory=list)   # ready-at times
    backlog: float = 0.0

    @property
    def total(self) -> int:
        return self.ready + len(self.starting)

    def set_desired(self, desired: int, now: float) -> None:
        desired = max(self.model.min_replicas, min(self.model.max_replicas, desired))
        while self.total < desired:
            self.starting.append(now + self.model.startup)
        while self.total > desired and self.starting:
            self.starting.pop()                      # newest pending pod goes first
        while self.total > desired:
            self.ready -= 1
            self.backlog *= self.ready / (self.ready + 1) if self.ready else 0.0

    def tick(self, now: float) -> None:
        done = [t for t in self.starting if t <= now]
        self.starting = [t for t in self.starting if t > now]
        self.ready += len(done)


@dataclass
class Second:
    """What happened to one pool in one second: arrivals, completions, rejections, and the latency tail."""

    arrivals: float
    completed: float
    rejected: float
    delay: float          # fluid backlog wait (seconds)
    rho: float            # utilization of the M/M/1 part (< 1)
    mu: float
    base: float
    queue: float          # requests waiting (gauge)

    def tail(self, x: float) -> float:
        """P(latency > x) for a request admitted this second."""
        if self.arrivals <= 0:
            return 0.0
        if self.mu <= 0:
            return 1.0
        start = self.base + self.delay
        if x < start:
            return 1.0
        return min(1.0, self.rho * math.exp(-self.mu * (1 - self.rho) * (x - start)))


def step_pool(state: PoolState, arrivals: float) -> Second:
    m = state.model
    n = state.ready
    if n <= 0:
        return Second(arrivals, 0.0, arrivals, 0.0, 0.0, 0.0, m.base_latency, 0.0)
    capacity = n * m.throughput
    work = state.backlog + arrivals
    completed = min(work, capacity)
    backlog = work - completed
    limit = MAX_CONCURRENT * n
    rejected = max(0.0, backlog - limit)
    state.backlog = backlog - rejected
    rho = min(arrivals / capacity, 0.99) if state.backlog <= 0 else 0.99
    delay = state.backlog / capacity
    queue = state.backlog + n * (rho * rho / (1 - rho))
    return Second(arrivals, completed, rejected, delay, rho, m.throughput, m.base_latency, queue)


def mixture_p95(parts: list[Second], weights: list[float]) -> float:
    """Smallest x with sum_i w_i P(L_i > x) <= 5%, by bisection (weights are arrival counts)."""
    total = sum(weights)
    if total <= 0:
        return 0.0
    if any(p.mu <= 0 and w > 0 for p, w in zip(parts, weights)) and \
            sum(w for p, w in zip(parts, weights) if p.mu <= 0) / total > TAIL:
        return math.inf

    def excess(x: float) -> float:
        return sum(w * p.tail(x) for p, w in zip(parts, weights)) / total - TAIL

    low, high = 0.0, 1.0
    while excess(high) > 0 and high < 1e4:
        high *= 2
    for _ in range(40):
        middle = (low + high) / 2
        if excess(middle) > 0:
            low = middle
        else:
            high = middle
    return high


def trace(hours: float, seed: int, low: float, high: float, spikes_per_day: float, spike_low: float,
          spike_high: float) -> tuple[list[float], list]:
    """Requests/s for each second, and the spikes as (start, end, extra requests/s)."""
    rng = random.Random(seed)
    seconds = int(hours * 3600)
    day = 86400.0
    spikes = []
    t = rng.expovariate(spikes_per_day / day)
    while t < seconds - 600:
        duration = rng.uniform(120, 600)
        spikes.append((int(t), int(t + duration), rng.uniform(spike_low, spike_high)))
        t += duration + rng.expovariate(spikes_per_day / day)
    rates = []
    for s in range(seconds):
        diurnal = low + (high - low) * (1 - math.cos(2 * math.pi * (s % day) / day)) / 2
        extra = max((f for a, b, f in spikes if a <= s < b), default=0.0)
        rates.append(diurnal + extra)
    return rates, spikes


@dataclass
class Window:
    """Per-pool seconds since the last controller tick (what the scrape delta covers)."""

    seconds: list[list[Second]] = field(default_factory=lambda: [[], []])

    def signals(self, states: list[PoolState], now: float) -> Signals:
        pools = []
        for index, state in enumerate(states):
            window = self.seconds[index]
            span = max(len(window), 1)
            arrivals = sum(s.arrivals for s in window)
            latency = mixture_p95(window, [s.arrivals for s in window]) if arrivals > 0 else None
            pools.append(PoolSignals(
                ready_replicas=state.ready, scraped_replicas=state.ready,
                request_rate=arrivals / span, success_rate=sum(s.completed for s in window) / span,
                failure_rate=sum(s.rejected for s in window) / span,
                queue_size=window[-1].queue if window else 0.0,
                latency_p95_ms=None if latency is None or math.isinf(latency) else latency * 1000,
                sampled_at=now))
        self.seconds = [[], []]
        return Signals(gpu=pools[0], cpu=pools[1])


Controller = Callable[[int, Signals, list[PoolState], list[float]], None]


def run(rates: list[float], spikes: list, gpu: PoolModel, cpu: PoolModel, interval: int, slo: float,
        controller: Controller, cpu_share: float) -> dict:
    states = [PoolState(gpu, gpu.min_replicas), PoolState(cpu, cpu.min_replicas)]
    share = [cpu_share]
    window = Window()
    violations = []
    cost_seconds = [0.0, 0.0]
    rejected = served = 0.0
    actions: list[int] = []
    for now, rate in enumerate(rates):
        for state in states:
            state.tick(now)
        cpu_rate = rate * share[0]
        split = [rate - cpu_rate, cpu_rate]
        parts = [step_pool(state, split[i]) for i, state in enumerate(states)]
        for i, part in enumerate(parts):
            window.seconds[i].append(part)
            cost_seconds[i] += states[i].total
        rejected += sum(p.rejected for p in parts)
        served += sum(p.completed for p in parts)
        p95 = mixture_p95(parts, split)
        violations.append(p95 > slo or sum(p.rejected for p in parts) > TAIL * max(rate, 1e-9))
        if now % interval == interval - 1:
            before = (states[0].total, states[1].total, share[0])
            controller(now, window.signals(states, now), states, share)
            if (states[0].total, states[1].total, share[0]) != before:
                actions.append(now)
    return summarize(violations, cost_seconds, gpu, cpu, spikes, actions, rejected, served)


def summarize(violations: list[bool], cost_seconds: list[float], gpu: PoolModel, cpu: PoolModel, spikes: list,
              actions: list[int], rejected: float, served: float) -> dict:
    reacts, recoveries, hurt_reacts = [], [], []
    for index, (start, end, _) in enumerate(spikes):
        after = [a - start for a in actions if start <= a < end]
        reacts.append(after[0] if after else end - start)
        if any(violations[start:end]):
            hurt_reacts.append(reacts[-1])
        following = spikes[index + 1][0] if index + 1 < len(spikes) else len(violations)
        recoveries.append(_recovery(violations, start, end, following))
    cost = cost_seconds[0] / 3600 * gpu.price_per_hour + cost_seconds[1] / 3600 * cpu.price_per_hour
    return {
        "slo_violation_seconds": sum(violations),
        "gpu_replica_seconds": round(cost_seconds[0]),
        "cpu_replica_seconds": round(cost_seconds[1]),
        "cost_usd": round(cost, 2),
        "spike_first_action_s_mean": round(sum(reacts) / len(reacts), 1) if reacts else None,
        # the same over the spikes that broke the SLO (a spike absorbed without any action counts its whole
        # duration above, which says nothing about reaction time)
        "spikes_violating": len(hurt_reacts),
        "spike_first_action_s_mean_violating": round(sum(hurt_reacts) / len(hurt_reacts), 1) if hurt_reacts else None,
        "spike_time_to_slo_s_mean": round(sum(recoveries) / len(recoveries), 1) if recoveries else None,
        "spike_time_to_slo_s_max": max(recoveries) if recoveries else None,
        "rejected_fraction": round(rejected / max(served + rejected, 1), 5),
    }


def _recovery(violations: list[bool], start: int, end: int, following: int) -> int:
    """Seconds from spike onset until the p95 is back under the SLO for 30 s (0 if it never left).

    Looks at most 600 s past the spike's end and never into the next spike (its violations are its own)."""
    last_bad = None
    for t in range(start, min(end + 600, following, len(violations))):
        if violations[t]:
            last_bad = t
        elif last_bad is not None and t - last_bad >= 30:
            break
    return 0 if last_bad is None else last_bad + 1 - start


def policy_controller(spec: AutoscalingSpec) -> Controller:
    memory = {"history": History()}

    def control(now: int, signals: Signals, states: list[PoolState], share: list[float]) -> None:
        current = autoscale_policy.Current(states[0].total, states[1].total, round(share[0] * 100))
        decision = autoscale_policy.decide(spec, signals, current, memory["history"], float(now))
        memory["history"] = decision.history
        states[0].set_desired(decision.gpu_replicas, now)
        states[1].set_desired(decision.cpu_replicas, now)
        share[0] = decision.cpu_percent / 100

    return control


def hpa_controller(target: float = 0.7, tolerance: float = 0.1, window_s: int = 300) -> Controller:
    recommendations: list[list[tuple[int, int]]] = [[], []]

    def desired(index: int, state: PoolState, signals: PoolSignals, now: int) -> int:
        m = state.model
        current = state.total
        if state.ready <= 0:
            return current
        utilization = min((signals.request_rate or 0.0) / (state.ready * m.throughput), 1.0)
        ratio = utilization / target
        if abs(ratio - 1) <= tolerance:
            rec = current
        elif ratio > 1 and state.starting:
            adjusted = utilization * state.ready / current / target   # unready pods count as 0% busy
            rec = current if adjusted <= 1 + tolerance else math.ceil(adjusted * current)
        else:
            rec = math.ceil(ratio * state.ready)
        rec = max(m.min_replicas, min(m.max_replicas, rec))
        history = [(t, r) for t, r in recommendations[index] if now - t < window_s] + [(now, rec)]
        recommendations[index] = history
        if rec > current:
            return min(rec, max(current * 2, current + 4))      # default scale-up policies, select max
        return min(current, max(r for _, r in history))         # scale-down stabilization

    def control(now: int, signals: Signals, states: list[PoolState], share: list[float]) -> None:
        for index, state in enumerate(states):
            state.set_desired(desired(index, state, signals.pool("gpu" if index == 0 else "cpu"), now), now)

    return control


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=24)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--low-rps", type=float, default=100, help="diurnal minimum")
    parser.add_argument("--high-rps", type=float, default=450, help="diurnal maximum")
    parser.add_argument("--spikes-per-day", type=float, default=24)
    parser.add_argument("--spike-min-rps", type=float, default=80, help="smallest extra load of a spike")
    parser.add_argument("--spike-max-rps", type=float, default=300, help="largest extra load of a spike")
    parser.add_argument("--slo-ms", type=float, default=500)
    parser.add_argument("--gpu-rps", type=float, default=120, help="one GPU FP16 replica's throughput")
    parser.add_argument("--gpu-max", type=int, default=6)
    parser.add_argument("--gpu-startup-s", type=float, default=120)
    parser.add_argument("--gpu-price", type=float, default=1.0, help="$ per GPU replica-hour")
    parser.add_argument("--cpu-fp32-rps", type=float, default=4.0, help="one CPU replica's FP32 throughput")
    parser.add_argument("--int8-speedup", type=float, default=2.5, help="quantizer's measured INT8/FP32 speedup")
    parser.add_argument("--cpu-max", type=int, default=32)
    parser.add_argument("--cpu-startup-s", type=float, default=40)
    parser.add_argument("--cpu-price", type=float, default=0.2, help="$ per CPU replica-hour")
    parser.add_argument("--scale-up-max-step", type=int, default=None,
                        help="policy spec scaleUp.maxStep (default: the CRD default)")
    parser.add_argument("--scale-up-cooldown-s", type=float, default=None,
                        help="policy spec scaleUp.cooldownSeconds (default: the CRD default)")
    parser.add_argument("--interval-s", type=int, default=None,
                        help="policy spec intervalSeconds (default: the CRD default); the HPA baseline keeps its "
                             "15 s sync period either way")
    parser.add_argument("--surge-max-step", type=int, default=None,
                        help="policy spec spillover.surgeMaxStep (default: the CRD default)")
    parser.add_argument("--autoscaling", type=json.loads, default=None, metavar="JSON",
                        help="extra policy spec.autoscaling fields, merged over the flags above "
                             "(e.g. '{\"scaleDown\": {\"maxStep\": 2}}')")
    parser.add_argument("--baseline-cpu-share", type=float, default=0.0,
                        help="fixed share of traffic the baseline sends to the CPU pool")
    args = parser.parse_args(argv)

    gpu = PoolModel("gpu", args.gpu_rps, 0.05, args.gpu_startup_s, 1, args.gpu_max, args.gpu_price)
    cpu = PoolModel("cpu", args.cpu_fp32_rps * args.int8_speedup, 0.12, args.cpu_startup_s, 1, args.cpu_max,
                    args.cpu_price)
    scale_up = {key: value for key, value in (("maxStep", args.scale_up_max_step),
                                              ("cooldownSeconds", args.scale_up_cooldown_s)) if value is not None}
    autoscaling: dict = {"scaleUp": scale_up}
    if args.interval_s is not None:
        autoscaling["intervalSeconds"] = args.interval_s
    if args.surge_max_step is not None:
        autoscaling["spillover"] = {"surgeMaxStep": args.surge_max_step}
    for key, value in (args.autoscaling or {}).items():
        autoscaling[key] = {**autoscaling[key], **value} if isinstance(value, dict) and isinstance(
            autoscaling.get(key), dict) else value
    autoscaling = {key: value for key, value in autoscaling.items() if value not in ({}, None)}
    spec = AutoscalingSpec.from_spec({
        "pools": {"gpu": {"minReplicas": gpu.min_replicas, "maxReplicas": gpu.max_replicas},
                  "cpu": {"minReplicas": cpu.min_replicas, "maxReplicas": cpu.max_replicas}},
        "routing": {"policy": "gpu-first"},
        "autoscaling": autoscaling,
    })
    rates, spikes = trace(args.hours, args.seed, args.low_rps, args.high_rps, args.spikes_per_day,
                          args.spike_min_rps, args.spike_max_rps)
    interval = int(spec.interval_seconds)
    slo = args.slo_ms / 1000
    candidate = run(rates, spikes, gpu, cpu, interval, slo, policy_controller(spec), 0.0)
    baseline = run(rates, spikes, gpu, cpu, HPA_SYNC_SECONDS, slo, hpa_controller(), args.baseline_cpu_share)
    result = {
        "parameters": {**vars(args), "cpu_int8_rps": cpu.throughput, "spikes": len(spikes),
                       "interval_s": interval, "baseline_sync_s": HPA_SYNC_SECONDS,
                       "policy_spec": {"routing": "gpu-first", "autoscaling": autoscaling or "CRD defaults"}},
        "policy": candidate,
        "baseline_hpa": baseline,
        "violation_ratio": round(candidate["slo_violation_seconds"]
                                 / max(baseline["slo_violation_seconds"], 1), 3),
        "cost_ratio": round(candidate["cost_usd"] / max(baseline["cost_usd"], 1e-9), 3),
    }
    result["target_met"] = result["violation_ratio"] <= 0.5 and result["cost_ratio"] <= 1.1
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
