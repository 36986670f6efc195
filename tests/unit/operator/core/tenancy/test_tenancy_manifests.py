"""Static checks of crds/rerankclass.yaml and policies/: descriptions everywhere, cpu and gpu rules in step."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.unit.operator.core.tenancy.tenancy_helpers import POLICY, REPO, class_schema


def walk(schema: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{key}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")


def test_every_class_field_has_a_description() -> None:
    skip = {".apiVersion", ".kind", ".metadata"}
    missing = [p for p, s in walk(class_schema()) if p not in skip and p and not s.get("description")]
    assert missing == []


def policy_docs() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(POLICY.read_text()))


def test_policy_cpu_and_gpu_rules_differ_only_by_pool_name() -> None:
    policy = policy_docs()[0]
    texts = [yaml.safe_dump(v) for v in policy["spec"]["validations"]]
    cpu = [t for t in texts if "pools.cpu" in t]
    gpu = [t for t in texts if "pools.gpu" in t]
    assert cpu and [t.replace("cpu", "gpu") for t in cpu] == gpu
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["cpuResourceExcess"].replace("cpu", "gpu") == variables["gpuResourceExcess"]


def test_policy_and_binding_fit_together() -> None:
    policy, binding = policy_docs()
    assert policy["spec"]["paramKind"] == {"apiVersion": "rerank.io/v1alpha1", "kind": "RerankClass"}
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["paramRef"] == {"selector": {}, "parameterNotFoundAction": "Deny"}
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert all("messageExpression" in v for v in policy["spec"]["validations"])


def test_aggregate_roles_label_into_the_built_in_roles() -> None:
    docs = list(yaml.safe_load_all((REPO / "policies" / "aggregate-roles.yaml").read_text()))
    labels = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in docs if d["kind"] == "ClusterRole"}
    assert labels["rerank:aggregate-to-view"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert labels["rerank:aggregate-to-edit"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert labels["rerank:aggregate-to-edit"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    verbs = {v for d in docs if d["kind"] == "ClusterRole" for r in d["rules"] for v in r["verbs"]}
    assert "use" not in verbs and "*" not in verbs


def test_tenancy_stays_import_light() -> None:
    package = REPO / "operator" / "rerank_operator" / "core" / "tenancy"
    source = "\n".join(p.read_text() for p in sorted(package.glob("*.py")))
    imports = set(re.findall(r"^(?:from|import) ([\w.]+)", source, re.M))
    # The operator's pure core, and the contracts (standard library only, like the core).
    third_party = {i for i in imports if not i.startswith(("rerank_operator.core", "rerank_contracts"))}
    assert third_party <= {"__future__", "collections.abc", "copy", "re", "dataclasses", "decimal", "typing"}, imports
    assert len(list(package.glob("*.py"))) >= 6  # one small module per concern
