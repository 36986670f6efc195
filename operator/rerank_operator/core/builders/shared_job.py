"""The Job that builds a shared artifact (``core/artifacts/sharing.py``) in its store's namespace, and pushes it there.

It is the model's quantization Job (``job.py``) with nothing of a tenant's: no claim (an emptyDir holds the build and
its download), no hub token and no data ConfigMaps (a model with them is never shared), no owner (it serves every
namespace that asks for the same id); the store's push Secret is its only credential. Its name is the same for
every model that asks (``names.shared_job_name``), so concurrent first requests start one Job.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import names, platform
from rerank_operator.core.builders import job, pods
from rerank_operator.core.spec.model import Quantization, RerankModelSpec

#: Where a shared artifact's Job finds the store's push credentials (a Docker config.json, ``$DOCKER_CONFIG``).
REGISTRY_CONFIG_MOUNT = "/etc/rerank/registry"


def build_shared_job(spec: RerankModelSpec, artifact_id: str, attempt: int, store: platform.ArtifactStore,
                     transient_retries: int = 0, built_for: str = "") -> dict[str, Any]:
    """Attempt ``attempt`` of the Job building shared artifact ``artifact_id`` as ``spec`` asks for it, run as the
    platform says: with its class's default resources, and at least the built-in deadline and retries. What one
    tenant's spec says of those is not part of the artifact's id, so no tenant may make the build every tenant of the
    artifact waits for fail (a memory limit too small, a deadline too short, no retries); a longer deadline or more
    retries harm no one. It runs on the class's CPU node pool (``store.job_placement``), never on a placement a
    tenant chose. ``built_for``: the namespace of the model that starts it, which the Job is counted for
    (``artifactStore.maxBuildsPerNamespace``)."""
    built_in, q = Quantization(), spec.quantization
    spec = replace(spec, quantization=replace(
        q, resources=store.job_resources,
        active_deadline_seconds=max(q.active_deadline_seconds, built_in.active_deadline_seconds),
        backoff_limit=max(q.backoff_limit, built_in.backoff_limit)))
    env: list[dict[str, Any]] = [
        {"name": "HOME", "value": "/tmp"},
        {"name": "HF_HOME", "value": job.HF_HOME},
        *job.hub_env(spec.model.hub),
    ]
    mounts: list[dict[str, Any]] = [
        {"name": pods.MODEL_VOLUME, "mountPath": artifact_layout.VOLUME_MOUNT_PATH},
        {"name": pods.SCRATCH_VOLUME, "mountPath": "/tmp"},
    ]
    volumes: list[dict[str, Any]] = [pods.scratch_volume(pods.MODEL_VOLUME), pods.scratch_volume()]
    if store.push_secret:
        env.append({"name": "DOCKER_CONFIG", "value": REGISTRY_CONFIG_MOUNT})
        mounts.append({"name": "registry-credentials", "mountPath": REGISTRY_CONFIG_MOUNT, "readOnly": True})
        volumes.append({"name": "registry-credentials", "secret": {
            "secretName": store.push_secret, "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
    req = replace(job.request(spec, artifact_id), push_repository=store.repository, push_insecure=store.insecure)
    metadata: dict[str, Any] = {
        "name": names.shared_job_name(artifact_id, attempt),
        "namespace": store.namespace,
        "labels": {**names.shared_labels(artifact_id), **({names.LABEL_BUILT_FOR: built_for} if built_for else {})},
        "annotations": {
            names.ANNOTATION_ATTEMPT: str(attempt),
            names.ANNOTATION_SOURCE: spec.model.display,
            **({names.ANNOTATION_TRANSIENT_RETRIES: str(transient_retries)} if transient_retries else {}),
        },
    }
    return job.manifest(spec, metadata, names.shared_labels(artifact_id), quantize_job.build_args(req), env, mounts,
                        volumes, dict(store.job_placement))
