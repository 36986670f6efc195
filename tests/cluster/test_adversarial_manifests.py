"""A hostile or careless tenant against the real control plane: invalid RerankModels are refused at apply time with a
message naming the field and the offending value, valid ones are admitted, with and without the class policy.

Each case starts from a valid model and breaks one thing, the way a tenant would (TEI flags that smuggle in a port or
a token, revisions that read as flags or paths, quantities Kubernetes refuses when the pod is written, a Prometheus
URL the privileged operator would call). The table names, per case, the fragment its refusal must carry and the layer
that refuses it: ``crd`` (schema + CEL in crds/rerankmodel.yaml; refused with or without the policy) or ``policy``
(policies/rerankmodel-class-policy.yaml with the chart's default class, ``spec: {}``, and a class that allows only
the direct metrics source). Manifests go in as ``kubectl apply`` sends them: server-side dry run with strict field
validation (an unknown field is refused instead of silently dropped).

Defence in depth: for ``crd`` cases the operator's own parser (``spec.parse``) must refuse the spec too, unless the
case says ``parse=False`` (shapes only Kubernetes cares about, e.g. a toleration's value with operator Exists; and
a Prometheus URL in a stored model, which the operator never reads: tests/unit/autoscale); for
``policy`` cases the operator's ``tenancy.violations`` must report it. Every refusal is also checked for what makes
a message useless: a raw regex, ``Invalid value: "string"``/``"object"`` instead of the value, a ``<nil>`` path.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rerank_devcluster.cluster import Cluster
from rerank_devcluster.waiting import eventually
from rerank_operator.core import tenancy
from rerank_operator.core.spec import model as specs
from rerank_operator.core.spec import parse as spec_parse

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO / "policies" / "rerankmodel-class-policy.yaml"
RUN = uuid.uuid4().hex[:6]
LABEL = "rerank.io/adversarial-test"
DEFAULT_CLASS = f"adv-{RUN}-default"
DIRECT_ONLY = f"adv-{RUN}-direct-only"
GROUP, VERSION, PLURAL = "rerank.io", "v1alpha1", "rerankmodels"

GPU = {"limits": {"nvidia.com/gpu": 1}}
BASE: dict[str, Any] = {
    "apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankModel", "metadata": {"name": "adv"},
    "spec": {
        "model": {"id": "BAAI/bge-reranker-v2-m3", "revision": "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e",
                  "tokenSecretRef": {"name": "hf", "key": "token"}},
        "pools": {"cpu": {"minReplicas": 1, "maxReplicas": 4},
                  "gpu": {"minReplicas": 1, "maxReplicas": 2, "resources": GPU}},
    },
}


def at(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set ``spec.<path>`` (dots; list indexes as numbers)."""
    def mod(body: dict[str, Any]) -> None:
        node: Any = body["spec"]
        *parents, leaf = path.split(".")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        node[leaf] = copy.deepcopy(value)
    return mod


def both(*mods: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def mod(body: dict[str, Any]) -> None:
        for m in mods:
            m(body)
    return mod


def args(pool: str, *values: str) -> Callable[[dict[str, Any]], None]:
    return at(f"pools.{pool}.tei.extraArgs", list(values))


def cpu_resources(**sections: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return at("pools.cpu.resources", sections)


def affinity(value: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return at("pools.cpu.affinity", value)


def term(**requirement: Any) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [requirement]}]}}}


@dataclass(frozen=True)
class Case:
    name: str
    mod: Callable[[dict[str, Any]], None]
    expected: str  # a fragment of the refusal; names the field or the offending value
    layer: str = "crd"  # "crd": refused by the CRD alone; "policy": only with the class policy
    parse: bool = True  # crd cases: the operator's spec.parse refuses it too
    class_name: str | None = None  # policy cases judged against another class than the default one


FLAGS_ALLOWED = "--tokenization-workers, --max-batch-requests, --payload-limit"

INVALID: list[Case] = [
    # -- 1. SSRF: a model never names a server the operator calls ---------------------------------------------------
    Case("prometheus url: cloud metadata", at("autoscaling.metrics", {
        "source": "prometheus", "prometheus": {"url": "http://169.254.169.254/latest/meta-data"}}),
        "autoscaling.metrics.prometheus is not accepted", parse=False),
    Case("prometheus url: in-cluster service", at("autoscaling.metrics.prometheus", {
        "url": "http://kubernetes.default.svc:443"}), "autoscaling.metrics.prometheus is not accepted", parse=False),
    Case("prometheus queries only", at("autoscaling.metrics.prometheus", {"gpuMemoryUsedQuery": "up"}),
         "autoscaling.metrics.prometheus is not accepted", parse=False),
    # -- 2. TEI flags: an allow-list, each value checked, the flag named --------------------------------------------
    Case("short port flag", args("cpu", "-p=8081"), "flag -p is not allowed in tei.extraArgs"),
    Case("short flag with separate value", args("cpu", "-p", "8081"), "flag 8081 is not allowed"),
    Case("deprecated token alias", args("cpu", "--hf-api-token=hf_abcdef"), "flag --hf-api-token is not allowed"),
    Case("token on the command line", args("gpu", "--hf-token=hf_abcdef"), "flag --hf-token is not allowed"),
    Case("api key on the command line", args("cpu", "--api-key=s3cret"), "flag --api-key is not allowed"),
    Case("port", args("cpu", "--port=9000"), "flag --port is not allowed"),
    Case("hostname", args("cpu", "--hostname=0.0.0.0"), "flag --hostname is not allowed"),
    Case("model id", args("cpu", "--model-id", "/etc"), "flag --model-id is not allowed"),
    Case("dtype on the gpu pool", args("gpu", "--dtype=float32"), "flag --dtype is not allowed"),
    Case("telemetry endpoint", args("cpu", "--otlp-endpoint=http://10.0.0.1:4317"),
         "flag --otlp-endpoint is not allowed"),
    Case("hub cache path", args("cpu", "--huggingface-hub-cache=/models"),
         "flag --huggingface-hub-cache is not allowed"),
    Case("auto-truncate twice", args("cpu", "--auto-truncate"), "flag --auto-truncate is not allowed"),
    Case("workers zero", args("cpu", "--tokenization-workers=0"), "--tokenization-workers=0 has an invalid value"),
    Case("workers as two arguments", args("cpu", "--tokenization-workers", "4"),
         "--tokenization-workers has an invalid value"),
    Case("negative payload limit", args("cpu", "--payload-limit=-5"), "--payload-limit=-5 has an invalid value"),
    Case("served name that is a flag", args("cpu", "--served-model-name=--port"),
         "--served-model-name=--port has an invalid value"),
    Case("switch with a value", args("cpu", "--disable-spans=false"), "--disable-spans=false has an invalid value"),
    Case("flag given twice", args("cpu", "--max-batch-requests=8", "--max-batch-requests=9"),
         "must not give a flag more than once"),
    # -- 3. strings that reach a command line or a path ------------------------------------------------------------
    Case("revision --help", at("model.revision", "--help"), "model.revision --help must start with a letter or digit"),
    Case("revision -rf", at("model.revision", "-rf"), "model.revision -rf must start with a letter or digit"),
    Case("revision with ..", at("model.revision", "main/../../etc"),
         "model.revision main/../../etc must not contain '..'"),
    Case("revision with //", at("model.revision", "refs//pr/2"), "model.revision refs//pr/2 must not contain"),
    Case("revision ending in /", at("model.revision", "v1/"),
         "model.revision v1/ must not contain '..' or '//' nor end"),
    Case("revision with a space", at("model.revision", "main branch"), "model.revision main branch must start"),
    Case("hub id with ..", at("model.id", "org/../secret"), "model.id org/../secret must not contain '..' or '--'"),
    Case("hub id with --", at("model.id", "org/na--me"), "model.id org/na--me must not contain '..' or '--'"),
    Case("hub id starting with -", at("model.id", "-org/name"), "model.id -org/name is not a hub repository id"),
    Case("hub id with three parts", at("model.id", "a/b/c"), "model.id a/b/c is not a hub repository id"),
    Case("hub id ending with .", at("model.id", "org/name."), "model.id org/name. is not a hub repository id"),
    Case("path with empty segment", both(at("model", {"path": "a//b"}), at("storage", {"existingClaim": "data"})),
         "model.path a//b must be a path relative to the volume's root"),
    Case("evaluation data escaping the volume", both(
        at("quantization.evaluationData", {"path": "../../etc/shadow"}), at("storage", {"existingClaim": "data"})),
        "data path ../../etc/shadow must not contain '.' or '..' segments"),
    Case("operator type that is a flag", at("quantization.operators", ["--evil"]),
         "quantization.operators entry --evil is not an ONNX operator type"),
    Case("class name with underscore", at("className", "Bad_Class"), "className Bad_Class is not a RerankClass name",
         parse=False),
    Case("hostname with capitals", at("routing.gateway", {"parentRefs": [{"name": "edge"}],
                                                          "hostnames": ["Rerank.Example.COM"]}),
         "hostnames entry Rerank.Example.COM is not a host name", parse=False),
    Case("cpu image with a space", at("pools.cpu.image", "tei:cpu 1.9"),
         "pools.cpu.image tei:cpu 1.9 is not an image reference"),
    Case("quantizer image that is a flag", at("quantization.image", "--privileged"),
         "quantization.image --privileged is not an image reference"),
    # -- 4. values Kubernetes refuses later, when the operator writes the children --------------------------------
    Case("negative memory request", cpu_resources(requests={"memory": "-1Gi"}),
         "resources.requests[memory]: Forbidden: -1Gi is negative"),
    Case("negative gpu pool cpu limit", at("pools.gpu.resources", {"limits": {"nvidia.com/gpu": 1, "cpu": "-500m"}}),
         "-500m is negative"),
    Case("negative quantizer cpu", at("quantization.resources", {"requests": {"cpu": "-1"}}),
         "quantization.resources.requests[cpu]: Forbidden: -1 is negative"),
    Case("request above limit", cpu_resources(requests={"memory": "16Gi"}, limits={"memory": "8Gi"}),
         "pools.cpu.resources.requests: Forbidden: a request must not be above its limit"),
    Case("quantizer request above limit",
         at("quantization.resources", {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}),
         "quantization.resources.requests: Forbidden: a request must not be above its limit"),
    Case("gpu requested without limit", cpu_resources(requests={"nvidia.com/gpu": 1}), "cannot be overcommitted"),
    Case("gpu request unlike its limit", at("pools.gpu.resources", {"requests": {"nvidia.com/gpu": 2},
                                                                    "limits": {"nvidia.com/gpu": 1}}),
         "cannot be overcommitted"),
    Case("unqualified resource name", cpu_resources(limits={"gpus": 1}), "names a resource a container cannot request"),
    Case("quantity that is not one", cpu_resources(requests={"cpu": "lots"}), "lots is not a Kubernetes quantity"),
    Case("storage size zero", at("storage.size", "0"), "storage.size 0 must be a positive quantity"),
    Case("storage size 0Gi", at("storage.size", "0Gi"), "storage.size 0Gi must be a positive quantity"),
    Case("storage size negative", at("storage.size", "-5Gi"), "storage.size -5Gi must be a positive quantity"),
    Case("ReadWriteOncePod with others", at("storage.accessModes", ["ReadWriteOncePod", "ReadWriteMany"]),
         "ReadWriteOncePod cannot be combined with other access modes"),
    Case("parentRef namespace not a label", at("routing.gateway", {"parentRefs": [{"name": "edge",
                                                                                   "namespace": "Gateway_NS"}]}),
         "parentRef namespace Gateway_NS is not a namespace name"),
    Case("parentRef namespace with a dot", at("routing.gateway", {"parentRefs": [{"name": "edge",
                                                                                  "namespace": "gw.system"}]}),
         "parentRef namespace gw.system is not a namespace name"),
    Case("parentRef name with a space", at("routing.gateway", {"parentRefs": [{"name": "edge gw"}]}),
         "parentRef name edge gw is not an object name"),
    Case("parentRef kind with a space", at("routing.gateway", {"parentRefs": [{"name": "edge", "kind": "Gate way"}]}),
         "parentRef kind Gate way is not a kind", parse=False),
    Case("time budget beyond the deadline", at("quantization.timeBudgetSeconds", 4000),
         "quantization.timeBudgetSeconds: Forbidden: quantization.timeBudgetSeconds must be below"),
    Case("time budget equal to the deadline", at("quantization", {"timeBudgetSeconds": 900,
                                                                  "activeDeadlineSeconds": 900}),
         "timeBudgetSeconds must be below quantization.activeDeadlineSeconds"),
    Case("arbitrary affinity content", affinity({"nodeAffinity": {"evil": True}}),
         'unknown field "spec.pools.cpu.affinity.nodeAffinity.evil"', parse=False),
    Case("arbitrary affinity kind", affinity({"hostAffinity": {}}),
         'unknown field "spec.pools.cpu.affinity.hostAffinity"', parse=False),
    Case("affinity In without values", affinity(term(key="zone", operator="In")),
         "operators In and NotIn need at least one value", parse=False),
    Case("affinity Gt with text", affinity(term(key="cores", operator="Gt", values=["many"])),
         "operators Gt and Lt take exactly one integer value", parse=False),
    Case("affinity key that is not a label key", affinity(term(key="bad key!", operator="Exists")),
         "key bad key! is not a label key", parse=False),
    Case("anti-affinity without topology key", affinity({"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "x"}}}]}}),
        "topologyKey: Required value: topologyKey is required", parse=False),
    Case("affinity weight zero", affinity({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}}]}}),
        "weight: Invalid value: 0", parse=False),
    Case("token Secret name with underscore", at("model.tokenSecretRef", {"name": "hf_token", "key": "token"}),
         "Secret name hf_token is not a valid Secret name"),
    Case("api key Secret name with capitals", at("pools.cpu.tei", {"apiKeySecretRef": {"name": "TEI", "key": "k"}}),
         "Secret name TEI is not a valid Secret name"),
    Case("Secret key with a slash", at("model.tokenSecretRef", {"name": "hf", "key": "a/b"}),
         "Secret key a/b is not a valid key"),
    Case("ConfigMap name with ..", at("quantization.evaluationData", {"configMapRef": {"name": "cm..x", "key": "k"}}),
         "ConfigMap name cm..x is not a valid ConfigMap name"),
    Case("claim name with capitals", at("storage", {"existingClaim": "Models_1"}),
         "storage.existingClaim Models_1 is not a PersistentVolumeClaim name"),
    Case("storage class with a space", at("storage.storageClassName", "fast ssd"),
         "storage.storageClassName fast ssd is not a StorageClass name"),
    Case("nodeSelector key with a space", at("pools.cpu.nodeSelector", {"pool type": "cpu"}),
         "nodeSelector: Forbidden: has a key that is not a label key"),
    Case("nodeSelector value with a space", at("pools.cpu.nodeSelector", {"pool": "cpu heavy"}),
         "nodeSelector value cpu heavy is not a label value"),
    Case("toleration Exists with a value", at("pools.cpu.tolerations", [{"key": "gpu", "operator": "Exists",
                                                                          "value": "yes"}]),
         "a toleration with operator Exists must not have a value, got yes", parse=False),
    Case("toleration without key and Equal", at("pools.cpu.tolerations", [{"operator": "Equal", "value": "x"}]),
         "a toleration without a key must have operator Exists", parse=False),
    Case("tolerationSeconds with NoSchedule", at("pools.cpu.tolerations", [{"key": "k", "operator": "Exists",
                                                                            "effect": "NoSchedule",
                                                                            "tolerationSeconds": 30}]),
         "tolerationSeconds only applies to effect NoExecute", parse=False),
    # -- beyond the class: refused by the class policy (the operator reports ClassViolation for stored ones) -------
    Case("replicas above the class", at("pools.cpu.maxReplicas", 9), "are above the limit of RerankClass", "policy"),
    Case("minimum above the class", both(at("pools.cpu", {"minReplicas": 9})), "are above the limit of RerankClass",
         "policy"),
    Case("storage above the class", at("storage.size", "500Gi"), "storage.size 500Gi is above the limit of RerankClass",
         "policy"),
    Case("local path not allowed", both(at("model", {"path": "uploads/m"}), at("storage", {"existingClaim": "data"})),
         "model.path is not allowed by RerankClass", "policy"),
    Case("image outside the class", at("pools.cpu.image", "docker.io/evil/tei:1"),
         "pools.cpu.image docker.io/evil/tei:1 is not allowed by RerankClass", "policy"),
    Case("quality gate below the floor", at("quantization.qualityGate", {"minSpearman": 0.5}),
         "quantization.qualityGate.minSpearman 0.5 is below the floor", "policy"),
    Case("cpu above maxResources", cpu_resources(requests={"cpu": "64"}),
         "pools.cpu.resources requests.cpu=64 exceed the limit of RerankClass", "policy"),
    Case("own placement", affinity(term(key="zone", operator="In", values=["a"])),
         "(pools.cpu.allowTenantPlacement: false)", "policy"),
    Case("metrics source the class forbids", both(at("className", DIRECT_ONLY),
                                                  at("autoscaling.metrics", {"source": "prometheus"})),
         f"autoscaling.metrics.source prometheus is not allowed by RerankClass {DIRECT_ONLY}", "policy",
         class_name=DIRECT_ONLY),
]

VALID: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("the base model", lambda body: None),
    ("every allowed TEI flag", args("cpu", "--tokenization-workers=4", "--max-batch-requests=64",
                                    "--payload-limit=4000000", "--served-model-name=search/bge-m3", "--disable-spans")),
    ("a pull-request revision", at("model.revision", "refs/pr/2")),
    ("a tag revision", at("model.revision", "v2.1.0-rc.1")),
    ("requests equal to limits", both(cpu_resources(requests={"cpu": "2", "memory": "8Gi"},
                                                    limits={"cpu": "2", "memory": "8Gi"}),
                                      at("pools.gpu.resources", {"requests": {"nvidia.com/gpu": 1},
                                                                 "limits": {"nvidia.com/gpu": 1}}))),
    ("ReadWriteOncePod alone", at("storage", {"size": "1Gi", "accessModes": ["ReadWriteOncePod"]})),
    ("a gateway in another namespace", at("routing.gateway", {
        "parentRefs": [{"name": "edge", "namespace": "gateway-system", "sectionName": "https"}],
        "hostnames": ["*.example.com", "rerank.example.com"]})),
    ("a time budget within the deadline", at("quantization", {"timeBudgetSeconds": 600, "activeDeadlineSeconds": 900})),
    ("a short deadline and no time budget", at("quantization.activeDeadlineSeconds", 300)),
    ("a minimum above the default maximum", at("pools.cpu", {"minReplicas": 6})),
    ("the prometheus source, server chosen by the platform", at("autoscaling.metrics", {"source": "prometheus"})),
    ("a dotted Secret name", at("model.tokenSecretRef", {"name": "hf-token.v2", "key": "HF_TOKEN"})),
]


def body_of(mod: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    body = copy.deepcopy(BASE)
    mod(body)
    return body


def dry_run_create(api: client.ApiClient, namespace: str, body: dict[str, Any]) -> str | None:
    """The refusal's message, or None when admitted (dry run, strict field validation as kubectl apply does)."""
    try:
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, dry_run="All", field_validation="Strict")
    except ApiException as exc:
        assert exc.status in (400, 403, 422), exc.body
        return str(json.loads(exc.body)["message"])
    return None


def useless_parts(message: str) -> list[str]:
    """What makes a refusal unhelpful: a raw regex, the type instead of the value, no field path."""
    return [p for p in ("should match '", 'Invalid value: "string"', 'Invalid value: "object"', "<nil>")
            if p in message]


@pytest.fixture(scope="module")
def plain_ns(cluster: Cluster, crds_installed: list[str]) -> Iterator[str]:
    """A namespace the class policy does not cover: only the CRD judges."""
    ns = f"adv-plain-{RUN}"
    cluster.kubectl_run("create", "namespace", ns)
    yield ns
    cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


@pytest.fixture(scope="module")
def policed_ns(cluster: Cluster, kube: client.ApiClient,
               crds_installed: list[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """A namespace under the shipped policy (its binding narrowed to this namespace), with the chart's default class
    (``defaultClass.spec: {}``) and a class allowing only the direct metrics source. Yields the namespace and the
    classes as stored (with their CRD defaults)."""
    ns = f"adv-policed-{RUN}"
    cluster.kubectl_run("create", "namespace", ns)
    cluster.kubectl_run("label", "namespace", ns, f"{LABEL}={RUN}")
    policy, binding = yaml.safe_load_all(POLICY_FILE.read_text())
    binding["spec"]["matchResources"] = {"namespaceSelector": {"matchLabels": {LABEL: RUN}}}
    classes = [
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass",
         "metadata": {"name": DEFAULT_CLASS, "annotations": {tenancy.DEFAULT_CLASS_ANNOTATION: "true"}}, "spec": {}},
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "RerankClass", "metadata": {"name": DIRECT_ONLY},
         "spec": {"metrics": {"allowedSources": ["direct"]}}},
    ]
    docs = [*classes, policy, binding]
    cluster.apply(docs)
    api = client.CustomObjectsApi(kube)
    stored = {c["metadata"]["name"]:
              api.get_cluster_custom_object(GROUP, VERSION, "rerankclasses", c["metadata"]["name"])
              for c in classes}
    probe = body_of(at("pools.cpu.maxReplicas", 99))
    eventually(lambda: (m := dry_run_create(kube, ns, probe)) is not None and "RerankClass" in m,
               what="the class policy to be enforced")
    try:
        yield ns, stored
    finally:
        cluster.kubectl_run("delete", "-f", "-", "--ignore-not-found", input=yaml.safe_dump_all([policy, binding]),
                            check=False)
        cluster.kubectl_run("delete", "rerankclass", DEFAULT_CLASS, DIRECT_ONLY, "--ignore-not-found", check=False)
        cluster.kubectl_run("delete", "namespace", ns, "--wait=false", check=False)


def test_the_suite_is_large_enough() -> None:
    assert len(INVALID) >= 60 and len(VALID) >= 10
    assert len({c.name for c in INVALID}) == len(INVALID)


@pytest.mark.parametrize("case", INVALID, ids=[c.name for c in INVALID])
def test_without_the_policy(kube: client.ApiClient, plain_ns: str, case: Case) -> None:
    message = dry_run_create(kube, plain_ns, body_of(case.mod))
    if case.layer == "policy":
        assert message is None, f"{case.name}: the CRD alone should admit it (the class policy judges it): {message}"
        return
    assert message is not None, f"{case.name}: admitted"
    assert case.expected in message, message
    assert useless_parts(message) == [], message


@pytest.mark.parametrize("case", INVALID, ids=[c.name for c in INVALID])
def test_with_the_policy(kube: client.ApiClient, policed_ns: tuple[str, dict[str, Any]], case: Case) -> None:
    message = dry_run_create(kube, policed_ns[0], body_of(case.mod))
    assert message is not None, f"{case.name}: admitted"
    assert case.expected in message, message
    assert useless_parts(message) == [], message


@pytest.mark.parametrize(("name", "mod"), VALID, ids=[v[0] for v in VALID])
def test_valid_models_are_admitted_with_and_without_the_policy(kube: client.ApiClient, plain_ns: str,
                                                               policed_ns: tuple[str, dict[str, Any]], name: str,
                                                               mod: Callable[[dict[str, Any]], None]) -> None:
    body = body_of(mod)
    assert dry_run_create(kube, plain_ns, body) is None, name
    assert dry_run_create(kube, policed_ns[0], body) is None, name
    spec_parse.parse(body["spec"])  # and the operator can serve it


@pytest.mark.parametrize("case", [c for c in INVALID if c.layer == "crd" and c.parse], ids=lambda c: c.name)
def test_the_operator_refuses_what_the_crd_refuses(case: Case) -> None:
    """Defence in depth: an object stored before a rule existed never meets it again; the parser does."""
    with pytest.raises(specs.SpecError):
        spec_parse.parse(body_of(case.mod)["spec"])


@pytest.mark.parametrize("case", [c for c in INVALID if c.layer == "policy"], ids=lambda c: c.name)
def test_the_operator_reports_what_the_policy_refuses(policed_ns: tuple[str, dict[str, Any]], case: Case) -> None:
    class_spec = policed_ns[1][case.class_name or DEFAULT_CLASS]["spec"]
    spec = body_of(case.mod)["spec"]
    assert tenancy.violations(tenancy.resolve(spec, class_spec), class_spec), case.name


def test_counts(kube: client.ApiClient, plain_ns: str, policed_ns: tuple[str, dict[str, Any]]) -> None:
    """The closing numbers: how many of the suite's manifests each setup refuses and admits."""
    counts: dict[str, dict[str, int]] = {}
    for mode, ns in (("without policy", plain_ns), ("with policy", policed_ns[0])):
        invalid = [dry_run_create(kube, ns, body_of(c.mod)) for c in INVALID]
        valid = [dry_run_create(kube, ns, body_of(m)) for _, m in VALID]
        counts[mode] = {"invalid refused": sum(m is not None for m in invalid),
                        "invalid admitted": sum(m is None for m in invalid),
                        "valid admitted": sum(m is None for m in valid),
                        "valid refused": sum(m is not None for m in valid)}
    print("adversarial suite:", json.dumps(counts))
    policy_only = sum(c.layer == "policy" for c in INVALID)
    assert counts["with policy"] == {"invalid refused": len(INVALID), "invalid admitted": 0,
                                     "valid admitted": len(VALID), "valid refused": 0}
    assert counts["without policy"] == {"invalid refused": len(INVALID) - policy_only, "invalid admitted": policy_only,
                                        "valid admitted": len(VALID), "valid refused": 0}
