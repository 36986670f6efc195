"""Real TEI routers behind a real gateway, programmed by the operator: the gateway's own cost and the time from a
split decision to the traffic moved; JSON.

    .venv/bin/python -m benchmarks.gateway_e2e --router /path/to/text-embeddings-router [--requests 150]
        [--concurrency 4] [--texts 8] [--flips 10] [--out FILE]

Opt-in (not in ./hack/test): TEI's router cannot be built in CI (``docs/tei-contract.md`` says how to build one; never
commit it). Needs root: like ``tests/cluster/test_gateway.py`` it makes the dev cluster's pod CIDR local to this
machine, so that the pool pods' addresses (kwok pods, real addresses in their EndpointSlices) are served here, each by
a real ``text-embeddings-router`` bound to that address and the pod's port, serving the trained MiniLM-size
cross-encoder (``benchmarks/trained_fixture.py``, minilm-ce, its FP32 ONNX export as the Job publishes one).

1. the dev cluster (kube-apiserver, etcd, controller-manager, scheduler, kwok), the Gateway API CRDs, Traefik
   (``rerank_devcluster.gateway``, built from the Go module proxy) and the operator process; a RerankModel with a GPU
   and a CPU pool (one pod each) and a fixed split, its HTTPRoute attached to Traefik's Gateway;
2. **the gateway's cost**: the split at 100/0, the same ``/rerank`` requests (``--texts`` held-out passages each) from
   ``--concurrency`` clients straight to the GPU pool's pod and through the Gateway, alternating for two rounds:
   pairs/s and latency percentiles per path;
3. **decision to traffic moved**: the split flipped between 100/0 and 0/100 ``--flips`` times (a spec change: the
   operator writes the route, Traefik applies it); one probe request at a time through the Gateway, each counted at
   the pool that served it (TEI's own ``te_request_count``); per flip, seconds from the change to the route written
   (the operator) and to the first request served by the new pool (the gateway), p50 and p95.

The JSON names the CPU (``cpu``): clients, Traefik, the operator, the control plane and both routers share it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks import tei_serving, trained_fixture
from benchmarks.sampler_overhead import cpu_model
from rerank_devcluster import binaries
from rerank_devcluster.cluster import POD_CIDR, Cluster
from rerank_devcluster.gateway import TraefikGateway, start_gateway
from rerank_devcluster.operator_process import (
    GROUP,
    OPERATOR_NS,
    VERSION,
    OperatorProcess,
    apply_and_wait_established,
    bind_leader_election,
    create_identity,
    install_crds,
    static_pv,
)
from rerank_devcluster.waiting import eventually

NAME, NAMESPACE = "minilm", "gateway-bench"
TEI_PORT = 8080
#: TEI's own default ``--max-batch-tokens``.
TEI_BATCH_TOKENS = 16384
POOLS = {"cpu": {"minReplicas": 1, "maxReplicas": 1},
         "gpu": {"minReplicas": 1, "maxReplicas": 1, "resources": {"limits": {"nvidia.com/gpu": 1}}}}


def log(msg: str) -> None:
    print(f"[gateway_e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def served(router: tei_serving.RouterServer) -> float:
    """TEI's own count of requests a router served (``te_request_count``, every method: a /rerank of several texts
    counts as ``method="batch"``)."""
    with urllib.request.urlopen(router.url + "/metrics", timeout=5) as r:
        return sum(float(line.split()[-1]) for line in r.read().decode().splitlines()
                   if line.startswith("te_request_count{"))


def rerank_body(query: str, texts: list[str]) -> bytes:
    return json.dumps({"query": query, "texts": texts, "raw_scores": True}).encode()


def post(url: str, body: bytes) -> float:
    """One ``/rerank``; its seconds."""
    started = time.monotonic()
    request = urllib.request.Request(url + "/rerank", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        r.read()
        if r.status != 200:
            raise SystemExit(f"{url}: HTTP {r.status}")
    return time.monotonic() - started


def load(url: str, bodies: list[bytes], requests: int, concurrency: int, texts: int) -> dict[str, Any]:
    """``requests`` requests from ``concurrency`` threads (closed loop); pairs/s and latency."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker() -> None:
        for i in counter:
            seconds = post(url, bodies[i % len(bodies)])
            with lock:
                latencies.append(seconds)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    q = statistics.quantiles(latencies, n=100)
    return {"pairs_per_s": round(requests * texts / elapsed, 1), "requests_per_s": round(requests / elapsed, 1),
            "p50_ms": round(q[49] * 1000, 2), "p95_ms": round(q[94] * 1000, 2), "p99_ms": round(q[98] * 1000, 2)}


def held_out(fx: dict[str, Any], texts: int) -> list[bytes]:
    bodies = []
    for line in Path(fx["eval_jsonl"]).read_text().splitlines():
        row = json.loads(line)
        candidates = row.get("texts") or row.get("candidates") or row.get("documents")
        if candidates and len(candidates) >= texts:
            bodies.append(rerank_body(row["query"], list(candidates[:texts])))
    if not bodies:
        raise SystemExit(f"no held-out query with {texts} passages in {fx['eval_jsonl']}")
    return bodies


def model(gw: TraefikGateway, gpu: int) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankModel",
            "metadata": {"name": NAME, "namespace": NAMESPACE},
            "spec": {"model": {"id": "bench/minilm-ce"}, "quantization": {"enabled": False},
                     "storage": {"storageClassName": f"pv-{NAMESPACE}", "reclaimPolicy": "Delete"},
                     "pools": POOLS, "autoscaling": {"enabled": False},
                     "routing": {"policy": "fixed", "weights": {"gpu": gpu, "cpu": 100 - gpu},
                                 "gateway": {"parentRefs": [gw.parent_ref()]}}}}


def route_weights(cluster: Cluster) -> dict[str, int]:
    out = cluster.kubectl_run("get", "httproute", NAME, "-n", NAMESPACE, "-o", "json", check=False)
    if out.returncode != 0:
        return {}
    backends = json.loads(out.stdout)["spec"]["rules"][0]["backendRefs"]
    return {b["name"].rsplit("-", 1)[-1]: int(b.get("weight", 1)) for b in backends}


def pool_pods(cluster: Cluster) -> dict[str, str]:
    """{pool: pod IP} of the Ready pool pods."""
    pods = json.loads(cluster.kubectl_run("get", "pods", "-n", NAMESPACE, "-l",
                                          f"app.kubernetes.io/instance={NAME},rerank.io/pool", "-o", "json").stdout)
    found = {}
    for pod in pods["items"]:
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions") or ())
        if ready and pod["status"].get("podIP"):
            found[pod["metadata"]["labels"]["rerank.io/pool"]] = pod["status"]["podIP"]
    return found


def flip(cluster: Cluster, gw: TraefikGateway, routers: dict[str, tei_serving.RouterServer], gpu: int,
         probe: bytes) -> dict[str, float]:
    """Set the split to ``gpu``/``100 - gpu``; seconds to the route written and to the first request served by the
    pool that now takes everything."""
    to = "gpu" if gpu == 100 else "cpu"
    patch = json.dumps({"spec": {"routing": {"weights": {"gpu": gpu, "cpu": 100 - gpu}}}})
    changed = time.monotonic()
    cluster.kubectl_run("patch", "rerankmodel", NAME, "-n", NAMESPACE, "--type", "merge", "-p", patch)
    written = None
    while True:
        if written is None and route_weights(cluster).get(to) == 100:
            written = time.monotonic() - changed
        before = served(routers[to])
        post(gw.address, probe)
        if served(routers[to]) > before:
            return {"route_written_s": round(written if written is not None else time.monotonic() - changed, 3),
                    "traffic_moved_s": round(time.monotonic() - changed, 3)}
        if time.monotonic() - changed > 60:
            raise SystemExit(f"the traffic did not move to {to} within 60 s")


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50": round(statistics.median(ordered), 3),
            "p95": round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 3),
            "max": round(ordered[-1], 3)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0:
        raise SystemExit("needs root: the pod CIDR is made local to this machine (ip route add local)")
    fx = trained_fixture.make_fixture("minilm-ce")
    work = Path(tempfile.mkdtemp(prefix="gateway-e2e-"))
    dirs, _ = tei_serving.prepare(fx, work, [], threads=2)
    bodies = held_out(fx, args.texts)
    binaries.ensure("traefik")
    subprocess.run(["ip", "route", "replace", "local", POD_CIDR, "dev", "lo"], check=True)
    routers: dict[str, tei_serving.RouterServer] = {}
    try:
        with Cluster.start() as cluster:
            install_crds(cluster)
            apply_and_wait_established(cluster, binaries.gateway_api_crds())
            identity = create_identity(cluster)
            bind_leader_election(cluster, OPERATOR_NS)
            cluster.kubectl_run("create", "namespace", NAMESPACE)
            gw = start_gateway(cluster, namespace=NAMESPACE)
            static_pv(cluster, f"pv-{NAMESPACE}", f"pv-{NAMESPACE}")
            operator = OperatorProcess(cluster, identity, [NAMESPACE]).start()
            try:
                cluster.kubectl_run("apply", "-f", "-", input=json.dumps(model(gw, 100)))
                pods = eventually(lambda: (p if len(p := pool_pods(cluster)) == 2 else None), 180,
                                  "a Ready GPU and CPU pod")
                log(f"pool pods {pods}; starting a TEI router on each")
                routers = {pool: tei_serving.RouterServer(args.router, dirs["fp32"], work / f"router-{ip}.log",
                                                          TEI_BATCH_TOKENS, hostname=ip, port=TEI_PORT)
                           for pool, ip in pods.items()}
                gw.wait_route(NAMESPACE, NAME, timeout=60)
                eventually(lambda: route_weights(cluster).get("gpu") == 100, 60, "the route at 100/0")
                eventually(lambda: post(gw.address, bodies[0]) > 0, 60, "a request through the gateway")
                for url in (routers["gpu"].url, gw.address):  # warm both paths
                    load(url, bodies, 2 * args.concurrency, args.concurrency, args.texts)
                cost: dict[str, list[dict[str, Any]]] = {"direct": [], "gateway": []}
                for _ in range(2):
                    cost["direct"].append(load(routers["gpu"].url, bodies, args.requests, args.concurrency,
                                               args.texts))
                    cost["gateway"].append(load(gw.address, bodies, args.requests, args.concurrency, args.texts))
                log(f"gateway cost: {cost}")
                flips = [flip(cluster, gw, routers, 0 if i % 2 == 0 else 100, bodies[0]) for i in range(args.flips)]
                log(f"flips: {flips}")
            finally:
                operator.stop()
                gw.stop()
    finally:
        for r in routers.values():
            r.close()
        subprocess.run(["ip", "route", "del", "local", POD_CIDR, "dev", "lo"], check=False)
    direct = statistics.median(r["pairs_per_s"] for r in cost["direct"])
    through = statistics.median(r["pairs_per_s"] for r in cost["gateway"])
    return {"benchmark": "gateway_e2e", "cpu": cpu_model(), "cpus": os.cpu_count(), "router": args.router,
            "model": "minilm-ce FP32 ONNX", "gateway": "Traefik (rerank_devcluster.gateway)",
            "texts": args.texts, "concurrency": args.concurrency, "requests": args.requests,
            "gateway_cost": {**cost, "pairs_per_s_direct": direct, "pairs_per_s_gateway": through,
                             "gateway_over_direct": round(through / direct, 3)},
            "decision_to_traffic_moved": {"flips": flips,
                                          "route_written_s": percentiles([f["route_written_s"] for f in flips]),
                                          "traffic_moved_s": percentiles([f["traffic_moved_s"] for f in flips])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--router", required=True, help="a text-embeddings-router built with the ORT backend")
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--texts", type=int, default=8)
    ap.add_argument("--flips", type=int, default=10)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    text = json.dumps(run(args), indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
