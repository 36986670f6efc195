"""Scale to zero on the real control plane, with the real activator (rerank_activator, in this process).

An idle model's HTTPRoute is pointed at the activator first, its pool goes to zero pods after the drain, requests
sent as the Gateway would send them (the route's own headers) are held, the operator wakes the CPU pool, and every
held request is answered by the pool once its pod is Ready; the route then points at the pool again.

kwok pods have no network: the pool's /metrics are served locally (rerank_devcluster.fake_tei, through
scrape_redirect as in test_autoscaling.py), and the activator's connections to the pool's Service go to a local
stand-in for the pool (``Upstream``) that listens only while the kwok pod is Ready, as a Service has an endpoint only
then. Everything else is real: the API server, the operator process, its RBAC, the ReferenceGrant, the activator's
HTTP handling, token check, hold and forwarding.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_activator import server as activator_server
from rerank_contracts import activator
from rerank_devcluster.cluster import free_port
from rerank_devcluster.fake_tei import MetricsServer, TeiCounters
from rerank_devcluster.operator_process import REPO, kubectl_apply
from rerank_devcluster.waiting import eventually
from tests.cluster.rrm_harness import OPERATOR_NS, OPERATOR_SA, Env, Kube, OperatorProcess, cleanup, static_pv

pytestmark = pytest.mark.cluster

NAME = "bge-m3"
IDLE_SECONDS = 30  # the CRD's least
ACTIVATOR_SERVICE = "rerank-activator"
POOLS = {"cpu": {"minReplicas": 0, "maxReplicas": 3}, "gpu": {"enabled": False}}
AUTOSCALING = {"enabled": True, "intervalSeconds": 5, "idleSeconds": IDLE_SECONDS,
               "metrics": {"staleAfterSeconds": 15},
               "scaleDown": {"stabilizationSeconds": 5, "maxStep": 2, "cooldownSeconds": 10}}
ROUTING = {"gateway": {"parentRefs": [{"name": "shared", "namespace": "gateway-system"}]}}
RBAC_ACTIVATOR = REPO / "operator" / "rerank_operator" / "rbac_activator.yaml"


class Upstream:
    """The CPU pool's Service as the activator reaches it: a /rerank answer, accepting connections only while the
    pool has a Ready pod (``open``/``close``); counts what it answered."""

    def __init__(self) -> None:
        self.port = free_port()
        self.answered = 0
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()
        self.httpd: ThreadingHTTPServer | None = None

    def open(self) -> None:
        if self.httpd is not None:
            return
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                leaked = [h for h in self.headers if h.lower().startswith("x-rerank-activate")]
                with owner.lock:
                    owner.answered += 1
                    owner.bodies.append(body)
                data = json.dumps([{"index": 0, "score": 0.9, "leaked_headers": leaked}]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None


class CpuPool:
    """The model's CPU pods as the operator's scraper sees them (one fake TEI /metrics each, ``rate`` requests/s
    spread over the Ready ones), and the Upstream opened while one is Ready. Refreshed every 0.5 s."""

    def __init__(self, kube: client.ApiClient, namespace: str, override: Path, upstream: Upstream) -> None:
        self.core = client.CoreV1Api(kube)
        self.namespace, self.override, self.upstream = namespace, override, upstream
        self.rate = 0.0
        self.pods: dict[str, tuple[TeiCounters, MetricsServer]] = {}
        self.ready_since: float | None = None
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(0.5):
            now = time.monotonic()
            try:
                pods = self.core.list_namespaced_pod(
                    self.namespace, label_selector=f"app.kubernetes.io/instance={NAME},rerank.io/pool=cpu").items
            except ApiException:
                continue
            ready = [p.metadata.name for p in pods if not p.metadata.deletion_timestamp and any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions or ())]
            with self.lock:
                for name in ready:
                    if name not in self.pods:
                        counters = TeiCounters(50.0, 0.05, 400.0)
                        self.pods[name] = (counters, MetricsServer(lambda c=counters: self._render(c)))
                for name in ready:
                    self.pods[name][0].step(self.rate / len(ready), now - last)
                last = now
            self.override.write_text(json.dumps({n: s.address for n, (_, s) in self.pods.items()}))
            if ready:
                if self.ready_since is None:
                    self.ready_since = time.monotonic()
                self.upstream.open()
            else:
                self.ready_since = None
                self.upstream.close()

    def _render(self, counters: TeiCounters) -> str:
        with self.lock:
            return counters.render()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for _, srv in self.pods.values():
            srv.stop()
        self.upstream.close()


@dataclass
class Sleepy:
    env: Env
    pool: CpuPool
    upstream: Upstream
    activator: activator_server.Running
    activator_url: str
    key: bytes


def bind_activator_rbac(cluster: Any) -> None:
    """A Role of exactly rbac_activator.yaml in the operator's namespace, bound to its ServiceAccount (the chart's)."""
    name = "rerank-operator-activator"
    kubectl_apply(cluster, [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": OPERATOR_NS}, "rules": yaml.safe_load(RBAC_ACTIVATOR.read_text())},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": OPERATOR_NS},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_SA, "namespace": OPERATOR_NS}]},
    ])


@pytest.fixture
def sleepy(cluster: Any, kube: client.ApiClient, namespace: str, operator_identity: Any,
           gateway_api_installed: list[str], tmp_path: Path) -> Iterator[Sleepy]:
    static_pv(cluster, f"pv-{namespace}", namespace)
    bind_activator_rbac(cluster)
    key = secrets.token_hex(24).encode()
    key_file = tmp_path / "activator-key"
    key_file.write_bytes(key + b"\n")
    os.chmod(key_file, 0o600)
    upstream = Upstream()
    activator = activator_server.start(
        activator_server.Settings(key=key, hold_seconds=60.0), "127.0.0.1", 0,
        holder_options={"resolve": lambda host, port: ("127.0.0.1", upstream.port)})
    url = activator.url
    override = tmp_path / "scrape-addresses.json"
    override.write_text("{}")
    operator = OperatorProcess(
        cluster, operator_identity, [namespace], launcher=["-m", "rerank_devcluster.scrape_redirect", str(override)],
        extra_args=["--activator-url", url, "--activator-service", f"{OPERATOR_NS}/{ACTIVATOR_SERVICE}:8080",
                    "--activator-key-file", str(key_file)]).start()
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, operator)
    pool = CpuPool(kube, namespace, override, upstream)
    try:
        yield Sleepy(env, pool, upstream, activator, url, key)
    finally:
        pool.stop()
        activator.server.shutdown()
        cleanup(env, [namespace])
        cluster.kubectl_run("delete", "pv", f"pv-{namespace}", "--wait=false", check=False)


def route(env: Env) -> dict[str, Any]:
    found: dict[str, Any] = client.CustomObjectsApi(env.kube.api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", env.namespace, "httproutes", NAME)
    return found


def to_activator(env: Env) -> bool:
    refs = route(env)["spec"]["rules"][0]["backendRefs"]
    return [(r.get("namespace"), r["name"]) for r in refs] == [(OPERATOR_NS, ACTIVATOR_SERVICE)]


def replicas(env: Env) -> int:
    return int(((env.kube.deployment(env.namespace, f"{NAME}-cpu") or {}).get("spec") or {}).get("replicas", 0))


def phase(env: Env) -> str | None:
    body = env.kube.model(env.namespace, NAME) or {}
    return ((body.get("status") or {}).get("autoscaling") or {}).get("lastDecision", {}).get("scaleToZero")


def event_reasons(env: Env) -> list[str]:
    items = json.loads(env.cluster.kubectl_run("get", "events", "-n", env.namespace, "-o", "json",
                                               "--field-selector", f"involvedObject.name={NAME}").stdout)["items"]
    return [e["reason"] for e in items]


def gateway_request(url: str, env: Env, body: bytes, timeout: float = 90) -> tuple[int, bytes, float]:
    """A /rerank request as the Gateway sends it while the route points at the activator: with the headers the
    route's filter sets (read from the HTTPRoute itself). Returns (status, body, seconds)."""
    headers = {h["name"]: h["value"] for f in route(env)["spec"]["rules"][0].get("filters") or ()
               for h in (f.get("requestHeaderModifier") or {}).get("set") or ()}
    request = urllib.request.Request(f"{url}/rerank", data=body, method="POST",
                                     headers={**headers, "Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read(), time.monotonic() - started
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), time.monotonic() - started


def test_an_idle_model_goes_to_zero_and_its_held_requests_wake_the_cpu_pool(sleepy: Sleepy) -> None:
    env, pool = sleepy.env, sleepy.pool
    env.kube.create_model(env.model(pools=POOLS, autoscaling=AUTOSCALING, routing=ROUTING))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "Serving", timeout=90)
    assert replicas(env) == 1  # a model that may sleep starts awake, on one CPU replica
    grant: dict[str, Any] = client.CustomObjectsApi(env.kube.api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1beta1", OPERATOR_NS, "referencegrants",
        f"rerank-activator-from-{env.namespace}")
    assert grant["spec"]["from"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                      "namespace": env.namespace}]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": ACTIVATOR_SERVICE}]

    # Traffic, then none: after idleSeconds the route goes to the activator while the pod still serves (the drain).
    pool.rate = 5.0
    eventually(lambda: env.kube.condition(env.namespace, NAME, "MetricsAvailable").get("status") == "True", 60,
               "fresh metrics")
    pool.rate = 0.0
    idle_from = time.monotonic()
    eventually(lambda: to_activator(env), IDLE_SECONDS + 40, "the route to the activator", every=0.5)
    drained_at = time.monotonic()
    assert drained_at - idle_from >= IDLE_SECONDS - 6  # not before idleSeconds (less the last interval's rate)
    assert replicas(env) == 1 and phase(env) == "draining"
    rule = route(env)["spec"]["rules"][0]
    headers = {h["name"]: h["value"] for f in rule["filters"] for h in f["requestHeaderModifier"]["set"]}
    model_key = f"{env.namespace}/{NAME}"
    assert headers[activator.MODEL_HEADER] == model_key
    assert headers[activator.TOKEN_HEADER] == activator.token(sleepy.key, model_key, headers[activator.UPSTREAM_HEADER])
    # Then zero pods (the drain's length is the policy's: tests/unit/autoscale/test_autoscale_zero.py; timing it here
    # from a loaded test machine's polls was flaky), and Ready says why.
    eventually(lambda: replicas(env) == 0, 60, "the CPU pool at zero", every=0.5)
    eventually(lambda: not env.kube.pods(env.namespace, f"app.kubernetes.io/instance={NAME},rerank.io/pool=cpu"),
               60, "no CPU pod left")
    # and the stand-in Service has no endpoint left (it closes within its next look, 0.5 s): a burst sent before
    # that reached the last pod directly, and its listener then closed under one of them (a real pool's preStop
    # keeps serving while endpoints are removed; this stand-in does not).
    eventually(lambda: sleepy.upstream.httpd is None, 10, "the pool's Service without endpoints", every=0.1)
    cond = env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "ScaledToZero", timeout=30)
    assert "asleep" in cond["message"]
    assert {"ScalingToZero", "ScaledToZero"} <= set(event_reasons(env))
    assert to_activator(env)

    # A burst of requests to the sleeping model, as the Gateway sends them: each is held, the operator wakes the
    # CPU pool, and each is answered by the pool once its pod is Ready. None lost, none answered twice.
    bodies = [json.dumps({"query": f"q{i}", "texts": ["a", "b"]}).encode() for i in range(20)]
    woke_at = time.monotonic()
    with ThreadPoolExecutor(20) as pool_exec:
        results = list(pool_exec.map(lambda b: gateway_request(sleepy.activator_url, env, b), bodies))
    statuses = [status for status, _, _ in results]
    assert statuses == [200] * len(bodies), results
    assert sleepy.upstream.answered == len(bodies) and sorted(sleepy.upstream.bodies) == sorted(bodies)
    assert all(json.loads(b)[0]["leaked_headers"] == [] for _, b, _ in results)  # the activate headers stay behind
    first = min(seconds for _, _, seconds in results)
    print(f"\nWAKE: first answer {first:.1f}s, last {max(s for _, _, s in results):.1f}s after the burst; "
          f"pod Ready {pool.ready_since - woke_at:.1f}s after it" if pool.ready_since else "")
    # Awake: the route points at the pool again, and the events tell the story.
    eventually(lambda: not to_activator(env), 30, "the route back to the CPU pool", every=0.5)
    assert [b["name"] for b in route(env)["spec"]["rules"][0]["backendRefs"]] == [f"{NAME}-cpu"]
    assert {"Waking", "Woken"} <= set(event_reasons(env))
    env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "Serving", timeout=30)
    metrics = env.operator.metrics()
    assert any(k.startswith("rerank_operator_scaled_to_zero_seconds_total{") and v > 0 for k, v in metrics.items())


def test_a_request_with_a_forged_token_is_refused_and_wakes_nothing(sleepy: Sleepy) -> None:
    env = sleepy.env
    env.kube.create_model(env.model(pools=POOLS, autoscaling=AUTOSCALING, routing=ROUTING))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "Serving", timeout=90)
    model_key = f"{env.namespace}/{NAME}"
    upstream = f"http://{NAME}-cpu.{env.namespace}.svc:80"
    forged = {activator.MODEL_HEADER: model_key, activator.UPSTREAM_HEADER: upstream,
              activator.TOKEN_HEADER: activator.token(b"not-the-key" * 4, model_key, upstream)}
    request = urllib.request.Request(f"{sleepy.activator_url}/rerank", data=b"{}", method="POST", headers=forged)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    pending = urllib.request.Request(f"{sleepy.activator_url}{activator.PENDING_PATH}",
                                     headers={activator.TOKEN_HEADER: activator.pending_token(sleepy.key)})
    with urllib.request.urlopen(pending, timeout=5) as resp:
        assert model_key not in json.loads(resp.read())["models"]
    assert sleepy.upstream.answered == 0
