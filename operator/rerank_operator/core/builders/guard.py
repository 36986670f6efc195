"""The model's quality guard: one Deployment ``<name>-guard`` (one replica) and its Service, when the model's
RerankClass turns the guard on (``spec.qualityGuard``) and the model can be checked (``unavailable``).

The guard (``python -m quality_guard.server``) receives a sampled copy of the model's live ``/rerank`` requests from
the HTTPRoute's RequestMirror filter (``routing.build_httproute``), asks the CPU pool's and the GPU pool's Services
the same request, and exports per pool whether the CPU pool ranks below the model's quality floor. A model without a
GPU pool is checked against FP32 scores the guard computes itself from the artifact's original weights
(``local_reference``; ``quality_guard/reference.py``), at the same budget. It is never in
the serving path: the gateway drops the mirror's answers, and the guard answers 202 at once. Its configuration
travels in an environment variable, so a change (the floor, the budget, the verdict it must start from) rolls it.

It runs from the quantization Job's image (which carries ``quality_guard`` and its numpy), or the class's
``qualityGuard.image``, with no API access (no ServiceAccount token), as the same non-root user as every other pod.

It counts only what the model's own route mirrors: the route sets the model's mirror token in a header
(``route_filters``: a ``RequestHeaderModifier`` before the ``RequestMirror``, standard filters only) and the guard
drops POSTs without it (``quality_guard/intake.py``). The token is random, made once per guard Deployment and read
back from it (``mirror_token``), so it survives restarts and leader changes without a Secret the operator would
need cluster-wide Secret access for; it is as private as the model's HTTPRoute and Deployments.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from rerank_contracts import artifact_layout
from rerank_contracts.guard import (
    CONFIG_ENV,
    LOCAL_REFERENCE,
    MIRROR_TOKEN_ENV,
    MIRROR_TOKEN_HEADER,
    Floor,
    GuardConfig,
    LiveSampleSettings,
)
from rerank_operator.core import names
from rerank_operator.core.builders import deployment, pods
from rerank_operator.core.builders import fetch as fetching
from rerank_operator.core.platform import CHECKED, REFERENCE, GuardSettings
from rerank_operator.core.spec.model import RerankModelSpec

CONTAINER = "guard"
#: What a guard needs: one worker thread, small JSON bodies, numpy. Its requests are the class's to change.
DEFAULT_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "50m", "memory": "128Mi"},
                                        "limits": {"cpu": "500m", "memory": "512Mi"}}
#: A guard that scores FP32 itself holds the original weights in memory (bge-reranker-v2-m3: 2.3 GB) and runs
#: PyTorch on them: room for a model of that size. A larger model needs the class's ``qualityGuard.resources``.
LOCAL_REFERENCE_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "500m", "memory": "3Gi"},
                                                "limits": {"cpu": "2", "memory": "6Gi"}}
#: The mirrored fraction's resolution (the Gateway API's Fraction: numerator / denominator).
FRACTION_DENOMINATOR = 10000


def service_url(owner: names.Owner, service: str) -> str:
    """A Service of the model, as the guard (in the model's namespace or not) reaches it."""
    return f"http://{service}.{owner.namespace}.svc:{names.SERVICE_PORT}"


#: Where the guard of a model without a Gateway finds the served artifact (its evaluation pairs, to replay).
ARTIFACT_MOUNT = "/artifact"


def replays(spec: RerankModelSpec) -> bool:
    """Without a Gateway there is no mirror: the guard replays the served artifact's evaluation pairs instead."""
    return spec.routing.gateway is None


def local_reference(spec: RerankModelSpec) -> bool:
    """Without a GPU pool nothing serves the original weights: the guard scores them in FP32 itself, from the served
    artifact's ``original/`` (the Job always publishes it)."""
    return not spec.gpu.enabled


#: ``status.quality.reference`` when the guard scores FP32 itself (otherwise the reference pool's name).
REFERENCE_FP32 = "fp32"


def reference_of(spec: RerankModelSpec) -> str:
    """What the checked pool is compared with: the GPU pool, or FP32 of the original weights in the guard."""
    return REFERENCE_FP32 if local_reference(spec) else REFERENCE


def mounts_artifact(spec: RerankModelSpec) -> bool:
    """The guard reads the served artifact: its evaluation pairs to replay, or its original weights to score."""
    return replays(spec) or local_reference(spec)


#: Where the guard keeps the model's live sample (the volume's ``samples/<model>``, with the tenant's consent).
SAMPLE_MOUNT = "/var/lib/rerank-guard/samples"


def samples_live(spec: RerankModelSpec) -> bool:
    """With the tenant's consent (``quantization.requantizeOnDrift``) the guard keeps a sample of the mirrored
    requests on the model's volume, the data a re-quantization on drift runs on (``core/quality/requantize.py``)."""
    return spec.quantization.requantize_on_drift.enabled and not replays(spec)


def guard_config(owner: names.Owner, spec: RerankModelSpec, settings: GuardSettings,
                 below_floor: Iterable[str], canary: bool = False, max_input_tokens: int = 0) -> GuardConfig:
    """The guard's configuration (the contract's ``GuardConfig``).

    The mirror already samples (``settings.sample_fraction`` of the model's requests), so the guard checks every copy
    it gets, within its budget. The floor is the model's quantization gate, the one its artifact passed. While a new
    artifact is a canary (``canary``), the guard checks it too, against the same reference. Without a Gateway
    (``replays``) it replays the artifact's evaluation pairs as fast as its budget allows. Without a GPU pool
    (``local_reference``) the reference is FP32 of the artifact's original weights, scored in the guard; the budget
    counts it as one call per sampled request, like a TEI reference, which bounds that compute too; it truncates
    pairs as the CPU pool does, whose token budget comes from the served artifact (``max_input_tokens``)."""
    gate = spec.quantization.quality_gate
    local = local_reference(spec)
    key_env = {}
    endpoints = ([(CHECKED, CHECKED)] + ([] if local else [(REFERENCE, "reference")])
                 + ([(CHECKED, names.CANARY)] if canary else []))
    for pool, endpoint in endpoints:  # the canary runs the CPU pool's settings, its key included
        if spec.pool(pool).tei.api_key_secret is not None:
            key_env[endpoint] = _key_env(pool)
    pools = {CHECKED: service_url(owner, names.pool_service_name(owner.name, CHECKED)),
             **({names.CANARY: service_url(owner, names.canary_name(owner.name))} if canary else {})}
    live = None
    if samples_live(spec):
        policy = spec.quantization.requantize_on_drift
        live = LiveSampleSettings(f"{SAMPLE_MOUNT}/{artifact_layout.LIVE_SAMPLE_FILE}", policy.max_pairs,
                                  policy.max_age_hours * 3600)
    return GuardConfig(
        namespace=owner.namespace,
        model=owner.name,
        pools=pools,
        reference=LOCAL_REFERENCE if local else service_url(owner, names.pool_service_name(owner.name, REFERENCE)),
        reference_model=f"{ARTIFACT_MOUNT}/{artifact_layout.ORIGINAL_SUBDIR}" if local else None,
        reference_max_batch_tokens=deployment.batch_tokens(spec.cpu.tei, max_input_tokens) if local else None,
        reference_auto_truncate=spec.cpu.tei.auto_truncate if local else True,
        floor=Floor(gate.min_spearman, gate.min_topk_agreement),
        k=gate.topk,
        fraction=1.0,
        calls_per_second=settings.calls_per_second,
        below_floor=tuple(sorted(set(below_floor) & {CHECKED})),
        api_key_env=key_env,
        mirror_token_env=MIRROR_TOKEN_ENV,
        replay=f"{ARTIFACT_MOUNT}/{artifact_layout.EVALUATION_FILE}" if replays(spec) else None,
        replay_per_second=settings.calls_per_second / (len(pools) + 1) if replays(spec) else 0.0,
        live_sample=None if replays(spec) else live,
    )


def _key_env(pool: names.PoolName) -> str:
    return f"RERANK_GUARD_API_KEY_{pool.upper()}"


def mirror_token(live: Mapping[str, Any] | None) -> str:
    """The model's mirror token: the one its guard Deployment ``live`` carries, or a new random one (no guard yet,
    or one without a token: a guard of an older version, or deleted by hand)."""
    containers = ((((live or {}).get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or ()
    for container in containers:
        if container.get("name") == CONTAINER:
            for var in container.get("env") or ():
                if var.get("name") == MIRROR_TOKEN_ENV and var.get("value"):
                    return str(var["value"])
    return secrets.token_urlsafe(32)


def build_guard_deployment(owner: names.Owner, spec: RerankModelSpec, settings: GuardSettings,
                           below_floor: Iterable[str], canary: bool = False, *, claim: str = "",
                           artifact_id: str | None = None, max_input_tokens: int = 0,
                           token: str = "", fetch: fetching.Fetch | None = None) -> dict[str, Any]:
    """``claim`` and ``artifact_id``: the volume and the served artifact, mounted read-only when the guard reads it
    (``mounts_artifact``); with the tenant's consent (``samples_live``) the model's ``samples/<model>`` read-write.
    ``max_input_tokens``: the served artifact's (``guard_config``). ``token``: the model's mirror token
    (``mirror_token``; empty: the guard takes no POST at all). ``fetch``: the served artifact is a shared one, which
    an init container fetches (the parts the guard reads) instead of a claim holding it."""
    config = guard_config(owner, spec, settings, below_floor, canary, max_input_tokens)
    env: list[dict[str, Any]] = [{"name": CONFIG_ENV, "value": config.to_json()},
                                 {"name": MIRROR_TOKEN_ENV, "value": token}]
    local = local_reference(spec)
    for pool in (CHECKED,) if local else (CHECKED, REFERENCE):  # only the pools it calls: a disabled pool's Secret
        secret = spec.pool(pool).tei.api_key_secret             # may be gone
        if secret is not None:
            env.append(pods.secret_env(_key_env(pool), secret.name, secret.key))
    if local:  # PyTorch writes under the temporary directory as it imports; never reach the hub from here
        env += [{"name": "HOME", "value": "/tmp"}, {"name": "HF_HOME", "value": "/tmp/hf"},
                {"name": "HF_HUB_OFFLINE", "value": "1"}]
    probe = {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "timeoutSeconds": 3}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": settings.image or spec.quantization.image,
        "command": ["python", "-m", "quality_guard.server", "--config-env", CONFIG_ENV,
                    "--port", str(names.GUARD_PORT)],
        "env": env,
        "ports": [{"name": "http", "containerPort": names.GUARD_PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "failureThreshold": 3},
        "livenessProbe": {**probe, "failureThreshold": 6},
        "resources": {k: dict(v) for k, v in (settings.resources or (
            LOCAL_REFERENCE_RESOURCES if local else DEFAULT_RESOURCES)).items()},
        "securityContext": pods.container_security_context(),
    }
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    fetched = fetch is not None and artifact_id is not None and mounts_artifact(spec)
    reads = mounts_artifact(spec) and bool((claim or fetched) and artifact_id)
    writes = samples_live(spec) and bool(claim) and not fetched  # a shared artifact's model keeps no sample
    if reads:
        mounts.append({"name": pods.MODEL_VOLUME, "mountPath": ARTIFACT_MOUNT, "readOnly": True,
                       "subPath": f"{artifact_layout.ARTIFACTS_DIR}/{artifact_id}"})
    if writes:  # its own directory only: the artifacts stay read-only to it
        mounts.append({"name": pods.MODEL_VOLUME, "mountPath": SAMPLE_MOUNT,
                       "subPath": f"{artifact_layout.SAMPLES_DIR}/{owner.name}"})
    init: list[dict[str, Any]] = []
    if fetched:
        assert fetch is not None and artifact_id is not None
        volumes += fetching.volumes(fetch)
        parts = ((artifact_layout.EVALUATION_FILE,) if replays(spec) else ()) + (
            (artifact_layout.ORIGINAL_SUBDIR,) if local_reference(spec) else ())
        init.append(fetching.init_container(fetch, artifact_id, parts))
        if not local:  # the init container writes under /tmp too
            volumes.append(pods.scratch_volume())
    elif reads or writes:
        volumes.append(pods.model_volume(claim, read_only=not writes))
    if local:  # the root filesystem is read-only; torch needs a writable temporary directory (os.makedirs at import)
        mounts.append({"name": pods.SCRATCH_VOLUME, "mountPath": "/tmp"})
        volumes.append(pods.scratch_volume())
    if mounts:
        container["volumeMounts"] = mounts
    cpu = spec.cpu
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pods.pod_security_context(),
        "containers": [container],
    }
    if volumes:
        pod_spec["volumes"] = volumes
    if init:
        pod_spec["initContainers"] = init
    # Where the CPU pool may run, the guard may too (a tenant's nodes, taints and all).
    if cpu.node_selector:
        pod_spec["nodeSelector"] = dict(cpu.node_selector)
    if cpu.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in cpu.tolerations]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.child_metadata(owner, names.guard_name(owner.name), names.COMPONENT_GUARD),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": names.selector_labels(owner.name, names.COMPONENT_GUARD)},
            "revisionHistoryLimit": 2,
            "template": {"metadata": {"labels": names.labels(owner.name, names.COMPONENT_GUARD)}, "spec": pod_spec},
        },
    }


def build_guard_service(owner: names.Owner) -> dict[str, Any]:
    """The HTTPRoute's mirror backend (a Gateway mirrors to a Service, not to pods)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.child_metadata(owner, names.guard_name(owner.name), names.COMPONENT_GUARD),
        "spec": {
            "type": "ClusterIP",
            "selector": names.selector_labels(owner.name, names.COMPONENT_GUARD),
            "ports": [{"name": "http", "port": names.SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def route_filters(owner: names.Owner, settings: GuardSettings, token: str) -> list[dict[str, Any]]:
    """The HTTPRoute rule's filters for the guard, in the order the Gateway API says implementations apply them:
    the model's mirror token set in a header (``set`` replaces whatever a client sent), then the RequestMirror of
    ``sample_fraction`` of the requests to the guard, which so receives the token with each copy."""
    numerator = max(1, min(FRACTION_DENOMINATOR, round(settings.sample_fraction * FRACTION_DENOMINATOR)))
    return [
        {"type": "RequestHeaderModifier", "requestHeaderModifier": {
            "set": [{"name": MIRROR_TOKEN_HEADER, "value": token}]}},
        {"type": "RequestMirror", "requestMirror": {
            "backendRef": {"name": names.guard_name(owner.name), "port": names.SERVICE_PORT},
            "fraction": {"numerator": numerator, "denominator": FRACTION_DENOMINATOR},
        }},
    ]
