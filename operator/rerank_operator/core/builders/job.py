"""The quantization Job's manifest (what became of a Job is read back by ``artifacts/job_outcome.py``).

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

from typing import Any

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import names
from rerank_operator.core.builders import deployment, pods
from rerank_operator.core.spec.model import DataSource, HubAccess, RerankModelSpec

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
    return manifest(spec, metadata, pod_labels, args, env, mounts, volumes, cpu_pool_placement(spec))


def cpu_pool_placement(spec: RerankModelSpec) -> dict[str, Any]:
    """Where the CPU pool's pods run (the model's placement with its class's added), as pod spec fields: the Job
    runs there too. With ``target: auto`` the Job picks its INT8 recipe for the CPU it runs on and measures the
    speedup it reports there: on another node pool's CPU (an AMX node for an AVX2 pool) the artifact would be
    tuned, and its figures measured, for hardware that never serves it. Empty for a model without a CPU pool."""
    cpu = spec.cpu
    if not cpu.enabled:
        return {}
    return {**({"nodeSelector": dict(cpu.node_selector)} if cpu.node_selector else {}),
            **({"tolerations": [dict(t) for t in cpu.tolerations]} if cpu.tolerations else {}),
            **({"affinity": dict(cpu.affinity)} if cpu.affinity else {})}


def manifest(spec: RerankModelSpec, metadata: dict[str, Any], pod_labels: dict[str, str], args: list[str],
             env: list[dict[str, Any]], mounts: list[dict[str, Any]], volumes: list[dict[str, Any]],
             placement: dict[str, Any]) -> dict[str, Any]:
    """A quantization Job around ``rerank-quantize args`` (a model's own, or a shared artifact's: shared_job.py),
    its pod placed by ``placement`` (nodeSelector, tolerations, affinity)."""
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
                    **placement,
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
