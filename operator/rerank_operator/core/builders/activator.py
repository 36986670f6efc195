"""What a model at zero is routed through: the platform's activator (``rerank_activator``). Pure.

While a model is going to, at or waking from zero (``autoscale/zero.py``), its HTTPRoute has one backend, the
activator's Service in the operator's namespace, and sets the three headers of the activator's contract
(``rerank_contracts.activator``): which model, where it is served once awake (its wake pool's Service), and a token
over both made with the key only the operator and the activator hold. A route may name a Service in another
namespace only where a ReferenceGrant there allows it: one per model namespace (``build_reference_grant``), which the
operator writes when a model of that namespace may go to zero.
"""

from __future__ import annotations

from typing import Any

from rerank_contracts.activator import (
    MODEL_HEADER,
    TOKEN_HEADER,
    UPSTREAM_HEADER,
    token,
)
from rerank_operator.core import names
from rerank_operator.core.platform import Activator
from rerank_operator.core.spec.model import RerankModelSpec

GATEWAY_GROUP = "gateway.networking.k8s.io"
#: The route's request timeout while the activator holds the model's requests: its hold (the chart's
#: ``activator.holdSeconds``, 30 s by default, at most 50) and the woken pool's answer must fit in it.
ROUTE_TIMEOUT = "60s"


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
