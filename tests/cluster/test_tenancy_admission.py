"""Tenancy on the real control plane: RerankClass limits enforced by the ValidatingAdmissionPolicy, the aggregated
tenant roles, the NetworkPolicy the operator builds, and the quota messages the operator turns into a condition.

The shipped binding applies to every namespace; here it is narrowed (matchResources.namespaceSelector) to the
namespaces this module labels, so other tests' RerankModels never meet these test classes, and it is removed when
the module ends.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from rerank_devcluster.cluster import Cluster
from rerank_devcluster.waiting import eventually
from rerank_operator.core import tenancy

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "policies" / "rerankmodel-class-policy.yaml"
ROLES_FILE = REPO / "policies" / "aggregate-roles.yaml"
RUN = uuid.uuid4().hex[:6]
TEST_LABEL = "rerank.io/tenancy-test"
DEFAULT_CLASS = f"t-{RUN}-standard"
SECURE_CLASS = f"t-{RUN}-secure"
TENANT = f"tenant-{RUN}"
GROUP, VERSION = "rerank.io", "v1alpha1"

# Limits chosen so that the RerankModel CRD's own defaults (cpu-1.9 image, 4 replicas, 2 CPUs/8Gi) fit.
DEFAULT_CLASS_SPEC: dict[str, Any] = {
    "pools": {"cpu": {"maxReplicas": 4}, "gpu": {"allowed": False}},
    "storage": {"maxSize": "50Gi", "allowedStorageClassNames": ["fast", "standard"]},
    "modelSources": {"hubOrganizations": ["BAAI", "mixedbread-ai"]},
    "quantization": {"minimumQualityGate": {"minSpearman": 0.97, "minTopKAgreement": 0.85}},
    "network": {"routingNamespaces": ["gateway-system"], "routingPodLabels": {"app": "envoy"},
                "allowedNamespaces": ["search"]},
}
SECURE_CLASS_SPEC: dict[str, Any] = {"security": {"requireApiKey": True}}




def apply(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    cluster.apply(docs)


def rrc(name: str, spec: dict[str, Any], default: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if default:
        meta["annotations"] = {tenancy.DEFAULT_CLASS_ANNOTATION: "true"}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": meta, "spec": spec}


def rrm(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankModel", "metadata": {"name": name}, "spec": spec}


def as_user(cluster: Cluster, user: str) -> client.CustomObjectsApi:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    api.set_default_header("Impersonate-User", user)
    return client.CustomObjectsApi(api)


def create(api: client.CustomObjectsApi, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return api.create_namespaced_custom_object(GROUP, VERSION, namespace, "rerankmodels", body)


def refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status in (403, 422), err.value.body
    return str(json.loads(err.value.body)["message"])


@pytest.fixture(scope="module")
def tenancy_policies(cluster: Cluster, crds_installed: list[str]) -> Iterator[dict[str, Any]]:
    """The shipped policy, binding (narrowed to labelled namespaces), roles and two test classes."""
    policy, binding = yaml.safe_load_all(POLICY_FILE.read_text())
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {TEST_LABEL: RUN}}}
    apply(cluster, list(yaml.safe_load_all(ROLES_FILE.read_text())))
    apply(cluster, [rrc(DEFAULT_CLASS, DEFAULT_CLASS_SPEC, default=True), rrc(SECURE_CLASS, SECURE_CLASS_SPEC)])
    apply(cluster, [policy, binding])
    yield policy
    cluster.kubectl_run("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all([policy, binding]),
                        check=False)
    cluster.kubectl_run("delete", "rerankclass", DEFAULT_CLASS, SECURE_CLASS, "--ignore-not-found", check=False)


@pytest.fixture
def tenant_ns(cluster: Cluster, kube: client.ApiClient, namespace: str, tenancy_policies: dict[str, Any]) -> str:
    """A namespace under the policy where TENANT holds the built-in ``edit`` role, with the policy in force."""
    cluster.kubectl_run("label", "namespace", namespace, f"{TEST_LABEL}={RUN}")
    cluster.kubectl_run("create", "rolebinding", "tenant-edit", "--clusterrole=edit", f"--user={TENANT}",
                        "-n", namespace)
    admin = client.CustomObjectsApi(kube)
    probe = rrm("probe", {"model": {"id": "BAAI/bge-reranker-base"}, "pools": {"cpu": {"maxReplicas": 99}}})

    def enforced() -> bool:  # the admission plugin picks new policies and bindings up asynchronously
        try:
            create(admin, namespace, probe)
        except ApiException as err:
            return err.status == 403 and "RerankClass" in err.body
        admin.delete_namespaced_custom_object(GROUP, VERSION, namespace, "rerankmodels", "probe")
        return False

    eventually(enforced, what="the class policy to refuse a model above its limits")
    return namespace


# -- the policy itself ------------------------------------------------------------------------------------------------
def test_policy_type_checks_without_warnings(cluster: Cluster, tenancy_policies: dict[str, Any]) -> None:
    name = tenancy_policies["metadata"]["name"]

    def checked() -> dict[str, Any] | None:
        obj = json.loads(cluster.kubectl_run("get", "validatingadmissionpolicy", name, "-o", "json").stdout)
        status = obj.get("status") or {}
        done = status.get("observedGeneration") == obj["metadata"]["generation"] and "typeChecking" in status
        return status if done else None

    status = eventually(checked, what="the policy's type checking")
    # A warning here means a field the policy reads is missing from crds/rerankmodel.yaml (spec.className,
    # pools.<pool>.resourceProfile) or crds/rerankclass.yaml; see docs/platform-teams.md.
    assert status["typeChecking"].get("expressionWarnings", []) == []


def test_model_within_its_class_is_admitted(cluster: Cluster, tenant_ns: str) -> None:
    api = as_user(cluster, TENANT)
    spec = {"model": {"id": "BAAI/bge-reranker-v2-m3"},
            "pools": {"cpu": {"maxReplicas": 3, "resources": {"requests": {"cpu": "4", "memory": "8Gi"}}}},
            "storage": {"size": "40Gi", "storageClassName": "fast"},
            "quantization": {"qualityGate": {"minSpearman": 0.98, "minTopKAgreement": 0.9}}}
    created = create(api, tenant_ns, rrm("fits", spec))
    assert created["spec"]["pools"]["cpu"]["maxReplicas"] == 3


BEYOND: list[tuple[str, dict[str, Any], str]] = [
    ("too-many-replicas", {"pools": {"cpu": {"maxReplicas": 10}}},
     f"are above the limit of RerankClass {DEFAULT_CLASS}: pools.cpu.maxReplicas is 4"),
    ("disallowed-image", {"pools": {"cpu": {"image": "docker.io/evil/tei:1"}}},
     "pools.cpu.image docker.io/evil/tei:1 is not allowed by RerankClass "
     f"{DEFAULT_CLASS}: pools.cpu.images.allowed is [ghcr.io/huggingface/text-embeddings-inference:cpu-*]"),
    ("too-much-cpu", {"pools": {"cpu": {"resources": {"requests": {"cpu": "16"}}}}},
     f"pools.cpu.resources requests.cpu=16 exceed the limit of RerankClass {DEFAULT_CLASS}: "
     "pools.cpu.maxResources is {"),
    ("gpu-not-allowed", {"pools": {"gpu": {"enabled": True, "resources": {"limits": {"nvidia.com/gpu": 1}}}}},
     f"pools.gpu is enabled but RerankClass {DEFAULT_CLASS} does not allow it (pools.gpu.allowed: false)"),
    ("own-placement", {"pools": {"cpu": {"nodeSelector": {"pool": "gpu"}}}},
     "(pools.cpu.allowTenantPlacement: false)"),
    ("disallowed-org", {"model": {"id": "evil/reranker"}},
     f"model.id evil/reranker is not from a hub organisation RerankClass {DEFAULT_CLASS} allows: "
     "modelSources.hubOrganizations is [BAAI, mixedbread-ai]"),
    ("local-path", {"model": {"path": "uploads/reranker"}, "storage": {"existingClaim": "data"}},
     f"model.path is not allowed by RerankClass {DEFAULT_CLASS} (modelSources.allowLocalPaths: false)"),
    ("storage-too-big", {"storage": {"size": "500Gi"}},
     f"storage.size 500Gi is above the limit of RerankClass {DEFAULT_CLASS}: storage.maxSize is 50Gi"),
    ("storage-class", {"storage": {"storageClassName": "gold"}},
     f"storage.storageClassName gold is not allowed by RerankClass {DEFAULT_CLASS}: "
     "storage.allowedStorageClassNames is [fast, standard]"),
    ("quality-floor", {"quantization": {"qualityGate": {"minSpearman": 0.9}}},
     f"quantization.qualityGate.minSpearman 0.9 is below the floor of RerankClass {DEFAULT_CLASS}: "
     "quantization.minimumQualityGate.minSpearman is 0.97"),
    ("unknown-class", {"className": "no-such-class"},
     f"spec.className no-such-class: {TENANT} may not use RerankClass no-such-class"),
]


@pytest.mark.parametrize(("name", "overrides", "expected"), BEYOND, ids=[b[0] for b in BEYOND])
def test_model_beyond_its_class_is_refused_with_the_limit(cluster: Cluster, tenant_ns: str, name: str,
                                                          overrides: dict[str, Any], expected: str) -> None:
    spec = {"model": {"id": "BAAI/bge-reranker-v2-m3"}, **overrides}
    message = refusal(lambda: create(as_user(cluster, TENANT), tenant_ns, rrm(name, spec)))
    assert expected in message, message
    assert "ValidatingAdmissionPolicy 'rerankmodel-class-limits.rerank.io'" in message


def test_naming_a_class_needs_use_and_then_meets_that_class(cluster: Cluster, tenant_ns: str) -> None:
    api = as_user(cluster, TENANT)
    keyless = rrm("secure", {"className": SECURE_CLASS, "model": {"id": "anyone/reranker"}})
    assert f"may not use RerankClass {SECURE_CLASS}" in refusal(lambda: create(api, tenant_ns, keyless))
    apply(cluster, [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "use-secure", "namespace": tenant_ns},
         "rules": [{"apiGroups": [GROUP], "resources": ["rerankclasses"], "resourceNames": [SECURE_CLASS],
                    "verbs": ["use"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "use-secure", "namespace": tenant_ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "use-secure"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT}]},
    ])
    # Now the secure class applies (not the default one: any hub organisation is fine), and it wants an API key.
    message = eventually(lambda: (m := refusal(lambda: create(api, tenant_ns, keyless))) and "may not use" not in m
                         and m, what="the use grant to take effect")
    assert (f"pools.cpu.tei.apiKeySecretRef is required by RerankClass {SECURE_CLASS} "
            "(security.requireApiKey: true)") in message
    keyed = rrm("secure", {"className": SECURE_CLASS, "model": {"id": "anyone/reranker"},
                           "pools": {"cpu": {"tei": {"apiKeySecretRef": {"name": "tei", "key": "api-key"}}}}})
    assert create(api, tenant_ns, keyed)["spec"]["className"] == SECURE_CLASS


def test_admission_cannot_know_that_a_class_is_missing(kube: client.ApiClient, tenant_ns: str) -> None:
    """A cluster admin bypasses the use check, and no class matches: admitted; the operator reports ClassNotFound."""
    api = client.CustomObjectsApi(kube)
    create(api, tenant_ns, rrm("orphan", {"className": "no-such-class", "model": {"id": "evil/reranker"}}))
    classes = api.list_cluster_custom_object(GROUP, VERSION, "rerankclasses")["items"]
    assert (tenancy.class_not_found("no-such-class", classes)
            == "RerankClass no-such-class (spec.className) does not exist")


def test_tightened_class_blocks_spec_changes_but_not_metadata_or_deletion(cluster: Cluster, kube: client.ApiClient,
                                                                           tenant_ns: str) -> None:
    api = client.CustomObjectsApi(kube)
    tight_class = f"t-{RUN}-tight-{tenant_ns[-4:]}"
    apply(cluster, [rrc(tight_class, {"pools": {"cpu": {"maxReplicas": 4}}})])
    create(api, tenant_ns, rrm("old", {"className": tight_class, "model": {"id": "BAAI/bge-reranker-v2-m3"},
                                       "pools": {"cpu": {"maxReplicas": 4}}}))
    try:
        cluster.kubectl_run("patch", "rerankclass", tight_class, "--type=merge", "-p",
                            json.dumps({"spec": {"pools": {"cpu": {"maxReplicas": 2, "defaultMaxReplicas": 2}}}}))

        def patch(body: dict[str, Any]) -> Any:
            return api.patch_namespaced_custom_object(GROUP, VERSION, tenant_ns, "rerankmodels", "old", body)

        message = eventually(lambda: (m := refusal(lambda: patch({"spec": {"routing": {"policy": "cpu-only"}}}))) and m,
                             what="the tightened class to be enforced")
        assert f"RerankClass {tight_class}: pools.cpu.maxReplicas is 2" in message
        patch({"metadata": {"annotations": {"touched": "yes"}, "finalizers": ["rerank.io/test"]}})  # kopf-like writes
        api.delete_namespaced_custom_object(GROUP, VERSION, tenant_ns, "rerankmodels", "old")
        patch({"metadata": {"finalizers": None}})  # what the operator does last when a model is deleted
        eventually(lambda: "old" not in cluster.kubectl_run("get", "rrm", "-n", tenant_ns, "-o", "name").stdout,
                   what="the model to be gone")
    finally:
        cluster.kubectl_run("delete", "rerankclass", tight_class, "--ignore-not-found", check=False)


# -- the class CRD's own rules ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "expected"), [
    ({"pools": {"cpu": {"images": {"default": "evil/tei:1"}}}}, "images.default must be matched by images.allowed"),
    ({"pools": {"cpu": {"maxReplicas": 2}}}, "defaultMaxReplicas must be less than or equal to maxReplicas"),
    ({"pools": {"cpu": {"maxResources": {"cpu": "1"}}}},
     "every resource profile's requests must be named in maxResources"),
    ({"pools": {"cpu": {"defaultResourceProfile": "huge"}}},
     "defaultResourceProfile must name one of resourceProfiles"),
    ({"storage": {"maxSize": "10Gi"}}, "storage.defaultSize must not be above storage.maxSize"),
    ({"quantization": {"minimumQualityGate": {"minSpearman": 0.999}}},
     "quantization.defaults.qualityGate.minSpearman must not be below minimumQualityGate.minSpearman"),
    ({"pricing": {"currency": "dollars", "cpuReplicaHour": 0.2}}, "spec.pricing.currency"),
    ({"pricing": {"gpuReplicaHour": -2.5}}, "spec.pricing.gpuReplicaHour"),
    ({"pricing": {"cpuReplicaHour": "0.20"}}, "spec.pricing.cpuReplicaHour"),
    ({"pricing": {"cpuReplicaHour": 0.2, "gpuReplicaRequestsPerSecond": 0}},
     "spec.pricing.gpuReplicaRequestsPerSecond"),
])
def test_class_refuses_defaults_outside_its_own_limits(kube: client.ApiClient, crds_installed: list[str],
                                                       spec: dict[str, Any], expected: str) -> None:
    api = client.CustomObjectsApi(kube)
    body = rrc(f"t-{RUN}-bad-{uuid.uuid4().hex[:4]}", spec)
    message = refusal(lambda: api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", body))
    assert expected in message, message


def test_priced_class_is_accepted_with_its_currency_defaulted(kube: client.ApiClient,
                                                             crds_installed: list[str]) -> None:
    api = client.CustomObjectsApi(kube)
    name = f"t-{RUN}-priced"
    pricing = {"gpuReplicaHour": 2.5, "cpuReplicaHour": 0.2, "gpuReplicaRequestsPerSecond": 120}
    created = api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", rrc(name, {"pricing": pricing}))
    try:
        assert created["spec"]["pricing"] == {"currency": "USD", **pricing}
    finally:
        api.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)


def test_empty_class_is_valid_and_defaulted(kube: client.ApiClient, crds_installed: list[str]) -> None:
    api = client.CustomObjectsApi(kube)
    name = f"t-{RUN}-empty"
    created = api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", rrc(name, {}))
    try:
        assert created["spec"]["pools"]["cpu"]["maxReplicas"] == 8
        assert created["spec"]["modelSources"] == {"hubOrganizations": ["*"], "allowLocalPaths": False,
                                                  "allowRemoteCode": False}
    finally:
        api.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)


@pytest.mark.parametrize(("hub", "refused"), [
    ({"endpoint": "https://hf-mirror.internal/hub", "proxy": "http://proxy.internal:3128",
      "noProxy": "10.0.0.0/8,.svc.cluster.local"}, None),
    ({"endpoint": "ftp://mirror.internal"}, "hub.endpoint must be an http(s) URL"),
    ({"endpoint": "https://mirror.internal/"}, "hub.endpoint must be an http(s) URL"),
    ({"endpoint": "https://mirror.internal/?token=x"}, "hub.endpoint must be an http(s) URL"),
    ({"proxy": "http://proxy.internal:3128/path"}, "hub.proxy must be an http(s) URL of a proxy"),
    ({"noProxy": "a b"}, "spec.modelSources.hub.noProxy"),
])
def test_class_hub_access_is_checked_by_the_api_server(kube: client.ApiClient, crds_installed: list[str],
                                                       hub: dict[str, Any], refused: str | None) -> None:
    api = client.CustomObjectsApi(kube)
    name = f"t-{RUN}-hub-{uuid.uuid4().hex[:4]}"
    body = rrc(name, {"modelSources": {"hub": hub, "allowRemoteCode": True}})
    if refused is None:
        created = api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", body)
        api.delete_cluster_custom_object(GROUP, VERSION, "rerankclasses", name)
        assert created["spec"]["modelSources"]["hub"] == hub and created["spec"]["modelSources"]["allowRemoteCode"]
        return
    with pytest.raises(ApiException) as err:
        api.create_cluster_custom_object(GROUP, VERSION, "rerankclasses", body)
    assert err.value.status == 422 and refused in str(err.value.body), err.value.body


# -- RBAC ---------------------------------------------------------------------------------------------------------
def test_edit_role_manages_models_in_its_namespace_and_nothing_cluster_scoped(cluster: Cluster, tenant_ns: str) -> None:
    def can(*args: str) -> bool:
        out = cluster.kubectl_run("auth", "can-i", *args, f"--as={TENANT}", check=False)
        return out.stdout.strip() == "yes"

    eventually(lambda: can("create", "rerankmodels.rerank.io", "-n", tenant_ns), what="aggregation into edit")
    for verb in ("create", "update", "patch", "delete", "get", "list", "watch"):
        assert can(verb, "rerankmodels.rerank.io", "-n", tenant_ns), verb
    assert can("get", "rerankclasses.rerank.io")  # reading the limits is for everyone
    assert not can("update", "rerankmodels.rerank.io", "--subresource=status", "-n", tenant_ns)
    assert not can("create", "rerankmodels.rerank.io", "-n", "default")
    for verb in ("create", "update", "patch", "delete"):
        assert not can(verb, "rerankclasses.rerank.io"), verb
    assert not can("create", "validatingadmissionpolicybindings.admissionregistration.k8s.io")
    assert not can("use", "rerankclasses.rerank.io", "-n", tenant_ns)


def test_view_role_reads_models_only(cluster: Cluster, tenant_ns: str) -> None:
    viewer = f"viewer-{RUN}"
    cluster.kubectl_run("create", "rolebinding", "viewer", "--clusterrole=view", f"--user={viewer}", "-n", tenant_ns)

    def can(*args: str) -> bool:
        return cluster.kubectl_run("auth", "can-i", *args, f"--as={viewer}", check=False).stdout.strip() == "yes"

    eventually(lambda: can("list", "rerankmodels.rerank.io", "-n", tenant_ns), what="aggregation into view")
    assert not can("create", "rerankmodels.rerank.io", "-n", tenant_ns)


# -- NetworkPolicy and quotas ---------------------------------------------------------------------------------------
def test_built_network_policy_is_accepted(kube: client.ApiClient, tenant_ns: str) -> None:
    api = client.CustomObjectsApi(kube)
    model = create(api, tenant_ns, rrm("netpol", {"model": {"id": "BAAI/bge-reranker-v2-m3"}}))
    rclass = api.get_cluster_custom_object(GROUP, VERSION, "rerankclasses", DEFAULT_CLASS)
    body = tenancy.build_network_policy(model, rclass, operator_namespace="rerank-system",
                                        operator_pod_labels={"app.kubernetes.io/name": "rerank-operator"})
    assert body is not None
    created = client.NetworkingV1Api(kube).create_namespaced_network_policy(tenant_ns, body)
    assert created.metadata.owner_references[0].uid == model["metadata"]["uid"]
    assert len(created.spec.ingress[0]._from) == 4


def test_quota_blocks_are_detected_from_real_objects(kube: client.ApiClient, namespace: str) -> None:
    core, apps, batch = client.CoreV1Api(kube), client.AppsV1Api(kube), client.BatchV1Api(kube)
    core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "tight"}, "spec": {"hard": {"pods": "0", "requests.storage": "1Gi"}}})
    eventually(lambda: (core.read_namespaced_resource_quota("tight", namespace).status.hard or {}).get("pods") == "0",
               what="the quota to be observed")
    labels = {"app": "tei"}
    container = {"name": "tei", "image": "tei:1"}
    apps.create_namespaced_deployment(namespace, {
        "metadata": {"name": "m-cpu"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}})
    batch.create_namespaced_job(namespace, {
        "metadata": {"name": "m-q-1"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}})
    with pytest.raises(ApiException) as err:
        core.create_namespaced_persistent_volume_claim(namespace, {
            "metadata": {"name": "m-models"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "20Gi"}}}})
    pvc_error = json.loads(err.value.body)["message"]

    def blocked_rs() -> tenancy.QuotaBlock | None:
        rss = apps.list_namespaced_replica_set(namespace).items
        return tenancy.quota_blocked(replica_sets=[kube.sanitize_for_serialization(r) for r in rss])

    found = eventually(blocked_rs, what="the ReplicaSet's quota failure")
    assert found.reason == "QuotaExceeded" and "exceeded quota: tight" in found.message, found

    def blocked_job() -> tenancy.QuotaBlock | None:
        jobs = [kube.sanitize_for_serialization(batch.read_namespaced_job("m-q-1", namespace))]
        events = [kube.sanitize_for_serialization(e) for e in core.list_namespaced_event(namespace).items]
        return tenancy.quota_blocked(jobs=jobs, events=events)

    found = eventually(blocked_job, what="the Job's FailedCreate event")
    assert found.blocked == "Job/m-q-1" and "exceeded quota: tight" in found.message, found
    found = tenancy.quota_blocked(api_errors={"PersistentVolumeClaim/m-models": pvc_error})
    assert found is not None and found.message.startswith(
        "PersistentVolumeClaim/m-models: exceeded quota: tight"), found
