"""The queueing world and a run of it: N controllers in lockstep over one trace (numpy over the runs, Python per
controller tick). Each run draws from its own random stream, so adding or removing a controller never changes
another's result, and every controller meets the same traffic and start-ups. Cadence is each run's own (``RunSpec``):
the policy scrapes and ticks every interval (5 s by default) right after its own scrape; the baselines at
Prometheus' scrape period, a sync lag after it and a rate() window (15 s, 8 s, 1 m by default; the CLI's
``--baseline-period-s``, ``--baseline-lag-s`` and ``--rate-window-s`` set them, e.g. to the policy's own)."""

from __future__ import annotations

import itertools
import math
import random
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .attribution import CAUSES, SPIKE_TAIL_S, attribute
from .observation import RATE_WINDOW_S, SCRAPE_S, TEI_BUCKETS, Action, Controller, Scrape, View
from .world import MAX_CONCURRENT, TAIL, PoolModel, Realism


@dataclass
class RunSpec:
    label: str
    make: Callable[[], Controller]
    realism: Realism = field(default_factory=Realism)
    phase: int = 0    # tick offset within the scrape period (0: right after the scrape, like the direct source)
    period: int = SCRAPE_S  # scrape and tick period (the policy's intervalSeconds; Prometheus' scrape interval)
    histogram: bool = False  # it reads te_request_duration (only the policy does: the others cost less without)
    rate_window: int = RATE_WINDOW_S  # the baselines' rate() range (the policy reads deltas of its last two scrapes)


def simulate(rates: np.ndarray, runs: Sequence[RunSpec], gpu: PoolModel, cpu: PoolModel, slo: float,
             seed: int, record: list[np.ndarray] | None = None,
             spikes: Sequence[tuple[int, int, float]] = (),
             replicas: list[np.ndarray] | None = None) -> list[dict[str, Any]]:
    """Run every controller over the same trace; `record`, if given, receives each second's violations; `spikes`
    (onset, end, height) are the trace's spikes, for the attribution of violations (`attribute`); `replicas`, if
    given, receives each second's billed pods (run x pool: ready and starting), what the cost is computed from."""
    k = len(runs)
    since_onset = np.full(rates.size, -1, dtype=int)
    spike_of = np.full(rates.size, -1, dtype=int)     # the spike whose window a second is in (the latest onset)
    for n, (a, b, _) in enumerate(spikes):
        window = np.arange(a, min(b + SPIKE_TAIL_S, rates.size))
        newer = (since_onset[window] < 0) | (window - a < since_onset[window])
        since_onset[window] = np.where(newer, window - a, since_onset[window])
        spike_of[window] = np.where(newer, n, spike_of[window])
    causes = [dict.fromkeys(CAUSES, 0) for _ in range(k)]
    episodes: list[set[int]] = [set() for _ in range(k)]   # spikes with at least one second over the SLO
    stale_tick = [False] * k
    last_reduce = [-math.inf] * k
    models = (gpu, cpu)
    mu = np.array([gpu.throughput, cpu.throughput])
    base = np.array([gpu.base_latency, cpu.base_latency])
    ready = np.array([[gpu.min_replicas, cpu.min_replicas]] * k, dtype=float)
    backlog = np.zeros((k, 2))
    share = np.zeros(k)
    counters = np.zeros((3, k, 2))               # requests, success, failure
    # Bounds below the fastest pool's base latency never hold an observation: they stay 0, only the rest is computed.
    low = int(np.searchsorted(TEI_BUCKETS, min(gpu.base_latency, cpu.base_latency)))
    active = TEI_BUCKETS[low:]
    hist_runs = np.array([i for i, r in enumerate(runs) if r.histogram], dtype=int)
    hist_row = {int(i): row for row, i in enumerate(hist_runs)}
    buckets = np.zeros((hist_runs.size, 2, active.size))
    violations = np.zeros(k)
    rejected_total = np.zeros(k)
    late_total = np.zeros(k)
    replica_seconds = np.zeros((k, 2))
    controllers = [r.make() for r in runs]
    # Each run's own random stream (start-up jitter, failed scrapes), independent of its position in the list.
    # The policy's ablations share the policy's stream (common random numbers): they differ only by the part switched.
    rngs = [random.Random(seed * 1_000_003 + zlib.crc32(_stream(r.label).encode())) for r in runs]
    starting: list[list[list[float]]] = [[[], []] for _ in range(k)]
    intent = [[gpu.min_replicas, cpu.min_replicas] for _ in range(k)]
    intent_share = [0.0] * k
    pending: list[deque] = [deque() for _ in range(k)]
    # Enough scrapes for the longest rate() window at the run's scrape period (and never fewer than 6).
    scrapes = [[deque(maxlen=max(6, r.rate_window // max(r.period, 1) + 2)) for _ in (0, 1)] for r in runs]
    failed = [[False, False] for _ in range(k)]
    shares_seen: list[list[int]] = [[] for _ in range(k)]
    next_event = math.inf
    # Which runs scrape and tick at each second of the 15 s cycle (periods divide 15); bounds (period 1) read
    # the trace, not scrapes.
    assert all(15 % r.period == 0 for r in runs)
    tick_at = [[i for i, r in enumerate(runs) if s % r.period == r.phase % r.period] for s in range(15)]
    scrape_at = [[i for i, r in enumerate(runs) if r.period > 1 and s % r.period == 0] for s in range(15)]
    waiting: set[int] = set()
    last_action: list[Action | None] = [None] * k
    total = np.array([[gpu.min_replicas, cpu.min_replicas]] * k, dtype=float)

    def apply(i: int, action: Action, now: int) -> None:
        nonlocal next_event
        for p, desired in enumerate(action[:2]):
            model = models[p]
            desired = max(model.min_replicas, min(model.max_replicas, int(desired)))
            if desired < total[i, p]:
                last_reduce[i] = now
            pods = starting[i][p]
            startup = model.startup if p == 0 else runs[i].realism.cpu_startup_s
            while int(ready[i, p]) + len(pods) < desired:
                pods.append(now + startup * rngs[i].uniform(1, 1 + runs[i].realism.jitter))
                next_event = min(next_event, pods[-1])
            while int(ready[i, p]) + len(pods) > desired and pods:
                pods.remove(max(pods))               # the pod furthest from ready goes first
            while int(ready[i, p]) + len(pods) > desired:
                ready[i, p] -= 1
            total[i, p] = ready[i, p] + len(pods)
        if action[2] < share[i]:
            last_reduce[i] = now
        share[i] = action[2]

    for now, rate in enumerate(rates.tolist()):
        if now >= next_event:
            next_event = math.inf
            for i in range(k):
                for p in (0, 1):
                    pods = starting[i][p]
                    if pods:
                        done = [t for t in pods if t <= now]
                        if done:
                            starting[i][p] = pods = [t for t in pods if t > now]
                            ready[i, p] += len(done)
                        if pods:
                            next_event = min(next_event, min(pods))
        # Arrivals, service, backlog, rejections.
        arrivals = rate * np.stack([1 - share, share], axis=1)
        capacity = ready * mu
        safe = np.maximum(capacity, 1e-9)
        work = backlog + arrivals
        completed = np.minimum(work, capacity)
        left = work - completed
        rejected = np.maximum(0.0, left - MAX_CONCURRENT * ready)
        backlog = left - rejected
        rho = np.where(backlog > 0, 0.99, np.minimum(arrivals / safe, 0.99))
        start = base + backlog / safe
        decay = mu * (1 - rho)
        down = ready <= 0
        at_slo = np.where(slo < start, 1.0, rho * np.exp(-decay * np.maximum(slo - start, 0.0)))
        at_slo = np.where(down, 1.0, at_slo)
        late = (arrivals * at_slo).sum(axis=1)
        violated = (late > TAIL * max(rate, 1e-9)) | (rejected.sum(axis=1) > TAIL * max(rate, 1e-9))
        violations += violated
        if record is not None:
            record.append(violated)
        for i in np.flatnonzero(violated).tolist():
            causes[i][attribute(now, int(since_onset[now]), runs[i].realism, gpu, stale_tick[i],
                                now - last_reduce[i])] += 1
            if spike_of[now] >= 0:
                episodes[i].add(int(spike_of[now]))
        rejected_total += rejected.sum(axis=1)
        late_total += late + rejected.sum(axis=1)
        admitted = arrivals - rejected
        if hist_runs.size:
            h_start, h_rho, h_decay = start[hist_runs], rho[hist_runs], decay[hist_runs]
            gap = active - h_start[..., None]
            tails = np.where(gap < 0, 1.0, h_rho[..., None] * np.exp(-h_decay[..., None] * np.maximum(gap, 0.0)))
            buckets += admitted[hist_runs][..., None] * (1.0 - tails)
        counters[0] += arrivals
        counters[1] += completed
        counters[2] += rejected
        replica_seconds += total
        if replicas is not None:
            replicas.append(total.copy())
        # Scrapes, then the controllers whose tick it is, then the actions whose delay has passed.
        if scrape_at[now % 15]:
            queue = backlog + ready * rho * rho / (1 - rho)
            for i in scrape_at[now % 15]:
                for p in (0, 1):
                    failed[i][p] = rngs[i].random() < runs[i].realism.scrape_failure
                    if not failed[i][p]:
                        scrapes[i][p].append(Scrape(now, int(ready[i, p]), counters[0, i, p], counters[1, i, p],
                                                    counters[2, i, p], queue[i, p],
                                                    np.concatenate([np.zeros(low), buckets[hist_row[i], p]])
                                                    if i in hist_row else np.zeros(0)))
        for i in tick_at[now % 15] if now > 0 else ():
            view = View(now, [int(ready[i, 0]), int(ready[i, 1])], [len(starting[i][0]), len(starting[i][1])],
                        list(intent[i]), intent_share[i], scrapes[i], failed[i], rates,
                        (float(backlog[i, 0]), float(backlog[i, 1])), runs[i].rate_window)
            action = controllers[i](view)
            stale_tick[i] = failed[i][0] or failed[i][1]
            intent[i] = [action[0], action[1]]
            intent_share[i] = action[2]
            shares_seen[i].append(round(action[2] * 100))
            if action != last_action[i]:
                last_action[i] = action
                pending[i].append((now + runs[i].realism.delay_s, action))
                waiting.add(i)
        for i in list(waiting):
            while pending[i] and pending[i][0][0] <= now:
                apply(i, pending[i].popleft()[1], now)
            if not pending[i]:
                waiting.discard(i)

    results = []
    for i, run_spec in enumerate(runs):
        results.append({
            "controller": run_spec.label,
            "violation_s": int(violations[i]),
            **_billed(replica_seconds[i], gpu, cpu),
            "rejected_fraction": round(float(rejected_total[i] / max(float(rates.sum()), 1.0)), 5),
            "late_fraction": round(float(late_total[i] / max(float(rates.sum()), 1.0)), 5),
            **_split_stats(shares_seen[i]),
            "causes": causes[i],
            "spike_episodes": len(episodes[i]),
        })
    return results


def _stream(label: str) -> str:
    """The random stream a run draws from: its label, except that a policy ablation draws the policy's."""
    variant, _, name = label.partition("|")
    return f"{variant}|policy" if name.startswith("ablation:") else label


def _split_stats(shares: list[int]) -> dict[str, Any]:
    """How much the CPU share moved: total movement, and reversals (up then down then up...)."""
    moves = [b - a for a, b in itertools.pairwise(shares) if b != a]
    reversals = sum(1 for a, b in itertools.pairwise(moves) if (a > 0) != (b > 0))
    return {"split_moves": len(moves), "split_travel_pct": sum(abs(m) for m in moves), "split_reversals": reversals,
            "max_cpu_share_pct": max(shares, default=0)}


def segment(results: Sequence[dict[str, Any]], record: Sequence[np.ndarray], replicas: Sequence[np.ndarray],
            gpu: PoolModel, cpu: PoolModel, start: int, end: int) -> list[dict[str, Any]]:
    """Each run's violations and cost over seconds [start, end) of one `simulate` call (given its `record` and
    `replicas`): a part of a trace reported apart (a recorded trace's held-out part) while every controller ran the
    whole trace, so none starts the part cold."""
    violated = np.array(record[start:end], dtype=float).sum(axis=0)
    billed = np.array(replicas[start:end]).sum(axis=0)          # run x pool replica-seconds
    return [{"controller": result["controller"], "violation_s": int(violated[i]), **_billed(billed[i], gpu, cpu)}
            for i, result in enumerate(results)]


def _billed(replica_seconds: np.ndarray, gpu: PoolModel, cpu: PoolModel) -> dict[str, float]:
    """A run's cost and replica-hours from its (GPU, CPU) replica-seconds (ready and starting pods alike)."""
    gpu_s, cpu_s = float(replica_seconds[0]), float(replica_seconds[1])
    return {"cost_usd": round((gpu_s * gpu.price_per_hour + cpu_s * cpu.price_per_hour) / 3600, 3),
            "gpu_replica_h": round(gpu_s / 3600, 2), "cpu_replica_h": round(cpu_s / 3600, 2)}
