"""The autoscaler's shell (controllers/model_autoscaler.py, autoscale_loop.py) against a fake API: what it writes,
when, and what it leaves alone."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from rerank_operator.adapters import signal_sources, tei_scrape
from rerank_operator.controllers import autoscale_loop, class_index, model_autoscaler
from rerank_operator.controllers.handoff import Handoff
from rerank_operator.core import names
from rerank_operator.core.autoscale import policy, record
from rerank_operator.core.reconcile.observed import PoolsView
from rerank_operator.core.settings import Settings
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions
from rerank_operator.core.status.conditions import Condition
from tests.unit.operator.fake_cluster import FakeCluster, merge

NS, NAME = "ns", "m"


def dep(pool: str, replicas: int, ready: int | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"{NAME}-{pool}", "labels": {names.LABEL_POOL: pool}},
            "spec": {"replicas": replicas}, "status": {"readyReplicas": replicas if ready is None else ready}}


def pod(pool: str, i: int, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": f"{NAME}-{pool}-{i}", "labels": {names.LABEL_POOL: pool}},
            "status": {"podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": str(ready)}]}}


def route(gpu: int, cpu: int) -> dict[str, Any]:
    return {"spec": {"rules": [{"backendRefs": [{"name": f"{NAME}-gpu", "weight": gpu},
                                                {"name": f"{NAME}-cpu", "weight": cpu}]}]}}


def stored(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": NAME, "namespace": NS, "uid": "u1", "generation": 1},
            "spec": spec, "status": {"traffic": {"gpuPercent": 100, "cpuPercent": 0}}}


class FakeTei:
    """te_* text whose request counter grows by ``rate`` per second of the fake clock; latency from ``p95``."""

    def __init__(self, clock: list[float], rate: float, latency: float) -> None:
        self.clock, self.rate, self.latency, self.up = clock, rate, latency, True

    def __call__(self, url: str, timeout: float) -> str:
        if not self.up:
            raise OSError("connection refused")
        n = self.rate * self.clock[0]
        le = "0.05" if self.latency <= 0.05 else "2.5"
        return "\n".join([
            f"te_request_count {n}", f"te_request_success {n}", "te_queue_size 0",
            "# TYPE te_request_duration histogram",
            f'te_request_duration_bucket{{le="{le}"}} {n}', f'te_request_duration_bucket{{le="+Inf"}} {n}',
            f"te_request_duration_sum {n * self.latency}", f"te_request_duration_count {n}", ""])


SPEC = {"model": {"id": "org/m"}, "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 4},
                                            "gpu": {"minReplicas": 1, "maxReplicas": 3}},
        "routing": {"gateway": {"parentRefs": [{"name": "gw"}]}},
        "autoscaling": {"intervalSeconds": 5, "scaleUp": {"cooldownSeconds": 0}}}


def loop(spec: dict[str, Any] = SPEC, rate: float = 5.0, latency: float = 0.03,
         view: PoolsView | None = None) -> tuple[model_autoscaler.ModelAutoscaler, FakeCluster, FakeTei, list[float]]:
    clock = [1000.0]
    tei = FakeTei(clock, rate, latency)
    view = view or PoolsView(deployments={"gpu": dep("gpu", 1), "cpu": dep("cpu", 1)},
                             pods=(pod("gpu", 1), pod("cpu", 2)), route=route(100, 0))
    fake = FakeCluster(stored(copy.deepcopy(spec)), view=view)
    applied: list[int] = []
    a = model_autoscaler.ModelAutoscaler(fake, NS, NAME, after_decision=lambda: applied.append(1),
                                   fetch=tei, clock=lambda: clock[0], now_iso=lambda: f"t{clock[0]:.0f}")
    return a, fake, tei, clock


def ticks(a: model_autoscaler.ModelAutoscaler, clock: list[float], n: int) -> None:
    for _ in range(n):
        clock[0] += a.tick()


def test_first_tick_primes_then_records_a_decision_once_and_steady_load_writes_nothing() -> None:
    a, fake, _, clock = loop()
    ticks(a, clock, 1)
    assert fake.patches == []  # the direct source's rates need a second scrape
    ticks(a, clock, 1)
    assert len(fake.patches) == 1
    st = fake.body["status"]
    decision = st["autoscaling"]["lastDecision"]
    assert (decision["gpuReplicas"], decision["cpuReplicas"], decision["gpuPercent"],
            decision["held"]) == (1, 1, 100, False)
    assert st["autoscaling"]["fresh"] is True and st["autoscaling"]["signals"]["gpu"]["requestRate"] > 0
    conds = {c["type"]: (c["status"], c["reason"]) for c in st["conditions"]}
    assert conds == {"MetricsAvailable": ("True", "MetricsFresh"), "TrafficEnforced": ("True", "HTTPRoute")}
    assert st["traffic"] == {"gpuPercent": 100, "cpuPercent": 0}  # the reconcile loop's field: untouched
    ticks(a, clock, 10)
    assert len(fake.patches) == 1 and fake.events == [] and fake.annotations == []


def test_overload_scales_records_events_and_saves_the_history() -> None:
    a, fake, tei, clock = loop()
    ticks(a, clock, 2)
    tei.rate, tei.latency = 80.0, 2.0
    ticks(a, clock, 2)
    decision = fake.body["status"]["autoscaling"]["lastDecision"]
    assert decision["gpuReplicas"] > 1
    assert "ScaledUp" in {r for r, _ in fake.events}
    saved = json.loads(fake.annotations[-1][record.HISTORY_ANNOTATION])
    assert saved["v"] == 1 and saved["gpu"]["up"] is not None


def test_a_missed_scrape_writes_nothing() -> None:
    a, fake, tei, clock = loop()
    ticks(a, clock, 2)
    tei.up = False
    ticks(a, clock, 1)
    tei.up = True
    ticks(a, clock, 5)
    assert len(fake.patches) == 1 and fake.events == []   # the first decision only: the miss's sample was 5 s old
    assert fake.body["status"]["autoscaling"]["fresh"] is True


def test_lost_metrics_hold_once_the_last_sample_is_stale_and_say_so_once() -> None:
    a, fake, tei, clock = loop()
    ticks(a, clock, 2)
    tei.up = False
    start = clock[0]
    while clock[0] - start < 55:  # staleAfterSeconds 60 (the default): the last sample stands in until then
        ticks(a, clock, 1)
    assert len(fake.patches) == 1
    ticks(a, clock, 3)
    st = fake.body["status"]
    assert len(fake.patches) == 2  # one decision, then one hold: not one write per tick
    assert st["autoscaling"]["lastDecision"]["held"] is True and st["autoscaling"]["fresh"] is False
    last = st["autoscaling"]["lastDecision"]
    assert (last["gpuReplicas"], last["cpuReplicas"]) == (1, 1)
    cond = next(c for c in st["conditions"] if c["type"] == "MetricsAvailable")
    assert (cond["status"], cond["reason"]) == ("False", "MetricsStale") and "connection refused" in cond["message"]


def test_without_gateway_the_split_is_not_enforced_and_external_replicas_are_not_recorded() -> None:
    spec = {**SPEC, "routing": {}, "autoscaling": {**SPEC["autoscaling"], "replicaManagement": "external"}}
    a, fake, _, clock = loop(spec, view=PoolsView(deployments={"gpu": dep("gpu", 1), "cpu": dep("cpu", 1)},
                                                  pods=(pod("gpu", 1), pod("cpu", 2))))
    ticks(a, clock, 2)
    st = fake.body["status"]
    cond = next(c for c in st["conditions"] if c["type"] == "TrafficEnforced")
    assert (cond["status"], cond["reason"]) == ("False", "NoGateway") and "still scaled" in cond["message"]
    last = st["autoscaling"]["lastDecision"]
    assert "gpuReplicas" not in last and last["gpuPercent"] == 100


def test_gpu_pool_lost_records_the_shift_the_reconcile_loop_already_made() -> None:
    a, fake, _, clock = loop()
    ticks(a, clock, 2)
    fake.view = PoolsView(deployments={"gpu": dep("gpu", 1, ready=0), "cpu": dep("cpu", 1)}, pods=(pod("cpu", 2),),
                          route=route(0, 100))
    ticks(a, clock, 1)
    assert fake.body["status"]["autoscaling"]["lastDecision"]["cpuPercent"] == 100
    assert [r for r, _ in fake.events] == ["TrafficShifted"]


def test_disabling_removes_the_autoscalers_status_and_undeployed_pools_are_left_alone() -> None:
    a, fake, _, clock = loop()
    ticks(a, clock, 2)
    fake.body["spec"]["autoscaling"]["enabled"] = False
    ticks(a, clock, 1)
    st = fake.body["status"]
    assert "autoscaling" not in st and not any(c["type"] in conditions.AUTOSCALER_OWNED for c in st["conditions"])
    ticks(a, clock, 2)
    assert len(fake.patches) == 2

    b, other, _, clock = loop(view=PoolsView())  # no Deployments yet (the first artifact is being built)
    ticks(b, clock, 3)
    assert other.patches == []


def test_status_patch_ignores_what_moves_every_tick() -> None:
    d = policy.Decision(2, 1, 25, "reason one")
    record = {"signals": {"gpu": {"requestRate": 1.0}}, "fresh": True, "lastDecision": {"gpuReplicas": 2,
              "cpuReplicas": 1, "gpuPercent": 75, "cpuPercent": 25, "held": False, "time": "t1", "reason": d.reason}}
    conds = [Condition("MetricsAvailable", "True", "MetricsFresh", "a")]
    patch = statuses.autoscaler_patch({}, record, conds, generation=1, now="t1")
    previous = merge({}, patch)
    moved = {**record, "signals": {"gpu": {"requestRate": 9.0}},
             "lastDecision": {**record["lastDecision"], "time": "t2", "reason": "reason two"}}
    assert statuses.autoscaler_patch(previous, moved, [Condition("MetricsAvailable", "True", "MetricsFresh", "b")],
                                     generation=1, now="t2") == {}
    changed = {**moved, "lastDecision": {**moved["lastDecision"], "gpuReplicas": 3}}
    patch = statuses.autoscaler_patch(previous, changed, conds, generation=1, now="t2")
    assert patch["autoscaling"]["lastDecision"]["gpuReplicas"] == 3 and patch["autoscaling"]["signals"]


def test_current_split_comes_from_the_route_else_the_status() -> None:
    assert record.current_cpu_percent(route(3, 1), NAME, {}) == 25
    assert record.current_cpu_percent(None, NAME, {"traffic": {"cpuPercent": 40}}) == 40
    assert record.current_cpu_percent(route(0, 0), NAME, {}) == 0


def test_the_two_builders_own_disjoint_fields_and_carry_the_others_over() -> None:
    """status.compute (the reconcile loop's) and status.autoscaler_part (the autoscaler's) split the status: each
    replaces only its own fields and conditions, so either may write after the other without losing anything."""
    reconciled = {"observedGeneration": 1, "phase": "Ready", "traffic": {"gpuPercent": 100, "cpuPercent": 0},
                  "conditions": [{"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": "",
                                  "observedGeneration": 1, "lastTransitionTime": "t0"}]}
    record = {"fresh": True, "lastDecision": {"gpuReplicas": 2, "cpuReplicas": 1, "gpuPercent": 75, "cpuPercent": 25}}
    both = statuses.autoscaler_part(reconciled, record, [Condition("MetricsAvailable", "True", "MetricsFresh", "m")],
                                    generation=1, now="t1")
    assert {k: v for k, v in both.items() if k != "conditions"} == {
        **{k: v for k, v in reconciled.items() if k != "conditions"}, "autoscaling": record}
    assert [c["type"] for c in both["conditions"]] == ["Ready", "MetricsAvailable"]
    assert both["conditions"][0] == reconciled["conditions"][0]
    off = statuses.autoscaler_part(both, None, [], generation=1, now="t2")
    assert off == reconciled
    assert statuses.merge_patch(both, off) == {"autoscaling": None, "conditions": reconciled["conditions"]}


class Fleet:
    """Several models' FakeClusters behind one ClusterAccess, by the owner's name (the fleet loop's view)."""

    def __init__(self, models: dict[str, FakeCluster]) -> None:
        self.models = models

    def all_keys(self) -> list[tuple[str, str]]:
        return [(NS, name) for name in self.models]

    def __getattr__(self, method: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            name = args[1] if method == "get_model" else args[0].name if args else None
            fake = self.models[str(name)] if name in self.models else next(iter(self.models.values()))
            return getattr(fake, method)(*args, **kwargs)
        return call


class RecordingSources(signal_sources.Sources):
    def __init__(self, tei: FakeTei, clock: list[float]) -> None:
        super().__init__(tei_scrape.ScrapePool(fetch=tei, clock=lambda: clock[0]))
        self.batches: list[list[tuple[str, str]]] = []

    def collect(self, batch: Any) -> Any:
        self.batches.append(sorted(batch))
        return super().collect(batch)


def test_the_fleet_loop_collects_every_due_model_in_one_batch_and_ticks_on_aligned_times() -> None:
    clock = [1001.0]
    tei = FakeTei(clock, 5.0, 0.03)
    view = PoolsView(deployments={"gpu": dep("gpu", 1), "cpu": dep("cpu", 1)},
                     pods=(pod("gpu", 1), pod("cpu", 2)), route=route(100, 0))
    fakes = {}
    for name, interval in (("a", 5), ("b", 5), ("c", 10)):
        body = stored({**copy.deepcopy(SPEC), "autoscaling": {**SPEC["autoscaling"], "intervalSeconds": interval}})
        body["metadata"]["name"] = name
        fakes[name] = FakeCluster(body, view=view)
    fleet = Fleet(fakes)
    sources = RecordingSources(tei, clock)
    decided: list[tuple[str, str]] = []
    loop = autoscale_loop.FleetAutoscaler(fleet, registry=class_index.Registry(),  # type: ignore[arg-type]
                                      settings=Settings(), handoff=Handoff(), models=fleet,
                                      after_decision=decided.append, sources=sources, clock=lambda: clock[0])
    for _ in range(5):
        clock[0] += loop.round()
    # Every model is due at once first; then a and b every 5 s on multiples of 5, c every 10 s with them.
    assert sources.batches[0] == [(NS, "a"), (NS, "b"), (NS, "c")]
    assert all(b in ([(NS, "a"), (NS, "b")], [(NS, "a"), (NS, "b"), (NS, "c")]) for b in sources.batches[1:])
    assert clock[0] % 5 == 0
    # Each model primed on its first tick and recorded one decision on its second, like a model alone.
    assert sorted(set(decided)) == [(NS, "a"), (NS, "b"), (NS, "c")]
    assert all(len(f.patches) == 1 for f in fakes.values())


def test_the_first_rates_span_at_least_half_an_interval_after_the_priming_scrape() -> None:
    # Primed 10 ms before a grid point: rates taken there would span 10 ms (a fake pod's counters, or a real one's
    # between two requests, read 0): the first decision waits for the grid point after.
    clock = [1004.99]
    tei = FakeTei(clock, 5.0, 0.03)
    view = PoolsView(deployments={"gpu": dep("gpu", 1), "cpu": dep("cpu", 1)},
                     pods=(pod("gpu", 1), pod("cpu", 2)), route=route(100, 0))
    fake = FakeCluster(stored(copy.deepcopy(SPEC)), view=view)
    fleet = Fleet({NAME: fake})
    loop = autoscale_loop.FleetAutoscaler(fleet, registry=class_index.Registry(),  # type: ignore[arg-type]
                                      settings=Settings(), handoff=Handoff(), models=fleet,
                                      sources=RecordingSources(tei, clock), after_decision=lambda key: None,
                                      clock=lambda: clock[0])
    loop.round()  # primes
    state = loop.states[(NS, NAME)]
    assert state.primed_at == 1004.99 and state.next_due == 1010.0
    assert state.next_due - state.primed_at >= 2.5
    clock[0] = 1010.0
    loop.round()  # decides on 5 s of rates, and ticks on the grid from then on
    assert state.primed_at is None and state.next_due == 1015.0 and len(fake.patches) == 1


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_priced_class_meters_cost_slo_events_and_pairs_every_tick() -> None:
    """Two pods in each pool at 2.50 and 0.20 per replica-hour, 5 s ticks: each tick after the first adds
    2 x 2.5 x 5/3600 and 2 x 0.2 x 5/3600; 10 requests/s at 30 ms against a 250 ms target are never slow."""
    namespace = "metered"
    view = PoolsView(deployments={p: {**dep(p, 2), "status": {"readyReplicas": 2, "replicas": 2}}
                                  for p in ("gpu", "cpu")},
                     pods=(pod("gpu", 1), pod("gpu", 2), pod("cpu", 3), pod("cpu", 4)), route=route(100, 0))
    clock = [1000.0]
    tei = FakeTei(clock, 5.0, 0.03)
    gold = {"apiVersion": "rerank.io/v1alpha1", "kind": "RerankClass",
            "metadata": {"name": "gold", "annotations": {"rerank.io/is-default-class": "true"}},
            "spec": {"pricing": {"currency": "EUR", "gpuReplicaHour": 2.5, "cpuReplicaHour": 0.2,
                                 "gpuReplicaRequestsPerSecond": 100}}}
    body = stored(copy.deepcopy(SPEC))
    body["metadata"]["namespace"] = namespace
    fake = FakeCluster(body, view=view, classes=[gold])
    a = model_autoscaler.ModelAutoscaler(fake, namespace, NAME, fetch=tei, clock=lambda: clock[0],
                                   now_iso=lambda: f"t{clock[0]:.0f}")
    ticks(a, clock, 6)  # the first look starts the meter (and primes the rates): 5 intervals of 5 s metered
    labels = {"namespace": namespace, "rerankmodel": NAME}
    assert _sample("rerank_operator_pool_cost_total", **labels, **{"class": "gold"}, pool="gpu") == \
        pytest.approx(5 * 2 * 2.5 * 5 / 3600)
    assert _sample("rerank_operator_pool_cost_total", **labels, **{"class": "gold"}, pool="cpu") == \
        pytest.approx(5 * 2 * 0.2 * 5 / 3600)
    # 4 pods x 5 requests/s = 20/s; at 100/s per GPU replica (85% used) one GPU replica would do, at 2.50 an hour.
    assert _sample("rerank_operator_gpu_only_cost_total", **labels, **{"class": "gold"}) == \
        pytest.approx(5 * 1 * 2.5 * 5 / 3600)
    served = _sample("rerank_operator_pool_requests_total", **labels, pool="gpu")
    assert served == pytest.approx(5 * 2 * 5.0 * 5)  # five intervals, two pods at 5/s, 5 s each
    assert _sample("rerank_operator_pool_slow_requests_total", **labels, pool="gpu") == 0.0
    assert _sample("rerank_operator_latency_target_seconds", **labels, pool="gpu") == 0.25
    assert _sample("rerank_operator_pool_replicas", **labels, pool="cpu") == 2
    assert _sample("rerank_operator_model_condition", **labels, condition="MetricsAvailable") == 1
    summary = fake.body["status"]["autoscaling"]["cost"]
    assert summary["currency"] == "EUR" and summary["gpuOnlyPerHour"] == "2.5000"
    tei.latency = 2.0  # every request now lands in TEI's (0, 2.5 s] bucket
    before = _sample("rerank_operator_pool_slow_requests_total", **labels, pool="gpu")
    ticks(a, clock, 1)
    # Interpolated inside the bucket as histogram_quantile would: 0.25 / 2.5 = 10% of it below the target.
    assert _sample("rerank_operator_pool_slow_requests_total", **labels, pool="gpu") - before == \
        pytest.approx(0.9 * 2 * 5.0 * 5)
