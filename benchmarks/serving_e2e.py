"""A real TEI CPU pool in the dev cluster, run by the operator from its image, under real load; prints JSON.

    .venv/bin/python -m benchmarks.serving_e2e --router /path/to/text-embeddings-router [--ort-library PATH]
        [--workdir DIR] [--step-seconds 40] [--fractions 0.3,0.6,0.9,1.2,1.6] [--out FILE]

Opt-in (not in ./hack/test): TEI's source is not on crates.io, so CI cannot build its router. Build one yourself
with the ORT backend from TEI's own sources (``docs/tei-contract.md``; never commit it), then pass it here.
``--ort-library`` defaults to the ``libonnxruntime.so.1.22.0`` of this environment's onnxruntime wheel (TEI 1.9
embeds ONNX Runtime 1.22).

What it does:
1. wraps the router and ONNX Runtime's library in an image on the node's Debian rootfs
   (``rerank_devcluster.nodeimage.tei_image``; a stand-in for TEI's ``cpu-1.9`` image), starts the dev cluster with
   its real node (kubelet + containerd) and imports it;
2. ``helm install``s the chart: the operator runs as a pod on the real node from operator/Dockerfile's image;
3. applies a RerankModel of the trained MiniLM-size cross-encoder (``benchmarks/trained_fixture.py``, minilm-ce)
   whose CPU pool runs that image on the real node (nodeSelector + toleration, 1-CPU limit from a 900m request),
   no GPU pool, autoscaling on (the direct source, 5 s ticks, a short scale-down window so the run sees it);
   the quantization Job runs on the real node from the quantizer image;
4. (a) readiness: when the CPU pod turned Ready vs when TEI said it had loaded the model; (b) threads: the router's
   threads in the pod (from /proc on this machine, the node's host) and the CPU quota of its cgroup, vs the pod's
   CPU limit; (c) a load ramp: open-loop Poisson arrivals of ``/rerank`` requests (8 passages each, the fixture's
   held-out queries) straight to the pool's ready pod IPs in turn (the node has no kube-proxy: this stands in for
   the Service), at fractions of one replica's measured capacity; every ``--tick`` seconds, side by side: the
   client-measured arrival rate, completion rate, p95 and requests in flight, and what the operator's direct
   source computes from the same pods over the same interval (``rerank_operator.adapters.tei_scrape.ScrapePool``,
   the operator's own code: request rate, success rate, te_queue_size, p95 from te_request_duration), with the
   Deployment's replicas and the operator's last decision; (d) the autoscaler scaling the pool 1 -> 2 under the
   overload and back to 1 while traffic still flows (40% of one replica), with the requests that failed in each
   phase (``failed_requests``, and ``unfinished_requests`` still unanswered at the end: a scale-down must lose
   none; the client, like a proxy, learns of a removed pod only at its next refresh, up to one tick late).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import shutil
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rerank_devcluster import binaries, nodeimage, realnode
from rerank_devcluster.cluster import Cluster
from rerank_devcluster.operator_release import OperatorRelease
from rerank_devcluster.waiting import eventually
from rerank_operator.adapters.tei_scrape import ModelTargets, PodTarget, ScrapePool
from rerank_operator.core.autoscale.signals import PoolSignals

NS, MODEL, CLAIM = "bench", "reranker", "models"
OPERATOR_NS, RELEASE = "rerank-system", "rerank-operator"
TEI_PORT = 8080
REAL_NODE_LABEL = "rerank.io/quantize-on-real-node"  # the dev cluster's policy sends this namespace's Job there
TEXTS_PER_REQUEST = 8
_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[serving_e2e {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def default_ort_library() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise SystemExit("no onnxruntime in this environment: pass --ort-library")
    found = sorted(Path(spec.origin).parent.glob("capi/libonnxruntime.so.1.*"))
    if not found:
        raise SystemExit(f"no libonnxruntime.so.1.* next to {spec.origin}: pass --ort-library")
    return found[-1]


# --- the cluster side ---------------------------------------------------------------------------------------------
def volume_objects(volume: Path) -> list[dict[str, Any]]:
    nodes = [realnode.NAME, "kwok-cpu-0", "kwok-cpu-1", "kwok-gpu-0"]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {REAL_NODE_LABEL: "true"}}},
        realnode.local_pv(f"{NS}-models", NS, volume, nodes),
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": CLAIM, "namespace": NS},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": NS, "volumeName": f"{NS}-models",
                  "resources": {"requests": {"storage": "5Gi"}}}},
    ]


def rerank_model(quantizer_image: str, tei_image: str, scale_down_seconds: int) -> dict[str, Any]:
    """The model under test: a CPU pool on the real node (the TEI image), no GPU pool, autoscaling on."""
    return {
        "apiVersion": "rerank.io/v1alpha1", "kind": "RerankModel",
        "metadata": {"name": MODEL, "namespace": NS},
        "spec": {
            "model": {"path": "sources/minilm-ce"},
            "quantization": {"image": quantizer_image, "timeBudgetSeconds": 300,
                             "evaluationData": {"path": "data/eval.jsonl"},
                             "qualityGate": {"minSpearman": 0.98, "minTopKAgreement": 0.85}},
            "storage": {"existingClaim": CLAIM},
            "routing": {"policy": "cpu-only"},
            "pools": {
                "cpu": {"image": tei_image, "minReplicas": 1, "maxReplicas": 2,
                        # 900m: two replicas and the operator fit the node's 2 CPUs; the operator makes the limit 1
                        "resources": {"requests": {"cpu": "900m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                        "nodeSelector": realnode.node_selector(), "tolerations": [realnode.toleration()]},
                "gpu": {"enabled": False, "minReplicas": 0},
            },
            "autoscaling": {"intervalSeconds": 5,
                            "scaleDown": {"stabilizationSeconds": scale_down_seconds, "maxStep": 1,
                                          "cooldownSeconds": scale_down_seconds}},
        },
    }


def kget(cluster: Cluster, *args: str) -> Any:
    out = cluster.kubectl_run("get", *args, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def cpu_pods(cluster: Cluster) -> list[dict[str, Any]]:
    found = kget(cluster, "pods", "-n", NS, "-l",
                 f"app.kubernetes.io/instance={MODEL},app.kubernetes.io/component=cpu-pool")
    return list(found["items"]) if found else []


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod.get("status", {}).get("conditions") or ())


def wait_ready(cluster: Cluster, timeout: float) -> dict[str, Any]:
    last = ""

    def step() -> dict[str, Any] | None:
        nonlocal last
        obj = kget(cluster, "rerankmodel", MODEL, "-n", NS)
        if obj is None:
            return None
        status = obj.get("status") or {}
        conds = {c["type"]: c for c in status.get("conditions") or ()}
        line = f"phase={status.get('phase')} " + " ".join(f"{t}={c['status']}({c.get('reason', '')})"
                                                           for t, c in sorted(conds.items()))
        if line != last:
            log(line)
            last = line
        if status.get("phase") == "Failed":
            raise SystemExit(f"the model failed: {conds.get('Ready')}")
        current = status.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and conds.get("Ready", {}).get("status") == "True" else None

    result: dict[str, Any] = eventually(step, timeout, "the RerankModel to be Ready", every=2, error=SystemExit)
    return result


def tei_log(cluster: Cluster, pod: str) -> list[dict[str, Any]]:
    out = cluster.kubectl_run("logs", "-n", NS, pod, "-c", "tei", "--timestamps", check=False).stdout
    lines = []
    for raw in out.splitlines():
        stamp, _, rest = raw.partition(" ")
        try:
            rec = json.loads(rest)
        except json.JSONDecodeError:
            rec = {"text": rest}
        if isinstance(rec, dict):
            rec["_kubelet_time"] = stamp
            lines.append(rec)
    return lines


def _message(rec: dict[str, Any]) -> str:
    fields = rec.get("fields") if isinstance(rec.get("fields"), dict) else {}
    return str((fields or {}).get("message", rec.get("message", rec.get("text", ""))))


def _iso(ts: str) -> float:
    """Seconds since the epoch from an RFC 3339 time (kubelet's nanosecond stamps or the API's seconds)."""
    from datetime import datetime

    head = re.sub(r"(\.\d{6})\d+", r"\1", ts.replace("Z", "+00:00"))
    return datetime.fromisoformat(head).timestamp()


def readiness_check(cluster: Cluster, pod: dict[str, Any]) -> dict[str, Any]:
    """(a) Did the pod turn Ready only once TEI had loaded the model? TEI logs "Ready" after the model is loaded
    and its HTTP server listens; before that /health has nothing listening, so the probe fails."""
    name = pod["metadata"]["name"]
    records = tei_log(cluster, name)
    loaded = next((r for r in records if _message(r).strip() == "Ready"), None)
    container = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "tei")
    started = _iso(container["state"]["running"]["startedAt"])
    ready_at = next(_iso(c["lastTransitionTime"]) for c in pod["status"]["conditions"] if c["type"] == "Ready")
    loaded_at = _iso(loaded["_kubelet_time"]) if loaded else None
    probes = {k: pod["spec"]["containers"][0].get(k) for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    return {
        "pod": name,
        "container_started_to_tei_ready_s": round(loaded_at - started, 2) if loaded_at else None,
        "container_started_to_pod_ready_s": round(ready_at - started, 2),
        # the API's condition time has whole seconds: Ready may read up to 1 s before the log line's nanoseconds
        "pod_ready_after_model_loaded": loaded_at is not None and ready_at >= int(loaded_at),
        "tei_startup_log": [_message(r) for r in records[:25]],
        "probes": probes,
    }


def _router_pids() -> list[int]:
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().strip().startswith("text-embedding"):
                pids.append(int(comm.parent.name))
        except OSError:
            continue
    return pids


def _cgroup_cpu(pid: int) -> dict[str, Any]:
    """The CPU quota the kernel enforces on ``pid`` (cgroup v1 cpu controller), in CPUs."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            base = next((Path("/sys/fs/cgroup") / d for d in ("cpu,cpuacct", "cpu")
                         if (Path("/sys/fs/cgroup") / d / path.lstrip("/") / "cpu.cfs_quota_us").exists()), None)
            if base is None:
                return {"cgroup": path}
            quota = int((base / path.lstrip("/") / "cpu.cfs_quota_us").read_text())
            period = int((base / path.lstrip("/") / "cpu.cfs_period_us").read_text())
            return {"cgroup": path, "quota_cpus": round(quota / period, 3) if quota > 0 else None}
    return {}


def threads_check(cluster: Cluster, pod: dict[str, Any], limit_cpus: int) -> dict[str, Any]:
    """(b) TEI's threads in a pod with a CPU limit: ONNX Runtime's intra-op pool and the tokenization workers are
    sized by ``num_cpus`` (cgroup quota aware). Counted from /proc: the node is this machine."""
    uid = pod["metadata"]["uid"]
    pids = [p for p in _router_pids() if uid.replace("-", "_") in Path(f"/proc/{p}/cgroup").read_text()
            or uid in Path(f"/proc/{p}/cgroup").read_text()]
    if not pids:
        return {"error": f"no router process of pod {pod['metadata']['name']} found in /proc"}
    pid = pids[0]
    names: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with_name = (task / "comm").read_text().strip()
        names[with_name] = names.get(with_name, 0) + 1
    records = tei_log(cluster, pod["metadata"]["name"])
    workers = next((int(m.group(1)) for r in records
                    if (m := re.search(r"Starting (\d+) tokenization workers", _message(r)))), None)
    import os

    return {"pod_cpu_limit": limit_cpus, "host_cpus": os.cpu_count(), "cgroup": _cgroup_cpu(pid),
            "tokenization_workers": workers, "threads_total": sum(names.values()), "threads_by_name": names,
            "tokenization_workers_follow_limit": workers == max(limit_cpus - 1, 1) if workers else None}


# --- the client side ----------------------------------------------------------------------------------------------
@dataclass
class Request:
    sent: float
    done: float | None = None
    ok: bool = False
    pod: str = ""


@dataclass
class Client:
    """Open-loop Poisson arrivals at ``rate`` requests/s, each one ``/rerank`` to the next ready pod in turn."""

    groups: list[tuple[str, list[str]]]
    workers: int = 256
    rate: float = 0.0
    pods: list[tuple[str, str]] = field(default_factory=list)  # (name, ip) of ready pods
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="client")
        self.thread = threading.Thread(target=self._arrivals, daemon=True)
        self.thread.start()

    def _arrivals(self) -> None:
        rng, turn, next_at = random.Random(7), 0, time.monotonic()
        while not self.stop.is_set():
            if self.rate <= 0 or not self.pods:
                time.sleep(0.05)
                next_at = time.monotonic()
                continue
            next_at += rng.expovariate(self.rate)
            time.sleep(max(0.0, next_at - time.monotonic()))
            pod = self.pods[turn % len(self.pods)]
            query, texts = self.groups[turn % len(self.groups)]
            turn += 1
            self.pool.submit(self._send, pod, query, texts)

    def _send(self, pod: tuple[str, str], query: str, texts: list[str]) -> None:
        req = Request(sent=time.monotonic(), pod=pod[0])
        with self.lock:
            self.requests.append(req)
        body = json.dumps({"query": query, "texts": texts}).encode()
        try:
            call = urllib.request.Request(f"http://{pod[1]}:{TEI_PORT}/rerank", data=body,
                                          headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(call, timeout=300) as resp:
                resp.read()
            req.ok = True
        except (OSError, urllib.error.HTTPError):
            req.ok = False
        req.done = time.monotonic()

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Client-side figures for (start, end]."""
        with self.lock:
            reqs = list(self.requests)
        span = end - start
        sent = [r for r in reqs if start < r.sent <= end]
        done = [r for r in reqs if r.done is not None and start < r.done <= end]
        latencies = [(r.done - r.sent) * 1e3 for r in done if r.ok and r.done is not None]
        in_flight = [r for r in reqs if r.sent <= end and (r.done is None or r.done > end)]
        return {"arrival_rps": round(len(sent) / span, 3), "completion_rps": round(len(done) / span, 3),
                "ok_rps": round(sum(r.ok for r in done) / span, 3), "failed": sum(not r.ok for r in done),
                "p50_ms": _r(percentile(latencies, 50)), "p95_ms": _r(percentile(latencies, 95)),
                "in_flight": len(in_flight), "in_flight_pairs": len(in_flight) * TEXTS_PER_REQUEST}

    def close(self) -> None:
        self.stop.set()
        if hasattr(self, "pool"):
            self.pool.shutdown(wait=False, cancel_futures=True)


def _r(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def closed_loop_capacity(groups: list[tuple[str, list[str]]], ip: str, seconds: float, clients: int = 2) -> float:
    """Requests/s one replica completes with ``clients`` requests always in flight (no queue to speak of)."""
    end = time.monotonic() + seconds
    done = [0] * clients

    def loop(i: int) -> None:
        turn = i
        while time.monotonic() < end:
            query, texts = groups[turn % len(groups)]
            turn += clients
            call = urllib.request.Request(f"http://{ip}:{TEI_PORT}/rerank",
                                          data=json.dumps({"query": query, "texts": texts}).encode(),
                                          headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(call, timeout=120) as resp:
                resp.read()
            done[i] += 1

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as ex:
        list(ex.map(loop, range(clients)))
    return sum(done) / (time.monotonic() - started)


# --- the ramp -----------------------------------------------------------------------------------------------------
def operator_view(cluster: Cluster) -> dict[str, Any]:
    dep = kget(cluster, "deployment", f"{MODEL}-cpu", "-n", NS) or {}
    model = kget(cluster, "rerankmodel", MODEL, "-n", NS) or {}
    auto = (model.get("status") or {}).get("autoscaling") or {}
    decision = auto.get("lastDecision") or {}
    return {"replicas": (dep.get("spec") or {}).get("replicas"),
            "ready_replicas": (dep.get("status") or {}).get("readyReplicas", 0),
            "decision": decision.get("reason"), "decided_at": decision.get("time"),
            "recorded_signals": (auto.get("signals") or {}).get("cpu")}


def signals_row(s: PoolSignals) -> dict[str, Any]:
    return {"request_rps": _r(s.request_rate, 3), "success_rps": _r(s.success_rate, 3),
            "queue_pairs": _r(s.queue_size), "p95_ms": _r(s.latency_p95_ms), "p50_ms": _r(s.latency_p50_ms),
            "queue_time_p95_ms": _r(s.queue_time_p95_ms), "pair_rate": _r(s.pair_rate), "error": s.error}


@dataclass
class Ramp:
    cluster: Cluster
    client: Client
    tick: float
    scrape: ScrapePool = field(default_factory=lambda: ScrapePool(timeout_seconds=3.0))
    rows: list[dict[str, Any]] = field(default_factory=list)
    last: float = field(default_factory=time.monotonic)

    def refresh_pods(self) -> list[dict[str, Any]]:
        pods = [p for p in cpu_pods(self.cluster) if ready(p) and p["status"].get("podIP")
                and not p["metadata"].get("deletionTimestamp")]
        self.client.pods = [(p["metadata"]["name"], p["status"]["podIP"]) for p in pods]
        return pods

    def one_tick(self, phase: str) -> dict[str, Any]:
        time.sleep(max(0.0, self.last + self.tick - time.monotonic()))
        pods = self.refresh_pods()
        targets = tuple(PodTarget(p["metadata"]["name"], "cpu", p["status"]["podIP"], TEI_PORT) for p in pods)
        now = time.monotonic()
        signals = self.scrape.collect({(NS, MODEL): ModelTargets(targets, {"cpu": len(pods), "gpu": 0})},
                                      3.0)[(NS, MODEL)].cpu
        row: dict[str, Any] = {"t": round(now - _T0, 1), "phase": phase, "target_rps": round(self.client.rate, 3),
                               "client": self.client.window(self.last, now), "operator_source": signals_row(signals),
                               "operator": operator_view(self.cluster)}
        self.last = now
        self.rows.append(row)
        c, o, k = row["client"], row["operator_source"], row["operator"]
        log(f"{phase:>10} rate {row['target_rps']:5.2f} | client in {c['arrival_rps']:5.2f} out "
            f"{c['completion_rps']:5.2f} p95 {c['p95_ms']} inflight {c['in_flight']} | operator source in "
            f"{o['request_rps']} out {o['success_rps']} p95 {o['p95_ms']} queue {o['queue_pairs']} | replicas "
            f"{k['replicas']}/{k['ready_replicas']} {(k['decision'] or '')[:60]}")
        return row

    def hold(self, phase: str, seconds: float, until: Callable[[dict[str, Any]], bool] | None = None) -> bool:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            row = self.one_tick(phase)
            if until is not None and until(row):
                return True
        return False


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How each signal the policy uses tracks the client's figure, over ticks with traffic and a complete sample
    (rates within 10%, p95 within 25% are the issue's bar)."""
    def ratios(client_key: str, source_key: str) -> list[float]:
        out = []
        for r in rows:
            c, s = r["client"].get(client_key), r["operator_source"].get(source_key)
            if c and s is not None and r["client"]["arrival_rps"] > 0:
                out.append(s / c)
        return out

    def summary(values: list[float], tolerance: float) -> dict[str, Any]:
        if not values:
            return {"ticks": 0}
        return {"ticks": len(values), "median_ratio": round(statistics.median(values), 3),
                "within": round(sum(abs(v - 1) <= tolerance for v in values) / len(values), 3),
                "tolerance": tolerance, "min": round(min(values), 3), "max": round(max(values), 3)}

    return {"request_rate_vs_arrivals": summary(ratios("arrival_rps", "request_rps"), 0.10),
            "success_rate_vs_completions": summary(ratios("ok_rps", "success_rps"), 0.10),
            "p95_vs_client_p95": summary(ratios("p95_ms", "p95_ms"), 0.25),
            "queue_pairs_vs_client_in_flight_pairs": summary(ratios("in_flight_pairs", "queue_pairs"), 0.25)}


def scale_events(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    last: tuple[Any, Any] | None = None
    for r in rows:
        key = (r["operator"]["replicas"], r["operator"]["ready_replicas"])
        if key != last:
            events.append({"t": r["t"], "phase": r["phase"], "replicas": key[0], "ready": key[1],
                           "decision": r["operator"]["decision"]})
            last = key
    return events


def failures(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Requests that failed, by the phase in which they completed (a scale-down must lose none)."""
    out: dict[str, int] = {}
    for r in rows:
        out[r["phase"]] = out.get(r["phase"], 0) + r["client"]["failed"]
    return out


def load_groups(eval_jsonl: Path) -> list[tuple[str, list[str]]]:
    groups = []
    for line in eval_jsonl.read_text().splitlines():
        rec = json.loads(line)
        groups.append((rec["query"], list(rec["texts"])[:TEXTS_PER_REQUEST]))
    return groups


@dataclass
class Stack:
    """The dev cluster with its real node, the TEI image in its registry, the chart released, and the MiniLM
    fixture's model Ready on a CPU pool of that image (``serve``): what this benchmark and ``serving_wake`` run on."""

    router: Path
    ort: Path
    archive: Path
    tei: str
    workdir: Path
    groups: list[tuple[str, list[str]]]
    result: dict[str, Any]
    started: float = 0.0

    @classmethod
    def prepare(cls, router: Path, ort_library: Path | None, workdir: Path) -> Stack:
        from benchmarks import trained_fixture  # untyped: not followed by mypy (pyproject.toml), so Any here

        fixture = trained_fixture.make_fixture("minilm-ce")
        ort = (ort_library or default_ort_library()).resolve()
        archive, tei = nodeimage.tei_image(router.resolve(), ort)
        log(f"TEI image {tei} ({archive.stat().st_size >> 20} MiB archive; router {router}, {ort.name})")
        workdir = workdir.resolve()
        shutil.rmtree(workdir, ignore_errors=True)
        volume = workdir / "volume"
        shutil.copytree(fixture["model_dir"], volume / "sources" / "minilm-ce")
        (volume / "data").mkdir(parents=True)
        shutil.copy(fixture["eval_jsonl"], volume / "data" / "eval.jsonl")
        result: dict[str, Any] = {"tei_image": tei, "router": str(router), "ort_library": ort.name,
                                  "model": "trained_fixture minilm-ce", "texts_per_request": TEXTS_PER_REQUEST}
        return cls(router, ort, archive, tei, workdir, load_groups(volume / "data" / "eval.jsonl"), result)

    def start(self) -> Cluster:
        self.started = time.monotonic()
        cluster = Cluster.start(self.workdir / "cluster", real_node=True, timeout=900)
        cluster.keep_workdir = True
        return cluster

    def serve(self, cluster: Cluster, model: Callable[[str, str], dict[str, Any]],
              release_values: dict[str, Any] | None = None) -> dict[str, Any]:
        """Push the TEI image, release the chart (``release_values`` on top), apply ``model(quantizer image, TEI
        image)`` and wait until it is Ready; returns the model."""
        assert cluster.real_node is not None
        repository, _, tag = self.tei.rpartition(":")
        self.tei = cluster.real_node.push_image(self.archive,
                                                f"{nodeimage.REGISTRY_PREFIX}/{repository.rsplit('/', 1)[-1]}",
                                                tag)  # the node pulls it from the registry, as it pulls the others
        self.result["tei_image"] = self.tei
        self.result["cluster_start_s"] = round(time.monotonic() - self.started, 1)
        cluster.apply(realnode.quantizer_placement_policy(REAL_NODE_LABEL))
        cluster.apply(volume_objects(self.workdir / "volume"))  # the namespace first: the chart's Roles go into it
        release = OperatorRelease(cluster, OPERATOR_NS, RELEASE, cluster.real_node.images.operator.name,
                                  watch_namespaces=[NS], extra_values=release_values or {})
        release.install(self.workdir, timeout=240)
        applied = time.monotonic()
        cluster.apply([model(cluster.real_node.images.quantizer_image, self.tei)])
        obj = wait_ready(cluster, 1200)
        self.result["apply_to_ready_s"] = round(time.monotonic() - applied, 1)
        self.result["artifact"] = {k: obj["status"]["artifact"].get(k) for k in ("id", "recipe", "quality", "speed")}
        return obj


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--router", type=Path, required=True, help="a text-embeddings-router built with the ORT backend")
    ap.add_argument("--ort-library", type=Path, default=None)
    ap.add_argument("--workdir", type=Path, default=binaries.REPO_ROOT / ".serving-e2e")
    ap.add_argument("--tick", type=float, default=5.0)
    ap.add_argument("--step-seconds", type=float, default=40.0)
    ap.add_argument("--fractions", default="0.3,0.6,0.9,1.2,1.6")
    ap.add_argument("--scale-down-seconds", type=int, default=30)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    stack = Stack.prepare(args.router, args.ort_library, args.workdir)
    groups, result = stack.groups, stack.result
    cluster = stack.start()
    client = Client(groups)
    try:
        stack.serve(cluster, lambda quantizer, tei: rerank_model(quantizer, tei, args.scale_down_seconds))
        pods = [p for p in cpu_pods(cluster) if ready(p)]
        result["readiness"] = readiness_check(cluster, pods[0])
        result["threads"] = threads_check(cluster, pods[0], 1)
        log(f"readiness {json.dumps(result['readiness'])[:300]}")
        log(f"threads {json.dumps(result['threads'])}")

        ip = pods[0]["status"]["podIP"]
        closed_loop_capacity(groups, ip, 5)  # warm-up
        capacity = closed_loop_capacity(groups, ip, 20)
        result["one_replica_capacity_rps"] = round(capacity, 3)
        log(f"one replica, 2 clients closed loop: {capacity:.2f} requests/s")

        ramp = Ramp(cluster, client, args.tick)
        ramp.refresh_pods()
        client.start()
        ramp.one_tick("prime")
        for fraction in (float(f) for f in args.fractions.split(",")):
            client.rate = capacity * fraction
            ramp.hold(f"x{fraction:g}", args.step_seconds)
        scaled_up = ramp.hold("overload", 180, until=lambda r: (r["operator"]["ready_replicas"] or 0) >= 2)
        if scaled_up:
            ramp.hold("two-ready", args.step_seconds)
        # Scale down while traffic still flows (one replica's 40%): the removed pod must finish what it was sent.
        client.rate = capacity * 0.4
        scaled_down = ramp.hold("drain", 120 + 4 * args.scale_down_seconds,
                                until=lambda r: r["operator"]["replicas"] == 1)
        ramp.hold("after-drain", 4 * args.tick)
        client.rate = 0.0
        ramp.hold("idle", 300, until=lambda r: r["client"]["in_flight"] == 0)
        # A request still unanswered here hung (e.g. sent to a pod that was gone): as lost as a failed one.
        unfinished = ramp.rows[-1]["client"]["in_flight"]
        result.update({"scaled_up_to_2": scaled_up, "scaled_back_to_1_under_load": scaled_down,
                       "failed_requests": failures(ramp.rows), "unfinished_requests": unfinished,
                       "scale_events": scale_events(ramp.rows),
                       "agreement": agreement(ramp.rows), "ticks": ramp.rows})
    finally:
        client.close()
        cluster.stop()
    return emit(result, args.out)


def emit(result: dict[str, Any], out: Path | None) -> int:
    """Print the result as JSON (and write it to ``out``)."""
    text = json.dumps(result, indent=1)
    if out:
        out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
