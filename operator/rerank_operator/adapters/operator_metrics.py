"""The operator's own Prometheus metrics (the TEI pods' metrics are the autoscaler's business).

``rerank_operator_api_writes_total`` counts every write request the operator makes (every request goes through
``kube_api.Client``), which is how dashboards and the cluster tests check that an idle operator writes nothing.
"""

from __future__ import annotations

import contextlib

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


def record_model(namespace: str, model: str, traffic: dict[str, int], replicas: dict[str, int]) -> None:
    """Per-model gauges after a reconcile; pools not listed (disabled) are removed."""
    for pool in ("cpu", "gpu"):
        for gauge, values in ((TRAFFIC_WEIGHT, traffic), (DESIRED_REPLICAS, replicas)):
            if pool in values:
                gauge.labels(namespace, model, pool).set(values[pool])
            else:
                forget(gauge, namespace, model, pool)


def forget_model(namespace: str, model: str) -> None:
    for pool in ("cpu", "gpu"):
        forget(TRAFFIC_WEIGHT, namespace, model, pool)
        forget(DESIRED_REPLICAS, namespace, model, pool)
        for reason in DECISION_REASONS:
            forget(SCALING_DECISIONS, namespace, model, pool, reason)


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
