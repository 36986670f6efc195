"""Parse the serving half of a RerankModel's ``spec``: the pools (TEI settings, placement, resources), routing
and autoscaling. Separate from ``spec_parse`` (the model, its quantization and storage) because the autoscaler
re-reads exactly these sections (``autoscale/config.py``), and these alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.spec import fields, shapes, tei_flags
from rerank_operator.core.spec.model import (
    DEFAULT_CPU_RESOURCES,
    DEFAULT_MAX_REPLICAS,
    DEFAULT_MIN_REPLICAS,
    ROUTING_POLICIES,
    TEI_CPU_IMAGE,
    TEI_GPU_IMAGE,
    TEI_MAX_BATCH_TOKENS,
    Autoscaling,
    Gateway,
    Pool,
    Routing,
    SpecError,
    Spillover,
    StepBehavior,
    Targets,
    TeiSettings,
    Weights,
)


def _tei(section: Mapping[str, Any], path: str, cpu: bool) -> TeiSettings:
    """``cpu``: the CPU pool, whose unset ``maxBatchTokens`` is left to the served artifact (None)."""
    d = TeiSettings()
    extra = fields.strings(section, "extraArgs", f"{path}.extraArgs")
    refused = tei_flags.refusals(extra, f"{path}.extraArgs")
    if refused:
        raise SpecError("; ".join(refused))
    return TeiSettings(
        max_batch_tokens=(None if cpu and section.get("maxBatchTokens") is None else
                          fields.integer(section, "maxBatchTokens", f"{path}.maxBatchTokens", TEI_MAX_BATCH_TOKENS, 1)),
        max_concurrent_requests=fields.integer(section, "maxConcurrentRequests", f"{path}.maxConcurrentRequests",
                                               d.max_concurrent_requests, 1),
        max_client_batch_size=fields.integer(section, "maxClientBatchSize", f"{path}.maxClientBatchSize",
                                             d.max_client_batch_size, 1),
        auto_truncate=fields.boolean(section, "autoTruncate", f"{path}.autoTruncate", d.auto_truncate),
        api_key_secret=fields.secret(fields.obj(section, "apiKeySecretRef", f"{path}.apiKeySecretRef"),
                                     f"{path}.apiKeySecretRef"),
        extra_args=tuple(extra),
    )


AFFINITY_KINDS = ("nodeAffinity", "podAffinity", "podAntiAffinity")


def _placement(section: Mapping[str, Any], path: str) -> tuple[dict[str, str], tuple[dict[str, Any], ...],
                                                               dict[str, Any] | None]:
    selector = dict(fields.obj(section, "nodeSelector", f"{path}.nodeSelector"))
    for key, value in selector.items():
        if not shapes.label_key(str(key)) or not isinstance(value, str) or not shapes.label_value(value):
            raise SpecError(f"{path}.nodeSelector {key}={fields.show(value)} is not a label key and value")
    tolerations = []
    for t in fields.items(section, "tolerations", f"{path}.tolerations"):
        if not isinstance(t, Mapping):
            raise SpecError(f"{path}.tolerations entries must be objects, got {fields.show(t)}")
        tolerations.append(dict(t))
    affinity = fields.obj(section, "affinity", f"{path}.affinity")
    unknown = [k for k in affinity if k not in AFFINITY_KINDS]
    if unknown:
        raise SpecError(f"{path}.affinity {', '.join(map(str, unknown))}: only {', '.join(AFFINITY_KINDS)} are allowed")
    return selector, tuple(tolerations), dict(affinity) if affinity else None


def parse_pool(name: names.PoolName, section: Mapping[str, Any], *, present: bool) -> Pool:
    """``spec.pools.<name>`` alone; ``present``: the section exists (an absent GPU section means no GPU pool)."""
    cpu = name == "cpu"
    path = f"pools.{name}"
    low = fields.integer(section, "minReplicas", f"{path}.minReplicas", DEFAULT_MIN_REPLICAS, 0)
    # An unset maxReplicas is never below minReplicas: a default cannot make a spec contradict itself.
    high = fields.integer(section, "maxReplicas", f"{path}.maxReplicas", max(low, DEFAULT_MAX_REPLICAS[name]), 1)
    if low > high:
        raise SpecError(f"{path}.minReplicas {low} is above {path}.maxReplicas {high}")
    selector, tolerations, affinity = _placement(section, path)
    resources = (fields.resources(fields.obj(section, "resources", f"{path}.resources"), f"{path}.resources")
                 if "resources" in section else dict(DEFAULT_CPU_RESOURCES if cpu else {}))
    return Pool(
        name=name,
        enabled=present and fields.boolean(section, "enabled", f"{path}.enabled", True),
        image=fields.checked(section, "image", f"{path}.image", shapes.image, "an image reference",
                             default=TEI_CPU_IMAGE if cpu else TEI_GPU_IMAGE) or "",
        min_replicas=low,
        max_replicas=high,
        resources=resources,
        node_selector=selector,
        tolerations=tolerations,
        affinity=affinity,
        tei=_tei(fields.obj(section, "tei", f"{path}.tei"), f"{path}.tei", cpu),
        dtype=fields.choice(section, "dtype", f"{path}.dtype", "float16", ("float16", "float32")),
        allow_without_gpu_resource=fields.boolean(section, "allowWithoutGPUResource",
                                                  f"{path}.allowWithoutGPUResource", False),
    )


def _gateway(section: Mapping[str, Any]) -> Gateway | None:
    refs = fields.items(section, "parentRefs", "routing.gateway.parentRefs")
    if not refs:
        return None
    parents = []
    for ref in refs:
        if not isinstance(ref, Mapping):
            raise SpecError(f"routing.gateway.parentRefs entries must be objects, got {fields.show(ref)}")
        fields.checked(ref, "name", "routing.gateway.parentRefs[].name", shapes.dns_subdomain, "an object name")
        fields.checked(ref, "namespace", "routing.gateway.parentRefs[].namespace", shapes.dns_label,
                       "a namespace name (a DNS label)")
        parents.append(dict(ref))
    hostnames = fields.strings(section, "hostnames", "routing.gateway.hostnames")
    return Gateway(parent_refs=tuple(parents), hostnames=tuple(hostnames))


def parse_routing(section: Mapping[str, Any]) -> Routing:
    """``spec.routing`` alone (see ``parse_autoscaling``)."""
    weights = fields.obj(section, "weights", "routing.weights")
    return Routing(
        policy=fields.choice(section, "policy", "routing.policy", Routing.policy, ROUTING_POLICIES),
        weights=Weights(gpu=fields.integer(weights, "gpu", "routing.weights.gpu", 0, 0, 100),
                        cpu=fields.integer(weights, "cpu", "routing.weights.cpu", 0, 0, 100)) if weights else None,
        gateway=_gateway(fields.obj(section, "gateway", "routing.gateway")),
    )


def parse_autoscaling(section: Mapping[str, Any]) -> Autoscaling:
    """``spec.autoscaling`` alone (the autoscaler's unit tests and simulator build only this part of a spec)."""
    d = Autoscaling()
    metrics = fields.obj(section, "metrics", "autoscaling.metrics")
    targets = fields.obj(section, "targets", "autoscaling.targets")
    spill = fields.obj(section, "spillover", "autoscaling.spillover")
    t, sp = d.targets, d.spillover
    return Autoscaling(
        enabled=fields.boolean(section, "enabled", "autoscaling.enabled", d.enabled),
        interval_seconds=fields.integer(section, "intervalSeconds", "autoscaling.intervalSeconds", d.interval_seconds,
                                        1),
        replica_management=fields.choice(section, "replicaManagement", "autoscaling.replicaManagement",
                                         d.replica_management, ("operator", "external")),
        idle_seconds=fields.integer(section, "idleSeconds", "autoscaling.idleSeconds", d.idle_seconds, 30, 604800),
        source=fields.choice(metrics, "source", "autoscaling.metrics.source", d.source, ("direct", "prometheus")),
        stale_after_seconds=fields.number(metrics, "staleAfterSeconds", "autoscaling.metrics.staleAfterSeconds",
                                          d.stale_after_seconds, 1),
        targets=Targets(
            gpu_latency_p95_ms=fields.number(targets, "gpuLatencyP95Ms", "autoscaling.targets.gpuLatencyP95Ms",
                                             t.gpu_latency_p95_ms, 1),
            cpu_latency_p95_ms=fields.number(targets, "cpuLatencyP95Ms", "autoscaling.targets.cpuLatencyP95Ms",
                                             t.cpu_latency_p95_ms, 1),
            queue_per_replica=fields.number(targets, "queuePerReplica", "autoscaling.targets.queuePerReplica",
                                            t.queue_per_replica, 1),
            gpu_memory_watermark=fields.fraction(targets, "gpuMemoryWatermark",
                                                 "autoscaling.targets.gpuMemoryWatermark",
                                                 t.gpu_memory_watermark),
        ),
        scale_up=_behavior(fields.obj(section, "scaleUp", "autoscaling.scaleUp"), "autoscaling.scaleUp",
                           d.scale_up),
        scale_down=_behavior(fields.obj(section, "scaleDown", "autoscaling.scaleDown"), "autoscaling.scaleDown",
                             d.scale_down),
        spillover=Spillover(
            step_percent=fields.integer(spill, "stepPercent", "autoscaling.spillover.stepPercent", sp.step_percent, 1,
                                        100),
            recover_step_percent=fields.integer(spill, "recoverStepPercent", "autoscaling.spillover.recoverStepPercent",
                                                sp.recover_step_percent, 1, 100),
            max_cpu_percent=fields.integer(spill, "maxCpuPercent", "autoscaling.spillover.maxCpuPercent",
                                           sp.max_cpu_percent,
                                           0, 100),
            surge_max_step=fields.integer(spill, "surgeMaxStep", "autoscaling.spillover.surgeMaxStep",
                                          sp.surge_max_step,
                                          1, 1000),
        ),
    )


def _behavior(section: Mapping[str, Any], path: str, d: StepBehavior) -> StepBehavior:
    return StepBehavior(
        stabilization_seconds=fields.number(section, "stabilizationSeconds", f"{path}.stabilizationSeconds",
                                            d.stabilization_seconds, 0),
        max_step=fields.integer(section, "maxStep", f"{path}.maxStep", d.max_step, 1),
        cooldown_seconds=fields.number(section, "cooldownSeconds", f"{path}.cooldownSeconds", d.cooldown_seconds, 0),
    )
