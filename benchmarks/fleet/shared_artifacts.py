"""Shared artifacts (--distinct-models K): the store (a real distribution registry) and its RerankClass, each shared
Job's quantizer played here (a small artifact pushed with the quantizer's own push code), and late tenants arriving
one at a time into the running fleet: apply -> Ready when their artifact is already in the store."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rerank_contracts import oci, shared_store
from rerank_devcluster import operator_process as op
from rerank_devcluster.cluster import Cluster, finished_pod_status
from rerank_devcluster.processes import Processes
from rerank_devcluster.registry import LocalRegistry

from .harness import Harness
from .manifests import SHARED_CLASS, STORE_NS, STORE_REPOSITORY, model_manifest
from .report import log, quantiles


class SharedArtifacts(Harness):
    """N models asking for K artifacts: the store, its Jobs' quantizers, and the late tenants' time to Ready."""

    def _start_store(self, cluster: Cluster) -> None:
        """--distinct-models: the store (a distribution registry with deletes on), its namespace and the class."""
        root = cluster.workdir / "store"
        root.mkdir(exist_ok=True)
        self.registry = LocalRegistry(Processes(logs_dir=cluster.logs_dir, cwd=root), root, delete=True).start(
            time.monotonic() + 30)
        op.kubectl_apply(cluster, [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STORE_NS}},
            {"apiVersion": f"{op.GROUP}/{op.VERSION}", "kind": "RerankClass", "metadata": {"name": SHARED_CLASS},
             "spec": {"artifactStore": {"repository": f"{self.registry.host}/{STORE_REPOSITORY}",
                                        "namespace": STORE_NS, "insecure": True}}}])
        log(f"artifact store at {self.registry.host}/{STORE_REPOSITORY} (class {SHARED_CLASS})")

    def _finish_shared(self, pod: dict[str, Any]) -> None:
        """A shared Job's quantizer: push its artifact to the store, then end the pod with the result."""
        assert self.registry is not None
        meta = pod["metadata"]
        artifact_id = meta["labels"][op.ARTIFACT_LABEL]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                ref = shared_store.push(op.shared_artifact(Path(tmp), artifact_id), STORE_REPOSITORY, artifact_id,
                                 registry=oci.Registry(self.registry.host, insecure=True), scratch=Path(tmp) / "s")
            self.api.ok("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        finished_pod_status(pod, 0, op.published_shared(artifact_id, ref)),
                        "application/merge-patch+json")
        except (RuntimeError, OSError) as exc:
            with self.fleet.lock:
                self.fleet.finish_errors += 1
                self.fleet.finishing.discard(meta["uid"])
            log(f"finishing shared {meta['namespace']}/{meta['name']} failed: {exc}")

    def _late_tenants(self, namespaces: list[str]) -> None:
        """--distinct-models: tenants arriving one at a time into the running fleet (``--late-models``, one every
        ``--late-interval`` seconds), each asking for a model whose artifact the store holds: apply -> Ready."""
        args, fleet = self.args, self.fleet
        keys = [(namespaces[i % len(namespaces)], f"m-late-{i:05d}") for i in range(args.late_models)]
        log(f"late tenants: {len(keys)} models, one every {args.late_interval:g}s")
        for key in keys:
            self.api.ok("POST", f"/apis/{op.GROUP}/{op.VERSION}/namespaces/{key[0]}/{op.PLURAL}",
                        model_manifest(key[1], key[0], args))
            with fleet.lock:
                fleet.applied[key] = time.monotonic()
            time.sleep(args.late_interval)
        self._wait(lambda: all(fleet.ready_now.get(k) for k in keys), args.timeout, "every late tenant Ready")
        with fleet.lock:
            took = [fleet.first_ready[k] - fleet.applied[k] for k in keys if k in fleet.first_ready]
        self.result["ready_after_first_s"] = {
            **quantiles(took), "models": len(keys), "ready": len(took), "interval_s": args.late_interval,
            "method": "tenants applied one at a time into the running fleet, their artifact in the store: the "
                      "create call returned -> Ready seen on this process's watch"}
        log(f"late tenants: {json.dumps(self.result['ready_after_first_s'])}")
        self.keys = [*self.keys, *keys]
