"""What the benchmark reports: progress on stderr, the latency summaries (n, p50, p95, max) of every phase, and the
targets the result is held to (each measured value, its limit, pass, fail or not measured)."""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

from .prometheus import PROMQL_SIGNALS

TARGETS = {
    "ready_after_jobs_finished_s": 120.0,
    "apply_to_job_p95_s": 3.0,
    "steady_requests_per_s": 20.0,
    "steady_writes": 0.0,
    "promql_queries_per_signal_per_tick": 1.0,
    "rss_mb": 300.0,
    "cpu_cores": 0.5,
    "failover_s": 15.0,
    "idle_pods": 0.0,
    "ready_after_first_p95_s": 10.0,
}

_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[fleet {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def quantiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    s = sorted(values)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))], 3)

    return {"n": len(s), "p50": q(0.5), "p95": q(0.95), "max": round(s[-1], 3)}


def targets(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    bring_up, steady = result.get("bring_up", {}), result.get("steady_state", {})
    failover = result.get("failover") or {}
    leader = steady.get("leader", "replica-0")
    requests = steady.get("operator_requests", {})
    measured: dict[str, Any] = {
        "ready_after_jobs_finished_s": bring_up.get("all_ready_after_jobs_finished_s")
        if bring_up.get("all_ready") else None,
        "apply_to_job_p95_s": bring_up.get("apply_to_job_s", {}).get("p95"),
        "steady_requests_per_s": requests.get("requests_per_s"),
        "steady_writes": requests.get("writes"),
        "promql_queries_per_signal_per_tick": steady.get("promql", {}).get("per_signal_per_tick"),
        "rss_mb": steady.get("operator_rss_mb", {}).get(leader, {}).get("max"),
        "cpu_cores": steady.get("operator_cpu_cores", {}).get(leader),
        "failover_s": failover.get("failover_s"),
        "idle_pods": result.get("idle", {}).get("idle_pods"),
        "ready_after_first_p95_s": result.get("ready_after_first_s", {}).get("p95"),
    }
    notes = {
        "ready_after_jobs_finished_s": f"target for 1000 models; measured with {args.models}",
        "apply_to_job_p95_s": f"target for a burst of 300; measured in a burst of {args.models}",
        "promql_queries_per_signal_per_tick": f"{PROMQL_SIGNALS} signals per pool; only with --metrics-source "
                                              "prometheus",
        "failover_s": "the later of: the standby's rerank_operator_leader is 1, and a spec change made at the kill "
                      "reaches the Deployment; only with --replicas 2",
        "steady_requests_per_s": "completed non-watch requests plus watches opened, per second (leader election's "
                                 "Lease calls included)",
        "steady_writes": "writes in the window, leader election's Lease renewals excepted (lease_writes)",
        "idle_pods": "the fleet's pool pods at the end of the steady window; only with --idle",
    }
    out: dict[str, Any] = {}
    for name, limit in TARGETS.items():
        value = measured[name]
        out[name] = {"target": f"<= {limit:g}", "measured": value,
                     "pass": None if value is None else bool(value <= limit)}
        if name in notes:
            out[name]["note"] = notes[name]
    if args.metrics_source != "prometheus":
        out["promql_queries_per_signal_per_tick"]["pass"] = None
    if args.replicas != 2:
        out["failover_s"]["pass"] = None
    elif measured["failover_s"] is None:
        out["failover_s"]["pass"] = False
    if args.distinct_models:
        checks = result.get("checks", {})
        for name in ("jobs", "artifacts"):
            out[name] = {"target": f"== {args.distinct_models}", "measured": checks.get(name),
                         "pass": checks.get(name) == args.distinct_models}
    else:
        out["ready_after_first_p95_s"]["pass"] = None
    if not args.idle:
        out["idle_pods"]["pass"] = None
    elif measured["idle_pods"] is None:
        out["idle_pods"]["pass"] = False
    return out
