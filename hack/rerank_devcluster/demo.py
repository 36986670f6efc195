"""The whole flow on this machine, with nothing but the local control plane: ``./hack/demo``.

1. start the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes) and the real node
   (kubelet + containerd), whose images are the project's Dockerfiles built by buildah (cached);
2. release and install it as a platform team would: ``hack/release`` pushes both images and the chart (naming them
   by digest) to the dev cluster's registry, then ``helm install oci://...`` of what it pushed; the operator runs as
   the chart's pods on the real node, its image pulled from the registry, with the chart's ServiceAccount, RBAC,
   probes and securityContext;
3. put a small cross-encoder (all-MiniLM-L6-v2's encoder + a 1-logit head, shipped on PyPI) on a local volume and
   apply a RerankModel pointing at it;
4. the operator's quantization Job runs on the real node from the quantizer image (an admission policy of the dev
   cluster sends quantizer pods there: kwok's nodes run nothing); the demo streams its log;
5. watch the RerankModel go to Ready and print the artifact's figures. The TEI pools run on kwok nodes (no TEI image
   here), so they turn Ready without serving;
6. put the model behind a real gateway: Traefik (built from the Go module proxy) as the cluster's Gateway, the
   model's HTTPRoute attached to it by the operator, and the CPU pool pods' addresses served on this machine by the
   published INT8 artifact in TEI's /rerank shape (``artifact_server``: no TEI image can run here); then a request
   to the Gateway's address, and the ``curl`` that sends it again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rerank_contracts.guard import SAMPLER_PORT
from rerank_devcluster import artifact_server, binaries, nodeimage, realnode
from rerank_devcluster import release as releases
from rerank_devcluster.cluster import POD_CIDR, Cluster
from rerank_devcluster.gateway import start_gateway
from rerank_devcluster.operator_process import apply_and_wait_established
from rerank_devcluster.operator_release import OperatorRelease, ReleaseError
from rerank_devcluster.waiting import eventually
from rerank_operator import __version__
from rerank_sampler import server as front
from rerank_sampler.translation import ApiSettings

REPO = binaries.REPO_ROOT
CHART = REPO / "charts" / "rerank-operator"
RELEASE, OPERATOR_NS = "rerank-operator", "rerank-system"
DEMO_NS, MODEL, CLAIM = "search", "minilm", "models"
QUANTIZER_SELECTOR = "app.kubernetes.io/component=quantizer"
REAL_NODE_LABEL = "rerank.io/quantize-on-real-node"


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def kubectl_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl_run(*args, "-o", "json").stdout)


def install_operator(cluster: Cluster, workdir: Path) -> OperatorRelease:
    """A release into the dev cluster's registry (``hack/release``), then ``helm install`` of the chart it pushed,
    with none of its images overridden: its pods (two: a leader and a standby) on the real node."""
    node = cluster.real_node
    assert node is not None and node.registry is not None
    published = releases.publish(node.registry.client, nodeimage.REGISTRY_PREFIX, __version__, workdir=workdir)
    say(f"hack/release {__version__}: pushed {published.operator_image}, {published.quantizer_image} and "
        f"{published.chart} {published.chart_version}")
    release = OperatorRelease(cluster, OPERATOR_NS, RELEASE, None, replicas=2,
                              chart_args=published.helm_args(insecure=True))
    try:
        release.install(workdir, timeout=240)
    except ReleaseError as exc:
        raise SystemExit(str(exc)) from None
    pods = release.pods()
    images = sorted({c["image"] for p in pods for c in p["spec"]["containers"]})
    say(f"helm: chart {published.chart} {published.chart_version} installed in {OPERATOR_NS}; operator pods "
        + ", ".join(f"{p['metadata']['name']} on {p['spec'].get('nodeName')}" for p in pods)
        + f" ({', '.join(images)})")
    return release


def prepare_model(volume: Path) -> str:
    """The demo's model, on the stand-in volume; returns its path relative to the volume's root."""
    from rerank_devcluster import devmodels

    rel = "sources/minilm-reranker"
    if not (volume / rel / "config.json").exists():
        devmodels.minilm_cross_encoder(volume / rel)
    return rel


def volume_objects(volume: Path) -> list[dict[str, Any]]:
    """A local PersistentVolume on this directory and the claim the RerankModel names. The dev cluster has no
    storage provisioner; this is how an admin hands a pre-filled volume to a namespace."""
    nodes = [realnode.NAME, "kwok-cpu-0", "kwok-cpu-1", "kwok-gpu-0"]
    return [
        realnode.local_pv(f"{DEMO_NS}-models", "demo", volume, nodes),
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": DEMO_NS},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "demo",
                  "resources": {"requests": {"storage": "20Gi"}}, "volumeName": f"{DEMO_NS}-models"}},
    ]


def rerank_model(model_path: str) -> dict[str, Any]:
    return {
        "apiVersion": "rerank.io/v1alpha1", "kind": "RerankModel",
        "metadata": {"name": MODEL, "namespace": DEMO_NS},
        "spec": {
            "model": {"path": model_path},
            # The demo model's head is untrained, so its scores are close together and a little INT8 noise
            # reorders them more than on a trained reranker: the gate is relaxed here, and only here.
            # No quantization.image: the release's own (the chart's workloads.quantizerImage, by digest).
            "quantization": {"timeBudgetSeconds": 300,
                             "qualityGate": {"minSpearman": 0.98, "minTopKAgreement": 0.85}},
            "storage": {"existingClaim": CLAIM},
            "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 4},
                      "gpu": {"minReplicas": 1, "maxReplicas": 2,
                              "resources": {"limits": {"nvidia.com/gpu": "1"}}}},
        },
    }


def follow_quantizer(cluster: Cluster, pod: dict[str, Any]) -> threading.Thread:
    """Print the quantizer container's log as it runs (kubectl logs -f), summarized."""
    name = pod["metadata"]["name"]
    image = pod["spec"]["containers"][0]["image"]
    say(f"quantization Job pod {name} running on {pod['spec'].get('nodeName')} from {image}")

    def follow() -> None:
        proc = subprocess.Popen([str(cluster.kubectl), "logs", "-f", "-n", DEMO_NS, name, "-c", "quantizer"],
                                env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"    | {_summarize(line.rstrip())}", flush=True)
        proc.wait()
    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread


def report_exit(pod: dict[str, Any]) -> bool:
    """Say how the quantizer container ended (the kubelet's report), once it has."""
    for status in pod["status"].get("containerStatuses") or ():
        term = (status.get("state") or {}).get("terminated")
        if status["name"] == "quantizer" and term:
            say(f"quantizer exited {term['exitCode']} ({term.get('reason')}); the kubelet reported its termination "
                "message to the API server")
            return True
    return False


def _summarize(line: str) -> str:
    """Quantizer logs are JSON; show stage, message and figures compactly."""
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return line
    if not isinstance(rec, dict):
        return line
    head = " ".join(str(rec.pop(k)) for k in ("stage", "msg", "message", "event") if k in rec)
    rec.pop("ts", None), rec.pop("time", None), rec.pop("level", None)
    return f"{head} {json.dumps(rec, separators=(',', ':'))[:200]}"


def watch(cluster: Cluster, release: OperatorRelease, timeout: float) -> dict[str, Any]:
    """Until the RerankModel is Ready: follow each quantizer pod's log, print each change of the model's status."""
    followed: dict[str, threading.Thread] = {}
    ended: set[str] = set()
    last = ""

    def step() -> dict[str, Any] | None:
        nonlocal last
        for pod in kubectl_json(cluster, "get", "pods", "-n", DEMO_NS, "-l", QUANTIZER_SELECTOR)["items"]:
            name = pod["metadata"]["name"]
            if name not in followed and pod["status"].get("phase") in ("Running", "Succeeded", "Failed"):
                followed[name] = follow_quantizer(cluster, pod)
            if name in followed and name not in ended and report_exit(pod):
                followed[name].join(timeout=10)
                ended.add(name)
        obj: dict[str, Any] = kubectl_json(cluster, "get", "rerankmodel", MODEL, "-n", DEMO_NS)
        status = obj.get("status", {})
        conds = {c["type"]: c for c in status.get("conditions", [])}
        line = " ".join(f"{t}={c['status']}({c.get('reason', '')})" for t, c in sorted(conds.items()))
        summary = f"phase={status.get('phase', '-')} {line}"
        if summary != last:
            say(summary)
            last = summary
        ready = conds.get("Ready", {})
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        if current and ready.get("status") == "True":
            return obj
        if current and status.get("phase") == "Failed":
            raise SystemExit(f"RerankModel {DEMO_NS}/{MODEL} failed: {ready.get('reason')}: {ready.get('message')}")
        return None

    try:
        result: dict[str, Any] = eventually(step, timeout, f"RerankModel {DEMO_NS}/{MODEL} to become Ready",
                                            every=1, error=SystemExit)
    except SystemExit as exc:
        raise SystemExit(f"{exc}\n--- operator ---\n{release.describe()}") from None
    return result


QUERY = {"query": "what is a panda?", "texts": ["The giant panda is a bear native to south central China.",
                                                "Paris is the capital and largest city of France.",
                                                "Pandas eat bamboo for most of the day."]}
COHERE_QUERY = {"model": MODEL, "query": QUERY["query"], "documents": QUERY["texts"], "top_n": 2}


@contextlib.contextmanager
def through_the_gateway(cluster: Cluster, artifact: Path) -> Iterator[None]:
    """Step 6: Traefik as the demo namespace's Gateway, the model routed through it (all to the CPU pool: the GPU
    pool's kwok pods have no GPU here), each CPU pod's address served as the pod would be (the real front on the
    pod's serving port, the artifact in TEI's shapes behind it on TEI's), one request in TEI's shape and one in
    Cohere's through the gateway."""
    if os.geteuid() != 0:
        say("not root: the model is not put behind a gateway (serving the pods' addresses needs a local route)")
        yield
        return
    say("putting the model behind a real gateway: Traefik as the Gateway of namespace " + DEMO_NS)
    gw = start_gateway(cluster, namespace=DEMO_NS)
    subprocess.run(["ip", "route", "replace", "local", POD_CIDR, "dev", "lo"], check=True)
    servers: list[Any] = []
    fronts: list[front.Running] = []
    try:
        routing = {"policy": "fixed", "weights": {"gpu": 0, "cpu": 100}, "gateway": {"parentRefs": [gw.parent_ref()]}}
        cluster.kubectl_run("patch", "rerankmodel", MODEL, "-n", DEMO_NS, "--type", "merge", "-p",
                            json.dumps({"spec": {"routing": routing}}))
        gw.wait_route(DEMO_NS, MODEL, timeout=120)
        scorer = artifact_server.Scorer(artifact)
        pods = eventually(lambda: [p["status"]["podIP"] for p in kubectl_json(
            cluster, "get", "pods", "-n", DEMO_NS, "-l", f"app.kubernetes.io/instance={MODEL},rerank.io/pool=cpu")[
            "items"] if p["status"].get("podIP")] or None, 120, "the CPU pool's pod addresses")
        api = ApiSettings(models=(MODEL, f"{DEMO_NS}/{MODEL}"), served_model=MODEL)
        for ip in pods:
            servers.append(artifact_server.serve(scorer, ip, f"{DEMO_NS}/{MODEL}"))
            fronts.append(front.start(front.Settings(guard_url=None, token="", fraction=0.0, api=api,
                                                     upstream=f"http://{ip}:{artifact_server.TEI_PORT}"),
                                      ip, SAMPLER_PORT))
        say(f"the CPU pool's pods {', '.join(pods)} answer with artifact {artifact.name} behind the pods' front "
            f"(kwok pods: served here)")
        tei_body, cohere_body = json.dumps(QUERY), json.dumps(COHERE_QUERY)
        answer = _through(cluster, gw, "/rerank", tei_body, pods)
        say(f"through the gateway, TEI's shape: HTTP 200 {answer}")
        say(f"  curl -s {gw.address}/rerank -H 'Content-Type: application/json' -d '{tei_body}'")
        answer = _through(cluster, gw, "/v2/rerank", cohere_body, pods)
        say(f"through the gateway, Cohere's shape: HTTP 200 {answer}")
        say(f"  curl -s {gw.address}/v2/rerank -H 'Content-Type: application/json' -d '{cohere_body}'")
        yield
    finally:
        for running in fronts:
            running.stop()
        for server in servers:
            server.shutdown()
            server.server_close()
        subprocess.run(["ip", "route", "del", "local", POD_CIDR, "dev", "lo"], check=False)
        gw.stop()


def _through(cluster: Cluster, gw: Any, path: str, body: str, pods: list[str]) -> str:
    """The gateway's 200 answer to ``body`` at ``path``; on a timeout, what was seen on the way (the gateway's last
    answer, the pods' own answer, the route and its endpoints, the end of Traefik's log)."""
    last: list[str] = []

    def attempt() -> str | None:
        status, text = _post(gw.address + path, body)
        last[:] = [f"{status} {text[:300]}"]
        return text if status == 200 else None

    try:
        result: str = eventually(attempt, 90, f"an answer through the gateway at {path}")
        return result
    except AssertionError:
        direct = [f"{ip}: {' '.join(map(str, _post(f'http://{ip}:{SAMPLER_PORT}{path}', body)))[:300]}" for ip in pods]
        route = cluster.kubectl_run("get", "httproute", MODEL, "-n", DEMO_NS, "-o", "yaml", check=False).stdout
        slices = cluster.kubectl_run("get", "endpointslices", "-n", DEMO_NS, "-o", "wide", check=False).stdout
        log = cluster.logs_dir / f"{gw.process}.log"
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:]) if log.exists() else "(no log)"
        raise SystemExit(f"no answer through the gateway at {path}: last {last}\nthe pods directly: {direct}\n"
                         f"--- route ---\n{route}\n--- endpoint slices ---\n{slices}\n--- {log.name} ---\n{tail}"
                         ) from None


def _post(url: str, body: str) -> tuple[int | str, str]:
    """The answer's status and body (an error's name instead of a status when none came)."""
    request = urllib.request.Request(url, data=body.encode(), headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # the gateway is local: never a proxy
    try:
        with opener.open(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return type(exc).__name__, str(exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rerank-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=REPO / ".demo")
    parser.add_argument("--keep", action="store_true", help="keep everything running after Ready (Ctrl-C ends)")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args(argv)
    workdir: Path = args.workdir.resolve()
    shutil.rmtree(workdir / "cluster", ignore_errors=True)
    volume = workdir / "volume"
    volume.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    stack = contextlib.ExitStack()
    say("starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok) and the real "
        "node (kubelet, containerd; the images are built from the Dockerfiles the first time: minutes)")
    cluster = Cluster.start(workdir / "cluster", real_node=True, timeout=900)
    cluster.keep_workdir = True
    try:
        say(f"control plane up at {cluster.server}; KUBECONFIG={cluster.kubeconfig}")
        assert cluster.real_node is not None
        # First, so that the API server has loaded it when the quantizer's pod is created.
        cluster.kubectl_run("apply", "-f", "-", input="\n---\n".join(
            json.dumps(o) for o in realnode.quantizer_placement_policy(REAL_NODE_LABEL)))
        # Before the operator: it finds the Gateway API at start-up (an API installed later is looked for again
        # only every minute), and step 6 attaches the model to a Gateway.
        apply_and_wait_established(cluster, binaries.gateway_api_crds())
        release = install_operator(cluster, workdir)
        say("preparing the demo model (all-MiniLM-L6-v2 encoder + 1-logit head) on the local volume")
        model_path = prepare_model(volume)
        cluster.kubectl_run("create", "namespace", DEMO_NS, check=False)
        cluster.kubectl_run("label", "namespace", DEMO_NS, f"{REAL_NODE_LABEL}=true", "--overwrite")
        cluster.kubectl_run("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in volume_objects(volume)))
        model = rerank_model(model_path)
        cluster.kubectl_run("apply", "-f", "-", input=json.dumps(model))
        say(f"applied RerankModel {DEMO_NS}/{MODEL} (model.path={model_path})")
        obj = watch(cluster, release, args.timeout)
        print(cluster.kubectl_run("get", "rerankmodels", "-A").stdout)
        art = obj["status"].get("artifact", {})
        say(f"Ready in {time.monotonic() - started:.0f}s. Artifact {art.get('id')} at {art.get('path')}")
        say(f"  size {art.get('sizeBytes')} bytes, manifest sha256 {art.get('manifestSha256')}")
        say(f"  quality vs FP32: {json.dumps(art.get('quality', {}))}")
        say(f"  speed: {json.dumps(art.get('speed', {}))}")
        print(cluster.kubectl_run("get", "deployments,services,jobs,pvc", "-n", DEMO_NS).stdout)
        print(cluster.kubectl_run("get", "pods", "-n", OPERATOR_NS, "-o", "wide").stdout)
        stack.enter_context(through_the_gateway(cluster, volume / "artifacts" / str(art.get("id"))))
        if args.keep:
            say(f"kept running: export KUBECONFIG={cluster.kubeconfig}; Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return 0
    finally:
        stack.close()
        cluster.stop()
        say("control plane stopped")


if __name__ == "__main__":
    sys.exit(main())
