"""``PrometheusSource.collect_many``: one query per signal for the whole fleet, the same signals as per model.

A fake Prometheus evaluates both shapes of query over one table of per-pod series, the way Prometheus would: label
matchers (anchored regexes), `count`/`sum`/`max` with or without `by (namespace, pod[, le])`, and
`histogram_quantile` over `sum by (le)` written from Prometheus' own Go code (promql/quantile.go, bucketQuantile),
not from the operator's ``exposition.quantile``, so the per-model answers are what a real server would give.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from prometheus_client import REGISTRY

from rerank_operator.adapters.prometheus_api import ModelPods, PrometheusSource, build_selector, fleet_selector
from rerank_operator.core.autoscale import exposition

URL = "http://prom:9090"
INF = math.inf
#: TEI's duration buckets (metrics-exporter-prometheus in TEI's router: 1e-5 x 1.5^n, 35 of them) and +Inf.
TEI_BOUNDS = [1e-5 * 1.5 ** n for n in range(1, 36)] + [INF]


@dataclass
class Pod:
    """The series Prometheus holds for one TEI pod (rates already taken over the window)."""

    up: float = 1.0
    scraped_at: float = 1000.0
    request_rate: float | None = 0.0
    success_rate: float | None = 0.0
    failure_rate: float | None = None        # TEI creates the counter on the first failure
    queue_size: float = 0.0
    pair_rate: float | None = None           # rate(te_batch_next_size_sum): absent until TEI batched once
    duration: Mapping[float, float] = field(default_factory=dict)        # le -> rate of the cumulative bucket
    queue_duration: Mapping[float, float] = field(default_factory=dict)
    gpu_used: float | None = None
    gpu_total: float | None = None


def buckets(rate: float, center: int, spread: int = 3) -> dict[float, float]:
    """Cumulative TEI bucket rates: `rate` observations/s spread over the buckets around index `center`."""
    cumulative, running = {}, 0.0
    weights = {i: spread + 1 - abs(i - center) for i in range(center - spread, center + spread + 1)}
    total = sum(weights.values())
    for i, bound in enumerate(TEI_BOUNDS):
        running += rate * weights.get(i, 0) / total
        cumulative[bound] = running
    cumulative[INF] = rate
    return cumulative


def bucket_quantile(q: float, le_counts: Mapping[float, float]) -> float:
    """Prometheus' bucketQuantile (promql/quantile.go), line for line, for classic buckets."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -INF
    if q > 1:
        return INF
    ordered = sorted(le_counts.items())
    if not ordered or not math.isinf(ordered[-1][0]):
        return math.nan
    counts = []                                   # ensureMonotonic
    high = -INF
    for bound, count in ordered:
        high = max(high, count)
        counts.append((bound, high))
    if len(counts) < 2:
        return math.nan
    observations = counts[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = next((i for i in range(len(counts) - 1) if counts[i][1] >= rank), len(counts) - 1)  # sort.Search
    if b == len(counts) - 1:
        return counts[-2][0]
    if b == 0 and counts[0][0] <= 0:
        return counts[0][0]
    start, end, count = 0.0, counts[b][0], counts[b][1]
    if b > 0:
        start = counts[b - 1][0]
        count -= counts[b - 1][1]
        rank -= counts[b - 1][1]
    return start + (end - start) * (rank / count)


_MATCHER = re.compile(r'(namespace|pod)(=~|=)"((?:[^"\\]|\\.)*)"')


class FakePrometheus:
    """Answers POSTed instant queries over `series`: {(namespace, pod): Pod}."""

    def __init__(self, series: Mapping[tuple[str, str], Pod]) -> None:
        self.series = series
        self.asked: list[str] = []
        self.fail: str | None = None  # a query containing this fails

    def post(self, url: str, data: bytes, timeout: float) -> bytes:
        assert url == f"{URL}/api/v1/query"
        [query] = urllib.parse.parse_qs(data.decode())["query"]
        self.asked.append(query)
        if self.fail and self.fail in query:
            return json.dumps({"status": "error", "errorType": "timeout", "error": "query timed out"}).encode()
        result = [{"metric": labels, "value": [1000.0, repr(value)]} for labels, value in self.evaluate(query)]
        return json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()

    def selected(self, query: str) -> list[tuple[tuple[str, str], Pod]]:
        matchers = {}
        for label, op, raw in _MATCHER.findall(query):
            value = raw.replace('\\"', '"').replace("\\\\", "\\")
            matchers[label] = value if op == "=~" else re.escape(value)
        return [(key, pod) for key, pod in self.series.items()
                if all(re.fullmatch(matchers[label], value) for label, value in zip(("namespace", "pod"), key,
                                                                                   strict=True) if label in matchers)]

    def evaluate(self, query: str) -> list[tuple[dict[str, str], float]]:
        pods = self.selected(query)
        per_pod = "by (namespace, pod" in query
        if query.startswith("histogram_quantile("):
            q = float(query[len("histogram_quantile("):].split(",")[0])
            name = "queue_duration" if "queue_duration" in query else "duration"
            summed: dict[float, float] = {}
            for _, pod in pods:
                for bound, rate in getattr(pod, name).items():
                    summed[bound] = summed.get(bound, 0.0) + rate
            return [({}, bucket_quantile(q, summed))] if summed else []
        if "_bucket{" in query:
            name = "queue_duration" if "queue_duration" in query else "duration"
            return [({"namespace": ns, "pod": p, "le": "+Inf" if math.isinf(b) else repr(b)}, rate)
                    for (ns, p), pod in pods for b, rate in getattr(pod, name).items()]
        if "DCGM_USED" in query:
            found = [(key, pod.gpu_used / pod.gpu_total) for key, pod in pods
                     if pod.gpu_used is not None and pod.gpu_total]
            return self.group(found, per_pod, max)
        if "timestamp(up" in query:
            return self.group([(key, pod.scraped_at) for key, pod in pods], per_pod, max)
        if "up{" in query:
            return self.group([(key, 1.0) for key, pod in pods if pod.up == 1], per_pod, sum)
        for signal in ("request_rate", "success_rate", "failure_rate", "queue_size", "pair_rate"):
            metric = {"request_rate": "te_request_count{", "success_rate": "te_request_success{",
                      "failure_rate": "te_request_failure{", "queue_size": "te_queue_size{",
                      "pair_rate": "te_batch_next_size_sum{"}[signal]
            if metric in query:
                found = [(key, getattr(pod, signal)) for key, pod in pods if getattr(pod, signal) is not None]
                return self.group(found, per_pod, sum)
        raise AssertionError(f"the fake does not know {query}")

    @staticmethod
    def group(found: list[tuple[tuple[str, str], float]], per_pod: bool,
              how: object) -> list[tuple[dict[str, str], float]]:
        if not found:
            return []
        if per_pod:
            out: dict[tuple[str, str], list[float]] = {}
            for key, value in found:
                out.setdefault(key, []).append(value)
            return [({"namespace": ns, "pod": p}, how(values)) for (ns, p), values in out.items()]  # type: ignore[operator]
        return [({}, how(value for _, value in found))]  # type: ignore[operator]


SERIES = {
    ("team-a", "ra-gpu-0"): Pod(request_rate=12.0, success_rate=11.5, failure_rate=0.5, queue_size=3, pair_rate=96.0,
                                duration=buckets(12.0, 20), queue_duration=buckets(12.0, 8),
                                gpu_used=30.0, gpu_total=40.0, scraped_at=1001.0),
    ("team-a", "ra-gpu-1"): Pod(request_rate=8.0, success_rate=8.0, queue_size=5, pair_rate=64.0,
                                duration=buckets(8.0, 24), queue_duration=buckets(8.0, 12), gpu_used=10.0,
                                gpu_total=40.0, scraped_at=999.0),
    ("team-a", "ra-cpu-0"): Pod(request_rate=2.0, success_rate=2.0, queue_size=1, duration=buckets(2.0, 28)),
    # Same pod name as in team-a, another model: never mixed up.
    ("team-b", "ra-gpu-0"): Pod(request_rate=100.0, success_rate=100.0, queue_size=40,
                                duration=buckets(100.0, 30, spread=1), gpu_used=39.0, gpu_total=40.0),
    ("team-b", "rb-gpu-0"): Pod(up=0.0, request_rate=None, success_rate=None),           # its /metrics is down
    # Matched by the fleet regexes (a requested name, a requested namespace) but asked for by no model.
    ("team-b", "ra-cpu-0"): Pod(request_rate=1000.0, queue_size=1000, duration=buckets(1000.0, 2)),
    ("team-c", "rc-cpu-0"): Pod(request_rate=0.0, success_rate=0.0, duration={b: 0.0 for b in TEI_BOUNDS}),
}
MODELS = {
    ("team-a", "ra"): ModelPods("team-a", {"gpu": (2, ("ra-gpu-0", "ra-gpu-1")), "cpu": (1, ("ra-cpu-0",))}),
    ("team-b", "ra"): ModelPods("team-b", {"gpu": (1, ("ra-gpu-0",)), "cpu": (0, ())}),
    ("team-b", "rb"): ModelPods("team-b", {"gpu": (1, ("rb-gpu-0",))}),
    ("team-c", "rc"): ModelPods("team-c", {"gpu": (0, ()), "cpu": (1, ("rc-cpu-0",))}),
    ("team-c", "gone"): ModelPods("team-c", {"gpu": (1, ())}),                          # ready, but no pod listed
}


def source(fake: FakePrometheus) -> PrometheusSource:
    return PrometheusSource(URL, post=fake.post, gpu_memory_used_query="DCGM_USED$selector",
                            gpu_memory_total_query="DCGM_TOTAL$selector")


def per_model(fake: FakePrometheus, model: ModelPods) -> object:
    """The single-model path's answer for the same pods."""
    selectors = {pool: build_selector(model.namespace, pods) for pool, (_, pods) in model.pools.items()}
    return source(fake).collect(selectors, {pool: ready for pool, (ready, _) in model.pools.items()})


def test_fleet_signals_equal_the_per_model_path_and_histogram_quantile_over_sum_by_le() -> None:
    fleet = source(FakePrometheus(SERIES)).collect_many(MODELS)
    assert set(fleet) == set(MODELS)
    for key, model in MODELS.items():
        expected = per_model(FakePrometheus(SERIES), model)
        for pool in ("gpu", "cpu"):
            got, want = fleet[key].pool(pool), expected.pool(pool)  # type: ignore[attr-defined]
            assert got.error == want.error, (key, pool)
            for name in ("ready_replicas", "scraped_replicas", "sampled_at"):
                assert getattr(got, name) == getattr(want, name), (key, pool, name)
            for name in ("request_rate", "success_rate", "failure_rate", "queue_size", "latency_p50_ms",
                         "latency_p95_ms", "queue_time_p95_ms", "gpu_memory_fraction", "pair_rate"):
                value = getattr(got, name)
                assert value == (None if getattr(want, name) is None else pytest.approx(getattr(want, name),
                                                                                          rel=1e-9)), (key, pool, name)
    a = fleet[("team-a", "ra")]
    # Hand-checked where the numbers are simple: sums and counts over the pool's own two pods only.
    assert (a.gpu.scraped_replicas, a.gpu.request_rate, a.gpu.queue_size, a.gpu.sampled_at) == (2, 20.0, 8, 1001.0)
    assert a.gpu.gpu_memory_fraction == 0.75 and a.gpu.failure_rate == 0.5 and a.cpu.failure_rate == 0.0
    assert a.gpu.latency_p95_ms is not None and a.cpu.queue_time_p95_ms is None    # no queue histogram: unmeasured
    assert a.gpu.pair_rate == 160.0 and a.cpu.pair_rate == 0.0  # no te_batch_next_size yet: none scored
    assert a.gpu.latency is not None and exposition.fraction_above(0.0, a.gpu.latency) == 1.0
    assert a.cpu.request_rate == 2.0          # team-b's ra-cpu-0 is matched by the regexes, never counted
    assert fleet[("team-b", "ra")].gpu.request_rate == 100.0 and fleet[("team-b", "ra")].gpu.gpu_memory_fraction \
        == pytest.approx(39 / 40)
    assert fleet[("team-b", "rb")].gpu.error == "Prometheus has no successful scrape of this pool"
    assert fleet[("team-c", "gone")].gpu.error == "Prometheus has no successful scrape of this pool"
    assert fleet[("team-c", "rc")].cpu.latency_p50_ms is None and fleet[("team-c", "rc")].cpu.request_rate == 0.0


def test_quantiles_from_summed_buckets_match_prometheus_on_a_tei_bucket_set() -> None:
    """The grouping in Python, bucket by bucket, against bucketQuantile over `sum by (le)` of the same pods."""
    series = {("ns", f"p-{i}"): Pod(duration=buckets(5.0 + i, 10 + 3 * i, spread=i % 4 + 1),
                                    queue_duration=buckets(1.0, 5 + i)) for i in range(6)}
    pods = tuple(name for _, name in series)
    fleet = source(FakePrometheus(series)).collect_many({("ns", "m"): ModelPods("ns", {"gpu": (6, pods)})})
    gpu = fleet[("ns", "m")].gpu
    summed = {b: sum(pod.duration[b] for pod in series.values()) for b in TEI_BOUNDS}
    waiting = {b: sum(pod.queue_duration[b] for pod in series.values()) for b in TEI_BOUNDS}
    assert gpu.latency_p50_ms == pytest.approx(1000 * bucket_quantile(0.5, summed), rel=1e-12)
    assert gpu.latency_p95_ms == pytest.approx(1000 * bucket_quantile(0.95, summed), rel=1e-12)
    assert gpu.queue_time_p95_ms == pytest.approx(1000 * bucket_quantile(0.95, waiting), rel=1e-12)
    # And the edges PromQL defines: above every finite bound -> the highest finite bound.
    tail = {("ns", "t"): Pod(duration={**{b: 0.0 for b in TEI_BOUNDS[:-1]}, INF: 4.0})}
    top = source(FakePrometheus(tail)).collect_many({("ns", "m"): ModelPods("ns", {"gpu": (1, ("t",))})})
    assert top[("ns", "m")].gpu.latency_p95_ms == pytest.approx(1000 * TEI_BOUNDS[-2])


def fleet_of(n: int) -> tuple[dict[tuple[str, str], Pod], dict[tuple[str, str], ModelPods]]:
    series, models = {}, {}
    for i in range(n):
        namespace, name = f"ns-{i % 7}", f"m-{i}"
        gpu_pods = (f"{name}-gpu-0", f"{name}-gpu-1")
        cpu_pods = (f"{name}-cpu-0",)
        for pod in (*gpu_pods, *cpu_pods):
            series[(namespace, pod)] = Pod(request_rate=float(i), success_rate=float(i), queue_size=i % 3,
                                           duration=buckets(float(i + 1), 10 + i % 20), gpu_used=float(i % 40),
                                           gpu_total=40.0)
        models[(namespace, name)] = ModelPods(namespace, {"gpu": (2, gpu_pods), "cpu": (1, cpu_pods)})
    return series, models


@pytest.mark.parametrize("models", [1, 12, 400])
def test_the_query_count_does_not_depend_on_the_number_of_models(models: int) -> None:
    series, requests = fleet_of(models)
    fake = FakePrometheus(series)
    before = REGISTRY.get_sample_value("rerank_operator_promql_queries_total", {"result": "ok"}) or 0.0
    out = source(fake).collect_many(requests)
    # 9 signals (up count and timestamp, 3 rates, queue size, pairs, 2 bucket sets) and GPU memory: 10 for any fleet.
    assert len(fake.asked) == 10
    assert REGISTRY.get_sample_value("rerank_operator_promql_queries_total", {"result": "ok"}) == before + 10
    assert all("by (namespace, pod" in q for q in fake.asked)
    for key, signals in out.items():
        i = int(key[1].removeprefix("m-"))
        assert signals.gpu.request_rate == 2.0 * i and signals.cpu.request_rate == float(i)
        assert signals.gpu.gpu_memory_fraction == (i % 40) / 40
    # One model checked against its own 20 queries.
    key = next(iter(requests))
    alone = per_model(FakePrometheus(series), requests[key])
    assert out[key].gpu.latency_p95_ms == pytest.approx(alone.gpu.latency_p95_ms)  # type: ignore[attr-defined]


def test_the_fleet_selector_names_every_pod_and_goes_in_a_post_body() -> None:
    series, requests = fleet_of(1000)
    fake = FakePrometheus({})
    source(fake).collect_many(requests)
    assert len(fake.asked) == 10 and all(len(q) > 30_000 for q in fake.asked)  # 3000 pod names: no URL would do
    selector = fleet_selector((ns, pod) for ns, pod in series)
    assert selector.startswith('{namespace=~"ns\\\\-0|ns\\\\-1|') and "m\\\\-999\\\\-gpu\\\\-1" in selector
    assert fleet_selector([]) == '{namespace=~"$^",pod=~"$^"}'


def test_a_failed_query_holds_every_pool_that_needed_it() -> None:
    fake = FakePrometheus(SERIES)
    fake.fail = "te_request_queue_duration_bucket"
    out = source(fake).collect_many(MODELS)
    assert len(fake.asked) == 10                                  # the others are still asked
    for key, model in MODELS.items():
        for pool, (ready, _) in model.pools.items():
            signals = out[key].pool(pool)
            if ready > 0:
                assert signals.error and "query timed out" in signals.error and signals.request_rate is None
            else:
                assert signals.error is None
    # GPU memory is only the GPU pools' need: its failure holds them, not the CPU pools.
    fake = FakePrometheus(SERIES)
    fake.fail = "DCGM_USED"
    out = source(fake).collect_many(MODELS)
    assert out[("team-a", "ra")].gpu.error and out[("team-a", "ra")].cpu.error is None
    before = REGISTRY.get_sample_value("rerank_operator_promql_queries_total", {"result": "error"}) or 0.0

    def refused(url: str, data: bytes, timeout: float) -> bytes:
        raise OSError("connection refused")

    down = PrometheusSource(URL, post=refused).collect_many(MODELS)
    assert all(s.pool(p).error for key, s in down.items() for p, (r, _) in MODELS[key].pools.items() if r > 0)
    assert REGISTRY.get_sample_value("rerank_operator_promql_queries_total", {"result": "error"}) == before + 9


def test_nothing_is_asked_when_no_pool_has_ready_replicas() -> None:
    fake = FakePrometheus(SERIES)
    out = source(fake).collect_many({("a", "m"): ModelPods("a", {"gpu": (0, ()), "cpu": (0, ())})})
    assert fake.asked == [] and out[("a", "m")].gpu.ready_replicas == 0 and out[("a", "m")].gpu.error is None
    assert source(fake).collect_many({}) == {}


def test_gpu_memory_series_without_a_namespace_are_matched_by_pod_name() -> None:
    """A platform query that aggregates `by (pod)` loses `namespace`: such series still reach their pool."""
    fake = FakePrometheus(SERIES)
    plain = fake.evaluate

    def without_namespace(query: str) -> list[tuple[dict[str, str], float]]:
        found = plain(query)
        if "DCGM_USED" in query:
            return [({k: v for k, v in labels.items() if k != "namespace"}, value) for labels, value in found]
        return found

    fake.evaluate = without_namespace  # type: ignore[method-assign]
    out = source(fake).collect_many({("team-a", "ra"): MODELS[("team-a", "ra")]})
    assert out[("team-a", "ra")].gpu.gpu_memory_fraction == 0.75
