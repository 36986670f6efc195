"""The traffic split between the pools, and the HTTPRoute that enforces it when a Gateway is given.

Here the split is static per policy (the metrics-driven one is the autoscaler's, which records its decision in
``status.autoscaling.lastDecision``; the split is then taken from there, still within the policy). One safety rule
holds for every policy, as in the autoscaler: a pool with no ready replica gets no traffic while the other has some,
because a weight on an empty backend is a share of requests that fail. One quality rule holds for every policy too:
a pool the quality guard finds below the model's quality floor (``status.quality.belowFloor``,
``core/quality/assessment.py``) gets no traffic while the other pool has ready replicas (a worse ranking beats a failed
request, so not otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.spec.model import RerankModelSpec


@dataclass(frozen=True)
class Traffic:
    gpu_percent: int
    cpu_percent: int
    reason: str

    @property
    def receiving(self) -> tuple[names.PoolName, ...]:
        """Pools that get a share of requests."""
        shares: tuple[tuple[names.PoolName, int], ...] = (("cpu", self.cpu_percent), ("gpu", self.gpu_percent))
        return tuple(p for p, share in shares if share > 0)


def build_httproute(owner: names.Owner, spec: RerankModelSpec, traffic: Traffic,
                    filters: Sequence[Mapping[str, Any]] = (), canary_percent: int = 0,
                    backends: Sequence[Mapping[str, Any]] | None = None,
                    request_timeout: str | None = None) -> dict[str, Any] | None:
    """The HTTPRoute ``<name>`` with one weighted backend per enabled pool, or None without gateway.parentRefs.
    ``filters``: the rule's filters, in order (the quality guard's token header and mirror, ``guard.route_filters``).
    ``canary_percent``: a new artifact's canary (``<name>-canary``) takes that share of all requests; the pools share
    the rest in the split's proportions (weights are relative: the pools' are scaled by 100 - canary_percent, so their
    ratio, which the autoscaler reads back as the split, is unchanged). ``backends``: instead of the pools, these
    (a model at zero is routed to the activator: ``builders/activator.py``). ``request_timeout``: the rule's
    ``timeouts.request`` (a held request outlasts a Gateway's default: Envoy's is 15 s)."""
    gateway = spec.routing.gateway
    if gateway is None:
        return None
    if backends is None:
        backends = _pool_backends(owner, spec, traffic, canary_percent)
    rule: dict[str, Any] = {"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                            "backendRefs": [dict(b) for b in backends]}
    if filters:
        rule["filters"] = [dict(f) for f in filters]
    if request_timeout:
        rule["timeouts"] = {"request": request_timeout}
    route_spec: dict[str, Any] = {
        "parentRefs": [dict(ref) for ref in gateway.parent_refs],
        "rules": [rule],
    }
    if gateway.hostnames:
        route_spec["hostnames"] = list(gateway.hostnames)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": names.child_metadata(owner, names.route_name(owner.name), "route"),
        "spec": route_spec,
    }


def _pool_backends(owner: names.Owner, spec: RerankModelSpec, traffic: Traffic,
                   canary_percent: int) -> list[dict[str, Any]]:
    shares = {"gpu": traffic.gpu_percent, "cpu": traffic.cpu_percent}
    scale = 100 - canary_percent if canary_percent > 0 else 1
    backends = [
        {"name": names.pool_service_name(owner.name, pool.name), "port": names.SERVICE_PORT,
         "weight": shares[pool.name] * scale}
        for pool in spec.enabled_pools
    ]
    if canary_percent > 0:
        backends.append({"name": names.canary_name(owner.name), "port": names.SERVICE_PORT,
                         "weight": canary_percent * 100})
    return backends
