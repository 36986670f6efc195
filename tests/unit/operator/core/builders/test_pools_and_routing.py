"""TEI Deployments, Services and the HTTPRoute."""

from __future__ import annotations

from typing import Any

import pytest

from rerank_contracts import artifact_layout
from rerank_operator.core import names
from rerank_operator.core.autoscale import split as splits
from rerank_operator.core.autoscale.recorded import RecordedDecision
from rerank_operator.core.builders import cpu_check, deployment, pods, routing, service
from rerank_operator.core.builders import fetch as fetching
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.reconcile.observed import Observed
from tests.unit.operator.rerankmodel_gen import Mod, model, owner_of, set_, spec_of

ARTIFACT = "0123456789abcdef"


def build(pool: str, *mods: Mod, artifact_id: str | None = ARTIFACT, replicas: int | None = 2) -> dict[str, Any]:
    body = model(*mods)
    spec = spec_of(body)
    return deployment.build_deployment(owner_of(body), spec, spec.pool(pool), artifact_id, replicas, "claim")  # type: ignore[arg-type]


def tei(dep: dict[str, Any]) -> dict[str, Any]:
    return dep["spec"]["template"]["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@pytest.mark.parametrize("pool,subdir", [("cpu", artifact_layout.CPU_SUBDIR), ("gpu", artifact_layout.ORIGINAL_SUBDIR)])
def test_pool_serves_its_directory_of_the_artifact(pool: str, subdir: str) -> None:
    dep = build(pool)
    c = tei(dep)
    model_dir = flag(c["args"], "--model-id")
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == model_dir)
    assert mount["subPath"] == f"{artifact_layout.ARTIFACTS_DIR}/{ARTIFACT}/{subdir}" and mount["readOnly"] is True
    volume = next(v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["persistentVolumeClaim"]["claimName"] == "claim"
    assert dep["spec"]["template"]["metadata"]["annotations"][names.ANNOTATION_ARTIFACT] == ARTIFACT


def test_tei_flags() -> None:
    cpu = tei(build("cpu", set_("pools.cpu.tei", {"maxBatchTokens": 8192, "maxConcurrentRequests": 64,
                                                  "maxClientBatchSize": 16, "autoTruncate": False,
                                                  "extraArgs": ["--tokenization-workers=2"]})))["args"]
    assert "--json-output" in cpu and flag(cpu, "--port") == str(names.TEI_PORT)
    assert (flag(cpu, "--max-batch-tokens"), flag(cpu, "--max-concurrent-requests"),
            flag(cpu, "--max-client-batch-size")) == ("8192", "64", "16")
    assert "--auto-truncate" not in cpu and "--dtype" not in cpu
    assert cpu[-1:] == ["--tokenization-workers=2"]  # one argument: a value can never be read as a flag
    gpu = tei(build("gpu"))["args"]
    assert flag(gpu, "--dtype") == "float16" and "--auto-truncate" in gpu


def test_probes_ports_and_rollout() -> None:
    dep = build("cpu")
    c = tei(dep)
    port = c["ports"][0]
    assert port["containerPort"] == names.TEI_PORT
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": port["name"]}
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    startup = c["startupProbe"]
    # A large model may load for 15 minutes; a loaded one joins the Service within 2 s (serving_e2e: TEI served 0.9 s
    # after its container started, and a 10 s period made the pod Ready at 11 s).
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 900
    assert startup["periodSeconds"] <= 2
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


@pytest.mark.parametrize("pool", ["cpu", "gpu"])
def test_a_removed_pod_keeps_serving_until_its_endpoint_is_gone_then_drains(pool: str) -> None:
    """serving_e2e: a 2 -> 1 scale-down without a delay lost ~20 requests already routed to the removed pod."""
    dep = build(pool)
    pre_stop = tei(dep)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    delay = int(pre_stop[1])
    assert delay >= 5  # endpoint removal takes seconds to reach kube-proxy and gateways
    # SIGTERM comes after the delay, and TEI then needs time of its own to finish what it holds.
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= delay + 30


def test_selector_is_stable_across_artifacts_and_matches_the_pods() -> None:
    a, b = build("cpu"), build("cpu", artifact_id="fedcba9876543210")
    assert a["spec"]["selector"] == b["spec"]["selector"]
    labels = a["spec"]["template"]["metadata"]["labels"]
    assert all(labels[k] == v for k, v in a["spec"]["selector"]["matchLabels"].items())
    assert tei(a)["args"] == tei(b)["args"] and a["spec"]["template"] != b["spec"]["template"]


def test_replicas_left_out_for_external_management() -> None:
    assert "replicas" not in build("cpu", replicas=None)["spec"]
    assert build("cpu", replicas=3)["spec"]["replicas"] == 3


def test_gpu_pool_scheduling_and_resources() -> None:
    dep = build("gpu", set_("pools.gpu.nodeSelector", {"gpu": "h100"}),
                set_("pools.gpu.tolerations",
                     [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]))
    pod = dep["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "h100"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert tei(dep)["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_cpu_pool_gets_a_cpu_limit_so_tei_sizes_its_threads_to_its_cpus() -> None:
    default = tei(build("cpu"))["resources"]
    assert default["requests"]["cpu"] == "2" and default["limits"] == {"memory": "8Gi", "cpu": "2"}
    fractional = tei(build("cpu", set_("pools.cpu.resources", {"requests": {"cpu": "1500m"}})))["resources"]
    assert fractional["limits"] == {"cpu": "2"}  # whole CPUs: TEI's thread count rounds the quota up
    own = {"requests": {"cpu": "2"}, "limits": {"cpu": "3", "memory": "6Gi"}}
    assert tei(build("cpu", set_("pools.cpu.resources", own)))["resources"] == own  # the user's limit stays
    no_request = tei(build("cpu", set_("pools.cpu.resources", {"limits": {"memory": "6Gi"}})))["resources"]
    assert no_request == {"limits": {"memory": "6Gi"}}


def test_api_key_comes_from_the_secret_not_the_args() -> None:
    c = tei(build("cpu", set_("pools.cpu.tei.apiKeySecretRef", {"name": "keys", "key": "tei"})))
    env = {e["name"]: e for e in c["env"]}
    assert env["API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "keys", "key": "tei"}
    assert "--api-key" not in c["args"]


def test_without_quantization_pools_serve_the_hub_model() -> None:
    c = tei(build("gpu", set_("quantization.enabled", False), artifact_id=None))
    assert flag(c["args"], "--model-id") == "BAAI/bge-reranker-v2-m3"
    assert flag(c["args"], "--revision") == "953dc6f6f85a1b2dbfca4c34a2796e7dde08d41e"
    assert {e["name"] for e in c["env"]} >= {"HF_TOKEN", "HUGGINGFACE_HUB_CACHE"}
    assert not any(m.get("subPath") for m in c["volumeMounts"])


# --- traffic ------------------------------------------------------------------------------------------------------

BOTH_READY = (1, 1)


@pytest.mark.parametrize("mods,ready,gpu_percent", [
    ((), BOTH_READY, 100),
    ((), (0, 1), 0),  # gpu-first falls back to CPU while no GPU replica is ready
    ((set_("routing", {"policy": "cpu-only"}),), BOTH_READY, 0),
    ((set_("routing", {"policy": "gpu-only"}),), BOTH_READY, 100),
    ((set_("routing", {"policy": "fixed", "weights": {"gpu": 70, "cpu": 30}}),), BOTH_READY, 70),
    ((set_("routing", {"policy": "fixed", "weights": {"gpu": 70, "cpu": 30}}),), (1, 0), 100),
    ((set_("pools.gpu.enabled", False),), (0, 1), 0),
    ((set_("pools.cpu.enabled", False),), (0, 0), 100),
])
def test_static_split(mods: tuple[Mod, ...], ready: tuple[int, int], gpu_percent: int) -> None:
    t = splits.split(spec_of(model(*mods)), *ready)
    assert (t.gpu_percent, t.cpu_percent) == (gpu_percent, 100 - gpu_percent)


def test_autoscaler_decision_is_applied_within_the_policy() -> None:
    decision = RecordedDecision(gpu_percent=60, reason="spill")
    assert splits.split(spec_of(model()), 1, 1, decision).gpu_percent == 60
    assert splits.split(spec_of(model(set_("routing", {"policy": "gpu-only"}))), 1, 1, decision).gpu_percent == 100


def test_httproute_weights_follow_the_split() -> None:
    body = model(set_("routing", {"policy": "fixed", "weights": {"gpu": 80, "cpu": 20},
                                  "gateway": {"parentRefs": [{"name": "edge", "namespace": "infra"}],
                                              "hostnames": ["rerank.example.com"]}}))
    spec = spec_of(body)
    route = routing.build_httproute(owner_of(body), spec, splits.split(spec, 1, 1))
    assert route is not None
    weights = {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}
    assert weights == {"bge-m3-gpu": 80, "bge-m3-cpu": 20}
    assert route["spec"]["parentRefs"] == [{"name": "edge", "namespace": "infra"}]
    assert route["spec"]["hostnames"] == ["rerank.example.com"]
    assert routing.build_httproute(owner_of(body), spec_of(model()), splits.split(spec, 1, 1)) is None


def test_model_service_selects_the_receiving_pools() -> None:
    owner = owner_of(model())
    one = service.build_model_service(owner, ["gpu"])["spec"]["selector"]
    both = service.build_model_service(owner, ["gpu", "cpu"])["spec"]["selector"]
    gpu_pod = build("gpu")["spec"]["template"]["metadata"]["labels"]
    cpu_pod = build("cpu")["spec"]["template"]["metadata"]["labels"]
    matches = lambda sel, labels: all(labels.get(k) == v for k, v in sel.items())  # noqa: E731
    assert matches(one, gpu_pod) and not matches(one, cpu_pod)
    assert matches(both, gpu_pod) and matches(both, cpu_pod)
    quantizer_pod = {names.LABEL_INSTANCE: "bge-m3", names.LABEL_NAME: names.APP_NAME,
                     names.LABEL_COMPONENT: "quantizer"}
    assert not matches(both, quantizer_pod)


def test_the_platforms_pull_secrets_go_on_every_pod_the_plan_makes_and_nowhere_else() -> None:
    body = model()
    owner, spec = owner_of(body), spec_of(body)
    wanted = [{"name": "regcred"}, {"name": "mirror"}]
    first = plans.compute(owner, spec, Observed(), {}, "2026-01-01T00:00:00Z", pull_secrets=("regcred", "mirror"))
    (job,) = first.create
    assert job["spec"]["template"]["spec"]["imagePullSecrets"] == wanted
    assert "imagePullSecrets" not in plans.compute(owner, spec, Observed(), {}, "2026-01-01T00:00:00Z"
                                                   ).create[0]["spec"]["template"]["spec"]
    pool = build("cpu")
    with_secrets = pods.with_pull_secrets(pool, ("regcred", "mirror"))
    assert with_secrets["spec"]["template"]["spec"]["imagePullSecrets"] == wanted
    assert "imagePullSecrets" not in pool["spec"]["template"]["spec"]  # the input is left alone
    svc = service.build_pool_service(owner, spec.cpu)
    assert pods.with_pull_secrets(svc, ("regcred",)) == svc  # no pod template: nothing to add


def test_a_cpu_pool_checks_its_node_before_serving_an_artifact_that_needs_vnni() -> None:
    """Full-range weights chosen on a VNNI CPU saturate on AVX2: the CPU pool's pods check their node first (before
    the fetch of a shared artifact, before TEI). A 7-bit artifact, the GPU pool and a record without a target get
    no check."""
    image = "registry.example/rerank-operator:1.2.3"
    vnni = cpu_check.for_record({"recipe": {"target": "avx512_vnni", "reduce_range": False}}, image)
    assert vnni == cpu_check.CpuCheck("avx512_vnni", False, image)
    assert cpu_check.for_record({"recipe": {"target": "avx2", "reduce_range": True}}, image) is None
    assert cpu_check.for_record({"recipe": {"target": "avx512_vnni", "reduce_range": True}}, image) is None
    assert cpu_check.for_record({"recipe": {"name": "older Job"}}, image) is None
    assert cpu_check.for_record({"recipe": {"target": "arm64"}}, image) == cpu_check.CpuCheck("arm64", False, image)
    body = model()
    spec = spec_of(body)
    cpu = deployment.build_deployment(owner_of(body), spec, spec.cpu, ARTIFACT, 2, "claim", cpu_check=vnni)
    (init,) = cpu["spec"]["template"]["spec"]["initContainers"]
    assert (init["name"], init["image"], init["command"], init["args"]) == (
        "check-cpu", image, ["rerank-fetch-artifact"], ["--check-cpu", "avx512_vnni"])
    assert init["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    # Where nodes carry Node Feature Discovery's labels, the pods prefer those that can serve the artifact.
    preferred = cpu["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert {t["preference"]["matchExpressions"][0]["key"] for t in preferred} == {
        "feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI", "feature.node.kubernetes.io/cpu-cpuid.AVXVNNI",
        "feature.node.kubernetes.io/cpu-cpuid.AMXINT8"}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in cpu["spec"]["template"]["spec"]["affinity"][
        "nodeAffinity"]
    gpu = deployment.build_deployment(owner_of(body), spec, spec.gpu, ARTIFACT, 1, "claim", cpu_check=vnni)
    assert "initContainers" not in gpu["spec"]["template"]["spec"] and "affinity" not in gpu["spec"]["template"]["spec"]
    failed = {"metadata": {"name": "m-cpu-x"}, "status": {"initContainerStatuses": [{"name": "check-cpu", "state": {
        "terminated": {"exitCode": 23, "message": '{"reason": "ArtifactTargetMismatch", "message": "node n1: no"}'}}}]}}
    assert fetching.failures([failed]) == ["pod m-cpu-x: ArtifactTargetMismatch: node n1: no"]


def test_the_preference_for_capable_nodes_keeps_the_pools_own_affinity() -> None:
    required = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "cpu-pool", "operator": "In", "values": ["big"]}]}]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 7, "preference": {"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}}]}, "podAntiAffinity": {"x": 1}}
    vnni = cpu_check.CpuCheck("avx512_vnni", False, "img")
    merged = cpu_check.preferring_capable_nodes(required, vnni)
    assert merged is not None
    node = merged["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"] == required["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 7
    assert len(node["preferredDuringSchedulingIgnoredDuringExecution"]) == 4 and merged["podAntiAffinity"] == {"x": 1}
    assert required["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 7  # untouched
    assert len(required["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]) == 1
    assert cpu_check.preferring_capable_nodes(None, cpu_check.CpuCheck("arm64", False, "img")) is None
