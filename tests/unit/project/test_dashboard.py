"""dashboards/rerank.json: well formed, queries only metrics that exist (TEI's te_* and the operator's own), shows the
operator's per-model series filtered by the dashboard's variables. That every query has data on a real Prometheus
is tests/cluster/test_dashboard_prometheus.py's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.unit.project.operator_metrics_names import HIST_SUFFIXES, operator_metric_names

REPO_ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = REPO_ROOT / "dashboards" / "rerank.json"

# TEI 1.9's metrics (no _total suffix), as listed in the TEI contract the operator is built against.
TEI_COUNTERS = {"te_request_count", "te_request_success", "te_request_failure", "te_predict_count",
                "te_predict_success", "te_embed_count", "te_embed_success"}
TEI_HISTOGRAMS = {"te_request_duration", "te_request_queue_duration", "te_request_inference_duration",
                  "te_request_tokenization_duration", "te_request_input_length", "te_batch_next_size",
                  "te_batch_next_tokens"}
TEI_GAUGES = {"te_queue_size"}
PROMQL_WORDS = {"sum", "by", "rate", "increase", "histogram_quantile", "clamp_min", "le", "without", "avg", "max",
                "min", "count", "on", "ignoring", "group_left", "label_values"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(d: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for p in d["panels"]:
        yield p
        yield from p.get("panels", [])


def exprs(d: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(d) for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Identifiers directly followed by a selector or a range: the metric names of a PromQL expression."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    return {m for m in re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?=\{|\[)", no_strings) if m not in PROMQL_WORDS}




def test_dashboard_is_well_formed() -> None:
    d = dashboard()
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "namespace", "rerankmodel", "pool"} <= variables
    for e in exprs(d):
        assert e.count("(") == e.count(")") and e.count("{") == e.count("}") and e.count("[") == e.count("]"), e
        for v in re.findall(r"\$(\w+)", e):
            assert v in variables or v.startswith("__"), f"{e}: unknown variable ${v}"


def test_tei_metrics_are_teis() -> None:
    queried = {m for e in exprs(dashboard()) for m in metric_names(e) if m.startswith("te_")}
    known = TEI_COUNTERS | TEI_GAUGES | {h + s for h in TEI_HISTOGRAMS for s in HIST_SUFFIXES}
    assert queried and queried <= known, queried - known
    # TEI's counters carry no _total suffix.
    assert not any(m.endswith("_total") for m in queried)


def test_tei_pools_are_covered_per_pool() -> None:
    tei = [e for e in exprs(dashboard()) if any(m.startswith("te_") for m in metric_names(e))]
    queried = {m for e in tei for m in metric_names(e)}
    for needed in ("te_request_count", "te_request_success", "te_request_failure", "te_queue_size",
                   "te_request_duration_bucket", "te_request_queue_duration_bucket", "te_batch_next_size_bucket"):
        assert needed in queried, needed
    for q in (0.5, 0.95, 0.99):
        for h in ("te_request_duration", "te_request_queue_duration"):
            assert any(f"histogram_quantile({q}" in e and h + "_bucket" in e for e in tei), (q, h)
    assert all('pool=~"$pool"' in e for e in tei)
    assert all("by (pool" in e for e in tei)


def test_operator_metrics_exist_in_the_operator_code() -> None:
    queried = {m for e in exprs(dashboard()) for m in metric_names(e) if m.startswith("rerank_operator_")}
    assert queried, "the dashboard shows the operator too"
    missing = queried - operator_metric_names()
    assert not missing, f"dashboard queries metrics the operator does not define: {sorted(missing)}"


# The operator's per-model series (namespace, rerankmodel labels) the dashboard must show, each filtered by the
# dashboard's variables; the cost counters also carry the model's RerankClass.
PER_MODEL = {"rerank_operator_traffic_weight_percent", "rerank_operator_pool_desired_replicas",
             "rerank_operator_pool_replicas", "rerank_operator_pool_max_replicas",
             "rerank_operator_latency_target_seconds", "rerank_operator_pool_requests_total",
             "rerank_operator_pool_slow_requests_total", "rerank_operator_pool_pairs_total",
             "rerank_operator_pool_cost_total", "rerank_operator_gpu_only_cost_total", "rerank_operator_model_info",
             "rerank_operator_model_condition", "rerank_operator_scaling_decisions_total"}
WITH_CLASS = {"rerank_operator_pool_cost_total", "rerank_operator_gpu_only_cost_total", "rerank_operator_model_info"}
#: Labelled counters the operator creates at their first increment: increase() alone would not count that event.
BORN_COUNTING = {"rerank_operator_scaling_decisions_total", "rerank_operator_quantization_jobs_total"}


def selectors(expr: str, metric: str) -> list[str]:
    """The label matchers of every use of ``metric`` in ``expr`` ("" where it has none)."""
    return re.findall(rf"\b{metric}(?![a-zA-Z0-9_:])(?:\{{([^}}]*)\}})?", expr)


def test_operator_per_model_series_are_shown_and_filtered() -> None:
    d = dashboard()
    assert "class" in {v["name"] for v in d["templating"]["list"]}
    queried = {m for e in exprs(d) for m in metric_names(e)}
    assert not PER_MODEL - queried, sorted(PER_MODEL - queried)
    for e in exprs(d):
        for metric in PER_MODEL & metric_names(e):
            for sel in selectors(e, metric):
                assert 'namespace=~"$namespace"' in sel and 'rerankmodel=~"$rerankmodel"' in sel, (metric, e)
                if metric in WITH_CLASS:
                    assert 'class=~"$class"' in sel, (metric, e)


def test_event_counters_count_their_first_event() -> None:
    for e in exprs(dashboard()):
        for metric in BORN_COUNTING & metric_names(e):
            if "increase(" in e or "rate(" in e:
                assert f"unless {metric}" in e and "offset" in e, f"{metric}: a series born counting is missed: {e}"
