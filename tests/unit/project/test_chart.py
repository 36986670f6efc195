"""charts/rerank-operator: lint, and what `helm template` renders (no cluster needed).

The chart takes its CRDs from crds/ (charts/rerank-operator/crds is a symlink) and its RBAC rules from
operator/rerank_operator/rbac_rules.yaml (charts/rerank-operator/files/rbac_rules.yaml is a symlink): these tests
check that helm follows both links when rendering and when packaging, so neither is ever a hand copy.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_devcluster import binaries
from rerank_operator.core.builders import deployment, sampler

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART = REPO_ROOT / "charts" / "rerank-operator"
RBAC_RULES = REPO_ROOT / "operator" / "rerank_operator" / "rbac_rules.yaml"
LEADER_RULES = REPO_ROOT / "operator" / "rerank_operator" / "rbac_leader_election.yaml"
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
Doc = dict[str, Any]


@pytest.fixture(scope="module")
def helm() -> str:
    return str(binaries.ensure("helm"))


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=check)


def render(helm: str, *args: str) -> list[Doc]:
    out = run_helm(helm, "template", "rr", str(CHART), "--namespace", "rerank-system", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


OPERATOR_NAME = "rr-rerank-operator"  # the release's full name: the operator's own objects
LEADER_ROLE = f"{OPERATOR_NAME}-leader-election"  # the Role (and binding) for the leader-election Lease


def only(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, f"{kind}: {len(found)}"
    return found[0]


def crd_docs() -> list[Doc]:
    return [d for f in sorted((REPO_ROOT / "crds").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def rbac_rules() -> list[Doc]:
    return yaml.safe_load(RBAC_RULES.read_text())


# -- single sources ----------------------------------------------------------------------------------------------

def test_chart_links_to_the_single_sources() -> None:
    assert (CHART / "crds").is_symlink() and (CHART / "crds").resolve() == REPO_ROOT / "crds"
    link = CHART / "files" / "rbac_rules.yaml"
    assert link.is_symlink() and link.resolve() == RBAC_RULES
    link = CHART / "files" / "rbac_leader_election.yaml"
    assert link.is_symlink() and link.resolve() == LEADER_RULES


def test_lint(helm: str) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART), check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    out = run_helm(helm, "lint", "--strict", str(CHART), "--set", "watchNamespaces={a,b}", check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rendered_crds_equal_crds_dir(helm: str) -> None:
    rendered = [d for d in render(helm, "--include-crds") if d["kind"] == "CustomResourceDefinition"]
    assert rendered == crd_docs()


def test_packaged_chart_carries_the_crds_and_rules(helm: str, tmp_path: Path) -> None:
    run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    (pkg,) = tmp_path.glob("rerank-operator-*.tgz")
    with tarfile.open(pkg) as tar:
        members = {m.name: m for m in tar.getmembers()}
        crds = sorted(n for n in members if n.startswith("rerank-operator/crds/"))
        assert crds, "helm package must follow the crds symlink"
        assert all(members[n].isfile() for n in crds)
        packaged = [d for n in crds for d in yaml.safe_load_all(tar.extractfile(n).read()) if d]  # type: ignore[union-attr]
        assert packaged == crd_docs()
        rules = tar.extractfile("rerank-operator/files/rbac_rules.yaml")
        assert rules is not None and yaml.safe_load(rules.read()) == rbac_rules()
        rules = tar.extractfile("rerank-operator/files/rbac_leader_election.yaml")
        assert rules is not None and yaml.safe_load(rules.read()) == yaml.safe_load(LEADER_RULES.read_text())
        for policy in (REPO_ROOT / "policies").glob("*.yaml"):
            packaged_policy = tar.extractfile(f"rerank-operator/files/policies/{policy.name}")
            assert packaged_policy is not None and packaged_policy.read() == policy.read_bytes()
    # And the packaged chart renders the same RBAC as the source tree.
    rendered = [d for d in yaml.safe_load_all(run_helm(helm, "template", "rr", str(pkg)).stdout) if d]
    assert only(rendered, "ClusterRole", OPERATOR_NAME)["rules"] == rbac_rules()


# -- RBAC ----------------------------------------------------------------------------------------------------------

def test_cluster_wide_rbac_equals_the_rules_file(helm: str) -> None:
    docs = render(helm)
    role, binding = only(docs, "ClusterRole", OPERATOR_NAME), only(docs, "ClusterRoleBinding", OPERATOR_NAME)
    sa = only(docs, "ServiceAccount")
    assert role["rules"] == rbac_rules()
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"],
                                    "namespace": "rerank-system"}]
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] != LEADER_ROLE]
    assert "--all-namespaces" in container(docs)["args"]


# Cluster-scoped resources a rules file might name (a Role cannot grant them).
CLUSTER_SCOPED = {"customresourcedefinitions", "namespaces", "nodes", "persistentvolumes", "storageclasses",
                  "clusterroles", "clusterrolebindings", "gatewayclasses"} | {
    c["spec"]["names"]["plural"] for c in crd_docs() if c["spec"]["scope"] == "Cluster"}


def is_cluster_scoped(rule: Doc) -> bool:
    return all(r.split("/")[0] in CLUSTER_SCOPED for r in rule["resources"])


def test_namespaced_mode_renders_a_role_per_namespace(helm: str) -> None:
    docs = render(helm, "--set", "watchNamespaces={team-a,team-b}")
    roles = {d["metadata"]["namespace"]: d for d in docs
             if d["kind"] == "Role" and d["metadata"]["name"] != LEADER_ROLE}
    bindings = {d["metadata"]["namespace"]: d for d in docs
                if d["kind"] == "RoleBinding" and d["metadata"]["name"] != LEADER_ROLE}
    assert set(roles) == set(bindings) == {"team-a", "team-b"}
    namespaced = [r for r in rbac_rules() if not is_cluster_scoped(r)]
    cluster_wide = [r for r in rbac_rules() if is_cluster_scoped(r)]
    for ns, role in roles.items():
        assert role["rules"] == namespaced
        assert bindings[ns]["roleRef"]["kind"] == "Role"
        assert bindings[ns]["roleRef"]["name"] == role["metadata"]["name"]
        assert bindings[ns]["subjects"][0]["namespace"] == "rerank-system"
    # Only the cluster-scoped rules (kopf's discovery) are granted cluster-wide.
    cluster_roles = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == OPERATOR_NAME]
    if cluster_wide:
        assert [c["rules"] for c in cluster_roles] == [cluster_wide]
        assert only(docs, "ClusterRoleBinding", OPERATOR_NAME)["roleRef"]["name"] == OPERATOR_NAME
    else:
        assert not cluster_roles
    args = container(docs)["args"]
    assert "--all-namespaces" not in args
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_a_rule_mixing_scopes_is_refused(helm: str, tmp_path: Path) -> None:
    chart = tmp_path / "chart"
    subprocess.run(["cp", "-rL", str(CHART), str(chart)], check=True)
    (chart / "files" / "rbac_rules.yaml").write_text(
        "- apiGroups: ['']\n  resources: [pods, nodes]\n  verbs: [get]\n")
    out = run_helm(helm, "template", "rr", str(chart), "--set", "watchNamespaces={a}", check=False)
    assert out.returncode != 0 and "mixes cluster-scoped and namespaced" in out.stderr


def policy_docs(name: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all((REPO_ROOT / "policies" / name).read_text()) if d]


def test_tenant_roles_and_admission_policy_come_from_policies_dir(helm: str) -> None:
    assert (CHART / "files" / "policies").resolve() == REPO_ROOT / "policies"
    default = render(helm)
    tenant = policy_docs("aggregate-roles.yaml")
    def key(d: Doc) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    rendered_tenant = [d for d in default if d["metadata"]["name"] not in (OPERATOR_NAME, LEADER_ROLE)
                       and "rbac" in d["apiVersion"]]
    assert sorted(rendered_tenant, key=key) == sorted(tenant, key=key)
    assert not [d for d in default if d["kind"].startswith("ValidatingAdmissionPolicy")]
    assert not [d for d in default if d["kind"] == "RerankClass"]
    on = render(helm, "--set", "admissionPolicy.enabled=true", "--set", "tenantRoles.enabled=false")
    assert sorted((d for d in on if d["apiVersion"].startswith("admissionregistration")), key=key) == \
        sorted(policy_docs("rerankmodel-class-policy.yaml"), key=key)
    assert sorted(d["metadata"]["name"] for d in on if "rbac" in d["apiVersion"]) == [
        OPERATOR_NAME, OPERATOR_NAME, LEADER_ROLE, LEADER_ROLE]


def test_default_class(helm: str) -> None:
    docs = render(helm, "--set", "defaultClass.create=true", "--set", "defaultClass.spec.pools.gpu.allowed=false")
    rc = only(docs, "RerankClass")
    assert rc["apiVersion"] == "rerank.io/v1alpha1" and rc["metadata"]["name"] == "default"
    assert rc["metadata"]["annotations"]["rerank.io/is-default-class"] == "true"
    assert rc["spec"] == {"pools": {"gpu": {"allowed": False}}}


def test_rbac_rules_are_least_privilege() -> None:
    for rule in rbac_rules():
        assert "*" not in rule.get("verbs", []) and "*" not in rule.get("resources", []), rule
        assert "*" not in rule.get("apiGroups", []), rule
        assert not rule.get("nonResourceURLs"), rule
        if "secrets" in rule.get("resources", []):
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, "the operator only reads Secrets"


# -- the operator Deployment ---------------------------------------------------------------------------------------

def container(docs: list[Doc]) -> Doc:
    (c,) = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def test_deployment_is_locked_down(helm: str) -> None:
    docs = render(helm)
    dep = only(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 65532
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    c = container(docs)
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True and sc.get("privileged") is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"]
    assert c["resources"]["limits"]["memory"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/tmp" in mounts, "a writable /tmp next to the read-only root filesystem"
    assert pod["serviceAccountName"] == only(docs, "ServiceAccount")["metadata"]["name"]


def test_deployment_ports_probes_args_and_image(helm: str) -> None:
    c = container(render(helm))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--health-port=8080" in c["args"] and "--metrics-port=9090" in c["args"]
    assert "--log-format=json" in c["args"]
    assert c["image"] == f"ghcr.io/rerank-operator/rerank-operator:{CHART_META['appVersion']}"
    digest = "sha256:" + "a" * 64
    c = container(render(helm, "--set", f"image.digest={digest}"))
    assert c["image"] == f"ghcr.io/rerank-operator/rerank-operator@{digest}"


# -- high availability: replicas, leader election, disruption budget, spreading ----------------------------------

def leader_rules() -> list[Doc]:
    return yaml.safe_load(LEADER_RULES.read_text())


def test_default_is_two_replicas_electing_a_leader(helm: str) -> None:
    docs = render(helm)
    dep = only(docs, "Deployment")
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    args = container(docs)["args"]
    assert args[args.index("--leader-election"):][:5] == [
        "--leader-election", f"--leader-election-id={OPERATOR_NAME}", "--leader-election-lease-seconds=10",
        "--leader-election-renew-seconds=7", "--leader-election-retry-seconds=2"]
    env = {e["name"]: e for e in container(docs)["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    from rerank_operator import main

    parsed = main.parse_args([a for a in args if a.startswith("--leader")])
    election = main.settings_from(parsed, {"POD_NAMESPACE": "rerank-system"}).leader_election
    assert (election.enabled, election.namespace, election.name) == (True, "rerank-system", OPERATOR_NAME)


def test_the_lease_role_is_exactly_the_rules_file_in_the_release_namespace(helm: str) -> None:
    for sets in ([], ["--set", "watchNamespaces={team-a}"]):
        docs = render(helm, *sets)
        role, binding = only(docs, "Role", LEADER_ROLE), only(docs, "RoleBinding", LEADER_ROLE)
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "rerank-system"
        assert role["rules"] == leader_rules() == [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEADER_ROLE}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": only(docs, "ServiceAccount")["metadata"][
            "name"], "namespace": "rerank-system"}]


def test_pdb_and_anti_affinity_keep_a_standby(helm: str) -> None:
    docs = render(helm)
    pdb = only(docs, "PodDisruptionBudget")
    pod = only(docs, "Deployment")["spec"]["template"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == pdb["spec"]["selector"]["matchLabels"]
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    docs = render(helm, "--set-json", f"affinity={json.dumps(own)}")  # the chart's values replace the spreading
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["affinity"] == own


def test_one_replica_has_no_pdb_and_no_spreading(helm: str) -> None:
    docs = render(helm, "--set", "replicaCount=1")
    assert only(docs, "Deployment")["spec"]["replicas"] == 1
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert "affinity" not in only(docs, "Deployment")["spec"]["template"]["spec"]
    assert "--leader-election" in container(docs)["args"]  # still elected: a rollout overlaps two pods


def test_without_leader_election_one_replica_and_no_lease_role(helm: str) -> None:
    docs = render(helm, "--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    dep = only(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in container(docs)["args"] if a.startswith("--leader-election")]
    assert not [d for d in docs if d["metadata"]["name"] == LEADER_ROLE]
    assert not [d for d in docs if d["kind"] == "PodDisruptionBudget"]


@pytest.mark.parametrize(("sets", "message"), [
    (["leaderElection.enabled=false"], "replicaCount > 1 needs leaderElection.enabled"),
    (["leaderElection.renewDeadlineSeconds=10"], "renewDeadlineSeconds must be shorter"),
    (["leaderElection.retryPeriodSeconds=7"], "retryPeriodSeconds must be shorter"),
])
def test_inconsistent_election_values_are_refused(helm: str, sets: list[str], message: str) -> None:
    out = run_helm(helm, "template", "rr", str(CHART), *[a for s in sets for a in ("--set", s)], check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_metrics_service_selects_the_operator(helm: str) -> None:
    docs = render(helm)
    svc = only(docs, "Service")
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]


# -- monitoring ----------------------------------------------------------------------------------------------------

def test_monitors_are_optional(helm: str) -> None:
    kinds = {d["kind"] for d in render(helm)}
    assert not kinds & {"ServiceMonitor", "PodMonitor"}
    docs = render(helm, "--set", "metrics.serviceMonitor.enabled=true", "--set", "teiPodMonitor.enabled=true",
                  "--set", "metrics.serviceMonitor.labels.release=prom")
    sm, pm = only(docs, "ServiceMonitor"), only(docs, "PodMonitor")
    svc = only(docs, "Service")
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert pm["spec"]["namespaceSelector"] == {"any": True}
    # TEI's te_* through the pod's serving port, and the pods' front's own (the rerank API's usage)
    assert [e["port"] for e in pm["spec"]["podMetricsEndpoints"]] == ["http", sampler.container(
        sampler.Sidecar("img", ("m",)))["ports"][1]["name"]]
    docs = render(helm, "--set", "teiPodMonitor.enabled=true", "--set", "watchNamespaces={team-a}")
    assert only(docs, "PodMonitor")["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


def test_tei_podmonitor_matches_the_operators_pod_labels(helm: str) -> None:
    from rerank_operator.core import names

    pm = only(render(helm, "--set", "teiPodMonitor.enabled=true"), "PodMonitor")
    sel = pm["spec"]["selector"]
    assert sel["matchLabels"] == {names.LABEL_NAME: names.APP_NAME}
    assert sel["matchExpressions"] == [{"key": names.LABEL_POOL, "operator": "In", "values": list(names.POOLS)}]

    def meta(label: str) -> str:
        return "__meta_kubernetes_pod_label_" + "".join(ch if ch.isalnum() else "_" for ch in label)

    # The pool pods' serving port, by the name the operator's pool Deployment gives it (TEI's, or the sampler's in
    # front of TEI, which passes /metrics through).
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == deployment.SERVING_PORT
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in pm["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert relabel == {"pool": [meta(names.LABEL_POOL)], "rerankmodel": [meta(names.LABEL_INSTANCE)]}


# -- values --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    "logFormat=xml", "watchNamespaces={Not_A_Namespace}", "image.pullPolicy=Sometimes", "unknownKey=1",
    "metrics.port=0", "image.digest=latest", "replicaCount=0", "leaderElection.leaseDurationSeconds=0",
    "leaderElection.unknown=1",
])
def test_schema_refuses_bad_values(helm: str, bad: str) -> None:
    out = run_helm(helm, "template", "rr", str(CHART), "--set", bad, check=False)
    assert out.returncode != 0 and "schema" in out.stderr.lower(), out.stderr


def test_argocd_example_values_are_valid(helm: str, tmp_path: Path) -> None:
    app = next(d for d in yaml.safe_load_all((REPO_ROOT / "examples" / "argocd-application.yaml").read_text())
               if d and d["spec"]["source"]["path"] == "charts/rerank-operator")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(app["spec"]["source"]["helm"]["valuesObject"]))
    assert only(render(helm, "-f", str(values)), "Deployment")


def test_the_platforms_prometheus_reaches_the_operator(helm: str) -> None:
    """The one place a Prometheus server is chosen for models without a class server (never a RerankModel)."""
    def operator_args(*sets: str) -> list[str]:
        [dep] = [d for d in render(helm, *sets) if d["kind"] == "Deployment"]
        return list(dep["spec"]["template"]["spec"]["containers"][0]["args"])

    assert not [a for a in operator_args() if a.startswith("--prometheus")]
    args = operator_args("--set", "prometheus.url=http://prometheus.monitoring:9090",
                         "--set-string", "prometheus.gpuMemoryUsedQuery=sum(used$selector)")
    assert "--prometheus-url=http://prometheus.monitoring:9090" in args
    assert "--prometheus-gpu-memory-used-query=sum(used$selector)" in args
    refused = run_helm(helm, "template", "rr", str(CHART), "--set", "prometheus.url=file:///etc/passwd", check=False)
    assert refused.returncode != 0 and "prometheus" in refused.stderr


def test_the_workloads_values_become_the_operators_flags(helm: str) -> None:
    image = "registry.example.com/rq@sha256:" + "0" * 64
    args = container(render(helm, "--set", f"workloads.quantizerImage={image}",
                            "--set", "workloads.imagePullSecrets[0].name=regcred",
                            "--set", "workloads.imagePullSecrets[1].name=mirror"))["args"]
    assert f"--quantizer-image={image}" in args
    assert [a for a in args if a.startswith("--image-pull-secret")] == ["--image-pull-secret=regcred",
                                                                         "--image-pull-secret=mirror"]
    plain = container(render(helm))["args"]
    assert not [a for a in plain if a.startswith(("--quantizer-image", "--image-pull-secret"))]
    refused = run_helm(helm, "template", "rr", str(CHART), "--set", "workloads.imagePullSecrets[0].name=Reg_Cred",
                       check=False)
    assert refused.returncode != 0 and "imagePullSecrets" in refused.stderr
