"""Readiness as an ordered chain of named, pure checks; the first that fails gives the Ready condition's reason.

Order matters: it is the order in which a user would fix things (a child that cannot be written hides everything
after it; no artifact means no pools to roll out). Ready=True means the cluster serves exactly what the current
spec asks for: the desired artifact, fully rolled out and available. A pool still serving the previous artifact
keeps clients happy but is not Ready for the new generation, which is what kstatus and ``kubectl wait`` need.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rerank_operator.core import gateway
from rerank_operator.core.builders import deployment
from rerank_operator.core.reconcile.observed import Observed
from rerank_operator.core.reconcile.plan import Plan
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status import conditions


@dataclass(frozen=True)
class Facts:
    """What one reconcile acted on (``status.World``): the parsed spec, the children it observed, its plan, and the
    writes that were refused (quota refusals excluded)."""

    spec: RerankModelSpec
    observed: Observed
    plan: Plan
    apply_errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    reason: str
    message: str


Check = Callable[[Facts], Verdict | None]


def children_applied(f: Facts) -> Verdict | None:
    if f.apply_errors:
        return Verdict(conditions.REASON_APPLY_FAILED, "; ".join(f.apply_errors))
    return None


def storage_available(f: Facts) -> Verdict | None:
    claim = f.observed.claim
    if f.spec.storage.existing_claim and claim is None:
        return Verdict(conditions.REASON_CLAIM_NOT_FOUND, f"PersistentVolumeClaim {f.spec.storage.existing_claim} "
                                        "(storage.existingClaim) does not exist")
    if claim is not None and claim.get("status", {}).get("phase") == "Lost":
        return Verdict(conditions.REASON_CLAIM_LOST, f"PersistentVolumeClaim {f.plan.claim} lost its volume")
    return None


def artifact_published(f: Facts) -> Verdict | None:
    pending = f.plan.artifact.pending
    if pending is None:
        return None
    if pending.state == "Failed":
        return Verdict(pending.reason, f"quantization Job {pending.job} failed: {pending.message}")
    if pending.state in ("Canary", "RolledBack") or not pending.job:  # no Job (yet): its own words
        return Verdict(pending.reason, pending.message)
    return Verdict(pending.reason, f"building artifact {pending.id} with Job {pending.job} "
                                   f"(attempt {pending.attempts}): {pending.message}")


def _rollout_gap(pool: str, live: Mapping[str, Any] | None, want_artifact: str | None) -> str | None:
    if live is None:
        return f"{pool} pool Deployment not created yet"
    status = live.get("status", {})
    if status.get("observedGeneration", 0) < live["metadata"].get("generation", 0):
        return f"{pool} pool: Deployment change not yet observed"
    if want_artifact is not None and deployment.served_artifact(live) != want_artifact:
        return f"{pool} pool still serves artifact {deployment.served_artifact(live)}"
    wanted = live.get("spec", {}).get("replicas", 1)
    updated = status.get("updatedReplicas", 0)
    if updated < wanted or status.get("replicas", 0) > wanted:
        return f"{pool} pool: {updated}/{wanted} replicas updated"
    return None


def pools_rolled_out(f: Facts) -> Verdict | None:
    if not f.plan.pools_deployed:
        return Verdict(conditions.REASON_AWAITING_ARTIFACT, "the pools start once the first artifact is published")
    changing = sorted({o["metadata"]["name"] for o in f.plan.apply if o["kind"] == "Deployment"})
    if changing:
        return Verdict(conditions.REASON_ROLLING_OUT, f"updating Deployment(s) {', '.join(changing)}")
    gaps = [g for p in f.spec.enabled_pools
            if (g := _rollout_gap(p.name, f.observed.deployments.get(p.name), f.plan.serving_artifact))]
    return Verdict(conditions.REASON_ROLLING_OUT, "; ".join(gaps)) if gaps else None


def artifact_fetched(f: Facts) -> Verdict | None:
    """A shared artifact the pods could not fetch (a checksum that does not match refuses to serve), or a node whose
    CPU cannot serve the artifact's target: the init container's own reason, so a tampered store reads as
    ChecksumMismatch and an AVX2 node under a VNNI artifact as ArtifactTargetMismatch, not as pods merely slow."""
    if not f.observed.fetch_failures:
        return None
    first = f.observed.fetch_failures[0]
    said = first.split(": ", 2)[1] if first.count(": ") >= 2 else ""
    known = (conditions.REASON_CHECKSUM_MISMATCH, conditions.REASON_REGISTRY_UNAVAILABLE,
             conditions.REASON_ARTIFACT_TARGET_MISMATCH)
    reason = said if said in known else conditions.REASON_ARTIFACT_FETCH_FAILED
    return Verdict(reason, "; ".join(f.observed.fetch_failures))


def pools_available(f: Facts) -> Verdict | None:
    # A pool this very reconcile scales wants its new count: the observed Deployment still shows the old one, and
    # Ready must not be True for the new generation before its replicas are (the next reconcile sees the rest).
    # A model routed to the activator (going to, at or waking from zero) serves through it, whatever its pools have.
    if f.plan.zero is not None:
        return None
    scaled = {s.name: s.replicas for s in f.plan.scale}
    short = []
    for pool in f.spec.enabled_pools:
        live = f.observed.deployments.get(pool.name) or {}
        wanted = scaled.get(live.get("metadata", {}).get("name", ""), live.get("spec", {}).get("replicas", 1))
        ready = live.get("status", {}).get("readyReplicas", 0) or 0
        available = live.get("status", {}).get("availableReplicas", 0) or 0
        if min(ready, available) < wanted:
            short.append(f"{pool.name} {ready}/{wanted} ready")
    return Verdict(conditions.REASON_REPLICAS_UNAVAILABLE, ", ".join(short)) if short else None


def route_accepted(f: Facts) -> Verdict | None:
    """A parent Gateway that refused the model's route serves none of its requests. A route no Gateway has reported
    on is not held against the model: a cluster may have no controller for it yet (RouteAccepted says so)."""
    if f.spec.routing.gateway is None or not f.plan.pools_deployed:
        return None
    verdict = gateway.route_verdict(f.observed.route, gateway.parent_refs(f.spec.routing.gateway.parent_refs,
                                                                          _namespace(f)))
    return Verdict(verdict.reason, verdict.message) if verdict.state == "refused" else None


def _namespace(f: Facts) -> str:
    return str(((f.observed.route or {}).get("metadata") or {}).get("namespace") or "")


CHAIN: Sequence[tuple[str, Check]] = (
    ("children-applied", children_applied),
    ("route-accepted", route_accepted),
    ("storage-available", storage_available),
    ("artifact-published", artifact_published),
    ("pools-rolled-out", pools_rolled_out),
    ("artifact-fetched", artifact_fetched),
    ("pools-available", pools_available),
)


def evaluate(facts: Facts, chain: Sequence[tuple[str, Check]] = CHAIN) -> tuple[bool, Verdict]:
    """(ready, verdict): the first failing check's verdict, or a Serving verdict describing what serves."""
    for _name, check in chain:
        verdict = check(facts)
        if verdict is not None:
            return False, verdict
    served = facts.plan.serving_artifact
    pools = ", ".join(f"{p.name} {facts.observed.ready(p.name)}" for p in facts.spec.enabled_pools)
    what = f"artifact {served}" if served else facts.spec.model.display
    t = facts.plan.traffic
    if facts.plan.zero is not None:
        return True, Verdict(conditions.REASON_SCALED_TO_ZERO, f"{facts.plan.zero}: the activator holds requests and "
                             f"wakes the model; serving {what}; ready replicas: {pools}")
    return True, Verdict(conditions.REASON_SERVING, f"serving {what}; ready replicas: {pools}; "
                                    f"traffic gpu {t.gpu_percent}% / cpu {t.cpu_percent}%")
