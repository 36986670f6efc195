"""The bring-up: N applies in a burst, the operator's quantization Job per model (apply->Job from the audit log and
as seen here), each quantizer pod finished here as soon as kwok runs it, and the time until every model is Ready."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rerank_devcluster import operator_process as op

from .audit import AuditTail, apply_to_job_from_audit
from .harness import Harness
from .manifests import model_manifest
from .report import log, quantiles
from .watches import Key, owner_key


class BringUp(Harness):
    """The burst of applies and the time to every model Ready."""

    def _finish(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = owner_key(pod)
        try:
            self.api.ok("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        op.publish_status(pod), "application/merge-patch+json")
        except (RuntimeError, OSError) as exc:
            with self.fleet.lock:
                self.fleet.finish_errors += 1
                self.fleet.finishing.discard(meta["uid"])
            log(f"finishing {meta['namespace']}/{meta['name']} failed: {exc}")
            return
        if key:
            with self.fleet.lock:
                self.fleet.finished.setdefault(key, time.monotonic())

    def _bring_up(self, namespaces: list[str]) -> None:
        args, fleet = self.args, self.fleet
        keys = [(namespaces[i % len(namespaces)], f"m-{i:05d}") for i in range(args.models)]

        def apply(key: Key) -> None:
            self.api.ok("POST", f"/apis/{op.GROUP}/{op.VERSION}/namespaces/{key[0]}/{op.PLURAL}",
                        model_manifest(key[1], key[0], args))
            done = time.monotonic()
            with fleet.lock:
                fleet.applied[key] = done

        if args.distinct_models:  # one model per artifact first: the others find their artifact published
            first = keys[:args.distinct_models]
            log(f"applying the first {len(first)} RerankModels, one per distinct model")
            with ThreadPoolExecutor(max_workers=args.apply_concurrency, thread_name_prefix="apply") as pool:
                list(pool.map(apply, first))
            self._wait(lambda: all(fleet.ready_now.get(k) for k in first), args.timeout,
                       "the first model of each artifact Ready")
            keys_first, keys = first, keys[args.distinct_models:]
        log(f"applying {len(keys)} RerankModels ({args.apply_concurrency} clients)")
        audit = AuditTail(self.cluster.audit_log)
        burst_start = audit.position()
        t_apply = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.apply_concurrency, thread_name_prefix="apply") as pool:
            list(pool.map(apply, keys))
        t_applied = time.monotonic()
        log(f"applied in {t_applied - t_apply:.1f}s")

        def progress() -> bool:
            with fleet.lock:
                jobs, running, finished = len(fleet.job_seen), len(fleet.pod_running), len(fleet.finished)
            ready = fleet.ready_count()
            now = time.monotonic()
            if now - self._last_progress >= 10:
                self._last_progress = now
                log(f"jobs {jobs}/{len(keys)}, quantizer pods running {running}, finished {finished}, "
                    f"ready {ready}")
            return ready >= len(keys) and all(fleet.ready_now.get(k) for k in keys)

        self._last_progress = 0.0
        all_ready = self._wait(progress, args.timeout, "every model Ready")
        t_ready = time.monotonic()
        with fleet.lock:
            apply_to_job = [fleet.job_seen[k] - fleet.applied[k] for k in keys if k in fleet.job_seen
                            and k in fleet.applied]
            job_to_running = [fleet.pod_running[k] - fleet.job_seen[k] for k in keys
                              if k in fleet.pod_running and k in fleet.job_seen]
            finish_to_ready = [fleet.first_ready[k] - fleet.finished[k] for k in keys
                               if k in fleet.first_ready and k in fleet.finished]
            last_finish = max(fleet.finished.values(), default=t_ready)
            last_job = max(fleet.job_seen.values(), default=t_ready)
            counts = {"jobs_seen": len(fleet.job_seen), "quantizer_pods_finished": len(fleet.finished),
                      "ready": sum(1 for k in keys if fleet.ready_now.get(k)), "finish_errors": fleet.finish_errors}
        served = apply_to_job_from_audit(audit.events(burst_start, audit.position()))
        if args.distinct_models:
            with fleet.lock:
                after_first = [fleet.first_ready[k] - fleet.applied[k] for k in keys
                               if k in fleet.first_ready and k in fleet.applied]
            self.result["ready_after_first_burst_s"] = {
                **quantiles(after_first), "models": len(keys),
                "method": "models applied in one burst after their artifact was published: the create call "
                          "returned -> Ready seen on this process's watch (the API server's queue of the burst's "
                          "writes included)"}
            keys = keys_first + keys
            counts["ready"] = sum(1 for k in keys if fleet.ready_now.get(k))
        self.keys = keys
        self.result["bring_up"] = {
            "all_ready": all_ready,
            **counts,
            "apply_burst_s": round(t_applied - t_apply, 2),
            "apply_to_job_s": {**quantiles([served[k] for k in keys if k in served]), "burst": len(keys),
                               "method": "API server's audit log: the model's create received -> the operator's "
                                         "Job create answered (one clock, microseconds)"},
            "apply_to_job_seen_here_s": {**quantiles(apply_to_job), "burst": len(keys),
                                         "method": "Job first seen on this process's watch minus the model's create "
                                                   "call returning (time.monotonic): adds the API server's watch "
                                                   "delivery to this process"},
            "last_job_after_first_apply_s": round(last_job - t_apply, 2),
            "job_to_quantizer_pod_running_s": quantiles(job_to_running),
            "all_jobs_finished_after_first_apply_s": round(last_finish - t_apply, 2),
            "all_ready_after_jobs_finished_s": round(t_ready - last_finish, 2),
            "finish_to_ready_s": quantiles(finish_to_ready),
            "total_apply_to_all_ready_s": round(t_ready - t_apply, 2),
        }
        log(f"bring-up: {json.dumps(self.result['bring_up'])}")
