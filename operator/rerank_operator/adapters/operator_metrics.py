"""The operator's own Prometheus metrics (the TEI pods' metrics are the autoscaler's business).

``rerank_operator_api_writes_total`` counts every write request the operator makes (every request goes through
``kube_api.Client``), which is how dashboards and the cluster tests check that an idle operator writes nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

RECONCILES = Counter(
    "rerank_operator_reconciles_total", "Reconciles of a RerankModel, by trigger and result.", ["trigger", "result"]
)
ERRORS = Counter(
    "rerank_operator_reconcile_errors_total", "Failed reconciles, by kind of error.", ["kind"]
)
DURATION = Histogram(
    "rerank_operator_reconcile_duration_seconds", "Duration of one reconcile.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
JOBS = Counter(
    "rerank_operator_quantization_jobs_total", "Quantization Jobs, by outcome (created, succeeded, failed).",
    ["outcome", "reason"],
)
FENCED_WRITES = Counter(
    "rerank_operator_fenced_writes_total", "Writes refused before they were sent because this process no longer "
    "led (its renew deadline passed), by verb and kind.", ["verb", "kind"]
)
API_WRITES = Counter(
    "rerank_operator_api_writes_total", "Write requests sent to the Kubernetes API, by verb and kind.", ["verb", "kind"]
)
MODEL_LABELS = ["namespace", "rerankmodel", "pool"]
TRAFFIC_WEIGHT = Gauge(
    "rerank_operator_traffic_weight_percent", "Share of a model's traffic each pool receives.", MODEL_LABELS
)
DESIRED_REPLICAS = Gauge(
    "rerank_operator_pool_desired_replicas", "Replicas the operator wants for each pool of a model.", MODEL_LABELS
)
DECISION_REASONS = ("ScaledUp", "ScaledDown", "TrafficShifted")
SCALING_DECISIONS = Counter(
    "rerank_operator_scaling_decisions_total",
    "Autoscaler decisions that changed a pool: ScaledUp/ScaledDown (pool = the one scaled) and TrafficShifted "
    "(pool = the one that gained traffic).",
    [*MODEL_LABELS, "reason"],
)


FOREIGN_PODS = Gauge(
    "rerank_operator_foreign_pods",
    "Pods carrying a model's pool or guard labels that its own Deployments do not own (a look-alike): never scraped.",
    ["namespace", "rerankmodel"],
)


def record_foreign_pods(namespace: str, model: str, count: int) -> None:
    """rerank_operator_foreign_pods of a model, now."""
    _series(FOREIGN_PODS, namespace, model).set(count)


def record_model(namespace: str, model: str, traffic: dict[str, int], replicas: dict[str, int]) -> None:
    """Per-model gauges after a reconcile; pools not listed (disabled) are removed."""
    for pool in ("cpu", "gpu"):
        for gauge, values in ((TRAFFIC_WEIGHT, traffic), (DESIRED_REPLICAS, replicas)):
            if pool in values:
                _series(gauge, namespace, model, pool).set(values[pool])
            else:
                _drop(gauge, (namespace, model, pool))
        if pool in traffic:  # decisions start at 0, so increase() counts a model's first scale-up or shift too
            for reason in DECISION_REASONS:
                _series(SCALING_DECISIONS, namespace, model, pool, reason)


def count_decision(namespace: str, model: str, pool: str, reason: str) -> None:
    """rerank_operator_scaling_decisions_total, one more ``reason`` (DECISION_REASONS) for ``pool``."""
    _series(SCALING_DECISIONS, namespace, model, pool, reason).inc()


def forget_model(namespace: str, model: str) -> None:
    """Remove every series of a deleted model (a thousand tenants' churn must not grow the operator's /metrics)."""
    with _LOCK:
        held = _MODEL_SERIES.pop((namespace, model), set())
    for metric, labels in held:
        forget(metric, *labels)


def forget(gauge: Gauge | Counter, *labels: str) -> None:
    with contextlib.suppress(KeyError):  # never set: nothing to forget
        gauge.remove(*labels)


PROMQL_QUERIES = Counter(
    "rerank_operator_promql_queries_total",
    "Instant queries the autoscaler's Prometheus source sent (one HTTP request each), by result (ok, error).",
    ["result"],
)


#: 1 while this process leads (controllers/leader.py; always 1 without --leader-election), 0 while it stands by.
#: Summed over the replicas it must be 1: 0 is a failover in progress, 2 would be two writers.
LEADER = Gauge("rerank_operator_leader", "1 when this operator process is the leader (the one that writes).")


#: The fleet's shape (controllers/handlers.py, autoscale_loop.py): how much the operator holds and how long a round
#: of the autoscaler over every due model takes.
AUTOSCALER_ROUND = Histogram(
    "rerank_operator_autoscaler_round_seconds",
    "Duration of one autoscaler round over every model due (signals of all of them collected at once).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
QUEUE_DEPTH = Gauge("rerank_operator_queue_depth", "RerankModels waiting in the reconcile queue.")
QUEUE_WAIT = Histogram(
    "rerank_operator_queue_wait_seconds",
    "How long a queued RerankModel waited for a reconcile worker (the operator's own share of a change's latency).",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
CACHED_OBJECTS = Gauge("rerank_operator_cached_objects", "Objects held in the watch-fed caches, by kind.", ["kind"])


# --- per model: class, conditions, SLO and cost (issue: run it like a service) --------------------------------------
# Series per model, at most: info 1, conditions 7, and per pool (2) replicas, max, target, requests, slow, pairs,
# cost (12), GPU-only cost 1, plus the traffic/desired/decision series above (2 + 2 + 6): 33. docs/operations.md
# states it; tests/unit/operator/core/test_cost.py counts it.
MODEL_INFO = Gauge("rerank_operator_model_info", "1 for each RerankModel, with its RerankClass (class=\"\" without).",
                   ["namespace", "rerankmodel", "class"])
MODEL_CONDITION = Gauge(
    "rerank_operator_model_condition",
    "A RerankModel's status conditions: 1 True, 0 False, -1 Unknown (Degraded=1 is degraded).",
    ["namespace", "rerankmodel", "condition"],
)
POOL_REPLICAS = Gauge("rerank_operator_pool_replicas",
                      "Pods a pool's Deployment has, ready or starting (what is billed).", MODEL_LABELS)
POOL_MAX_REPLICAS = Gauge("rerank_operator_pool_max_replicas", "A pool's maxReplicas.", MODEL_LABELS)
LATENCY_TARGET = Gauge("rerank_operator_latency_target_seconds",
                       "A pool's p95 latency target (autoscaling.targets): the SLO's threshold.", MODEL_LABELS)
POOL_REQUESTS = Counter(
    "rerank_operator_pool_requests",
    "Requests a pool completed or failed, as the autoscaler measured them from TEI's metrics (the SLO's total).",
    MODEL_LABELS,
)
POOL_SLOW_REQUESTS = Counter(
    "rerank_operator_pool_slow_requests",
    "Requests slower than the pool's p95 target, or failed (the SLO's bad events; 95% within target is the SLO).",
    MODEL_LABELS,
)
POOL_PAIRS = Counter("rerank_operator_pool_pairs",
                     "Query-passage pairs a pool scored (TEI's te_batch_next_size sum).", MODEL_LABELS)
COST_LABELS = ["namespace", "rerankmodel", "class", "pool"]
POOL_COST = Counter(
    "rerank_operator_pool_cost",
    "Cost accrued by a pool: replica-hours x the RerankClass's price (spec.pricing, in its currency).", COST_LABELS,
)
GPU_ONLY_COST = Counter(
    "rerank_operator_gpu_only_cost",
    "What the same load would have cost on the GPU pool alone (the CPU INT8 pool's saving is the difference).",
    ["namespace", "rerankmodel", "class"],
)
# Scale to zero: series only for models that went to zero (a thousand awake models' /metrics stay as they were).
ZERO_SECONDS = Counter("rerank_operator_scaled_to_zero_seconds",
                       "Seconds a RerankModel spent at zero pods (scale to zero).", ["namespace", "rerankmodel"])
ZERO_SAVED_COST = Counter(
    "rerank_operator_scaled_to_zero_saved_cost",
    "What one replica of the pool a request wakes would have cost while the model was at zero (the RerankClass's "
    "price): the least it would have kept without scale to zero.", ["namespace", "rerankmodel", "class"],
)
CONDITION_VALUES = {"True": 1.0, "False": 0.0}

_LOCK = threading.Lock()
_MODEL_SERIES: dict[tuple[str, str], set[tuple[Any, tuple[str, ...]]]] = {}


def _series(metric: Any, namespace: str, model: str, *rest: str) -> Any:
    """``metric.labels(namespace, model, *rest)``, remembered so that ``forget_model`` removes it: every per-model
    series is made through here."""
    labels = (namespace, model, *rest)
    with _LOCK:
        _MODEL_SERIES.setdefault((namespace, model), set()).add((metric, labels))
    return metric.labels(*labels)


def _drop(metric: Any, labels: tuple[str, ...]) -> None:
    """Remove one per-model series made by ``_series`` (a pool disabled, a class changed)."""
    with _LOCK:
        _MODEL_SERIES.get((labels[0], labels[1]), set()).discard((metric, labels))
    forget(metric, *labels)


def record_class(namespace: str, model: str, class_name: str) -> None:
    """The model's info series; a model that changed class keeps one series (the old one is removed)."""
    with _LOCK:
        stale = [labels for m, labels in _MODEL_SERIES.get((namespace, model), ())
                 if m is MODEL_INFO and labels[2] != class_name]
    for labels in stale:
        _drop(MODEL_INFO, labels)
    _series(MODEL_INFO, namespace, model, class_name).set(1)


def record_conditions(namespace: str, model: str, conditions: Iterable[Mapping[str, Any]]) -> None:
    for cond in conditions:
        kind = str(cond.get("type", ""))
        if kind:
            _series(MODEL_CONDITION, namespace, model, kind).set(CONDITION_VALUES.get(str(cond.get("status")), -1.0))


def record_pool(namespace: str, model: str, pool: str, *, replicas: int, max_replicas: int,
                target_seconds: float) -> None:
    _series(POOL_REPLICAS, namespace, model, pool).set(replicas)
    _series(POOL_MAX_REPLICAS, namespace, model, pool).set(max_replicas)
    _series(LATENCY_TARGET, namespace, model, pool).set(target_seconds)


def count_served(namespace: str, model: str, pool: str, *, requests: float, slow: float, pairs: float) -> None:
    _series(POOL_REQUESTS, namespace, model, pool).inc(max(requests, 0.0))
    _series(POOL_SLOW_REQUESTS, namespace, model, pool).inc(max(slow, 0.0))
    _series(POOL_PAIRS, namespace, model, pool).inc(max(pairs, 0.0))


def count_cost(namespace: str, model: str, class_name: str, pools: Mapping[str, float],
               gpu_only: float | None) -> None:
    for pool, amount in pools.items():
        _series(POOL_COST, namespace, model, class_name, pool).inc(max(amount, 0.0))
    if gpu_only is not None:
        _series(GPU_ONLY_COST, namespace, model, class_name).inc(max(gpu_only, 0.0))


def count_zero(namespace: str, model: str, class_name: str, seconds: float, saved: float) -> None:
    """Time a model spent at zero, and what it saved (``ModelAutoscaler._count_zero``)."""
    _series(ZERO_SECONDS, namespace, model).inc(max(seconds, 0.0))
    _series(ZERO_SAVED_COST, namespace, model, class_name).inc(max(saved, 0.0))
