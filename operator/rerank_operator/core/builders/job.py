"""The quantization Job: its manifest, and what its outcome was.

One Job per (artifact, attempt), named ``<model>-q-<hash8>-<attempt>``: a restarted operator finds the Job it
started by name and labels instead of starting another. Within one attempt Kubernetes retries failed pods with
exponential backoff up to ``backoffLimit``; a new attempt starts when the spec changes after a failure, or when a
Job succeeded but its result is gone (see ``ResultLost``).
The command line comes from ``rerank_contracts.quantize_job.build_args`` and the outcome from ``parse_result``
applied to the container's termination message; nothing here spells a quantizer flag or result key.

The termination message lives only as long as the pod. When a Job succeeds while the operator is down and its pod
is removed before it returns (a node scaled away, pod garbage collection), the result is gone but the artifact was
published: its ``manifest.json`` on the volume is the durable result. The operator cannot mount tenant volumes, so
it reads that manifest through the quantizer: the next attempt finds the artifact published and returns at once
with ``AlreadyPublished`` and the manifest's figures (``quantizer_job.pipeline.Job.run``), no second quantization.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import conditions, names
from rerank_operator.core.builders import deployment, pods
from rerank_operator.core.spec import DataSource, HubAccess, RerankModelSpec

CONTAINER = "quantizer"
EVAL_MOUNT = "/etc/rerank/evaluation"
CALIBRATION_MOUNT = "/etc/rerank/calibration"
PAIRS_FILE = "pairs.jsonl"
HF_HOME = f"{artifact_layout.VOLUME_MOUNT_PATH}/.cache/huggingface"  # on the volume: retries do not download again


def _data_path(source: DataSource | None, mount: str) -> str | None:
    if source is None:
        return None
    if source.config_map is not None:
        return f"{mount}/{PAIRS_FILE}"
    assert source.path is not None
    return pods.on_volume(source.path)


def request(spec: RerankModelSpec, artifact_id: str) -> quantize_job.JobRequest:
    """The contract's request for ``spec``: what the Job is asked to build."""
    q = spec.quantization
    model = spec.model.id if spec.model.id else pods.on_volume(spec.model.path or "")
    return quantize_job.JobRequest(
        model=model,
        output_root=artifact_layout.VOLUME_MOUNT_PATH,
        artifact_id=artifact_id,
        revision=spec.model.revision,
        mode=q.mode,
        target=q.target,
        recipe=q.recipe,
        per_channel=q.per_channel,
        reduce_range=q.reduce_range,
        operators=tuple(q.operators),
        optimization_level=q.optimization_level,
        eval_pairs=_data_path(q.evaluation_data, EVAL_MOUNT),
        calibration_pairs=_data_path(q.calibration_data, CALIBRATION_MOUNT),
        min_spearman=q.quality_gate.min_spearman,
        min_topk_agreement=q.quality_gate.min_topk_agreement,
        topk=q.quality_gate.topk,
        time_budget_seconds=q.time_budget_seconds,
        keep_original=True,
        # A re-quantization's pairs are the tenant's live queries: they expire with the sample, not in an artifact.
        keep_eval_pairs=not q.live_round,
        # The Job times candidates with the threads the CPU pool's TEI will use (not part of the artifact's id).
        serve_threads=deployment.pool_cpus(spec.cpu) if spec.cpu.enabled else 0,
        # ... and within its batches' token budget (unset: the model's maximum input length, which the Job knows).
        serve_batch_tokens=(spec.cpu.tei.max_batch_tokens or 0) if spec.cpu.enabled else 0,
        trust_remote_code=spec.model.trust_remote_code,
    )


def hub_env(hub: HubAccess) -> list[dict[str, Any]]:
    """The class's way to the hub as the environment huggingface_hub and its HTTP client read: ``HF_ENDPOINT`` (a
    mirror), the proxy in both spellings (Python's HTTP clients read either) and what bypasses it."""
    env: list[dict[str, Any]] = []
    if hub.endpoint:
        env.append({"name": "HF_ENDPOINT", "value": hub.endpoint})
    for value, keys in ((hub.proxy, ("HTTPS_PROXY", "HTTP_PROXY")), (hub.no_proxy, ("NO_PROXY",))):
        if value:
            env += [{"name": k, "value": value} for key in keys for k in (key, key.lower())]
    return env


def _config_map_volume(volume: str, source: DataSource | None) -> dict[str, Any] | None:
    if source is None or source.config_map is None:
        return None
    ref = source.config_map
    return {"name": volume, "configMap": {"name": ref.name, "items": [{"key": ref.key, "path": PAIRS_FILE}]}}


def build_job(
    owner: names.Owner, spec: RerankModelSpec, artifact_id: str, attempt: int, claim: str, recovers: int = 0,
    transient_retries: int = 0,
) -> dict[str, Any]:
    """``recovers``: attempts in a row (this one included) started because a finished Job's result was lost.
    ``transient_retries``: attempts in a row before this one that failed transiently (the hub unavailable)."""
    q = spec.quantization
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": HF_HOME},
    ]
    if spec.model.token_secret:
        env.append(pods.secret_env("HF_TOKEN", spec.model.token_secret.name, spec.model.token_secret.key))
    env += hub_env(spec.model.hub)
    mounts: list[dict[str, Any]] = [
        {"name": pods.MODEL_VOLUME, "mountPath": artifact_layout.VOLUME_MOUNT_PATH},
        {"name": pods.SCRATCH_VOLUME, "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [pods.model_volume(claim, read_only=False), pods.scratch_volume()]
    for volume, source, mount in (
        ("evaluation-data", q.evaluation_data, EVAL_MOUNT),
        ("calibration-data", q.calibration_data, CALIBRATION_MOUNT),
    ):
        cm_volume = _config_map_volume(volume, source)
        if cm_volume:
            volumes.append(cm_volume)
            mounts.append({"name": volume, "mountPath": mount, "readOnly": True})
    metadata = names.child_metadata(
        owner,
        names.job_name(owner.name, artifact_id, attempt),
        names.COMPONENT_QUANTIZER,
        extra_labels={names.LABEL_ARTIFACT: artifact_id},
        annotations={
            names.ANNOTATION_ATTEMPT: str(attempt),
            names.ANNOTATION_SPEC_GENERATION: str(owner.generation),
            **({names.ANNOTATION_RECOVERS: str(recovers)} if recovers else {}),
            **({names.ANNOTATION_TRANSIENT_RETRIES: str(transient_retries)} if transient_retries else {}),
        },
    )
    pod_labels = {**names.labels(owner.name, names.COMPONENT_QUANTIZER), names.LABEL_ARTIFACT: artifact_id}
    args = quantize_job.build_args(request(spec, artifact_id))
    return manifest(spec, metadata, pod_labels, args, env, mounts, volumes)


def manifest(spec: RerankModelSpec, metadata: dict[str, Any], pod_labels: dict[str, str], args: list[str],
             env: list[dict[str, Any]], mounts: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    """A quantization Job around ``rerank-quantize args`` (a model's own, or a shared artifact's: shared_job.py)."""
    q = spec.quantization
    quantizer: dict[str, Any] = {
        "name": CONTAINER, "image": q.image, "command": ["rerank-quantize"], "args": args, "env": env,
        "volumeMounts": mounts,
        "terminationMessagePath": quantize_job.TERMINATION_MESSAGE_PATH,
        # A crash before the result is written still leaves the log tail in the message for status to show.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": pods.container_security_context(),
        **({"resources": dict(q.resources)} if q.resources else {}),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": q.backoff_limit,
            "activeDeadlineSeconds": q.active_deadline_seconds,
            # Never two quantizers on one artifact directory: a replacement waits for the old pod to be gone.
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": pod_failure_policy(),
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": pods.pod_security_context(),
                    "containers": [quantizer],
                    "volumes": volumes,
                },
            },
        },
    }


def pod_failure_policy() -> dict[str, Any]:
    """Fail the Job at once when retrying cannot help (quality gate, unsupported model, bad input) or when the
    operator retries it on its own schedule (the hub unavailable: the quantizer already retried within seconds, and
    a new Job after a backoff of minutes is the retry that spans an outage), and do not count an evicted or
    preempted pod against ``backoffLimit``."""
    at_once = (*quantize_job.PERMANENT_FAILURES, *quantize_job.TRANSIENT_FAILURES)
    permanent = sorted(quantize_job.EXIT_CODES[r] for r in at_once)
    return {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": permanent}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]}


# --- reading a Job back -------------------------------------------------------------------------------------------

JobState = Literal["Running", "Succeeded", "Failed"]


@dataclass(frozen=True)
class JobOutcome:
    """What became of one quantization Job, with the Job's own reason when it failed."""

    state: JobState
    reason: str
    message: str
    result: quantize_job.JobResult | None = None


def _int_annotation(job: Mapping[str, Any], key: str) -> int:
    """An integer the operator wrote into the Job's annotations; 0 when absent or not a number."""
    try:
        return int(job["metadata"].get("annotations", {}).get(key, "0"))
    except ValueError:
        return 0


def attempt_of(job: Mapping[str, Any]) -> int:
    return _int_annotation(job, names.ANNOTATION_ATTEMPT)


def spec_generation_of(job: Mapping[str, Any]) -> int:
    return _int_annotation(job, names.ANNOTATION_SPEC_GENERATION)


def recovers_of(job: Mapping[str, Any]) -> int:
    return _int_annotation(job, names.ANNOTATION_RECOVERS)


def transient_retries_of(job: Mapping[str, Any]) -> int:
    return _int_annotation(job, names.ANNOTATION_TRANSIENT_RETRIES)


@dataclass(frozen=True)
class RetryBackoff:
    """When the operator starts a new Job after one failed transiently (``quantize_job.TRANSIENT_FAILURES``: the hub,
    or the mirror or proxy in front of it, did not answer): ``base_seconds`` after the first, doubling per failure
    in a row, at most ``max_seconds``; forever, since an outage ends without anyone editing the spec."""

    base_seconds: float = 30.0
    max_seconds: float = 600.0

    def delay(self, failures_in_a_row: int) -> float:
        return float(min(self.max_seconds, self.base_seconds * 2 ** max(0, failures_in_a_row - 1)))


def failed_at(job: Mapping[str, Any]) -> float | None:
    """Unix time of the Job's Failed (or FailureTarget) condition; None when it has none that parses."""
    cond = _condition(job, "Failed") or _condition(job, "FailureTarget")
    return unix_time((cond or {}).get("lastTransitionTime"))


def unix_time(stamp: object) -> float | None:
    """An RFC 3339 timestamp of the API server's as unix seconds; None when it does not parse."""
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


#: Reason of a Job that succeeded but whose result can no longer be read (pod gone, or a message that is no result).
RESULT_LOST = conditions.REASON_RESULT_LOST


def _condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in job.get("status", {}).get("conditions") or ():
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _quantizer_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The quantizer container's entry in the pod's containerStatuses ({} until the kubelet reports it)."""
    statuses = pod.get("status", {}).get("containerStatuses") or ()
    return next((s for s in statuses if s.get("name") == CONTAINER), {})


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    status = _quantizer_status(pod)
    term = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get("terminated")
    return dict(term) if term else None


def _waiting(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    waiting = (_quantizer_status(pod).get("state") or {}).get("waiting")
    if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
        return dict(waiting)
    return None


def _newest_first(job_pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return sorted(job_pods, key=lambda p: p["metadata"].get("creationTimestamp") or "", reverse=True)


def _from_message(term: Mapping[str, Any]) -> quantize_job.JobResult | str:
    """The parsed result, or the raw text (a log tail through FallbackToLogsOnError) when it is not one."""
    text = term.get("message") or ""
    try:
        return quantize_job.parse_result(text)
    except quantize_job.ResultParseError:
        return text.strip()


def outcome(job: Mapping[str, Any], job_pods: Sequence[Mapping[str, Any]]) -> JobOutcome:
    """Interpret a Job and its pods. Pure: the Job's conditions decide the state, the pods explain it."""
    pods_newest = _newest_first(job_pods)
    complete = _condition(job, "Complete") or _condition(job, "SuccessCriteriaMet")
    failed = _condition(job, "Failed") or _condition(job, "FailureTarget")
    if complete:
        for pod in pods_newest:
            term = _terminated(pod)
            if term and term.get("exitCode") == 0:
                parsed = _from_message(term)
                if isinstance(parsed, quantize_job.JobResult) and parsed.ok:
                    return JobOutcome("Succeeded", parsed.reason, parsed.message, parsed)
                if isinstance(parsed, quantize_job.JobResult):
                    return JobOutcome("Failed", parsed.reason, parsed.message, parsed)
                return JobOutcome("Succeeded", RESULT_LOST,
                                  f"the Job succeeded but its pod left no readable result: {parsed[:300]!r}")
        return JobOutcome("Succeeded", RESULT_LOST, "the Job succeeded but its pod, and with it the result, is gone")
    if failed:
        return _failure(failed, pods_newest)
    for pod in pods_newest:
        waiting = _waiting(pod)
        if waiting:
            return JobOutcome(
                "Running", conditions.REASON_JOB_POD_WAITING,
                f"pod {pod['metadata']['name']}: {waiting.get('reason')}: {waiting.get('message', '')}".strip()
            )
    failures = job.get("status", {}).get("failed") or 0
    if failures:
        previous = _failure({"reason": "PodFailed", "message": ""}, pods_newest)
        return JobOutcome("Running", conditions.REASON_RETRYING,
                          f"attempt failed {failures} time(s), retrying with backoff; "
                          f"last: {previous.reason}: {previous.message}")
    return JobOutcome("Running", conditions.REASON_QUANTIZING, "the quantization Job is running")


def _out_of_memory(term: Mapping[str, Any], parsed: quantize_job.JobResult | str) -> JobOutcome:
    """The kubelet's OOMKilled, whatever the quantizer said: the kernel killed a process of the container (on cgroup
    v1 often only the export child, so the parent survives and reports ExportFailed), and the fix is the limit."""
    said = f"{parsed.reason}: {parsed.message}" if isinstance(parsed, quantize_job.JobResult) else parsed[-300:]
    return JobOutcome("Failed", conditions.REASON_OOM_KILLED,
                      f"the quantizer ran out of its memory limit (exit code {term.get('exitCode')}"
                      + (f"; it reported {said}" if said else "")
                      + "): raise spec.quantization.resources.limits.memory")


def _failure(failed: Mapping[str, Any], pods_newest: Sequence[Mapping[str, Any]]) -> JobOutcome:
    """The deadline if the Job hit it; else out of memory if the kubelet says so; else the Job's own reason (its
    result message) if a pod left one; else the container's; else the Job's."""
    job_reason = failed.get("reason") or conditions.REASON_JOB_FAILED
    if job_reason == "DeadlineExceeded":
        # The kubelet stops the running quantizer with SIGTERM, and it writes an InternalError "terminated" result on
        # the way out: a consequence of the deadline, not the cause.
        return JobOutcome("Failed", job_reason, failed.get("message") or "the quantization Job ran past its deadline")
    crashed: JobOutcome | None = None
    for pod in pods_newest:
        term = _terminated(pod)
        if not term or term.get("exitCode") == 0:
            continue
        parsed = _from_message(term)
        if term.get("reason") == "OOMKilled":
            return _out_of_memory(term, parsed)
        if isinstance(parsed, quantize_job.JobResult):
            return JobOutcome("Failed", parsed.reason, parsed.message, parsed)
        if crashed is None:
            container_reason = term.get("reason") or "Error"
            if container_reason == "Error":
                container_reason = conditions.REASON_QUANTIZER_CRASHED
            detail = f"exit code {term.get('exitCode')}" + (f": {parsed[-500:]}" if parsed else "")
            crashed = JobOutcome("Failed", container_reason, detail)
    if crashed is not None:
        return crashed
    return JobOutcome("Failed", job_reason, failed.get("message") or "the quantization Job failed")


def waiting_for_pods(job: Mapping[str, Any]) -> bool:
    """Unfinished and without an active pod: the only state in which its FailedCreate Events (a quota refusing
    its pod) are read and counted."""
    status = job.get("status") or {}
    finished = status.get("completionTime") or any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in status.get("conditions") or ())
    return not finished and not status.get("active")


#: The Job controller creates a Job's pod within a second or two. Only a Job pod-less for longer can have been
#: refused by a quota, so only then are its FailedCreate Events worth a read (inside a burst of applies that read was
#: one more request in every new model's first reconciles, each waiting on a busy API server).
FAILED_CREATE_GRACE_SECONDS = 5.0


def pod_long_missing(job: Mapping[str, Any], now: float) -> bool:
    """``waiting_for_pods`` for at least FAILED_CREATE_GRACE_SECONDS since the Job was created (``now``: unix
    seconds); a Job without a readable creationTimestamp counts as old."""
    if not waiting_for_pods(job):
        return False
    created = (job.get("metadata") or {}).get("creationTimestamp")
    try:
        born = datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return True
    return now - born >= FAILED_CREATE_GRACE_SECONDS
