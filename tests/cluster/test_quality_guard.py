"""The quality guard on the real control plane, with the real operator and a real guard process that really scores.

A RerankClass turns the guard on; its model (both pools, quantization, a Gateway, autoscaling as in
test_autoscaling.py) gets a Deployment and a Service ``<model>-guard`` and a RequestMirror filter on its HTTPRoute.
kwok runs no containers, so the guard pod's process is run here, in-process (``quality_guard.server.serve`` on
127.0.0.1), from the configuration the operator wrote in the Deployment, with the host's addresses instead of the
in-cluster DNS names: its reference is a TEI-like server scoring with the FP32 export of a tiny cross-encoder
(tests/guard/scoring_server.py), and its "CPU pool" a switch in front of either the same FP32 graph (healthy) or the
INT8 of that model truncating at 12 tokens (a pool whose max input length is wrong). The test posts what the gateway
would mirror (the evaluation set's requests) and the operator reads the guard's /metrics through the same address
file as the pools' (rerank_devcluster.scrape_redirect), while ``Fleet`` (test_autoscaling.py) serves the pools'
metrics under a load the test sets. The detector's windows are shrunk (20 requests, recovery after 40) so that
each verdict takes a second, not minutes; what the operator does with a verdict is what it does in production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from quality_guard import detector, intake, server
from quality_guard.checks import Guard
from quantizer_job.steps.evaluation import evaldata
from rerank_contracts.guard import LOCAL_REFERENCE, Floor, GuardConfig, LiveSampleSettings
from rerank_devcluster.waiting import eventually
from rerank_operator.core.builders.guard import MIRROR_TOKEN_ENV
from tests.cluster.rrm_harness import GROUP, VERSION, Env, Kube, OperatorProcess, cleanup, static_pv
from tests.cluster.test_autoscaling import AUTOSCALING, GATEWAY, NAME, POOLS, Fleet, operator_log, route_weights, status
from tests.guard.scoring_server import ScoringServer, tiny_pools

pytestmark = [pytest.mark.cluster, pytest.mark.quantizer, pytest.mark.slow]

GUARD = f"{NAME}-guard"
GUARD_SELECTOR = f"app.kubernetes.io/instance={NAME},app.kubernetes.io/component=quality-guard"
#: The class's guard: a quarter of the requests mirrored (2500 / 10000 on the route), 20 extra calls/s. The model's
#: gateway (``shared`` in ``gateway-system``: the test plays it) mirrors but publishes no feature list, as Envoy Gateway
#: and Istio do: the class says so (``sampling: Mirror``). On a gateway without a mirror: tests/cluster/test_gateway.py.
QUALITY_GUARD = {"enabled": True, "sampleFraction": 0.25, "callsPerSecond": 20, "sampling": "Mirror"}
#: The model's quality gate, not the defaults (0.99 / 0.9), so the guard's floor is seen to be the model's.
GATE = {"minSpearman": 0.98, "minTopKAgreement": 0.85, "topK": 3}
#: Small windows: a verdict after 10 requests, a recovery after 40 (production: 30 / 300). Proving a failure rate
#: under 2% with the recovery's confidence takes 187 clean requests (0.98^n < 2.3%); under 10%, 36.
SMALL = detector.Settings(window=20, min_samples=10, recovery_window=40, check_every=1, max_failure_rate=0.1)
GPU_MAX = POOLS["gpu"]["maxReplicas"]
BURST = 50.0  # requests/s: more than the GPU pool at its maximum serves (3 x 10), so traffic spills to the CPU pool


# --- scoring pools ------------------------------------------------------------------------------------------------

@dataclass
class Scorers:
    reference: ScoringServer  # FP32, TEI's batches (the GPU pool)
    healthy: ScoringServer    # the same FP32 graph, one pair per batch: float differences only
    broken: ScoringServer     # INT8, truncating at 12 tokens
    original: Path            # the model as the Job publishes it for the GPU pool: what a guard scores FP32 from


@pytest.fixture(scope="module")
def scorers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scorers]:
    """tests/guard's pools: a tiny cross-encoder through the Job's own export and quantization."""
    tmp = tmp_path_factory.mktemp("guard-model")
    pools = tiny_pools(tmp)
    found = Scorers(pools["reference"], pools["cpu"], pools["truncated"], tmp / "original")
    yield found
    for s in (found.reference, found.healthy, found.broken):
        s.close()


class Switch:
    """The CPU pool as the guard sees it: a proxy that forwards ``/rerank`` to one scorer or another, so the pool
    breaks (or is repaired) under a guard that keeps running, as a bad rollout would."""

    def __init__(self, target: str) -> None:
        self.target = target
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = urllib.request.Request(outer.target + self.path, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as resp:
                    data = resp.read()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# --- the guard process --------------------------------------------------------------------------------------------

class WatchedGuard(Guard):
    """The guard, counting the operator's reads of its /metrics (so the test can post a burst between two)."""

    scrapes = 0

    def metrics(self) -> bytes:
        self.scrapes += 1
        return super().metrics()


@dataclass
class GuardProcess:
    guard: WatchedGuard
    running: server.Running
    token: str  # the mirror token the operator gave the guard pod and put on the route
    posted: int = 0

    @classmethod
    def start(cls, config: GuardConfig, token: str, sample_every: float = 0.2) -> GuardProcess:
        """The guard pod's process, with the pod's environment: the mirror token (``mirror_token``)."""
        guard = WatchedGuard(config, environ={MIRROR_TOKEN_ENV: token})
        return cls(guard, server.serve(guard, sample_every=sample_every), token)

    @property
    def address(self) -> str:
        return self.running.url.removeprefix("http://")

    def post_unsigned(self, bodies: list[dict[str, Any]]) -> list[int]:
        """POST ``bodies`` as any other pod that reaches the guard would: without the route's token."""
        codes = []
        for body in bodies:
            req = urllib.request.Request(self.running.url + "/rerank", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    codes.append(resp.status)
            except urllib.error.HTTPError as exc:
                codes.append(exc.code)
        return codes

    def mirror(self, bodies: list[dict[str, Any]]) -> None:
        """POST ``bodies`` as the gateway's mirror would (the route's token header set, as its RequestHeaderModifier
        does before the RequestMirror), then wait until the guard has checked them all."""
        for body in bodies:
            req = urllib.request.Request(self.running.url + "/rerank", data=json.dumps(body).encode(), method="POST",
                                         headers={"Content-Type": "application/json",
                                                  intake.MIRROR_TOKEN_HEADER: self.token})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 202
                assert json.loads(resp.read())["sampled"] is True  # fraction 1, a budget it never reaches
            self.posted += 1
        eventually(lambda: self.running.worker.done >= self.posted, 60, "the guard to check the mirrored requests",
                   every=0.05)

    def mirror_between_scrapes(self, bodies: list[dict[str, Any]]) -> None:
        """Right after the operator read /metrics (it reads once an autoscaler interval, 5 s): the burst is checked
        before its next read, which sees the verdict and the figures after it, never a window half-filled."""
        seen = self.guard.scrapes
        eventually(lambda: self.guard.scrapes > seen, 30, "the operator to read the guard's /metrics", every=0.02)
        started = time.monotonic()
        self.mirror(bodies)
        assert time.monotonic() - started < 2.5, "the burst took too long to be checked between two reads"

    def state(self) -> str:
        return self.guard.detectors["cpu"].state

    def stop(self) -> None:
        self.running.stop()


def mirrored_requests(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` /rerank bodies as live traffic would bring them: the evaluation set's queries with their passages."""
    by_query: dict[str, list[str]] = {}
    for p in evaldata.builtin_pairs():
        by_query.setdefault(p.query, []).append(p.text)
    bodies = [{"query": q, "texts": ts} for q, ts in by_query.items()]
    rng = random.Random(seed)
    return [rng.choice(bodies) for _ in range(n)]


# --- the fleet, with the guard pod's address ----------------------------------------------------------------------

class GuardedFleet(Fleet):
    """test_autoscaling's fleet (the pools' pods and their load), with every guard pod of the model mapped to the
    test's guard process in the same address table: the pools' pods and the guard are published together, so the
    operator never reads a table without the guard."""

    def __init__(self, kube: client.ApiClient, namespace: str, override_file: Path, rate: float) -> None:
        self.guard_address: str | None = None  # before Fleet's first refresh, which publishes the table
        super().__init__(kube, namespace, override_file, rate)

    def addresses(self) -> dict[str, str]:
        table = super().addresses()
        if self.guard_address is not None:
            for pod in self.core.list_namespaced_pod(self.namespace, label_selector=GUARD_SELECTOR).items:
                table[pod.metadata.name] = self.guard_address
        return table

    def point_at(self, guard: GuardProcess) -> None:
        self.guard_address = guard.address
        self.look_again()


# --- the cluster side ---------------------------------------------------------------------------------------------

@dataclass
class Stack:
    env: Env
    override: Path
    class_name: str

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.env.kube.api)

    def set_guard(self, section: dict[str, Any]) -> None:
        self.custom.patch_cluster_custom_object(GROUP, VERSION, "rerankclasses", self.class_name,
                                                {"spec": {"qualityGuard": section}})


@pytest.fixture
def stack(cluster: Any, kube: client.ApiClient, namespace: str, operator_identity: Any,
          gateway_api_installed: list[str], tmp_path: Path) -> Iterator[Stack]:
    """A RerankClass with the guard on, and an operator whose scraper reads pod addresses from a file."""
    static_pv(cluster, f"pv-{namespace}", namespace)
    custom = client.CustomObjectsApi(kube)
    class_name = f"guarded-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": class_name},
        "spec": {"qualityGuard": QUALITY_GUARD}})
    override = tmp_path / "scrape-addresses.json"
    override.write_text("{}")
    operator = OperatorProcess(cluster, operator_identity, [namespace],
                               launcher=["-m", "rerank_devcluster.scrape_redirect", str(override)]).start()
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, operator)
    try:
        yield Stack(env, override, class_name)
    finally:
        cleanup(env, [namespace])
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", class_name)
        cluster.kubectl_run("delete", "pv", f"pv-{namespace}", "--wait=false", check=False)


def wait(env: Env, check: Callable[[], Any], timeout: float, what: str, every: float = 0.3) -> Any:
    """``eventually``, failing with the model's status, its children and the operator's log tail."""
    try:
        return eventually(check, timeout, what, every=every)
    except AssertionError as exc:
        quality = json.dumps(status(env).get("quality"), indent=1)
        conds = json.dumps(status(env).get("conditions"), indent=1)
        raise AssertionError(f"{exc}\nstatus.quality: {quality}\nconditions: {conds}\n{env.describe()}\n"
                             f"--- operator log (filtered) ---\n{operator_log(env, 60)}") from None


def quality_condition(env: Env, want: str, reason: str, timeout: float = 60) -> dict[str, Any]:
    def check() -> Any:
        cond = env.kube.condition(env.namespace, NAME, "QualityVerified")
        return cond if (cond.get("status"), cond.get("reason")) == (want, reason) else None
    return wait(env, check, timeout, f"QualityVerified {want}/{reason}")


def events(env: Env) -> list[tuple[str, str, str]]:
    items = json.loads(env.cluster.kubectl_run("get", "events", "-n", env.namespace, "-o", "json",
                                               "--field-selector", f"involvedObject.name={NAME}").stdout)["items"]
    return [(e["type"], e["reason"], e.get("message", "")) for e in items]


def route(env: Env) -> dict[str, Any]:
    got: dict[str, Any] = client.CustomObjectsApi(env.kube.api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", env.namespace, "httproutes", NAME)
    return got


def guard_env(env: Env, name: str) -> str | None:
    """A variable of the guard container's environment, as its Deployment has it (None: no such variable)."""
    dep = env.kube.deployment(env.namespace, GUARD) or {}
    containers = ((dep.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or [{}]
    return next((e.get("value") for e in containers[0].get("env") or () if e["name"] == name), None)


def mirror_token(env: Env) -> str:
    """The token the operator gave the guard pod (its Deployment's environment)."""
    token = guard_env(env, MIRROR_TOKEN_ENV)
    assert token, "the guard's Deployment carries no mirror token"
    return token


def guard_config(env: Env) -> dict[str, Any]:
    value = guard_env(env, "RERANK_GUARD_CONFIG")
    return json.loads(value) if value else {}


def replicas(env: Env, pool: str) -> int:
    dep = env.kube.deployment(env.namespace, f"{NAME}-{pool}") or {}
    return int((dep.get("spec") or {}).get("replicas") or 0)


def test_guard_takes_a_pool_below_the_floor_out_of_traffic_and_back(stack: Stack, scorers: Scorers) -> None:
    env, ns = stack.env, stack.env.namespace
    started = time.monotonic()
    env.kube.create_model(env.model(className=stack.class_name, pools=POOLS, autoscaling=AUTOSCALING,
                                    routing=GATEWAY, quantization={"qualityGate": GATE}))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, NAME, "Ready", "True", "Serving")

    # 1. The guard's children: a Deployment and a Service owned by the model, the mirror on the route.
    dep = wait(env, lambda: env.kube.deployment(ns, GUARD), 30, "the guard's Deployment")
    meta = dep["metadata"]
    assert [(o["kind"], o["name"], o.get("controller")) for o in meta["ownerReferences"]] == [
        ("RerankModel", NAME, True)], meta["ownerReferences"]
    assert meta["labels"]["app.kubernetes.io/component"] == "quality-guard" and "rerank.io/pool" not in meta["labels"]
    pod = dep["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    container = pod["containers"][0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["command"][:3] == ["python", "-m", "quality_guard.server"]
    raw = guard_config(env)
    op_config = GuardConfig.from_dict(raw)
    assert (op_config.namespace, op_config.model) == (ns, NAME)
    assert op_config.floor == Floor(min_spearman=GATE["minSpearman"], min_topk_agreement=GATE["minTopKAgreement"])
    assert op_config.k == GATE["topK"]
    assert dict(op_config.pools) == {"cpu": f"http://{NAME}-cpu.{ns}.svc:80"}
    assert op_config.reference == f"http://{NAME}-gpu.{ns}.svc:80"
    assert op_config.calls_per_second == QUALITY_GUARD["callsPerSecond"] and op_config.below_floor == ()
    svc = env.kube.core.read_namespaced_service(GUARD, ns)
    assert svc.metadata.owner_references[0].name == NAME
    assert svc.spec.selector == dep["spec"]["selector"]["matchLabels"]
    assert [(p.port, p.target_port) for p in svc.spec.ports] == [(80, "http")]
    mirror = {"type": "RequestMirror", "requestMirror": {  # group and kind: the API server's defaults
        "backendRef": {"group": "", "kind": "Service", "name": GUARD, "port": 80},
        "fraction": {"numerator": 2500, "denominator": 10000}}}
    rule = wait(env, lambda: (r := route(env)["spec"]["rules"][0]).get("filters") and r, 30, "the mirror filter")
    token = mirror_token(env)
    header = {"type": "RequestHeaderModifier",
              "requestHeaderModifier": {"set": [{"name": intake.MIRROR_TOKEN_HEADER, "value": token}]}}
    assert rule["filters"] == [header, mirror], rule  # the token first: the mirrored copy carries it
    assert len(token) >= 32 and op_config.mirror_token_env == MIRROR_TOKEN_ENV
    assert {b["name"] for b in rule["backendRefs"]} == {f"{NAME}-cpu", f"{NAME}-gpu"}

    # The guard pod's process: the operator's configuration with the host's addresses and small windows.
    switch = Switch(scorers.healthy.url)
    config = dataclasses.replace(op_config, pools={"cpu": switch.url}, reference=scorers.reference.url,
                                 evidence=dataclasses.asdict(SMALL), calls_per_second=1e6)
    proc = GuardProcess.start(config, token)
    fleet = GuardedFleet(env.kube.api, ns, stack.override, rate=4.0)
    try:
        fleet.point_at(proc)
        wait(env, lambda: proc.guard.scrapes > 0, 30, "the operator to read the guard's /metrics")

        # 2. A healthy CPU pool: verified within the floor; the pools are not disturbed.
        proc.mirror(mirrored_requests(15, seed=1))
        cond = quality_condition(env, "True", "WithinFloor")
        assert "cpu pool within the quality floor" in cond["message"] and "Spearman" in cond["message"], cond
        wait(env, lambda: env.kube.condition(ns, NAME, "MetricsAvailable").get("status") == "True", 60,
             "fresh pool metrics")
        quality = status(env)["quality"]
        assert quality["guard"] == GUARD and quality["reference"] == "gpu" and quality["belowFloor"] == []
        cpu = quality["pools"]["cpu"]
        assert cpu["belowFloor"] is False and cpu["windowRequests"] >= 1 and cpu["spearman"] > 0.999, quality
        assert route_weights(env) == {"cpu": 0, "gpu": 100}
        assert "BelowFloor" not in [r for _, r, _ in events(env)]
        print(f"\nWITHIN FLOOR after {time.monotonic() - started:.0f}s: {cond['message']}")

        # A burst more than the GPU pool serves at its maximum: traffic spills to the CPU pool.
        fleet.rate = BURST
        wait(env, lambda: route_weights(env)["cpu"] > 0, 90, "spillover to the CPU pool", every=0.5)
        spilled, gpu_before = route_weights(env), replicas(env, "gpu")

        # 3. The CPU pool breaks. First a pod that is not the routing layer (another tenant's, or a stray one the
        # NetworkPolicy would stop where the CNI enforces it) posts the stream that shows it, without the route's
        # token: nothing of it is scored or kept, the verdict and the weights stay.
        switch.target = scorers.broken.url
        done, compared = proc.running.worker.done, proc.guard.detectors["cpu"].samples
        assert set(proc.post_unsigned(mirrored_requests(30, seed=2))) == {401}
        assert (proc.running.worker.done, proc.guard.detectors["cpu"].samples) == (done, compared)
        assert proc.state() == "healthy"
        seen = proc.guard.scrapes
        wait(env, lambda: proc.guard.scrapes > seen, 30, "the operator to read the guard's /metrics after the posts")
        assert env.kube.condition(ns, NAME, "QualityVerified")["reason"] == "WithinFloor"
        assert route_weights(env)["cpu"] > 0  # still spilling
        assert 'outcome="unauthenticated"' in proc.guard.metrics().decode()
        # The same stream through the route's mirror is scored: the guard flips, the operator takes the pool out
        # of traffic under the same load.
        proc.mirror_between_scrapes(mirrored_requests(30, seed=2))
        assert proc.state() == "below_floor"
        cond = quality_condition(env, "False", "BelowFloor", timeout=30)
        message = cond["message"]
        assert "cpu pool below the quality floor vs the GPU pool" in message, message
        assert "sampled requests" in message, message  # the guard's reason: the figures it decided on
        assert "its traffic goes to the GPU pool" in message, message
        quality = status(env)["quality"]
        assert quality["belowFloor"] == ["cpu"], quality
        assert quality["pools"]["cpu"]["belowFloor"] is True
        assert quality["pools"]["cpu"]["spearman"] < GATE["minSpearman"], quality
        wait(env, lambda: route_weights(env) == {"cpu": 0, "gpu": 100}, 30,
             f"the CPU pool out of traffic at {BURST} requests/s (it had {spilled})")
        warnings = [(t, m) for t, r, m in events(env) if r == "BelowFloor"]
        assert warnings and warnings[0][0] == "Warning" and "cpu pool ranks below the quality floor" in warnings[0][1]
        # The autoscaler sizes the GPU pool for all the traffic (its maximum: 3 x 10 < 50 requests/s).
        decision = wait(env, lambda: (d := status(env)["autoscaling"]["lastDecision"])["gpuReplicas"] == GPU_MAX
                        and d, 60, "the GPU pool sized for all the traffic")
        assert decision["cpuPercent"] == 0, decision
        assert "quality floor" in decision.get("reason", ""), decision
        wait(env, lambda: replicas(env, "gpu") == GPU_MAX, 30, "the GPU pool at its maximum")
        # The verdict travels into the guard's configuration: a new guard pod starts below the floor.
        wait(env, lambda: guard_config(env).get("below_floor") == ["cpu"], 30, "below_floor in the guard's config")
        print(f"BELOW FLOOR after {time.monotonic() - started:.0f}s: {message}\n  weights at the spill {spilled} "
              f"with {gpu_before} GPU replicas; then {route_weights(env)}, decision: {decision}")

        # The guard restarts (the Deployment rolled with the new configuration): it starts below the floor, with no
        # figures, and the operator keeps the CPU pool out (no QualityRestored on a guard that knows nothing yet).
        proc.stop()
        restarted = GuardConfig.from_dict(guard_config(env))
        assert restarted.below_floor == ("cpu",)
        proc = GuardProcess.start(dataclasses.replace(restarted, pools={"cpu": switch.url},
                                                      reference=scorers.reference.url,
                                                      evidence=dataclasses.asdict(SMALL), calls_per_second=1e6),
                                  mirror_token(env))
        assert proc.state() == "below_floor"
        fleet.point_at(proc)
        wait(env, lambda: proc.guard.scrapes >= 2, 30, "two reads of the restarted guard")
        cond = env.kube.condition(ns, NAME, "QualityVerified")
        assert (cond["status"], cond["reason"]) == ("False", "BelowFloor"), cond
        assert status(env)["quality"]["belowFloor"] == ["cpu"]
        assert route_weights(env) == {"cpu": 0, "gpu": 100}
        assert "QualityRestored" not in [r for _, r, _ in events(env)]

        # 4. The pool is repaired: after the recovery window the guard says so, and the CPU pool takes the
        # spillover again (the burst is still on).
        switch.target = scorers.healthy.url
        proc.mirror_between_scrapes(mirrored_requests(SMALL.recovery_window + 10, seed=3))
        assert proc.state() == "healthy"
        cond = quality_condition(env, "True", "WithinFloor", timeout=30)
        assert status(env)["quality"]["belowFloor"] == []
        restored = [(t, m) for t, r, m in events(env) if r == "QualityRestored"]
        assert restored and restored[0][0] == "Normal" and "back within the quality floor" in restored[0][1], restored
        wait(env, lambda: route_weights(env)["cpu"] > 0, 90, "the CPU pool back in traffic under the burst",
             every=0.5)
        wait(env, lambda: guard_config(env).get("below_floor") == [], 30, "the guard's config without below_floor")
        print(f"RESTORED after {time.monotonic() - started:.0f}s: {cond['message']}; weights {route_weights(env)}")

        # Under a fixed split the verdict also changes what the GPU pool is sized for (gpu-first sizes it for all
        # the traffic anyway, which is why it was at its maximum above). 20% of the traffic is one GPU replica's
        # work; once the CPU pool is out, the GPU pool takes all of it and grows.
        fleet.rate = 3.0  # the burst is over: the GPU pods work off their backlog and the pool shrinks
        env.kube.patch_spec(ns, NAME, {"routing": {"policy": "fixed", "weights": {"gpu": 20, "cpu": 80}}})
        wait(env, lambda: route_weights(env) == {"cpu": 80, "gpu": 20}, 30, "the fixed split on the route")
        wait(env, lambda: replicas(env, "gpu") == 1, 150, "the GPU pool back to one replica", every=1)
        fleet.rate = 15.0
        switch.target = scorers.broken.url
        proc.mirror_between_scrapes(mirrored_requests(40, seed=4))
        assert proc.state() == "below_floor"
        quality_condition(env, "False", "BelowFloor", timeout=30)
        wait(env, lambda: route_weights(env) == {"cpu": 0, "gpu": 100}, 30, "the fixed split overruled by the verdict")
        wait(env, lambda: replicas(env, "gpu") >= 2, 60, "the GPU pool grown for all the traffic", every=0.5)
        print(f"FIXED SPLIT, BELOW FLOOR after {time.monotonic() - started:.0f}s: GPU replicas {replicas(env, 'gpu')}, "
              f"decision {status(env)['autoscaling']['lastDecision']}")

        # 5. The class turns the guard off: its children, the mirror and the model's quality status go, and with
        # them the verdict (no guard, no quality rule): the fixed split applies again.
        stack.set_guard({"enabled": False})
        wait(env, lambda: not env.kube.exists("Deployment", ns, GUARD) and not env.kube.exists("Service", ns, GUARD),
             60, "the guard's Deployment and Service deleted")
        wait(env, lambda: "filters" not in route(env)["spec"]["rules"][0], 30, "the mirror filter removed")
        wait(env, lambda: "quality" not in status(env)
             and not env.kube.condition(ns, NAME, "QualityVerified"), 30, "status.quality and QualityVerified gone")
        wait(env, lambda: route_weights(env) == {"cpu": 80, "gpu": 20}, 30, "the fixed split back without the guard")
        # One Event per transition: the guard's restart and the Deployment's rollouts posted none.
        reasons = [r for _, r, _ in events(env)]
        assert (reasons.count("BelowFloor"), reasons.count("QualityRestored")) == (2, 1), events(env)
        assert "Traceback" not in env.operator.log.read_text(), operator_log(env, 80)
        print(f"GUARD OFF after {time.monotonic() - started:.0f}s")
    finally:
        fleet.stop()
        proc.stop()
        switch.close()


def test_a_model_without_a_gpu_pool_is_checked_against_fp32_scored_in_the_guard(
        stack: Stack, scorers: Scorers, tmp_path: Path) -> None:
    """A CPU-only model without a Gateway: the guard mounts the served artifact, replays its evaluation pairs and
    scores the original weights in FP32 itself (quality_guard/reference.py, PyTorch on the published original/)."""
    env, ns = stack.env, stack.env.namespace
    env.kube.create_model(env.model(className=stack.class_name, pools={"cpu": POOLS["cpu"], "gpu": {"enabled": False}},
                                    autoscaling=AUTOSCALING, quantization={"qualityGate": GATE}))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(ns, NAME, "Ready", "True", "Serving")
    dep = wait(env, lambda: env.kube.deployment(ns, GUARD), 30, "the guard's Deployment")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/artifact")
    artifact_id = status(env)["artifact"]["id"]
    assert (mount["readOnly"], mount["subPath"]) == (True, f"artifacts/{artifact_id}")
    claim = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert claim["persistentVolumeClaim"]["readOnly"] is True
    assert container["resources"]["requests"]["memory"] == "3Gi", container["resources"]  # room for the weights
    op_config = GuardConfig.from_dict(guard_config(env))
    assert op_config.reference == LOCAL_REFERENCE and op_config.reference_model == "/artifact/original"
    assert op_config.replay == "/artifact/evaluation.jsonl"
    assert dict(op_config.pools) == {"cpu": f"http://{NAME}-cpu.{ns}.svc:80"}
    assert op_config.replay_per_second == QUALITY_GUARD["callsPerSecond"] / 2  # the pool + the FP32 scoring

    # The guard pod's process with the artifact's files where the pod mounts them: the original weights and the
    # evaluation pairs the Job verified on. It replays them by itself (nothing is mirrored); its budget is the
    # class's.
    pairs = tmp_path / "evaluation.jsonl"
    pairs.write_text("".join(json.dumps({"query": p.query, "text": p.text}) + "\n" for p in evaldata.builtin_pairs()))
    switch = Switch(scorers.healthy.url)
    reference_calls = scorers.reference.calls
    proc = GuardProcess.start(dataclasses.replace(op_config, pools={"cpu": switch.url},
                                                  reference_model=str(scorers.original), replay=str(pairs),
                                                  evidence=dataclasses.asdict(SMALL)), mirror_token(env))
    fleet = GuardedFleet(env.kube.api, ns, stack.override, rate=2.0)
    try:
        fleet.point_at(proc)
        cond = quality_condition(env, "True", "WithinFloor", timeout=60)
        assert "cpu pool within the quality floor vs FP32 of the original weights" in cond["message"], cond
        quality = status(env)["quality"]
        assert quality["reference"] == "fp32" and quality["pools"]["cpu"]["spearman"] > 0.999, quality
        selector = env.kube.core.read_namespaced_service(NAME, ns).spec.selector

        # The CPU pool breaks: below the floor, said and evented, but it keeps serving (nothing else can).
        switch.target = scorers.broken.url
        cond = quality_condition(env, "False", "BelowFloor", timeout=60)
        message = cond["message"]
        assert "cpu pool below the quality floor vs FP32 of the original weights" in message, message
        assert "it keeps serving: the model has no other pool" in message, message
        assert status(env)["quality"]["belowFloor"] == ["cpu"]
        assert env.kube.core.read_namespaced_service(NAME, ns).spec.selector == selector
        assert [t for t, r, _ in events(env) if r == "BelowFloor"] == ["Warning"]

        # Repaired: back within the floor after the recovery window.
        switch.target = scorers.healthy.url
        quality_condition(env, "True", "WithinFloor", timeout=90)
        assert [t for t, r, _ in events(env) if r == "QualityRestored"] == ["Normal"]
        # Every comparison was against the guard's own FP32 scores: no TEI reference was asked.
        assert scorers.reference.calls == reference_calls
        assert proc.guard.detectors["cpu"].samples >= SMALL.recovery_window
        assert "Traceback" not in env.operator.log.read_text(), operator_log(env, 80)
    finally:
        fleet.stop()
        proc.stop()
        switch.close()


def test_a_drifting_model_is_requantized_on_its_live_sample_and_the_result_serves_as_a_canary(
        stack: Stack, scorers: Scorers, tmp_path: Path) -> None:
    """With the tenant's consent (quantization.requantizeOnDrift) the guard keeps the mirrored requests in its
    directory of the volume; when the stable CPU pool ranks below the floor on them the operator starts a round: a
    Job evaluated on that sample, whose artifact then serves as a canary beside the stable one."""
    env, ns = stack.env, stack.env.namespace
    consent = {"enabled": True, "maxPairs": 400, "maxAgeHours": 24, "minIntervalHours": 1}
    env.kube.create_model(env.model(className=stack.class_name, pools=POOLS, autoscaling=AUTOSCALING,
                                    routing=GATEWAY, quantization={"qualityGate": GATE, "requantizeOnDrift": consent}))
    stable = env.finish_quantizer(ok=True)["metadata"]["labels"]["rerank.io/artifact"]
    env.kube.wait_condition(ns, NAME, "Ready", "True", "Serving")
    dep = wait(env, lambda: env.kube.deployment(ns, GUARD), 30, "the guard's Deployment")
    pod = dep["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["subPath"] == f"samples/{NAME}")
    assert not mount.get("readOnly") and not next(
        v for v in pod["volumes"] if v["name"] == mount["name"])["persistentVolumeClaim"].get("readOnly")
    op_config = GuardConfig.from_dict(guard_config(env))
    assert op_config.live_sample == LiveSampleSettings(f"{mount['mountPath']}/live.jsonl", 400, 24 * 3600.0)

    # The guard pod's process, its sample where the mount puts it on the volume; the CPU pool has drifted.
    live = tmp_path / "volume" / "samples" / NAME / "live.jsonl"
    assert op_config.live_sample is not None
    switch = Switch(scorers.broken.url)
    proc = GuardProcess.start(dataclasses.replace(
        op_config, pools={"cpu": switch.url}, reference=scorers.reference.url, evidence=dataclasses.asdict(SMALL),
        calls_per_second=1e6, live_sample=dataclasses.replace(op_config.live_sample, path=str(live))),
        mirror_token(env))
    fleet = GuardedFleet(env.kube.api, ns, stack.override, rate=2.0)
    try:
        fleet.point_at(proc)
        proc.mirror(mirrored_requests(50, seed=5))
        quality_condition(env, "False", "BelowFloor")
        found = wait(env, lambda: (status(env).get("quality") or {}).get("requantization"), 60,
                     "a re-quantization round in status.quality")
        assert found["count"] == 1 and found["fromArtifact"] == stable, found
        kept = evaldata.load_jsonl(str(live))  # the Job's own reader, on what the guard wrote
        assert found["samplePairs"] == len(kept) >= 200, (found, len(kept))
        assert [(t, r) for t, r, _ in events(env) if r == "RequantizingOnDrift"] == [("Normal", "RequantizingOnDrift")]

        # One Job for the round, evaluated on the live sample (mode dynamic: no calibration data).
        def round_job() -> Any:
            jobs = env.kube.batch.list_namespaced_job(ns, label_selector="app.kubernetes.io/component=quantizer").items
            return next((j for j in jobs if j.metadata.labels["rerank.io/artifact"] != stable), None)
        job = wait(env, round_job, 60, "the round's quantization Job")
        args = job.spec.template.spec.containers[0].args
        assert args[args.index("--eval-pairs") + 1] == f"/models/samples/{NAME}/live.jsonl", args
        assert "--calibration-pairs" not in args
        new = job.metadata.labels["rerank.io/artifact"]

        # Its artifact comes from the same weights: a canary first, the stable artifact keeps serving.
        env.finish_quantizer(ok=True, artifact_id=new)
        wait(env, lambda: (status(env).get("canary") or {}).get("state") == "Running"
             and status(env)["canary"]["artifact"]["id"] == new, 60, "the round's artifact as a canary")
        assert status(env)["artifact"]["id"] == stable
        assert wait(env, lambda: env.kube.deployment(ns, f"{NAME}-canary"), 30, "the canary's Deployment")
        # Still below the floor on the stable pool, but within the interval: no second round, no second Job.
        seen = proc.guard.scrapes
        wait(env, lambda: proc.guard.scrapes >= seen + 2, 30, "two more reads of the guard")
        assert status(env)["quality"]["requantization"]["count"] == 1
        assert len(env.kube.batch.list_namespaced_job(
            ns, label_selector="app.kubernetes.io/component=quantizer").items) == 2
        assert "Traceback" not in env.operator.log.read_text(), operator_log(env, 80)
    finally:
        fleet.stop()
        proc.stop()
        switch.close()

