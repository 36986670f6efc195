"""What became of a quantization Job, read back from the Job and its pods: running, succeeded with the result in
the quantizer's termination message, or failed with the quantizer's own reason (or the kubelet's: OOMKilled); the
attempt and retry counts the operator keeps in the Job's annotations, and the backoff between transient failures.
The Job itself is built by ``builders/job.py``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from rerank_contracts import quantize_job
from rerank_operator.core import names
from rerank_operator.core.builders.job import CONTAINER
from rerank_operator.core.status import conditions

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
