"""The plan: from (spec, what was observed, last status) to what must be written. Pure.

The artifact decision comes first because everything else follows from it (``artifact_decision.py``): the pools
serve the served artifact, and a new one only once it is published (or as a canary).
Jobs for artifacts that are neither desired nor served are deleted (a superseded build is wasted work); the pools
keep serving the served artifact until the desired one is published.
Objects that already match (``drift.needs_apply``) are left out, so a reconcile with nothing to change plans no
writes at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rerank_operator.core import gateway, names, platform
from rerank_operator.core.artifacts import job_outcome, sharing
from rerank_operator.core.artifacts.decision import (
    DEFAULT_BACKOFF,
    ArtifactDecision,
    decide_artifact,
    jobs_for,
    max_input_tokens,
)
from rerank_operator.core.autoscale import split as splits
from rerank_operator.core.autoscale import zero as zeros
from rerank_operator.core.autoscale.recorded import RecordedDecision
from rerank_operator.core.builders import activator as activators
from rerank_operator.core.builders import cpu_check, deployment, guard, pods, routing, service, storage
from rerank_operator.core.builders import fetch as fetching
from rerank_operator.core.builders import sampler as sampling
from rerank_operator.core.quality import assessment as quality
from rerank_operator.core.quality import canary as canaries
from rerank_operator.core.quality import guard_policy, requantize
from rerank_operator.core.reconcile import drift
from rerank_operator.core.reconcile.observed import Obj, ObjectRef, Observed, ref_of
from rerank_operator.core.spec.model import RerankModelSpec

DEFAULT_DEPLOYMENT_REPLICAS = 1  # what the API server gives a Deployment created without replicas


@dataclass(frozen=True)
class Scale:
    """A pool Deployment's replicas, written through its scale subresource (never part of the applied manifest,
    so handing replicas to an HPA, or taking them back, never resets them). ``exists``: the Deployment was seen;
    otherwise it is scaled right after this plan creates it."""

    namespace: str
    name: str
    replicas: int
    exists: bool


@dataclass(frozen=True)
class Plan:
    apply: tuple[Obj, ...] = ()  # server-side apply, already stamped; only objects that drifted
    create: tuple[Obj, ...] = ()  # create-only (Jobs: their template is immutable)
    delete: tuple[ObjectRef, ...] = ()
    artifact: ArtifactDecision = field(default_factory=lambda: ArtifactDecision(None, None))
    serving_artifact: str | None = None  # what the pool Deployments serve (None: the source, or nothing yet)
    pools_deployed: bool = False  # whether the plan has Deployments at all (no artifact yet: not)
    replicas: Mapping[str, int | None] = field(default_factory=dict)  # per enabled pool; None = left to others
    traffic: routing.Traffic = field(default_factory=lambda: routing.Traffic(0, 0, ""))
    claim: str = ""
    scale: tuple[Scale, ...] = ()  # replicas that differ from the live Deployments' (operator-managed only)
    zero: str | None = None  # the scale-to-zero phase the route follows (``builders/activator.py``); None: none
    # Written once per process and namespace, not compared with the cluster: the ReferenceGrant in the activator's
    # namespace that lets this namespace's routes name its Service (``activator.build_reference_grant``).
    grants: tuple[Obj, ...] = ()
    #: What the model's gateway lacks and what the plan did instead (the GatewayFeatures condition's message).
    gateway_notes: tuple[str, ...] = ()

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.create) + len(self.delete) + len(self.scale)


_NO_TIMEOUT = (f"a parent Gateway does not list {gateway.REQUEST_TIMEOUT}: the route to the activator carries no "
               f"request timeout, so the gateway's own applies (it must outlast the activator's hold)")


def _timeout_allowed(observed: Observed) -> bool:
    """The activator's route timeout, unless a parent Gateway publishes features without it (an unknown list keeps
    it: a gateway ignores a field it lacks, or refuses the route, which RouteAccepted then says)."""
    return gateway.support(observed.gateways, gateway.REQUEST_TIMEOUT) != "unsupported"


def _obsolete_jobs(observed: Observed, decision: ArtifactDecision) -> list[ObjectRef]:
    """Jobs of artifacts neither desired nor served, and older attempts of those that are."""
    keep: set[str] = set()
    for artifact_id in (decision.desired_id, (decision.served or {}).get("id")):
        jobs = jobs_for(observed, artifact_id) if artifact_id else []
        if jobs:
            keep.add(jobs[-1]["metadata"]["name"])
    return [ref_of({**j, "apiVersion": "batch/v1", "kind": "Job"}) for j in observed.jobs
            if j["metadata"]["name"] not in keep and not j["metadata"].get("deletionTimestamp")]


def _fetch(record: Mapping[str, Any] | None, store: platform.ArtifactStore | None,
           image: str) -> fetching.Fetch | None:
    """How the pods get a shared artifact record (None: a built one, on the claim): as the record says (records
    written before it kept the registry's settings: as the class's store says)."""
    if not sharing.is_shared(record):
        return None
    assert record is not None
    insecure = record["insecure"] if "insecure" in record else bool(store and store.insecure)
    pull = record.get("pullSecret", store.pull_secret if store is not None else None)
    return fetching.Fetch(ref=str(record["ref"]), manifest_sha256=str(record.get("manifestSha256") or ""),
                          image=image, insecure=bool(insecure), pull_secret=str(pull) if pull else None)


def _replicas(spec: RerankModelSpec, pool: names.PoolName, decision: RecordedDecision | None) -> int | None:
    p = spec.pool(pool)
    auto = spec.autoscaling
    if not auto.enabled:
        return p.min_replicas
    if auto.replica_management == "external":
        return None
    decided = decision.replicas.get(pool) if decision is not None else None
    if decided is not None:
        return max(p.min_replicas, min(p.max_replicas, decided))
    # A model that may go to zero starts awake, on one replica of the pool a request wakes (``zero.awake_bounds``).
    return max(p.min_replicas, int(spec.scales_to_zero and pool == names.wake_pool(spec.cpu.enabled)))


def _scale(owner: names.Owner, pool: names.PoolName, replicas: int | None, live: Obj | None) -> Scale | None:
    """The scale write that brings the pool's Deployment to ``replicas`` (None: another controller's business)."""
    if replicas is None or (live is not None and live["metadata"].get("deletionTimestamp")):
        return None
    current = int((live or {}).get("spec", {}).get("replicas", DEFAULT_DEPLOYMENT_REPLICAS))
    if current == replicas:
        return None
    return Scale(owner.namespace, names.deployment_name(owner.name, pool), replicas, exists=live is not None)


def _autoscaler_decision(spec: RerankModelSpec, status: Mapping[str, Any]) -> RecordedDecision | None:
    return RecordedDecision.from_status(status) if spec.autoscaling.enabled else None


def _leftovers(owner: names.Owner, observed: Observed, role: str, name: str) -> list[ObjectRef]:
    """The Deployment (observed under ``role``) and Service ``name`` of a companion that is no longer wanted: the
    quality guard once the model is not guarded, the canary once it is promoted or rolled back."""
    found = []
    live = observed.deployments.get(role)
    if live is not None and not live["metadata"].get("deletionTimestamp"):
        found.append(ObjectRef("apps/v1", "Deployment", owner.namespace, live["metadata"]["name"]))
    if name in observed.services:
        found.append(ObjectRef("v1", "Service", owner.namespace, name))
    return found


def compute(
    owner: names.Owner, spec: RerankModelSpec, observed: Observed, status: Mapping[str, Any], now: str,
    network_policy: Obj | None = None, guard_settings: platform.GuardSettings | None = None,
    backoff: job_outcome.RetryBackoff = DEFAULT_BACKOFF, pull_secrets: tuple[str, ...] = (),
    activator: platform.Activator | None = None, store: platform.ArtifactStore | None = None,
    shared: sharing.SharedView | None = None, fetcher_image: str = "",
) -> Plan:
    """``network_policy``: the model's NetworkPolicy from its class (classes.network_policy); None deletes it.
    ``guard_settings``: the class's quality guard, when it turns it on (``builders/guard.py``); with it, new
    artifacts go through a canary. ``backoff``: the retry of a Job that failed transiently. ``pull_secrets``: the
    platform's image pull Secrets, on every pod the plan makes (``pods.with_pull_secrets``). ``activator``: the
    platform's (``--activator-*``), where the route of a model going to or at zero points. ``store``: the class's
    artifact store (``sharing.py``), ``shared``: what the operator saw of this spec's id there, ``fetcher_image``:
    the image whose init container fetches a shared artifact into the pods (``builders/fetch.py``)."""
    canary = canaries.policy(spec, guard_settings)
    # After a re-quantization round on drift, the artifact is planned on the live sample (quality/requantize.py).
    decision, new_job = decide_artifact(owner, requantize.effective(spec, status, owner.name), observed, status, now,
                                        canary, backoff, store, shared)
    served_fetch = _fetch(decision.served, store, fetcher_image or spec.quantization.image)
    canary_fetch = _fetch(decision.canary, store, fetcher_image or spec.quantization.image)
    served_check = cpu_check.for_record(decision.served, fetcher_image or spec.quantization.image)
    canary_check = cpu_check.for_record(decision.canary, fetcher_image or spec.quantization.image)
    canary_running = decision.pending is not None and decision.pending.state == "Canary" and decision.canary
    canary_id = str((decision.canary or {}).get("id")) if canary_running else None
    claim = storage.claim_name(owner, spec)
    serving = (decision.served or {}).get("id") if decision.desired_id is not None else None
    pools_deployed = decision.desired_id is None or serving is not None
    autoscaler = _autoscaler_decision(spec, status)
    refused, why_refused = quality.refused_by_artifact(decision.served)
    below_floor = quality.below_floor_of(status) | refused
    traffic = splits.split(spec, observed.ready("gpu"), observed.ready("cpu"), autoscaler, below_floor)
    if why_refused is not None and traffic.gpu_percent == 0 and spec.gpu.enabled:
        traffic = replace(traffic, reason=why_refused)
    guarding = guard_settings if pools_deployed and guard_policy.applies(spec, guard_settings) else None
    # Where the guard's copy of live requests comes from: the route's mirror, or a sampler in the pool pods.
    token = guard.mirror_token(observed.deployments.get(names.COMPONENT_GUARD)) if guarding is not None else ""
    source = guard_policy.sample_source(spec, guarding, observed.gateways) if guarding is not None else None
    mode = source.mode if source is not None else None
    copies = (sampling.Sampling(guard.service_url(owner, names.guard_name(owner.name)), guarding.sample_fraction,
                                token)
              if guarding is not None and mode == "sampler" else None)
    # Every pool pod's front: the rerank API's shapes, and the guard's copies where the route cannot mirror.
    sidecar = sampling.Sidecar(fetcher_image or spec.quantization.image, names.api_model_names(owner, spec.model.id),
                               spec.api.long_documents, copies)

    desired: list[Obj] = []
    # A model whose artifact comes from the store needs no volume of its own (unless one still serves).
    from_store = sharing.store_for(spec, store) is not None and (not decision.served or served_fetch is not None)
    pvc = None if from_store else storage.build_pvc(owner, spec)
    if pvc:
        desired.append(pvc)
    replicas: dict[str, int | None] = {}
    scales: list[Scale] = []
    for pool in spec.enabled_pools:
        replicas[pool.name] = _replicas(spec, pool.name, autoscaler)
        if pools_deployed:
            desired.append(deployment.build_deployment(owner, spec, pool, serving, None, claim,
                                                       max_input_tokens=max_input_tokens(decision.served),
                                                       fetch=served_fetch, sampler=sidecar,
                                                       cpu_check=served_check))
            scale = _scale(owner, pool.name, replicas[pool.name], observed.deployments.get(pool.name))
            if scale:
                scales.append(scale)
            desired.append(service.build_pool_service(owner, pool))
    # What serves (Services, route, NetworkPolicy) comes with the pools: before the first artifact there is nothing
    # to route to, and a burst of new models writes only their claims and Jobs first.
    filters = guard.route_filters(owner, guarding, token) if guarding is not None and mode == "mirror" else []
    canary_share = canary.percent if canary_id and canary else 0
    sleeping = zeros.routing_to(spec, autoscaler, activator)
    if sleeping is not None:  # the activator holds the requests; the guard gets no copy of what the pools never see
        filters = activators.route_filters(owner, spec, sleeping)
    timeout = activators.ROUTE_TIMEOUT if _timeout_allowed(observed) else None
    route = (routing.build_httproute(owner, spec, traffic, filters, canary_share,
                                     *((activators.backends(sleeping), timeout) if sleeping else ()))
             if pools_deployed else None)
    if pools_deployed:
        desired.append(service.build_model_service(owner, traffic.receiving))
        desired.extend(o for o in (route, network_policy) if o is not None)
    if guarding is not None:
        guard_deployment = guard.build_guard_deployment(owner, spec, guarding, below_floor, canary=bool(canary_id),
                                                        claim=claim, artifact_id=serving,
                                                        max_input_tokens=max_input_tokens(decision.served), token=token,
                                                        fetch=served_fetch)
        if sleeping is not None and zeros.recorded_phase(autoscaler) == "asleep":
            guard_deployment["spec"]["replicas"] = 0  # nothing to check at zero: the guard sleeps with the pools
        desired.append(guard_deployment)
        desired.append(guard.build_guard_service(owner))
    if canary_id and pools_deployed:
        desired.append(deployment.build_deployment(owner, spec, spec.cpu, canary_id, 1, claim, canary=True,
                                                   max_input_tokens=max_input_tokens(decision.canary),
                                                   fetch=canary_fetch, sampler=sidecar, cpu_check=canary_check))
        desired.append(service.build_canary_service(owner))

    desired = [pods.with_pull_secrets(d, pull_secrets) for d in desired]
    new_job = pods.with_pull_secrets(new_job, pull_secrets) if new_job else None
    to_apply = tuple(s for s in (drift.stamp(d) for d in desired) if drift.needs_apply(s, observed.live(s)))
    deletes = _obsolete_jobs(observed, decision)
    for pool_name in names.POOLS:
        if spec.pool(pool_name).enabled:
            continue
        live = observed.deployments.get(pool_name)
        if live is not None and not live["metadata"].get("deletionTimestamp"):
            deletes.append(ref_of({**observed.deployments[pool_name], "apiVersion": "apps/v1", "kind": "Deployment"}))
        svc = names.pool_service_name(owner.name, pool_name)
        if svc in observed.services:
            deletes.append(ObjectRef("v1", "Service", owner.namespace, svc))
    if guarding is None:
        deletes.extend(_leftovers(owner, observed, names.COMPONENT_GUARD, names.guard_name(owner.name)))
    if not canary_id:
        deletes.extend(_leftovers(owner, observed, names.COMPONENT_CANARY, names.canary_name(owner.name)))
    live_policy = observed.network_policy
    if network_policy is None and live_policy is not None and not live_policy["metadata"].get("deletionTimestamp"):
        deletes.append(ObjectRef("networking.k8s.io/v1", "NetworkPolicy", owner.namespace,
                                 names.network_policy_name(owner.name)))
    if route is None and observed.route is not None:
        deletes.append(ObjectRef("gateway.networking.k8s.io/v1", "HTTPRoute", owner.namespace,
                                 names.route_name(owner.name)))
    return Plan(
        apply=to_apply,
        create=(new_job,) if new_job else (),
        delete=tuple(deletes),
        artifact=decision,
        serving_artifact=serving,
        pools_deployed=pools_deployed,
        replicas=replicas,
        traffic=traffic,
        claim=claim,
        scale=tuple(scales),
        zero=zeros.recorded_phase(autoscaler) if sleeping is not None else None,
        gateway_notes=tuple(n for n in (
            source.instead if source is not None else "",
            "" if sleeping is None or timeout is not None else _NO_TIMEOUT) if n),
        grants=((activators.build_reference_grant(activator, owner.namespace),)
                if activator is not None and spec.scales_to_zero and spec.routing.gateway is not None else ()),
    )
