"""What the two loops need from the cluster, as one protocol: ``reconcile`` and the autoscaler take a
``ClusterAccess``, not the API module. ``apply.Cluster`` is the real one; tests/unit/fake_cluster.py is the one fake
both loops' unit tests use, so a new need shows up in one place. Types only, no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from . import names
from .events import Event
from .observed import Obj, Observed, PoolsView
from .plan import Plan
from .spec import RerankModelSpec
from .writes import Executed


class ClusterAccess(Protocol):
    """One RerankModel's view of the API: read it and its class, observe and change its children, write its status,
    annotations and events. Reads raise ``client.TransientApiError`` for what a retry may fix."""

    def get_model(self, namespace: str, name: str) -> Obj | None:
        """The model as stored now; None when it is gone."""

    def list_classes(self) -> list[Obj]:
        """Every RerankClass; none when their CRD is not installed."""

    def observe(self, owner: names.Owner, spec: RerankModelSpec) -> Observed:
        """Everything the plan needs, filtered to children this model controls."""

    def execute(self, plan: Plan) -> Executed:
        """Run ``plan``; the objects written and the writes refused."""

    def observe_pools(self, owner: names.Owner) -> PoolsView:
        """The pools' Deployments, pods and route, as the autoscaler reads them every tick."""

    def patch_status(self, owner: names.Owner, patch: Mapping[str, Any]) -> None:
        """Merge ``patch`` into the model's status."""

    def post_event(self, owner: names.Owner, event: Event) -> None:
        """An Event on the model."""

    def annotate_model(self, owner: names.Owner, annotations: Mapping[str, str | None]) -> None:
        """Set (or, with None, remove) annotations of the model."""
