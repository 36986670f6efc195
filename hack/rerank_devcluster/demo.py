"""The whole flow on this machine, with nothing but the local control plane: ``./hack/demo``.

1. start the control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok nodes);
2. ``helm install`` the chart (CRDs, RBAC, the operator Deployment, which kwok "runs");
3. run the real operator as a local process, authenticated as the chart's ServiceAccount (so the chart's RBAC
   is what it really gets);
4. put a small cross-encoder (all-MiniLM-L6-v2's encoder + a 1-logit head, shipped on PyPI) on a directory that
   stands in for the model volume, and apply a RerankModel pointing at it;
5. kwok runs no containers, so when the operator's quantization Job starts a pod, the demo runs that pod's
   container command here (``rerank-quantize`` with the volume mapped to the local directory) and reports its
   exit code and termination message on the pod exactly as the kubelet would;
6. watch the RerankModel go to Ready and print the artifact's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quantizer_job import contract
from rerank_devcluster import binaries
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.waiting import eventually

REPO = binaries.REPO_ROOT
CHART = REPO / "charts" / "rerank-operator"
RELEASE, OPERATOR_NS = "rerank-operator", "rerank-system"
DEMO_NS, MODEL, CLAIM = "search", "minilm", "models"
QUANTIZER_SELECTOR = "app.kubernetes.io/component=quantizer"


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def kubectl_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl_run(*args, "-o", "json").stdout)


def install_chart(cluster: Cluster) -> None:
    helm = str(binaries.ensure("helm"))
    done = subprocess.run([helm, "upgrade", "--install", RELEASE, str(CHART), "--namespace", OPERATOR_NS,
                           "--create-namespace", "--wait", "--timeout", "120s"], env=cluster.env(),
                          capture_output=True, text=True)
    if done.returncode != 0:  # helm's notes about the chart's symlinks (crds/, files/) are noise otherwise
        raise SystemExit(f"helm install failed:\n{done.stdout}\n{done.stderr}")
    say(f"helm: chart {CHART.name} installed in {OPERATOR_NS}; CRD served: "
        + cluster.kubectl_run("get", "crd", "rerankmodels.rerank.io", "-o", "name").stdout.strip())


def operator_kubeconfig(cluster: Cluster, workdir: Path) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount: the local operator gets only the chart's RBAC."""
    sas = kubectl_json(cluster, "get", "serviceaccounts", "-n", OPERATOR_NS,
                       "-l", "app.kubernetes.io/name=rerank-operator")["items"]
    if not sas:
        raise SystemExit("the chart created no ServiceAccount labelled "
                         f"app.kubernetes.io/name=rerank-operator in {OPERATOR_NS}")
    sa = sas[0]["metadata"]["name"]
    token = cluster.kubectl_run("create", "token", sa, "-n", OPERATOR_NS, "--duration=12h").stdout.strip()
    config = json.loads(cluster.kubeconfig.read_text())
    config["users"] = [{"name": sa, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = sa
    path = workdir / "operator.kubeconfig"
    path.write_text(json.dumps(config))
    path.chmod(0o600)
    say(f"operator runs here as system:serviceaccount:{OPERATOR_NS}:{sa}")
    return path


def start_operator(cluster: Cluster, kubeconfig: Path, workdir: Path) -> subprocess.Popen[bytes]:
    log = open(workdir / "operator.log", "wb")  # noqa: SIM115 - the operator process holds it open
    exe = Path(sys.executable).with_name("rerank-operator")
    env = {**cluster.env(), "KUBECONFIG": str(kubeconfig)}
    proc = subprocess.Popen([str(exe), "--all-namespaces", "--health-port", "0", "--metrics-port", "0"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    say(f"operator started (pid {proc.pid}, log {workdir / 'operator.log'})")
    return proc


def prepare_model(volume: Path) -> str:
    """The demo's model, on the stand-in volume; returns its path relative to the volume's root."""
    from rerank_devcluster import devmodels

    rel = "sources/minilm-reranker"
    if not (volume / rel / "config.json").exists():
        devmodels.minilm_cross_encoder(volume / rel)
    return rel


def volume_objects(volume: Path) -> list[dict[str, Any]]:
    """A PersistentVolume whose hostPath is the stand-in directory, and the claim the RerankModel names.

    The dev cluster has no storage provisioner; this is how an admin hands a pre-filled volume to a namespace.
    """
    return [
        {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{DEMO_NS}-models"},
         "spec": {"capacity": {"storage": "20Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "demo",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(volume)},
                  "claimRef": {"namespace": DEMO_NS, "name": CLAIM}}},
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
            "quantization": {"timeBudgetSeconds": 300,
                             "qualityGate": {"minSpearman": 0.98, "minTopKAgreement": 0.85}},
            "storage": {"existingClaim": CLAIM},
            "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 4},
                      "gpu": {"minReplicas": 1, "maxReplicas": 2,
                              "resources": {"limits": {"nvidia.com/gpu": "1"}}}},
        },
    }


def run_quantizer_pod(cluster: Cluster, pod: dict[str, Any], volume: Path, workdir: Path) -> None:
    """Do what the kubelet would: run the container's command (volume mapped here) and report how it ended."""
    container = pod["spec"]["containers"][0]
    args = [a.replace(contract.VOLUME_MOUNT_PATH, str(volume)) for a in container.get("args", [])]
    command = container.get("command") or ["rerank-quantize"]
    exe = Path(sys.executable).with_name(Path(command[0]).name)
    term = workdir / f"termination-{pod['metadata']['name']}"
    term.unlink(missing_ok=True)
    say(f"quantization Job pod {pod['metadata']['name']} started; running its command here:")
    say("  rerank-quantize " + " ".join(container.get("args", [])))
    env = {**os.environ, "TERMINATION_MESSAGE_PATH": str(term), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([str(exe), *command[1:], *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(f"    | {_summarize(line.rstrip())}", flush=True)
    code = proc.wait()
    # The container sees the volume at /models: report paths the way it would have.
    message = term.read_text().replace(str(volume), contract.VOLUME_MOUNT_PATH) if term.exists() else ""
    cluster.finish_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], code, message)
    say(f"quantizer exited {code}; pod status reported to the API server with its termination message")


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


def watch(cluster: Cluster, volume: Path, workdir: Path, timeout: float) -> dict[str, Any]:
    """Until the RerankModel is Ready: run each quantizer pod as it starts, print each change of its status."""
    handled: set[str] = set()
    last = ""

    def step() -> dict[str, Any] | None:
        nonlocal last
        for pod in kubectl_json(cluster, "get", "pods", "-n", DEMO_NS, "-l", QUANTIZER_SELECTOR)["items"]:
            if pod["metadata"]["name"] not in handled and pod["status"].get("phase") == "Running":
                handled.add(pod["metadata"]["name"])
                run_quantizer_pod(cluster, pod, volume, workdir)
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

    result: dict[str, Any] = eventually(step, timeout, f"RerankModel {DEMO_NS}/{MODEL} to become Ready "
                                        f"(see {workdir}/operator.log)", every=1, error=SystemExit)
    return result


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
    say("starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)")
    cluster = Cluster.start(workdir / "cluster")
    cluster.keep_workdir = True
    operator = None
    try:
        say(f"control plane up at {cluster.server}; KUBECONFIG={cluster.kubeconfig}")
        install_chart(cluster)
        operator = start_operator(cluster, operator_kubeconfig(cluster, workdir), workdir)
        say("preparing the demo model (all-MiniLM-L6-v2 encoder + 1-logit head) on the stand-in volume")
        model_path = prepare_model(volume)
        cluster.kubectl_run("create", "namespace", DEMO_NS, check=False)
        cluster.kubectl_run("apply", "-f", "-", input="\n---\n".join(json.dumps(o) for o in volume_objects(volume)))
        cluster.kubectl_run("apply", "-f", "-", input=json.dumps(rerank_model(model_path)))
        say(f"applied RerankModel {DEMO_NS}/{MODEL} (model.path={model_path})")
        obj = watch(cluster, volume, workdir, args.timeout)
        print(cluster.kubectl_run("get", "rerankmodels", "-A").stdout)
        art = obj["status"].get("artifact", {})
        say(f"Ready in {time.monotonic() - started:.0f}s. Artifact {art.get('id')} at {art.get('path')}")
        say(f"  size {art.get('sizeBytes')} bytes, manifest sha256 {art.get('manifestSha256')}")
        say(f"  quality vs FP32: {json.dumps(art.get('quality', {}))}")
        say(f"  speed: {json.dumps(art.get('speed', {}))}")
        print(cluster.kubectl_run("get", "deployments,services,jobs,pvc", "-n", DEMO_NS).stdout)
        if args.keep:
            say(f"kept running: export KUBECONFIG={cluster.kubeconfig}; Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                operator.wait()
        return 0
    finally:
        if operator and operator.poll() is None:
            operator.terminate()
            operator.wait(timeout=30)
        cluster.stop()
        say("control plane stopped")


if __name__ == "__main__":
    sys.exit(main())
