"""Requests through a real gateway: the routes the operator writes, executed by Traefik (built from the Go module
proxy, ``rerank_devcluster.gateway``), client -> Traefik -> the pools' pod addresses.

The pools are kwok pods, whose addresses (the dev cluster's pod CIDR) lead nowhere: the test makes the whole pod CIDR
local to this machine (``ip route add local``, root) and serves each pod's address itself, so Traefik's connections,
made to the addresses in the Services' EndpointSlices as with any real pod, arrive at a stand-in per pod that counts
them by pool and answers TEI's ``/rerank``. Where a guarded model's pods run the guard's sampler in front of TEI (a
gateway without RequestMirror), the test runs the real ``rerank-sampler`` with the arguments and token the operator
put in the pod spec, in front of a stand-in TEI, copying to a stand-in guard.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_contracts.guard import MIRROR_TOKEN_ENV, MIRROR_TOKEN_HEADER, SAMPLER_PORT
from rerank_devcluster.cluster import POD_CIDR, Cluster
from rerank_devcluster.gateway import TraefikGateway, start_gateway
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from tests.cluster.rrm_harness import GROUP, VERSION, Env, Kube, OperatorProcess, cleanup, static_pv

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAME = "bge-m3"
POOLS = {"cpu": {"minReplicas": 1, "maxReplicas": 2},
         "gpu": {"minReplicas": 1, "maxReplicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}}}
REQUESTS = 1000
BODY = json.dumps({"query": "what is a panda?", "texts": ["a bear", "a city"]}).encode()
SAMPLE_FRACTION = 0.2


# --- the pods' addresses, served here ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pod_cidr_is_local() -> Iterator[None]:
    """Every address of the pod CIDR is this machine's, for the test's duration (the AnyIP trick: a local route)."""
    assert os.geteuid() == 0, "needs root: the test routes the pod CIDR to this machine (as the node tier needs root)"
    subprocess.run(["ip", "route", "replace", "local", POD_CIDR, "dev", "lo"], check=True)
    try:
        yield
    finally:
        subprocess.run(["ip", "route", "del", "local", POD_CIDR, "dev", "lo"], check=False)


class Counted(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], pool: str, seen: Counter[str], lock: threading.Lock) -> None:
        self.pool, self.seen, self.lock = pool, seen, lock
        super().__init__(address, Tei)


class Tei(BaseHTTPRequestHandler):
    """A stand-in TEI: /health, and /rerank answered in TEI's shape; every /rerank counted for its server's pool."""

    protocol_version = "HTTP/1.1"
    server: Counted

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._answer(b"ok")

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with self.server.lock:
            self.server.seen[self.server.pool] += 1
        texts = body.get("texts") or []
        self._answer(json.dumps([{"index": i, "score": 1.0 / (i + 1)} for i in range(len(texts))]).encode())

    def _answer(self, data: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class Pods:
    """A stand-in TEI on each Ready pool pod's address and serving port, counting requests by pool."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.seen: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.servers: dict[str, Counted] = {}

    def serve(self, port: int = 8080) -> list[str]:
        """Serve every Ready pool pod's address not served yet; their addresses."""
        for pod in self.kube.pods(self.namespace, f"app.kubernetes.io/instance={NAME},rerank.io/pool"):
            ip, pool = pod["status"].get("podIP"), pod["metadata"]["labels"]["rerank.io/pool"]
            if ip and ip not in self.servers:
                server = Counted((ip, port), pool, self.seen, self.lock)
                threading.Thread(target=server.serve_forever, daemon=True).start()
                self.servers[ip] = server
        return sorted(self.servers)

    def take(self) -> Counter[str]:
        with self.lock:
            seen, self.seen = self.seen.copy(), Counter()
            for server in self.servers.values():
                server.seen = self.seen
        return seen

    def stop(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


def send(gw: TraefikGateway, n: int) -> Counter[int]:
    """``n`` rerank requests to the Gateway's address, four at a time; their status codes."""
    codes: Counter[int] = Counter()
    lock = threading.Lock()

    def one() -> None:
        request = urllib.request.Request(gw.address + "/rerank", data=BODY, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                response.read()
                code = response.status
        except urllib.error.HTTPError as exc:
            code = exc.code
        with lock:
            codes[code] += 1

    def worker(count: int) -> None:
        for _ in range(count):
            one()

    threads = [threading.Thread(target=worker, args=(n // 4 + (1 if i < n % 4 else 0),)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


# --- the stack: a namespace with its Gateway, an operator ----------------------------------------------------------

@pytest.fixture
def stack(cluster: Cluster, kube: client.ApiClient, namespace: str, operator_identity: Any,
          gateway_api_installed: list[str], pod_cidr_is_local: None) -> Iterator[tuple[Env, TraefikGateway]]:
    """Traefik's Gateway in the model's namespace (the operator watches that namespace: its Gateways are readable
    to it), an operator, a static volume."""
    gw = start_gateway(cluster, namespace=namespace)
    static_pv(cluster, f"pv-{namespace}", namespace)
    operator = OperatorProcess(cluster, operator_identity, [namespace]).start()
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, operator)
    try:
        yield env, gw
    finally:
        cleanup(env, [namespace])
        gw.stop()
        cluster.kubectl_run("delete", "pv", f"pv-{namespace}", "--wait=false", check=False)


def route(env: Env) -> dict[str, Any]:
    got: dict[str, Any] = client.CustomObjectsApi(env.kube.api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", env.namespace, "httproutes", NAME)
    return got


def weights(env: Env) -> dict[str, int]:
    try:
        backends = route(env)["spec"]["rules"][0]["backendRefs"]
    except ApiException:
        return {}
    return {b["name"].rsplit("-", 1)[-1]: b.get("weight", 1) for b in backends}


def served(env: Env, pods: Pods, count: int) -> list[str]:
    """Wait until ``count`` pool pods are Ready and served here."""
    return eventually(lambda: (ips if len(ips := pods.serve()) >= count else None), 120,
                      f"{count} Ready pool pods served\n{env.describe()}")


def test_the_operators_weights_reach_the_pods_through_a_real_gateway(stack: tuple[Env, TraefikGateway]) -> None:
    """100/0 -> 70/30 -> 0/100 (routing policy fixed): counted at the pods, within 5 points over 1000 requests each;
    the time from the spec change to the traffic moved, printed."""
    env, gw = stack
    routing = {"policy": "fixed", "weights": {"gpu": 100, "cpu": 0}, "gateway": {"parentRefs": [gw.parent_ref()]}}
    env.kube.create_model(env.model(quantization={"enabled": False}, pools=POOLS, routing=routing))
    pods = Pods(env.kube, env.namespace)
    try:
        served(env, pods, 2)
        gw.wait_route(env.namespace, NAME, timeout=60)
        moved = []
        for gpu in (100, 70, 0):
            changed = time.monotonic()
            env.kube.patch_spec(env.namespace, NAME, {"routing": {"weights": {"gpu": gpu, "cpu": 100 - gpu}}})
            eventually(lambda g=gpu: weights(env) == {"gpu": g, "cpu": 100 - g}, 30, f"route weights {gpu}")

            def shifted(g: int = gpu) -> bool:  # a small probe until the gateway applies the route's new weights
                pods.take()
                send(gw, 20)
                probe = pods.take()
                return abs(100 * probe["gpu"] / max(1, sum(probe.values())) - g) <= 10
            eventually(shifted, 30, f"traffic at {gpu}/{100 - gpu}", every=0.1)
            moved.append(round(time.monotonic() - changed, 2))
            pods.take()
            codes = send(gw, REQUESTS)
            seen = pods.take()
            assert codes == {200: REQUESTS}, codes
            assert sum(seen.values()) == REQUESTS
            assert abs(100 * seen["gpu"] / REQUESTS - gpu) <= 5, (gpu, seen)
        print(json.dumps({"spec_change_to_traffic_moved_s": moved}))
    finally:
        pods.stop()


def test_a_route_the_gateway_does_not_accept_shows_in_the_models_status_within_10_s(
        stack: tuple[Env, TraefikGateway]) -> None:
    env, gw = stack
    wrong = {**gw.parent_ref(), "sectionName": "no-such-listener"}
    routing = {"policy": "fixed", "weights": {"gpu": 50, "cpu": 50}, "gateway": {"parentRefs": [gw.parent_ref()]}}
    env.kube.create_model(env.model(quantization={"enabled": False}, pools=POOLS, routing=routing))
    gw.wait_route(env.namespace, NAME, timeout=60)
    env.kube.wait_condition(env.namespace, NAME, "RouteAccepted", "True", "Accepted", timeout=60)
    changed = time.monotonic()
    env.kube.patch_spec(env.namespace, NAME, {"routing": {"gateway": {"parentRefs": [wrong]}}})
    cond = env.kube.wait_condition(env.namespace, NAME, "RouteAccepted", "False", timeout=30)
    took = time.monotonic() - changed
    assert took <= 10, f"RouteAccepted=False after {took:.1f} s"
    assert gw.namespace + "/" + gw.name in cond["message"], cond
    ready = env.kube.condition(env.namespace, NAME, "Ready")
    assert ready["status"] == "False" and ready["reason"] in ("NotAccepted", "RefsNotResolved"), ready
    print(json.dumps({"route_refused_to_status_s": round(took, 2), "message": cond["message"]}))


# --- a guarded model on a gateway without RequestMirror ----------------------------------------------------------

class Guard(ThreadingHTTPServer):
    """A stand-in quality guard: counts the copies carrying ``token``; answers 202 as the guard does."""

    daemon_threads = True

    def __init__(self) -> None:
        self.copies: list[tuple[str | None, bytes]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with outer.lock:
                    outer.copies.append((self.headers.get(MIRROR_TOKEN_HEADER), body))
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def guarded_class(kube: client.ApiClient) -> Iterator[str]:
    custom = client.CustomObjectsApi(kube)
    name = f"guarded-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": name},
        "spec": {"qualityGuard": {"enabled": True, "sampleFraction": SAMPLE_FRACTION, "canaryPercent": 0}}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)


def test_a_guarded_model_serves_on_a_gateway_without_request_mirror_and_its_guard_gets_its_sample(
        stack: tuple[Env, TraefikGateway], kube: client.ApiClient) -> None:
    """Traefik publishes its features without RequestMirror: the route carries none (every request 200, where a
    mirror filter made Traefik answer 500 to all), GatewayFeatures says why, and the pool pods' sampler copies the
    class's fraction of the requests to the guard, with the model's token."""
    env, gw = stack
    features = gw.gateway_class_status().get("supportedFeatures") or []
    assert "HTTPRouteRequestMirror" not in [f.get("name") if isinstance(f, dict) else f for f in features]
    with guarded_class(kube) as class_name:
        routing = {"policy": "fixed", "weights": {"gpu": 50, "cpu": 50}, "gateway": {"parentRefs": [gw.parent_ref()]}}
        env.kube.create_model(env.model(className=class_name, pools=POOLS, routing=routing))
        env.finish_quantizer()
        cond = env.kube.wait_condition(env.namespace, NAME, "GatewayFeatures", "False", "FeatureUnsupported", 60)
        assert "HTTPRouteRequestMirror" in cond["message"] and "sampler" in cond["message"], cond
        gw.wait_route(env.namespace, NAME, timeout=60)
        assert not [f for r in route(env)["spec"]["rules"] for f in r.get("filters") or ()
                    if f["type"] == "RequestMirror"]
        # The pod spec the operator wrote: the sampler on the serving port, its fraction, guard and token.
        cpu = eventually(lambda: env.kube.deployment(env.namespace, f"{NAME}-cpu"), 60, "the CPU pool")
        containers = {c["name"]: c for c in cpu["spec"]["template"]["spec"]["containers"]}
        sampler = containers["sampler"]
        assert ("http", SAMPLER_PORT) in [(p["name"], p["containerPort"]) for p in sampler["ports"]]
        args, token = sampler["args"], {e["name"]: e["value"] for e in sampler["env"]}[MIRROR_TOKEN_ENV]
        assert float(args[args.index("--fraction") + 1]) == SAMPLE_FRACTION
        # Run it as the pod would (the guard's address is this test's stand-in: no cluster DNS here).
        guard, tei = Guard(), Pods(env.kube, env.namespace)
        upstream = Counted(("127.0.0.1", 0), "pool", tei.seen, tei.lock)
        threading.Thread(target=upstream.serve_forever, daemon=True).start()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rerank_sampler", "--guard-url", guard.url,
             "--fraction", args[args.index("--fraction") + 1], "--port", str(SAMPLER_PORT),
             "--metrics-port", str(free_port()), "--upstream", f"http://127.0.0.1:{upstream.server_address[1]}"],
            env={**os.environ, MIRROR_TOKEN_ENV: token}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            eventually(lambda: send(gw, 1) == {200: 1}, 60, "the first request through the gateway and the sampler")
            codes = send(gw, REQUESTS)
            assert codes == {200: REQUESTS}, codes
            eventually(lambda: len(guard.copies) >= 0.8 * SAMPLE_FRACTION * REQUESTS, 15, "the copies")
            time.sleep(1)
            copies = list(guard.copies)
            assert abs(len(copies) - SAMPLE_FRACTION * (REQUESTS + 1)) <= 0.2 * SAMPLE_FRACTION * REQUESTS, \
                len(copies)
            assert all(t == token and body == BODY for t, body in copies)
            print(json.dumps({"requests": REQUESTS, "status_200": codes[200], "copies_to_guard": len(copies),
                              "fraction": SAMPLE_FRACTION}))
        finally:
            proc.terminate()
            proc.wait(15)
            upstream.shutdown()
            guard.shutdown()
