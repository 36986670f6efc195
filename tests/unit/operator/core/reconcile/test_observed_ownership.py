"""observed.owned_pods: which pods the autoscaler and the guard reader may believe (issue: look-alike pods)."""

from __future__ import annotations

from typing import Any

from rerank_operator.core.reconcile.observed import owned_pods


def obj(name: str, uid: str, controller: str | None = None, *, controller_flag: bool = True) -> dict[str, Any]:
    refs = [{"uid": controller, "controller": controller_flag}] if controller else []
    return {"metadata": {"name": name, "uid": uid, "ownerReferences": refs}}


def test_a_lookalike_pod_is_told_from_the_pools_own_pods() -> None:
    deployments = [obj("m-cpu", "dep-cpu", "model"), obj("m-guard", "dep-guard", "model")]
    replica_sets = [obj("m-cpu-1", "rs-1", "dep-cpu"), obj("m-guard-1", "rs-g", "dep-guard"),
                    obj("forged-rs", "rs-x", "someone-else")]
    pods = [obj("m-cpu-1-a", "p1", "rs-1"), obj("m-guard-1-a", "p2", "rs-g"),
            obj("bare", "p3"),  # a pod with the labels and no owner
            obj("under-forged-rs", "p4", "rs-x"),  # owned by a ReplicaSet no Deployment of the model controls
            obj("claims-our-rs", "p5", "rs-1", controller_flag=False),  # a mere reference, not the controller
            obj("claims-our-deployment", "p6", "dep-cpu")]  # skips the ReplicaSet: pods of a Deployment never do
    trusted, foreign = owned_pods(pods, deployments, replica_sets)
    assert [p["metadata"]["name"] for p in trusted] == ["m-cpu-1-a", "m-guard-1-a"]
    assert [p["metadata"]["name"] for p in foreign] == ["bare", "under-forged-rs", "claims-our-rs",
                                                        "claims-our-deployment"]


def test_without_deployments_no_pod_is_believed() -> None:
    trusted, foreign = owned_pods([obj("p", "p1", "rs-1")], [], [obj("rs", "rs-1", "dep")])
    assert trusted == [] and len(foreign) == 1
