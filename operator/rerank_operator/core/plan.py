"""The plan: from (spec, what was observed, last status) to what must be written. Pure.

The artifact decision comes first because everything else follows from it:
- the desired artifact id is the content hash of the spec (``artifact.artifact_id``);
- if it is already the served one (``status.artifact.id``), nothing is built;
- else the newest Job for it decides: none -> create attempt 1; running -> wait; succeeded -> publish (the pools
  switch to it in this same plan); succeeded but its result lost with its pod -> attempt n+1, which finds the
  artifact published on the volume and returns its manifest at once (at most ``MAX_RESULT_RECOVERIES`` in a row);
  failed -> stay failed, unless the spec changed since that Job started (a fix retries at once, as attempt n+1).
  Deleting a failed Job by hand also retries. Failed transiently (the hub unavailable) -> wait, then attempt n+1
  after a backoff that doubles per transient failure in a row (``job.RetryBackoff``), with no spec edit.
Jobs for artifacts that are neither desired nor served are deleted (a superseded build is wasted work); the pools
keep serving the served artifact until the desired one is published.
Objects that already match (``drift.needs_apply``) are left out, so a reconcile with nothing to change plans no
writes at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from quantizer_job import contract
from rerank_operator.core import artifact, conditions, drift, names
from rerank_operator.core.builders import activator as activators
from rerank_operator.core.builders import deployment, guard, job, pods, routing, service, storage
from rerank_operator.core.observed import Obj, ObjectRef, Observed, ref_of
from rerank_operator.core.quality import assessment as quality
from rerank_operator.core.quality import canary as canaries
from rerank_operator.core.quality import requantize
from rerank_operator.core.spec import RerankModelSpec

PendingState = Literal["Creating", "Running", "Waiting", "Failed", "Canary", "RolledBack"]
#: Attempts in a row that may be started to recover a finished Job's lost result; beyond, the model reports
#: ResultLost as a failure (a message that is never a result would otherwise start Jobs forever).
MAX_RESULT_RECOVERIES = 3
#: The operator's default retry of a Job that failed transiently (``--hub-retry-*``).
DEFAULT_BACKOFF = job.RetryBackoff()
DEFAULT_DEPLOYMENT_REPLICAS = 1  # what the API server gives a Deployment created without replicas


@dataclass(frozen=True)
class Pending:
    """The artifact being built for the current spec while it differs from the served one."""

    id: str
    job: str
    attempts: int
    state: PendingState
    reason: str
    message: str


@dataclass(frozen=True)
class ArtifactDecision:
    desired_id: str | None  # None: quantization disabled, pools serve the source
    served: Mapping[str, Any] | None  # the status.artifact record the pools serve after this plan
    published: bool = False  # ``served`` was published by a Job (or promoted from a canary) in this plan
    pending: Pending | None = None
    # The desired artifact's record while it is a canary (pending.state "Canary") or after it was rolled back
    # ("RolledBack"): status.canary keeps it, so neither depends on the Job still being there.
    canary: Mapping[str, Any] | None = None
    canary_since: str | None = None
    #: Seconds until the plan changes with no event (a transient failure's next attempt is due): look again then.
    recheck_after: float | None = None


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

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.create) + len(self.delete) + len(self.scale)


def artifact_record(result: contract.JobResult, artifact_id: str, now: str, source: str = "") -> dict[str, Any]:
    """status.artifact from a Job's result; ``source``: the weights it was made from (``spec.model.display``), which
    tells whether a canary can be judged against the GPU pool (the same weights) or not."""
    return {
        "id": result.artifact_id or artifact_id,
        "path": result.path or contract.artifact_dir(contract.VOLUME_MOUNT_PATH, artifact_id),
        "sizeBytes": int(result.size_bytes),
        "manifestSha256": result.manifest_sha256,
        "quality": {k: float(v) for k, v in result.quality.items()},
        "speed": {k: float(v) for k, v in result.speed.items()},
        "recipe": dict(result.recipe),
        **({"maxInputTokens": int(result.max_input_tokens)} if result.max_input_tokens else {}),
        "publishedAt": now,
        **({"source": source} if source else {}),
    }


def max_input_tokens(record: Mapping[str, Any] | None) -> int:
    """An artifact record's ``maxInputTokens`` (0: a record from a Job that did not report it, or none)."""
    return int((record or {}).get("maxInputTokens") or 0)


def _jobs_for(observed: Observed, artifact_id: str | None) -> list[Obj]:
    mine = [j for j in observed.jobs if j["metadata"].get("labels", {}).get(names.LABEL_ARTIFACT) == artifact_id]
    return sorted(mine, key=job.attempt_of)


def _canary_step(desired: str, served: Mapping[str, Any] | None, status: Mapping[str, Any], now: str,
                 canary: canaries.CanaryPolicy | None) -> ArtifactDecision | None:
    """Where the desired artifact's canary stands (None: it has none). The quality guard's verdict on it is
    recorded by the autoscaler in ``status.quality.canary``: promote, roll back, or keep running."""
    ongoing = status.get("canary") or {}
    record = ongoing.get("artifact") or {}
    if record.get("id") != desired:
        return None
    since = str(ongoing.get("since") or now)
    if ongoing.get("state") == "RolledBack":
        return ArtifactDecision(desired, served, canary=record, canary_since=since, pending=Pending(
            desired, "", 0, "RolledBack", conditions.REASON_CANARY_ROLLED_BACK, str(ongoing.get("message") or "")))
    verdict = (status.get("quality") or {}).get("canary") or {}
    judged = verdict.get("id") == desired
    if canary is None or not served or (judged and verdict.get("verdict") == "promote"):
        # Promoted, or nobody left to judge it (the class turned the guard off): it serves, as without a canary.
        return ArtifactDecision(desired, {**record, "publishedAt": now}, published=True)
    if judged and verdict.get("verdict") == "rollback":
        message = (f"canary artifact {desired} ranked below the quality floor: {verdict.get('message', '')}; "
                   f"artifact {served.get('id')} keeps serving (change the spec to try again)")
        return ArtifactDecision(desired, served, canary=record, canary_since=now, pending=Pending(
            desired, "", 0, "RolledBack", conditions.REASON_CANARY_ROLLED_BACK, message))
    return ArtifactDecision(desired, served, canary=record, canary_since=since, pending=Pending(
        desired, "", 0, "Canary", conditions.REASON_CANARY, canaries.message(desired, served, canary, verdict)))


def _retry_transient(owner: names.Owner, spec: RerankModelSpec, desired: str, served: Mapping[str, Any] | None,
                     latest: Obj, out: job.JobOutcome, claim: str, now: str,
                     backoff: job.RetryBackoff) -> tuple[ArtifactDecision, Obj | None]:
    """A Job that failed transiently: the next attempt once its backoff has passed, else wait for it (a spec change
    meanwhile starts it at once: the hub may be the fix's)."""
    name, attempt = latest["metadata"]["name"], job.attempt_of(latest)
    in_a_row = job.transient_retries_of(latest) + 1
    wait = backoff.delay(in_a_row)
    left = wait
    at, now_s = job.failed_at(latest), job.unix_time(now)
    if at is not None and now_s is not None:
        left = at + wait - now_s
    if left <= 0 or job.spec_generation_of(latest) < owner.generation:
        new = job.build_job(owner, spec, desired, attempt + 1, claim, transient_retries=in_a_row)
        return ArtifactDecision(desired, served, pending=Pending(
            desired, new["metadata"]["name"], attempt + 1, "Creating", conditions.REASON_QUANTIZING,
            f"{name} failed transiently ({out.reason}, {in_a_row} in a row): retrying")), new
    message = (f"{out.message}; attempt {attempt + 1} starts in {int(left + 0.999)} s (backoff {int(wait)} s after "
               f"{in_a_row} transient failure(s) in a row; nothing in the spec needs to change)")
    return ArtifactDecision(desired, served, recheck_after=left, pending=Pending(
        desired, name, attempt, "Waiting", out.reason, message)), None


def decide_artifact(
    owner: names.Owner, spec: RerankModelSpec, observed: Observed, status: Mapping[str, Any], now: str,
    canary: canaries.CanaryPolicy | None = None, backoff: job.RetryBackoff = DEFAULT_BACKOFF,
) -> tuple[ArtifactDecision, Obj | None]:
    """The artifact decision and the Job to create (if any). ``canary``: new artifacts first serve as a canary.
    ``backoff``: when a Job that failed transiently is retried (the operator's ``--hub-retry-*`` flags)."""
    desired = artifact.artifact_id(spec)
    served = status.get("artifact") or None
    if desired is None:
        return ArtifactDecision(None, None), None
    if served and served.get("id") == desired:
        return ArtifactDecision(desired, served), None
    step = _canary_step(desired, served, status, now, canary)
    if step is not None:
        return step, None
    claim = storage.claim_name(owner, spec)
    jobs = _jobs_for(observed, desired)
    if not jobs:
        new = job.build_job(owner, spec, desired, 1, claim)
        return ArtifactDecision(desired, served, pending=Pending(
            desired, new["metadata"]["name"], 1, "Creating", conditions.REASON_QUANTIZING,
            "starting the quantization Job")), new
    latest = jobs[-1]
    attempt = job.attempt_of(latest)
    out = job.outcome(latest, observed.pods_of(latest))
    name = latest["metadata"]["name"]
    if out.state == "Succeeded" and out.result is not None:
        record = artifact_record(out.result, desired, now, source=spec.model.display)
        if canary is not None and canaries.starts(record, served):
            assert served is not None
            return ArtifactDecision(desired, served, canary=record, canary_since=now, pending=Pending(
                desired, name, attempt, "Canary", conditions.REASON_CANARY,
                canaries.message(desired, served, canary, {}))), None
        return ArtifactDecision(desired, record, published=True), None
    if out.state == "Succeeded":  # the result died with the pod: the manifest on the volume is read by a new attempt
        recovers = job.recovers_of(latest) + 1
        if recovers <= MAX_RESULT_RECOVERIES:
            new = job.build_job(owner, spec, desired, attempt + 1, claim, recovers=recovers)
            return ArtifactDecision(desired, served, pending=Pending(
                desired, new["metadata"]["name"], attempt + 1, "Creating", conditions.REASON_RECOVERING_RESULT,
                f"{out.message} ({name}): attempt {attempt + 1} reads the published artifact's manifest")), new
        return ArtifactDecision(desired, served, pending=Pending(
            desired, name, attempt, "Failed", out.reason,
            f"{out.message}; {MAX_RESULT_RECOVERIES} attempts in a row could not recover it")), None
    if out.state == "Failed" and out.reason in contract.TRANSIENT_FAILURES:
        return _retry_transient(owner, spec, desired, served, latest, out, claim, now, backoff)
    if out.state == "Failed" and job.spec_generation_of(latest) < owner.generation:
        new = job.build_job(owner, spec, desired, attempt + 1, claim)
        return ArtifactDecision(desired, served, pending=Pending(
            desired, new["metadata"]["name"], attempt + 1, "Creating", conditions.REASON_QUANTIZING,
            f"the spec changed after {name} failed ({out.reason}): retrying")), new
    state: PendingState = "Failed" if out.state == "Failed" else "Running"
    reason, message = out.reason, out.message
    if out.state == "Running" and out.reason == conditions.REASON_QUANTIZING and job.recovers_of(latest):
        reason = conditions.REASON_RECOVERING_RESULT
        message = ("the result of an earlier attempt was lost with its pod: this attempt reads the published "
                   "artifact's manifest")
    return ArtifactDecision(desired, served, pending=Pending(desired, name, attempt, state, reason, message)), None


def _obsolete_jobs(observed: Observed, decision: ArtifactDecision) -> list[ObjectRef]:
    """Jobs of artifacts neither desired nor served, and older attempts of those that are."""
    keep: set[str] = set()
    for artifact_id in (decision.desired_id, (decision.served or {}).get("id")):
        jobs = _jobs_for(observed, artifact_id) if artifact_id else []
        if jobs:
            keep.add(jobs[-1]["metadata"]["name"])
    return [ref_of({**j, "apiVersion": "batch/v1", "kind": "Job"}) for j in observed.jobs
            if j["metadata"]["name"] not in keep and not j["metadata"].get("deletionTimestamp")]


def _replicas(spec: RerankModelSpec, pool: names.PoolName, decision: Mapping[str, Any] | None) -> int | None:
    p = spec.pool(pool)
    auto = spec.autoscaling
    if not auto.enabled:
        return p.min_replicas
    if auto.replica_management == "external":
        return None
    decided = (decision or {}).get(f"{pool}Replicas")
    if isinstance(decided, int) and not isinstance(decided, bool):
        return max(p.min_replicas, min(p.max_replicas, decided))
    # A model that may go to zero starts awake, on one replica of the pool a request wakes (``zero.awake_bounds``).
    return max(p.min_replicas, int(spec.scales_to_zero and pool == activators.wake_pool(spec)))


def _scale(owner: names.Owner, pool: names.PoolName, replicas: int | None, live: Obj | None) -> Scale | None:
    """The scale write that brings the pool's Deployment to ``replicas`` (None: another controller's business)."""
    if replicas is None or (live is not None and live["metadata"].get("deletionTimestamp")):
        return None
    current = int((live or {}).get("spec", {}).get("replicas", DEFAULT_DEPLOYMENT_REPLICAS))
    if current == replicas:
        return None
    return Scale(owner.namespace, names.deployment_name(owner.name, pool), replicas, exists=live is not None)


def _autoscaler_decision(spec: RerankModelSpec, status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    if not spec.autoscaling.enabled:
        return None
    decision = (status.get("autoscaling") or {}).get("lastDecision")
    return decision if isinstance(decision, Mapping) else None


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
    network_policy: Obj | None = None, guard_settings: guard.GuardSettings | None = None,
    backoff: job.RetryBackoff = DEFAULT_BACKOFF, pull_secrets: tuple[str, ...] = (),
    activator: activators.Activator | None = None,
) -> Plan:
    """``network_policy``: the model's NetworkPolicy from its class (classes.network_policy); None deletes it.
    ``guard_settings``: the class's quality guard, when it turns it on (``builders/guard.py``); with it, new
    artifacts go through a canary. ``backoff``: the retry of a Job that failed transiently. ``pull_secrets``: the
    platform's image pull Secrets, on every pod the plan makes (``pods.with_pull_secrets``). ``activator``: the
    platform's (``--activator-*``), where the route of a model going to or at zero points."""
    canary = canaries.policy(spec, guard_settings)
    # After a re-quantization round on drift, the artifact is planned on the live sample (quality/requantize.py).
    decision, new_job = decide_artifact(owner, requantize.effective(spec, status, owner.name), observed, status, now,
                                        canary, backoff)
    canary_running = decision.pending is not None and decision.pending.state == "Canary" and decision.canary
    canary_id = str((decision.canary or {}).get("id")) if canary_running else None
    claim = storage.claim_name(owner, spec)
    serving = (decision.served or {}).get("id") if decision.desired_id is not None else None
    pools_deployed = decision.desired_id is None or serving is not None
    autoscaler = _autoscaler_decision(spec, status)
    below_floor = quality.below_floor_of(status)
    traffic = routing.split(spec, observed.ready("gpu"), observed.ready("cpu"), autoscaler, below_floor)
    guarding = guard_settings if pools_deployed and guard.applies(spec, guard_settings) else None

    desired: list[Obj] = []
    pvc = storage.build_pvc(owner, spec)
    if pvc:
        desired.append(pvc)
    replicas: dict[str, int | None] = {}
    scales: list[Scale] = []
    for pool in spec.enabled_pools:
        replicas[pool.name] = _replicas(spec, pool.name, autoscaler)
        if pools_deployed:
            desired.append(deployment.build_deployment(owner, spec, pool, serving, None, claim,
                                                       max_input_tokens=max_input_tokens(decision.served)))
            scale = _scale(owner, pool.name, replicas[pool.name], observed.deployments.get(pool.name))
            if scale:
                scales.append(scale)
            desired.append(service.build_pool_service(owner, pool))
    # What serves (Services, route, NetworkPolicy) comes with the pools: before the first artifact there is nothing
    # to route to, and a burst of new models writes only their claims and Jobs first.
    token = guard.mirror_token(observed.deployments.get(names.COMPONENT_GUARD)) if guarding is not None else ""
    filters = guard.route_filters(owner, guarding, token) if guarding is not None and not guard.replays(spec) else []
    canary_share = canary.percent if canary_id and canary else 0
    sleeping = activators.routing_to(spec, autoscaler, activator)
    if sleeping is not None:  # the activator holds the requests; the guard gets no copy of what the pools never see
        filters = activators.route_filters(owner, spec, sleeping)
    route = (routing.build_httproute(owner, spec, traffic, filters, canary_share,
                                     *((activators.backends(sleeping), activators.ROUTE_TIMEOUT) if sleeping else ()))
             if pools_deployed else None)
    if pools_deployed:
        desired.append(service.build_model_service(owner, traffic.receiving))
        desired.extend(o for o in (route, network_policy) if o is not None)
    if guarding is not None:
        guard_deployment = guard.build_guard_deployment(owner, spec, guarding, below_floor, canary=bool(canary_id),
                                                        claim=claim, artifact_id=serving,
                                                        max_input_tokens=max_input_tokens(decision.served), token=token)
        if sleeping is not None and activators.phase(autoscaler) == "asleep":
            guard_deployment["spec"]["replicas"] = 0  # nothing to check at zero: the guard sleeps with the pools
        desired.append(guard_deployment)
        desired.append(guard.build_guard_service(owner))
    if canary_id and pools_deployed:
        desired.append(deployment.build_deployment(owner, spec, spec.cpu, canary_id, 1, claim, canary=True,
                                                   max_input_tokens=max_input_tokens(decision.canary)))
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
        zero=activators.phase(autoscaler) if sleeping is not None else None,
        grants=((activators.build_reference_grant(activator, owner.namespace),)
                if activator is not None and spec.scales_to_zero and spec.routing.gateway is not None else ()),
    )
