"""What a model at zero is routed through: the platform's activator (``rerank_activator``). Pure.

While a model is going to, at or waking from zero (``autoscale/zero.py``), its HTTPRoute has one backend, the
activator's Service in the operator's namespace, and sets the three headers of the activator's contract
(``rerank_contracts.activator``): which model, where it is served once awake (its wake pool's Service), and a token
over both made with the key only the operator and the activator hold. A route may name a Service in another
namespace only where a ReferenceGrant there allows it: one per model namespace (``build_reference_grant``), which the
operator writes when a model of that namespace may go to zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rerank_contracts.activator import (
    MIN_KEY_BYTES,
    MODEL_HEADER,
    POD_LABELS,
    PORT,
    TOKEN_HEADER,
    UPSTREAM_HEADER,
    token,
)
from rerank_operator.core import names
from rerank_operator.core.spec import RerankModelSpec

GATEWAY_GROUP = "gateway.networking.k8s.io"
#: The route's request timeout while the activator holds the model's requests: its hold (the chart's
#: ``activator.holdSeconds``, 30 s by default, at most 50) and the woken pool's answer must fit in it.
ROUTE_TIMEOUT = "60s"


@dataclass(frozen=True)
class Activator:
    """The platform's activator (``--activator-url``, ``--activator-service``, ``--activator-key-file``)."""

    url: str            # where the operator polls GET /pending
    namespace: str      # the Service's namespace (the operator's, as the chart deploys it)
    service: str
    port: int = PORT
    key: bytes = field(default=b"", repr=False)
    #: The activator's pods' labels (the chart's), which a sleeping model's NetworkPolicy lets into its pools.
    pod_labels: Mapping[str, str] = field(default_factory=lambda: dict(POD_LABELS))

    @classmethod
    def parse_service(cls, url: str, service: str, key: bytes) -> Activator:
        """From ``--activator-service`` ``<namespace>/<name>:<port>``; ValueError with what is wrong."""
        namespace, sep, rest = service.partition("/")
        name, colon, port = rest.partition(":")
        if not sep or not namespace or not name:
            raise ValueError(f"--activator-service {service!r} is not <namespace>/<name>[:<port>]")
        if colon and not port.isdigit():
            raise ValueError(f"--activator-service {service!r}: the port must be a number")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--activator-url {url!r} is not an http(s) URL")
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"the activator key must be at least {MIN_KEY_BYTES} bytes")
        return cls(url.rstrip("/"), namespace, name, int(port) if colon else PORT, key)


def upstream(owner: names.Owner, spec: RerankModelSpec) -> str:
    """Where the activator forwards the model's held requests: its wake pool's Service."""
    service = names.pool_service_name(owner.name, names.wake_pool(spec.cpu.enabled))
    return f"http://{service}.{owner.namespace}.svc:{names.SERVICE_PORT}"


def route_filters(owner: names.Owner, spec: RerankModelSpec, activator: Activator) -> list[dict[str, Any]]:
    """The route's headers for the activator, ``set`` so that a client cannot choose them."""
    model = f"{owner.namespace}/{owner.name}"
    target = upstream(owner, spec)
    return [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [
        {"name": MODEL_HEADER, "value": model},
        {"name": UPSTREAM_HEADER, "value": target},
        {"name": TOKEN_HEADER, "value": token(activator.key, model, target)},
    ]}}]


def backends(activator: Activator) -> list[dict[str, Any]]:
    """The route's one backend while the model is routed to the activator."""
    return [{"group": "", "kind": "Service", "name": activator.service, "namespace": activator.namespace,
             "port": activator.port, "weight": 1}]


def reference_grant_name(namespace: str) -> str:
    return f"rerank-activator-from-{namespace}"[:253]


def build_reference_grant(activator: Activator, from_namespace: str) -> dict[str, Any]:
    """The ReferenceGrant in the activator's namespace that lets HTTPRoutes of ``from_namespace`` name its
    Service (and nothing else of that namespace)."""
    return {
        "apiVersion": f"{GATEWAY_GROUP}/v1beta1",
        "kind": "ReferenceGrant",
        "metadata": {"name": reference_grant_name(from_namespace), "namespace": activator.namespace,
                     "labels": {names.LABEL_MANAGED_BY: names.OPERATOR_NAME, names.LABEL_PART_OF: names.PART_OF,
                                names.LABEL_COMPONENT: "activator-grant"}},
        "spec": {"from": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "namespace": from_namespace}],
                 "to": [{"group": "", "kind": "Service", "name": activator.service}]},
    }




def phase(decision: Mapping[str, Any] | None) -> str | None:
    """The scale-to-zero phase the autoscaler recorded (``lastDecision.scaleToZero``), None for other models."""
    value = (decision or {}).get("scaleToZero")
    return value if isinstance(value, str) else None


def routing_to(spec: RerankModelSpec, decision: Mapping[str, Any] | None,
               activator: Activator | None) -> Activator | None:
    """The activator the model's route must point at now, or None (it routes to its pools): the autoscaler took
    it towards zero, the operator knows an activator, and the model has a route to change."""
    if activator is None or spec.routing.gateway is None or phase(decision) not in names.ROUTED_TO_ACTIVATOR:
        return None
    return activator
