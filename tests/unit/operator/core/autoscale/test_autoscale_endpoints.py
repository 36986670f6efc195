"""The Prometheus server the autoscaler calls is the platform's choice (autoscale/endpoints.py), never a model's."""

from __future__ import annotations

import pytest

from rerank_operator import main
from rerank_operator.core.autoscale import endpoints
from rerank_operator.core.autoscale.config import InvalidAutoscalingSpec, PrometheusSettings

OPERATOR = PrometheusSettings(url="http://prometheus.monitoring:9090", gpu_memory_used_query="used")
CLASS_SPEC = {"metrics": {"prometheus": {"url": "http://thanos.platform:10902", "gpuMemoryTotalQuery": "total"}}}


def test_class_server_wins_over_the_operator_default() -> None:
    chosen = endpoints.prometheus_for("prometheus", CLASS_SPEC, OPERATOR)
    assert chosen == PrometheusSettings(url="http://thanos.platform:10902", gpu_memory_total_query="total")


@pytest.mark.parametrize("class_spec", [None, {}, {"metrics": {"allowedSources": ["direct", "prometheus"]}}])
def test_operator_default_without_a_class_server(class_spec: dict | None) -> None:
    assert endpoints.prometheus_for("prometheus", class_spec, OPERATOR) == OPERATOR


def test_no_server_anywhere_says_who_must_configure_one() -> None:
    with pytest.raises(InvalidAutoscalingSpec, match=r"platform configured no Prometheus server.*--prometheus-url"):
        endpoints.prometheus_for("prometheus", None, PrometheusSettings())


def test_class_may_forbid_a_source() -> None:
    only_direct = {"metrics": {"allowedSources": ["direct"]}}
    with pytest.raises(InvalidAutoscalingSpec, match=r"source prometheus is not allowed.*\[direct\]"):
        endpoints.prometheus_for("prometheus", only_direct, OPERATOR)
    assert endpoints.prometheus_for("direct", only_direct, OPERATOR) == PrometheusSettings()


def test_operator_flags_reach_the_autoscaler() -> None:
    settings = main.settings_from(main.parse_args(["--prometheus-url", "http://p.monitoring:9090",
                                                   "--prometheus-gpu-memory-used-query", "sum(used)"]), {})
    assert settings.prometheus == PrometheusSettings(url="http://p.monitoring:9090", gpu_memory_used_query="sum(used)")
    assert main.settings_from(main.parse_args([]), {}).prometheus == PrometheusSettings()


def test_the_direct_source_never_scrapes_a_pod_on_the_host_network() -> None:
    """A look-alike pod a tenant labels as a pool pod, on the host's network, would point the operator at a node
    address: only pod-network addresses are scraped."""
    from rerank_operator.core.reconcile.observed import PoolsView

    def pod(name: str, ip: str, host_network: bool = False) -> dict:
        return {"metadata": {"name": name, "labels": {"rerank.io/pool": "cpu"}},
                "spec": {"hostNetwork": True} if host_network else {},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}}

    view = PoolsView(pods=(pod("m-cpu-1", "10.1.0.7"), pod("m-cpu-evil", "192.168.0.10", host_network=True)))
    assert [p["metadata"]["name"] for p in view.ready_pods("cpu")] == ["m-cpu-1"]
