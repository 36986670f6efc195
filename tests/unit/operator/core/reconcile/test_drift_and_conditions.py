"""The drift check that keeps idle reconciles write-free, and the conditions helper."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from rerank_operator.core import names
from rerank_operator.core.reconcile import drift
from rerank_operator.core.status import conditions
from rerank_operator.core.status.conditions import Condition

DESIRED = drift.stamp({
    "apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": "m-cpu", "namespace": "ns", "labels": {"a": "1"},
                 "ownerReferences": [{"uid": "u1", "name": "m"}]},
    "spec": {"replicas": 2, "template": {"spec": {"containers": [{
        "name": "tei", "args": ["--port", "8080"], "ports": [{"name": "http", "containerPort": 8080}],
        "resources": {"requests": {"cpu": "0.5", "memory": "4Gi"}, "limits": {"memory": 8 * 2**30}}}]}}},
})


def live_from(desired: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns: defaults added, quantities canonicalized, other managers' fields present."""
    live = copy.deepcopy(desired)
    live.pop("apiVersion"), live.pop("kind")
    live["metadata"].update(uid="x", resourceVersion="7", generation=3)
    live["metadata"]["annotations"]["deployment.kubernetes.io/revision"] = "3"
    live["metadata"]["labels"]["team"] = "search"
    c = live["spec"]["template"]["spec"]["containers"][0]
    c["imagePullPolicy"] = "IfNotPresent"
    c["ports"][0]["protocol"] = "TCP"
    c["resources"] = {"requests": {"cpu": "500m", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    live["spec"]["template"]["spec"]["containers"].append({"name": "istio-proxy"})
    live["status"] = {"readyReplicas": 2}
    return live


def test_live_with_defaults_and_foreign_fields_needs_nothing() -> None:
    assert not drift.needs_apply(DESIRED, live_from(DESIRED))


def edit(path: list[Any], value: Any) -> dict[str, Any]:
    live = live_from(DESIRED)
    node: Any = live
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return live


@pytest.mark.parametrize("live", [
    None,
    edit(["spec", "replicas"], 5),
    edit(["metadata", "labels", "a"], "2"),
    edit(["spec", "template", "spec", "containers", 0, "args"], ["--port", "9090"]),
    edit(["spec", "template", "spec", "containers", 0, "args"], ["--port", "8080", "--extra"]),
    edit(["spec", "template", "spec", "containers", 0, "resources", "requests", "cpu"], "1"),
    edit(["metadata", "annotations", names.ANNOTATION_APPLIED_HASH], "stale"),
    edit(["metadata", "ownerReferences"], []),
])
def test_any_change_to_our_fields_needs_an_apply(live: dict[str, Any] | None) -> None:
    assert drift.needs_apply(DESIRED, live)


def test_a_field_we_stopped_setting_needs_an_apply() -> None:
    live = live_from(DESIRED)
    smaller = copy.deepcopy(DESIRED)
    del smaller["metadata"]["labels"]["a"]
    assert drift.needs_apply(drift.stamp(smaller), live)


@pytest.mark.parametrize("a,b,same", [
    ("500m", "0.5", True), ("1Gi", "1024Mi", True), ("2", 2, True), ("1G", "1Gi", False), ("100m", "0.2", False),
])
def test_quantities(a: Any, b: Any, same: bool) -> None:
    assert (drift.quantity(a) == drift.quantity(b)) is same


def test_quantity_semantics_only_under_resources() -> None:
    assert not drift.is_subset({"image": "tei:1.9"}, {"image": "tei:1.90"})
    assert drift.is_subset({"limits": {"cpu": "1.9"}}, {"limits": {"cpu": "1900m"}})


# --- conditions ----------------------------------------------------------------------------------------------------

T0, T1 = "2025-01-01T00:00:00Z", "2025-01-01T01:00:00Z"


def test_new_condition_gets_now_and_generation() -> None:
    [c] = conditions.set_condition([], Condition("Ready", "False", "Quantizing", "x"), generation=4, now=T0)
    assert c == {"type": "Ready", "status": "False", "reason": "Quantizing", "message": "x",
                 "observedGeneration": 4, "lastTransitionTime": T0}


def test_reason_change_keeps_transition_time_status_change_moves_it() -> None:
    first = conditions.set_condition([], Condition("Ready", "False", "Quantizing", "x"), generation=1, now=T0)
    same = conditions.set_condition(first, Condition("Ready", "False", "RollingOut", "y"), generation=2, now=T1)
    assert same[0]["lastTransitionTime"] == T0 and same[0]["reason"] == "RollingOut"
    assert same[0]["observedGeneration"] == 2
    flipped = conditions.set_condition(same, Condition("Ready", "True", "Serving", "z"), generation=2, now=T1)
    assert flipped[0]["lastTransitionTime"] == T1


def test_other_conditions_are_kept_in_place() -> None:
    foreign = {"type": "MetricsAvailable", "status": "True", "reason": "Scraped", "message": "",
               "lastTransitionTime": T0}
    result = conditions.set_conditions([foreign], [Condition("Ready", "True", "Serving", "")], generation=1, now=T1)
    assert result[0] == foreign and [c["type"] for c in result] == ["MetricsAvailable", "Ready"]
