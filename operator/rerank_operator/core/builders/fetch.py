"""The init container that puts a shared artifact where a pod reads it (``core/artifacts/sharing.py``).

A pod serving a shared artifact has no claim: its model volume is an emptyDir, filled before TEI (or the quality
guard) starts by ``rerank-fetch-artifact`` (``rerank_contracts/shared_store.py``, in the operator image). It pulls the
artifact's manifest by digest, checks that the manifest.json it names is the one the operator recorded
(``status.artifact.manifestSha256``), verifies every file of the parts the pod needs against it and renames the
whole into place: a pod sees all of a verified artifact or nothing. A mismatch stops the pod before it serves
(reason ``ChecksumMismatch`` in the init container's termination message).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core.builders import cpu_check, pods

CONTAINER = "fetch-artifact"
REGISTRY_CONFIG_MOUNT = "/etc/rerank/registry"
CREDENTIALS_VOLUME = "registry-credentials"


@dataclass(frozen=True)
class Fetch:
    """Where a shared artifact is and how to check it: ``ref`` by digest, the checksum of its manifest.json, the
    image that fetches it, whether its registry is plain HTTP and the pull Secret (a ``dockerconfigjson`` one the
    platform keeps in every model namespace; None: anonymous pull)."""

    ref: str
    manifest_sha256: str
    image: str
    insecure: bool = False
    pull_secret: str | None = None


def init_container(fetch: Fetch, artifact_id: str, parts: tuple[str, ...]) -> dict[str, Any]:
    args = ["--ref", fetch.ref, "--manifest-sha256", fetch.manifest_sha256,
            "--into", artifact_layout.artifact_dir(artifact_layout.VOLUME_MOUNT_PATH, artifact_id)]
    for part in parts:
        args += ["--part", part]
    if fetch.insecure:
        args.append("--insecure")
    mounts: list[dict[str, Any]] = [{"name": pods.MODEL_VOLUME, "mountPath": artifact_layout.VOLUME_MOUNT_PATH},
                                    {"name": pods.SCRATCH_VOLUME, "mountPath": "/tmp"}]
    if fetch.pull_secret:
        args += ["--docker-config", f"{REGISTRY_CONFIG_MOUNT}/config.json"]
        mounts.append({"name": CREDENTIALS_VOLUME, "mountPath": REGISTRY_CONFIG_MOUNT, "readOnly": True})
    return {
        "name": CONTAINER,
        "image": fetch.image,
        "command": ["rerank-fetch-artifact"],
        "args": args,
        "volumeMounts": mounts,
        "terminationMessagePath": quantize_job.TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": pods.container_security_context(),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
    }


def volumes(fetch: Fetch) -> list[dict[str, Any]]:
    """The pod's model volume (an emptyDir the init container fills) and, if any, the pull credentials."""
    out: list[dict[str, Any]] = [pods.scratch_volume(pods.MODEL_VOLUME)]
    if fetch.pull_secret:
        out.append({"name": CREDENTIALS_VOLUME, "secret": {
            "secretName": fetch.pull_secret, "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}})
    return out


def failure(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, message) of a pod whose fetch (or CPU check: ``cpu_check.py``) init container failed (its last
    run, if it is being retried): the fetcher's one-line JSON termination message, or the exit code when it left
    none."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or ():
        if status.get("name") not in (CONTAINER, cpu_check.CONTAINER):
            continue
        for state in (status.get("state") or {}, status.get("lastState") or {}):
            term = state.get("terminated") or {}
            if term and term.get("exitCode") not in (None, 0):
                try:
                    said = json.loads(term.get("message") or "")
                except ValueError:
                    said = None
                if isinstance(said, dict) and said.get("reason"):
                    return str(said["reason"]), str(said.get("message") or "")
                return "", f"exit code {term.get('exitCode')}: {str(term.get('message') or '')[-300:]}"
    return None


def failures(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """What the pods' fetch init containers said when they failed: one line per pod, ``reason: message``."""
    found = []
    for pod in pods:
        failed = failure(pod)
        if failed is not None:
            reason, message = failed
            found.append(f"pod {pod.get('metadata', {}).get('name')}: {reason or 'failed'}: {message}")
    return found


def part_of(pool: str) -> str:
    """The part of an artifact a pool serves: INT8 ONNX on CPU, the original weights on GPU."""
    return artifact_layout.CPU_SUBDIR if pool == "cpu" else artifact_layout.ORIGINAL_SUBDIR
