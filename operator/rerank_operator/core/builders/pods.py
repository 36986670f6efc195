"""Pod pieces shared by the quantization Job and the TEI pools: hardening, the model volume, image pull Secrets.

Everything runs as the same non-root uid/gid with fsGroup set, so files the Job writes to the volume are readable by
TEI pods. Root filesystems are read-only; scratch space is an emptyDir at /tmp (and /data for TEI's hub cache).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from rerank_contracts import artifact_layout

RUN_AS = 65532  # the conventional "nonroot" uid/gid of distroless images
MODEL_VOLUME = "models"
SCRATCH_VOLUME = "scratch"


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def model_volume(claim: str, *, read_only: bool) -> dict[str, Any]:
    claim_source: dict[str, Any] = {"claimName": claim}
    if read_only:
        claim_source["readOnly"] = True
    return {"name": MODEL_VOLUME, "persistentVolumeClaim": claim_source}


def scratch_volume(name: str = SCRATCH_VOLUME) -> dict[str, Any]:
    return {"name": name, "emptyDir": {}}


def on_volume(relative: str) -> str:
    """Where a path relative to the volume root appears inside the Job's container."""
    return f"{artifact_layout.VOLUME_MOUNT_PATH}/{relative}"


def secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def with_pull_secrets(obj: Mapping[str, Any], secrets: Sequence[str]) -> dict[str, Any]:
    """``obj`` with the platform's image pull Secrets (``--image-pull-secret``) on its pod template, if it has one
    (the Job, the pools' and the guard's Deployments): the images the operator names may live in a private registry.
    The Secrets are the platform's, one of each name in every model namespace; a tenant cannot name them."""
    template = (obj.get("spec") or {}).get("template")
    if not secrets or not isinstance(template, Mapping):
        return dict(obj)
    out = copy.deepcopy(dict(obj))
    out["spec"]["template"]["spec"]["imagePullSecrets"] = [{"name": name} for name in secrets]
    return out
