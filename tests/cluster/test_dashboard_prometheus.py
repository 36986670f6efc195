"""Every query of dashboards/rerank.json and every rule of alerts/rerank-operator.rules.yaml, evaluated on a real
Prometheus (Debian's ``prometheus``) scraping the real operator and TEI pods under load.

What runs, as in a cluster with the chart's monitors:
- the operator as a real process on the dev cluster (rerank_devcluster.scrape_redirect, as the autoscaling tests),
  serving a RerankModel of a RerankClass with ``spec.pricing``, so its cost counters grow;
- its kwok pods' ``/metrics`` served locally by ``TeiPod`` (TEI 1.9's series: counters without ``_total``, the queue
  gauge, the request/queue/inference/tokenization and next-batch histograms), fed by a small fluid model of the
  traffic split by the HTTPRoute's weights (``Fleet``), at rest and then in a burst beyond what the GPU pool can
  take at its maxReplicas, so the operator scales, spills traffic to the CPU pool, and requests get slow and fail;
- two more models: one whose quantization Job the quality gate refuses (a failed Job, a Degraded model), one held
  back by a ResourceQuota on claims (reconciles fail and are retried: reconcile errors; a model not Ready);
- Prometheus scraping both with the chart's own monitors: the PodMonitor's relabelings and the ServiceMonitor's
  ``honorLabels`` come from ``helm template`` of charts/rerank-operator, the pods reach it through ``file_sd`` with
  the ``__meta_kubernetes_*`` labels Kubernetes service discovery would give them, and it loads the rule file.

Then every panel target, with Grafana's variables substituted (all values, then this test's namespace, model, class
and pools), and every template variable's ``label_values`` must answer without error and with at least one finite
value; every recording rule's expression too, and every rule must evaluate cleanly. A few panels must also show
what the setup made happen: the first spill and the first Jobs counted, a model not Ready, a slow GPU pool, and cost
figures in the right units.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_devcluster import binaries, scrape_redirect
from rerank_devcluster.fake_tei import Histogram, MetricsServer, TeiCounters, TrafficLoop
from rerank_devcluster.prometheus_server import PrometheusError, PrometheusServer, Sample, write_file_sd
from rerank_devcluster.waiting import eventually
from tests.cluster.rrm_harness import GROUP, VERSION, Env, Kube, OperatorProcess, cleanup, refused, static_pv

pytestmark = [pytest.mark.cluster, pytest.mark.prometheus]

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "dashboards" / "rerank.json"
RULES = REPO / "alerts" / "rerank-operator.rules.yaml"
CHART = REPO / "charts" / "rerank-operator"

NAME = "bge-m3"                         # the model served, under load
REFUSED = "refused"                     # a model whose quantization Job fails (the quality gate refuses)
BLOCKED = "over-quota"                  # a model a ResourceQuota holds back (its claim is refused)
CPU_ONLY = {"cpu": {"minReplicas": 1, "maxReplicas": 1}, "gpu": {"enabled": False}}
CAPACITY = {"gpu": 10.0, "cpu": 4.0}    # requests/s one pod serves
BASE_LATENCY = {"gpu": 0.03, "cpu": 0.2}
MAX_BACKLOG = 200.0                     # per pod; beyond it requests fail (TEI's 429)
PAIRS_PER_REQUEST = 8                   # texts per /rerank: TEI batches pairs
BATCH_PAIRS = 32                        # pairs per batch
AT_REST, BURST = 4.0, 40.0              # requests/s; the GPU pool serves 20 at most (2 x 10), the CPU 12 (3 x 4)
POOLS = {"cpu": {"minReplicas": 1, "maxReplicas": 3},
         "gpu": {"minReplicas": 1, "maxReplicas": 2, "resources": {"limits": {"nvidia.com/gpu": 1}}}}
AUTOSCALING = {
    "enabled": True, "intervalSeconds": 5,
    "metrics": {"staleAfterSeconds": 15},
    "targets": {"gpuLatencyP95Ms": 250, "cpuLatencyP95Ms": 500, "queuePerReplica": 16},
    "scaleUp": {"stabilizationSeconds": 0, "maxStep": 2, "cooldownSeconds": 0},
    "scaleDown": {"stabilizationSeconds": 30, "maxStep": 1, "cooldownSeconds": 60},
    "spillover": {"stepPercent": 50, "recoverStepPercent": 50},
}
GATEWAY = {"gateway": {"parentRefs": [{"name": "shared", "namespace": "gateway-system"}]}}
PRICING = {"currency": "EUR", "gpuReplicaHour": 2.5, "cpuReplicaHour": 0.3, "gpuReplicaRequestsPerSecond": 10}
#: Grafana's built-in variables: windows that hold data within the test's few minutes at a 1 s scrape interval.
BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "10m", "__range_s": "600",
            "__range_ms": "600000"}
SETTLE_SECONDS = 150.0                  # how long after the burst starts every query may take to have data


# --- TEI pods -----------------------------------------------------------------------------------------------------

class TeiPod(TeiCounters):
    """One pod's TEI series: the fake's counters, queue and latency histograms, plus inference and tokenization
    time and the next-batch size (pairs per batch: its sum is the pairs scored)."""

    def __init__(self, pool: str) -> None:
        super().__init__(CAPACITY[pool], BASE_LATENCY[pool], MAX_BACKLOG)
        self.inference, self.tokenization = Histogram(), Histogram()
        self.batch = Histogram((1, 2, 4, 8, 16, 32, 64, 128, 256, 512))

    def step(self, rate: float, dt: float) -> None:
        before = self.success
        super().step(rate, dt)
        served = self.success - before
        if served > 0:
            self.inference.observe(self.base_latency * 0.8, served)
            self.tokenization.observe(0.002, served)
            self.batch.observe(BATCH_PAIRS, served * PAIRS_PER_REQUEST / BATCH_PAIRS)

    def render(self) -> str:
        return "\n".join([
            super().render().rstrip("\n"),
            *self.inference.render("te_request_inference_duration"),
            *self.tokenization.render("te_request_tokenization_duration"),
            *self.batch.render("te_batch_next_size"), "",
        ])


def meta_label(name: str) -> str:
    """A pod label as Kubernetes service discovery names it (``__meta_kubernetes_pod_label_<sanitized>``)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


class Fleet(TrafficLoop):
    """The pods the chart's PodMonitor selects, each served by a TeiPod: their addresses go to the operator's scrape
    redirect and to Prometheus' file_sd (with the pod's labels); requests arrive at ``rate`` and are split between
    the pools by the HTTPRoute's weights, evenly over each pool's Ready pods."""

    def __init__(self, kube: client.ApiClient, namespace: str, selector: str, redirect: Path, file_sd: Path) -> None:
        super().__init__(AT_REST)
        self.core = client.CoreV1Api(kube)
        self.custom = client.CustomObjectsApi(kube)
        self.namespace, self.selector = namespace, selector
        self.redirect, self.file_sd = redirect, file_sd
        self.pods: dict[str, tuple[TeiPod, MetricsServer]] = {}
        self.start()

    def step_pod(self, name: str, rate: float, dt: float) -> None:
        self.pods[name][0].step(rate, dt)

    def _serve(self, pool: str) -> tuple[TeiPod, MetricsServer]:
        pod = TeiPod(pool)

        def render() -> str:
            with self.lock:
                return pod.render()
        return pod, MetricsServer(render)

    def refresh(self) -> None:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector).items
        ready: dict[str, str] = {}
        groups = []
        for pod in pods:
            name, labels = pod.metadata.name, pod.metadata.labels or {}
            if pod.metadata.deletion_timestamp:
                continue
            if name not in self.pods:
                self.pods[name] = self._serve(labels["rerank.io/pool"])
            groups.append({"targets": [self.pods[name][1].address], "labels": {
                "__meta_kubernetes_namespace": self.namespace, "__meta_kubernetes_pod_name": name,
                **{meta_label(k): v for k, v in labels.items()}}})
            if labels.get("app.kubernetes.io/instance") == NAME and any(
                    c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ()):
                ready[name] = labels["rerank.io/pool"]
        scrape_redirect.publish(self.redirect, {n: server.address for n, (_, server) in self.pods.items()})
        write_file_sd(self.file_sd, groups)
        try:
            route = self.custom.get_namespaced_custom_object("gateway.networking.k8s.io", "v1", self.namespace,
                                                             "httproutes", NAME)
            weights = {b["name"]: b.get("weight", 1) for b in route["spec"]["rules"][0]["backendRefs"]}
            share = weights.get(f"{NAME}-cpu", 0) / (sum(weights.values()) or 1)
        except ApiException:
            share = 0.0
        with self.lock:
            self.ready, self.cpu_share = ready, share

    def stop(self) -> None:
        super().stop()
        for _, server in self.pods.values():
            server.stop()


# --- Prometheus as the chart's monitors configure it --------------------------------------------------------------

def chart_monitors() -> tuple[dict[str, Any], dict[str, Any]]:
    """The chart's PodMonitor (TEI) and ServiceMonitor (operator), rendered by ``helm template`` (the values schema
    is the chart tests' business, not this one's)."""
    out = subprocess.run(
        [str(binaries.ensure("helm")), "template", "ro", str(CHART),
         "--set", "teiPodMonitor.enabled=true",
         "--set", "metrics.serviceMonitor.enabled=true", "--show-only", "templates/tei-podmonitor.yaml",
         "--show-only", "templates/servicemonitor.yaml"], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout) if d}
    return docs["PodMonitor"], docs["ServiceMonitor"]


def relabel_config(monitor_relabeling: Mapping[str, Any]) -> dict[str, Any]:
    """A Prometheus Operator relabeling (camelCase) as a prometheus.yml relabel_config."""
    return {re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), k): v for k, v in monitor_relabeling.items()}


def pod_selector(pod_monitor: Mapping[str, Any]) -> str:
    selector = pod_monitor["spec"]["selector"]
    terms = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or ():
        assert e["operator"] == "In", e
        terms.append(f"{e['key']} in ({','.join(e['values'])})")
    return ",".join(terms)


def prometheus_config(pod_monitor: Mapping[str, Any], service_monitor: Mapping[str, Any], file_sd: Path,
                      operator_port: int) -> dict[str, Any]:
    """Scrape jobs as the Prometheus Operator generates them from the chart's monitors (namespace and pod from
    discovery, then the monitor's relabelings; the operator's endpoint with its honorLabels), every second."""
    # TEI's te_* through the pods' serving port; the front's own endpoint (sampler-metrics: the rerank API's usage)
    # has no panel or rule, and the stand-in pods here serve TEI's page only.
    tei, front = pod_monitor["spec"]["podMetricsEndpoints"]
    assert (tei["port"], front["port"]) == ("http", "sampler-metrics") and front["relabelings"] == tei["relabelings"]
    operator, = service_monitor["spec"]["endpoints"]
    discovered = [{"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                  {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}]
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "tei", "metrics_path": tei.get("path", "/metrics"),
             "file_sd_configs": [{"files": [str(file_sd)], "refresh_interval": "1s"}],
             "relabel_configs": [*discovered, *(relabel_config(r) for r in tei.get("relabelings") or ())]},
            {"job_name": "rerank-operator", "metrics_path": operator.get("path", "/metrics"),
             "honor_labels": bool(operator.get("honorLabels", False)),
             "static_configs": [{"targets": [f"127.0.0.1:{operator_port}"],
                                 "labels": {"namespace": "rerank-system", "pod": "rerank-operator-0"}}]},
        ],
    }
    if RULES.exists():
        config["rule_files"] = [str(RULES)]
    return config


# --- queries ------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Query:
    where: str   # what a failure names: the panel and target, the variable or the rule
    expr: str


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Grafana's ``$var`` / ``${var}`` / ``${var:fmt}`` replaced by ``values`` (built-ins included)."""
    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise AssertionError(f"{expr}: no value for ${name}")
        return values[name]
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", one, expr)


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def panel_queries(dashboard: Mapping[str, Any], values: Mapping[str, str]) -> list[Query]:
    return [Query(f"panel {p['title']!r} [{t['refId']}]", substitute(t["expr"], values))
            for p in panels(dashboard) for t in p.get("targets", []) if t.get("expr") and not t.get("hide")]


def variable_queries(dashboard: Mapping[str, Any], values: Mapping[str, str]) -> list[tuple[str, str, str]]:
    """``(variable, label, series selector)`` of every ``label_values(selector, label)`` variable."""
    found = []
    for v in dashboard["templating"]["list"]:
        if v.get("type") != "query":
            continue
        m = re.fullmatch(r"\s*label_values\((.+),\s*(\w+)\)\s*", v["definition"])
        assert m, f"${v['name']}: only label_values(selector, label) is evaluated here: {v['definition']}"
        found.append((v["name"], m.group(2), substitute(m.group(1), values)))
    return found


def rule_groups() -> list[dict[str, Any]]:
    return list((yaml.safe_load(RULES.read_text()) or {}).get("groups") or []) if RULES.exists() else []


def recording_queries() -> list[Query]:
    return [Query(f"recording rule {r['record']!r} (group {g['name']!r})", str(r["expr"]))
            for g in rule_groups() for r in g.get("rules") or () if "record" in r]


def problem(prom: PrometheusServer, query: Query) -> str | None:
    """Why ``query`` shows nothing on a panel (an error, no series, only NaN or infinities), or None."""
    try:
        samples = prom.query(query.expr)
    except PrometheusError as exc:
        return f"error: {exc}"
    if not samples:
        return "empty result"
    if not any(s.is_number for s in samples):
        return f"no finite value: {[s.value for s in samples]}"
    return None


@dataclass(frozen=True)
class Selection:
    """One setting of the dashboard's variables: what each query variable is set to, and the values its
    ``label_values`` must offer."""

    name: str
    values: Mapping[str, str]
    offered: Mapping[str, set[str]]


def problems(prom: PrometheusServer, dashboard: Mapping[str, Any], selections: Sequence[Selection],
             checks: Mapping[str, Callable[[list[Sample]], bool]]) -> list[str]:
    found: list[str] = []
    for sel in selections:
        values = {**BUILTINS, **sel.values}
        for q in panel_queries(dashboard, values):
            why = problem(prom, q)
            if why:
                found.append(f"[{sel.name}] {q.where}: {why}\n    {q.expr}")
        for name, label, selector in variable_queries(dashboard, values):
            try:
                offered = set(prom.label_values(label, selector))
            except PrometheusError as exc:
                found.append(f"[{sel.name}] variable ${name}: error: {exc}\n    {selector}")
                continue
            if not offered or not sel.offered.get(name, set()) <= offered:
                found.append(f"[{sel.name}] variable ${name}: offers {sorted(offered)}, expected "
                             f"{sorted(sel.offered.get(name, set()))}\n    label_values({selector}, {label})")
    all_values = {**BUILTINS, **selections[0].values}
    targets = {q.where: q for q in panel_queries(dashboard, all_values)}
    for where, holds in checks.items():
        q = targets[where]
        with contextlib.suppress(PrometheusError):
            samples = prom.query(q.expr)
            if holds(samples):
                continue
            found.append(f"{where}: does not show what the test made happen: "
                         f"{[(dict(s.labels), s.value) for s in samples]}\n    {q.expr}")
    for q in recording_queries():
        why = problem(prom, q)
        if why:
            found.append(f"{q.where}: {why}\n    {q.expr}")
    return found + rules_health(prom)


def rules_health(prom: PrometheusServer) -> list[str]:
    """Every loaded rule evaluated without error, and every recording rule's series exists."""
    found = []
    try:
        for group in prom.rule_groups():
            for rule in group["rules"]:
                name = rule.get("name", "?")
                if rule.get("health") != "ok":
                    found.append(f"rule {name!r} (group {group['name']!r}): health {rule.get('health')!r}: "
                                 f"{rule.get('lastError', '')}")
                elif rule.get("type") == "recording" and not prom.query(name):
                    found.append(f"recording rule {name!r}: its series is not there")
    except PrometheusError as exc:
        found.append(f"rules: {exc}")
    return found


def summary(prom: PrometheusServer, dashboard: Mapping[str, Any], values: Mapping[str, str]) -> str:
    lines = []
    for q in panel_queries(dashboard, {**BUILTINS, **values}):
        try:
            samples = prom.query(q.expr)
            shown = ", ".join(f"{'/'.join(s.labels.values()) or '-'}={s.value:.4g}" for s in samples[:4])
            lines.append(f"  {q.where}: {len(samples)} series {shown}")
        except PrometheusError as exc:
            lines.append(f"  {q.where}: {exc}")
    return "\n".join(lines)


# --- the fixture --------------------------------------------------------------------------------------------------

@dataclass
class Stack:
    env: Env
    prom: PrometheusServer
    fleet: Fleet
    class_name: str


@pytest.fixture
def stack(cluster: Any, kube: client.ApiClient, namespace: str, operator_identity: Any,
          gateway_api_installed: list[str], tmp_path: Path) -> Iterator[Stack]:
    pod_monitor, service_monitor = chart_monitors()
    static_pv(cluster, f"pv-{namespace}", namespace)
    static_pv(cluster, f"pv-{namespace}-2", namespace)
    custom = client.CustomObjectsApi(kube)
    class_name = f"priced-{uuid.uuid4().hex[:6]}"
    custom.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": class_name},
        "spec": {"pricing": PRICING}})
    redirect, file_sd = tmp_path / "scrape-addresses.json", tmp_path / "tei-pods.json"
    redirect.write_text("{}")
    write_file_sd(file_sd, [])
    operator = OperatorProcess(cluster, operator_identity, [namespace],
                               launcher=["-m", "rerank_devcluster.scrape_redirect", str(redirect)])
    env = Env(cluster, Kube(cluster, kube), namespace, namespace, operator)
    prom: PrometheusServer | None = None
    fleet: Fleet | None = None
    try:
        operator.start()
        prom = PrometheusServer(tmp_path / "prometheus",
                                prometheus_config(pod_monitor, service_monitor, file_sd, operator.metrics_port))
        prom.start()
        fleet = Fleet(kube, namespace, pod_selector(pod_monitor), redirect, file_sd)
        yield Stack(env, prom, fleet, class_name)
    finally:
        if fleet is not None:
            fleet.stop()
        if prom is not None:
            prom.stop()
        cleanup(env, [namespace])
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", class_name)
        cluster.kubectl_run("delete", "pv", f"pv-{namespace}", f"pv-{namespace}-2", "--wait=false", check=False)


def refuse_and_block_two_more_models(stack: Stack) -> None:
    """A model whose quantization Job ends refused by the quality gate; then a ResourceQuota of the two claims
    there are, and a model whose claim it refuses: its reconciles fail (a transient error, retried)."""
    env = stack.env
    env.kube.create_model(env.model(REFUSED, className=stack.class_name, pools=CPU_ONLY))
    env.finish_quantizer(ok=False, message=refused("QualityGateFailed", "spearman 0.91 < 0.98"))
    core = client.CoreV1Api(env.kube.api)
    core.create_namespaced_resource_quota(env.namespace, {"metadata": {"name": "claims"},
                                                          "spec": {"hard": {"persistentvolumeclaims": "2"}}})
    eventually(lambda: (core.read_namespaced_resource_quota("claims", env.namespace).status.used or {}).get(
        "persistentvolumeclaims") == "2", 30, "the claims quota to count the two claims")
    env.kube.create_model(env.model(BLOCKED, className=stack.class_name, pools=CPU_ONLY))


def test_every_dashboard_query_and_rule_has_data_on_a_real_prometheus(stack: Stack) -> None:
    env, prom, fleet = stack.env, stack.prom, stack.fleet
    started = time.monotonic()
    dashboard = json.loads(DASHBOARD.read_text())
    env.kube.create_model(env.model(NAME, className=stack.class_name, pools=POOLS, autoscaling=AUTOSCALING,
                                    routing=GATEWAY))
    env.finish_quantizer(ok=True)
    env.kube.wait_condition(env.namespace, NAME, "Ready", "True", "Serving")
    refuse_and_block_two_more_models(stack)
    try:
        env.kube.wait_condition(env.namespace, NAME, "MetricsAvailable", "True", "MetricsFresh", timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{env.describe()}") from None
    fleet.rate = BURST
    burst = time.monotonic()

    everything = {"namespace": ".*", "rerankmodel": ".*", "pool": ".*", "class": ".*"}
    selected = {"namespace": env.namespace, "rerankmodel": NAME, "pool": "cpu|gpu", "class": stack.class_name}
    selections = [
        Selection("all", everything, {"namespace": {env.namespace}, "rerankmodel": {NAME},
                                      "pool": {"cpu", "gpu"}, "class": {stack.class_name}}),
        Selection("this model", selected, {"namespace": {env.namespace}, "rerankmodel": {NAME},
                                           "pool": {"cpu", "gpu"}, "class": {stack.class_name}}),
    ]

    def labelled(samples: list[Sample], key: str, value: str) -> list[float]:
        return [s.value for s in samples if s.labels.get(key) == value and math.isfinite(s.value)]

    checks: dict[str, Callable[[list[Sample]], bool]] = {
        "panel 'Traffic shifts in range' [A]": lambda s: any(v >= 1 for v in labelled(s, "pool", "cpu")),
        "panel 'Models not Ready' [A]": lambda s: any(x.value >= 1 for x in s),
        # 1 to 2 GPU pods at 2.5 an hour: more would be a unit error (per second, twice x 3600)
        "panel 'Cost per hour by pool' [A]": lambda s: all(0 < v <= 5.5 for v in labelled(s, "pool", "gpu") or [0]),
        # a saturated GPU pod scores 80 pairs/s for 2.5 an hour: 8.7 per million pairs, more while it is idle or a
        # pod is starting (billed, not serving); an order of magnitude off is a unit error
        "panel 'Cost per million pairs by pool' [A]": lambda s: all(5 < v < 50 for v in labelled(s, "pool", "gpu")
                                                                    or [0]),
        "panel 'Slow-request ratio by pool (SLO: at most 5%)' [A]": lambda s: any(
            v > 0.05 for v in labelled(s, "pool", "gpu")),
        "panel 'Replicas by pool: pods, desired, max' [C]": lambda s: labelled(s, "pool", "gpu") == [2.0],
        "panel 'Quantization Jobs by outcome and reason (1h)' [A]": lambda s: (
            # each Job counted from its first event on (the held model may have one too, waiting for its claim)
            sum(labelled(s, "outcome", "created")) >= 2 and labelled(s, "outcome", "succeeded") == [1.0]
            and labelled(s, "reason", "QualityGateFailed") == [1.0]),
    }
    titles = {q.where for q in panel_queries(dashboard, {**BUILTINS, **everything})}
    assert set(checks) <= titles, f"checked panels not on the dashboard: {sorted(set(checks) - titles)}"
    found: list[str] = []

    def settled() -> bool:
        found[:] = problems(prom, dashboard, selections, checks)
        return not found
    with contextlib.suppress(AssertionError):
        eventually(settled, SETTLE_SECONDS, "every dashboard query to have data", every=3)
    print(f"\nDASHBOARD on a real Prometheus: settled {time.monotonic() - burst:.0f}s after the burst began, "
          f"{time.monotonic() - started:.0f}s in all; queries with every variable at All:\n"
          + summary(prom, dashboard, everything))
    assert not found, (f"{len(found)} dashboard queries or rules show nothing:\n" + "\n".join(found)
                       + f"\n--- operator log ---\n{env.operator.log.read_text()[-2000:]}")
    assert RULES.exists(), f"{RULES.relative_to(REPO)} is missing: its rules are evaluated here once it exists"
    loaded = prom.rule_groups()
    assert sorted(g["name"] for g in loaded) == sorted(g["name"] for g in rule_groups()), "not every group loaded"
    print(f"RULES: {sum(len(g['rules']) for g in loaded)} rules in {len(loaded)} groups evaluated cleanly, "
          f"{len(recording_queries())} recording rules with data")
