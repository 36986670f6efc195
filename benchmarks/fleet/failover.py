"""Failover (--replicas 2): the leader SIGKILLed, one model's spec changed at that moment, and the time until the
standby leads, until its counters move, and until the change reaches the model's Deployment."""

from __future__ import annotations

import json
import os
import signal
import time

from rerank_devcluster import operator_process as op

from .harness import LEASE_NAME, LEASE_NS, Harness
from .report import log


class Failover(Harness):
    """The standby taking over from a killed leader."""

    def _failover(self) -> None:
        leaders = [(i, r.leader()) for i, r in enumerate(self.replicas)]
        lease = self.api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{LEASE_NAME}")
        holder = lease[1].get("spec", {}).get("holderIdentity") if lease[0] == 200 else None
        current = [i for i, v in leaders if (v or 0) >= 1]
        if len(current) != 1:
            self.result["failover"] = {"error": f"expected one leader, rerank_operator_leader per replica: {leaders}",
                                       "lease_holder": holder}
            log(self.result["failover"]["error"])
            return
        old, new = self.replicas[current[0]], self.replicas[1 - current[0]]
        ns, name = self.keys[0]
        before = new.activity()
        log(f"failover: SIGKILL replica-{current[0]} (lease holder {holder!r}); changing {ns}/{name} minReplicas")
        t0 = time.monotonic()
        os.kill(old.process.pid, signal.SIGKILL)
        if old.process.proc:
            old.process.proc.wait(timeout=10)
        self.api.ok("PATCH", f"/apis/{op.GROUP}/{op.VERSION}/namespaces/{ns}/{op.PLURAL}/{name}",
                    {"spec": {"pools": {"cpu": {"minReplicas": 2}}}}, "application/merge-patch+json")
        times: dict[str, float | None] = {"leader": None, "activity": None, "change_applied": None}
        deadline = t0 + self.args.failover_timeout
        while time.monotonic() < deadline and None in times.values():
            now = time.monotonic() - t0
            if times["leader"] is None and (new.leader() or 0) >= 1:
                times["leader"] = now
            if times["leader"] is not None and times["activity"] is None and new.activity() > before:
                times["activity"] = now
            if times["change_applied"] is None:
                status, dep = self.api.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}-cpu")
                if status == 200 and dep.get("spec", {}).get("replicas", 0) >= 2:
                    times["change_applied"] = now
            time.sleep(0.2)
        lease = self.api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{LEASE_NAME}")
        decided = [v for v in (times["leader"], times["change_applied"]) if v is not None]
        self.result["failover"] = {
            "killed": f"replica-{current[0]}",
            "lease_holder_before": holder,
            "lease_holder_after": lease[1].get("spec", {}).get("holderIdentity") if lease[0] == 200 else None,
            "standby_leader_after_s": round(times["leader"], 2) if times["leader"] is not None else None,
            "standby_counters_moved_after_s": round(times["activity"], 2) if times["activity"] is not None else None,
            "spec_change_applied_after_s": round(times["change_applied"], 2)
            if times["change_applied"] is not None else None,
            "failover_s": round(max(decided), 2) if len(decided) == 2 else None,
        }
        self.replicas = [new]
        log(f"failover: {json.dumps(self.result['failover'])}")
        self._wait(lambda: self.fleet.ready_count() >= len(self.keys), 120, "every model Ready after failover")
