"""What the benchmark sees: the watches on quantization Jobs, pods, RerankModels (and, with --idle, the CPU
Deployments), and the Fleet they fill, by model; times are ``time.monotonic()`` on receipt. The apply->Job and
Ready times, the pool pods and the scale-to-zero phases every phase measures are read from here."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rerank_devcluster import operator_process as op

from .api import Api

NS_PREFIX = "fleet-"
POOL_LABEL, INSTANCE_LABEL = "rerank.io/pool", "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
SHARED_LABEL = "rerank.io/shared"


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
