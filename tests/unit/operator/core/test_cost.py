"""Cost per tenant (core/cost.py) and the SLO's events (core/slo.py): a hand-worked example, the simulator's cost
model on the same trace, and the series the operator exports per model (their count is the one docs state)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import REGISTRY

from benchmarks.autoscale_sim import experiments, simulation, traffic, world
from rerank_operator.adapters import operator_metrics as metrics
from rerank_operator.controllers import model_autoscaler
from rerank_operator.core import cost, names, slo
from rerank_operator.core.autoscale.exposition import Histogram, fraction_above, quantile
from rerank_operator.core.autoscale.signals import PoolSignals
from rerank_operator.core.reconcile.observed import PoolsView
from tests.unit.operator.fake_cluster import FakeCluster

REPO = Path(__file__).resolve().parents[4]

PRICING = {"currency": "EUR", "gpuReplicaHour": 2.5, "cpuReplicaHour": 0.2, "gpuReplicaRequestsPerSecond": 100}


def test_a_hand_worked_hour_and_a_half() -> None:
    pricing = cost.Pricing.from_class({"pricing": PRICING})
    assert pricing is not None
    # 300 requests/s at 100/s per GPU replica, sized at 85%: 300 / 85 = 3.53 -> 4 GPU replicas alone.
    alone = cost.gpu_only_replicas(300.0, cost.gpu_capacity(None, pricing), min_replicas=1)
    assert alone == 4
    accrued = cost.accrue(pricing, cost.Usage(5400.0, {"gpu": 2, "cpu": 3}, alone))
    assert accrued.pools == {"gpu": pytest.approx(7.5), "cpu": pytest.approx(0.9)}  # 2 x 2.5 x 1.5, 3 x 0.2 x 1.5
    assert accrued.total == pytest.approx(8.4)
    assert accrued.gpu_only == pytest.approx(15.0)                                    # 4 x 2.5 x 1.5
    assert cost.summary(pricing, {"gpu": 2, "cpu": 3}, alone) == {
        "currency": "EUR", "perHour": "5.6000",
        "pools": {"gpu": {"replicas": 2, "perHour": "5.0000"}, "cpu": {"replicas": 3, "perHour": "0.6000"}},
        "gpuOnlyPerHour": "10.0000", "savedPercent": 44,                              # (10 - 5.6) / 10
    }


def test_the_capacity_a_gpu_pool_has_shown_wins_over_the_platforms_figure() -> None:
    pricing = cost.Pricing.from_class({"pricing": PRICING})
    assert pricing is not None
    assert cost.gpu_capacity(170.0, pricing) == 170.0 and cost.gpu_capacity(None, pricing) == 100.0
    # Seen only below target, a capacity is a lower bound: it may raise the platform's figure, never stand alone.
    assert cost.gpu_capacity(5.0, pricing, saturated=False) == 100.0
    assert cost.gpu_capacity(170.0, pricing, saturated=False) == 170.0
    assert cost.gpu_only_replicas(300.0, 170.0) == 3          # 300 / (170 x 0.85) = 2.08
    assert cost.gpu_only_replicas(0.0, 170.0, min_replicas=2) == 2
    assert cost.gpu_only_replicas(0.0, 170.0, min_replicas=0) == 1  # serving at all takes one replica
    unknown = cost.Pricing.from_class({"pricing": {"cpuReplicaHour": 0.2}})
    assert unknown is not None and cost.gpu_capacity(None, unknown) is None
    assert cost.gpu_capacity(5.0, unknown, saturated=False) is None
    assert cost.gpu_only_replicas(300.0, None) is None
    summary = cost.summary(unknown, {"gpu": 0, "cpu": 2}, None)
    assert "gpuOnlyPerHour" not in summary and "savedPercent" not in summary
    assert summary["pools"] == {"cpu": {"replicas": 2, "perHour": "0.4000"}}  # an unpriced, empty GPU pool: left out


@pytest.mark.parametrize("pricing", [None, {}, {"currency": "USD"}, {"gpuReplicaHour": "2.5"},
                                     {"cpuReplicaHour": float("nan")}, {"gpuReplicaHour": -1},
                                     {"cpuReplicaHour": True}])
def test_no_usable_price_means_no_cost_figures(pricing: object) -> None:
    assert cost.Pricing.from_class({"pricing": pricing} if pricing is not None else {}) is None


def _pools(gpu: int, cpu: int) -> PoolsView:
    """What the autoscaler observes: each pool's Deployment with ``n`` pods (all ready), and one scrapeable pod each."""
    def deployment(pool: str, n: int) -> dict[str, Any]:
        return {"metadata": {"name": f"m-{pool}", "labels": {names.LABEL_POOL: pool}}, "spec": {"replicas": n},
                "status": {"replicas": n, "readyReplicas": n}}

    def pod(pool: str, i: int) -> dict[str, Any]:
        return {"metadata": {"name": f"m-{pool}-{i}", "labels": {names.LABEL_POOL: pool}},
                "status": {"podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]}}

    return PoolsView(deployments={"gpu": deployment("gpu", gpu), "cpu": deployment("cpu", cpu)},
                     pods=(pod("gpu", 1), pod("cpu", 2)))


def test_the_operators_own_loop_meters_what_the_simulators_cost_model_bills_on_the_same_trace() -> None:
    """The simulator bills each second's pods; the operator's autoscaler (``ModelAutoscaler``, the loop it runs for
    every model) bills, at each of its ticks, the pods it observes for the interval since its last tick and exports
    the sum as ``rerank_operator_pool_cost``. Driven on a fake clock through two hours of traffic stepping up and
    down, with the pools scaled as the simulator's policy scaled them, the exported total and the simulator's agree
    within 1%."""
    gpu = world.PoolModel("gpu", 120, 0.05, 120, 1, 6, 2.5)
    cpu = world.PoolModel("cpu", 10.0, 0.12, 40.0, 1, 32, 0.2)
    spec = experiments.policy_spec(gpu, cpu)
    rates = traffic.square(20, hours=2.0, seed=3)  # 20-minute steps between 150 and 550 requests/s
    run = simulation.RunSpec("policy", lambda: experiments.policy_controller(spec), period=int(spec.interval_seconds),
                             histogram=True)
    seconds: list[np.ndarray] = []
    [result] = simulation.simulate(rates, [run], gpu, cpu, 0.5, seed=3, replicas=seconds)
    pods = np.array([row[0] for row in seconds])      # (second, pool): gpu, cpu
    assert pods[:, 0].max() > pods[:, 0].min() and pods[:, 1].max() > pods[:, 1].min()  # both pools scaled

    priced = {"metadata": {"name": "priced"}, "spec": {"pricing": {
        "currency": "USD", "gpuReplicaHour": gpu.price_per_hour, "cpuReplicaHour": cpu.price_per_hour}}}
    model = {"metadata": {"name": "metered", "namespace": "cost", "uid": "u1", "generation": 1},
             "spec": {"className": "priced", "model": {"id": "org/m"},
                      "pools": {"gpu": {"minReplicas": 1, "maxReplicas": 6}, "cpu": {"minReplicas": 1,
                                                                                        "maxReplicas": 32}},
                      "autoscaling": {"intervalSeconds": int(spec.interval_seconds)}}}
    clock = [0.0]
    cluster = FakeCluster(model, view=_pools(int(pods[0, 0]), int(pods[0, 1])), classes=[priced])
    loop = model_autoscaler.ModelAutoscaler(cluster, "cost", "metered", fetch=lambda url, timeout: "te_queue_size 0\n",
                                            clock=lambda: clock[0], now_iso=lambda: "t")
    while clock[0] < len(pods):
        cluster.view = _pools(int(pods[int(clock[0]), 0]), int(pods[int(clock[0]), 1]))
        clock[0] += loop.tick()
    labels = {"namespace": "cost", "rerankmodel": "metered", "class": "priced"}
    exported = sum(REGISTRY.get_sample_value("rerank_operator_pool_cost_total", {**labels, "pool": pool}) or 0.0
                   for pool in ("gpu", "cpu"))
    metrics.forget_model("cost", "metered")
    assert exported == pytest.approx(result["cost_usd"], rel=0.01)


def test_fraction_above_inverts_histogram_quantile() -> None:
    hist = Histogram({0.1: 10, 0.2: 60, 0.5: 90, 1.0: 100, math.inf: 100}, 100, 0)
    for q in (0.05, 0.5, 0.9, 0.95, 0.99):
        bound = quantile(q, hist)
        assert bound is not None and fraction_above(bound, hist) == pytest.approx(1 - q)
    assert fraction_above(2.0, hist) == 0.0 and fraction_above(0.0, hist) == 1.0
    assert fraction_above(0.5, Histogram({0.1: 0, math.inf: 0}, 0, 0)) is None          # nothing observed
    beyond = Histogram({0.1: 5, 1.0: 5, math.inf: 8}, 8, 0)                              # 3 past the top bound
    assert fraction_above(2.0, beyond) == pytest.approx(3 / 8)


def test_the_slo_counts_slow_and_failed_requests_as_bad() -> None:
    latency = Histogram({0.1: 10, 0.2: 60, 0.5: 90, 1.0: 100, math.inf: 100}, 100, 0)
    signals = PoolSignals(ready_replicas=2, request_rate=21.0, success_rate=20.0, failure_rate=1.0, pair_rate=160.0,
                          latency=latency)
    served = slo.served(signals, target_seconds=0.5, seconds=10.0)
    assert served is not None
    assert served.requests == pytest.approx(210.0)            # (20 completed + 1 failed) x 10 s
    assert served.slow == pytest.approx(20 * 0.1 * 10 + 10)   # 10% of the completed past 0.5 s, and every failure
    assert served.pairs == pytest.approx(1600.0)
    assert slo.served(PoolSignals(ready_replicas=1, error="no pod answered"), 0.5, 10.0) is None
    assert slo.served(PoolSignals(ready_replicas=1), 0.5, 10.0) is None                 # first scrape: no rate yet


def _series_of(model: str) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for family in REGISTRY.collect() for s in family.samples
            if s.labels.get("rerankmodel") == model and not s.name.endswith("_created")]


def test_series_per_model_are_bounded_as_documented_and_all_go_with_the_model() -> None:
    model = "cardinality-probe"
    conditions = [{"type": t, "status": "True"} for t in ("Ready", "ModelReady", "PoolsAvailable", "Degraded",
                                                          "ClassCompliant", "MetricsAvailable", "TrafficEnforced")]
    for _ in range(3):  # every reconcile and tick again: the same series, never more
        metrics.record_class("ns", model, "gold")
        metrics.record_conditions("ns", model, conditions)
        metrics.record_model("ns", model, traffic={"gpu": 80, "cpu": 20}, replicas={"gpu": 2, "cpu": 3})
        for pool in ("gpu", "cpu"):
            metrics.record_pool("ns", model, pool, replicas=2, max_replicas=4, target_seconds=0.25)
            metrics.count_served("ns", model, pool, requests=10, slow=1, pairs=80)
            for reason in metrics.DECISION_REASONS:
                metrics.count_decision("ns", model, pool, reason)
        metrics.count_cost("ns", model, "gold", {"gpu": 0.1, "cpu": 0.01}, 0.3)
    documented = re.search(r"\*\*(\d+) series per model\*\*", (REPO / "docs" / "operations.md").read_text())
    assert documented, "docs/operations.md must state the series per model as **N series per model**"
    assert len(_series_of(model)) == int(documented[1])
    metrics.record_class("ns", model, "silver")           # a model moved to another class keeps one info series
    assert [labels["class"] for name, labels in _series_of(model) if name == "rerank_operator_model_info"] == ["silver"]
    metrics.forget_model("ns", model)
    assert _series_of(model) == []
