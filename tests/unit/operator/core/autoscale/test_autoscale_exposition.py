"""Parsing TEI's exposition and PromQL's histogram_quantile, checked against values worked out by hand."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rerank_operator.core.autoscale import exposition
from rerank_operator.core.autoscale.exposition import Histogram as Hist

TEI_LIKE = """\
# HELP te_request_count te_request_count
# TYPE te_request_count counter
te_request_count{method="single"} 7
te_request_count{method="batch"} 3
# TYPE te_queue_size gauge
te_queue_size 4
# TYPE te_request_duration histogram
te_request_duration_bucket{le="0.1"} 10
te_request_duration_bucket{le="0.2"} 30
te_request_duration_bucket{le="0.5"} 40
te_request_duration_bucket{le="+Inf"} 40
te_request_duration_sum 6.5
te_request_duration_count 40
te_request_failure{err="over \\"limit\\", really\\n"} 2 1712345678000
odd_value NaN
"""


def test_parse_tei_like_body():
    samples = exposition.parse(TEI_LIKE)
    assert exposition.total(samples, "te_request_count") == 10
    assert exposition.total(samples, "te_queue_size") == 4
    assert exposition.total(samples, "te_request_success") is None
    failure = next(s for s in samples if s.name == "te_request_failure")
    assert failure.labels == {"err": 'over "limit", really\n'} and failure.value == 2
    hist = exposition.histogram(samples, "te_request_duration")
    assert hist == Hist({0.1: 10, 0.2: 30, 0.5: 40, math.inf: 40}, 40, 6.5)


def test_non_exposition_is_rejected():
    with pytest.raises(exposition.ExpositionError):
        exposition.parse("<html><body>502 Bad Gateway</body></html>")


# Buckets 0.1:10, 0.2:30, 0.5:40, +Inf:40 (40 observations).
#   p50: rank 20 falls in (0.1, 0.2] holding 20 -> 0.1 + 0.1 * (20 - 10) / 20 = 0.15
#   p95: rank 38 falls in (0.2, 0.5] holding 10 -> 0.2 + 0.3 * (38 - 30) / 10 = 0.44
#   p10: rank 4 in the first bucket, which starts at 0 -> 0.1 * 4 / 10 = 0.04
HAND = Hist({0.1: 10, 0.2: 30, 0.5: 40, math.inf: 40}, 40, 6.5)


@pytest.mark.parametrize("q, expected", [(0.5, 0.15), (0.95, 0.44), (0.1, 0.04), (1.0, 0.5)])
def test_quantile_interpolates_like_promql(q, expected):
    assert exposition.quantile(q, HAND) == pytest.approx(expected)


def test_quantile_in_the_inf_bucket_is_the_highest_finite_bound():
    # 5 of 10 observations above 0.1: rank 9.5 lands in +Inf -> PromQL answers 0.1
    assert exposition.quantile(0.95, Hist({0.1: 5, math.inf: 10}, 10, 0)) == 0.1


@pytest.mark.parametrize("hist", [
    Hist({}, 0, 0),
    Hist({0.1: 0, math.inf: 0}, 0, 0),            # no observations
    Hist({0.1: 3, 0.2: 5}, 5, 0),                 # no +Inf bucket
    Hist({math.inf: 5}, 5, 0),                    # a single bucket
])
def test_quantile_is_undefined_where_promql_gives_nan(hist):
    assert exposition.quantile(0.95, hist) is None


def test_delta_of_two_scrapes():
    later = Hist({0.1: 10, 0.2: 30, 0.5: 60, math.inf: 70}, 70, 20.0)
    delta = later.since(HAND)
    # 30 new observations: 20 in (0.2, 0.5], 10 above 0.5.
    assert delta == Hist({0.1: 0, 0.2: 0, 0.5: 20, math.inf: 30}, 30, 13.5)
    # p50: rank 15 in (0.2, 0.5] holding 20 -> 0.2 + 0.3 * 15 / 20 = 0.425; p95: rank 28.5 -> +Inf -> 0.5
    assert exposition.quantile(0.5, delta) == pytest.approx(0.425)
    assert exposition.quantile(0.95, delta) == 0.5


def test_counter_reset_takes_the_new_values_as_the_increase():
    restarted = Hist({0.1: 1, 0.2: 2, 0.5: 2, math.inf: 2}, 2, 0.3)
    assert restarted.since(HAND) == restarted


def test_non_monotonic_buckets_are_made_monotonic():
    # 0.2's count (8) below 0.1's (10) is a scrape race; treated as 10, so all 10 are <= 0.1.
    assert exposition.quantile(0.5, Hist({0.1: 10, 0.2: 8, math.inf: 10}, 10, 0)) == pytest.approx(0.05)


def test_reads_what_prometheus_client_writes():
    """An independent writer: observations with known positions give a known quantile."""
    registry = CollectorRegistry()
    duration = Histogram("te_request_duration", "d", buckets=(0.05, 0.1, 0.25, 1.0), registry=registry)
    for value in [0.01] * 50 + [0.2] * 40 + [0.5] * 10:
        duration.observe(value)
    Gauge("te_queue_size", "q", registry=registry).set(3)
    Counter("te_request_success", "s", registry=registry).inc(100)
    samples = exposition.parse(generate_latest(registry).decode())
    hist = exposition.histogram(samples, "te_request_duration")
    assert hist is not None and hist.count == 100 and hist.sum == pytest.approx(0.5 + 8 + 5)
    # p95: rank 95 in (0.25, 1.0] holding the 10 values of 0.5 -> 0.25 + 0.75 * (95 - 90) / 10 = 0.625
    assert exposition.quantile(0.95, hist) == pytest.approx(0.625)
    # prometheus_client names the counter te_request_success_total: that is not TEI's name.
    assert exposition.total(samples, "te_request_success_total") == 100
    assert exposition.total(samples, "te_queue_size") == 3
