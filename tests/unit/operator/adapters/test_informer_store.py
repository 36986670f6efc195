"""The informers' Store (adapters/informer.py): newest copy wins, our own writes survive a stale LIST or watch
echo, and the controller index follows every change."""

from __future__ import annotations

from typing import Any

from rerank_operator.adapters.informer import Store


def obj(name: str, rv: int, owner: str | None = "u1", ns: str = "ns", **labels: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "resourceVersion": str(rv), "labels": labels}
    if owner:
        meta["ownerReferences"] = [{"uid": owner, "controller": True}]
    return {"metadata": meta}


def names(objs: list[dict[str, Any]]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in objs)


def test_newer_versions_replace_and_the_echo_of_our_own_write_is_not_news() -> None:
    store = Store()
    assert store.record(obj("a", 5))
    assert not store.record(obj("a", 5))  # the watch's echo of the write we stored already
    assert not store.record(obj("a", 4))  # an older copy arriving late
    assert store.record(obj("a", 7, owner="u2"))
    assert store.controlled_by("u1") == [] and names(store.controlled_by("u2")) == ["a"]
    store.remove(obj("a", 8))
    assert store.get("ns", "a") is None and store.controlled_by("u2") == []


def test_a_list_replaces_its_namespace_but_keeps_writes_newer_than_itself() -> None:
    store = Store()
    store.record(obj("gone", 3))
    store.record(obj("ours", 12))  # written by us after the LIST below was taken
    store.record(obj("other-ns", 3, ns="b"))
    store.replace([obj("listed", 9)], listed_at=10, namespace="ns")
    assert names(store.controlled_by("u1")) == ["listed", "other-ns", "ours"]
    store.replace([], listed_at=20, namespace=None)  # a cluster-wide LIST at 20 knows about everything
    assert store.all_keys() == []


def test_select_by_labels_within_a_namespace() -> None:
    store = Store()
    store.record(obj("p1", 1, ns="a", pool="cpu"))
    store.record(obj("p2", 1, ns="a", pool="gpu"))
    store.record(obj("p3", 1, ns="b", pool="cpu"))
    assert names(store.select("a", {"pool": "cpu"})) == ["p1"]
    assert names(store.select("a", {})) == ["p1", "p2"]


def test_the_instance_index_follows_relabelling_and_removal() -> None:
    store = Store()
    store.record(obj("p1", 1, ns="a", **{"app.kubernetes.io/instance": "m1"}))
    store.record(obj("p2", 1, ns="a", **{"app.kubernetes.io/instance": "m1"}))
    store.record(obj("p1", 2, ns="a", **{"app.kubernetes.io/instance": "m2"}))
    assert names(store.select("a", {"app.kubernetes.io/instance": "m1"})) == ["p2"]
    assert names(store.select("a", {"app.kubernetes.io/instance": "m2"})) == ["p1"]
    store.remove(obj("p2", 3, ns="a"))
    assert store.select("a", {"app.kubernetes.io/instance": "m1"}) == []


def test_stored_objects_lose_what_the_operator_never_reads_and_keep_what_it_compares() -> None:
    store = Store()
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1",
                                       "managedFields": [{"manager": "kubelet"}]},
           "spec": {"hostNetwork": False, "containers": [{"name": "tei", "args": ["--big"] * 100}]},
           "status": {"podIP": "10.0.0.1"}}
    deployment = {"kind": "Deployment", "metadata": {"name": "d", "namespace": "ns", "resourceVersion": "1",
                                                     "managedFields": [{"manager": "rerank-operator"}]},
                  "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "tei"}]}}}}
    job = {"kind": "Job", "metadata": {"name": "j", "namespace": "ns", "resourceVersion": "1"},
           "spec": {"backoffLimit": 2, "template": {"spec": {"containers": [{"name": "q"}]}}}, "status": {}}
    for o in (pod, deployment, job):
        store.record(o)
    assert store.get("ns", "p") == {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1"},
                                    "spec": {"hostNetwork": False}, "status": {"podIP": "10.0.0.1"}}
    kept = store.get("ns", "d")
    assert kept is not None and "managedFields" not in kept["metadata"]
    assert kept["spec"]["template"]["spec"]["containers"] == [{"name": "tei"}]  # drift compares the whole spec
    assert store.get("ns", "j") == {**job, "spec": {"backoffLimit": 2}}


def test_stored_objects_share_their_keys_and_short_strings_and_stay_equal() -> None:
    import json

    from rerank_operator.adapters.informer import SHARED_STRING_MAX

    long = "x" * (SHARED_STRING_MAX + 1)
    text = json.dumps({"kind": "Service", "metadata": {"name": "m-cpu", "namespace": "ns", "resourceVersion": "3",
                                                       "labels": {"app.kubernetes.io/name": "rerank"}},
                       "spec": {"ports": [{"port": 8080}], "note": long}})
    first, second = json.loads(text), json.loads(text)
    second["metadata"]["name"] = "m-gpu"
    assert first["metadata"]["labels"] is not second["metadata"]["labels"]
    key = next(iter(first["metadata"]["labels"]))
    assert key is not next(iter(second["metadata"]["labels"]))   # json.loads copies every key, per object
    store = Store()
    store.replace([second], listed_at=10, namespace="ns")   # a LIST stores compact copies
    store.record(first)                                      # so does a watch event or our own write
    a, b = store.get("ns", "m-cpu"), store.get("ns", "m-gpu")
    assert a == json.loads(text) and b is not None and b["spec"] == a["spec"]
    label_a, label_b = next(iter(a["metadata"]["labels"].items())), next(iter(b["metadata"]["labels"].items()))
    assert label_a[0] is label_b[0] and label_a[1] is label_b[1]   # one copy of the label's key and value
    assert next(iter(a["spec"])) is next(iter(b["spec"]))
    assert a["spec"]["note"] is not b["spec"]["note"]                # long strings stay per object
