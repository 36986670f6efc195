"""The CRD (crds/rerankmodel.yaml) is well-formed, documented, and its defaults are the ones spec.py assumes."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import parse as spec_parse

CRD_PATH = Path(__file__).resolve().parents[5] / "crds" / "rerankmodel.yaml"
CRD = yaml.safe_load(CRD_PATH.read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["openAPIV3Schema"] if "openAPIV3Schema" in VERSION else VERSION["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def apply_defaults(obj: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: unset properties with a default get it, recursively."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                obj[name] = apply_defaults(obj[name], sub)
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(i, schema["items"]) for i in obj]
    return obj


def test_every_field_has_a_description() -> None:
    missing = [p for p, node in walk(SCHEMA["properties"]["spec"], "spec") if not node.get("description")]
    missing += [p for p, node in walk(SCHEMA["properties"]["status"], "status") if not node.get("description")]
    # quantity values under resources are the one place Kubernetes itself leaves undocumented
    assert [p for p in missing if not p.endswith("{}")] == []


def test_every_cel_rule_has_a_message() -> None:
    rules = [(p, r) for p, node in walk(SCHEMA) for r in node.get("x-kubernetes-validations") or ()]
    assert len(rules) >= 20
    assert [p for p, r in rules if not r.get("message")] == []


def test_printer_columns_and_names() -> None:
    columns = [c["name"].upper() for c in VERSION["additionalPrinterColumns"]]
    assert columns == ["READY", "PHASE", "MODEL", "CPU", "GPU", "GPU%", "ARTIFACT", "TARGET", "AGE"]
    assert CRD["spec"]["names"]["shortNames"] == ["rrm"]
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns_point_at_declared_status_fields() -> None:
    declared = {p for p, _ in walk(SCHEMA)}
    for column in VERSION["additionalPrinterColumns"]:
        path = column["jsonPath"].split("[")[0]
        if path.startswith(".status"):
            assert path in declared, column


def test_status_fields_the_operator_writes_are_declared() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    from rerank_operator.core.status.compute import OWNED_KEYS
    assert set(OWNED_KEYS) <= set(status)
    assert {"id", "path", "sizeBytes", "manifestSha256", "quality", "speed", "recipe", "publishedAt"} <= set(
        status["artifact"]["properties"])


MINIMAL = {"model": {"id": "BAAI/bge-reranker-v2-m3"},
           "pools": {"gpu": {"resources": {"limits": {"nvidia.com/gpu": 1}}}}}


def test_crd_defaults_are_the_defaults_spec_py_assumes() -> None:
    defaulted = apply_defaults(copy.deepcopy(MINIMAL), SCHEMA["properties"]["spec"])
    assert defaulted != MINIMAL  # the CRD did default something
    assert spec_parse.parse(defaulted) == spec_parse.parse(MINIMAL)


@pytest.mark.parametrize("path,expected", [
    ("autoscaling.intervalSeconds", 5), ("autoscaling.metrics.source", "direct"),
    ("autoscaling.metrics.staleAfterSeconds", 60), ("autoscaling.targets.gpuLatencyP95Ms", 250),
    ("autoscaling.targets.cpuLatencyP95Ms", 500), ("autoscaling.targets.queuePerReplica", 16),
    ("autoscaling.targets.gpuMemoryWatermark", 0.9), ("autoscaling.scaleUp.stabilizationSeconds", 0),
    ("autoscaling.scaleUp.maxStep", 4), ("autoscaling.scaleUp.cooldownSeconds", 0),
    ("autoscaling.scaleDown.stabilizationSeconds", 300), ("autoscaling.scaleDown.maxStep", 1),
    ("autoscaling.scaleDown.cooldownSeconds", 120), ("autoscaling.spillover.stepPercent", 25),
    ("autoscaling.spillover.recoverStepPercent", 10), ("autoscaling.spillover.maxCpuPercent", 100),
    ("autoscaling.spillover.surgeMaxStep", 32),
    ("autoscaling.replicaManagement", "operator"), ("autoscaling.idleSeconds", 900), ("quantization.enabled", True),
    ("storage.reclaimPolicy", "Retain"), ("routing.policy", "gpu-first"),
])
def test_agreed_defaults(path: str, expected: Any) -> None:
    """The defaults listed in docs/reconcile.md and the brief, read from an empty spec after defaulting."""
    value: Any = apply_defaults(copy.deepcopy(MINIMAL), SCHEMA["properties"]["spec"])
    for key in path.split("."):
        value = value[key]
    assert value == expected


# Fields a RerankClass may default (tenancy.resolve) carry no CRD default: the API server would fill them before the
# class could. spec.py applies the built-in default after the class's (tenant value, class default, built-in).
CLASS_DEFAULTED = ["pools.cpu.image", "pools.cpu.minReplicas", "pools.cpu.maxReplicas", "pools.cpu.resources",
                   "pools.gpu.image", "pools.gpu.minReplicas", "pools.gpu.maxReplicas", "pools.gpu.resources",
                   "quantization.image", "quantization.mode", "quantization.target", "quantization.recipe",
                   "quantization.qualityGate.minSpearman", "quantization.qualityGate.minTopKAgreement",
                   "quantization.qualityGate.topK", "storage.size", "storage.storageClassName"]


@pytest.mark.parametrize("path", CLASS_DEFAULTED)
def test_fields_a_class_defaults_have_no_crd_default(path: str) -> None:
    node = SCHEMA["properties"]["spec"]
    for key in path.split("."):
        node = node["properties"][key]
    assert "default" not in node, path
    assert "Default:" in node["description"] or path.startswith("storage."), path


def test_built_in_defaults_apply_when_neither_model_nor_class_sets_them() -> None:
    parsed = spec_parse.parse({"model": {"id": "org/m"}, "pools": {"gpu": {}}})
    assert (parsed.cpu.image, parsed.gpu.image) == (specs.TEI_CPU_IMAGE, specs.TEI_GPU_IMAGE)
    assert (parsed.cpu.min_replicas, parsed.cpu.max_replicas, parsed.gpu.max_replicas) == (1, 4, 2)
    assert parsed.cpu.resources == specs.DEFAULT_CPU_RESOURCES
    assert parsed.quantization.image == specs.QUANTIZER_IMAGE
    q = parsed.quantization
    assert (q.mode, q.target, q.recipe) == ("dynamic", "auto", "auto")
    assert parsed.quantization.quality_gate == specs.QualityGate(0.99, 0.9, 3)


def test_absent_gpu_pool_is_disabled_and_cpu_pool_is_enabled() -> None:
    parsed = spec_parse.parse({"model": {"id": "org/m"}})
    assert parsed.cpu.enabled and not parsed.gpu.enabled


@pytest.mark.parametrize("spec,fragment", [
    ({"model": {}}, "exactly one of id or path"),
    ({"model": {"id": "a/b", "path": "x"}}, "exactly one of id or path"),
    ({"model": {"id": "a/b"}, "pools": {"cpu": {"enabled": False}}}, "no pool"),
    ({"model": {"id": "a/b"}, "quantization": {"evaluationData": {}}}, None),
    ({"model": {"id": "a/b"},
      "quantization": {"evaluationData": {"path": "x", "configMapRef": {"name": "c", "key": "k"}}}},
     "exactly one of configMapRef or path"),
])
def test_parse_refuses_what_the_crd_refuses(spec: dict[str, Any], fragment: str | None) -> None:
    if fragment is None:
        spec_parse.parse(spec)  # an empty data section means "none"
        return
    with pytest.raises(specs.SpecError, match=fragment):
        spec_parse.parse(spec)


def test_the_autoscalers_view_has_the_crds_defaults_and_comes_from_the_same_parser() -> None:
    from rerank_operator.core.autoscale.config import AutoscalingSpec
    defaulted = apply_defaults(copy.deepcopy(MINIMAL), SCHEMA["properties"]["spec"])
    view = AutoscalingSpec.from_model(spec_parse.parse(defaulted))
    assert view == AutoscalingSpec.from_model(spec_parse.parse(MINIMAL)) == AutoscalingSpec.from_spec(MINIMAL)
    crd = defaulted["autoscaling"]
    assert (view.interval_seconds, view.stale_after_seconds) == (crd["intervalSeconds"],
                                                                 crd["metrics"]["staleAfterSeconds"])
    assert (view.scale_up.max_step, view.scale_down.stabilization_seconds) == (crd["scaleUp"]["maxStep"],
                                                                               crd["scaleDown"]["stabilizationSeconds"])
    assert view.spillover.surge_max_step == crd["spillover"]["surgeMaxStep"]
    assert (view.gpu.max_replicas, view.cpu.max_replicas) == (specs.DEFAULT_MAX_REPLICAS["gpu"],
                                                              specs.DEFAULT_MAX_REPLICAS["cpu"])


@pytest.mark.parametrize("quantization,budget", [
    ({}, 900),                                                   # the built-in budget under the built-in deadline
    ({"activeDeadlineSeconds": 600}, 450),                       # a shorter deadline shrinks the unset budget
    ({"activeDeadlineSeconds": 60}, 45),
    ({"activeDeadlineSeconds": 7200}, 900),                      # a longer one does not grow it
    ({"activeDeadlineSeconds": 600, "timeBudgetSeconds": 120}, 120),  # a budget the tenant sets is kept
])
def test_an_unset_time_budget_fits_the_deadline(quantization: dict[str, Any], budget: int) -> None:
    """Setting only a short deadline must not trip 'timeBudgetSeconds must be below activeDeadlineSeconds' for a
    budget the tenant never wrote: the CRD has no default for it, spec.py derives it from the deadline."""
    body = apply_defaults(copy.deepcopy({**MINIMAL, "quantization": quantization}), SCHEMA["properties"]["spec"])
    parsed = spec_parse.parse(body)
    assert parsed.quantization.time_budget_seconds == budget
    assert parsed.quantization.time_budget_seconds < parsed.quantization.active_deadline_seconds


# -- scale to zero: every enabled pool at minReplicas 0 ------------------------------------------------------------

ROUTE = {"gateway": {"parentRefs": [{"name": "edge"}]}}
GPU_LIMITS = {"resources": {"limits": {"nvidia.com/gpu": 1}}}


def scale_to_zero_rule() -> dict[str, Any]:
    (rule,) = [r for r in SCHEMA["properties"]["spec"]["x-kubernetes-validations"] if "minReplicas" in r["rule"]]
    return dict(rule)


def test_the_crd_and_the_parser_refuse_an_unwakeable_zero_model_in_the_same_words() -> None:
    rule = scale_to_zero_rule()
    assert " ".join(rule["message"].split()) == spec_parse.SCALE_TO_ZERO_NEEDS
    for field in ("self.autoscaling.enabled", "self.autoscaling.replicaManagement == 'operator'",
                  "has(self.routing.gateway)"):
        assert field in " ".join(rule["rule"].split()), field
    idle = SCHEMA["properties"]["spec"]["properties"]["autoscaling"]["properties"]["idleSeconds"]
    assert (idle["default"], idle["minimum"], idle["maximum"]) == (specs.Autoscaling.idle_seconds, 30, 604800)


@pytest.mark.parametrize("cpu,gpu,zero", [
    ({"minReplicas": 0}, None, True),
    ({"minReplicas": 0}, {"minReplicas": 0, **GPU_LIMITS}, True),
    ({"enabled": False}, {"minReplicas": 0, **GPU_LIMITS}, True),
    ({"minReplicas": 0}, {"enabled": False, "minReplicas": 1, **GPU_LIMITS}, True),
    ({"minReplicas": 1}, {"minReplicas": 0, **GPU_LIMITS}, False),   # the CPU pool keeps serving
    ({"minReplicas": 0}, {"minReplicas": 1, **GPU_LIMITS}, False),
    ({}, None, False),                                               # unset: the built-in 1
    ({"minReplicas": 0}, {**GPU_LIMITS}, False),
])
def test_scales_to_zero_is_every_enabled_pool_at_min_zero(cpu: dict[str, Any], gpu: dict[str, Any] | None,
                                                           zero: bool) -> None:
    pools = {"cpu": cpu} if gpu is None else {"cpu": cpu, "gpu": gpu}
    parsed = spec_parse.parse({"model": {"id": "org/m"}, "pools": pools, "routing": ROUTE})
    assert parsed.scales_to_zero is zero


@pytest.mark.parametrize("change", [
    {"routing": {}},
    {"autoscaling": {"enabled": False}},
    {"autoscaling": {"replicaManagement": "external"}},
])
def test_a_model_at_zero_must_be_wakeable(change: dict[str, Any]) -> None:
    body = {"model": {"id": "org/m"}, "pools": {"cpu": {"minReplicas": 0}}, "routing": ROUTE, **change}
    with pytest.raises(specs.SpecError) as refused:
        spec_parse.parse(body)
    assert str(refused.value) == (
        "every enabled pool at minReplicas 0 (scale to zero) needs autoscaling.enabled, autoscaling.replicaManagement "
        "operator and routing.gateway: the activator that wakes the model is reached through its HTTPRoute")
    spec_parse.parse({**body, "pools": {"cpu": {"minReplicas": 1}}})  # with a pod kept, nothing needs waking


def test_a_class_default_of_min_zero_is_checked_on_the_effective_spec() -> None:
    """The CRD sees only the tenant's spec (no minReplicas: not 0); the class's defaultMinReplicas 0 makes the
    effective spec scale to zero, and the operator's parse refuses it without a route."""
    from rerank_operator.core import tenancy
    class_spec = {"pools": {"cpu": {"defaultMinReplicas": 0}}, "scaleToZero": {"allowed": True}}
    tenant = apply_defaults({"model": {"id": "org/m"}}, SCHEMA["properties"]["spec"])
    with pytest.raises(specs.SpecError, match="scale to zero"):
        spec_parse.parse(tenancy.resolve(tenant, class_spec))
    routed = spec_parse.parse(tenancy.resolve({**tenant, "routing": {**tenant["routing"], **ROUTE}}, class_spec))
    assert routed.scales_to_zero and routed.autoscaling.idle_seconds == 900


@pytest.mark.parametrize("idle,ok", [(30, True), (604800, True), (3600, True), (29, False), (604801, False),
                                     ("60", False), (True, False)])
def test_idle_seconds_is_parsed_within_the_crds_bounds(idle: Any, ok: bool) -> None:
    body = {"model": {"id": "org/m"}, "autoscaling": {"idleSeconds": idle}}
    if not ok:
        with pytest.raises(specs.SpecError, match=r"autoscaling\.idleSeconds"):
            spec_parse.parse(body)
        return
    assert spec_parse.parse(body).autoscaling.idle_seconds == idle
