"""One run of the benchmark: the dev cluster with room for the fleet, the operator replica(s) behind the scrape
redirect, the phases in order (bring-up, to zero, steady state, late tenants, the idle end and a wake, failover) and
the end-of-run checks (one Job per model and artifact, every model Ready)."""

from __future__ import annotations

import json
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rerank_contracts import oci
from rerank_devcluster import operator_process as op
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.fake_tei import MetricsServer, SteadyTei
from rerank_devcluster.scrape_redirect import ANY_POD

from .api import Api
from .bring_up import BringUp
from .failover import Failover
from .harness import LEASE_NAME, LEASE_NS, Replica, operator_source
from .manifests import STORAGE_CLASS, STORE_REPOSITORY, fleet_nodes
from .prometheus import Prometheus
from .report import log
from .scale_to_zero import ScaleToZero
from .shared_artifacts import SharedArtifacts
from .steady_state import SteadyState
from .watches import COMPONENT_LABEL, NS_PREFIX, SHARED_LABEL, Watches, owner_key


class Benchmark(BringUp, SteadyState, SharedArtifacts, ScaleToZero, Failover):
    """Every phase on one dev cluster: ``run`` starts it, runs the phases the flags ask for, and stops it all."""

    # -- setup -------------------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        args = self.args
        workdir = Path(args.workdir) if args.workdir else None
        log(f"starting the dev cluster ({args.models} models in {args.namespaces} namespaces)")
        cluster = Cluster.start(workdir)
        cluster.keep_workdir = args.keep_workdir
        self.cluster = cluster
        try:
            return self._run(cluster)
        finally:
            for r in self.replicas:
                r.process.stop()
            if self.prometheus:
                self.prometheus.stop()
            if self.tei_server:
                self.tei_server.stop()
            if self.activator:
                self.activator.stop()
            if self.registry:
                self.registry.processes.stop_all()
            if args.keep_workdir:
                log(f"kept {cluster.workdir} (logs: {cluster.logs_dir})")
            cluster.stop()

    def _run(self, cluster: Cluster) -> dict[str, Any]:
        args = self.args
        api = self.api = Api(cluster)
        cluster.add_nodes(fleet_nodes(args.models))
        op.install_crds(cluster)
        identity = op.create_identity(cluster, token_duration="8h")
        if args.replicas == 2:
            op.bind_leader_election(cluster, LEASE_NS)  # as the chart does: the Lease lives in the operator's namespace
        namespaces = [f"{NS_PREFIX}{i:04d}" for i in range(args.namespaces)]
        op.kubectl_apply(cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                                   for ns in namespaces])
        op.static_pvs(cluster, [f"{STORAGE_CLASS}-{i:05d}" for i in range(args.models)], STORAGE_CLASS)
        self._wait(lambda: self._default_service_accounts() >= len(namespaces), 120,
                   "every namespace's default ServiceAccount")

        # --idle: no request at all, so the models go to zero (counters that never move read as a rate of 0).
        tei = SteadyTei(rate=0.0 if args.idle else 1.0, latency=0.03)
        self.tei_server = MetricsServer(tei.render)
        redirect = cluster.workdir / "scrape-addresses.json"
        redirect.write_text(json.dumps({ANY_POD: self.tei_server.address}))
        extra_env: dict[str, str] = {}
        if args.operator_ref:
            src = operator_source(args.operator_ref, cluster.workdir)
            extra_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH", "")]))
            log(f"operator from {args.operator_ref} ({src})")
        prom_args: list[str] = []
        if args.metrics_source == "prometheus":
            self.prometheus = Prometheus(cluster.workdir, self.fleet, self.tei_server.address, args.interval)
            prom_args = ["--prometheus-url", self.prometheus.url]
        if args.idle:
            prom_args += self._start_activator(cluster)
        if args.distinct_models:
            self._start_store(cluster)
        self._start_operators(cluster, identity, redirect, extra_env, prom_args)

        finisher = ThreadPoolExecutor(max_workers=args.finish_concurrency, thread_name_prefix="finish")
        def finish(pod: dict[str, Any]) -> None:
            finisher.submit(self._finish, pod)

        def finish_shared(pod: dict[str, Any]) -> None:
            finisher.submit(self._finish_shared, pod)

        watches = Watches(api, self.fleet, finish, idle=args.idle,
                          finish_shared=finish_shared if args.distinct_models else None)
        watches.start()
        try:
            self._bring_up(namespaces)
            if args.idle:
                self._to_zero()
            self._steady_state()
            if args.distinct_models and args.late_models:
                self._late_tenants(namespaces)
            if args.idle:
                self._idle_end()
                self._wake()
            if args.replicas == 2 and self.result.get("failover") is None:
                self._failover()
        finally:
            watches.stop.set()
            finisher.shutdown(wait=False, cancel_futures=True)
        self.result["checks"] = self._checks()
        return self.result

    def _start_operators(self, cluster: Cluster, identity: op.Identity, redirect: Path, extra_env: dict[str, str],
                         prom_args: list[str]) -> None:
        args = self.args
        launcher = ["-m", "rerank_devcluster.scrape_redirect", str(redirect)]
        election = ["--leader-election", "--leader-election-namespace", LEASE_NS,
                    "--leader-election-id", LEASE_NAME] if args.replicas == 2 else []
        for i in range(args.replicas):
            proc = op.OperatorProcess(cluster, identity, [], launcher=launcher, extra_env=extra_env,
                                      extra_args=[*prom_args, *election], resync_seconds=args.resync_seconds,
                                      name=f"fleet-{i}", start_timeout=60)
            try:
                proc.start()
            except AssertionError as exc:
                if not election:
                    raise
                text = str(exc).splitlines()
                self.result["failover"] = {"error": "the operator rejected the leader-election flags",
                                           "detail": "\n".join(text[-3:])[-600:]}
                log("the operator rejected --leader-election: going on with one replica, no failover measured")
                for r in self.replicas:
                    r.process.stop()
                self.replicas = [Replica(op.OperatorProcess(
                    cluster, identity, [], launcher=launcher, extra_env=extra_env, extra_args=prom_args,
                    resync_seconds=args.resync_seconds, name="fleet-0", start_timeout=60).start())]
                return
            self.replicas.append(Replica(proc))
        log(f"{len(self.replicas)} operator process(es) up: pids {[r.process.pid for r in self.replicas]}")

    def _default_service_accounts(self) -> int:
        out = self.api.ok("GET", "/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault")
        return sum(1 for sa in out["items"] if sa["metadata"]["namespace"].startswith(NS_PREFIX))

    # -- checks ------------------------------------------------------------------------------------------------------
    def _checks(self) -> dict[str, Any]:
        jobs = self.api.ok("GET", f"/apis/batch/v1/jobs?labelSelector={COMPONENT_LABEL}%3Dquantizer")["items"]
        per_artifact: Counter[tuple[str, str, str]] = Counter()
        for job in jobs:
            key = owner_key(job)
            if key:
                per_artifact[(*key, job["metadata"]["labels"].get(op.ARTIFACT_LABEL, ""))] += 1
        models_with_jobs = {(ns, name) for ns, name, _ in per_artifact}
        shared = {}
        if self.registry is not None:
            shared = {"artifacts": len(oci.Registry(self.registry.host, insecure=True).tags(STORE_REPOSITORY)),
                      "shared_jobs": sum(1 for j in jobs if (j["metadata"].get("labels") or {}).get(SHARED_LABEL))}
        return {**shared,
            "models_ready": self.fleet.ready_count(),
            "models": len(getattr(self, "keys", [])),
            "jobs": len(jobs),
            # Shared artifacts: a model has no Job of its own by design.
            **({} if self.registry else {"models_without_job": len(set(getattr(self, "keys", [])) - models_with_jobs)}),
            "artifacts_with_more_than_one_job": sum(1 for n in per_artifact.values() if n > 1),
            "one_job_per_artifact": all(n == 1 for n in per_artifact.values()),
        }
