"""Canary rollouts of a new artifact on the real control plane, with the real operator and a real guard process.

A RerankClass turns the quality guard on with a canary (5% of the requests, promoted after 30 compared requests:
the CRD's minimum). Its model (both pools, quantization, a Gateway, autoscaling) serves artifact A; a change of
``spec.quantization`` that keeps the weights makes a new artifact, which does not replace A when its Job succeeds: it
serves as a canary (``<model>-canary``, 5% on the HTTPRoute) while the guard compares it with the GPU pool, and the
operator promotes it (B) or rolls it back (C) on the guard's verdict.

As in test_quality_guard.py (whose scorers, fleet, guard process and stack this reuses), kwok runs no containers: the
guard pod's process runs in-process from the configuration the operator wrote in its Deployment, with the host's
addresses, and is restarted whenever the operator changes that configuration (the Deployment rolls when the canary's
pool comes or goes), as the cluster would. Its "CPU pool" and "canary" are two switches in front of the healthy
FP32 or the broken INT8 (truncating at 12 tokens) scorer.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from rerank_contracts.guard import GuardConfig
from rerank_operator.core.builders import deployment
from tests.cluster import test_quality_guard
from tests.cluster.test_autoscaling import AUTOSCALING, GATEWAY, NAME, POOLS, route_weights, status
from tests.cluster.test_quality_guard import (
    GATE,
    GUARD,
    SMALL,
    GuardedFleet,
    GuardProcess,
    Scorers,
    Stack,
    Switch,
    guard_config,
    mirror_token,
    mirrored_requests,
    route,
    wait,
)

pytestmark = [pytest.mark.cluster, pytest.mark.quantizer, pytest.mark.slow]

CANARY = f"{NAME}-canary"
CANARY_REQUESTS = 30  # the CRD's minimum
CANARY_GUARD = {"canaryPercent": 5, "canaryRequests": CANARY_REQUESTS}
ARTIFACT = "rerank.io/artifact"
#: test_quality_guard's fixtures, used here by name: the module's scorers, and a guarded class with its operator.
scorers, stack = test_quality_guard.scorers, test_quality_guard.stack


# --- the guard pod, restarted as its Deployment rolls ---------------------------------------------------------------

class GuardPod:
    """The guard pod's process as the cluster runs it: started from the operator's configuration (the host's
    addresses for the in-cluster ones: ``local`` per pool, ``reference``) and restarted whenever that configuration
    changes, which rolls the Deployment. The fleet publishes the new process's address at its next refresh."""

    def __init__(self, stack: Stack, fleet: GuardedFleet, local: Mapping[str, str], reference: str) -> None:
        self.env, self.fleet, self.local, self.reference = stack.env, fleet, dict(local), reference
        self.raw = guard_config(self.env)
        self.proc = self._start(self.raw)
        self.restarts = 0
        fleet.point_at(self.proc)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="guard-pod", daemon=True)
        self._thread.start()

    def _start(self, raw: Mapping[str, Any]) -> GuardProcess:
        config = GuardConfig.from_dict(raw)
        return GuardProcess.start(dataclasses.replace(
            config, pools={p: self.local[p] for p in config.pools}, reference=self.reference,
            evidence=dataclasses.asdict(SMALL), calls_per_second=1e6), mirror_token(self.env))

    def _run(self) -> None:
        while not self._stop.wait(0.3):
            try:
                raw = guard_config(self.env)
            except Exception:  # an API hiccup: look again
                continue
            if raw and raw != self.raw:
                old, self.proc, self.raw = self.proc, self._start(raw), raw
                self.fleet.guard_address = self.proc.address
                old.stop()
                self.restarts += 1

    def checking(self, pools: set[str]) -> GuardProcess:
        """The guard process once it checks ``pools`` and the operator has read it."""
        wait(self.env, lambda: set(self.proc.guard.config.pools) == pools and self.proc.guard.scrapes > 0
             and self.proc, 60, f"a guard process checking {sorted(pools)}, read by the operator")
        return self.proc

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.proc.stop()


# --- what the stable pools did meanwhile ------------------------------------------------------------------------------

@dataclass
class Sample:
    at: float
    weights: dict[str, int]
    served: dict[str, str | None]  # pool -> the artifact its Deployment's pods serve


class Watch:
    """The HTTPRoute's weights and what the pools' Deployments serve, every 0.5 s, while a canary runs."""

    def __init__(self, stack: Stack) -> None:
        self.env = stack.env
        self.samples: list[Sample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="canary-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                served = {p: served_artifact(self.env, f"{NAME}-{p}") for p in ("cpu", "gpu")}
                self.samples.append(Sample(time.monotonic(), route_weights(self.env), served))
            except Exception as exc:
                self.errors.append(repr(exc))
            if self._stop.wait(0.5):
                return

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.samples


def served_artifact(env: Any, name: str) -> str | None:
    """The artifact the Deployment ``name``'s pod template serves (its ``rerank.io/artifact`` annotation)."""
    return deployment.served_artifact(env.kube.deployment(env.namespace, name))


def condition(env: Any, kind: str) -> tuple[str | None, str | None]:
    cond = env.kube.condition(env.namespace, NAME, kind)
    return cond.get("status"), cond.get("reason")


def canary_children(env: Any) -> bool:
    return env.kube.exists("Deployment", env.namespace, CANARY) or env.kube.exists("Service", env.namespace, CANARY)


def build_artifact(env: Any, quantization: dict[str, Any], before: str) -> str:
    """Change ``spec.quantization`` and let its Job publish: the new artifact's id."""
    env.kube.patch_spec(env.namespace, NAME, {"quantization": quantization})
    pod = env.finish_quantizer(ok=True)
    new = str(pod["metadata"]["labels"][ARTIFACT])
    assert new != before, f"{quantization} did not change the artifact id"
    return new


def canary_running(env: Any, artifact_id: str) -> dict[str, Any]:
    return wait(env, lambda: (c := status(env).get("canary") or {}).get("state") == "Running"
                and c["artifact"]["id"] == artifact_id and c, 60, f"artifact {artifact_id} running as a canary")


def check_stable_pools(samples: list[Sample], errors: list[str], stable: str, new: str, at_least: int) -> None:
    assert len(samples) >= at_least, (len(samples), errors[-5:])
    lost = [s for s in samples if s.weights.get("cpu", 0) + s.weights.get("gpu", 0) <= 0]
    assert not lost, f"the stable pools lost their traffic: {lost[:5]}"
    moved = [s for s in samples if set(s.served.values()) != {stable}]
    assert not moved, f"the pools served something else than {stable} (canary {new}): {moved[:5]}"


@pytest.fixture
def canary_stack(stack: Stack, scorers: Scorers) -> Iterator[tuple[Stack, Scorers]]:
    stack.set_guard(CANARY_GUARD)
    yield stack, scorers


def test_canary_is_promoted_when_within_the_floor_and_rolled_back_when_below(
        canary_stack: tuple[Stack, Scorers]) -> None:
    stack, scorers = canary_stack
    env, ns = stack.env, stack.env.namespace
    started = time.monotonic()

    def since() -> str:
        return f"{time.monotonic() - started:.0f}s"

    env.kube.create_model(env.model(className=stack.class_name, pools=POOLS, autoscaling=AUTOSCALING,
                                    routing=GATEWAY, quantization={"qualityGate": GATE}))
    a = str(env.finish_quantizer(ok=True)["metadata"]["labels"][ARTIFACT])
    env.kube.wait_condition(ns, NAME, "Ready", "True", "Serving")
    wait(env, lambda: env.kube.deployment(ns, GUARD), 30, "the guard's Deployment")
    assert set(guard_config(env)["pools"]) == {"cpu"}

    cpu, canary = Switch(scorers.healthy.url), Switch(scorers.healthy.url)
    fleet = GuardedFleet(env.kube.api, ns, stack.override, rate=4.0)
    pod = GuardPod(stack, fleet, {"cpu": cpu.url, "canary": canary.url}, scorers.reference.url)
    watch: Watch | None = None
    try:
        proc = pod.checking({"cpu"})
        proc.mirror(mirrored_requests(15, seed=1))
        wait(env, lambda: condition(env, "QualityVerified") == ("True", "WithinFloor"), 60, "the CPU pool verified")
        print(f"\nSERVING {a} after {since()}")

        # 1. Artifact B, from the same weights (per-tensor instead of per-channel): a canary beside A.
        watch = Watch(stack)
        b = build_artifact(env, {"perChannel": False}, a)
        record = canary_running(env, b)
        assert record["since"] and b in record["message"] and a in record["message"], record
        st = status(env)
        assert st["artifact"]["id"] == a, st["artifact"]
        assert (st["pendingArtifact"]["id"], st["pendingArtifact"]["state"]) == (b, "Canary"), st["pendingArtifact"]
        ready = env.kube.wait_condition(ns, NAME, "Ready", "False", "Canary")
        assert f"{CANARY_GUARD['canaryPercent']}% of the requests as a canary" in ready["message"], ready
        wait(env, lambda: status(env).get("phase") == "Progressing", 30, "phase Progressing")
        dep = wait(env, lambda: env.kube.deployment(ns, CANARY), 30, "the canary's Deployment")
        labels, template = dep["metadata"]["labels"], dep["spec"]["template"]
        assert labels["app.kubernetes.io/component"] == "cpu-canary" and "rerank.io/pool" not in labels, labels
        assert "rerank.io/pool" not in template["metadata"]["labels"], template["metadata"]["labels"]
        assert dep["spec"]["replicas"] == 1 and deployment.served_artifact(dep) == b
        assert dep["metadata"]["ownerReferences"][0]["name"] == NAME
        assert served_artifact(env, f"{NAME}-cpu") == a and served_artifact(env, f"{NAME}-gpu") == a
        svc = env.kube.core.read_namespaced_service(CANARY, ns)
        assert svc.spec.selector == dep["spec"]["selector"]["matchLabels"], svc.spec.selector
        weights = wait(env, lambda: "canary" in (w := route_weights(env)) and w, 30, "the canary on the route")
        assert weights["canary"] / sum(weights.values()) == CANARY_GUARD["canaryPercent"] / 100, weights
        assert weights["cpu"] + weights["gpu"] > 0, weights
        assert route(env)["spec"]["rules"][0]["filters"], "the mirror filter is kept beside the canary"
        pools = wait(env, lambda: "canary" in (p := guard_config(env)["pools"]) and p, 30,
                     "the canary in the guard's configuration")
        assert pools == {"cpu": f"http://{NAME}-cpu.{ns}.svc:80", "canary": f"http://{CANARY}.{ns}.svc:80"}, pools
        check_stable_pools(watch.stop(), watch.errors, a, b, at_least=2)
        print(f"CANARY {b} after {since()}: route {weights}; {record['message']}")

        # 2. The canary ranks like the reference: after 30 compared requests it is promoted.
        proc = pod.checking({"cpu", "canary"})
        running = wait(env, lambda: (v := status(env).get("quality", {}).get("canary") or {}).get("id") == b and v,
                       30, "status.quality.canary for the canary")
        assert running["verdict"] == "running" and running["comparedRequests"] < CANARY_REQUESTS, running
        assert status(env)["artifact"]["id"] == a
        proc.mirror(mirrored_requests(CANARY_REQUESTS + 5, seed=2))
        assert proc.guard.detectors["canary"].state == "healthy", proc.guard.detectors["canary"].status()
        wait(env, lambda: status(env).get("artifact", {}).get("id") == b, 60, f"artifact {b} promoted")
        promoted = status(env)["artifact"]
        assert promoted["publishedAt"] and promoted["source"] == record["artifact"]["source"], promoted
        verdict = status(env)["quality"].get("canary") or {}
        assert verdict.get("verdict") in ("promote", None), verdict  # a record of the promotion, or gone with it
        assert not (status(env).get("canary") or {}), status(env).get("canary")
        wait(env, lambda: not canary_children(env), 60, "the canary's Deployment and Service deleted")
        wait(env, lambda: set(route_weights(env)) == {"cpu", "gpu"}, 30, "the route back to the two pools")
        wait(env, lambda: served_artifact(env, f"{NAME}-cpu") == b and served_artifact(env, f"{NAME}-gpu") == b,
             30, f"both pools rolled to {b}")
        env.kube.wait_condition(ns, NAME, "Ready", "True", "Serving", timeout=90)
        assert status(env)["phase"] == "Ready"
        wait(env, lambda: set(guard_config(env)["pools"]) == {"cpu"}, 30, "the canary out of the guard's config")
        print(f"PROMOTED {b} after {since()} (guard restarts: {pod.restarts})")

        # 3. Artifact C (another optimization level) ranks below the floor: rolled back, B never stops serving.
        pod.checking({"cpu"})
        canary.target = scorers.broken.url
        watch = Watch(stack)
        c = build_artifact(env, {"optimizationLevel": 2}, b)
        canary_running(env, c)
        proc = pod.checking({"cpu", "canary"})
        # Fewer than canaryRequests: whatever a read of the guard sees, the canary cannot be promoted on them.
        proc.mirror(mirrored_requests(CANARY_REQUESTS - 5, seed=3))
        assert proc.guard.detectors["canary"].state == "below_floor", proc.guard.detectors["canary"].status()
        assert proc.guard.detectors["cpu"].state == "healthy", proc.guard.detectors["cpu"].status()
        rolled = wait(env, lambda: (r := status(env).get("canary") or {}).get("state") == "RolledBack" and r, 60,
                      f"canary {c} rolled back")
        assert rolled["artifact"]["id"] == c and "below the quality floor" in rolled["message"], rolled
        assert f"artifact {b} keeps serving" in rolled["message"], rolled
        st = status(env)
        assert st["artifact"]["id"] == b, st["artifact"]
        assert (st["pendingArtifact"]["id"], st["pendingArtifact"]["state"]) == (c, "RolledBack"), st
        # The guard's figures in the message: its verdict decided (status.quality.canary goes at the next tick).
        assert "sampled requests" in rolled["message"] and "Spearman" in rolled["message"], rolled
        assert (st["quality"].get("canary") or {}).get("verdict") in ("rollback", None), st["quality"]
        env.kube.wait_condition(ns, NAME, "Degraded", "True", "CanaryRolledBack")
        env.kube.wait_condition(ns, NAME, "Ready", "False", "CanaryRolledBack")
        wait(env, lambda: status(env).get("phase") == "Degraded", 30, "phase Degraded")
        wait(env, lambda: not canary_children(env), 60, "the canary's Deployment and Service deleted")
        wait(env, lambda: set(route_weights(env)) == {"cpu", "gpu"}, 30, "the route back to the two pools")
        wait(env, lambda: set(guard_config(env)["pools"]) == {"cpu"}, 30, "the canary out of the guard's config")
        jobs = {j["metadata"]["name"] for j in env.kube.jobs(ns)
                if (j["metadata"].get("labels") or {}).get(ARTIFACT) == c}
        time.sleep(10)
        later = {j["metadata"]["name"] for j in env.kube.jobs(ns)
                 if (j["metadata"].get("labels") or {}).get(ARTIFACT) == c}
        assert later <= jobs, f"new Jobs for the rolled-back artifact {c}: {sorted(later - jobs)}"
        samples = watch.stop()
        check_stable_pools(samples, watch.errors, b, c, at_least=20)
        assert any("canary" in s.weights for s in samples), "the canary never had a share to roll back"
        st = status(env)
        assert st["artifact"]["id"] == b and (st.get("canary") or {}).get("state") == "RolledBack", st
        assert condition(env, "Degraded") == ("True", "CanaryRolledBack")
        assert "Traceback" not in env.operator.log.read_text()
        print(f"ROLLED BACK {c} after {since()}: {len(samples)} samples, stable weights min "
              f"{min(s.weights['cpu'] + s.weights['gpu'] for s in samples)}; {rolled['message']}")
    finally:
        if watch is not None:
            watch.stop()
        fleet.stop()
        pod.stop()
        cpu.close()
        canary.close()
