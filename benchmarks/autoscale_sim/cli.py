"""The command line: the flags, the world and the traces they describe, one comparison per trace, the report
printed (and written with --out). `python -m benchmarks.autoscale_sim --help` lists the flags."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rerank_operator.core.autoscale import split as routing

from . import __doc__ as PACKAGE_DOC
from .controllers import BASELINES
from .experiments import ABLATIONS, policy_spec, runs_for
from .observation import BASELINE_LAG_S, RATE_WINDOW_S, SCRAPE_S
from .report import markdown, report_for
from .simulation import RunSpec, segment, simulate
from .traffic import HELD_OUT, PEAK_SHARE, SHAPES, diurnal, diurnal_spikes, held_out_from, recorded, scaled
from .world import DELAY_S, PoolModel, Realism


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=PACKAGE_DOC.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds of 6 h, nominal only, no other shapes")
    parser.add_argument("--seeds", type=str, default="1-12", help="diurnal seeds, e.g. 1-12 or 3,7")
    parser.add_argument("--hours", type=float, default=24, help="length of each diurnal trace")
    parser.add_argument("--shape-seeds", type=str, default="1-8",
                        help="seeds of the other shapes (noise, and the square waves' phase)")
    parser.add_argument("--shapes", type=str, default="diurnal,ramp,flat,square10,square30,overload")
    parser.add_argument("--traces", type=str, default="",
                        help="recorded traces to replay too: CSV files of per-second arrivals (t_s,requests), "
                             "comma-separated; each is reported whole and as its tuning and held-out parts")
    parser.add_argument("--trace-seeds", type=str, default="1-4",
                        help="seeds of each recorded trace's runs (start-up jitter, failed scrapes)")
    parser.add_argument("--trace-peak-share", type=float, default=PEAK_SHARE,
                        help="scale each recorded trace so its busiest minute fills this share of the pools' "
                             "combined capacity at the SLO (GPU and CPU at their maximum)")
    parser.add_argument("--trace-scale", type=float, default=None,
                        help="multiply each recorded trace by this instead (one recorded request = this many)")
    parser.add_argument("--variants", type=str, default="nominal,delay10,cpu90",
                        help="nominal (CPU start-up 40 s), delay10 (10 s actuation delay), cpu90 (90 s CPU start-up)")
    parser.add_argument("--baselines", type=str, default=",".join(BASELINES), help="which baselines to run")
    parser.add_argument("--bounds", action="store_true",
                        help="also run the oracle and foresight bounds (every variant: what a target could be at best)")
    parser.add_argument("--no-sweep", action="store_true", help="baselines at their default target only")
    parser.add_argument("--ablations", nargs="?", const="builtin", default=None, metavar="JSON",
                        help="also run the policy's ablations (or {name: spec.autoscaling overrides} given here)")
    parser.add_argument("--baseline-period-s", type=int, default=SCRAPE_S,
                        help="the baselines' scrape and sync period (production: Prometheus' 15 s); 5 is the "
                             "policy's own interval. Must divide 15")
    parser.add_argument("--baseline-lag-s", type=int, default=BASELINE_LAG_S,
                        help="the baselines' sync after each scrape (production: 8 s, not aligned); 0 is the "
                             "policy's (it ticks right after its own scrape). Below the period")
    parser.add_argument("--rate-window-s", type=int, default=RATE_WINDOW_S,
                        help="the baselines' rate() range (production: 1 m)")
    parser.add_argument("--scrape-failure", type=float, default=0.05)
    parser.add_argument("--slo-ms", type=float, default=500)
    parser.add_argument("--gpu-rps", type=float, default=120, help="one GPU FP16 replica's throughput")
    parser.add_argument("--gpu-max", type=int, default=6)
    parser.add_argument("--gpu-startup-s", type=float, default=120)
    parser.add_argument("--gpu-price", type=float, default=1.0, help="$ per GPU replica-hour")
    parser.add_argument("--cpu-rps", type=float, default=10.0, help="one CPU INT8 replica's throughput")
    parser.add_argument("--cpu-max", type=int, default=32)
    parser.add_argument("--cpu-price", type=float, default=0.2, help="$ per CPU replica-hour")
    parser.add_argument("--autoscaling", type=json.loads, default={}, metavar="JSON",
                        help="policy spec.autoscaling fields over the CRD defaults (default: none)")
    parser.add_argument("--out", type=str, default=None, help="also write the JSON here")
    parser.add_argument("--format", choices=("json", "markdown"), default="json",
                        help="what to print: the JSON report, or its tables (targets; per shape, variant and seed: "
                             "the policy and each baseline at its default and cost-matched); --out is JSON either way")
    parser.add_argument("--from-rows", type=str, default=None, metavar="JSON",
                        help="summarize the rows of an earlier run's JSON again instead of simulating")
    args = parser.parse_args(argv)
    if args.from_rows:
        previous = json.loads(Path(args.from_rows).read_text())
        report = report_for(previous["rows"], previous["parameters"], args.variants.split(","))
        print(markdown(report) if args.format == "markdown" else json.dumps(report, indent=1))
        return
    if args.baseline_period_s <= 0 or 15 % args.baseline_period_s:
        parser.error("--baseline-period-s must divide 15 (1, 3, 5 or 15): the world's scrape cycle")
    if not 0 <= args.baseline_lag_s < args.baseline_period_s:
        parser.error("--baseline-lag-s must be at least 0 and below --baseline-period-s")
    if args.rate_window_s < 2 * args.baseline_period_s:
        parser.error("--rate-window-s must hold two scrapes at least (2 x --baseline-period-s)")
    if args.quick:
        args.seeds, args.hours, args.shapes, args.variants = "1-2", 6.0, "diurnal", "nominal"

    slo = args.slo_ms / 1000
    gpu = PoolModel("gpu", args.gpu_rps, 0.05, args.gpu_startup_s, 1, args.gpu_max, args.gpu_price)
    cpu = PoolModel("cpu", args.cpu_rps, 0.12, 40.0, 1, args.cpu_max, args.cpu_price)
    spec = policy_spec(gpu, cpu, args.autoscaling)
    chosen_ablations = ABLATIONS if args.ablations == "builtin" else json.loads(args.ablations or "{}")
    ablations = {name: (policy_spec(gpu, cpu, _merge(args.autoscaling or {},
                                                      {k: v for k, v in extra.items() if k != "tuning"})),
                        routing.Tuning(**extra.get("tuning", {})))
                 for name, extra in chosen_ablations.items()}
    variants = {"nominal": Realism(scrape_failure=args.scrape_failure),
                "delay10": Realism(scrape_failure=args.scrape_failure, delay_s=DELAY_S),
                "cpu90": Realism(scrape_failure=args.scrape_failure, cpu_startup_s=90.0)}
    chosen = [v for v in args.variants.split(",") if v]
    seeds = _seeds(args.seeds)
    traces: list[tuple[str, int, np.ndarray, list[tuple[int, int, float]]]] = []
    for shape in [s for s in args.shapes.split(",") if s]:
        if shape == "diurnal":
            traces += [("diurnal", s, diurnal(args.hours, s), diurnal_spikes(args.hours, s)) for s in seeds]
        elif shape in SHAPES:
            traces += [(shape, s, SHAPES[shape](s), []) for s in _seeds(args.shape_seeds)]
        else:
            parser.error(f"--shapes: unknown shape {shape!r}")
    combined = gpu.max_replicas * gpu.capacity_at(slo) + cpu.max_replicas * cpu.capacity_at(slo)
    busiest = args.trace_peak_share * combined
    for path in [Path(p) for p in args.traces.split(",") if p]:
        try:
            counts = recorded(path)
        except (OSError, ValueError) as error:
            parser.error(f"--traces: {error}")
        rates = counts * args.trace_scale if args.trace_scale else scaled(counts, busiest)
        traces += [(f"trace:{path.stem}", s, rates, []) for s in _seeds(args.trace_seeds)]

    started = time.monotonic()
    rows: list[dict[str, Any]] = []
    for shape, seed, rates, spikes in traces:
        runs: list[RunSpec] = []
        for variant in chosen:
            runs += runs_for(variant, variants[variant], gpu, cpu, slo, spec, not args.no_sweep,
                             ablations if variant == "nominal" else {}, args.baselines.split(","),
                             args.bounds, baseline_period=args.baseline_period_s, baseline_lag=args.baseline_lag_s,
                             rate_window=args.rate_window_s)
        record: list[np.ndarray] = []
        billed: list[np.ndarray] = []
        results = simulate(rates, runs, gpu, cpu, slo, seed, record=record, spikes=spikes, replicas=billed)
        rows += [{"shape": shape, "seed": seed, **row} for row in results]
        if shape.startswith("trace:"):
            cut = held_out_from(rates.size)
            for part, (a, b) in (("tuning", (0, cut)), ("held_out", (cut, rates.size))):
                rows += [{"shape": f"{shape}@{part}", "seed": seed, **row}
                         for row in segment(results, record, billed, gpu, cpu, a, b)]
        print(f"{shape} seed {seed}: {time.monotonic() - started:.0f}s", file=sys.stderr)

    parameters = {**vars(args), "gpu_capacity_at_slo": round(gpu.capacity_at(slo), 1),
                  "cpu_capacity_at_slo": round(cpu.capacity_at(slo), 2), "tei_buckets": "1e-5*1.5^k, k=1..35",
                  "policy_interval_s": spec.interval_seconds, "baseline_cadence": {
                      "period_s": args.baseline_period_s, "lag_s": args.baseline_lag_s,
                      "rate_window_s": args.rate_window_s,
                      "equal_to_policy": args.baseline_period_s == int(spec.interval_seconds)
                      and args.baseline_lag_s == 0},
                  "held_out_seeds": list(HELD_OUT), "trace_busiest_minute_rps": round(busiest, 1),
                  "runtime_s": round(time.monotonic() - started, 1)}
    report = report_for(rows, parameters, chosen)
    text = json.dumps(report, indent=1)
    if args.out:
        Path(args.out).write_text(text)
    print(markdown(report) if args.format == "markdown" else text)


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, dict) and isinstance(merged.get(key), dict) \
            else value
    return merged


def _seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            seeds += range(int(a), int(b) + 1)
        elif part:
            seeds.append(int(part))
    return seeds
