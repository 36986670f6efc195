"""The fleet at rest: once every model is Ready and the operator has made no write for --settle-quiet seconds, a
window of --steady-window seconds: the operator's API requests by verb (audit log), its CPU seconds per second and RSS
(/proc/<pid>), fake TEI scrapes per second and, with --metrics-source prometheus, PromQL queries per second."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .audit import AuditTail, summarize_requests
from .harness import Harness
from .prometheus import PROMQL_SIGNALS
from .report import log


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class SteadyState(Harness):
    """The operator's API load, CPU and memory over the steady window."""

    def _steady_state(self) -> None:
        args = self.args
        audit = AuditTail(self.cluster.audit_log)
        # Settle: no operator write for --settle-quiet seconds.
        start, quiet_since = audit.position(), time.monotonic()
        deadline = time.monotonic() + args.settle_timeout
        settled = False
        while time.monotonic() < deadline:
            time.sleep(2)
            writes, start = audit.operator_writes_since(start)
            if writes:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= args.settle_quiet:
                settled = True
                break
        log(f"steady state: settled={settled}; measuring {args.steady_window}s")
        leader = self.leader()
        pids = {f"replica-{i}": r.process.pid for i, r in enumerate(self.replicas)}
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        promql0 = self._promql_total()
        scrapes0 = self.tei_server.requests if self.tei_server else 0
        changed0 = self.fleet.autoscaling_changed
        offset0, t0 = audit.position(), time.monotonic()
        rss: dict[str, list[float]] = {name: [] for name in pids}
        while time.monotonic() - t0 < args.steady_window:
            for name, pid in pids.items():
                rss[name].append(rss_mb(pid))
            time.sleep(1.0)
        seconds = time.monotonic() - t0
        offset1 = audit.position()
        cpu = {name: round((cpu_seconds(pid) - cpu0[name]) / seconds, 3) for name, pid in pids.items()}
        promql1 = self._promql_total()
        scrapes = (self.tei_server.requests - scrapes0) if self.tei_server else 0
        requests = summarize_requests(list(audit.events(offset0, offset1)), seconds)
        leader_name = f"replica-{self.replicas.index(leader)}"
        promql: dict[str, Any] = {"source": promql0[0]}
        if promql0[1] is not None and promql1[1] is not None:
            qps = (promql1[1] - promql0[1]) / seconds
            per_tick = qps * args.interval
            promql.update(queries_per_s=round(qps, 3), queries_per_tick=round(per_tick, 2),
                          per_signal_per_tick=round(per_tick / PROMQL_SIGNALS, 3))
        self.result["steady_state"] = {
            "settled": settled,
            "window_s": round(seconds, 1),
            "operator_requests": requests,
            "operator_cpu_cores": cpu,
            "operator_rss_mb": {name: {"max": round(max(v), 1), "end": round(v[-1], 1)} for name, v in rss.items()},
            "leader": leader_name,
            "fake_tei_scrapes_per_s": round(scrapes / seconds, 2),
            "scrapes_per_pool_pod_per_tick": round(scrapes / seconds * args.interval / (2 * args.models), 3)
            if args.metrics_source == "direct" and not args.idle else None,
            "promql": promql,
            "autoscaling_status_changed_during_window": self.fleet.autoscaling_changed != changed0,
        }
        log(f"steady state: {json.dumps(self.result['steady_state'])}")

    def _promql_total(self) -> tuple[str, float | None]:
        if self.args.metrics_source != "prometheus":
            return "n/a (direct metrics)", None
        counter = sum(v for r in self.replicas for k, v in r.metrics().items()
                      if k.startswith("rerank_operator_promql_queries_total"))
        if any(k.startswith("rerank_operator_promql_queries_total") for r in self.replicas for k in r.metrics()):
            return "rerank_operator_promql_queries_total", counter
        assert self.prometheus is not None
        return 'prometheus_engine_query_duration_seconds_count{slice="inner_eval"}', self.prometheus.queries_total()
