"""Services: ``<name>-cpu`` and ``<name>-gpu`` per pool (the HTTPRoute's backends), and ``<name>`` for the model.

Without a Gateway the model Service is how clients reach the model, so its selector follows the traffic split as
far as a selector can: one pool when all traffic goes to it, both pools (by the shared ``rerank.io/serving`` label,
balanced by pod count) when the split is mixed. Exact weights need the HTTPRoute.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.spec.model import Pool


def _service(owner: names.Owner, name: str, component: names.Component, selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": names.child_metadata(owner, name, component),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [{"name": "http", "port": names.SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pool_service(owner: names.Owner, pool: Pool) -> dict[str, Any]:
    component = names.pool_component(pool.name)
    return _service(owner, names.pool_service_name(owner.name, pool.name), component,
                    names.selector_labels(owner.name, component))


def build_canary_service(owner: names.Owner) -> dict[str, Any]:
    """The canary Deployment's Service: the HTTPRoute's third backend and what the quality guard asks."""
    return _service(owner, names.canary_name(owner.name), names.COMPONENT_CANARY,
                    names.selector_labels(owner.name, names.COMPONENT_CANARY))


def build_model_service(owner: names.Owner, receiving: Iterable[names.PoolName]) -> dict[str, Any]:
    """The model's Service, selecting the pools that receive traffic (both: the shared serving label)."""
    pools = sorted(set(receiving))
    if len(pools) == 1:
        selector = names.selector_labels(owner.name, names.pool_component(pools[0]))
    else:
        selector = {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: owner.name, names.LABEL_SERVING: "true"}
    return _service(owner, names.model_service_name(owner.name), "service", selector)
