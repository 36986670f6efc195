"""What one reconcile saw of the world: plain data handed from the API layer to the pure functions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.gateway import GatewayView

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


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """``obj``'s controller is the object with ``uid``: the one ownership filter (a look-alike with the same labels
    but another owner, or a mere non-controller reference, is never ours)."""
    return any(r.get("uid") == uid and r.get("controller") for r in obj["metadata"].get("ownerReferences") or ())


def owned_pods(pods: Iterable[Obj], deployments: Iterable[Mapping[str, Any]],
               replica_sets: Iterable[Mapping[str, Any]]) -> tuple[list[Obj], list[Obj]]:
    """``pods`` split into those whose owner chain leads to one of ``deployments`` (controller ReplicaSet, whose
    controller is that Deployment) and the rest. Why: pool and guard pods are found by labels, and a tenant who may
    create pods can give any pod those labels; what such a pod serves on /metrics must never scale a pool or carry a
    verdict. A ReplicaSet forged to claim one of our Deployments is itself scaled away by the Deployment controller
    (its template is not the Deployment's), taking its pods with it."""
    ours = {d["metadata"].get("uid") for d in deployments} - {None}
    sets = {r["metadata"].get("uid") for r in replica_sets
            if any(controlled_by(r, uid) for uid in ours)} - {None}
    trusted: list[Obj] = []
    foreign: list[Obj] = []
    for pod in pods:
        (trusted if any(controlled_by(pod, uid) for uid in sets) else foreign).append(pod)
    return trusted, foreign


def pool_deployments(deployments: Iterable[Obj], model: str) -> dict[str, Obj]:
    """A model's Deployments by pool name (``cpu``, ``gpu``), the quality guard's by its component. Only those of
    the names the operator gives them: a tenant who may create Deployments can forge a controller reference to its
    model and the labels of a pool; such a Deployment must not stand in for the pool, nor make its pods "owned"."""
    ours = {names.deployment_name(model, "cpu"), names.deployment_name(model, "gpu"), names.canary_name(model),
            names.guard_name(model)}
    found: dict[str, Obj] = {}
    for d in deployments:
        if d["metadata"].get("name") not in ours:
            continue
        labels = d["metadata"].get("labels") or {}
        found[labels.get(names.LABEL_POOL) or labels.get(names.LABEL_COMPONENT, "")] = d
    return found


def short_of_replicas(deployments: Iterable[Mapping[str, Any]]) -> bool:
    """Some pool has fewer ready replicas than it wants: only then are its ReplicaSets read (for a quota's
    ReplicaFailure)."""
    return any(int(d.get("status", {}).get("readyReplicas") or 0) < int(d.get("spec", {}).get("replicas") or 0)
               for d in deployments)


@dataclass(frozen=True)
class Observed:
    """Children of one RerankModel as last read (None or empty: absent)."""

    claim: Obj | None = None
    jobs: tuple[Obj, ...] = ()
    job_pods: tuple[Obj, ...] = ()
    deployments: Mapping[str, Obj] = field(default_factory=dict)  # by pool name; the guard's by "quality-guard"
    services: Mapping[str, Obj] = field(default_factory=dict)  # by Service name
    route: Obj | None = None
    route_api_available: bool = True
    network_policy: Obj | None = None  # <name>-tei, when this model controls it
    replica_sets: tuple[Obj, ...] = ()  # of the pool Deployments; read only while a pool is short of replicas
    job_events: tuple[Obj, ...] = ()  # FailedCreate Events of Jobs; read only while a Job has no pod
    #: What the pools' fetch init containers said when they failed to get a shared artifact (``fetch.failures``);
    #: read only while a pool is short of replicas.
    fetch_failures: tuple[str, ...] = ()
    #: The parent Gateways the model's routing names, with what their classes support (``core/gateway.py``).
    gateways: tuple[GatewayView, ...] = ()

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
        if kind == "NetworkPolicy":
            return self.network_policy
        return None

    def ready(self, pool: names.PoolName) -> int:
        dep = self.deployments.get(pool)
        return int((dep or {}).get("status", {}).get("readyReplicas") or 0)


@dataclass(frozen=True)
class PoolsView:
    """What the autoscaler reads each tick: the pool Deployments (by pool), their pods, and the HTTPRoute."""

    deployments: Mapping[str, Obj] = field(default_factory=dict)
    pods: tuple[Obj, ...] = ()
    route: Obj | None = None
    route_api_available: bool = True
    #: Pods carrying the model's pool or guard labels whose owner chain does not lead to its Deployments
    #: (``owned_pods``): never scraped, only counted.
    foreign_pods: tuple[str, ...] = ()

    def ready(self, pool: names.PoolName) -> int:
        return int((self.deployments.get(pool) or {}).get("status", {}).get("readyReplicas") or 0)

    def replicas(self, pool: names.PoolName) -> int | None:
        """The Deployment's spec.replicas (None: no Deployment)."""
        dep = self.deployments.get(pool)
        return None if dep is None else int(dep.get("spec", {}).get("replicas", 1))

    def billable(self, pool: names.PoolName) -> int:
        """Pods the pool's Deployment has now, ready or starting (``status.replicas``): what a cloud bills."""
        return int((self.deployments.get(pool) or {}).get("status", {}).get("replicas") or 0)

    def ready_pods(self, pool: names.PoolName) -> list[Obj]:
        """Pods of ``pool`` that are Ready and have an address (what can be scraped). Never a pod on the host's
        network: the operator's pods never are, and a look-alike pod a tenant labels so would make the operator
        scrape a node address (tenants cannot choose where the operator sends requests)."""
        return [p for p in self.pods
                if p["metadata"].get("labels", {}).get(names.LABEL_POOL) == pool and _scrapable(p)]

    def guard_pods(self) -> list[Obj]:
        """The quality guard's Ready pods (``builders/guard.py``), on the same terms as ``ready_pods``."""
        return [p for p in self.pods
                if p["metadata"].get("labels", {}).get(names.LABEL_COMPONENT) == names.COMPONENT_GUARD
                and not p["metadata"].get("labels", {}).get(names.LABEL_POOL) and _scrapable(p)]


def _scrapable(pod: Obj) -> bool:
    return bool(pod.get("status", {}).get("podIP")) and not (pod.get("spec") or {}).get("hostNetwork") and any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in pod.get("status", {}).get("conditions") or ())
