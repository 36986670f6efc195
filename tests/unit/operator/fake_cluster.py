"""The one fake of ``rerank_operator.adapters.cluster.ClusterAccess``, shared by the unit tests of both loops
(reconcile and the autoscaler): the model as stored (status patches and annotations merged in), its children in a
``FakeWorld`` that runs plans the way the API server would, and, for the autoscaler, the pools' view. It records what
was written."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.reconcile.observed import ObjectRef, Observed, PoolsView, ref_of
from rerank_operator.core.reconcile.plan import Plan
from rerank_operator.core.reconcile.writes import Executed
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status.events import Event
from tests.unit.operator.rerankmodel_gen import FakeWorld


class FakeCluster:
    """``cluster.ClusterAccess`` in memory. ``view`` fixes what ``observe_pools`` returns (the autoscaler's tests);
    without it the pools come from the world's Deployments."""

    def __init__(self, body: dict[str, Any] | None, *, world: FakeWorld | None = None, view: PoolsView | None = None,
                 classes: Iterable[dict[str, Any]] = ()) -> None:
        self.body = body
        self.world = world or FakeWorld()
        self.view = view
        self.classes = list(classes)
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        self.annotations: list[dict[str, Any]] = []
        self.plans: list[Plan] = []

    def get_model(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.body)

    def list_classes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.classes)

    def observe(self, owner: names.Owner, spec: RerankModelSpec) -> Observed:
        return self.world.observed()

    def execute(self, plan: Plan) -> Executed:
        self.plans.append(plan)
        self.world.run(plan)
        scaled = [ObjectRef("apps/v1", "Deployment", s.namespace, s.name) for s in plan.scale]
        return Executed(done=(*[ref_of(o) for o in [*plan.apply, *plan.create]], *scaled, *plan.delete))

    def observe_pools(self, owner: names.Owner) -> PoolsView:
        if self.view is not None:
            return self.view
        return PoolsView(deployments=self.world.observed().deployments)

    def patch_status(self, owner: names.Owner, patch: Mapping[str, Any]) -> None:
        assert self.body is not None
        self.patches.append(dict(patch))
        self.body["status"] = merge(self.body.get("status") or {}, patch)

    def post_event(self, owner: names.Owner, event: Event) -> None:
        self.events.append((event.reason, event.message))

    def remove_finalizer(self, namespace: str, name: str, finalizer: str, index: int) -> None:
        assert self.body is not None
        finalizers = self.body["metadata"]["finalizers"]
        if finalizers[index] == finalizer:
            del finalizers[index]

    def annotate_model(self, owner: names.Owner, annotations: Mapping[str, str | None]) -> None:
        assert self.body is not None
        self.annotations.append(dict(annotations))
        stored = self.body["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                stored.pop(key, None)
            else:
                stored[key] = value


def merge(old: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386), as the API server applies a status patch."""
    if not isinstance(patch, Mapping) or not isinstance(old, Mapping):
        return copy.deepcopy(patch)
    out = dict(old)
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out
