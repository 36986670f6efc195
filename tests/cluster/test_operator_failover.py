"""Two operator processes with leader election on the real API server: one leads, the other stands by with warm
caches; SIGKILL of the leader in the middle of a burst of applies, and the standby takes over: it leads within the
Lease's timing, every model converges, and each artifact gets exactly one Job.

Short Lease timings (3 s lease, 2 s renew deadline, 0.5 s retry) keep the test quick; the bound asserted is the
issue's 15 s, far above what the timings allow, so the test does not depend on a loaded machine's luck.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from rerank_devcluster.cluster import Cluster
from tests.cluster.rrm_harness import Env, Identity, Kube, OperatorProcess, cleanup, eventually, published, static_pv

pytestmark = pytest.mark.cluster

TAKEOVER_BOUND_SECONDS = 15.0
MODELS = 4


def leads(op: OperatorProcess) -> bool:
    try:
        return op.metrics().get("rerank_operator_leader", 0.0) == 1.0
    except OSError:
        return False


@pytest.fixture
def pair(cluster: Cluster, kube: client.ApiClient, namespace: str,
         operator_identity: Identity) -> Iterator[tuple[Env, list[OperatorProcess]]]:
    for i in range(MODELS):
        static_pv(cluster, f"pv-{namespace}-{i}", namespace)
    lease_id = f"rerank-operator-{uuid.uuid4().hex[:8]}"
    flags = ["--leader-election", "--leader-election-namespace", "rerank-system", "--leader-election-id", lease_id,
             "--leader-election-lease-seconds", "3", "--leader-election-renew-seconds", "2",
             "--leader-election-retry-seconds", "0.5"]
    ops = [OperatorProcess(cluster, operator_identity, [namespace], extra_args=flags, name=f"{namespace}-{i}").start()
           for i in range(2)]
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, ops[0])
    try:
        yield env, ops
    finally:
        survivor = next((op for op in ops if op.proc is not None and op.proc.poll() is None), ops[0])
        env.operator = survivor
        cleanup(env, [namespace])
        for op in ops:
            op.stop()
        cluster.kubectl_run("delete", "pv", *[f"pv-{namespace}-{i}" for i in range(MODELS)], "--wait=false",
                            check=False)


def test_the_standby_takes_over_after_the_leader_is_killed_mid_burst(pair: tuple[Env, list[OperatorProcess]]) -> None:
    env, ops = pair
    ns = env.namespace
    leader = eventually(lambda: next((op for op in ops if leads(op)), None), 30, "one operator to lead")
    standby = next(op for op in ops if op is not leader)
    assert not leads(standby)  # never two writers

    # The burst: models applied while the leader works; it is killed before they are all handled.
    for i in range(MODELS):
        env.kube.create_model(env.model(f"m{i}"))
        if i == 1:
            leader.kill()
            killed = time.monotonic()
    eventually(lambda: leads(standby), TAKEOVER_BOUND_SECONDS, "the standby to lead")
    took_over = time.monotonic() - killed
    assert took_over <= TAKEOVER_BOUND_SECONDS

    # Every model converges under the new leader, with one Job per artifact.
    env.operator = standby

    def running() -> list[dict[str, Any]] | None:
        pods = [p for p in env.kube.pods(ns, "app.kubernetes.io/component=quantizer")
                if p["status"].get("phase") == "Running"]
        return pods if len(pods) == MODELS else None

    try:
        pods = eventually(running, 60, f"{MODELS} running quantizer pods")
    except AssertionError as exc:  # seen once under CI load (not reproduced): say why the pods did not run
        events = env.cluster.kubectl_run("get", "events", "-n", ns, "--sort-by=.lastTimestamp", check=False).stdout
        raise AssertionError(f"{exc}\n--- events ---\n{events[-6000:]}\n{env.describe()}") from None
    for pod in pods:
        aid = pod["metadata"]["labels"]["rerank.io/artifact"]
        env.cluster.finish_pod(ns, pod["metadata"]["name"], 0, published(aid))
    for i in range(MODELS):
        env.kube.wait_condition(ns, f"m{i}", "Ready", "True")
    jobs = env.kube.jobs(ns)
    owners = sorted(j["metadata"]["ownerReferences"][0]["name"] for j in jobs)
    assert owners == [f"m{i}" for i in range(MODELS)], owners

    # The restarted process stands by: exactly one leader again.
    leader.start()
    eventually(lambda: standby.proc is not None and leads(standby) and not leads(leader), 30,
               "the restarted operator to stand by")
