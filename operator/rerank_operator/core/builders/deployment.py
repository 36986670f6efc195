"""The CPU and GPU TEI Deployments.

The CPU pool mounts ``artifacts/<id>/cpu-int8`` (INT8 ONNX) read-only and TEI's ONNX Runtime backend serves it; the
GPU pool mounts ``artifacts/<id>/original`` (model.safetensors) and serves it with ``--dtype float16``. The artifact
id is a pod-template annotation, so a new artifact rolls the pool; ``maxUnavailable: 0, maxSurge: 1`` keeps every
ready replica serving until its replacement is ready. With quantization disabled the pools serve the model as
published on the hub (``--model-id org/name --revision ...``) or, for the GPU pool, from ``model.path``.
The plan leaves replicas out of the applied manifest (``replicas=None``) and sets them through the Deployment's
scale subresource instead (``plan.Scale``), so server-side apply never owns the field: an HPA or KEDA that takes
over (``replicaManagement: external``) is never fought over it, and switching modes never resets it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rerank_contracts import artifact_layout
from rerank_operator.core import names
from rerank_operator.core.builders import cpu_check as cpu_checks
from rerank_operator.core.builders import fetch as fetching
from rerank_operator.core.builders import pods
from rerank_operator.core.builders import sampler as sampling
from rerank_operator.core.spec.model import TEI_MAX_BATCH_TOKENS, Pool, RerankModelSpec, TeiSettings
from rerank_operator.core.spec.quantities import parse_quantity

CONTAINER = "tei"
#: The name of a pool pod's serving port, what the Services and the PodMonitor name: TEI's own, or the quality guard's
#: sampler's in front of it (``sampler.py``), which passes TEI's /metrics through like every other path.
SERVING_PORT = "http"
MODEL_MOUNT = "/model"
DATA_MOUNT = "/data"  # TEI's hub cache (HUGGINGFACE_HUB_CACHE) when serving from the hub
STARTUP_PROBE_PERIOD = 2  # seconds: how late a pod that has loaded its model can turn Ready
STARTUP_PROBE_WINDOW = 900  # seconds a pod may take to load its model before the kubelet restarts it
#: Seconds a pod that is being removed keeps serving before TEI gets SIGTERM: its endpoint's removal must first reach
#: every kube-proxy, gateway and client that routes to it (seconds; more behind some ingress controllers).
PRESTOP_DELAY = 10
#: The pod's whole grace period: the delay above, then TEI's own graceful shutdown (it stops accepting and finishes
#: the requests it holds; a CPU replica's queue drains in seconds, a GPU replica's batch in less).
TERMINATION_GRACE = PRESTOP_DELAY + 50


def artifact_subdir(pool: Pool, artifact_id: str) -> str:
    sub = artifact_layout.CPU_SUBDIR if pool.name == "cpu" else artifact_layout.ORIGINAL_SUBDIR
    return f"{artifact_layout.ARTIFACTS_DIR}/{artifact_id}/{sub}"


def batch_tokens(tei: TeiSettings, max_input_tokens: int = 0) -> int:
    """``--max-batch-tokens``: the pool's own setting; unset (the CPU pool's default), the served model's maximum
    input length as its artifact reports it (``max_input_tokens``), else TEI's default.

    Why the maximum input length: TEI's ONNX Runtime backend pads every batch of up to 8 pairs to its longest, and
    takes a pair into a batch only while entries x longest stays within this budget. At TEI's 16384 one long passage
    pads seven short ones; at the maximum input length a batch never holds more than one longest pair's worth of
    tokens, and nothing is truncated that TEI would not truncate anyway (TEI truncates pairs to this budget when it is
    smaller). The Job times its candidates within the same budget (``--serve-batch-tokens``)."""
    if tei.max_batch_tokens is not None:
        return tei.max_batch_tokens
    return max_input_tokens or TEI_MAX_BATCH_TOKENS


def tei_args(spec: RerankModelSpec, pool: Pool, artifact_id: str | None, max_input_tokens: int = 0) -> list[str]:
    """TEI's command line. Kubernetes args replace the image's CMD, so --json-output and --port are ours to pass.
    ``max_input_tokens``: the served artifact's (``batch_tokens``)."""
    local = artifact_id is not None or spec.model.id is None
    args = ["--model-id", MODEL_MOUNT if local else str(spec.model.id)]
    if not local and spec.model.revision:
        args += ["--revision", spec.model.revision]
    tei = pool.tei
    args += [
        "--port", str(names.TEI_PORT),
        "--json-output",
        "--max-batch-tokens", str(batch_tokens(tei, max_input_tokens)),
        "--max-concurrent-requests", str(tei.max_concurrent_requests),
        "--max-client-batch-size", str(tei.max_client_batch_size),
    ]
    if tei.auto_truncate:
        args.append("--auto-truncate")
    if pool.name == "gpu":
        args += ["--dtype", pool.dtype]
    return args + list(tei.extra_args)


def container_resources(pool: Pool) -> dict[str, Any]:
    """The TEI container's resources: the pool's, and for the CPU pool a CPU limit when it has only a request.

    Why: TEI sizes ONNX Runtime's intra-op thread pool and its tokenization workers from the CPUs it can see
    (``num_cpus``: the cgroup CPU quota, else every core the node lets it run on). With a request and no limit, a pod
    that asked for 2 CPUs on a 64-core node runs 64 inference threads and 63 tokenizers in 2 CPUs' worth of time
    (huggingface/text-embeddings-inference #170, #404: about 6x slower). A limit of the request rounded up to whole
    CPUs makes TEI's threads exactly the CPUs it is given. A limit the user set is kept as it is."""
    resources = {k: dict(v) if isinstance(v, Mapping) else v for k, v in pool.resources.items()}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if pool.name == "cpu" and "cpu" in requests and "cpu" not in limits:
        resources["limits"] = {**limits, "cpu": str(math.ceil(parse_quantity(requests["cpu"])))}
    return resources


def pool_cpus(pool: Pool) -> int:
    """The CPUs TEI in ``pool`` sizes its threads to: its container's CPU limit rounded up; 0 when it has none."""
    limits = container_resources(pool).get("limits") or {}
    return math.ceil(parse_quantity(limits["cpu"])) if "cpu" in limits else 0


def _probe(path: str, period: int, failures: int, timeout: int = 5, port: str = "http") -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": timeout,
    }


def build_deployment(
    owner: names.Owner,
    spec: RerankModelSpec,
    pool: Pool,
    artifact_id: str | None,
    replicas: int | None,
    claim: str,
    *,
    canary: bool = False,
    max_input_tokens: int = 0,
    fetch: fetching.Fetch | None = None,
    sampler: sampling.Sidecar | None = None,
    cpu_check: cpu_checks.CpuCheck | None = None,
) -> dict[str, Any]:
    """A pool's TEI Deployment; ``canary``: the CPU pool's twin ``<name>-canary`` serving a new artifact beside the
    stable one (plan.py) — its own component and no pool label, so neither the pool's Service nor the autoscaler's pool
    signals count its pods. ``max_input_tokens``: what the served artifact reports (status.artifact), the CPU pool's
    default token budget (``batch_tokens``). ``fetch``: the artifact is a shared one, fetched into an emptyDir by an
    init container (``fetch.py``) instead of read from the claim. ``sampler``: the pod's front (``sampler.py``: the
    rerank API, the guard's sample), which then takes the pod's ``http`` port. ``cpu_check``: the CPU pool checks its
    node against the artifact's target before anything else (``cpu_check.py``)."""
    component = names.COMPONENT_CANARY if canary else names.pool_component(pool.name)
    env: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = [
        {"name": pods.SCRATCH_VOLUME, "mountPath": "/tmp"},
        {"name": "hub-cache", "mountPath": DATA_MOUNT},
    ]
    volumes: list[dict[str, Any]] = [pods.scratch_volume(), pods.scratch_volume("hub-cache")]
    if artifact_id is not None or spec.model.path is not None:
        sub = artifact_subdir(pool, artifact_id) if artifact_id is not None else str(spec.model.path)
        mounts.append({"name": pods.MODEL_VOLUME, "mountPath": MODEL_MOUNT, "subPath": sub, "readOnly": True})
        if fetch is not None and artifact_id is not None:
            volumes += fetching.volumes(fetch)
        else:
            volumes.append(pods.model_volume(claim, read_only=True))
    else:
        env.append({"name": "HUGGINGFACE_HUB_CACHE", "value": DATA_MOUNT})
        if spec.model.token_secret:
            env.append(pods.secret_env("HF_TOKEN", spec.model.token_secret.name, spec.model.token_secret.key))
    if pool.tei.api_key_secret:
        env.append(pods.secret_env("API_KEY", pool.tei.api_key_secret.name, pool.tei.api_key_secret.key))
    port = "tei" if sampler is not None else SERVING_PORT
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": pool.image,
        "args": tei_args(spec, pool, artifact_id, max_input_tokens),
        "ports": [{"name": port, "containerPort": names.TEI_PORT, "protocol": "TCP"}],
        "volumeMounts": mounts,
        # Loading a large model (GPU, cold volume) can take minutes: the startup probe covers 15 of them. Every 2 s:
        # a CPU pod's TEI serves ~1 s after it starts (benchmarks/serving_e2e.py), and a 10 s period kept a new
        # replica out of the Service ~10 s longer, on each scale-up under load.
        "startupProbe": _probe("/health", period=STARTUP_PROBE_PERIOD, failures=STARTUP_PROBE_WINDOW // 2, port=port),
        "readinessProbe": _probe("/health", period=10, failures=3, port=port),
        "livenessProbe": _probe("/health", period=20, failures=6, port=port),
        # A scale-down or roll deletes a pod while clients still send to it: without the delay, TEI closed its
        # listener at once and requests already routed to the pod hung until they timed out (serving_e2e: ~20 lost
        # on one 2 -> 1 scale-down). An exec sleep works on every supported Kubernetes (the sleep action is GA
        # only from 1.34) and in TEI's images; an image without `sleep` only loses the delay (an event says so).
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_DELAY)]}}},
        "securityContext": pods.container_security_context(),
    }
    if env:
        container["env"] = env
    resources = container_resources(pool)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pods.pod_security_context(),
        "terminationGracePeriodSeconds": TERMINATION_GRACE,
        "containers": [container, *([sampling.container(sampler)] if sampler is not None else [])],
        "volumes": volumes,
    }
    init = [cpu_checks.init_container(cpu_check)] if cpu_check is not None and pool.name == "cpu" else []
    if fetch is not None and artifact_id is not None:
        init.append(fetching.init_container(fetch, artifact_id, (fetching.part_of(pool.name),)))
    if init:
        pod_spec["initContainers"] = init
    if pool.node_selector:
        pod_spec["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in pool.tolerations]
    affinity = (cpu_checks.preferring_capable_nodes(pool.affinity, cpu_check)
                if cpu_check is not None and pool.name == "cpu" else pool.affinity)
    if affinity:
        pod_spec["affinity"] = dict(affinity)
    pod_labels = {
        **names.labels(owner.name, component),
        **({} if canary else {names.LABEL_POOL: pool.name}),
        names.LABEL_SERVING: "true",
    }
    template_meta: dict[str, Any] = {"labels": pod_labels}
    if artifact_id is not None:
        template_meta["annotations"] = {names.ANNOTATION_ARTIFACT: artifact_id}
    deployment_spec: dict[str, Any] = {
        "selector": {"matchLabels": names.selector_labels(owner.name, component)},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": 1200,
        "template": {"metadata": template_meta, "spec": pod_spec},
    }
    if replicas is not None:
        deployment_spec["replicas"] = replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": names.child_metadata(
            owner, names.canary_name(owner.name) if canary else names.deployment_name(owner.name, pool.name),
            component, extra_labels=None if canary else {names.LABEL_POOL: pool.name}),
        "spec": deployment_spec,
    }


def served_artifact(deployment: Mapping[str, Any] | None) -> str | None:
    """The artifact id a live Deployment's pod template serves."""
    if not deployment:
        return None
    template = deployment.get("spec", {}).get("template", {})
    value = (template.get("metadata", {}).get("annotations") or {}).get(names.ANNOTATION_ARTIFACT)
    return str(value) if value is not None else None
