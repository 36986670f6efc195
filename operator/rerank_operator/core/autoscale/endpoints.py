"""Which Prometheus server the autoscaler queries for a model: the platform's choice, never the tenant's. Pure.

The operator is a privileged, cluster-wide pod; an HTTP request it sends to a host a tenant names is server-side
request forgery (a cloud metadata address, any in-cluster Service). So a RerankModel only picks a *source*
(``autoscaling.metrics.source``: ``direct`` or ``prometheus``); the server comes from the model's RerankClass
(``metrics.prometheus``) or, without one there, from the operator's own configuration (``--prometheus-url``, the
chart's ``prometheus.url``). The class may also restrict the sources (``metrics.allowedSources``). The ``direct``
source only ever scrapes the pool pods' own IPs, as the API reports them, at TEI's port.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rerank_operator.core.autoscale.config import InvalidAutoscalingSpec, PrometheusSettings

SOURCES = ("direct", "prometheus")


def allowed_sources(class_spec: Mapping[str, Any] | None) -> tuple[str, ...]:
    metrics = (class_spec or {}).get("metrics") or {}
    return tuple(s for s in metrics.get("allowedSources") or SOURCES if s in SOURCES)


def prometheus_for(source: str, class_spec: Mapping[str, Any] | None,
                   default: PrometheusSettings) -> PrometheusSettings:
    """The server for a model asking for ``source``; InvalidAutoscalingSpec when its class forbids the source or
    the platform configured no server. ``class_spec`` is None when no RerankClass applies."""
    if source not in allowed_sources(class_spec):
        raise InvalidAutoscalingSpec(
            f"autoscaling.metrics.source {source} is not allowed by the model's RerankClass: metrics.allowedSources is "
            f"[{', '.join(allowed_sources(class_spec))}]")
    if source != "prometheus":
        return PrometheusSettings()
    configured = ((class_spec or {}).get("metrics") or {}).get("prometheus") or {}
    chosen = PrometheusSettings(url=configured.get("url") or None,
                                gpu_memory_used_query=configured.get("gpuMemoryUsedQuery") or None,
                                gpu_memory_total_query=configured.get("gpuMemoryTotalQuery") or None)
    if chosen.url is None:
        chosen = default
    if chosen.url is None:
        raise InvalidAutoscalingSpec(
            "autoscaling.metrics.source is prometheus but the platform configured no Prometheus server: set the "
            "RerankClass's metrics.prometheus.url or the operator's --prometheus-url (chart value prometheus.url), "
            "or use source direct")
    return chosen
