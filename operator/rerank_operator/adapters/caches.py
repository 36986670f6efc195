"""Everything the two loops read, held in memory: one watch-fed ``Store`` per kind (informer.py).

The children (Jobs and their pods, the pools' Deployments, ReplicaSets and pods, Services, the volume's claim, the
NetworkPolicy, the HTTPRoute) come from this module's informers, filtered by the API server to the operator's labels;
the RerankModels from one more informer (every model of the watched namespaces). The models' stream is this module's
rather than kopf's: kopf's per-event machinery (diff bases, per-object loggers, deep copies on its one asyncio loop)
cost the operator more CPU than the whole reconcile in a burst of applies (py-spy, benchmarks/fleet/), on the two
cores the API server needs most then; an informer only parses and stores.

A standby replica (leader election) runs the same caches, so when it takes over it decides from memory at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rerank_operator.adapters.informer import Informer, Kind, OnChange, Store
from rerank_operator.adapters.kube_api import Client
from rerank_operator.core import names
from rerank_operator.core.reconcile.observed import Obj

log = logging.getLogger(__name__)

#: The children the operator reads, by kind.
CHILD_KINDS: Mapping[str, Kind] = {
    "Job": Kind("batch/v1", "Job"),
    "Pod": Kind("v1", "Pod"),
    "Deployment": Kind("apps/v1", "Deployment"),
    "ReplicaSet": Kind("apps/v1", "ReplicaSet"),
    "Service": Kind("v1", "Service"),
    "PersistentVolumeClaim": Kind("v1", "PersistentVolumeClaim"),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "NetworkPolicy"),
    "HTTPRoute": Kind("gateway.networking.k8s.io/v1", "HTTPRoute", optional=True),
}


#: The models: every RerankModel of the watched namespaces (no label selector: users create them).
MODEL_KIND = Kind(names.API_VERSION, names.KIND)

#: The gateways the models' routes name, and their classes (no label selector: the platform creates them): what
#: features a route's gateway supports (``core/gateway.py``). A handful per cluster. Gateways are watched in the
#: operator's namespaces (all, or the watched ones), GatewayClasses cluster-wide.
GATEWAY_KIND = Kind("gateway.networking.k8s.io/v1", "Gateway", optional=True)
GATEWAY_CLASS_KIND = Kind("gateway.networking.k8s.io/v1", "GatewayClass", optional=True)


class Caches:
    """The operator's watch-fed memory of its models and their children (one per process). ``on_model`` and
    ``on_child`` are told of every change the watches deliver (not of the echo of our own writes)."""

    def __init__(self, client: Client, namespaces: Sequence[str] = (),
                 on_child: OnChange | None = None, on_model: OnChange | None = None) -> None:
        self._model_informer = Informer(client, MODEL_KIND, namespaces=namespaces, selector="", on_change=on_model)
        self.models: Store = self._model_informer.store
        self._informers = {kind: Informer(client, spec, namespaces=namespaces, on_change=on_child)
                           for kind, spec in CHILD_KINDS.items()}
        self._gateway_informers = {
            "Gateway": Informer(client, GATEWAY_KIND, namespaces=namespaces, selector=""),
            "GatewayClass": Informer(client, GATEWAY_CLASS_KIND, selector=""),
        }

    def store(self, kind: str) -> Store:
        return self._informers[kind].store

    def gateway(self, namespace: str, name: str) -> Obj | None:
        """A Gateway as last seen (None: absent, not readable, or its API not installed)."""
        return self._gateway_informers["Gateway"].store.get(namespace, name)

    def gateway_class(self, name: str) -> Obj | None:
        """A GatewayClass as last seen (cluster-scoped)."""
        return self._gateway_informers["GatewayClass"].store.get("", name)

    def available(self, kind: str) -> bool:
        """Whether the kind's API is installed (the Gateway API may not be)."""
        return self._informers[kind].available

    def _all(self) -> dict[str, Informer]:
        return {**self._informers, **self._gateway_informers, names.KIND: self._model_informer}

    def start(self) -> None:
        """Start every informer; ``wait_synced`` tells when all have listed (the reconciles wait for it: a model's
        first reconcile must find its children listed)."""
        for informer in self._all().values():
            informer.start()

    def stop(self) -> None:
        for informer in self._all().values():
            informer.stop()

    def wait_synced(self, timeout: float) -> list[str]:
        """Wait until every informer has listed once; returns the kinds still not listed after ``timeout``."""
        deadline = time.monotonic() + timeout
        for informer in self._all().values():
            informer.wait_synced(max(0.0, deadline - time.monotonic()))
        return [kind for kind, informer in self._all().items() if not informer.synced]

    def record(self, stored: Any, sent: Mapping[str, Any]) -> None:
        """Keep the API server's answer to one of our writes (the object as stored) in its kind's store."""
        if not isinstance(stored, dict) or "metadata" not in stored:
            return
        meta = stored["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):  # the write let it go: it is gone (or
            return  # about to be), and its watch's DELETED may already have been handled: never bring it back
        kind = stored.get("kind") or sent.get("kind")
        stored.setdefault("apiVersion", sent.get("apiVersion"))
        stored.setdefault("kind", kind)
        if kind == names.KIND:
            self.models.record(stored)
        elif kind in self._informers:
            self._informers[kind].store.record(stored)

    def sizes(self) -> dict[str, int]:
        """Objects held per kind (the operator's metrics export them)."""
        return {"RerankModel": len(self.models),
                **{k: len(i.store) for k, i in {**self._informers, **self._gateway_informers}.items()}}
