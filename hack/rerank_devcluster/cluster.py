"""Start and stop a real control plane as local processes, all on 127.0.0.1 with free ports.

    with Cluster.start() as cluster:
        subprocess.run([cluster.kubectl, "--kubeconfig", cluster.kubeconfig, "get", "nodes"])

What runs: etcd, kube-apiserver (RBAC, admission, CEL, audit log of write calls and of the operator's
every call), kube-controller-manager
(Deployments, ReplicaSets, Jobs, garbage collection, namespaces; client rate limits raised for fleets of models),
kube-scheduler, and kwok faking the kubelets of
a few nodes (two CPU nodes and one GPU node advertising ``nvidia.com/gpu``). With ``real_node=True`` a real
worker node joins them (containerd, runc, CNI, kubelet: :mod:`rerank_devcluster.realnode`), tainted so that only
pods asking for it run there. Each component logs to ``<workdir>/logs/<name>.log``; :meth:`Cluster.log_tails`
gives what tests print on failure.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rerank_devcluster import binaries, pki, realnode
from rerank_devcluster.processes import Processes
from rerank_devcluster.processes import free_port as free_port  # re-exported: tests take their ports from here

SERVICE_CIDR = "10.0.0.0/16"
POD_CIDR = "10.244.0.0/16"
NODE_LABEL = "rerank.io/devcluster-node"
KWOK_CONFIG = Path(__file__).with_name("kwok.yaml")

#: The fake nodes: name -> extra labels and allocatable resources.
NODES: dict[str, dict[str, Any]] = {
    "kwok-cpu-0": {"labels": {"node.kubernetes.io/instance-type": "cpu-16"}, "allocatable": {}},
    "kwok-cpu-1": {"labels": {"node.kubernetes.io/instance-type": "cpu-16"}, "allocatable": {}},
    "kwok-gpu-0": {
        "labels": {"node.kubernetes.io/instance-type": "gpu-h100", "nvidia.com/gpu.present": "true"},
        "allocatable": {"nvidia.com/gpu": "8"},
    },
}

#: The operator's identity in the tests and benchmarks (rerank_devcluster.operator_process.OPERATOR_USER).
OPERATOR_USER = "system:serviceaccount:rerank-system:rerank-operator"

# The audit log: every request of the operator's ServiceAccount (reads included: benchmarks/fleet/ counts its
# requests per second by verb; a long-running watch logs ResponseStarted when it opens and ResponseComplete when it
# ends), and only what changes state for everyone else. Tests count the operator's write calls by verb (an idle
# reconcile must make none), so its reads being here changes nothing for them.
AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}"]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
"""

# Client rate limits of the control plane's own controllers. Their defaults (controller-manager 20 QPS, burst 30;
# the scheduler 50/100) would make a fleet of a thousand models wait on the Job, ReplicaSet and scheduler clients
# rather than on the operator; a local etcd and API server take far more than this.
KUBE_API_QPS = 400
KUBE_API_BURST = 800


class ClusterError(RuntimeError):
    """The control plane did not come up; the message carries the component logs' tails."""


#: What a loaded API server answers that is worth one more try (kubectl's stderr contains one of these).
TRANSIENT_KUBECTL = (
    "the server was unable to return a response in the time allotted", "the server is currently unable to handle",
    "Timeout", "timeout", "connection refused", "connection reset", "EOF", "etcdserver", "Internal error occurred",
    "TLS handshake", "too many requests", "Too many requests",
)


class KubectlError(subprocess.CalledProcessError):
    """kubectl failed; unlike its base class, the message says why (kubectl's stderr)."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"


@dataclass
class Cluster:
    workdir: Path
    bins: binaries.Binaries
    ports: dict[str, int]
    processes: Processes = field(init=False)
    keep_workdir: bool = False
    real_node: realnode.RealNode | None = None
    #: names the real node's bridge and pod subnet (several clusters may share the machine)
    node_tag: str = field(default_factory=realnode.new_tag)

    def __post_init__(self) -> None:
        self.processes = Processes(logs_dir=self.logs_dir, cwd=self.workdir, error=ClusterError)

    # -- paths -----------------------------------------------------------------------------------------------
    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.logs_dir / "audit.log"

    @property
    def kubectl(self) -> Path:
        return self.bins.kubectl

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def pod_api_endpoint(self) -> tuple[str, int]:
        """Where a pod on the real node reaches the API server (host, port): the node's bridge address, which the
        serving certificate names. In-pod clients get it as KUBERNETES_SERVICE_HOST/PORT."""
        return realnode.gateway(self.node_tag), self.ports["apiserver"]

    def env(self) -> dict[str, str]:
        """Environment for child tools (kubectl, helm, the operator) pointing at this cluster."""
        path = os.pathsep.join([*self.bins.path_dirs(), os.environ.get("PATH", "")])
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "PATH": path}

    # -- lifecycle -------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, workdir: Path | None = None, timeout: float = 180.0, real_node: bool = False) -> Cluster:
        bins = binaries.ensure_all()
        wd = Path(workdir or tempfile.mkdtemp(prefix="rerank-devcluster-"))
        (wd / "logs").mkdir(parents=True, exist_ok=True)
        ports = {name: free_port() for name in ("etcd", "etcd_peer", "apiserver", "kcm", "scheduler", "kwok")}
        cluster = cls(workdir=wd, bins=bins, ports=ports)
        try:
            cluster._boot(timeout)
            if real_node:
                cluster._add_real_node(timeout)
        except BaseException as exc:
            tails = cluster.log_tails()
            cluster.stop()
            # The cause first: the components' log tails that follow are long (a failed image import said why only
            # in the exception, which this message used to drop).
            raise ClusterError(f"control plane failed to start in {wd}: {type(exc).__name__}: {exc}\n{tails}") from None
        return cluster

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _boot(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # The API server also answers on the real node's bridge, for pods there (the operator's): no kube-proxy
        # routes the `kubernetes` Service's ClusterIP on this node, so in-pod clients are given this address.
        certs = pki.create(self.workdir / "pki", extra_ips=[realnode.gateway(self.node_tag)])
        self._write_kubeconfig(certs)
        (self.workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
        self.processes.spawn("etcd", [
            str(self.bins.etcd), "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.ports['etcd']}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.ports['etcd']}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.ports['etcd_peer']}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.ports['etcd_peer']}",
            "--initial-cluster", f"default=http://127.0.0.1:{self.ports['etcd_peer']}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 * 1024**3),
        ])
        self.processes.spawn("kube-apiserver", [
            str(self.bins.kube_apiserver),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}",
            "--bind-address=0.0.0.0", "--advertise-address=127.0.0.1",
            f"--secure-port={self.ports['apiserver']}",
            f"--tls-cert-file={certs.serving_crt}", f"--tls-private-key-file={certs.serving_key}",
            f"--client-ca-file={certs.ca_crt}",
            # How the apiserver authenticates to a real kubelet (logs, exec); kwok ignores it.
            f"--kubelet-client-certificate={certs.admin_crt}", f"--kubelet-client-key={certs.admin_key}",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--service-account-key-file={certs.sa_pub}", f"--service-account-signing-key-file={certs.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            # Loopback addresses are invalid in Endpoints; nothing here needs the `kubernetes` Service's endpoints.
            "--endpoint-reconciler-type=none",
            f"--audit-policy-file={self.workdir / 'audit-policy.yaml'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            # MutatingAdmissionPolicy (beta in 1.34, off by default): the node tier uses one to send only the
            # quantizer's pods to the real node, leaving the operator's pod spec unchanged.
            "--feature-gates=MutatingAdmissionPolicy=true",
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
        ])
        self.processes.wait_for(lambda: self._exists("/readyz"), deadline, "kube-apiserver /readyz")
        kc = str(self.kubeconfig)
        self.processes.spawn("kube-controller-manager", [
            str(self.bins.kube_controller_manager), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kcm']}", "--leader-elect=false",
            f"--service-account-private-key-file={certs.sa_key}", f"--root-ca-file={certs.ca_crt}",
            f"--cluster-signing-cert-file={certs.ca_crt}", f"--cluster-signing-key-file={certs.ca_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--use-service-account-credentials=false",
            "--controllers=*,-node-ipam-controller,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller",
            "--concurrent-gc-syncs=5",
            f"--kube-api-qps={KUBE_API_QPS}", f"--kube-api-burst={KUBE_API_BURST}",
            "--concurrent-job-syncs=10", "--concurrent-deployment-syncs=10", "--concurrent-replicaset-syncs=10",
        ])
        self.processes.spawn("kube-scheduler", [
            str(self.bins.kube_scheduler), f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['scheduler']}", "--leader-elect=false",
            f"--kube-api-qps={KUBE_API_QPS}", f"--kube-api-burst={KUBE_API_BURST}",
        ])
        self.processes.spawn("kwok", [
            str(self.bins.kwok), f"--kubeconfig={kc}", f"--config={KWOK_CONFIG}",
            f"--manage-nodes-with-label-selector={NODE_LABEL}=true",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
            f"--cidr={POD_CIDR}", "--node-ip=10.1.0.1", "--node-lease-duration-seconds=40",
        ])
        self._create_nodes()
        self.processes.wait_for(self._nodes_ready, deadline, "kwok nodes to become Ready")
        self.processes.wait_for(lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"),
                                deadline, "the default ServiceAccount (controller-manager)")

    def add_real_node(self, timeout: float = 300.0) -> realnode.RealNode:
        """Start the real worker node (idempotent); see :mod:`rerank_devcluster.realnode`."""
        if self.real_node is None:
            self._add_real_node(timeout)
        assert self.real_node is not None
        return self.real_node

    def _add_real_node(self, timeout: float) -> None:
        # Set first: stop() cleans up after a failed start.
        self.real_node = realnode.RealNode.create(self.processes, tag=self.node_tag, workdir=self.workdir,
                                                  server=self.server,
                                                  kubelet=self.bins.kubelet)
        # From here: images built after a code change (create, minutes) are not the node's start-up time.
        deadline = time.monotonic() + timeout
        self.real_node.start(deadline)
        self.processes.wait_for(lambda: self._node_ready(realnode.NAME), deadline,
                                f"the real node {realnode.NAME} to become Ready")

    def stop(self) -> None:
        """Stop every component (reverse start order) and remove the work directory unless asked to keep it.
        A real node goes first: kubelet, then its containers, then containerd, then its mounts and cgroups."""
        if self.real_node is not None:
            self.real_node.stop()
        self.processes.stop_all()
        if self.real_node is not None:
            self.real_node.teardown()
            if not self.keep_workdir:
                self.real_node.remove()
            self.real_node = None
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- helpers for tests and the demo ------------------------------------------------------------------------
    def log_tails(self, lines: int = 40) -> str:
        chunks = []
        for log in sorted(self.logs_dir.glob("*.log")) if self.logs_dir.exists() else []:
            if log.name == "audit.log":
                continue
            text = log.read_text(errors="replace").splitlines()[-lines:]
            chunks.append(f"----- {log.name} (last {len(text)} lines) -----\n" + "\n".join(text))
        return "\n".join(chunks)

    def kubectl_run(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster; with ``check`` a failure raises :class:`KubectlError`, whose message
        carries kubectl's stderr (the API server's reason), not only the exit status."""
        done = subprocess.run([str(self.kubectl), *args], env=self.env(), check=False, capture_output=True,
                              text=True, input=input, timeout=120)
        if check and done.returncode:
            raise KubectlError(done.returncode, done.args, done.stdout, done.stderr)
        return done

    def apply(self, docs: list[dict[str, Any]], attempts: int = 3) -> None:
        """Server-side apply of ``docs`` in one kubectl call, as the admin. A transient refusal of a loaded API
        server (a timeout, a 5xx, a dropped connection: :data:`TRANSIENT_KUBECTL`) is tried again after a pause;
        anything else, and the last attempt, raises with kubectl's stderr."""
        text = "\n---\n".join(json.dumps(d) for d in docs)
        for attempt in range(1, attempts + 1):
            try:
                self.kubectl_run("apply", "--server-side", "--force-conflicts", "-f", "-", input=text)
                return
            except KubectlError as err:
                if attempt == attempts or not any(t in (err.stderr or "") for t in TRANSIENT_KUBECTL):
                    raise
                time.sleep(2.0 * attempt)

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event so far (level Metadata): everyone's write calls, and every call of the operator's
        ServiceAccount (``AUDIT_POLICY``); filter by ``verb`` for writes."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def finish_pod(self, namespace: str, name: str, exit_code: int, message: str = "") -> None:
        """End a held pod the way a real container would: terminated state, termination message, phase."""
        pod = json.loads(self.kubectl_run("get", "pod", "-n", namespace, name, "-o", "json").stdout)
        self.kubectl_run("patch", "pod", "-n", namespace, name, "--subresource=status", "--type=merge",
                         "-p", json.dumps(finished_pod_status(pod, exit_code, message)))

    # -- internals ---------------------------------------------------------------------------------------------
    def _write_kubeconfig(self, certs: pki.Pki) -> None:
        def b64(p: Path) -> str:
            return base64.b64encode(p.read_bytes()).decode()

        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "rerank-dev",
            "clusters": [{"name": "rerank-dev", "cluster": {"server": self.server,
                                                            "certificate-authority-data": b64(certs.ca_crt)}}],
            "users": [{"name": "admin", "user": {"client-certificate-data": b64(certs.admin_crt),
                                                 "client-key-data": b64(certs.admin_key)}}],
            "contexts": [{"name": "rerank-dev", "context": {"cluster": "rerank-dev", "user": "admin"}}],
        }
        self.kubeconfig.write_text(json.dumps(config, indent=2))
        self.kubeconfig.chmod(0o600)

    def _ssl_context(self) -> ssl.SSLContext:
        pk = self.workdir / "pki"
        ctx = ssl.create_default_context(cafile=str(pk / "ca.crt"))
        ctx.load_cert_chain(str(pk / "admin.crt"), str(pk / "admin.key"))
        return ctx

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A raw API call with the admin identity; used while booting, before any client library is involved."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl_context(), timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw.startswith(b"{") else raw.decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")

    def _exists(self, path: str) -> bool:
        try:
            return self.request("GET", path)[0] == 200
        except OSError:
            return False

    def add_nodes(self, nodes: dict[str, dict[str, Any]], timeout: float = 60.0) -> None:
        """More kwok nodes (same shape as :data:`NODES`: labels, and allocatable that replaces the defaults'), e.g.
        room for a benchmark's thousands of pods; returns once they are Ready."""
        self._create_nodes(nodes)
        self.processes.wait_for(lambda: all(self._node_ready(n) for n in nodes), time.monotonic() + timeout,
                                f"kwok nodes {sorted(nodes)} to become Ready")

    def _create_nodes(self, nodes: dict[str, dict[str, Any]] = NODES) -> None:
        for name, spec in nodes.items():
            body = {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
                             "labels": {NODE_LABEL: "true", "kubernetes.io/hostname": name,
                                        "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                                        "type": "kwok", **spec["labels"]}},
                "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110", **spec["allocatable"]},
                           "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110", **spec["allocatable"]}},
            }
            code, text = self.request("POST", "/api/v1/nodes", body)
            if code not in (200, 201, 409):
                raise ClusterError(f"creating node {name}: {code} {text}")

    def _nodes_ready(self) -> bool:
        code, nodes = self.request("GET", f"/api/v1/nodes?labelSelector={NODE_LABEL}%3Dtrue")
        if code != 200:
            return False
        return len([n for n in nodes["items"] if _is_ready(n)]) == len(NODES)

    def _node_ready(self, name: str) -> bool:
        code, node = self.request("GET", f"/api/v1/nodes/{name}")
        return code == 200 and _is_ready(node)


def finished_pod_status(pod: dict[str, Any], exit_code: int, message: str = "") -> dict[str, Any]:
    """The status patch that ends a held pod (``pod`` as the API returns it) the way a real container would:
    terminated state with ``exit_code`` and the termination ``message``, phase Succeeded or Failed."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    statuses = []
    for c in pod["spec"]["containers"]:
        terminated: dict[str, Any] = {"exitCode": exit_code, "reason": "Completed" if exit_code == 0 else "Error",
                                      "startedAt": now, "finishedAt": now}
        if message:
            terminated["message"] = message
        statuses.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
                         "started": False, "restartCount": 0, "state": {"terminated": terminated}})
    return {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": statuses,
        "conditions": [{"type": t, "status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
                       for t in ("Ready", "ContainersReady")],
    }}


def _is_ready(node: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))

