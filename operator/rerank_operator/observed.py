"""What one reconcile saw of the world: plain data handed from the API layer to the pure functions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from . import names

Obj = dict[str, Any]


@dataclass(frozen=True)
class ObjectRef:
    """Enough to address any object through the generic REST layer."""

    api_version: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def ref_of(obj: Mapping[str, Any]) -> ObjectRef:
    meta = obj["metadata"]
    return ObjectRef(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


@dataclass(frozen=True)
class Observed:
    """Children of one RerankModel as last read (None or empty: absent)."""

    claim: Obj | None = None
    jobs: tuple[Obj, ...] = ()
    job_pods: tuple[Obj, ...] = ()
    deployments: Mapping[str, Obj] = field(default_factory=dict)  # by pool name
    services: Mapping[str, Obj] = field(default_factory=dict)  # by Service name
    route: Obj | None = None
    route_api_available: bool = True

    def pods_of(self, job: Mapping[str, Any]) -> list[Obj]:
        uid = job["metadata"].get("uid")
        return [
            p for p in self.job_pods
            if any(ref.get("uid") == uid for ref in p["metadata"].get("ownerReferences") or ())
        ]

    def live(self, obj: Mapping[str, Any]) -> Obj | None:
        """The live counterpart of a desired object, if it was seen."""
        kind, name = obj["kind"], obj["metadata"]["name"]
        if kind == "PersistentVolumeClaim":
            return self.claim
        if kind == "Deployment":
            return next((d for d in self.deployments.values() if d["metadata"]["name"] == name), None)
        if kind == "Service":
            return self.services.get(name)
        if kind == "HTTPRoute":
            return self.route
        if kind == "Job":
            return next((j for j in self.jobs if j["metadata"]["name"] == name), None)
        return None

    def ready(self, pool: names.PoolName) -> int:
        dep = self.deployments.get(pool)
        return int((dep or {}).get("status", {}).get("readyReplicas") or 0)
