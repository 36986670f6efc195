"""charts/rerank-operator with the activator (templates/activator.yaml; issue 45): what `helm template` renders.

Off by default, nothing of it is rendered. On, the chart runs the operator's image as ``rerank-activator`` with the
contract's port, key path and pod labels (operator/rerank_activator/activator.py, which the operator imports too),
fences it with a NetworkPolicy, shares one key Secret between it and the operator, and gives the operator the
``--activator-*`` flags and a Role for ReferenceGrants in the release namespace only.
"""

from __future__ import annotations

import base64
import posixpath
import subprocess
from typing import Any

import pytest
import yaml

from rerank_contracts import activator
from rerank_devcluster import binaries
from tests.unit.project.test_chart import CHART, OPERATOR_NAME, REPO_ROOT, Doc, only, render, run_helm

ACTIVATOR = f"{OPERATOR_NAME}-activator"
KEY_SECRET = f"{ACTIVATOR}-key"
KEY_DIR = posixpath.dirname(activator.KEY_FILE)
ACTIVATOR_RULES = REPO_ROOT / "operator" / "rerank_operator" / "rbac_activator.yaml"
ACTIVATOR_READS = REPO_ROOT / "operator" / "rerank_activator" / "rbac.yaml"
ON = ("--set", "activator.enabled=true")


@pytest.fixture(scope="module")
def helm() -> str:
    return str(binaries.ensure("helm"))


def deployment(docs: list[Doc], name: str) -> Doc:
    return only(docs, "Deployment", name)


def pod(docs: list[Doc], name: str) -> Doc:
    spec: Doc = deployment(docs, name)["spec"]["template"]
    return spec


def container(docs: list[Doc], name: str) -> Doc:
    containers: list[Doc] = pod(docs, name)["spec"]["containers"]
    (c,) = containers
    return c


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_off_by_default_nothing_of_it_is_rendered(helm: str) -> None:
    docs = render(helm)
    assert not [d for d in docs if "activator" in d["metadata"]["name"]]
    assert not [d for d in docs if d["kind"] in ("Secret", "NetworkPolicy")]
    operator = container(docs, OPERATOR_NAME)
    assert not [a for a in operator["args"] if a.startswith("--activator")]
    assert not [m for m in operator["volumeMounts"] if m["mountPath"] == KEY_DIR]


def test_on_the_activator_runs_the_operators_image_locked_down(helm: str) -> None:
    digest = "sha256:" + "b" * 64
    docs = render(helm, *ON, "--set", f"image.digest={digest}")
    dep = deployment(docs, ACTIVATOR)
    template = pod(docs, ACTIVATOR)
    labels = template["metadata"]["labels"]
    assert selects(activator.POD_LABELS, labels)
    assert labels["app.kubernetes.io/instance"] == "rr"
    assert selects(dep["spec"]["selector"]["matchLabels"], labels) and dep["spec"]["replicas"] == 2
    c = container(docs, ACTIVATOR)
    assert c["image"] == container(docs, OPERATOR_NAME)["image"] == f"ghcr.io/rerank-operator/rerank-operator@{digest}"
    assert c["command"] == ["rerank-activator"]
    assert c["args"] == [f"--port={activator.PORT}", f"--key-file={activator.KEY_FILE}", "--hold-seconds=30",
                         "--remember-seconds=60", "--log-format=json"]
    assert c["ports"] == [{"name": "http", "containerPort": activator.PORT, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    sc, psc = c["securityContext"], template["spec"]["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    # Its own ServiceAccount, not the operator's: its token reads Services and EndpointSlices, nothing more.
    assert template["spec"]["serviceAccountName"] == ACTIVATOR and template["spec"]["automountServiceAccountToken"]
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert c["volumeMounts"] == [{"name": "activator-key", "mountPath": KEY_DIR, "readOnly": True}]
    assert template["spec"]["volumes"] == [{"name": "activator-key",
                                            "secret": {"secretName": KEY_SECRET, "defaultMode": 0o440}}]
    # Past a whole hold and the pool's answer (60 s), the pod is killed: the grace covers both.
    assert template["spec"]["terminationGracePeriodSeconds"] > 30 + 60


def test_the_service_the_operators_flags_and_the_shared_key(helm: str) -> None:
    docs = render(helm, *ON)
    svc = only(docs, "Service", ACTIVATOR)
    assert svc["metadata"]["namespace"] == "rerank-system"
    assert svc["spec"]["ports"] == [{"name": "http", "port": activator.PORT, "targetPort": "http", "protocol": "TCP"}]
    assert selects(svc["spec"]["selector"], pod(docs, ACTIVATOR)["metadata"]["labels"])
    assert not selects(svc["spec"]["selector"], pod(docs, OPERATOR_NAME)["metadata"]["labels"])
    operator = container(docs, OPERATOR_NAME)
    assert [a for a in operator["args"] if a.startswith("--activator")] == [
        f"--activator-url=http://{ACTIVATOR}.rerank-system.svc:{activator.PORT}",
        f"--activator-service=rerank-system/{ACTIVATOR}:{activator.PORT}",
        f"--activator-key-file={activator.KEY_FILE}",
    ]
    mount = next(m for m in operator["volumeMounts"] if m["mountPath"] == KEY_DIR)
    assert mount["readOnly"] is True
    volume = next(v for v in pod(docs, OPERATOR_NAME)["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == KEY_SECRET
    secret = only(docs, "Secret", KEY_SECRET)
    key = base64.b64decode(secret["data"]["key"])
    assert len(key) == 48 and key.isalnum()
    assert len(key) >= activator.MIN_KEY_BYTES
    # Made at random (helm template cannot look the cluster's up): two renders, two keys.
    assert only(render(helm, *ON), "Secret", KEY_SECRET)["data"]["key"] != secret["data"]["key"]


def test_the_operators_selectors_and_the_activators_do_not_overlap(helm: str) -> None:
    """The operator's Deployment, PodDisruptionBudget and metrics Service select on name and instance: the activator's
    pods must not be counted as operator pods, nor the operator's as activators."""
    docs = render(helm, *ON)
    activator_pods = pod(docs, ACTIVATOR)["metadata"]["labels"]
    operator_pods = pod(docs, OPERATOR_NAME)["metadata"]["labels"]
    for selector in (deployment(docs, OPERATOR_NAME)["spec"]["selector"]["matchLabels"],
                     only(docs, "PodDisruptionBudget", OPERATOR_NAME)["spec"]["selector"]["matchLabels"],
                     only(docs, "Service", f"{OPERATOR_NAME}-metrics")["spec"]["selector"]):
        assert not selects(selector, activator_pods)
    pdb = only(docs, "PodDisruptionBudget", ACTIVATOR)
    assert pdb["spec"]["minAvailable"] == 1 and selects(pdb["spec"]["selector"]["matchLabels"], activator_pods)
    assert not selects(pdb["spec"]["selector"]["matchLabels"], operator_pods)
    single = render(helm, *ON, "--set", "activator.replicas=1")
    assert [d["metadata"]["name"] for d in single if d["kind"] == "PodDisruptionBudget"] == [OPERATOR_NAME]


def ingress_peers(docs: list[Doc]) -> list[dict[str, Any]]:
    policy = only(docs, "NetworkPolicy", ACTIVATOR)
    assert selects(policy["spec"]["podSelector"]["matchLabels"], pod(docs, ACTIVATOR)["metadata"]["labels"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": activator.PORT}]
    peers: list[dict[str, Any]] = rule["from"]
    return peers


def test_the_network_policy_lets_in_the_gateway_and_the_operator_only(helm: str) -> None:
    docs = render(helm, *ON, "--set", "activator.allowedFrom.namespaces={envoy-gateway-system,gw-b}",
                  "--set", "activator.allowedFrom.podLabels.app\\.kubernetes\\.io/name=envoy")
    operator_peer, gateway_peer = ingress_peers(docs)
    assert set(operator_peer) == {"podSelector"}  # no namespaceSelector: the policy's own namespace
    assert selects(operator_peer["podSelector"]["matchLabels"], pod(docs, OPERATOR_NAME)["metadata"]["labels"])
    assert not selects(operator_peer["podSelector"]["matchLabels"], pod(docs, ACTIVATOR)["metadata"]["labels"])
    assert gateway_peer == {
        "namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                    "values": ["envoy-gateway-system", "gw-b"]}]},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "envoy"}}}
    any_pod = ingress_peers(render(helm, *ON, "--set", "activator.allowedFrom.namespaces={gw}"))[1]
    assert set(any_pod) == {"namespaceSelector"}
    assert len(ingress_peers(render(helm, *ON))) == 1  # nothing allowed: the operator alone


def test_a_key_secret_of_ones_own_is_mounted_and_none_made(helm: str) -> None:
    docs = render(helm, *ON, "--set", "activator.keySecret=platform-activator-key")
    assert not [d for d in docs if d["kind"] == "Secret"]
    for name in (ACTIVATOR, OPERATOR_NAME):
        volumes = pod(docs, name)["spec"]["volumes"]
        assert {"name": "activator-key", "secret": {"secretName": "platform-activator-key", "defaultMode": 0o440}} \
            in volumes


def test_the_operator_may_manage_referencegrants_in_its_namespace_only(helm: str) -> None:
    docs = render(helm, *ON)
    role, binding = only(docs, "Role", ACTIVATOR), only(docs, "RoleBinding", ACTIVATOR)
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "rerank-system"
    # One rules file for the chart and the operator's cluster tests, and it grants ReferenceGrants only.
    assert role["rules"] == yaml.safe_load(ACTIVATOR_RULES.read_text())
    assert (CHART / "files" / "rbac_activator.yaml").resolve() == ACTIVATOR_RULES
    for rule in role["rules"]:
        assert rule["apiGroups"] == ["gateway.networking.k8s.io"] and rule["resources"] == ["referencegrants"]
        assert set(rule["verbs"]) <= {"get", "list", "watch", "create", "patch", "update", "delete"}
        assert {"create", "patch"} <= set(rule["verbs"]), "the operator applies one ReferenceGrant per namespace"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": ACTIVATOR}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": OPERATOR_NAME, "namespace": "rerank-system"}]
    cluster_rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert not [r for r in cluster_rules if "referencegrants" in r["resources"]]
    assert not [d for d in render(helm, *ON, "--set", "rbac.create=false") if d["kind"] in ("Role", "RoleBinding")
                and d["metadata"]["name"] == ACTIVATOR]


def test_the_activator_reads_services_and_endpointslices_with_its_own_account_and_writes_nothing(helm: str) -> None:
    docs = render(helm, *ON)
    account = only(docs, "ServiceAccount", ACTIVATOR)
    assert account["metadata"]["namespace"] == "rerank-system"
    role = only(docs, "ClusterRole", f"{ACTIVATOR}-reads")
    binding = only(docs, "ClusterRoleBinding", f"{ACTIVATOR}-reads")
    assert role["rules"] == yaml.safe_load(ACTIVATOR_READS.read_text())
    assert (CHART / "files" / "rbac_activator_reads.yaml").resolve() == ACTIVATOR_READS
    assert {(g, r) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]} == {
        ("", "services"), ("discovery.k8s.io", "endpointslices")}
    assert {v for rule in role["rules"] for v in rule["verbs"]} <= {"get", "list"}
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": f"{ACTIVATOR}-reads"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ACTIVATOR, "namespace": "rerank-system"}]
    # Nothing else is bound to the activator's account.
    bound = [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
             for s in d.get("subjects") or () if s.get("name") == ACTIVATOR]
    assert bound == [binding]
    assert not [d for d in render(helm, *ON, "--set", "rbac.create=false") if d["metadata"]["name"].endswith("-reads")]


def test_the_timings_reach_the_activators_flags(helm: str) -> None:
    docs = render(helm, *ON, "--set", "activator.holdSeconds=45", "--set-json", "activator.rememberSeconds=7.5")
    args = container(docs, ACTIVATOR)["args"]
    assert "--hold-seconds=45" in args and "--remember-seconds=7.5" in args
    assert pod(docs, ACTIVATOR)["spec"]["terminationGracePeriodSeconds"] > 45 + 60


def test_lint_with_the_activator(helm: str) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), *ON, "--set", "activator.allowedFrom.namespaces={gw}",
                   check=False)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("bad", [
    "activator.holdSeconds=0", "activator.holdSeconds=51", "activator.replicas=0",
    "activator.allowedFrom.namespaces={Bad_NS}", "activator.keySecret=Not_A_Name", "activator.unknown=1",
    "activator.allowedFrom.pods=1",
])
def test_schema_refuses_bad_activator_values(helm: str, bad: str) -> None:
    out: subprocess.CompletedProcess[str] = run_helm(helm, "template", "rr", str(CHART), *ON, "--set", bad,
                                                     check=False)
    assert out.returncode != 0 and "schema" in out.stderr.lower(), out.stderr
