"""The per-model NetworkPolicy: only the routing layer, allowed namespaces and the operator reach TEI pods; only the
routing layer and the operator reach the quality guard. Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rerank_contracts.guard import SAMPLER_PORT
from rerank_operator.core import names
from rerank_operator.core.tenancy import lookups as fields

Obj = Mapping[str, Any]


network_policy_name = names.network_policy_name


def build_network_policy(
    model: Obj,
    rclass: Obj | None,
    *,
    operator_namespace: str | None = None,
    operator_pod_labels: Mapping[str, str] | None = None,
    activator: tuple[str, Mapping[str, str]] | None = None,
) -> dict[str, Any] | None:
    """The NetworkPolicy isolating a model's TEI pods and its quality guard, or None when its class turns it off (or
    there is no class).

    Ingress to the TEI port only from: the routing layer (class ``network.routingNamespaces``, optionally only pods with
    ``routingPodLabels``), ``network.allowedNamespaces``, the model's own namespace (``allowSameNamespace``) and the
    operator (which scrapes TEI's /metrics for autoscaling); the model's quality guard where the class has one and the
    namespace is not already allowed; the same to the port of the pods' front (the rerank API). Ingress to the guard's
    port only from the routing layer (whose mirror sends it copies), the model's own pool pods (whose front does, on a
    gateway without RequestMirror) and the operator (which reads its verdicts): no other tenant pod, not even of the
    model's own namespace, may post to it (``quality_guard/intake.py`` checks the mirror's token as well). Egress is
    left alone (TEI downloads models). ``activator``: (namespace, pod labels) of the platform's activator, which
    forwards the requests it held while the model was at zero to its pools: given for models that may go to zero.
    """
    network = fields.get(rclass or {}, "spec", "network")
    if rclass is None or not network.get("enabled", True):
        return None
    meta = model["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    peers: list[dict[str, Any]] = []
    routing = ([_namespace_peer(network["routingNamespaces"], network.get("routingPodLabels") or {})]
               if network.get("routingNamespaces") else [])
    operator = [_namespace_peer([operator_namespace], operator_pod_labels or {})] if operator_namespace else []
    peers.extend(routing)
    if network.get("allowedNamespaces"):
        peers.append(_namespace_peer(network["allowedNamespaces"], {}))
    if network.get("allowSameNamespace", True):
        peers.append({"podSelector": {}})
    elif fields.get(rclass or {}, "spec", "qualityGuard").get("enabled"):
        # The model's quality guard asks both pools the requests it checks (builders/guard.py).
        peers.append({"podSelector": {"matchLabels": names.selector_labels(name, names.COMPONENT_GUARD)}})
    peers.extend(operator)
    if activator is not None:
        peers.append(_namespace_peer([activator[0]], activator[1]))
    guarded = bool(fields.get(rclass or {}, "spec", "qualityGuard").get("enabled"))
    # Every pool pod's front (builders/sampler.py) has the pods' http port; a guarded model's pods may send the
    # guard its copies.
    ports = [names.TEI_PORT, SAMPLER_PORT]
    ingress = [{"from": peers, "ports": [{"protocol": "TCP", "port": p} for p in ports]}] if peers else []
    pools = ([{"podSelector": {"matchLabels": {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: name,
                                               names.LABEL_SERVING: "true"}}}] if guarded else [])
    guard_peers = routing + operator + pools
    if guard_peers:
        ingress.append({"from": guard_peers, "ports": [{"protocol": "TCP", "port": names.GUARD_PORT}]})
    owner = names.Owner(name=name, namespace=namespace, uid=meta.get("uid", ""), generation=meta.get("generation", 0))
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": network_policy_name(name),
            "namespace": namespace,
            "labels": {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: name,
                       names.LABEL_COMPONENT: "network-policy", names.LABEL_MANAGED_BY: names.OPERATOR_NAME,
                       names.LABEL_PART_OF: names.PART_OF},
            **({"ownerReferences": [names.owner_reference(owner)]} if meta.get("uid") else {}),
        },
        "spec": {
            "podSelector": {
                "matchLabels": {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: name},
                "matchExpressions": [{"key": names.LABEL_COMPONENT, "operator": "In",
                                      "values": [names.pool_component("cpu"), names.pool_component("gpu"),
                                                 names.COMPONENT_CANARY, names.COMPONENT_GUARD]}],
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _namespace_peer(namespaces: Sequence[str], pod_labels: Mapping[str, str]) -> dict[str, Any]:
    peer: dict[str, Any] = {"namespaceSelector": {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": sorted(namespaces)}]}}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(pod_labels)}
    return peer
