"""alerts/rerank-operator.rules.yaml: valid for Prometheus, unit-tested with promtool, every alert tested both ways,
documented with a runbook, and shipped verbatim by the chart's PrometheusRule.

promtool (Prometheus' own rule checker, Debian package ``prometheus``) does the checking and runs the unit tests in
alerts/tests/; these tests add what promtool cannot know: that every alert has a test where it fires and one where it
stays silent, that every recording rule is evaluated by a test, that the rules read only metrics the operator exports,
and that every alert's labels and runbook follow the conventions of docs/operations.md (Alerts).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_devcluster import binaries
from tests.unit.project.operator_metrics_names import operator_metric_names

REPO_ROOT = Path(__file__).resolve().parents[3]
ALERTS = REPO_ROOT / "alerts"
RULES = ALERTS / "rerank-operator.rules.yaml"
TEST_FILES = sorted((ALERTS / "tests").glob("*.yaml"))
DOC = REPO_ROOT / "docs" / "operations.md"
CHART = REPO_ROOT / "charts" / "rerank-operator"
SEVERITIES = {"page", "ticket", "info"}
Doc = dict[str, Any]


def rule_file() -> Doc:
    data: Doc = yaml.safe_load(RULES.read_text())
    return data


def rules() -> Iterator[Doc]:
    for group in rule_file()["groups"]:
        yield from group["rules"]


def alerts() -> dict[str, Doc]:
    return {r["alert"]: r for r in rules() if "alert" in r}


def recorded() -> set[str]:
    return {r["record"] for r in rules() if "record" in r}


def unit_tests() -> Iterator[tuple[Path, Doc]]:
    for f in TEST_FILES:
        for case in yaml.safe_load(f.read_text())["tests"]:
            yield f, case


# -- promtool ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool not found on PATH: install Prometheus' tools (Debian/Ubuntu: apt-get install -y "
                    "prometheus, as hack/setup.sh does; elsewhere the promtool binary of a Prometheus release)")
    return found


def run_promtool(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)


def test_promtool_accepts_the_rules(promtool: str) -> None:
    out = run_promtool(promtool, "check", "rules", str(RULES.relative_to(REPO_ROOT)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(list(rules()))} rules found" in out.stdout, out.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    assert TEST_FILES, "no promtool unit tests in alerts/tests/"
    out = run_promtool(promtool, "test", "rules", *(str(f.relative_to(REPO_ROOT)) for f in TEST_FILES))
    assert out.returncode == 0, out.stdout + out.stderr


# -- coverage of the unit tests ------------------------------------------------------------------------------------

def test_the_unit_tests_load_the_rules_file_itself() -> None:
    for f in TEST_FILES:
        loaded = [(f.parent / p).resolve() for p in yaml.safe_load(f.read_text())["rule_files"]]
        assert loaded == [RULES], f"{f.name}: rule_files must be the one rules file, got {loaded}"


def test_every_alert_is_tested_firing_and_silent() -> None:
    firing: set[str] = set()
    silent: set[str] = set()
    for f, case in unit_tests():
        for check in case.get("alert_rule_test") or ():
            name = check["alertname"]
            assert name in alerts(), f"{f.name} ({case.get('name')}): tests an alert that does not exist: {name}"
            (firing if check.get("exp_alerts") else silent).add(name)
    assert not set(alerts()) - firing, f"alerts without a test where they fire: {sorted(set(alerts()) - firing)}"
    assert not set(alerts()) - silent, f"alerts without a test where they stay silent: {sorted(set(alerts()) - silent)}"


def names_in(expr: str, pattern: str) -> set[str]:
    """Identifiers of the given shape in a PromQL expression, string literals (label values) left out."""
    return set(re.findall(rf"(?<![\w:])({pattern})(?![\w:])", re.sub(r'"[^"]*"', '""', expr)))


def test_every_recording_rule_is_evaluated_by_a_test() -> None:
    evaluated: set[str] = set()
    for _, case in unit_tests():
        for check in case.get("promql_expr_test") or ():
            evaluated |= names_in(check["expr"], r"[a-zA-Z_][\w]*:[\w:]*")
    assert recorded(), "no recording rules"
    unevaluated = recorded() - evaluated
    assert not unevaluated, f"recording rules no promql_expr_test evaluates: {sorted(unevaluated)}"


# -- what the rules read -------------------------------------------------------------------------------------------



def test_rules_read_only_metrics_the_operator_exports_and_rules_recorded_here() -> None:
    used_metrics: set[str] = set()
    used_recorded: set[str] = set()
    for rule in rules():
        used_metrics |= names_in(rule["expr"], r"rerank_operator_\w+")
        used_recorded |= names_in(rule["expr"], r"[a-zA-Z_]\w*:[\w:]*")
    assert used_metrics, "the rules read no operator metric?"
    missing = used_metrics - operator_metric_names()
    assert not missing, f"metrics the operator does not export: {sorted(missing)}"
    assert not used_recorded - recorded(), f"recording rules that do not exist: {sorted(used_recorded - recorded())}"


# -- labels, annotations, runbooks ---------------------------------------------------------------------------------

def doc_url() -> str:
    home = yaml.safe_load((CHART / "Chart.yaml").read_text())["home"]
    return f"{home}/blob/main/docs/operations.md"


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def alerts_section() -> str:
    doc = DOC.read_text()
    found = re.search(r"^## Alerts\n(.*?)(?=^## |\Z)", doc, re.M | re.S)
    assert found, "docs/operations.md has no '## Alerts' section"
    return found.group(1)


def test_every_alert_has_severity_summary_description_and_a_runbook() -> None:
    section = alerts_section()
    anchors = {github_slug(h) for h in re.findall(r"^###\s+(.+)$", section, re.M)}
    for name, alert in alerts().items():
        assert re.fullmatch(r"Rerank[A-Z]\w+", name), f"{name}: alert names are Rerank<CamelCase>"
        assert alert.get("labels", {}).get("severity") in SEVERITIES, f"{name}: severity must be one of {SEVERITIES}"
        annotations = alert.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(annotations), f"{name}: annotations {annotations}"
        anchor = f"alert-{name.lower()}"
        assert annotations["runbook_url"] == f"{doc_url()}#{anchor}", f"{name}: runbook_url"
        assert anchor in anchors, f"{name}: docs/operations.md (Alerts) has no heading '### Alert: {name}'"


def test_the_runbooks_and_the_alert_table_match_the_rules() -> None:
    section = alerts_section()
    documented = set(re.findall(r"^### Alert: (\w+)$", section, re.M))
    assert documented == set(alerts()), f"runbooks without an alert: {sorted(documented - set(alerts()))}"
    table = dict(re.findall(r"^\| \[`(\w+)`\]\(#alert-\w+\) \| (\w+) \|", section, re.M))
    severities = {n: a["labels"]["severity"] for n, a in alerts().items()}
    assert table == severities, "docs/operations.md's table of alerts: each alert once, with its severity"


# -- the chart -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def helm() -> str:
    return str(binaries.ensure("helm"))


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=check)


def render(helm: str, *args: str, chart: Path = CHART) -> list[Doc]:
    out = run_helm(helm, "template", "rr", str(chart), "--namespace", "rerank-system", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def prometheus_rules(docs: list[Doc]) -> list[Doc]:
    return [d for d in docs if d["kind"] == "PrometheusRule"]


def test_chart_reads_the_rules_through_a_symlink() -> None:
    link = CHART / "files" / "alerts"
    assert link.is_symlink() and link.resolve() == ALERTS


def test_chart_prometheusrule_is_the_rules_file(helm: str) -> None:
    assert not prometheus_rules(render(helm)), "the PrometheusRule is off by default"
    [rule] = prometheus_rules(render(helm, "--set", "prometheusRule.enabled=true",
                                     "--set", "prometheusRule.labels.release=kube-prometheus-stack"))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "rerank-system"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["labels"]["app.kubernetes.io/name"] == "rerank-operator"
    assert rule["spec"] == {"groups": rule_file()["groups"]}


def test_chart_adds_additional_labels_to_every_alert_only(helm: str) -> None:
    [rule] = prometheus_rules(render(helm, "--set", "prometheusRule.enabled=true",
                                     "--set", "prometheusRule.additionalLabels.team=platform",
                                     "--set", "prometheusRule.additionalLabels.severity=overridden"))
    expected = rule_file()["groups"]
    for group in expected:
        for r in group["rules"]:
            if "alert" in r:
                r["labels"] = {"team": "platform", **r.get("labels", {})}  # the alert's own severity wins
    assert rule["spec"] == {"groups": expected}


def test_chart_refuses_to_render_without_the_rules_file(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    subprocess.run(["cp", "-rL", str(CHART), str(chart)], check=True)
    (chart / "files" / "alerts" / RULES.name).unlink()
    assert not prometheus_rules(render(helm, chart=chart)), "off, the rules file is not needed"
    out = run_helm(helm, "template", "rr", str(chart), "--set", "prometheusRule.enabled=true", check=False)
    assert out.returncode != 0 and f"files/alerts/{RULES.name} is missing" in out.stderr, out.stderr


def test_packaged_chart_carries_the_rules_file(helm: str, tmp_path: Path) -> None:
    run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    (pkg,) = tmp_path.glob("rerank-operator-*.tgz")
    with tarfile.open(pkg) as tar:
        packaged = tar.extractfile(f"rerank-operator/files/alerts/{RULES.name}")
        assert packaged is not None and packaged.read() == RULES.read_bytes()
    [rule] = prometheus_rules(render(helm, "--set", "prometheusRule.enabled=true", chart=pkg))
    assert rule["spec"] == {"groups": rule_file()["groups"]}
