"""A real Gateway API implementation for the dev cluster: Traefik, so that requests can go through a real gateway.

    gw = start_gateway(cluster)
    cluster.apply([{..., "kind": "HTTPRoute", "spec": {"parentRefs": [gw.parent_ref()], "rules": [...]}}])
    gw.wait_route(namespace, "my-route")
    urllib.request.urlopen(gw.address + "/rerank")
    gw.stop()

Traefik (built from the Go module proxy by ``hack/build-binaries.sh``, pinned in :mod:`rerank_devcluster.binaries`)
runs as a host process next to the control plane, like every other component, with its ``kubernetesGateway``
provider watching the cluster through the admin kubeconfig. Its static configuration is command-line flags: an
entry point ``web`` on a free 127.0.0.1 port for the traffic, another one for ``/ping`` (readiness), no dashboard or
API, no version check or usage report (there is no internet).

Traefik attaches a Gateway listener to the entry point whose address ends in the listener's port, so the Gateway
created here has one HTTP listener on ``web``'s port, open to routes from every namespace (tests use one namespace
each). Traefik reaches a route's backends at the addresses in the Services' EndpointSlices (ready endpoints only),
not at the ClusterIP (there is no kube-proxy here): a backend must be reachable from the host at those addresses
(a real node's pods are; kwok's pods are not; the API server refuses loopback addresses in an EndpointSlice).

What Traefik (3.7) does not implement, and does without saying so in the route's status (both Accepted and
ResolvedRefs read True): a RequestMirror filter makes its whole rule answer 500 (the quality guard's mirror), and
a rule's ``timeouts`` are ignored. Weighted backendRefs are split by a smooth weighted round robin: 80/20 over 500
requests is exactly 400/100. It needs Gateway API CRDs of v1.5 or later (:data:`binaries.GATEWAY_API_VERSION`).

Traefik handles every GatewayClass whose controllerName is ``traefik.io/gateway-controller``; each gateway started
here gets a GatewayClass of its own, labelled, and its Traefik selects only that label, so that two of them on one
cluster (two tests, a benchmark beside a demo) do not both program each other's Gateways.
"""

from __future__ import annotations

import time
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any

from rerank_devcluster import binaries
from rerank_devcluster.cluster import Cluster, ClusterError
from rerank_devcluster.operator_process import apply_and_wait_established
from rerank_devcluster.processes import free_port

CONTROLLER_NAME = "traefik.io/gateway-controller"
#: the label Traefik's ``labelSelector`` matches on its own GatewayClass (the value is the gateway's id)
INSTANCE_LABEL = "rerank.io/gateway-instance"
#: the Traefik entry point that carries the Gateway's HTTP listener
ENTRYPOINT = "web"
LISTENER = "http"
GATEWAY_API = "/apis/gateway.networking.k8s.io/v1"


@dataclass
class TraefikGateway:
    """A running Traefik and the GatewayClass and Gateway it serves; :meth:`stop` removes all three."""

    cluster: Cluster
    #: the name of Traefik's process in ``cluster.processes`` (and of its log, ``<logs>/<process>.log``)
    process: str
    port: int
    ping_port: int
    gateway_class: str
    namespace: str
    name: str

    @property
    def address(self) -> str:
        """Where clients send requests: the ``web`` entry point, i.e. the Gateway's HTTP listener."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def gateway(self) -> str:
        """The Gateway as ``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    def parent_ref(self) -> dict[str, Any]:
        """An HTTPRoute ``parentRefs`` entry attaching the route to this Gateway's HTTP listener."""
        return {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": self.namespace,
                "name": self.name, "sectionName": LISTENER}

    def route_parent_status(self, namespace: str, route: str) -> dict[str, Any] | None:
        """Traefik's entry for this Gateway in an HTTPRoute's ``status.parents``; None before it wrote one."""
        body = _get(self.cluster, f"{GATEWAY_API}/namespaces/{namespace}/httproutes/{route}")
        return self._parent_of(body) if body else None

    def wait_route(self, namespace: str, route: str, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until Traefik has accepted an HTTPRoute and resolved its backends (conditions Accepted and
        ResolvedRefs True for the route's current generation); returns that parent status. Traefik writes the
        status while it builds the new routing configuration and applies that configuration a little later (up to
        ``providersThrottleDuration``), so the first requests may still miss: a test polls for the response it
        expects. Accepted does not mean served: a rule with a filter Traefik does not implement (RequestMirror)
        is accepted too, and answers 500 (Traefik logs "Unable to load HTTPRoute filters")."""

        def accepted() -> dict[str, Any] | None:
            body = _get(self.cluster, f"{GATEWAY_API}/namespaces/{namespace}/httproutes/{route}")
            parent = self._parent_of(body) if body else None
            if parent is None or body is None:
                return None
            generation = body["metadata"]["generation"]
            ok = all(_condition_true(parent, t, generation) for t in ("Accepted", "ResolvedRefs"))
            return parent if ok else None

        self.cluster.processes.wait_for(accepted, time.monotonic() + timeout,
                                        f"HTTPRoute {namespace}/{route} accepted by {self.gateway}")
        parent = self.route_parent_status(namespace, route)
        if parent is None:  # deleted in between
            raise ClusterError(f"HTTPRoute {namespace}/{route} is gone")
        return parent

    def _parent_of(self, route: dict[str, Any]) -> dict[str, Any] | None:
        route_ns = route["metadata"]["namespace"]
        for parent in route.get("status", {}).get("parents", []):
            ref = parent.get("parentRef", {})
            if (parent.get("controllerName") == CONTROLLER_NAME and ref.get("name") == self.name
                    and ref.get("namespace", route_ns) == self.namespace):
                return dict(parent)
        return None

    def gateway_class_status(self) -> dict[str, Any]:
        """The GatewayClass's status as Traefik wrote it (conditions, ``supportedFeatures``)."""
        body = _get(self.cluster, f"{GATEWAY_API}/gatewayclasses/{self.gateway_class}")
        if body is None:
            raise ClusterError(f"GatewayClass {self.gateway_class} not found")
        return dict(body.get("status", {}))

    def stop(self) -> None:
        """Delete the Gateway and its GatewayClass (not waiting), then stop Traefik. Idempotent."""
        self.cluster.kubectl_run("delete", "gateway", "-n", self.namespace, self.name, "--ignore-not-found",
                                 "--wait=false", check=False)
        self.cluster.kubectl_run("delete", "gatewayclass", self.gateway_class, "--ignore-not-found", "--wait=false",
                                 check=False)
        self.cluster.processes.stop(self.process)


def start_gateway(cluster: Cluster, namespace: str = "rerank-gateway", name: str | None = None,
                  timeout: float = 120.0, log_level: str = "INFO") -> TraefikGateway:
    """Start Traefik against ``cluster`` and create its GatewayClass and a Gateway ``namespace/name`` (a fresh name
    by default) with one HTTP listener; return once Traefik answers ``/ping`` and the Gateway reads Accepted and
    Programmed. Installs the Gateway API standard CRDs first (server-side apply: a no-op when they are there).
    A failure stops what was started and raises :class:`ClusterError` with the end of Traefik's log."""
    deadline = time.monotonic() + timeout
    traefik = binaries.ensure("traefik")
    apply_and_wait_established(cluster, binaries.gateway_api_crds())
    instance = uuid.uuid4().hex[:8]
    gw = TraefikGateway(cluster=cluster, process=f"traefik-{instance}", port=free_port(), ping_port=free_port(),
                        gateway_class=f"traefik-{instance}", namespace=namespace, name=name or f"gw-{instance}")
    try:
        cluster.processes.spawn(gw.process, _traefik_argv(cluster, str(traefik), gw, instance, log_level))
        cluster.processes.wait_for(lambda: _pings(gw.ping_port), deadline, f"{gw.process} /ping")
        cluster.apply(_resources(gw, instance))
        cluster.processes.wait_for(lambda: _gateway_programmed(cluster, gw), deadline,
                                   f"Gateway {gw.gateway} Accepted and Programmed by {gw.process}")
    except BaseException as exc:
        log = cluster.logs_dir / f"{gw.process}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:]) if log.exists() else ""
        gw.stop()
        if isinstance(exc, Exception):  # a Ctrl-C stays one
            raise ClusterError(f"gateway did not come up: {exc}\n----- {log.name} -----\n{tail}") from exc
        raise
    return gw


def _traefik_argv(cluster: Cluster, traefik: str, gw: TraefikGateway, instance: str, log_level: str) -> list[str]:
    """Traefik's command line. Through ``env``: Traefik takes the in-cluster client whenever KUBERNETES_SERVICE_HOST
    is set and otherwise the KUBECONFIG file before its own endpoint flags, so both are set here, whatever the
    environment of the test or the person that starts it."""
    return [
        "env", "-u", "KUBERNETES_SERVICE_HOST", "-u", "KUBERNETES_SERVICE_PORT", f"KUBECONFIG={cluster.kubeconfig}",
        traefik,
        f"--entryPoints.{ENTRYPOINT}.address=127.0.0.1:{gw.port}",
        # /ping lives on the `traefik` entry point, 8080 by default: a free port instead (two clusters, a busy CI).
        f"--entryPoints.traefik.address=127.0.0.1:{gw.ping_port}",
        "--ping=true", "--ping.entryPoint=traefik",
        "--api=false",
        # Traefik applies a new routing configuration at most every 2s by default; tests wait on each change.
        "--providers.providersThrottleDuration=100ms",
        "--providers.kubernetesGateway=true",
        f"--providers.kubernetesGateway.labelSelector={INSTANCE_LABEL}={instance}",
        # Without it the Gateway's status has no address; with it, clients can read where to send requests.
        "--providers.kubernetesGateway.statusAddress.ip=127.0.0.1",
        "--global.checkNewVersion=false", "--global.sendAnonymousUsage=false",
        f"--log.level={log_level}", "--log.noColor=true",
    ]


def _resources(gw: TraefikGateway, instance: str) -> list[dict[str, Any]]:
    """The namespace, the labelled GatewayClass and the Gateway with its one HTTP listener on ``web``'s port."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": gw.namespace}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
         "metadata": {"name": gw.gateway_class, "labels": {INSTANCE_LABEL: instance}},
         "spec": {"controllerName": CONTROLLER_NAME}},
        {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
         "metadata": {"name": gw.name, "namespace": gw.namespace},
         "spec": {"gatewayClassName": gw.gateway_class,
                  "listeners": [{"name": LISTENER, "protocol": "HTTP", "port": gw.port,
                                 "allowedRoutes": {"namespaces": {"from": "All"}}}]}},
    ]


def _pings(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:  # refused while it starts; urllib's errors are OSErrors
        return False


def _get(cluster: Cluster, path: str) -> dict[str, Any] | None:
    """An object from the API server; None while it does not exist (or the server does not answer yet)."""
    try:
        code, body = cluster.request("GET", path)
    except OSError:
        return None
    return body if code == 200 and isinstance(body, dict) else None


def _gateway_programmed(cluster: Cluster, gw: TraefikGateway) -> bool:
    body = _get(cluster, f"{GATEWAY_API}/namespaces/{gw.namespace}/gateways/{gw.name}")
    if body is None:
        return False
    generation = body["metadata"]["generation"]
    return all(_condition_true(body.get("status", {}), t, generation) for t in ("Accepted", "Programmed"))


def _condition_true(status: dict[str, Any], kind: str, generation: int) -> bool:
    """``kind`` is True in ``status.conditions`` and was written for ``generation``: not a stale verdict on an
    earlier spec."""
    for cond in status.get("conditions", []):
        if cond.get("type") == kind:
            return bool(cond.get("status") == "True" and cond.get("observedGeneration") == generation)
    return False

