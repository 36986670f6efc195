"""The policy side of the shared class-limits table (tests/class_policy_cases.py): the shipped ValidatingAdmissionPolicy
on the real API server must refuse exactly what the table says, with the words ``tenancy.violations`` uses.

The unit side (tests/unit/tenancy/test_tenancy_class_policy_cases.py) runs the same table against the operator's checks.
One RerankClass per class of the table; every model names its class (spec.className) and is created by a cluster
admin (who passes the ``use`` check) as a server-side dry run. The binding is narrowed to this module's namespace.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from rerank_devcluster.cluster import Cluster
from rerank_devcluster.waiting import eventually
from tests.class_policy_cases import CASES, CLASSES, Case

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "policies" / "rerankmodel-class-policy.yaml"
RUN = uuid.uuid4().hex[:6]
LABEL = "rerank.io/class-cases-test"
GROUP, VERSION = "rerank.io", "v1alpha1"


def class_name(key: str) -> str:
    return f"cc-{RUN}-{key}"


def dry_run_create(kube: client.ApiClient, namespace: str, spec: dict[str, Any]) -> str | None:
    """The refusal's message, or None when admitted."""
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankModel", "metadata": {"name": "case"}, "spec": spec}
    try:
        client.CustomObjectsApi(kube).create_namespaced_custom_object(
            GROUP, VERSION, namespace, "rerankmodels", body, dry_run="All", field_validation="Strict")
    except ApiException as exc:
        assert exc.status in (403, 422), exc.body
        return str(json.loads(exc.body)["message"])
    return None


def wait_enforced(kube: client.ApiClient, namespace: str, name: str) -> None:
    """Until the policy refuses a model above every class's storage limit with RerankClass ``name``'s words."""
    probe = {"className": name, "model": {"id": "BAAI/bge-reranker-v2-m3"}, "storage": {"size": "999Pi"}}
    eventually(lambda: f"RerankClass {name}" in (dry_run_create(kube, namespace, probe) or ""),
               what=f"the class policy to enforce RerankClass {name}")


@pytest.fixture(scope="module")
def policed_ns(cluster: Cluster, kube: client.ApiClient, crds_installed: list[str]) -> Iterator[str]:
    """A namespace under the shipped policy with one RerankClass per class of the table, all seen by the policy."""
    ns = f"class-cases-{RUN}"
    cluster.kubectl_run("create", "namespace", ns)
    cluster.kubectl_run("label", "namespace", ns, f"{LABEL}={RUN}")
    policy, binding = yaml.safe_load_all(POLICY_FILE.read_text())
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {LABEL: RUN}}}
    classes = [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": class_name(key)},
                "spec": spec} for key, spec in CLASSES.items()]
    cluster.apply([*classes, policy, binding])
    try:
        for key in CLASSES:  # a class the policy has not seen yet passes vacuously: wait until each one is in force
            wait_enforced(kube, ns, class_name(key))
        yield ns
    finally:
        cluster.kubectl_run("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all([policy, binding]),
                            check=False)
        cluster.kubectl_run("delete", "rerankclass", *map(class_name, CLASSES), "--ignore-not-found", check=False)
        cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_policy_refuses_what_the_table_says(kube: client.ApiClient, policed_ns: str, case: Case) -> None:
    name = class_name(case.class_key)
    message = dry_run_create(kube, policed_ns, {**case.model_spec(), "className": name})
    if case.refused is None:
        assert message is None, message
        return
    assert message is not None, f"{case.name}: admitted"
    assert "ValidatingAdmissionPolicy 'rerankmodel-class-limits.rerank.io'" in message, message
    assert case.fragment(name) in message, message
