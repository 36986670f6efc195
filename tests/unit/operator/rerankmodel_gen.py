"""Test fixtures for RerankModel objects, built from modifier functions (cert-manager's test/unit/gen style).

    model(revision("v2"), replicas("cpu", 3))

and a tiny in-memory "API server" that applies what a plan writes the way a real one would (keeping the stamped
manifest, adding defaults and a status), so tests can check that a second plan over the result writes nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import names
from rerank_operator.core.reconcile.observed import Observed
from rerank_operator.core.reconcile.plan import Plan
from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import parse as spec_parse

Mod = Callable[[dict[str, Any]], None]

BASE: dict[str, Any] = {
    "apiVersion": "rerank.io/v1alpha1",
    "kind": "RerankModel",
    "metadata": {"name": "bge-m3", "namespace": "search", "uid": "0b1c-uid", "generation": 1},
    "spec": {
        "model": {"id": "BAAI/bge-reranker-v2-m3", "revision": "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e",
                  "tokenSecretRef": {"name": "hf", "key": "token"}},
        "pools": {
            "cpu": {"minReplicas": 1, "maxReplicas": 8},
            "gpu": {"minReplicas": 1, "maxReplicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}},
        },
        "autoscaling": {"enabled": False},
    },
}


def _at(obj: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    *parents, leaf = path.split(".")
    for key in parents:
        obj = obj.setdefault(key, {})
    return obj, leaf


def set_(path: str, value: Any) -> Mod:
    """Set ``spec.<path>`` (dotted)."""
    def mod(body: dict[str, Any]) -> None:
        parent, leaf = _at(body["spec"], path)
        parent[leaf] = copy.deepcopy(value)
    return mod


def without(path: str) -> Mod:
    def mod(body: dict[str, Any]) -> None:
        parent, leaf = _at(body["spec"], path)
        parent.pop(leaf, None)
    return mod


def generation(n: int) -> Mod:
    return lambda body: body["metadata"].__setitem__("generation", n)


def revision(rev: str) -> Mod:
    return set_("model.revision", rev)


def replicas(pool: str, n: int) -> Mod:
    return set_(f"pools.{pool}.minReplicas", n)


def model(*mods: Mod) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    for mod in mods:
        mod(body)
    return body


def spec_of(body: dict[str, Any]) -> specs.RerankModelSpec:
    return spec_parse.parse(body["spec"])


def owner_of(body: dict[str, Any]) -> names.Owner:
    meta = body["metadata"]
    return names.Owner(meta["name"], meta["namespace"], meta["uid"], meta["generation"])


# --- the Job's side of the contract ------------------------------------------------------------------------------

def published(artifact_id: str, **overrides: Any) -> str:
    result = quantize_job.JobResult(
        ok=True, reason="Published", message="published", artifact_id=artifact_id,
        path=artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, artifact_id), manifest_sha256="ab" * 32,
        size_bytes=581_000_000, quality={"spearman": 0.995, "topk_agreement": 0.97},
        speed={"fp32_pairs_per_s": 40.0, "int8_pairs_per_s": 120.0, "speedup": 3.0}, recipe={"per_channel": True},
    )
    for key, value in overrides.items():
        setattr(result, key, value)
    return result.to_message()


def refused(reason: str, message: str) -> str:
    return quantize_job.JobResult(ok=False, reason=reason, message=message).to_message()


def job_pod(job: dict[str, Any], exit_code: int, message: str, created: str = "2025-01-01T00:00:00Z") -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": job["metadata"]["name"] + "-x1", "namespace": job["metadata"]["namespace"],
                     "creationTimestamp": created,
                     "ownerReferences": [{"uid": job["metadata"]["uid"], "kind": "Job", "controller": True}]},
        "status": {"phase": "Succeeded" if exit_code == 0 else "Failed", "containerStatuses": [{
            "name": "quantizer",
            "state": {"terminated": {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                     "message": message}}}]},
    }


def finish(job: dict[str, Any], ok: bool) -> dict[str, Any]:
    done = copy.deepcopy(job)
    kind = "Complete" if ok else "Failed"
    done["status"] = {"conditions": [{"type": kind, "status": "True",
                                      "reason": "BackoffLimitExceeded" if not ok else ""}],
                      "succeeded" if ok else "failed": 1}
    return done


def _role(deployment: dict[str, Any]) -> str:
    """As the real observer keys a model's Deployments: by pool, the quality guard's by its component."""
    labels = deployment["metadata"]["labels"]
    return str(labels.get(names.LABEL_POOL) or labels[names.LABEL_COMPONENT])


# --- a minimal in-memory API server -------------------------------------------------------------------------------

class FakeWorld:
    """Holds live objects; ``run(plan)`` writes them as the API server would; ``observed()`` reads them back."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.writes = 0
        self._uid = 0

    def _live(self, obj: dict[str, Any]) -> dict[str, Any]:
        live = copy.deepcopy(obj)
        live["metadata"].setdefault("uid", f"uid-{self._uid}")
        live["metadata"]["generation"] = live["metadata"].get("generation", 0) + 1
        self._uid += 1
        # Defaults the API server adds: they must not count as drift.
        if obj["kind"] == "Service":
            live["spec"]["clusterIP"] = "10.0.0.1"
            live["spec"]["sessionAffinity"] = "None"
        if obj["kind"] == "Deployment":
            for c in live["spec"]["template"]["spec"]["containers"]:
                c["imagePullPolicy"] = "IfNotPresent"
                c.setdefault("resources", {})
            live["spec"].setdefault("replicas", 1)
            want = live["spec"]["replicas"]
            live["status"] = {"observedGeneration": live["metadata"]["generation"], "replicas": want,
                              "readyReplicas": want, "availableReplicas": want, "updatedReplicas": want}
        return live

    def run(self, plan: Plan) -> None:
        for obj in list(plan.apply) + list(plan.create):
            key = (obj["kind"], obj["metadata"]["name"])
            previous = self.objects.get(key)
            live = self._live(obj)
            if previous is not None:
                live["metadata"]["uid"] = previous["metadata"]["uid"]
                live["metadata"]["generation"] = previous["metadata"]["generation"] + 1
                if "status" in live:
                    live["status"]["observedGeneration"] = live["metadata"]["generation"]
            self.objects[key] = live
            self.writes += 1
        for scale in plan.scale:  # the scale subresource: only replicas change (and the status follows)
            dep = self.objects.get(("Deployment", scale.name))
            if dep is not None:
                dep["spec"]["replicas"] = scale.replicas
                dep["status"].update({"replicas": scale.replicas, "readyReplicas": scale.replicas,
                                      "availableReplicas": scale.replicas, "updatedReplicas": scale.replicas})
            self.writes += 1
        for ref in plan.delete:
            self.objects.pop((ref.kind, ref.name), None)
            self.writes += 1

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for (k, _), o in sorted(self.objects.items()) if k == kind]

    def observed(self) -> Observed:
        return Observed(
            claim=next(iter(self.of_kind("PersistentVolumeClaim")), None),
            jobs=tuple(self.of_kind("Job")),
            job_pods=tuple(self.of_kind("Pod")),
            deployments={_role(d): d for d in self.of_kind("Deployment")},
            services={s["metadata"]["name"]: s for s in self.of_kind("Service")},
            route=next(iter(self.of_kind("HTTPRoute")), None),
        )
