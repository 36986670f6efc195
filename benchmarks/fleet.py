"""Fleet benchmark: N RerankModels in M namespaces, autoscaling on, on the dev cluster (kwok nodes); prints JSON.

    .venv/bin/python -m benchmarks.fleet --models 1000 [--namespaces 100] [--metrics-source direct|prometheus]
                                         [--replicas 1|2] [--steady-window 60] [--operator-ref HEAD]
                                         [--idle [--idle-seconds 30] [--activator-hold 5]]

What it measures (progress on stderr, one JSON object on stdout):

- bring-up: N applies in a burst (``--apply-concurrency`` clients); the operator creates one quantization Job per
  model; this process finishes each quantizer pod as soon as kwok runs it, with the "published" termination message
  of the cluster tests (``rerank_devcluster.operator_process.publish_status``), and waits until every model is Ready.
  apply->Job latency is the API server's: from its audit log, the model's create received -> the operator's Job
  create answered (one clock, microseconds; ``apply_to_job_s``); ``apply_to_job_seen_here_s`` is the time this
  process saw the Job on its own watch minus the time the model's create call returned (``time.monotonic()``), which
  adds the API server's watch delivery to this process (~1.3 s in a 300-model burst on 2 cores).
- steady state: once all are Ready and the operator has made no write for ``--settle-quiet`` seconds, a window of
  ``--steady-window`` seconds: the operator's API requests by verb from the API server's audit log (the dev cluster
  logs every request of the operator's ServiceAccount; watches are counted apart: opened, by ResponseStarted), its
  CPU seconds per second and RSS from /proc/<pid>, fake TEI scrapes per second, and PromQL queries per second with
  ``--metrics-source prometheus`` (the operator's ``rerank_operator_promql_queries_total`` if it has one, else the
  Prometheus server's ``prometheus_engine_query_duration_seconds_count``).
- failover (``--replicas 2``): two operators with ``--leader-election``; the leader (gauge ``rerank_operator_leader``
  on its metrics port) is SIGKILLed, one model's spec is changed at that moment, and the time until the standby leads,
  until its counters move, and until the change reaches the model's Deployment is measured; then every model must be
  Ready with one Job per model and artifact.

- idle (``--idle``): every model may go to zero (CPU pool minReplicas 0, no GPU pool, ``idleSeconds``
  ``--idle-seconds``, an HTTPRoute to a Gateway that does not exist) and gets no request at all (the fake TEI serves
  zero counters); the cluster has the Gateway API CRDs, the operator the activator flags and rbac_activator.yaml's
  Role, and the activator runs in this process (``rerank_activator.server.start``). After the bring-up, the time
  until every CPU Deployment is at 0 replicas and no pool pod is left (``idle_after_s``, from the last model Ready),
  then the steady window above with zero pods, then ``idle_pods`` and ``models_at_zero`` (lastDecision.scaleToZero
  "asleep"); last, one model is woken by a request sent as the Gateway would (the headers of its HTTPRoute, to the
  activator): ``wake_scale_s`` from the request to its CPU Deployment at 1 replica (the operator's part of a wake).
  kwok pods serve nothing, so the held request is answered 503 once its hold (``--activator-hold``) runs out.

- shared artifacts (``--distinct-models K``): a RerankClass with an ``artifactStore`` (a real distribution registry,
  started here, and the store's namespace); model i serves hub model ``bench/reranker-<i mod K>`` with no hub token,
  so the N models ask for K artifacts. This process plays each shared Job's quantizer: it pushes a small artifact to
  the registry with the quantizer's own push code and ends the pod with the result. The first K models (one per
  artifact) are applied first and made Ready; then the other N - K in one burst, whose artifacts exist
  (``ready_after_first_burst_s``: apply -> Ready, the API server's queue of the burst included); after the steady
  window, ``--late-models`` tenants arrive one at a time (``ready_after_first_s``: the model's create call returned
  -> its Ready seen here).
  ``jobs`` counts every quantization Job in the cluster, ``artifacts`` the store's tags.

Direct metrics: kwok pods have no network, so every pool pod's /metrics is served by one local fake TEI endpoint
(``rerank_devcluster.fake_tei.SteadyTei``: constant light load) through ``rerank_devcluster.scrape_redirect``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from quantizer_job import oci, store
from rerank_activator import server as activator_server
from rerank_devcluster import binaries
from rerank_devcluster import operator_process as op
from rerank_devcluster.cluster import Cluster, finished_pod_status, free_port
from rerank_devcluster.fake_tei import MetricsServer, SteadyTei
from rerank_devcluster.processes import Processes
from rerank_devcluster.registry import LocalRegistry
from rerank_devcluster.scrape_redirect import ANY_POD
from rerank_operator.core.autoscale.zero import DRAIN_SECONDS

REPO = Path(__file__).resolve().parents[1]
STORAGE_CLASS = "fleet-bench"
NS_PREFIX = "fleet-"
LEASE_NS, LEASE_NAME = op.OPERATOR_NS, "rerank-operator"
POOL_LABEL, INSTANCE_LABEL = "rerank.io/pool", "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
GATEWAY_API = "/apis/gateway.networking.k8s.io/v1"
#: --idle: the activator's Service as the operator names it in the routes (``--activator-service``), and the Role of
#: rbac_activator.yaml (the chart's) in the operator's namespace.
ACTIVATOR_SERVICE = "rerank-activator"
RBAC_ACTIVATOR = REPO / "operator" / "rerank_operator" / "rbac_activator.yaml"
#: The autoscaler's per-pool signals read from Prometheus (rerank_operator.adapters.prometheus_api.queries).
PROMQL_SIGNALS = 9
#: --distinct-models: the store's namespace, repository and class (RerankClass spec.artifactStore).
STORE_NS, STORE_REPOSITORY, SHARED_CLASS = "rerank-artifacts", "rerank/artifacts", "fleet-shared"
SHARED_LABEL = "rerank.io/shared"
TARGETS = {
    "ready_after_jobs_finished_s": 120.0,
    "apply_to_job_p95_s": 3.0,
    "steady_requests_per_s": 20.0,
    "steady_writes": 0.0,
    "promql_queries_per_signal_per_tick": 1.0,
    "rss_mb": 300.0,
    "cpu_cores": 0.5,
    "failover_s": 15.0,
    "idle_pods": 0.0,
    "ready_after_first_p95_s": 10.0,
}

_T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[fleet {time.monotonic() - _T0:7.1f}s] {msg}", file=sys.stderr, flush=True)


def quantiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    s = sorted(values)

    def q(p: float) -> float:
        return round(s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))], 3)

    return {"n": len(s), "p50": q(0.5), "p95": q(0.95), "max": round(s[-1], 3)}


# --- the API, without a client library: cheap on a 2-core machine that also runs the cluster -----------------------

class Api:
    """JSON over HTTPS with the admin identity; one connection per thread."""

    def __init__(self, cluster: Cluster) -> None:
        pki = cluster.workdir / "pki"
        self.ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        url = urllib.parse.urlparse(cluster.server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.local = threading.local()

    def connect(self, timeout: float = 30) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(3):
            conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = self.connect()
            try:
                conn.request(method, path, body=data, headers={"Content-Type": content_type,
                                                                "Accept": "application/json"})
                resp = conn.getresponse()
                raw = resp.read()
                return resp.status, json.loads(raw) if raw[:1] == b"{" else raw.decode(errors="replace")
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def ok(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        status, out = self.call(method, path, body, content_type)
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {str(out)[:300]}")
        return out

    def watch(self, path: str, handle: Callable[[str, dict[str, Any], float], None], stop: threading.Event,
              query: dict[str, str] | None = None) -> threading.Thread:
        """Watch ``path`` in a daemon thread until ``stop``: ``handle(type, object, time.monotonic())`` for each
        event. Starts with ADDED for what exists; resumes from the last resourceVersion, or from scratch after 410."""

        def run() -> None:
            rv = ""
            while not stop.is_set():
                params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "240", **(query or {})}
                if rv:
                    params["resourceVersion"] = rv
                conn = self.connect(timeout=300)
                try:
                    conn.request("GET", f"{path}?{urllib.parse.urlencode(params)}",
                                 headers={"Accept": "application/json"})
                    resp = conn.getresponse()
                    if resp.status != 200:
                        resp.read()
                        rv = ""
                        time.sleep(1)
                        continue
                    for line in resp:
                        if stop.is_set():
                            break
                        event = json.loads(line)
                        obj = event.get("object") or {}
                        if event.get("type") == "ERROR":
                            rv = ""
                            break
                        rv = obj.get("metadata", {}).get("resourceVersion", rv)
                        if event.get("type") != "BOOKMARK":
                            handle(event["type"], obj, time.monotonic())
                except (OSError, http.client.HTTPException, ValueError):
                    time.sleep(0.5)
                finally:
                    conn.close()

        thread = threading.Thread(target=run, daemon=True, name=f"watch {path}")
        thread.start()
        return thread


# --- what the benchmark sees ------------------------------------------------------------------------------------------

Key = tuple[str, str]  # (namespace, model name)


@dataclass
class Fleet:
    """Everything the watches saw, by model; times are ``time.monotonic()`` on receipt."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    applied: dict[Key, float] = field(default_factory=dict)
    job_seen: dict[Key, float] = field(default_factory=dict)
    jobs: dict[Key, set[tuple[str, str]]] = field(default_factory=dict)  # model -> {(job name, artifact)}
    pod_running: dict[Key, float] = field(default_factory=dict)
    finishing: set[str] = field(default_factory=set)  # quantizer pod uids handed to a finisher
    finished: dict[Key, float] = field(default_factory=dict)
    ready_now: dict[Key, bool] = field(default_factory=dict)
    first_ready: dict[Key, float] = field(default_factory=dict)
    autoscaling: dict[Key, str] = field(default_factory=dict)  # json of status.autoscaling
    autoscaling_changed: float = 0.0
    pool_pods: dict[Key, str] = field(default_factory=dict)  # (ns, pod) -> pool
    pods_changed: float = 0.0
    finish_errors: int = 0
    # --idle: pool pods until DELETED (terminating ones included), the CPU Deployments' spec.replicas, the models'
    # lastDecision.scaleToZero.
    pool_pods_present: dict[tuple[str, str], Key] = field(default_factory=dict)
    pool_pod_deleted: float = 0.0
    pool_pod_added: dict[Key, float] = field(default_factory=dict)
    cpu_replicas: dict[Key, int] = field(default_factory=dict)
    cpu_replicas_changed: dict[Key, float] = field(default_factory=dict)
    zero_phase: dict[Key, str | None] = field(default_factory=dict)
    phase_transitions: Counter[str] = field(default_factory=Counter)  # "asleep->waking": n, as the watch saw them
    woken: list[tuple[Key, float]] = field(default_factory=list)  # each model seen going to "waking", and when

    def ready_count(self) -> int:
        with self.lock:
            return sum(1 for v in self.ready_now.values() if v)


def owner_key(obj: dict[str, Any]) -> Key | None:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace", "")
    name = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    return (ns, name) if ns.startswith(NS_PREFIX) and name else None


def zero_phase(model: dict[str, Any]) -> str | None:
    """The model's scale-to-zero phase (status.autoscaling.lastDecision.scaleToZero): awake, draining, asleep, ..."""
    decision = ((model.get("status") or {}).get("autoscaling") or {}).get("lastDecision") or {}
    phase = decision.get("scaleToZero")
    return str(phase) if phase is not None else None


def route_backends(route: dict[str, Any]) -> list[tuple[str | None, str]]:
    """(namespace, name) of each backendRef of the route's first rule."""
    rules = (route.get("spec") or {}).get("rules") or [{}]
    return [(r.get("namespace"), r["name"]) for r in rules[0].get("backendRefs") or ()]


def route_headers(route: dict[str, Any]) -> dict[str, str]:
    """The headers the route's first rule sets (RequestHeaderModifier): what the Gateway adds to each request."""
    rules = (route.get("spec") or {}).get("rules") or [{}]
    return {h["name"]: h["value"] for f in rules[0].get("filters") or ()
            for h in (f.get("requestHeaderModifier") or {}).get("set") or ()}


def is_ready(model: dict[str, Any]) -> bool:
    status = model.get("status") or {}
    if status.get("observedGeneration") != model.get("metadata", {}).get("generation"):
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())


class Watches:
    def __init__(self, api: Api, fleet: Fleet, finish: Callable[[dict[str, Any]], None], idle: bool = False,
                 finish_shared: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.api, self.fleet, self.finish, self.idle = api, fleet, finish, idle
        self.finish_shared = finish_shared
        self.stop = threading.Event()

    def start(self) -> None:
        self.api.watch("/apis/batch/v1/jobs", self.on_job, self.stop,
                       {"labelSelector": f"{COMPONENT_LABEL}=quantizer"})
        self.api.watch("/api/v1/pods", self.on_pod, self.stop)
        self.api.watch(f"/apis/{op.GROUP}/{op.VERSION}/{op.PLURAL}", self.on_model, self.stop)
        if self.idle:
            self.api.watch("/apis/apps/v1/deployments", self.on_deployment, self.stop,
                           {"labelSelector": f"{POOL_LABEL}=cpu"})

    def on_deployment(self, kind: str, dep: dict[str, Any], now: float) -> None:
        key = owner_key(dep)
        if key is None:
            return
        replicas = -1 if kind == "DELETED" else int((dep.get("spec") or {}).get("replicas", 1))
        with self.fleet.lock:
            if self.fleet.cpu_replicas.get(key) != replicas:
                self.fleet.cpu_replicas[key] = replicas
                self.fleet.cpu_replicas_changed[key] = now

    def on_job(self, kind: str, job: dict[str, Any], now: float) -> None:
        key = owner_key(job)
        if key is None or kind == "DELETED":
            return
        meta = job["metadata"]
        with self.fleet.lock:
            self.fleet.job_seen.setdefault(key, now)
            self.fleet.jobs.setdefault(key, set()).add((meta["name"], meta["labels"].get(op.ARTIFACT_LABEL, "")))

    def on_pod(self, kind: str, pod: dict[str, Any], now: float) -> None:
        key = owner_key(pod)
        meta = pod["metadata"]
        if key is None and (meta.get("labels") or {}).get(SHARED_LABEL) == "true" and self.finish_shared:
            if kind != "DELETED" and (pod.get("status") or {}).get("phase") == "Running":
                with self.fleet.lock:
                    if meta["uid"] in self.fleet.finishing:
                        return
                    self.fleet.finishing.add(meta["uid"])
                self.finish_shared(pod)
            return
        if key is None:
            return
        meta, status = pod["metadata"], pod.get("status") or {}
        labels = meta.get("labels") or {}
        if labels.get(POOL_LABEL):
            pod_key = (meta["namespace"], meta["name"])
            with self.fleet.lock:
                if kind == "DELETED":
                    if self.fleet.pool_pods_present.pop(pod_key, None) is not None:
                        self.fleet.pool_pod_deleted = now
                elif pod_key not in self.fleet.pool_pods_present:
                    self.fleet.pool_pods_present[pod_key] = key
                    self.fleet.pool_pod_added[key] = now
                gone = kind == "DELETED" or bool(meta.get("deletionTimestamp"))
                if gone and pod_key in self.fleet.pool_pods:
                    del self.fleet.pool_pods[pod_key]
                    self.fleet.pods_changed = now
                elif not gone and pod_key not in self.fleet.pool_pods:
                    self.fleet.pool_pods[pod_key] = labels[POOL_LABEL]
                    self.fleet.pods_changed = now
            return
        if labels.get(COMPONENT_LABEL) != "quantizer" or kind == "DELETED" or status.get("phase") != "Running":
            return
        with self.fleet.lock:
            self.fleet.pod_running.setdefault(key, now)
            if meta["uid"] in self.fleet.finishing:
                return
            self.fleet.finishing.add(meta["uid"])
        self.finish(pod)

    def on_model(self, kind: str, model: dict[str, Any], now: float) -> None:
        meta = model["metadata"]
        if not meta.get("namespace", "").startswith(NS_PREFIX):
            return
        key = (meta["namespace"], meta["name"])
        ready = kind != "DELETED" and is_ready(model)
        autoscaling = json.dumps((model.get("status") or {}).get("autoscaling"), sort_keys=True)
        with self.fleet.lock:
            self.fleet.ready_now[key] = ready
            phase = zero_phase(model) if kind != "DELETED" else None
            before = self.fleet.zero_phase.get(key)
            if before is not None and phase is not None and phase != before:
                self.fleet.phase_transitions[f"{before}->{phase}"] += 1
                if phase == "waking":
                    self.fleet.woken.append((key, now))
            self.fleet.zero_phase[key] = phase
            if ready:
                self.fleet.first_ready.setdefault(key, now)
            if self.fleet.autoscaling.get(key, autoscaling) != autoscaling:
                self.fleet.autoscaling_changed = now
            self.fleet.autoscaling[key] = autoscaling


# --- the operator's resources, from /proc ----------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# --- the audit log ----------------------------------------------------------------------------------------------------

Position = tuple[int, int]  # (inode, byte offset) in the audit log


class AuditTail:
    """Reads the API server's audit log between two positions (blocking mode: an event is there once answered).
    The API server rotates the file at ``--audit-log-maxsize`` (100 MB by default): a position in a rotated file is
    found again by its inode among the backups (``audit-<time>.log``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def position(self) -> Position:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return (0, 0)
        return (st.st_ino, st.st_size)

    def _file_of(self, inode: int) -> Path | None:
        for candidate in [self.path, *self.path.parent.glob(f"{self.path.stem}-*{self.path.suffix}")]:
            try:
                if candidate.stat().st_ino == inode:
                    return candidate
            except FileNotFoundError:
                continue
        return None

    def events(self, start: Position, end: Position) -> Iterator[dict[str, Any]]:
        chunks: list[bytes] = []
        if start[0] == end[0]:
            chunks.append(self._read(self.path, start[1], end[1]))
        else:  # rotated in between: the rest of the old file, then the new one up to ``end``
            old = self._file_of(start[0])
            if old is not None:
                chunks.append(self._read(old, start[1], None))
            chunks.append(self._read(self.path, 0, end[1]))
        for data in chunks:
            for line in data.splitlines():
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError:  # a line being written
                        continue

    @staticmethod
    def _read(path: Path, start: int, end: int | None) -> bytes:
        try:
            with path.open("rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except FileNotFoundError:
            return b""

    def operator_writes_since(self, start: Position) -> tuple[int, Position]:
        """(writes by the operator after ``start``, the position read up to)."""
        end = self.position()
        writes = sum(1 for e in self.events(start, end)
                     if e.get("user", {}).get("username") == op.OPERATOR_USER and e.get("verb") in op.WRITE_VERBS
                     and e.get("stage") == "ResponseComplete" and not is_lease(e))
        return writes, end


def is_lease(event: dict[str, Any]) -> bool:
    """A call on a Lease: leader election's own renewals, which go on at rest by design."""
    return (event.get("objectRef") or {}).get("resource") == "leases"


def audit_time(stamp: str) -> float:
    """An audit timestamp (RFC 3339 with microseconds) as seconds since the epoch."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def apply_to_job_from_audit(events: Iterable[dict[str, Any]]) -> dict[Key, float]:
    """Per model: from the API server receiving its create to the API server having stored the operator's first Job
    for it (both on the API server's clock, microseconds). The Job's name starts with the model's (``<model>-q-``);
    the audit log's Metadata level has no labels."""
    created: dict[Key, float] = {}
    job_stored: dict[Key, float] = {}
    for e in events:
        ref, verb = e.get("objectRef") or {}, e.get("verb")
        if e.get("stage") != "ResponseComplete" or verb != "create" or ref.get("subresource"):
            continue
        failed = e.get("responseStatus", {}).get("code", 201) >= 300
        if failed or not str(ref.get("namespace", "")).startswith(NS_PREFIX):
            continue
        if ref.get("resource") == op.PLURAL:
            created.setdefault((ref["namespace"], ref["name"]), audit_time(e["requestReceivedTimestamp"]))
        elif ref.get("resource") == "jobs" and e.get("user", {}).get("username") == op.OPERATOR_USER:
            key = (ref["namespace"], str(ref.get("name", "")).rsplit("-q-", 1)[0])
            job_stored.setdefault(key, audit_time(e["stageTimestamp"]))
    return {k: job_stored[k] - t for k, t in created.items() if k in job_stored}


def summarize_requests(events: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    by_verb: Counter[str] = Counter()
    by_call: Counter[str] = Counter()
    watches_opened = watches_closed = 0
    for e in events:
        if e.get("user", {}).get("username") != op.OPERATOR_USER:
            continue
        verb, stage = e.get("verb", ""), e.get("stage")
        ref = e.get("objectRef") or {}
        what = ref.get("resource", "?") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        if verb == "watch":
            watches_opened += stage == "ResponseStarted"
            watches_closed += stage == "ResponseComplete"
            if stage == "ResponseStarted":
                by_call[f"watch {what}"] += 1
            continue
        if stage != "ResponseComplete":
            continue
        by_verb[verb] += 1
        by_call[f"{verb} {what}"] += 1
    requests = sum(by_verb.values())
    lease_writes = sum(1 for e in events if e.get("user", {}).get("username") == op.OPERATOR_USER and is_lease(e)
                       and e.get("verb") in op.WRITE_VERBS and e.get("stage") == "ResponseComplete")
    writes = sum(n for v, n in by_verb.items() if v in op.WRITE_VERBS) - lease_writes
    return {
        "requests_per_s": round((requests + watches_opened) / seconds, 3),
        "non_watch_requests_per_s": round(requests / seconds, 3),
        "by_verb_per_s": {v: round(n / seconds, 3) for v, n in sorted(by_verb.items())},
        "writes": writes,
        "lease_writes": lease_writes,
        "watches_opened": watches_opened,
        "watches_opened_per_s": round(watches_opened / seconds, 3),
        "watches_completed": watches_closed,
        "top_calls": [{"call": c, "count": n} for c, n in by_call.most_common(8)],
    }


# --- Prometheus (--metrics-source prometheus) -------------------------------------------------------------------------

class Prometheus:
    """Debian's ``prometheus`` scraping every pool pod (file_sd: the shared fake endpoint, with namespace and pod
    labels as a Kubernetes scrape config would set them)."""

    def __init__(self, workdir: Path, fleet: Fleet, target: str, scrape_interval: int) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        if not Path(binary).exists():
            raise SystemExit("--metrics-source prometheus needs Debian's prometheus (hack/setup.sh installs it)")
        self.dir = workdir / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.fleet, self.target = fleet, target
        self.targets_file = self.dir / "targets.json"
        self.targets_file.write_text("[]")
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {scrape_interval}s\n  scrape_timeout: {min(10, scrape_interval)}s\n"
            f"scrape_configs:\n  - job_name: tei\n    file_sd_configs:\n"
            f"      - files: ['{self.targets_file}']\n        refresh_interval: 5s\n")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        log_file = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=log_file, stderr=subprocess.STDOUT)
        self.stop_event = threading.Event()
        self.written = -1.0
        threading.Thread(target=self._sync, daemon=True).start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"prometheus did not become ready; see {self.dir / 'prometheus.log'}")

    def _sync(self) -> None:
        while not self.stop_event.wait(2.0):
            with self.fleet.lock:
                if self.fleet.pods_changed == self.written:
                    continue
                self.written = self.fleet.pods_changed
                pods = dict(self.fleet.pool_pods)
            groups = [{"targets": [self.target], "labels": {"namespace": ns, "pod": name, "pool": pool}}
                      for (ns, name), pool in sorted(pods.items())]
            tmp = self.targets_file.with_suffix(".tmp")
            tmp.write_text(json.dumps(groups))
            tmp.rename(self.targets_file)

    def queries_total(self) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as resp:
            metrics = op.parse_exposition(resp.read().decode())
        return sum(v for k, v in metrics.items()
                   if k.startswith("prometheus_engine_query_duration_seconds_count") and 'slice="inner_eval"' in k)

    def stop(self) -> None:
        self.stop_event.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- the benchmark ----------------------------------------------------------------------------------------------------

def model_manifest(name: str, ns: str, args: argparse.Namespace) -> dict[str, Any]:
    """The cluster tests' model (rerank_devcluster.operator_process.rerank_model), autoscaled; with ``--idle``, one
    that may go to zero (test_scale_to_zero.py's: a CPU pool from 0, no GPU pool, idleSeconds, a Gateway route)."""
    if args.distinct_models:
        body = op.rerank_model(name, ns, STORAGE_CLASS, pools={"cpu": {"minReplicas": 1, "maxReplicas": 4},
                                                              "gpu": {"enabled": False}},
                               autoscaling={"enabled": True, "intervalSeconds": args.interval,
                                            "metrics": {"source": args.metrics_source,
                                                        "staleAfterSeconds": max(60, 4 * args.interval)}})
        body["spec"]["className"] = SHARED_CLASS
        body["spec"]["model"] = {"id": f"bench/reranker-{int(name.rsplit('-', 1)[1]) % args.distinct_models}"}
        return body
    if args.idle:
        return op.rerank_model(
            name, ns, STORAGE_CLASS, pools={"cpu": {"minReplicas": 0, "maxReplicas": 4}, "gpu": {"enabled": False}},
            autoscaling={"enabled": True, "intervalSeconds": args.interval, "idleSeconds": args.idle_seconds,
                         "metrics": {"source": args.metrics_source, "staleAfterSeconds": max(60, 4 * args.interval)}},
            routing={"gateway": {"parentRefs": [{"name": "shared", "namespace": "gateway-system"}]}})
    return op.rerank_model(name, ns, STORAGE_CLASS, pools={"cpu": {"minReplicas": 1, "maxReplicas": 4}},
                           autoscaling={"enabled": True, "intervalSeconds": args.interval,
                                        "metrics": {"source": args.metrics_source,
                                                    "staleAfterSeconds": max(60, 4 * args.interval)}})


def git(*argv: str) -> str:
    try:
        return subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def operator_source(ref: str, workdir: Path) -> Path:
    """``operator/`` as committed at ``ref`` (``git archive``: reads the repository, changes nothing)."""
    target = workdir / f"operator-{ref.replace('/', '_')}"
    with tempfile.TemporaryFile() as tar:
        subprocess.run(["git", "archive", "--format=tar", ref, "operator"], cwd=REPO, stdout=tar, check=True)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as archive:
            archive.extractall(target, filter="data")
    return target / "operator"


def fleet_nodes(models: int) -> dict[str, dict[str, Any]]:
    """Room for the fleet on big kwok nodes: two pool pods per model plus its quantizer pod. Every node takes all the
    pods (the scheduler spreads CPU-pool and quantizer pods over the GPU nodes too), and the GPU nodes' GPUs take
    every GPU-pool pod."""
    count = max(1, math.ceil(models / 250))
    big = {"cpu": "100000", "memory": "1000Ti", "pods": str(3 * models + 200)}
    nodes: dict[str, dict[str, Any]] = {}
    for i in range(count):
        nodes[f"kwok-fleet-cpu-{i}"] = {"labels": {"node.kubernetes.io/instance-type": "cpu-fleet"},
                                        "allocatable": big}
        nodes[f"kwok-fleet-gpu-{i}"] = {"labels": {"node.kubernetes.io/instance-type": "gpu-fleet",
                                                   "nvidia.com/gpu.present": "true"},
                                        "allocatable": {**big, "nvidia.com/gpu": str(2 * models + 50)}}
    return nodes


@dataclass
class Replica:
    process: op.OperatorProcess

    def metrics(self) -> dict[str, float]:
        try:
            return self.process.metrics()
        except OSError:
            return {}

    def leader(self) -> float | None:
        m = self.metrics()
        values = [v for k, v in m.items() if k.split("{")[0] == "rerank_operator_leader"]
        return max(values) if values else None

    def rounds(self) -> tuple[float, float, float]:
        """The autoscaler's rounds so far: (count, seconds in all, how many took 10 s or less)."""
        m = self.metrics()
        name = "rerank_operator_autoscaler_round_seconds"
        return (m.get(f"{name}_count", 0.0), m.get(f"{name}_sum", 0.0), m.get(f'{name}_bucket{{le="10.0"}}', 0.0))

    def activity(self) -> float:
        """Sum of the counters that move when the operator decides something (reconciles, autoscaler ticks)."""
        return sum(v for k, v in self.metrics().items()
                   if k.startswith("rerank_operator_") and (k.split("{")[0].endswith("_total")
                                                            or k.split("{")[0].endswith("_count"))
                   and any(w in k for w in ("reconcile", "autoscal", "tick", "scrape", "decision", "promql")))


class Benchmark:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fleet = Fleet()
        self.result: dict[str, Any] = {}
        self.replicas: list[Replica] = []
        self.prometheus: Prometheus | None = None
        self.tei_server: MetricsServer | None = None
        self.activator: activator_server.Running | None = None
        self.registry: LocalRegistry | None = None
        self.notes: list[str] = []
        self.keys: list[Key] = []
        self._last_progress = 0.0

    # -- setup -------------------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        args = self.args
        workdir = Path(args.workdir) if args.workdir else None
        log(f"starting the dev cluster ({args.models} models in {args.namespaces} namespaces)")
        cluster = Cluster.start(workdir)
        cluster.keep_workdir = args.keep_workdir
        self.cluster = cluster
        try:
            return self._run(cluster)
        finally:
            for r in self.replicas:
                r.process.stop()
            if self.prometheus:
                self.prometheus.stop()
            if self.tei_server:
                self.tei_server.stop()
            if self.activator:
                self.activator.stop()
            if self.registry:
                self.registry.processes.stop_all()
            if args.keep_workdir:
                log(f"kept {cluster.workdir} (logs: {cluster.logs_dir})")
            cluster.stop()

    def _run(self, cluster: Cluster) -> dict[str, Any]:
        args = self.args
        api = self.api = Api(cluster)
        cluster.add_nodes(fleet_nodes(args.models))
        op.install_crds(cluster)
        identity = op.create_identity(cluster, token_duration="8h")
        if args.replicas == 2:
            op.bind_leader_election(cluster, LEASE_NS)  # as the chart does: the Lease lives in the operator's namespace
        namespaces = [f"{NS_PREFIX}{i:04d}" for i in range(args.namespaces)]
        op.kubectl_apply(cluster, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                                   for ns in namespaces])
        op.static_pvs(cluster, [f"{STORAGE_CLASS}-{i:05d}" for i in range(args.models)], STORAGE_CLASS)
        self._wait(lambda: self._default_service_accounts() >= len(namespaces), 120,
                   "every namespace's default ServiceAccount")

        # --idle: no request at all, so the models go to zero (counters that never move read as a rate of 0).
        tei = SteadyTei(rate=0.0 if args.idle else 1.0, latency=0.03)
        self.tei_server = MetricsServer(tei.render)
        redirect = cluster.workdir / "scrape-addresses.json"
        redirect.write_text(json.dumps({ANY_POD: self.tei_server.address}))
        extra_env: dict[str, str] = {}
        if args.operator_ref:
            src = operator_source(args.operator_ref, cluster.workdir)
            extra_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), os.environ.get("PYTHONPATH", "")]))
            log(f"operator from {args.operator_ref} ({src})")
        prom_args: list[str] = []
        if args.metrics_source == "prometheus":
            self.prometheus = Prometheus(cluster.workdir, self.fleet, self.tei_server.address, args.interval)
            prom_args = ["--prometheus-url", self.prometheus.url]
        if args.idle:
            prom_args += self._start_activator(cluster)
        if args.distinct_models:
            self._start_store(cluster)
        self._start_operators(cluster, identity, redirect, extra_env, prom_args)

        finisher = ThreadPoolExecutor(max_workers=args.finish_concurrency, thread_name_prefix="finish")
        def finish(pod: dict[str, Any]) -> None:
            finisher.submit(self._finish, pod)

        def finish_shared(pod: dict[str, Any]) -> None:
            finisher.submit(self._finish_shared, pod)

        watches = Watches(api, self.fleet, finish, idle=args.idle,
                          finish_shared=finish_shared if args.distinct_models else None)
        watches.start()
        try:
            self._bring_up(namespaces)
            if args.idle:
                self._to_zero()
            self._steady_state()
            if args.distinct_models and args.late_models:
                self._late_tenants(namespaces)
            if args.idle:
                self._idle_end()
                self._wake()
            if args.replicas == 2 and self.result.get("failover") is None:
                self._failover()
        finally:
            watches.stop.set()
            finisher.shutdown(wait=False, cancel_futures=True)
        self.result["checks"] = self._checks()
        return self.result

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
            holder_options={"resolve": lambda host, port: closed})
        log(f"Gateway API CRDs installed; activator at {self.activator.url} (hold {self.args.activator_hold:g}s)")
        return ["--activator-url", self.activator.url,
                "--activator-service", f"{op.OPERATOR_NS}/{ACTIVATOR_SERVICE}:8080",
                "--activator-key-file", str(key_file)]

    def _start_store(self, cluster: Cluster) -> None:
        """--distinct-models: the store (a distribution registry with deletes on), its namespace and the class."""
        root = cluster.workdir / "store"
        root.mkdir(exist_ok=True)
        self.registry = LocalRegistry(Processes(logs_dir=cluster.logs_dir, cwd=root), root, delete=True).start(
            time.monotonic() + 30)
        op.kubectl_apply(cluster, [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STORE_NS}},
            {"apiVersion": f"{op.GROUP}/{op.VERSION}", "kind": "RerankClass", "metadata": {"name": SHARED_CLASS},
             "spec": {"artifactStore": {"repository": f"{self.registry.host}/{STORE_REPOSITORY}",
                                        "namespace": STORE_NS, "insecure": True}}}])
        log(f"artifact store at {self.registry.host}/{STORE_REPOSITORY} (class {SHARED_CLASS})")

    def _finish_shared(self, pod: dict[str, Any]) -> None:
        """A shared Job's quantizer: push its artifact to the store, then end the pod with the result."""
        assert self.registry is not None
        meta = pod["metadata"]
        artifact_id = meta["labels"][op.ARTIFACT_LABEL]
        try:
            with tempfile.TemporaryDirectory() as tmp:
                ref = store.push(op.shared_artifact(Path(tmp), artifact_id), STORE_REPOSITORY, artifact_id,
                                 registry=oci.Registry(self.registry.host, insecure=True), scratch=Path(tmp) / "s")
            self.api.ok("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        finished_pod_status(pod, 0, op.published_shared(artifact_id, ref)),
                        "application/merge-patch+json")
        except (RuntimeError, OSError) as exc:
            with self.fleet.lock:
                self.fleet.finish_errors += 1
                self.fleet.finishing.discard(meta["uid"])
            log(f"finishing shared {meta['namespace']}/{meta['name']} failed: {exc}")

    def _start_operators(self, cluster: Cluster, identity: op.Identity, redirect: Path, extra_env: dict[str, str],
                         prom_args: list[str]) -> None:
        args = self.args
        launcher = ["-m", "rerank_devcluster.scrape_redirect", str(redirect)]
        election = ["--leader-election", "--leader-election-namespace", LEASE_NS,
                    "--leader-election-id", LEASE_NAME] if args.replicas == 2 else []
        for i in range(args.replicas):
            proc = op.OperatorProcess(cluster, identity, [], launcher=launcher, extra_env=extra_env,
                                      extra_args=[*prom_args, *election], resync_seconds=args.resync_seconds,
                                      name=f"fleet-{i}", start_timeout=60)
            try:
                proc.start()
            except AssertionError as exc:
                if not election:
                    raise
                text = str(exc).splitlines()
                self.result["failover"] = {"error": "the operator rejected the leader-election flags",
                                           "detail": "\n".join(text[-3:])[-600:]}
                log("the operator rejected --leader-election: going on with one replica, no failover measured")
                for r in self.replicas:
                    r.process.stop()
                self.replicas = [Replica(op.OperatorProcess(
                    cluster, identity, [], launcher=launcher, extra_env=extra_env, extra_args=prom_args,
                    resync_seconds=args.resync_seconds, name="fleet-0", start_timeout=60).start())]
                return
            self.replicas.append(Replica(proc))
        log(f"{len(self.replicas)} operator process(es) up: pids {[r.process.pid for r in self.replicas]}")

    def _default_service_accounts(self) -> int:
        out = self.api.ok("GET", "/api/v1/serviceaccounts?fieldSelector=metadata.name%3Ddefault")
        return sum(1 for sa in out["items"] if sa["metadata"]["namespace"].startswith(NS_PREFIX))

    def _wait(self, check: Callable[[], bool], timeout: float, what: str, every: float = 0.5) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(every)
        log(f"timed out after {timeout:.0f}s waiting for {what}")
        return False

    def _finish(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = owner_key(pod)
        try:
            self.api.ok("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                        op.publish_status(pod), "application/merge-patch+json")
        except (RuntimeError, OSError) as exc:
            with self.fleet.lock:
                self.fleet.finish_errors += 1
                self.fleet.finishing.discard(meta["uid"])
            log(f"finishing {meta['namespace']}/{meta['name']} failed: {exc}")
            return
        if key:
            with self.fleet.lock:
                self.fleet.finished.setdefault(key, time.monotonic())

    # -- bring-up ----------------------------------------------------------------------------------------------------
    def _bring_up(self, namespaces: list[str]) -> None:
        args, fleet = self.args, self.fleet
        keys = [(namespaces[i % len(namespaces)], f"m-{i:05d}") for i in range(args.models)]

        def apply(key: Key) -> None:
            self.api.ok("POST", f"/apis/{op.GROUP}/{op.VERSION}/namespaces/{key[0]}/{op.PLURAL}",
                        model_manifest(key[1], key[0], args))
            done = time.monotonic()
            with fleet.lock:
                fleet.applied[key] = done

        if args.distinct_models:  # one model per artifact first: the others find their artifact published
            first = keys[:args.distinct_models]
            log(f"applying the first {len(first)} RerankModels, one per distinct model")
            with ThreadPoolExecutor(max_workers=args.apply_concurrency, thread_name_prefix="apply") as pool:
                list(pool.map(apply, first))
            self._wait(lambda: all(fleet.ready_now.get(k) for k in first), args.timeout,
                       "the first model of each artifact Ready")
            keys_first, keys = first, keys[args.distinct_models:]
        log(f"applying {len(keys)} RerankModels ({args.apply_concurrency} clients)")
        audit = AuditTail(self.cluster.audit_log)
        burst_start = audit.position()
        t_apply = time.monotonic()
        with ThreadPoolExecutor(max_workers=args.apply_concurrency, thread_name_prefix="apply") as pool:
            list(pool.map(apply, keys))
        t_applied = time.monotonic()
        log(f"applied in {t_applied - t_apply:.1f}s")

        def progress() -> bool:
            with fleet.lock:
                jobs, running, finished = len(fleet.job_seen), len(fleet.pod_running), len(fleet.finished)
            ready = fleet.ready_count()
            now = time.monotonic()
            if now - self._last_progress >= 10:
                self._last_progress = now
                log(f"jobs {jobs}/{len(keys)}, quantizer pods running {running}, finished {finished}, "
                    f"ready {ready}")
            return ready >= len(keys) and all(fleet.ready_now.get(k) for k in keys)

        self._last_progress = 0.0
        all_ready = self._wait(progress, args.timeout, "every model Ready")
        t_ready = time.monotonic()
        with fleet.lock:
            apply_to_job = [fleet.job_seen[k] - fleet.applied[k] for k in keys if k in fleet.job_seen
                            and k in fleet.applied]
            job_to_running = [fleet.pod_running[k] - fleet.job_seen[k] for k in keys
                              if k in fleet.pod_running and k in fleet.job_seen]
            finish_to_ready = [fleet.first_ready[k] - fleet.finished[k] for k in keys
                               if k in fleet.first_ready and k in fleet.finished]
            last_finish = max(fleet.finished.values(), default=t_ready)
            last_job = max(fleet.job_seen.values(), default=t_ready)
            counts = {"jobs_seen": len(fleet.job_seen), "quantizer_pods_finished": len(fleet.finished),
                      "ready": sum(1 for k in keys if fleet.ready_now.get(k)), "finish_errors": fleet.finish_errors}
        served = apply_to_job_from_audit(audit.events(burst_start, audit.position()))
        if args.distinct_models:
            with fleet.lock:
                after_first = [fleet.first_ready[k] - fleet.applied[k] for k in keys
                               if k in fleet.first_ready and k in fleet.applied]
            self.result["ready_after_first_burst_s"] = {
                **quantiles(after_first), "models": len(keys),
                "method": "models applied in one burst after their artifact was published: the create call "
                          "returned -> Ready seen on this process's watch (the API server's queue of the burst's "
                          "writes included)"}
            keys = keys_first + keys
            counts["ready"] = sum(1 for k in keys if fleet.ready_now.get(k))
        self.keys = keys
        self.result["bring_up"] = {
            "all_ready": all_ready,
            **counts,
            "apply_burst_s": round(t_applied - t_apply, 2),
            "apply_to_job_s": {**quantiles([served[k] for k in keys if k in served]), "burst": len(keys),
                               "method": "API server's audit log: the model's create received -> the operator's "
                                         "Job create answered (one clock, microseconds)"},
            "apply_to_job_seen_here_s": {**quantiles(apply_to_job), "burst": len(keys),
                                         "method": "Job first seen on this process's watch minus the model's create "
                                                   "call returning (time.monotonic): adds the API server's watch "
                                                   "delivery to this process"},
            "last_job_after_first_apply_s": round(last_job - t_apply, 2),
            "job_to_quantizer_pod_running_s": quantiles(job_to_running),
            "all_jobs_finished_after_first_apply_s": round(last_finish - t_apply, 2),
            "all_ready_after_jobs_finished_s": round(t_ready - last_finish, 2),
            "finish_to_ready_s": quantiles(finish_to_ready),
            "total_apply_to_all_ready_s": round(t_ready - t_apply, 2),
        }
        log(f"bring-up: {json.dumps(self.result['bring_up'])}")

    # -- steady state ------------------------------------------------------------------------------------------------
    def leader(self) -> Replica:
        if len(self.replicas) == 1:
            return self.replicas[0]
        leaders = [r for r in self.replicas if (r.leader() or 0) >= 1]
        return leaders[0] if len(leaders) == 1 else self.replicas[0]

    def _steady_state(self) -> None:
        args = self.args
        audit = AuditTail(self.cluster.audit_log)
        # Settle: no operator write for --settle-quiet seconds.
        start, quiet_since = audit.position(), time.monotonic()
        deadline = time.monotonic() + args.settle_timeout
        settled = False
        while time.monotonic() < deadline:
            time.sleep(2)
            writes, start = audit.operator_writes_since(start)
            if writes:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since >= args.settle_quiet:
                settled = True
                break
        log(f"steady state: settled={settled}; measuring {args.steady_window}s")
        leader = self.leader()
        pids = {f"replica-{i}": r.process.pid for i, r in enumerate(self.replicas)}
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        promql0 = self._promql_total()
        scrapes0 = self.tei_server.requests if self.tei_server else 0
        changed0 = self.fleet.autoscaling_changed
        offset0, t0 = audit.position(), time.monotonic()
        rss: dict[str, list[float]] = {name: [] for name in pids}
        while time.monotonic() - t0 < args.steady_window:
            for name, pid in pids.items():
                rss[name].append(rss_mb(pid))
            time.sleep(1.0)
        seconds = time.monotonic() - t0
        offset1 = audit.position()
        cpu = {name: round((cpu_seconds(pid) - cpu0[name]) / seconds, 3) for name, pid in pids.items()}
        promql1 = self._promql_total()
        scrapes = (self.tei_server.requests - scrapes0) if self.tei_server else 0
        requests = summarize_requests(list(audit.events(offset0, offset1)), seconds)
        leader_name = f"replica-{self.replicas.index(leader)}"
        promql: dict[str, Any] = {"source": promql0[0]}
        if promql0[1] is not None and promql1[1] is not None:
            qps = (promql1[1] - promql0[1]) / seconds
            per_tick = qps * args.interval
            promql.update(queries_per_s=round(qps, 3), queries_per_tick=round(per_tick, 2),
                          per_signal_per_tick=round(per_tick / PROMQL_SIGNALS, 3))
        self.result["steady_state"] = {
            "settled": settled,
            "window_s": round(seconds, 1),
            "operator_requests": requests,
            "operator_cpu_cores": cpu,
            "operator_rss_mb": {name: {"max": round(max(v), 1), "end": round(v[-1], 1)} for name, v in rss.items()},
            "leader": leader_name,
            "fake_tei_scrapes_per_s": round(scrapes / seconds, 2),
            "scrapes_per_pool_pod_per_tick": round(scrapes / seconds * args.interval / (2 * args.models), 3)
            if args.metrics_source == "direct" and not args.idle else None,
            "promql": promql,
            "autoscaling_status_changed_during_window": self.fleet.autoscaling_changed != changed0,
        }
        log(f"steady state: {json.dumps(self.result['steady_state'])}")

    def _late_tenants(self, namespaces: list[str]) -> None:
        """--distinct-models: tenants arriving one at a time into the running fleet (``--late-models``, one every
        ``--late-interval`` seconds), each asking for a model whose artifact the store holds: apply -> Ready."""
        args, fleet = self.args, self.fleet
        keys = [(namespaces[i % len(namespaces)], f"m-late-{i:05d}") for i in range(args.late_models)]
        log(f"late tenants: {len(keys)} models, one every {args.late_interval:g}s")
        for key in keys:
            self.api.ok("POST", f"/apis/{op.GROUP}/{op.VERSION}/namespaces/{key[0]}/{op.PLURAL}",
                        model_manifest(key[1], key[0], args))
            with fleet.lock:
                fleet.applied[key] = time.monotonic()
            time.sleep(args.late_interval)
        self._wait(lambda: all(fleet.ready_now.get(k) for k in keys), args.timeout, "every late tenant Ready")
        with fleet.lock:
            took = [fleet.first_ready[k] - fleet.applied[k] for k in keys if k in fleet.first_ready]
        self.result["ready_after_first_s"] = {
            **quantiles(took), "models": len(keys), "ready": len(took), "interval_s": args.late_interval,
            "method": "tenants applied one at a time into the running fleet, their artifact in the store: the "
                      "create call returned -> Ready seen on this process's watch"}
        log(f"late tenants: {json.dumps(self.result['ready_after_first_s'])}")
        self.keys = [*self.keys, *keys]

    def _promql_total(self) -> tuple[str, float | None]:
        if self.args.metrics_source != "prometheus":
            return "n/a (direct metrics)", None
        counter = sum(v for r in self.replicas for k, v in r.metrics().items()
                      if k.startswith("rerank_operator_promql_queries_total"))
        if any(k.startswith("rerank_operator_promql_queries_total") for r in self.replicas for k in r.metrics()):
            return "rerank_operator_promql_queries_total", counter
        assert self.prometheus is not None
        return 'prometheus_engine_query_duration_seconds_count{slice="inner_eval"}', self.prometheus.queries_total()

    # -- idle (--idle) -----------------------------------------------------------------------------------------------
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

    # -- failover ----------------------------------------------------------------------------------------------------
    def _failover(self) -> None:
        leaders = [(i, r.leader()) for i, r in enumerate(self.replicas)]
        lease = self.api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{LEASE_NAME}")
        holder = lease[1].get("spec", {}).get("holderIdentity") if lease[0] == 200 else None
        current = [i for i, v in leaders if (v or 0) >= 1]
        if len(current) != 1:
            self.result["failover"] = {"error": f"expected one leader, rerank_operator_leader per replica: {leaders}",
                                       "lease_holder": holder}
            log(self.result["failover"]["error"])
            return
        old, new = self.replicas[current[0]], self.replicas[1 - current[0]]
        ns, name = self.keys[0]
        before = new.activity()
        log(f"failover: SIGKILL replica-{current[0]} (lease holder {holder!r}); changing {ns}/{name} minReplicas")
        t0 = time.monotonic()
        os.kill(old.process.pid, signal.SIGKILL)
        if old.process.proc:
            old.process.proc.wait(timeout=10)
        self.api.ok("PATCH", f"/apis/{op.GROUP}/{op.VERSION}/namespaces/{ns}/{op.PLURAL}/{name}",
                    {"spec": {"pools": {"cpu": {"minReplicas": 2}}}}, "application/merge-patch+json")
        times: dict[str, float | None] = {"leader": None, "activity": None, "change_applied": None}
        deadline = t0 + self.args.failover_timeout
        while time.monotonic() < deadline and None in times.values():
            now = time.monotonic() - t0
            if times["leader"] is None and (new.leader() or 0) >= 1:
                times["leader"] = now
            if times["leader"] is not None and times["activity"] is None and new.activity() > before:
                times["activity"] = now
            if times["change_applied"] is None:
                status, dep = self.api.call("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}-cpu")
                if status == 200 and dep.get("spec", {}).get("replicas", 0) >= 2:
                    times["change_applied"] = now
            time.sleep(0.2)
        lease = self.api.call("GET", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{LEASE_NAME}")
        decided = [v for v in (times["leader"], times["change_applied"]) if v is not None]
        self.result["failover"] = {
            "killed": f"replica-{current[0]}",
            "lease_holder_before": holder,
            "lease_holder_after": lease[1].get("spec", {}).get("holderIdentity") if lease[0] == 200 else None,
            "standby_leader_after_s": round(times["leader"], 2) if times["leader"] is not None else None,
            "standby_counters_moved_after_s": round(times["activity"], 2) if times["activity"] is not None else None,
            "spec_change_applied_after_s": round(times["change_applied"], 2)
            if times["change_applied"] is not None else None,
            "failover_s": round(max(decided), 2) if len(decided) == 2 else None,
        }
        self.replicas = [new]
        log(f"failover: {json.dumps(self.result['failover'])}")
        self._wait(lambda: self.fleet.ready_count() >= len(self.keys), 120, "every model Ready after failover")

    # -- checks and targets ------------------------------------------------------------------------------------------
    def _checks(self) -> dict[str, Any]:
        jobs = self.api.ok("GET", f"/apis/batch/v1/jobs?labelSelector={COMPONENT_LABEL}%3Dquantizer")["items"]
        per_artifact: Counter[tuple[str, str, str]] = Counter()
        for job in jobs:
            key = owner_key(job)
            if key:
                per_artifact[(*key, job["metadata"]["labels"].get(op.ARTIFACT_LABEL, ""))] += 1
        models_with_jobs = {(ns, name) for ns, name, _ in per_artifact}
        shared = {}
        if self.registry is not None:
            shared = {"artifacts": len(oci.Registry(self.registry.host, insecure=True).tags(STORE_REPOSITORY)),
                      "shared_jobs": sum(1 for j in jobs if (j["metadata"].get("labels") or {}).get(SHARED_LABEL))}
        return {**shared,
            "models_ready": self.fleet.ready_count(),
            "models": len(getattr(self, "keys", [])),
            "jobs": len(jobs),
            # Shared artifacts: a model has no Job of its own by design.
            **({} if self.registry else {"models_without_job": len(set(getattr(self, "keys", [])) - models_with_jobs)}),
            "artifacts_with_more_than_one_job": sum(1 for n in per_artifact.values() if n > 1),
            "one_job_per_artifact": all(n == 1 for n in per_artifact.values()),
        }


def targets(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    bring_up, steady = result.get("bring_up", {}), result.get("steady_state", {})
    failover = result.get("failover") or {}
    leader = steady.get("leader", "replica-0")
    requests = steady.get("operator_requests", {})
    measured: dict[str, Any] = {
        "ready_after_jobs_finished_s": bring_up.get("all_ready_after_jobs_finished_s")
        if bring_up.get("all_ready") else None,
        "apply_to_job_p95_s": bring_up.get("apply_to_job_s", {}).get("p95"),
        "steady_requests_per_s": requests.get("requests_per_s"),
        "steady_writes": requests.get("writes"),
        "promql_queries_per_signal_per_tick": steady.get("promql", {}).get("per_signal_per_tick"),
        "rss_mb": steady.get("operator_rss_mb", {}).get(leader, {}).get("max"),
        "cpu_cores": steady.get("operator_cpu_cores", {}).get(leader),
        "failover_s": failover.get("failover_s"),
        "idle_pods": result.get("idle", {}).get("idle_pods"),
        "ready_after_first_p95_s": result.get("ready_after_first_s", {}).get("p95"),
    }
    notes = {
        "ready_after_jobs_finished_s": f"target for 1000 models; measured with {args.models}",
        "apply_to_job_p95_s": f"target for a burst of 300; measured in a burst of {args.models}",
        "promql_queries_per_signal_per_tick": f"{PROMQL_SIGNALS} signals per pool; only with --metrics-source "
                                              "prometheus",
        "failover_s": "the later of: the standby's rerank_operator_leader is 1, and a spec change made at the kill "
                      "reaches the Deployment; only with --replicas 2",
        "steady_requests_per_s": "completed non-watch requests plus watches opened, per second (leader election's "
                                 "Lease calls included)",
        "steady_writes": "writes in the window, leader election's Lease renewals excepted (lease_writes)",
        "idle_pods": "the fleet's pool pods at the end of the steady window; only with --idle",
    }
    out: dict[str, Any] = {}
    for name, limit in TARGETS.items():
        value = measured[name]
        out[name] = {"target": f"<= {limit:g}", "measured": value,
                     "pass": None if value is None else bool(value <= limit)}
        if name in notes:
            out[name]["note"] = notes[name]
    if args.metrics_source != "prometheus":
        out["promql_queries_per_signal_per_tick"]["pass"] = None
    if args.replicas != 2:
        out["failover_s"]["pass"] = None
    elif measured["failover_s"] is None:
        out["failover_s"]["pass"] = False
    if args.distinct_models:
        checks = result.get("checks", {})
        for name in ("jobs", "artifacts"):
            out[name] = {"target": f"== {args.distinct_models}", "measured": checks.get(name),
                         "pass": checks.get(name) == args.distinct_models}
    else:
        out["ready_after_first_p95_s"]["pass"] = None
    if not args.idle:
        out["idle_pods"]["pass"] = None
    elif measured["idle_pods"] is None:
        out["idle_pods"]["pass"] = False
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=int, default=100)
    p.add_argument("--namespaces", type=int, default=0, help="default: models / 10 (at least 1)")
    p.add_argument("--metrics-source", choices=["direct", "prometheus"], default="direct")
    p.add_argument("--replicas", type=int, choices=[1, 2], default=1)
    p.add_argument("--interval", type=int, default=15, help="the models' autoscaling.intervalSeconds (min 5)")
    p.add_argument("--resync-seconds", type=float, default=None,
                   help="the operator's --resync-seconds (default: not passed, the operator's own default)")
    p.add_argument("--steady-window", type=float, default=60.0)
    p.add_argument("--settle-quiet", type=float, default=0.0,
                   help="seconds without an operator write = settled (default: two autoscaling intervals and 5 s, so "
                        "the quiet between a model's priming scrape and its first decision is not taken for rest)")
    p.add_argument("--settle-timeout", type=float, default=180.0)
    p.add_argument("--timeout", type=float, default=1200.0, help="for every model to become Ready")
    p.add_argument("--failover-timeout", type=float, default=90.0)
    p.add_argument("--apply-concurrency", type=int, default=8)
    p.add_argument("--finish-concurrency", type=int, default=8)
    p.add_argument("--operator-ref", default="",
                   help="run operator/ as committed at this git ref (git archive) instead of the working tree's")
    p.add_argument("--distinct-models", type=int, default=0,
                   help="shared artifacts: the models ask for this many distinct hub models, served from one store")
    p.add_argument("--late-models", type=int, default=50,
                   help="--distinct-models: tenants applied one at a time after the steady window "
                        "(ready_after_first_s)")
    p.add_argument("--late-interval", type=float, default=1.0, help="seconds between two late tenants")
    p.add_argument("--idle", action="store_true",
                   help="models that may go to zero and get no request: measure the fleet asleep (module docstring)")
    p.add_argument("--idle-seconds", type=int, default=30, help="--idle: autoscaling.idleSeconds (min 30)")
    p.add_argument("--idle-timeout", type=float, default=0.0,
                   help="--idle: for every model to be at zero (default: idleSeconds + drain + 2 intervals + 60 s + "
                        "the bring-up's time)")
    p.add_argument("--activator-hold", type=float, default=5.0,
                   help="--idle: the in-process activator's hold (kwok pods never answer: the held request's 503)")
    p.add_argument("--workdir", default="")
    p.add_argument("--keep-workdir", action="store_true")
    args = p.parse_args(argv)
    args.namespaces = args.namespaces or max(1, args.models // 10)
    args.settle_quiet = args.settle_quiet or 2 * args.interval + 5.0
    return args


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM (also when started in the background, where SIGINT comes ignored) stop the cluster cleanly
    # and still print what was measured.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    commit = git("rev-parse", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", "operator"))
    bench = Benchmark(args)
    try:
        result = bench.run()
    except KeyboardInterrupt:
        result = bench.result
        result["interrupted"] = True
    inputs = {
        "models": args.models, "namespaces": args.namespaces, "metrics_source": args.metrics_source,
        "replicas": args.replicas, "autoscaling_interval_s": args.interval, "resync_seconds": args.resync_seconds,
        "steady_window_s": args.steady_window, "git_commit": commit,
        "idle": args.idle, "idle_seconds": args.idle_seconds if args.idle else None,
        "operator_commit": git("rev-parse", args.operator_ref) if args.operator_ref else commit,
        "operator": f"git archive {args.operator_ref}" if args.operator_ref
        else ("working tree, operator/ modified" if dirty else "working tree (clean)"),
        "cpus": os.cpu_count(),
    }
    out = {"inputs": inputs, **result, "targets": targets(result, args)}
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
