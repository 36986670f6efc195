"""Shared artifacts in the plan: the decision (``artifact_decision._decide_shared``), the one Job in the store's
namespace (``builders/shared_job.py``) and the pools that fetch a published artifact instead of mounting a claim
(``builders/fetch.py``)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from rerank_contracts import artifact_layout, quantize_job
from rerank_operator.core import names, platform
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.artifacts import sharing
from rerank_operator.core.artifacts.decision import (
    SHARED_LOOKUP_SECONDS,
    SHARED_RECHECK_SECONDS,
    ArtifactDecision,
    artifact_record,
    decide_artifact,
)
from rerank_operator.core.builders import pods, shared_job
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.reconcile.observed import Obj, Observed
from rerank_operator.core.spec.model import RerankModelSpec
from rerank_operator.core.status import conditions
from tests.unit.operator.rerankmodel_gen import (
    Mod,
    finish,
    job_pod,
    model,
    owner_of,
    published,
    refused,
    set_,
    spec_of,
    without,
)

REPO = Path(__file__).resolve().parents[5]
NOW = "2026-12-05T00:00:00Z"
REPOSITORY = "registry.platform.svc:5000/rerank/artifacts"
STORE = platform.ArtifactStore(repository=REPOSITORY, namespace="rerank-artifacts", push_secret="artifact-push",
                              insecure=True)
FETCHER = "registry.example/rerank-operator:1.2.3"
PUBLIC = without("model.tokenSecretRef")  # the fixtures' base model has a hub token: private


def body_of(*mods: Mod) -> dict[str, Any]:
    return model(PUBLIC, *mods)


def shared_id(spec: RerankModelSpec, store: platform.ArtifactStore = STORE) -> str:
    return sharing.shared_id(spec, store)


def publication(artifact_id: str) -> sharing.Published:
    return sharing.Published(ref=f"{REPOSITORY}@sha256:{'c' * 64}", manifest_sha256="d" * 64,
                             manifest={"size_bytes": 1000, "quality": {"spearman": 0.995}, "max_input_tokens": 512,
                                       "artifact_id": artifact_id},
                             parts=(artifact_layout.CPU_SUBDIR, artifact_layout.ORIGINAL_SUBDIR))


def decide(body: dict[str, Any], *, status: dict[str, Any] | None = None, store: platform.ArtifactStore | None = STORE,
           shared: sharing.SharedView | None = None,
           observed: Observed | None = None) -> tuple[ArtifactDecision, Obj | None]:
    return decide_artifact(owner_of(body), spec_of(body), observed or Observed(), status or {}, NOW, store=store,
                           shared=shared)


def container(obj: Obj) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"]["containers"][0])


def pod_spec(obj: Obj) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"])


def after(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def shared_job_of(spec: RerankModelSpec, attempt: int = 1, store: platform.ArtifactStore = STORE) -> Obj:
    """The builder's Job as the API server returns it: with a uid (its pods name it as their owner)."""
    built = shared_job.build_shared_job(spec, shared_id(spec, store), attempt, store)
    built["metadata"]["uid"] = f"job-uid-{attempt}"
    return built


# --- the decision: nothing published yet ---------------------------------------------------------------------------

def test_the_first_model_asking_creates_the_one_job_in_the_stores_namespace() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    decision, new = decide(body)
    assert new is not None
    assert decision.desired_id == sid and decision.served is None and not decision.published
    meta = new["metadata"]
    assert meta["name"] == f"rerank-artifact-{sid}-1"
    assert meta["namespace"] == "rerank-artifacts"
    assert meta["labels"] == {**names.shared_labels(sid), names.LABEL_BUILT_FOR: owner_of(body).namespace}
    assert new["spec"]["template"]["metadata"]["labels"] == names.shared_labels(sid)
    assert "ownerReferences" not in meta  # it serves every namespace that asks
    assert meta["annotations"][names.ANNOTATION_ATTEMPT] == "1"
    assert meta["annotations"][names.ANNOTATION_SOURCE] == spec.model.display
    pending = decision.pending
    assert pending is not None
    assert (pending.id, pending.job, pending.attempts, pending.state, pending.reason) == (
        sid, f"rerank-artifacts/{meta['name']}", 1, "Creating", conditions.REASON_QUANTIZING)
    assert decision.recheck_after == SHARED_RECHECK_SECONDS


def test_the_shared_job_carries_nothing_of_the_tenant_and_pushes_with_the_stores_secret() -> None:
    body = body_of()
    _, new = decide(body)
    assert new is not None
    quantizer = container(new)
    env = {e["name"]: e for e in quantizer["env"]}
    assert "HF_TOKEN" not in env
    assert env["DOCKER_CONFIG"] == {"name": "DOCKER_CONFIG", "value": "/etc/rerank/registry"}
    volumes = pod_spec(new)["volumes"]
    assert all("persistentVolumeClaim" not in v and "configMap" not in v for v in volumes)
    by_name = {v["name"]: v for v in volumes}
    assert by_name[pods.MODEL_VOLUME] == {"name": pods.MODEL_VOLUME, "emptyDir": {}}
    mounts = {m["mountPath"]: m for m in quantizer["volumeMounts"]}
    credentials = mounts["/etc/rerank/registry"]
    assert credentials["readOnly"] is True
    assert by_name[credentials["name"]]["secret"] == {
        "secretName": "artifact-push", "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}
    assert mounts[artifact_layout.VOLUME_MOUNT_PATH]["name"] == pods.MODEL_VOLUME
    args = quantizer["args"]
    assert after(args, "--push-repository") == REPOSITORY
    assert "--push-insecure" in args
    request = quantize_job.parse_args(args)
    assert (request.push_repository, request.push_insecure) == (REPOSITORY, True)
    assert request.artifact_id == shared_id(spec_of(body))
    assert request.eval_pairs is None and request.calibration_pairs is None


def test_a_tenant_cannot_fail_a_shared_build_for_others() -> None:
    """Resources, deadline and retries are not part of the shared id (the bytes do not depend on them), so the
    shared Job does not take them from whichever tenant asked first: it runs with the class's default resources and
    at least the built-in deadline and retries; a tenant's larger deadline or retries harm no one."""
    klass = {"artifactStore": {"repository": "registry.example/rerank/artifacts", "namespace": "rerank-artifacts"},
             "quantization": {"defaultResources": {"requests": {"cpu": "2", "memory": "4Gi"},
                                                   "limits": {"memory": "8Gi"}}}}
    store = platform.ArtifactStore.from_class(klass)
    assert store is not None
    # (A shorter deadline shortens the default time budget, which is part of the id: given, it keeps the id.)
    hostile = spec_of(model(set_("quantization.resources", {"limits": {"memory": "64Mi"}}),
                            set_("quantization.activeDeadlineSeconds", 1000), set_("quantization.backoffLimit", 0),
                            set_("quantization.timeBudgetSeconds", 900)))
    polite = spec_of(model(set_("quantization.timeBudgetSeconds", 900)))
    assert shared_id(hostile, store) == shared_id(polite, store)  # one artifact, one build for both
    built = shared_job.build_shared_job(hostile, shared_id(hostile, store), 1, store)
    assert container(built)["resources"] == klass["quantization"]["defaultResources"]
    assert built["spec"]["activeDeadlineSeconds"] >= spec_of(model()).quantization.active_deadline_seconds
    assert built["spec"]["backoffLimit"] >= 2
    patient = spec_of(model(set_("quantization.activeDeadlineSeconds", 7200)))
    assert shared_job.build_shared_job(patient, shared_id(patient, store), 1, store)["spec"][
        "activeDeadlineSeconds"] == 7200


def test_a_tenant_cannot_fill_the_stores_namespace_with_builds() -> None:
    """Shared Jobs run in the store's namespace, outside the tenants' quotas, and a tenant can mint distinct ids at
    will (each quality gate is another id). A namespace with ``maxBuildsPerNamespace`` of them building waits before
    it starts one more; another namespace does not wait for it, and a build already running is joined freely."""
    body = body_of()
    ns = owner_of(body).namespace
    store = dataclasses.replace(STORE, max_builds_per_namespace=2)
    sid = shared_id(spec_of(body), store)
    decision, new = decide(body, store=store, shared=sharing.SharedView(sid, building={ns: 2, "other": 5}))
    pending = decision.pending
    assert new is None and pending is not None
    assert (pending.state, pending.reason) == ("Waiting", conditions.REASON_SHARED_BUILDS_LIMITED)
    assert f"namespace {ns} has 2 shared artifacts building" in pending.message
    assert "maxBuildsPerNamespace" in pending.message and decision.recheck_after == SHARED_RECHECK_SECONDS
    _, new = decide(body, store=store, shared=sharing.SharedView(sid, building={ns: 1, "other": 5}))
    assert new is not None and new["metadata"]["labels"][names.LABEL_BUILT_FOR] == ns
    running = shared_job_of(spec_of(body), store=store)
    decision, new = decide(body, store=store, shared=sharing.SharedView(sid, jobs=(running,), building={ns: 9}))
    assert new is None and decision.pending is not None and decision.pending.state == "Running"
    assert platform.ArtifactStore.from_class({"artifactStore": {
        "repository": REPOSITORY, "namespace": "x", "maxBuildsPerNamespace": 5}}).max_builds_per_namespace == 5
    default = platform.ArtifactStore.from_class({"artifactStore": {"repository": REPOSITORY, "namespace": "x"}})
    crd = yaml.safe_load((REPO / "crds" / "rerankclass.yaml").read_text())
    fields = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert default is not None and default.max_builds_per_namespace == \
        fields["artifactStore"]["properties"]["maxBuildsPerNamespace"]["default"]  # the CRD's default, and ours


def test_the_shared_job_runs_on_the_classs_cpu_nodes_never_a_tenants() -> None:
    """The Job tunes and measures the INT8 recipe on the CPU it runs on: the class's CPU node pool. A tenant's own
    placement (where its class allows one) could make the build every tenant waits for unschedulable: not taken."""
    klass = {"artifactStore": {"repository": REPOSITORY, "namespace": "rerank-artifacts"},
             "pools": {"cpu": {"nodeSelector": {"cpu-pool": "avx2"},
                               "tolerations": [{"key": "cpu-pool", "operator": "Exists", "effect": "NoSchedule"}]}}}
    store = platform.ArtifactStore.from_class(klass)
    assert store is not None
    tenant = spec_of(body_of(set_("pools.cpu.nodeSelector", {"cpu-pool": "nowhere"})))
    built = pod_spec(shared_job.build_shared_job(tenant, shared_id(tenant, store), 1, store))
    assert built["nodeSelector"] == {"cpu-pool": "avx2"}
    assert built["tolerations"] == klass["pools"]["cpu"]["tolerations"] and "affinity" not in built
    bare = platform.ArtifactStore.from_class({"artifactStore": klass["artifactStore"]})
    assert bare is not None
    assert "nodeSelector" not in pod_spec(shared_job.build_shared_job(tenant, shared_id(tenant, bare), 1, bare))


def test_a_secure_store_without_push_credentials() -> None:
    store = dataclasses.replace(STORE, insecure=False, push_secret=None)
    _, new = decide(body_of(), store=store)
    assert new is not None
    quantizer = container(new)
    assert "--push-insecure" not in quantizer["args"]
    assert after(quantizer["args"], "--push-repository") == REPOSITORY
    assert "DOCKER_CONFIG" not in {e["name"] for e in quantizer["env"]}
    assert all("secret" not in v for v in pod_spec(new)["volumes"])


def test_the_classs_hub_endpoint_reaches_the_shared_job() -> None:
    _, new = decide(body_of(set_("model.hub", {"endpoint": "https://hub-mirror.internal"})))
    assert new is not None
    assert {"name": "HF_ENDPOINT", "value": "https://hub-mirror.internal"} in container(new)["env"]


def test_a_view_of_another_id_is_not_this_specs() -> None:
    body = body_of()
    other = sharing.SharedView("f" * 16, published=publication("f" * 16))
    decision, new = decide(body, shared=other)
    assert new is not None and not decision.published and decision.served is None
    assert new["metadata"]["name"] == f"rerank-artifact-{shared_id(spec_of(body))}-1"


def test_model_namespace_jobs_are_not_the_shared_jobs() -> None:
    # A per-model Job labelled with the same id (in the model's namespace) does not stand for the shared one.
    body = body_of()
    sid = shared_id(spec_of(body))
    stray = shared_job_of(spec_of(body))
    stray["metadata"]["namespace"] = "search"
    decision, new = decide(body, observed=Observed(jobs=(stray,)))
    assert new is not None and decision.pending is not None and decision.pending.state == "Creating"
    assert new["metadata"]["name"] == f"rerank-artifact-{sid}-1"


# --- the decision: published, building, failed --------------------------------------------------------------------

def test_a_published_artifact_is_served_from_the_store_without_a_job() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    pub = publication(sid)
    decision, new = decide(body, shared=sharing.SharedView(sid, published=pub))
    assert new is None
    assert decision.published is True and decision.pending is None
    assert decision.served == sharing.record(pub, sid, NOW, spec.model.display, STORE)
    assert decision.served is not None
    assert (decision.served["source"], decision.served["id"], decision.served["ref"]) == ("shared", sid, pub.ref)


def test_a_served_shared_artifact_stays_without_looking_at_the_store() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    record = sharing.record(publication(sid), sid, "earlier", spec.model.display)
    decision, new = decide(body, status={"artifact": record})
    assert new is None and decision.served == record and not decision.published and decision.pending is None


def test_a_running_shared_job_is_waited_on() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    running = shared_job_of(spec)
    running["status"] = {"active": 1}
    decision, new = decide(body, shared=sharing.SharedView(sid, jobs=(running,)))
    assert new is None
    assert decision.pending is not None
    assert decision.pending.state == "Running"
    assert decision.pending.job == f"rerank-artifacts/rerank-artifact-{sid}-1"
    assert decision.pending.attempts == 1
    assert decision.pending.reason == conditions.REASON_QUANTIZING
    assert decision.recheck_after == SHARED_RECHECK_SECONDS
    assert decision.served is None and not decision.published


def test_the_newest_attempt_decides() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    first = finish(shared_job_of(spec, 1), ok=False)
    second = shared_job_of(spec, 2)
    decision, new = decide(body, shared=sharing.SharedView(sid, jobs=(second, first)))
    assert new is None and decision.pending is not None
    assert (decision.pending.state, decision.pending.attempts) == ("Running", 2)
    assert decision.pending.job == f"rerank-artifacts/rerank-artifact-{sid}-2"


def test_a_permanently_failed_shared_job_fails_every_waiting_model_with_its_reason() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    built = shared_job_of(spec)
    failed = finish(built, ok=False)
    message = quantize_job.JobResult(ok=False, reason="QualityGateFailed", message="spearman 0.91 < 0.99").to_message()
    pod = job_pod(built, 1, message)
    view = sharing.SharedView(sid, jobs=(failed,), pods={built["metadata"]["name"]: (pod,)})
    decision, new = decide(body, shared=view)
    assert new is None
    assert decision.pending is not None
    assert decision.pending.state == "Failed"
    assert decision.pending.reason == "QualityGateFailed"
    assert "spearman 0.91 < 0.99" in decision.pending.message
    assert decision.pending.job == f"rerank-artifacts/rerank-artifact-{sid}-1"
    assert decision.recheck_after is None
    # The pods are found by the Job's name: without them the Job's own condition is all there is.
    alone, _ = decide(body, shared=sharing.SharedView(sid, jobs=(failed,)))
    assert alone.pending is not None and alone.pending.reason == "BackoffLimitExceeded"
    # A spec change to the same id (same bytes) does not retry a permanent failure: only deleting the Job does.
    later, again = decide(model(PUBLIC, set_("pools.cpu.maxReplicas", 3)), shared=view)
    assert again is None and later.pending is not None and later.pending.state == "Failed"


def test_a_transient_failure_waits_for_its_backoff_then_retries() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    built = shared_job_of(spec)
    failed = finish(built, ok=False)
    pod = job_pod(built, 1, refused("HubUnavailable", "503 from the hub"))
    failed["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-04T23:59:50Z"  # 10 s before NOW
    view = sharing.SharedView(sid, jobs=(failed,), pods={built["metadata"]["name"]: (pod,)})
    waiting, none = decide(body, shared=view)
    assert none is None and waiting.pending is not None
    assert (waiting.pending.state, waiting.pending.reason) == ("Waiting", "HubUnavailable")
    assert waiting.recheck_after is not None and waiting.recheck_after > 0
    failed["status"]["conditions"][0]["lastTransitionTime"] = "2026-12-04T00:00:00Z"  # a day ago
    retried, new = decide(body, shared=view)
    assert new is not None and retried.pending is not None
    assert new["metadata"]["name"] == f"rerank-artifact-{sid}-2"
    assert new["metadata"]["annotations"][names.ANNOTATION_TRANSIENT_RETRIES] == "1"
    assert (retried.pending.state, retried.pending.attempts) == ("Creating", 2)


def test_a_job_that_pushed_is_looked_up_again_shortly() -> None:
    body = body_of()
    spec = spec_of(body)
    sid = shared_id(spec)
    built = shared_job_of(spec)
    done = finish(built, ok=True)
    done["status"]["completionTime"] = "2026-12-04T23:59:50Z"
    pod = job_pod(built, 0, published(sid))
    decision, new = decide(body, shared=sharing.SharedView(sid, jobs=(done,), pods={built["metadata"]["name"]: (pod,)}))
    assert new is None and decision.pending is not None and decision.pending.state == "Running"
    assert decision.recheck_after == SHARED_LOOKUP_SECONDS and decision.served is None
    # Long finished and still no tag: what it pushed did not stay; the next attempt builds it again.
    done["status"]["completionTime"] = "2026-12-04T00:00:00Z"
    again, rebuilt = decide(body, shared=sharing.SharedView(sid, jobs=(done,),
                                                            pods={built["metadata"]["name"]: (pod,)}))
    assert rebuilt is not None and rebuilt["metadata"]["name"] == f"rerank-artifact-{sid}-2"
    assert again.pending is not None and again.pending.state == "Creating"


def test_a_tenant_private_spec_builds_its_own_artifact_even_with_a_store() -> None:
    body = body_of(set_("quantization.evaluationData", {"configMapRef": {"name": "pairs", "key": "e.jsonl"}}))
    spec = spec_of(body)
    own = artifact.artifact_id(spec)
    assert own is not None
    decision, new = decide(body)
    assert new is not None
    assert decision.desired_id == own
    assert new["metadata"]["name"] == names.job_name("bge-m3", own, 1) == f"bge-m3-q-{own[:8]}-1"
    assert new["metadata"]["namespace"] == "search"
    assert new["metadata"]["ownerReferences"][0]["uid"] == "0b1c-uid"
    assert names.LABEL_SHARED not in new["metadata"]["labels"]
    assert "--push-repository" not in container(new)["args"]
    claims = [v for v in pod_spec(new)["volumes"] if "persistentVolumeClaim" in v]
    assert claims and claims[0]["persistentVolumeClaim"]["claimName"] == "bge-m3-models"
    # Published or not in the store, a view of its shared id changes nothing.
    sid = sharing.shared_id(spec, STORE)
    same, again = decide(body, shared=sharing.SharedView(sid, published=publication(sid)))
    assert again is not None and same.desired_id == own and not same.published


def test_without_a_store_the_model_builds_its_own() -> None:
    body = body_of()
    decision, new = decide(body, store=None)
    assert new is not None and decision.desired_id == artifact.artifact_id(spec_of(body))
    assert new["metadata"]["namespace"] == "search"


# --- the plan: pools that fetch ------------------------------------------------------------------------------------

def compute(body: dict[str, Any], *, status: dict[str, Any] | None = None,
            store: platform.ArtifactStore | None = STORE, shared: sharing.SharedView | None = None,
            fetcher_image: str = FETCHER) -> plans.Plan:
    return plans.compute(owner_of(body), spec_of(body), Observed(), status or {}, NOW, store=store, shared=shared,
                         fetcher_image=fetcher_image)


def deployments(plan: plans.Plan) -> dict[str, Obj]:
    return {d["metadata"]["labels"][names.LABEL_POOL]: d for d in plan.apply if d["kind"] == "Deployment"}


def claims_in(obj: Obj) -> list[dict[str, Any]]:
    return [v for v in pod_spec(obj)["volumes"] if "persistentVolumeClaim" in v]


def published_plan(*mods: Mod, store: platform.ArtifactStore = STORE, fetcher_image: str = FETCHER) -> plans.Plan:
    body = body_of(*mods)
    sid = shared_id(spec_of(body), store)
    return compute(body, store=store, shared=sharing.SharedView(sid, published=publication(sid)),
                   fetcher_image=fetcher_image)


@pytest.mark.parametrize("pool,part", [("cpu", "cpu-int8"), ("gpu", "original")])
def test_the_pools_fetch_a_published_artifact_into_an_empty_dir(pool: str, part: str) -> None:
    plan = published_plan()
    sid = shared_id(spec_of(body_of()))
    assert plan.serving_artifact == sid and plan.pools_deployed and plan.create == ()
    deployment = deployments(plan)[pool]
    (init,) = pod_spec(deployment)["initContainers"]
    assert init["name"] == "fetch-artifact"
    assert init["image"] == FETCHER
    args = init["args"]
    assert after(args, "--ref") == f"{REPOSITORY}@sha256:{'c' * 64}"
    assert after(args, "--manifest-sha256") == "d" * 64
    assert [after(args[i:], "--part") for i, a in enumerate(args) if a == "--part"] == [part]
    assert "--insecure" in args
    assert not claims_in(deployment)
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes[pods.MODEL_VOLUME] == {"name": pods.MODEL_VOLUME, "emptyDir": {}}
    # TEI reads the part where the init container puts it: the same volume, the fetched directory's part.
    into = after(args, "--into")
    (fill,) = [m for m in init["volumeMounts"] if m["name"] == pods.MODEL_VOLUME]
    (serve,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == pods.MODEL_VOLUME]
    assert into.startswith(fill["mountPath"] + "/")
    assert f"{into[len(fill['mountPath']) + 1:]}/{part}" == serve["subPath"]
    assert sid in serve["subPath"]


def test_a_model_served_from_the_store_has_no_claim() -> None:
    plan = published_plan()
    assert not [o for o in plan.apply if o["kind"] == "PersistentVolumeClaim"]
    assert all(not claims_in(d) for d in plan.apply if d["kind"] == "Deployment")


def test_a_secure_store_is_fetched_over_tls_with_the_pull_secret() -> None:
    store = dataclasses.replace(STORE, insecure=False, pull_secret="artifact-pull")
    deployment = deployments(published_plan(store=store))["cpu"]
    (init,) = pod_spec(deployment)["initContainers"]
    assert "--insecure" not in init["args"]
    assert after(init["args"], "--docker-config") == "/etc/rerank/registry/config.json"
    secrets = [v["secret"]["secretName"] for v in pod_spec(deployment)["volumes"] if "secret" in v]
    assert secrets == ["artifact-pull"]


def test_the_fetcher_defaults_to_the_quantizer_image() -> None:
    plan = published_plan(set_("quantization.image", "registry.example/quantizer:0.3.0"), fetcher_image="")
    for deployment in deployments(plan).values():
        (init,) = pod_spec(deployment)["initContainers"]
        assert init["image"] == "registry.example/quantizer:0.3.0"


def test_a_cpu_only_model_fetches_only_the_int8_part() -> None:
    plan = published_plan(set_("pools.gpu.enabled", False))
    assert set(deployments(plan)) == {"cpu"}
    (init,) = pod_spec(deployments(plan)["cpu"])["initContainers"]
    assert after(init["args"], "--part") == "cpu-int8" and init["args"].count("--part") == 1


def test_the_next_reconcile_keeps_fetching_from_the_status_record() -> None:
    first = published_plan()
    body = body_of()
    status = {"artifact": dict(first.artifact.served or {})}
    again = compute(body, status=status)  # no view of the store: the served record says where it is
    assert again.create == () and not [o for o in again.apply if o["kind"] == "PersistentVolumeClaim"]
    for deployment in deployments(again).values():
        (init,) = pod_spec(deployment)["initContainers"]
        assert after(init["args"], "--ref") == f"{REPOSITORY}@sha256:{'c' * 64}"
        assert not claims_in(deployment)


def test_pods_serving_a_shared_artifact_keep_its_registry_settings_after_the_class_drops_its_store() -> None:
    first = published_plan()
    record = dict(first.artifact.served or {})
    assert record["insecure"] is True  # the store it came from speaks plain HTTP
    record["pullSecret"] = "store-pull"
    again = compute(body_of(), status={"artifact": record}, store=None)
    for deployment in deployments(again).values():
        (init,) = pod_spec(deployment)["initContainers"]
        assert "--insecure" in init["args"]
        assert after(init["args"], "--docker-config") == "/etc/rerank/registry/config.json"
        secrets = [v["secret"]["secretName"] for v in pod_spec(deployment)["volumes"] if "secret" in v]
        assert secrets == ["store-pull"]


def test_without_a_store_the_pools_mount_the_claim() -> None:
    body = body_of()
    spec = spec_of(body)
    own = artifact.artifact_id(spec)
    assert own is not None
    result = quantize_job.parse_result(published(own))
    status = {"artifact": artifact_record(result, own, NOW, spec.model.display)}
    plan = compute(body, status=status, store=None)
    (pvc,) = [o for o in plan.apply if o["kind"] == "PersistentVolumeClaim"]
    assert pvc["metadata"]["name"] == plan.claim == "bge-m3-models"
    assert plan.serving_artifact == own
    for deployment in deployments(plan).values():
        assert "initContainers" not in pod_spec(deployment)
        assert [v["persistentVolumeClaim"]["claimName"] for v in claims_in(deployment)] == [plan.claim]


def test_a_first_plan_without_a_store_applies_the_claim_and_creates_the_models_job() -> None:
    plan = compute(body_of(), store=None)
    assert [o["kind"] for o in plan.apply] == ["PersistentVolumeClaim"]
    (new,) = plan.create
    assert new["metadata"]["namespace"] == "search"


def test_a_first_plan_with_a_store_writes_no_claim_only_the_shared_job() -> None:
    plan = compute(body_of())
    assert plan.apply == ()
    (new,) = plan.create
    assert new["metadata"]["namespace"] == "rerank-artifacts"
    assert not plan.pools_deployed


# --- the transition: a built artifact serves until the shared one is published -------------------------------------

def built_status(spec: RerankModelSpec) -> dict[str, Any]:
    own = artifact.artifact_id(spec)
    assert own is not None
    return {"artifact": artifact_record(quantize_job.parse_result(published(own)), own, "earlier", spec.model.display)}


def test_a_built_artifact_keeps_its_claim_until_the_shared_one_is_published() -> None:
    body = body_of()
    spec = spec_of(body)
    own, sid = artifact.artifact_id(spec), shared_id(spec)
    status = built_status(spec)
    waiting = compute(body, status=status, shared=sharing.SharedView(sid))
    assert waiting.serving_artifact == own
    assert [o["kind"] for o in waiting.apply].count("PersistentVolumeClaim") == 1
    (new,) = waiting.create
    assert new["metadata"]["name"] == f"rerank-artifact-{sid}-1"
    assert waiting.artifact.pending is not None and waiting.artifact.pending.state == "Creating"
    for deployment in deployments(waiting).values():
        assert "initContainers" not in pod_spec(deployment)
        assert [v["persistentVolumeClaim"]["claimName"] for v in claims_in(deployment)] == ["bge-m3-models"]
        (serve,) = [m for m in container(deployment)["volumeMounts"] if m["name"] == pods.MODEL_VOLUME]
        assert own is not None and own in serve["subPath"]
    # The Job running: still the claim.
    running = shared_job_of(spec)
    running["status"] = {"active": 1}
    still = compute(body, status=status, shared=sharing.SharedView(sid, jobs=(running,)))
    assert still.create == () and still.serving_artifact == own
    assert [o["kind"] for o in still.apply].count("PersistentVolumeClaim") == 1
    assert all(claims_in(d) for d in deployments(still).values())
    # Published: the pools switch to the store, and the claim is no longer applied.
    switched = compute(body, status=status, shared=sharing.SharedView(sid, published=publication(sid)))
    assert switched.serving_artifact == sid and switched.artifact.published
    assert not [o for o in switched.apply if o["kind"] == "PersistentVolumeClaim"]
    for deployment in deployments(switched).values():
        assert not claims_in(deployment)
        assert pod_spec(deployment)["initContainers"][0]["name"] == "fetch-artifact"


def test_a_private_spec_with_a_store_keeps_its_claim() -> None:
    body = body_of(set_("quantization.evaluationData", {"configMapRef": {"name": "pairs", "key": "e.jsonl"}}))
    spec = spec_of(body)
    plan = compute(body, status=built_status(spec))
    assert [o["kind"] for o in plan.apply].count("PersistentVolumeClaim") == 1
    for deployment in deployments(plan).values():
        assert "initContainers" not in pod_spec(deployment)
        assert claims_in(deployment)


def test_a_status_record_is_not_mutated_by_the_plan() -> None:
    body = body_of()
    spec = spec_of(body)
    status = built_status(spec)
    before = copy.deepcopy(status)
    compute(body, status=status, shared=sharing.SharedView(shared_id(spec), published=publication(shared_id(spec))))
    assert status == before


def test_a_store_that_cannot_be_read_starts_no_job_and_says_so() -> None:
    body = body_of()
    sid = shared_id(spec_of(body))
    decision, new = decide(body, shared=sharing.SharedView(sid, unavailable="connection refused"))
    assert new is None, "a Job for an artifact the store may already hold would be wasted"
    assert decision.pending is not None and decision.pending.state == "Waiting"
    assert decision.pending.reason == "RegistryUnavailable" and "connection refused" in decision.pending.message
    assert decision.recheck_after == 10.0 and decision.served is None
