"""A model's CPU pool as scale to zero needs it on kwok pods (which have no network), shared by the scale-to-zero tests
(test_scale_to_zero.py, the activator called as the gateway would call it) and the gateway's wake test
(test_gateway.py, through Traefik): each Ready pod's TEI ``/metrics`` served here, reached through scrape_redirect,
at the request rate the test sets; and the RBAC the activator feature needs, bound from the project's own files.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_devcluster import scrape_redirect
from rerank_devcluster.cluster import free_port
from rerank_devcluster.fake_tei import MetricsServer, TeiCounters
from rerank_devcluster.operator_process import REPO, kubectl_apply
from tests.cluster.rrm_harness import OPERATOR_NS, OPERATOR_SA

NAME = "bge-m3"
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
    spread over the Ready ones), and the Upstream (if any) opened while one is Ready. Refreshed every 0.5 s."""

    def __init__(self, kube: client.ApiClient, namespace: str, override: Path,
                 upstream: Upstream | None = None) -> None:
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
            scrape_redirect.publish(self.override, {n: s.address for n, (_, s) in self.pods.items()})
            if ready:
                if self.ready_since is None:
                    self.ready_since = time.monotonic()
                if self.upstream is not None:
                    self.upstream.open()
            else:
                self.ready_since = None
                if self.upstream is not None:
                    self.upstream.close()

    def _render(self, counters: TeiCounters) -> str:
        with self.lock:
            return counters.render()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for _, srv in self.pods.values():
            srv.stop()
        if self.upstream is not None:
            self.upstream.close()


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
