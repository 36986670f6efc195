"""The operator as users run it: ``helm install`` of charts/rerank-operator, its pod on the dev cluster's real node.

The chart is installed from the dev cluster's registry as an OCI artifact (``helm push``, then ``helm install
oci://...``), and the pod runs the image built from operator/Dockerfile (:mod:`rerank_devcluster.nodeimage`),
pulled by the node from that registry by digest, with the chart's
ServiceAccount token, RBAC, probes, securityContext and ports, exactly as rendered. Only values a user sets too:
the image, where the pod goes (the real node's nodeSelector and toleration), which namespaces it watches, and one
environment override every cluster without kube-proxy needs: the API server's address (this node has no
kube-proxy, so the ``kubernetes`` Service's ClusterIP leads nowhere; ``KUBERNETES_SERVICE_HOST``/``PORT`` name the
API server on the node's bridge, as they would name a real cluster's endpoint).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rerank_devcluster import binaries, realnode
from rerank_devcluster.cluster import Cluster

CHART = binaries.REPO_ROOT / "charts" / "rerank-operator"


class ReleaseError(RuntimeError):
    """helm failed, or the operator's pod did not become Ready; the message has helm's output or the pod's log."""


def values(*, image: str | None, api_host: str, api_port: int, watch_namespaces: list[str], replicas: int,
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The chart's values for an operator pod on the real node (pure: the chart's own defaults do the rest; no
    ``image``: the chart's own, as a released chart names it)."""
    if image is None:
        ref: dict[str, str] = {}
    elif "@" in image:  # by digest, as the dev cluster's registry names what it holds
        repository, _, digest = image.partition("@")
        ref = {"repository": repository, "digest": digest}
    else:
        repository, _, tag = image.rpartition(":")
        ref = {"repository": repository, "tag": tag}
    out: dict[str, Any] = {
        "image": {**ref, "pullPolicy": "IfNotPresent"},  # pulled by the node from the registry, as anywhere
        "replicaCount": replicas,
        "watchNamespaces": watch_namespaces,
        "nodeSelector": realnode.node_selector(),
        "tolerations": [realnode.toleration()],
        "extraEnv": [{"name": "KUBERNETES_SERVICE_HOST", "value": api_host},
                     {"name": "KUBERNETES_SERVICE_PORT", "value": str(api_port)}],
        "logFormat": "json",
    }
    for key, value in (extra or {}).items():
        out[key] = value
    return out


@dataclass
class OperatorRelease:
    """One helm release of the chart; :meth:`install` waits for its pods to be Ready."""

    cluster: Cluster
    namespace: str
    name: str
    image: str | None  # None: the chart's own (a released chart names its image by digest)
    watch_namespaces: list[str] = field(default_factory=list)
    replicas: int = 1
    extra_values: dict[str, Any] = field(default_factory=dict)
    helm_flags: tuple[str, ...] = ()
    chart_args: tuple[str, ...] = ()  # helm's arguments for another chart (a release's oci://... --version ...)

    @property
    def selector(self) -> str:
        return f"app.kubernetes.io/instance={self.name},app.kubernetes.io/name=rerank-operator"

    def _helm(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(binaries.ensure("helm")), *args], env=self.cluster.env(), capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0:
            raise ReleaseError(f"helm {' '.join(args[:2])} failed:\n{done.stdout}\n{done.stderr}\n{self.describe()}")
        return done

    def install(self, workdir: Path, timeout: float = 180) -> OperatorRelease:
        host, port = self.cluster.pod_api_endpoint
        vals = values(image=self.image, api_host=host, api_port=port, watch_namespaces=self.watch_namespaces,
                      replicas=self.replicas, extra=self.extra_values)
        path = workdir / f"values-{self.name}.json"
        path.write_text(json.dumps(vals, indent=1))
        self._helm("upgrade", "--install", self.name, *self.chart(workdir), "--namespace", self.namespace,
                   "--create-namespace", "-f", str(path), "--wait", "--timeout", f"{int(timeout)}s",
                   *self.helm_flags, timeout=timeout + 30)
        return self

    def chart(self, workdir: Path) -> tuple[str, ...]:
        """What ``helm install`` installs: with a real node, the chart as an OCI artifact in the node's registry
        (packaged and pushed once per cluster, then ``oci://...`` with its version), as a platform team installs a
        published release; without one, the chart's folder."""
        if self.chart_args:
            return self.chart_args
        node = self.cluster.real_node
        if node is None or node.registry is None:
            return (str(CHART),)
        if node.chart is None:
            out = workdir / "chart"
            out.mkdir(parents=True, exist_ok=True)
            packaged = self._helm("package", str(CHART), "--destination", str(out)).stdout.strip()
            archive = packaged.rsplit(": ", 1)[-1]
            self._helm("push", archive, f"oci://{node.registry.host}/charts", "--plain-http")
            version = Path(archive).name.removeprefix("rerank-operator-").removesuffix(".tgz")
            node.chart = (f"oci://{node.registry.host}/charts/rerank-operator", "--version", version, "--plain-http")
        return node.chart

    def uninstall(self) -> None:
        subprocess.run([str(binaries.ensure("helm")), "uninstall", self.name, "-n", self.namespace, "--wait",
                        "--timeout", "60s"], env=self.cluster.env(), capture_output=True, text=True, timeout=120)

    def pods(self) -> list[dict[str, Any]]:
        out = self.cluster.kubectl_run("get", "pods", "-n", self.namespace, "-l", self.selector, "-o", "json",
                                       check=False)
        items: list[dict[str, Any]] = json.loads(out.stdout)["items"] if out.returncode == 0 else []
        return items

    def logs(self, tail: int = 200) -> str:
        """Every operator container's log (the previous run's too, after a restart)."""
        parts = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            for previous in (True, False):
                out = self.cluster.kubectl_run("logs", "-n", self.namespace, name, f"--tail={tail}",
                                               f"--previous={str(previous).lower()}", check=False)
                if out.returncode == 0 and out.stdout:
                    parts.append(f"--- {name}{' (previous)' if previous else ''} ---\n{out.stdout}")
        return "\n".join(parts)

    def describe(self) -> str:
        pods = self.cluster.kubectl_run("get", "pods", "-n", self.namespace, "-l", self.selector, "-o", "wide",
                                        check=False).stdout
        events = self.cluster.kubectl_run("get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp",
                                          check=False).stdout[-3000:]
        # A pod on the real node that its probes cannot reach: how this machine routes its address (a CI run
        # once saw "no route to host" to every operator pod there).
        network = "\n".join(realnode.network_report(ip) for pod in self.pods()
                              if (ip := pod.get("status", {}).get("podIP"))
                              and pod["spec"].get("nodeName") == realnode.NAME)
        return f"{pods}\n{events}\n{network}\n{self.logs(60)[-4000:]}"
