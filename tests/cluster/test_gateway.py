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
import secrets
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
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_activator import server as activator_server
from rerank_activator.endpoints import ApiAccess, Endpoints
from rerank_contracts import activator
from rerank_contracts.guard import MIRROR_TOKEN_ENV, MIRROR_TOKEN_HEADER, SAMPLER_PORT
from rerank_devcluster.cluster import POD_CIDR, Cluster
from rerank_devcluster.gateway import TraefikGateway, start_gateway
from rerank_devcluster.operator_process import REPO, kubectl_apply
from rerank_devcluster.processes import free_port
from rerank_devcluster.waiting import eventually
from rerank_operator.core.names import TEI_PORT
from rerank_sampler import server as front
from rerank_sampler.translation import ApiSettings
from tests.clients import official
from tests.cluster.rrm_harness import GROUP, OPERATOR_NS, VERSION, Env, Kube, OperatorProcess, cleanup, static_pv
from tests.cluster.sleeping_pool import CpuPool, bind_activator_rbac
from tests.tei_words import WordTei

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

    def serve(self, port: int = SAMPLER_PORT) -> list[str]:
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


def post_rerank(gw: TraefikGateway, body: bytes, timeout: float) -> int:
    """One /rerank to the Gateway's address; its status code."""
    request = urllib.request.Request(gw.address + "/rerank", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def send(gw: TraefikGateway, n: int) -> Counter[int]:
    """``n`` rerank requests to the Gateway's address, four at a time; their status codes."""
    codes: Counter[int] = Counter()
    lock = threading.Lock()

    def one() -> None:
        code = post_rerank(gw, BODY, timeout=10)
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


def test_the_official_rerank_clients_reach_the_model_through_a_real_gateway(
        stack: tuple[Env, TraefikGateway]) -> None:
    """Each pool pod served as it runs: the real front on the pod's serving port, a TEI (scoring by words,
    ``tests/tei_words.py``) on TEI's port. The official clients from PyPI (cohere v1 and v2, langchain-cohere,
    llama-index), given the Gateway's address as their base URL, rank through Traefik, the operator's route, the
    pool's Service and EndpointSlice, and the front: TEI's own scores for the pairs, in TEI's order."""
    env, gw = stack
    routing = {"policy": "fixed", "weights": {"gpu": 0, "cpu": 100}, "gateway": {"parentRefs": [gw.parent_ref()]}}
    env.kube.create_model(env.model(quantization={"enabled": False}, pools=POOLS, routing=routing))
    teis: list[WordTei] = []
    fronts: list[front.Running] = []
    try:
        ips = eventually(lambda: [p["status"]["podIP"] for p in env.kube.pods(
            env.namespace, f"app.kubernetes.io/instance={NAME},rerank.io/pool") if p["status"].get("podIP")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))]
            or None, 120, f"Ready pool pods\n{env.describe()}")
        deployment = env.kube.deployment(env.namespace, f"{NAME}-cpu")
        assert deployment is not None
        containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
        args = containers["sampler"]["args"]
        names_given = [args[i + 1] for i, a in enumerate(args) if a == "--model-name"]
        assert names_given[:2] == [NAME, f"{env.namespace}/{NAME}"]
        api = ApiSettings(models=tuple(names_given), served_model=names_given[0])
        for ip in ips:
            teis.append(WordTei(max_batch=8, host=ip, port=TEI_PORT))
            fronts.append(front.start(front.Settings(guard_url=None, token="", fraction=0.0, api=api,
                                                     upstream=f"http://{ip}:{TEI_PORT}"), ip, SAMPLER_PORT))
        gw.wait_route(env.namespace, NAME, timeout=60)
        query = "where do giant pandas live"
        documents = ["Giant pandas live in the mountains of central China.", "Paris is the capital of France.",
                     "Pandas eat bamboo.", "The giant panda is a bear.", "Where do you live?"]

        seen: list[Any] = []

        def teis_own() -> dict[int, float] | None:
            status, answer = post_json(gw, "/rerank", {"query": query, "texts": documents, "truncate": True})
            seen[:] = [status, answer]
            return {r["index"]: r["score"] for r in answer} if status == 200 else None
        try:
            expected = eventually(teis_own, 60, "TEI's /rerank through the gateway")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the gateway's last answer: {seen}\n{env.describe()}") from None
        got = official.rerank(gw.address, NAME, query, documents, top_n=3)
        best = sorted(expected, key=lambda i: (-expected[i], i))[:3]
        for client_name, ranking in got.items():
            assert [r[0] for r in ranking] == best, client_name
            assert all(r[1] == pytest.approx(expected[r[0]], abs=1e-5) for r in ranking), client_name
        status, refusal = post_json(gw, "/v2/rerank", {"model": "other", "query": query, "documents": documents})
        assert status == 404 and refusal["field"] == "model"
    finally:
        for running in fronts:
            running.stop()
        for tei in teis:
            tei.stop()


def post_json(gw: TraefikGateway, path: str, payload: Any) -> tuple[int, Any]:
    request = urllib.request.Request(gw.address + path, data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return int(exc.code), json.loads(raw or b"null")
        except ValueError:
            return int(exc.code), raw.decode(errors="replace")


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


# --- a sleeping model woken through the gateway --------------------------------------------------------------------

#: The activator's pod address (in the pod CIDR, which the test serves here; no node gives it to a pod).
ACTIVATOR_IP = "10.244.255.250"
ACTIVATOR_SERVICE = "rerank-activator"
IDLE_SECONDS = 30  # the CRD's least
WAKES = 20
SLEEPY_POOLS = {"cpu": {"minReplicas": 0, "maxReplicas": 3}, "gpu": {"enabled": False}}
AUTOSCALING = {"enabled": True, "intervalSeconds": 5, "idleSeconds": IDLE_SECONDS,
               "metrics": {"staleAfterSeconds": 15},
               "scaleDown": {"stabilizationSeconds": 5, "maxStep": 2, "cooldownSeconds": 10}}
ACTIVATOR_READS = REPO / "operator" / "rerank_activator" / "rbac.yaml"


def activator_token(cluster: Cluster, path: Path) -> Path:
    """A token of the activator's own ServiceAccount, bound to exactly operator/rerank_activator/rbac.yaml, as the
    chart binds it (a ClusterRole: the pools it wakes are in every namespace)."""
    name = "rerank-activator-reads"
    kubectl_apply(cluster, [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACTIVATOR_SERVICE, "namespace": OPERATOR_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": yaml.safe_load(ACTIVATOR_READS.read_text())},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": ACTIVATOR_SERVICE, "namespace": OPERATOR_NS}]},
    ])
    path.write_text(cluster.kubectl_run("create", "token", ACTIVATOR_SERVICE, "-n", OPERATOR_NS,
                                        "--duration=1h").stdout.strip())
    return path


def activator_service(cluster: Cluster) -> None:
    """The activator's Service as the gateway sees it: its EndpointSlice names the activator's pod address (a
    selectorless Service with a slice of its own, as no pod runs it here)."""
    kubectl_apply(cluster, [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": ACTIVATOR_SERVICE, "namespace": OPERATOR_NS},
         "spec": {"ports": [{"name": "http", "port": activator.PORT, "protocol": "TCP"}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{ACTIVATOR_SERVICE}-here", "namespace": OPERATOR_NS,
                      "labels": {"kubernetes.io/service-name": ACTIVATOR_SERVICE}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": activator.PORT, "protocol": "TCP"}],
         "endpoints": [{"addresses": [ACTIVATOR_IP], "conditions": {"ready": True}}]},
    ])


@pytest.fixture
def sleepy_stack(cluster: Cluster, kube: client.ApiClient, namespace: str, operator_identity: Any,
                 gateway_api_installed: list[str], pod_cidr_is_local: None,
                 tmp_path: Path) -> Iterator[tuple[Env, TraefikGateway, CpuPool, activator_server.Running]]:
    """Traefik's Gateway, the real activator on its pod address reading EndpointSlices with its own token, and an
    operator given the activator's flags and key."""
    gw = start_gateway(cluster, namespace=namespace)
    static_pv(cluster, f"pv-{namespace}", namespace)
    bind_activator_rbac(cluster)
    activator_service(cluster)
    key = secrets.token_hex(24).encode()
    key_file = tmp_path / "activator-key"
    key_file.write_bytes(key + b"\n")
    os.chmod(key_file, 0o600)
    access = ApiAccess(cluster.server, str(cluster.workdir / "pki" / "ca.crt"),
                       str(activator_token(cluster, tmp_path / "activator-token")))
    running = activator_server.start(activator_server.Settings(key=key, hold_seconds=60.0), ACTIVATOR_IP,
                                     activator.PORT, locate=Endpoints(access).locate)
    override = tmp_path / "scrape-addresses.json"
    override.write_text("{}")
    operator = OperatorProcess(
        cluster, operator_identity, [namespace], launcher=["-m", "rerank_devcluster.scrape_redirect", str(override)],
        extra_args=["--activator-url", running.url,
                    "--activator-service", f"{OPERATOR_NS}/{ACTIVATOR_SERVICE}:{activator.PORT}",
                    "--activator-key-file", str(key_file)]).start()
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, operator)
    pool = CpuPool(kube, namespace, override)
    try:
        yield env, gw, pool, running
    finally:
        pool.stop()
        running.stop()
        cleanup(env, [namespace])
        gw.stop()
        cluster.kubectl_run("delete", "pv", f"pv-{namespace}", "--wait=false", check=False)
        cluster.kubectl_run("delete", "service,endpointslice", "-n", OPERATOR_NS, ACTIVATOR_SERVICE,
                            f"{ACTIVATOR_SERVICE}-here", "--wait=false", check=False)


def backends(env: Env) -> list[tuple[str | None, str]]:
    try:
        refs = route(env)["spec"]["rules"][0]["backendRefs"]
    except (ApiException, KeyError, IndexError):
        return []
    return [(r.get("namespace"), r["name"]) for r in refs]


def test_a_sleeping_model_is_woken_by_requests_to_the_gateway_and_none_is_lost(
        sleepy_stack: tuple[Env, TraefikGateway, CpuPool, activator_server.Running]) -> None:
    """Client -> Traefik -> the activator (its route's signed headers set by the gateway) -> held until the operator
    has woken the CPU pool and the pool's Service lists a ready pod (read by the activator from the API server with
    its own RBAC; no DNS, no kube-proxy) -> the pod. Every one of the requests sent while the model sleeps is
    answered 200 by the pool."""
    env, gw, pool, running = sleepy_stack
    routing = {"gateway": {"parentRefs": [gw.parent_ref()]}}
    env.kube.create_model(env.model(pools=SLEEPY_POOLS, autoscaling=AUTOSCALING, routing=routing))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "Serving", timeout=90)
    pods = Pods(env.kube, env.namespace)
    serving = threading.Event()

    def serve_new_pods() -> None:  # a woken pod's address is served as soon as it is Ready
        while not serving.wait(0.1):
            with contextlib.suppress(Exception):
                pods.serve()

    threading.Thread(target=serve_new_pods, daemon=True).start()
    try:
        gw.wait_route(env.namespace, NAME, timeout=60)
        eventually(lambda: send(gw, 1) == {200: 1}, 60, "a request through the gateway to the awake pool")
        # Traffic (as the pool's metrics say), then none: the route goes to the activator, the pool to zero pods.
        pool.rate = 5.0
        eventually(lambda: env.kube.condition(env.namespace, NAME, "MetricsAvailable").get("status") == "True", 60,
                   "fresh metrics")
        pool.rate = 0.0
        eventually(lambda: backends(env) == [(OPERATOR_NS, ACTIVATOR_SERVICE)], IDLE_SECONDS + 60,
                   "the route to the activator", every=0.5)
        gw.wait_route(env.namespace, NAME, timeout=60)
        eventually(lambda: not env.kube.pods(env.namespace, f"app.kubernetes.io/instance={NAME},rerank.io/pool=cpu"),
                   90, "no CPU pod left")
        env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "ScaledToZero", timeout=30)
        pods.take()

        # The sleeping model's requests, sent to the gateway over two seconds as clients would.
        results: list[tuple[int, float]] = []
        lock = threading.Lock()

        def one(i: int) -> None:
            time.sleep(i * 0.1)
            started = time.monotonic()
            code = post_rerank(gw, json.dumps({"query": f"q{i}", "texts": ["a", "b"]}).encode(), timeout=90)
            with lock:
                results.append((code, time.monotonic() - started))

        threads = [threading.Thread(target=one, args=(i,)) for i in range(WAKES)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = Counter(code for code, _ in results)
        assert codes == {200: WAKES}, (codes, env.describe())
        assert sum(pods.take().values()) == WAKES  # each answered by the woken pool, once
        through_activator = int(running.metrics.registry.get_sample_value("rerank_activator_requests_total",
                                                                         {"outcome": "forwarded"}) or 0)
        assert through_activator >= 1  # the first ones, at least, were held and forwarded by the activator
        waits = sorted(seconds for _, seconds in results)
        # Once awake, the route leads to the pool again.
        eventually(lambda: backends(env) == [(None, f"{NAME}-cpu")], 90, "the route back to the pool", every=0.5)
        print(json.dumps({"requests_while_asleep": WAKES, "status_200": codes[200],
                          "forwarded_by_the_activator": through_activator,
                          "wait_s_p50": round(waits[len(waits) // 2], 2), "wait_s_max": round(waits[-1], 2)}))
    finally:
        serving.set()
        pods.stop()
