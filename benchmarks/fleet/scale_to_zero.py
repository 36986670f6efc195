"""The fleet asleep (--idle): the activator in this process, the time until every CPU Deployment is at 0 and no pool
pod is left, the fleet's state at the end of the steady window (pool pods, models asleep), and one model woken by a
request sent as the Gateway would: until its CPU Deployment scales, a pool pod exists and the route returns."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from typing import Any

import yaml

from rerank_activator import server as activator_server
from rerank_devcluster import binaries
from rerank_devcluster import operator_process as op
from rerank_devcluster.cluster import Cluster, free_port
from rerank_operator.core.autoscale.zero import DRAIN_SECONDS

from .audit import AuditTail, audit_time
from .harness import REPO, Harness
from .report import log, quantiles
from .watches import POOL_LABEL, Key, is_ready, owner_key, zero_phase

GATEWAY_API = "/apis/gateway.networking.k8s.io/v1"
#: --idle: the activator's Service as the operator names it in the routes (``--activator-service``), and the Role of
#: rbac_activator.yaml (the chart's) in the operator's namespace.
ACTIVATOR_SERVICE = "rerank-activator"
RBAC_ACTIVATOR = REPO / "operator" / "rerank_operator" / "rbac_activator.yaml"


def route_backends(route: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(namespace, name) of each backendRef of the route's first rule."""
    rules = (route.get("spec") or {}).get("rules") or [{}]
    return [(r.get("namespace"), r["name"]) for r in rules[0].get("backendRefs") or ()]


def route_headers(route: dict[str, Any]) -> dict[str, str]:
    """The headers the route's first rule sets (RequestHeaderModifier): what the Gateway adds to each request."""
    rules = (route.get("spec") or {}).get("rules") or [{}]
    return {h["name"]: h["value"] for f in rules[0].get("filters") or ()
            for h in (f.get("requestHeaderModifier") or {}).get("set") or ()}


class ScaleToZero(Harness):
    """Every model to zero, the fleet at rest asleep, and one wake."""

    def _start_activator(self, cluster: Cluster) -> list[str]:
        """--idle: the Gateway API CRDs, rbac_activator.yaml's Role bound in the operator's namespace (as
        tests/cluster/test_scale_to_zero.py does), and the activator in this process with a fresh key; returns the
        operator's activator flags. kwok pods have no network: every held request's connection goes to a closed local
        port (refused, tried again until its hold runs out: answered 503)."""
        op.apply_and_wait_established(cluster, binaries.gateway_api_crds())
        name = "rerank-operator-activator"
        op.kubectl_apply(cluster, [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": name, "namespace": op.OPERATOR_NS},
             "rules": yaml.safe_load(RBAC_ACTIVATOR.read_text())},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": name, "namespace": op.OPERATOR_NS},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": op.OPERATOR_SA, "namespace": op.OPERATOR_NS}]},
        ])
        key = secrets.token_hex(24).encode()
        key_file = cluster.workdir / "activator-key"
        key_file.write_bytes(key + b"\n")
        os.chmod(key_file, 0o600)
        closed = ("127.0.0.1", free_port())
        self.activator = activator_server.start(
            activator_server.Settings(key=key, hold_seconds=self.args.activator_hold), "127.0.0.1", 0,
            locate=lambda namespace, service, port: [closed])
        log(f"Gateway API CRDs installed; activator at {self.activator.url} (hold {self.args.activator_hold:g}s)")
        return ["--activator-url", self.activator.url,
                "--activator-service", f"{op.OPERATOR_NS}/{ACTIVATOR_SERVICE}:8080",
                "--activator-key-file", str(key_file)]

    def _fleet_pool_pods(self) -> int:
        keys = set(self.keys)
        with self.fleet.lock:
            return sum(1 for k in self.fleet.pool_pods_present.values() if k in keys)

    def _to_zero(self) -> None:
        """Wait until every model's CPU Deployment is at 0 replicas and no pool pod of the fleet is left (DELETED on
        this process's watch): idleSeconds, the drain, a tick or two, and the fleet's own pace (the bring-up's time)."""
        args, fleet, keys = self.args, self.fleet, self.keys
        bring_up_s = float(self.result.get("bring_up", {}).get("total_apply_to_all_ready_s") or 0.0)
        timeout = args.idle_timeout or (args.idle_seconds + DRAIN_SECONDS + 2 * args.interval + 60 + bring_up_s)
        with fleet.lock:
            last_ready = max((fleet.first_ready[k] for k in keys if k in fleet.first_ready), default=time.monotonic())
        log(f"idle: waiting up to {timeout:.0f}s for every CPU Deployment at 0 and no pool pod")
        rounds0 = self.leader().rounds()
        self._last_progress = 0.0

        def at_zero() -> bool:
            with fleet.lock:
                zero = sum(1 for k in keys if fleet.cpu_replicas.get(k) == 0)
                phases = Counter(fleet.zero_phase.get(k) or "none" for k in keys)
            pods = self._fleet_pool_pods()
            now = time.monotonic()
            if now - self._last_progress >= 10:
                self._last_progress = now
                log(f"idle: CPU Deployments at 0: {zero}/{len(keys)}, pool pods {pods}, phases {dict(phases)}")
            return zero == len(keys) and pods == 0

        done = self._wait(at_zero, timeout, "every CPU Deployment at 0 replicas and no pool pod")
        with fleet.lock:
            zero_at = {k: fleet.cpu_replicas_changed[k] for k in keys if fleet.cpu_replicas.get(k) == 0
                       and k in fleet.cpu_replicas_changed}
            ready_to_zero = [zero_at[k] - fleet.first_ready[k] for k in zero_at if k in fleet.first_ready]
            last_gone = fleet.pool_pod_deleted
            phases = Counter(fleet.zero_phase.get(k) or "none" for k in keys)
            transitions = dict(fleet.phase_transitions)
            woken = sorted({f"{ns}/{name}" for (ns, name), _ in fleet.woken})
        rounds1 = self.leader().rounds()
        rounds = rounds1[0] - rounds0[0]
        self.result["idle"] = {
            "idle_seconds": args.idle_seconds,
            "all_at_zero": done,
            "deployments_at_zero": len(zero_at),
            "pool_pods_left": self._fleet_pool_pods(),
            "idle_after_s": round(last_gone - last_ready, 2) if done else None,
            "idle_after_s_method": "last model first Ready -> last pool pod DELETED, both on this process's watches "
                                   f"(idleSeconds {args.idle_seconds} + drain {DRAIN_SECONDS:g} s + ticks + the "
                                   "fleet's pace)",
            "ready_to_deployment_at_zero_s": quantiles(ready_to_zero),
            "phases_when_at_zero": dict(phases),
            "phase_transitions": transitions,
            "woken_without_request": woken,
            "woken_without_request_note": "models seen going to 'waking' before this process sent any request to "
                                          "the activator (it sends one only in the wake step, after the window)",
            "autoscaler_rounds": {"count": int(rounds),
                                  "mean_s": round((rounds1[1] - rounds0[1]) / rounds, 2) if rounds else None,
                                  "over_10s": int(rounds - (rounds1[2] - rounds0[2])),
                                  "method": "rerank_operator_autoscaler_round_seconds over the wait for zero"},
            "timeout_s": round(timeout, 1),
        }
        log(f"idle: {json.dumps(self.result['idle'])}")

    def _idle_end(self) -> None:
        """At the end of the steady window, from the API (not the watches): the fleet's pool pods, the models
        asleep (lastDecision.scaleToZero), and the CPU Deployments' spec.replicas."""
        keys = set(self.keys)
        pods = self.api.ok("GET", f"/api/v1/pods?labelSelector={urllib.parse.quote(POOL_LABEL)}")["items"]
        fleet_pods = [p for p in pods if owner_key(p) in keys]
        models = self.api.ok("GET", f"/apis/{op.GROUP}/{op.VERSION}/{op.PLURAL}")["items"]
        phases = Counter(zero_phase(m) or "none" for m in models if (m["metadata"]["namespace"],
                                                                      m["metadata"]["name"]) in keys)
        deps = self.api.ok("GET", f"/apis/apps/v1/deployments?labelSelector="
                                  f"{urllib.parse.quote(f'{POOL_LABEL}=cpu')}")["items"]
        replicas = Counter(int(d["spec"].get("replicas", 1)) for d in deps if owner_key(d) in keys)
        ready = sum(1 for m in models if (m["metadata"]["namespace"], m["metadata"]["name"]) in keys
                    and is_ready(m))
        idle = self.result.setdefault("idle", {})
        idle.update({
            "idle_pods": len(fleet_pods),
            "models_at_zero": phases.get("asleep", 0),
            "scale_to_zero_phases": dict(phases),
            "cpu_deployment_replicas": {str(k): n for k, n in sorted(replicas.items())},
            "models_ready_at_zero": ready,
        })
        log(f"idle at the end of the window: pool pods {len(fleet_pods)}, phases {dict(phases)}, "
            f"CPU replicas {dict(replicas)}, Ready {ready}")

    def _route(self, key: Key) -> dict[str, Any]:
        status, route = self.api.call("GET", f"{GATEWAY_API}/namespaces/{key[0]}/httproutes/{key[1]}")
        return route if status == 200 and isinstance(route, dict) else {}

    def _wake(self) -> None:
        """One request to one sleeping model, as the Gateway sends it while the route points at the activator (the
        route's own headers, to the in-process activator): the seconds until its CPU Deployment is at 1 replica
        (this process's watch, and the operator's write on the API server's audit clock), until a pool pod exists,
        until the route points at the pool again, and the held request's answer."""
        assert self.activator is not None
        key = self.keys[0]
        ns, name = key
        route = self._route(key)
        activator_ref = (op.OPERATOR_NS, ACTIVATOR_SERVICE)
        wake: dict[str, Any] = {"model": f"{ns}/{name}",
                                "routed_to_activator": route_backends(route) == [activator_ref]}
        self.result["wake"] = wake
        if not wake["routed_to_activator"]:
            wake["error"] = f"the route's backends are {route_backends(route)}, not the activator"
            log(f"wake: {wake['error']}")
            return
        headers = route_headers(route)
        audit = AuditTail(self.cluster.audit_log)
        start = audit.position()
        answer: dict[str, Any] = {}
        url = f"{self.activator.url}/rerank"

        def send() -> None:
            body = json.dumps({"query": "wake", "texts": ["a", "b"]}).encode()
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={**headers, "Content-Type": "application/json"})
            t = time.monotonic()
            try:
                with urllib.request.urlopen(request, timeout=self.args.activator_hold + 30) as resp:
                    resp.read()
                    answer["status"] = resp.status
            except urllib.error.HTTPError as exc:
                exc.read()
                answer["status"] = exc.code
            except OSError as exc:
                answer["status"] = f"error: {exc}"
            answer["seconds"] = time.monotonic() - t

        held_before = sum(v for k, v in op.parse_exposition(self.activator.metrics.page().decode()).items()
                          if k.startswith("rerank_activator_requests_total"))
        with self.fleet.lock:
            pod_before = self.fleet.pool_pod_added.get(key, 0.0)
            wakes_before = len(self.fleet.woken)
            transitions_before = dict(self.fleet.phase_transitions)
        wake["activator_requests_before"] = int(held_before)
        wake["waking_transitions_before"] = wakes_before
        wake["phase_transitions_before"] = transitions_before
        wall0, t0 = time.time(), time.monotonic()
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        log(f"wake: one request for {ns}/{name} to the activator")
        times: dict[str, float | None] = {"scale": None, "pod": None, "route_back": None}
        deadline = t0 + 90
        next_route = 0.0
        while time.monotonic() < deadline and (None in times.values() or sender.is_alive()):
            now = time.monotonic()
            with self.fleet.lock:
                replicas = self.fleet.cpu_replicas.get(key, 0)
                changed = self.fleet.cpu_replicas_changed.get(key, now)
                pod_added = self.fleet.pool_pod_added.get(key, 0.0)
            if times["scale"] is None and replicas >= 1:
                times["scale"] = changed - t0
            if times["pod"] is None and pod_added > pod_before:
                times["pod"] = pod_added - t0
            if times["route_back"] is None and times["scale"] is not None and now >= next_route:
                next_route = now + 0.25
                backends = route_backends(self._route(key))
                if backends and backends != [activator_ref]:
                    times["route_back"] = time.monotonic() - t0
                    wake["route_backends_after"] = [b for _, b in backends]
            time.sleep(0.05)
        sender.join(timeout=5)
        scale_write = next((audit_time(e["stageTimestamp"]) - wall0 for e in audit.events(start, audit.position())
                            if e.get("user", {}).get("username") == op.OPERATOR_USER
                            and e.get("verb") in op.WRITE_VERBS and e.get("stage") == "ResponseComplete"
                            and (e.get("objectRef") or {}).get("resource") == "deployments"
                            and (e.get("objectRef") or {}).get("name") == f"{name}-cpu"), None)
        status = answer.get("status")
        wake.update({
            "wake_scale_s": round(times["scale"], 2) if times["scale"] is not None else None,
            "wake_scale_method": "request sent -> the CPU Deployment's spec.replicas >= 1 on this process's watch "
                                 "(the operator's /pending poll + decision + scale write, plus watch delivery)",
            "wake_scale_write_s": round(scale_write, 3) if scale_write is not None else None,
            "wake_scale_write_method": "request sent (wall clock) -> the operator's write of the CPU Deployment "
                                       "answered (audit stageTimestamp)",
            "wake_pool_pod_s": round(times["pod"], 2) if times["pod"] is not None else None,
            "wake_route_back_s": round(times["route_back"], 2) if times["route_back"] is not None else None,
            "returned_to_pool": times["route_back"] is not None,
            "wake_answer": f"{status} (kwok pods serve nothing)" if status == 503 else f"{status}",
            "wake_answer_after_s": round(answer["seconds"], 2) if "seconds" in answer else None,
            "activator_hold_s": self.args.activator_hold,
        })
        log(f"wake: {json.dumps(wake)}")
