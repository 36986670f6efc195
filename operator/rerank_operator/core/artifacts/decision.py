"""The artifact decision: which artifact the pools serve, and the Job (if any) to create for the one the spec asks for.
Pure; ``plan.py`` builds everything else on it.

- the desired artifact id is the content hash of the spec (``artifact.artifact_id``), or its shared id when its
  class's store may hold it (``sharing.py``);
- if it is already the served one (``status.artifact.id``), nothing is built;
- a shared one is served from the store when published there; else the one Job in the store's namespace builds it
  (``_decide_shared``);
- else the newest Job for it decides: none -> create attempt 1; running -> wait; succeeded -> publish (the pools
  switch to it in this same plan); succeeded but its result lost with its pod -> attempt n+1, which finds the
  artifact published on the volume and returns its manifest at once (at most ``MAX_RESULT_RECOVERIES`` in a row);
  failed -> stay failed, unless the spec changed since that Job started (a fix retries at once, as attempt n+1).
  Deleting a failed Job by hand also retries. Failed transiently (the hub unavailable) -> wait, then attempt n+1
  after a backoff that doubles per transient failure in a row (``job_outcome.RetryBackoff``), with no spec edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import names, platform
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.artifacts import job_outcome, sharing
from rerank_operator.core.builders import job, shared_job, storage
from rerank_operator.core.quality import canary as canaries
from rerank_operator.core.reconcile.observed import Obj, Observed
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status import conditions

PendingState = Literal["Creating", "Running", "Waiting", "Failed", "Canary", "RolledBack"]
#: Attempts in a row that may be started to recover a finished Job's lost result; beyond, the model reports
#: ResultLost as a failure (a message that is never a result would otherwise start Jobs forever).
MAX_RESULT_RECOVERIES = 3
#: The operator's default retry of a Job that failed transiently (``--hub-retry-*``).
DEFAULT_BACKOFF = job_outcome.RetryBackoff()


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



def artifact_record(result: quantize_job.JobResult, artifact_id: str, now: str, weights: str = "") -> dict[str, Any]:
    """status.artifact from a Job's result; ``weights``: what it was made from (``spec.model.display``), which
    tells whether a canary can be judged against the GPU pool (the same weights) or not."""
    return {
        "id": result.artifact_id or artifact_id,
        "source": sharing.SOURCE_BUILT,
        "path": result.path or artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, artifact_id),
        "sizeBytes": int(result.size_bytes),
        "manifestSha256": result.manifest_sha256,
        "quality": {k: float(v) for k, v in result.quality.items()},
        "speed": {k: float(v) for k, v in result.speed.items()},
        "recipe": dict(result.recipe),
        **({"maxInputTokens": int(result.max_input_tokens)} if result.max_input_tokens else {}),
        "publishedAt": now,
        **({"weights": weights} if weights else {}),
    }


def max_input_tokens(record: Mapping[str, Any] | None) -> int:
    """An artifact record's ``maxInputTokens`` (0: a record from a Job that did not report it, or none)."""
    return int((record or {}).get("maxInputTokens") or 0)


def jobs_for(observed: Observed, artifact_id: str | None) -> list[Obj]:
    mine = [j for j in observed.jobs if j["metadata"].get("labels", {}).get(names.LABEL_ARTIFACT) == artifact_id]
    return sorted(mine, key=job_outcome.attempt_of)


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


def _backoff_left(latest: Mapping[str, Any], now: str, backoff: job_outcome.RetryBackoff) -> tuple[int, float, float]:
    """(transient failures in a row with this one, the backoff after them, seconds of it left) for a Job that failed
    transiently; the whole backoff when its failure time or ``now`` does not parse."""
    in_a_row = job_outcome.transient_retries_of(latest) + 1
    wait = backoff.delay(in_a_row)
    at, now_s = job_outcome.failed_at(latest), job_outcome.unix_time(now)
    return in_a_row, wait, (at + wait - now_s if at is not None and now_s is not None else wait)


def _retry_transient(owner: names.Owner, spec: RerankModelSpec, desired: str, served: Mapping[str, Any] | None,
                     latest: Obj, out: job_outcome.JobOutcome, claim: str, now: str,
                     backoff: job_outcome.RetryBackoff) -> tuple[ArtifactDecision, Obj | None]:
    """A Job that failed transiently: the next attempt once its backoff has passed, else wait for it (a spec change
    meanwhile starts it at once: the hub may be the fix's)."""
    name, attempt = latest["metadata"]["name"], job_outcome.attempt_of(latest)
    in_a_row, wait, left = _backoff_left(latest, now, backoff)
    if left <= 0 or job_outcome.spec_generation_of(latest) < owner.generation:
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
    canary: canaries.CanaryPolicy | None = None, backoff: job_outcome.RetryBackoff = DEFAULT_BACKOFF,
    store: platform.ArtifactStore | None = None, shared: sharing.SharedView | None = None,
) -> tuple[ArtifactDecision, Obj | None]:
    """The artifact decision and the Job to create (if any). ``canary``: new artifacts first serve as a canary.
    ``backoff``: when a Job that failed transiently is retried (the operator's ``--hub-retry-*`` flags).
    ``store``: the class's artifact store; a spec it may share is served from there (``shared``: what the
    operator saw of its id in the store, ``_decide_shared``)."""
    shared_store = sharing.store_for(spec, store)
    desired = sharing.shared_id(spec, shared_store) if shared_store is not None else artifact.artifact_id(spec)
    served = status.get("artifact") or None
    if desired is None:
        return ArtifactDecision(None, None), None
    if served and served.get("id") == desired:
        return ArtifactDecision(desired, served), None
    step = _canary_step(desired, served, status, now, canary)
    if step is not None:
        return step, None
    if shared_store is not None:
        view = shared if shared is not None and shared.artifact_id == desired else sharing.SharedView(desired)
        return _decide_shared(owner, spec, desired, served, shared_store, view, now, canary, backoff)
    claim = storage.claim_name(owner, spec)
    jobs = jobs_for(observed, desired)
    if not jobs:
        new = job.build_job(owner, spec, desired, 1, claim)
        return ArtifactDecision(desired, served, pending=Pending(
            desired, new["metadata"]["name"], 1, "Creating", conditions.REASON_QUANTIZING,
            "starting the quantization Job")), new
    latest = jobs[-1]
    attempt = job_outcome.attempt_of(latest)
    out = job_outcome.outcome(latest, observed.pods_of(latest))
    name = latest["metadata"]["name"]
    if out.state == "Succeeded" and out.result is not None:
        record = artifact_record(out.result, desired, now, weights=spec.model.display)
        if canary is not None and canaries.starts(record, served):
            assert served is not None
            return ArtifactDecision(desired, served, canary=record, canary_since=now, pending=Pending(
                desired, name, attempt, "Canary", conditions.REASON_CANARY,
                canaries.message(desired, served, canary, {}))), None
        return ArtifactDecision(desired, record, published=True), None
    if out.state == "Succeeded":  # the result died with the pod: the manifest on the volume is read by a new attempt
        recovers = job_outcome.recovers_of(latest) + 1
        if recovers <= MAX_RESULT_RECOVERIES:
            new = job.build_job(owner, spec, desired, attempt + 1, claim, recovers=recovers)
            return ArtifactDecision(desired, served, pending=Pending(
                desired, new["metadata"]["name"], attempt + 1, "Creating", conditions.REASON_RECOVERING_RESULT,
                f"{out.message} ({name}): attempt {attempt + 1} reads the published artifact's manifest")), new
        return ArtifactDecision(desired, served, pending=Pending(
            desired, name, attempt, "Failed", out.reason,
            f"{out.message}; {MAX_RESULT_RECOVERIES} attempts in a row could not recover it")), None
    if out.state == "Failed" and out.reason in quantize_job.TRANSIENT_FAILURES:
        return _retry_transient(owner, spec, desired, served, latest, out, claim, now, backoff)
    if out.state == "Failed" and job_outcome.spec_generation_of(latest) < owner.generation:
        new = job.build_job(owner, spec, desired, attempt + 1, claim)
        return ArtifactDecision(desired, served, pending=Pending(
            desired, new["metadata"]["name"], attempt + 1, "Creating", conditions.REASON_QUANTIZING,
            f"the spec changed after {name} failed ({out.reason}): retrying")), new
    state: PendingState = "Failed" if out.state == "Failed" else "Running"
    reason, message = out.reason, out.message
    if out.state == "Running" and out.reason == conditions.REASON_QUANTIZING and job_outcome.recovers_of(latest):
        reason = conditions.REASON_RECOVERING_RESULT
        message = ("the result of an earlier attempt was lost with its pod: this attempt reads the published "
                   "artifact's manifest")
    return ArtifactDecision(desired, served, pending=Pending(desired, name, attempt, state, reason, message)), None


#: How soon a model waiting on a shared artifact's Job looks again with no event: a safety net. The shared Job's own
#: events queue every model waiting on it (controllers/handlers.py) where the operator watches the store's namespace.
SHARED_RECHECK_SECONDS = 30.0
#: How soon a store that did not answer is asked again.
SHARED_UNAVAILABLE_SECONDS = 10.0
#: How soon after a shared Job succeeded the store is asked again for its tag (the lookup's answer is cached ~2 s).
SHARED_LOOKUP_SECONDS = 2.0
#: A shared Job that succeeded this long ago while the store still has no tag for it pushed nothing that stayed.
SHARED_PUSH_VISIBLE_SECONDS = 60.0


def _decide_shared(owner: names.Owner, spec: RerankModelSpec, desired: str, served: Mapping[str, Any] | None,
                   store: platform.ArtifactStore, view: sharing.SharedView, now: str,
                   canary: canaries.CanaryPolicy | None, backoff: job_outcome.RetryBackoff) -> tuple[ArtifactDecision,
                                                                                              Obj | None]:
    """A shared artifact: served from the store when published there (no Job); else the one Job in the store's
    namespace that builds it, started by the first model that asks, waited on by all of them. A failure is every
    waiting model's (the Job's own reason); a transient one is retried after the backoff, a permanent one when
    someone deletes the Job. A model whose namespace already has ``maxBuildsPerNamespace`` shared Jobs building
    waits before it starts one: shared Jobs escape the tenants' quotas."""
    if view.unavailable and view.published is None:
        return ArtifactDecision(desired, served, recheck_after=SHARED_UNAVAILABLE_SECONDS, pending=Pending(
            desired, "", 0, "Waiting", conditions.REASON_REGISTRY_UNAVAILABLE,
            f"cannot read the artifact store {store.repository}: {view.unavailable}")), None
    if view.published is not None:
        record = sharing.record(view.published, desired, now, spec.model.display, store)
        if canary is not None and served is not None and canaries.starts(record, served):
            return ArtifactDecision(desired, served, canary=record, canary_since=now, pending=Pending(
                desired, "", 0, "Canary", conditions.REASON_CANARY,
                canaries.message(desired, served, canary, {}))), None
        return ArtifactDecision(desired, record, published=True), None
    jobs = sorted(view.jobs, key=job_outcome.attempt_of)
    building = view.building.get(owner.namespace, 0)
    if not jobs and building >= store.max_builds_per_namespace:
        return ArtifactDecision(desired, served, recheck_after=SHARED_RECHECK_SECONDS, pending=Pending(
            desired, "", 0, "Waiting", conditions.REASON_SHARED_BUILDS_LIMITED,
            f"namespace {owner.namespace} has {building} shared artifacts building in {store.namespace} (its class "
            f"allows {store.max_builds_per_namespace} at once: artifactStore.maxBuildsPerNamespace); this one "
            "starts when one of them finishes")), None
    if not jobs:
        new = shared_job.build_shared_job(spec, desired, 1, store, built_for=owner.namespace)
        return ArtifactDecision(desired, served, recheck_after=SHARED_RECHECK_SECONDS, pending=Pending(
            desired, _where(new), 1, "Creating", conditions.REASON_QUANTIZING,
            f"building shared artifact {desired} for the store {store.repository}: every model that asks for it "
            "waits on this one Job")), new
    latest = jobs[-1]
    attempt, where = job_outcome.attempt_of(latest), _where(latest)
    out = job_outcome.outcome(latest, view.pods_of(latest))
    finished = job_outcome.unix_time((latest.get("status") or {}).get("completionTime"))
    now_s = job_outcome.unix_time(now)
    gone = out.result is None or (finished is not None and now_s is not None
                                  and now_s - finished > SHARED_PUSH_VISIBLE_SECONDS)
    if out.state == "Succeeded" and gone and attempt <= MAX_RESULT_RECOVERIES:
        # Finished, yet the store has no such tag (its result lost with the pod, or the artifact deleted since):
        # build it again.
        new = shared_job.build_shared_job(spec, desired, attempt + 1, store, built_for=owner.namespace)
        return ArtifactDecision(desired, served, recheck_after=SHARED_RECHECK_SECONDS, pending=Pending(
            desired, _where(new), attempt + 1, "Creating", conditions.REASON_QUANTIZING,
            f"{where} finished but the store has no artifact {desired}: attempt {attempt + 1}")), new
    if out.state == "Succeeded" and gone:
        return ArtifactDecision(desired, served, pending=Pending(
            desired, where, attempt, "Failed", "PublishFailed",
            f"{attempt} Jobs finished but the store has no artifact {desired}: check the store "
            f"{store.repository} (delete {where} to try again)")), None
    if out.state == "Succeeded":  # pushed: the store's answer is a moment behind
        return ArtifactDecision(desired, served, recheck_after=SHARED_LOOKUP_SECONDS, pending=Pending(
            desired, where, attempt, "Running", conditions.REASON_QUANTIZING,
            f"{where} pushed shared artifact {desired}: looking it up in the store")), None
    if out.state == "Failed" and out.reason in quantize_job.TRANSIENT_FAILURES:
        in_a_row, _, left = _backoff_left(latest, now, backoff)
        if left <= 0:
            new = shared_job.build_shared_job(spec, desired, attempt + 1, store, transient_retries=in_a_row,
                                              built_for=owner.namespace)
            return ArtifactDecision(desired, served, recheck_after=SHARED_RECHECK_SECONDS, pending=Pending(
                desired, _where(new), attempt + 1, "Creating", conditions.REASON_QUANTIZING,
                f"{where} failed transiently ({out.reason}, {in_a_row} in a row): retrying")), new
        return ArtifactDecision(desired, served, recheck_after=left, pending=Pending(
            desired, where, attempt, "Waiting", out.reason,
            f"{out.message}; attempt {attempt + 1} starts in {int(left + 0.999)} s")), None
    if out.state == "Failed":
        return ArtifactDecision(desired, served, pending=Pending(
            desired, where, attempt, "Failed", out.reason,
            f"{out.message} (shared Job {where}; every model of this artifact waits on it: fix the spec, or delete "
            "the Job to try again)")), None
    return ArtifactDecision(desired, served, recheck_after=SHARED_RECHECK_SECONDS, pending=Pending(
        desired, where, attempt, "Running", out.reason, f"{out.message} (shared Job {where})")), None


def _where(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a shared Job: it lives in the store's namespace, not the model's."""
    return f"{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}"
