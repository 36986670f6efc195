"""Scale to zero on the real control plane, with the real activator (rerank_activator, in this process).

An idle model's HTTPRoute is pointed at the activator first, its pool goes to zero pods after the drain, requests
sent as the Gateway would send them (the route's own headers) are held, the operator wakes the CPU pool, and every
held request is answered by the pool once its pod is Ready; the route then points at the pool again.

kwok pods have no network: the pool's /metrics are served locally (rerank_devcluster.fake_tei, through
scrape_redirect as in test_autoscaling.py), and the activator's connections to the pool go to a local stand-in for
it (``Upstream``, tests/cluster/sleeping_pool.py) that listens only while the kwok pod is Ready, as a Service has a
ready endpoint only then (the activator's own lookup of those endpoints, and a sleeping model woken through a real
gateway, are test_gateway.py's). Everything else is real: the API server, the operator process, its RBAC, the
ReferenceGrant, the activator's HTTP handling, token check, hold and forwarding.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rerank_activator import server as activator_server
from rerank_contracts import activator
from rerank_devcluster.waiting import eventually
from tests.cluster.rrm_harness import OPERATOR_NS, Env, Kube, OperatorProcess, cleanup, static_pv
from tests.cluster.sleeping_pool import CpuPool, Upstream, bind_activator_rbac

pytestmark = pytest.mark.cluster

NAME = "bge-m3"
IDLE_SECONDS = 30  # the CRD's least
ACTIVATOR_SERVICE = "rerank-activator"
POOLS = {"cpu": {"minReplicas": 0, "maxReplicas": 3}, "gpu": {"enabled": False}}
AUTOSCALING = {"enabled": True, "intervalSeconds": 5, "idleSeconds": IDLE_SECONDS,
               "metrics": {"staleAfterSeconds": 15},
               "scaleDown": {"stabilizationSeconds": 5, "maxStep": 2, "cooldownSeconds": 10}}
ROUTING = {"gateway": {"parentRefs": [{"name": "shared", "namespace": "gateway-system"}]}}


@dataclass
class Sleepy:
    env: Env
    pool: CpuPool
    upstream: Upstream
    activator: activator_server.Running
    activator_url: str
    key: bytes


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
        locate=lambda namespace, service, port: [("127.0.0.1", upstream.port)])
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
