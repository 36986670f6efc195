"""plan -> (fake) API server -> status, step by step through a model's life, with no cluster.

Each step: plan from (spec, what the world holds, last status), let the fake server apply it, compute the status.
The checks are on behaviour (which objects exist, which Job runs, what the pools serve, the condition reasons), and
after every step a second plan over the result must write nothing (the idle reconcile).
"""

from __future__ import annotations

import copy
from typing import Any

from rerank_operator.core import names
from rerank_operator.core.artifacts import decision as decisions
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.builders import deployment
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.reconcile.observed import ref_of
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions, events, readiness
from tests.unit.operator.rerankmodel_gen import (
    FakeWorld,
    finish,
    generation,
    job_pod,
    model,
    owner_of,
    published,
    refused,
    replicas,
    revision,
    set_,
    spec_of,
)

NOW = "2025-01-01T00:00:00Z"


class Life:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.world = FakeWorld()
        self.status: dict[str, Any] = {}
        self.last: plans.Plan | None = None
        self.events: list[events.Event] = []

    def step(self, body: dict[str, Any] | None = None) -> plans.Plan:
        if body is not None:
            self.body = body
        owner, spec = owner_of(self.body), spec_of(self.body)
        observed = self.world.observed()
        plan = plans.compute(owner, spec, observed, self.status, NOW)
        self.world.run(plan)
        new = statuses.compute(owner.generation, self.status, NOW, statuses.World(spec, observed, plan))
        self.events += events.actions(plan.create, plan.delete,
                                      [ref_of(o) for o in plan.create]) + events.transitions(self.status, new)
        self.status = new
        self.last = plan
        return plan

    def settle(self) -> None:
        """Step until nothing is written (at most a few steps), then assert one more step is idle."""
        for _ in range(4):
            if self.step().writes == 0:
                break
        idle = self.step()
        assert idle.writes == 0, (idle.apply, idle.create, idle.delete)
        assert statuses.merge_patch(self.status, self.step_status()) == {}

    def step_status(self) -> dict[str, Any]:
        owner, spec = owner_of(self.body), spec_of(self.body)
        observed = self.world.observed()
        plan = plans.compute(owner, spec, observed, self.status, NOW)
        return statuses.compute(owner.generation, self.status, NOW, statuses.World(spec, observed, plan))

    def cond(self, kind: str) -> tuple[str, str]:
        c = conditions.find(self.status["conditions"], kind)
        assert c is not None
        return c["status"], c["reason"]

    def jobs(self) -> list[dict[str, Any]]:
        return self.world.of_kind("Job")

    def finish_job(self, ok: bool, message: str) -> None:
        [job] = [j for j in self.jobs() if "conditions" not in j.get("status", {})]
        self.world.objects[("Job", job["metadata"]["name"])] = finish(job, ok)
        pod = job_pod(job, 0 if ok else 1, message)
        self.world.objects[("Pod", pod["metadata"]["name"])] = pod

    def served(self, pool: str) -> str | None:
        return deployment.served_artifact(self.world.objects.get(("Deployment", f"bge-m3-{pool}")))


def test_first_artifact_then_serving() -> None:
    life = Life(model())
    first = life.step()
    kinds = sorted(o["kind"] for o in first.apply)
    assert kinds == ["PersistentVolumeClaim"]  # the build first: pools and their Services come with an artifact
    assert [j["kind"] for j in first.create] == ["Job"]
    assert life.status["phase"] == "Quantizing" and life.cond("ModelReady") == ("False", "Quantizing")
    assert life.cond("Ready") == ("False", "Quantizing")
    life.settle()
    assert len(life.jobs()) == 1  # re-planning while it runs starts nothing

    artifact_id = artifact.artifact_id(spec_of(life.body))
    assert artifact_id
    life.finish_job(True, published(artifact_id))
    life.step()
    assert life.status["artifact"]["id"] == artifact_id and life.status["artifact"]["quality"]["spearman"] == 0.995
    assert life.cond("ModelReady") == ("True", "ArtifactPublished")
    assert life.served("cpu") == life.served("gpu") == artifact_id
    life.settle()
    assert life.status["phase"] == "Ready" and life.cond("Ready") == ("True", "Serving")
    assert life.status["pools"]["cpu"]["readyReplicas"] == 1 and life.status["traffic"]["gpuPercent"] == 100
    assert {e.reason for e in life.events} >= {"QuantizationStarted", "ArtifactPublished", "Ready"}


def max_batch_tokens(life: Life, pool: str) -> str:
    args = life.world.objects[("Deployment", f"bge-m3-{pool}")]["spec"]["template"]["spec"]["containers"][0]["args"]
    return str(args[args.index("--max-batch-tokens") + 1])


def test_the_cpu_pools_token_budget_is_the_published_models_maximum_input_length() -> None:
    """The Job reports TEI's maximum input length of what it published; the CPU pool batches within it unless its
    spec sets a budget. The GPU pool keeps TEI's default, and so does a CPU pool whose artifact came from a Job that
    did not report it (no rollout of running pools on upgrade)."""
    life = Life(model())
    life.step()
    artifact_id = artifact.artifact_id(spec_of(life.body))
    assert artifact_id
    life.finish_job(True, published(artifact_id, max_input_tokens=510))
    life.settle()
    assert life.status["artifact"]["maxInputTokens"] == 510
    assert (max_batch_tokens(life, "cpu"), max_batch_tokens(life, "gpu")) == ("510", "16384")
    body = copy.deepcopy(life.body)
    set_("pools.cpu.tei.maxBatchTokens", 4096)(body)
    life.step(body)
    life.settle()
    assert max_batch_tokens(life, "cpu") == "4096"

    old = Life(model())
    old.step()
    old.finish_job(True, published(artifact_id))
    old.settle()
    assert "maxInputTokens" not in old.status["artifact"] and max_batch_tokens(old, "cpu") == "16384"


def serving_life() -> tuple[Life, str]:
    life = Life(model())
    life.step()
    artifact_id = artifact.artifact_id(spec_of(life.body))
    assert artifact_id
    life.finish_job(True, published(artifact_id))
    life.settle()
    return life, artifact_id


def test_scaling_never_requantizes() -> None:
    life, artifact_id = serving_life()
    plan = life.step(model(replicas("cpu", 3), generation(2)))
    # Replicas go through the scale subresource: the Deployment's manifest is not re-applied.
    assert plan.create == () and plan.apply == () and [(s.name, s.replicas) for s in plan.scale] == [("bge-m3-cpu", 3)]
    assert life.world.objects[("Deployment", "bge-m3-cpu")]["spec"]["replicas"] == 3
    life.settle()
    assert len(life.jobs()) == 1 and life.served("cpu") == artifact_id


def test_the_reconcile_that_scales_is_not_ready_at_the_old_count() -> None:
    life, _ = serving_life()
    body = model(replicas("cpu", 3), generation(2))
    owner, spec, observed = owner_of(body), spec_of(body), copy.deepcopy(life.world.observed())
    plan = plans.compute(owner, spec, observed, life.status, NOW)
    assert [(s.name, s.replicas) for s in plan.scale] == [("bge-m3-cpu", 3)]
    # It saw the Deployment at 1 ready replica: Ready waits for the 3 it is asking for.
    ready, verdict = readiness.evaluate(readiness.Facts(spec, observed, plan, ()))
    assert not ready and verdict.reason == "ReplicasUnavailable" and "cpu 1/3 ready" in verdict.message


def test_new_revision_builds_once_then_rolls_while_the_old_artifact_serves() -> None:
    life, old = serving_life()
    body = model(revision("feedfacecafe"), generation(2))
    plan = life.step(body)
    [new_job] = plan.create
    new = new_job["metadata"]["labels"][names.LABEL_ARTIFACT]
    assert new != old and life.served("cpu") == old
    assert life.cond("Ready") == ("False", "Quantizing") and life.cond("PoolsAvailable")[0] == "True"
    assert life.status["phase"] == "Progressing" and life.status["artifact"]["id"] == old
    life.settle()
    assert len([j for j in life.jobs() if j["metadata"]["labels"][names.LABEL_ARTIFACT] == new]) == 1

    life.finish_job(True, published(new))
    life.step()
    assert life.served("cpu") == new and life.status["artifact"]["id"] == new
    life.settle()
    assert life.cond("Ready") == ("True", "Serving")
    assert [j["metadata"]["labels"][names.LABEL_ARTIFACT] for j in life.jobs()] == [new]  # the old Job is cleaned up


def test_quality_gate_refusal_then_fix() -> None:
    life, old = serving_life()
    life.step(model(set_("quantization.qualityGate", {"minSpearman": 0.999}), generation(2)))
    life.finish_job(False, refused("QualityGateFailed", "spearman 0.991 < 0.999"))
    life.step()
    assert life.cond("ModelReady") == ("False", "QualityGateFailed")
    assert life.cond("Degraded") == ("True", "QualityGateFailed")
    assert life.status["phase"] == "Degraded" and life.served("cpu") == old  # still serving the previous artifact
    assert any(e.type == "Warning" and e.reason == "QualityGateFailed" for e in life.events)
    life.settle()
    assert len(life.jobs()) == 2  # no retry loop without a spec change

    fixed = model(set_("quantization.qualityGate", {"minSpearman": 0.98}), generation(3))
    plan = life.step(fixed)
    assert len(plan.create) == 1
    life.finish_job(True, published(artifact.artifact_id(spec_of(fixed)) or ""))
    life.settle()
    assert life.cond("Degraded") == ("False", "AsExpected") and life.cond("Ready") == ("True", "Serving")


def test_failed_first_job_retries_on_a_spec_change_with_the_same_artifact() -> None:
    life = Life(model())
    life.step()
    life.finish_job(False, refused("ModelNotFound", "401: gated repo, no token"))
    life.step()
    assert life.status["phase"] == "Failed" and life.cond("ModelReady") == ("False", "ModelNotFound")
    assert life.cond("PoolsAvailable") == ("False", "AwaitingArtifact")
    life.settle()
    plan = life.step(model(set_("model.tokenSecretRef", {"name": "hf-new", "key": "token"}), generation(2)))
    [retry] = plan.create
    assert retry["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "2"
    assert life.status["pendingArtifact"]["attempts"] == 2


def test_disabling_a_pool_removes_its_children() -> None:
    life, _ = serving_life()
    plan = life.step(model(set_("pools.gpu.enabled", False), generation(2)))
    assert {(r.kind, r.name) for r in plan.delete} == {("Deployment", "bge-m3-gpu"), ("Service", "bge-m3-gpu")}
    life.settle()
    assert life.status["traffic"]["cpuPercent"] == 100 and "gpu" not in life.status["pools"]


def test_external_replica_management_leaves_replicas_alone() -> None:
    body = model(set_("autoscaling", {"enabled": True, "replicaManagement": "external"}))
    life = Life(body)
    life.step()
    life.finish_job(True, published(artifact.artifact_id(spec_of(body)) or ""))
    life.step()
    assert all("replicas" not in d["spec"] or d["spec"]["replicas"] == 1 for d in life.world.of_kind("Deployment"))
    for plan_obj in life.last.apply if life.last else ():
        if plan_obj["kind"] == "Deployment":
            assert "replicas" not in plan_obj["spec"]


def test_autoscaler_decision_sets_replicas_within_bounds() -> None:
    body = model(set_("autoscaling.enabled", True))
    life = Life(body)
    life.step()
    life.finish_job(True, published(artifact.artifact_id(spec_of(body)) or ""))
    life.settle()
    life.status["autoscaling"] = {"lastDecision": {"cpuReplicas": 50, "gpuReplicas": 2, "gpuPercent": 75}}
    life.settle()
    deployments = {d["metadata"]["name"]: d["spec"]["replicas"] for d in life.world.of_kind("Deployment")}
    assert deployments == {"bge-m3-cpu": 8, "bge-m3-gpu": 2}  # cpu clamped to maxReplicas 8
    assert life.status["traffic"]["gpuPercent"] == 75
    assert life.status["autoscaling"]["lastDecision"]["cpuReplicas"] == 50  # the autoscaler's field is untouched


def test_quantization_disabled_serves_the_source_at_once() -> None:
    life = Life(model(set_("quantization.enabled", False)))
    plan = life.step()
    assert plan.create == () and {o["kind"] for o in plan.apply} >= {"Deployment"}
    life.settle()
    assert life.cond("ModelReady") == ("True", "QuantizationDisabled") and life.cond("Ready") == ("True", "Serving")
    assert "artifact" not in life.status


def test_one_event_per_publication_and_per_failure() -> None:
    life, _ = serving_life()
    assert [e.reason for e in life.events].count("ArtifactPublished") == 1

    life.events.clear()
    life.step(model(revision("feedfacecafe"), generation(2)))
    life.finish_job(False, refused("QualityGateFailed", "spearman 0.91 < 0.99"))
    life.settle()
    assert life.cond("Degraded") == ("True", "QualityGateFailed")  # two conditions changed: one fact, one event
    assert [e.reason for e in life.events].count("QualityGateFailed") == 1


def test_a_result_lost_with_its_pod_is_recovered_by_the_next_attempt() -> None:
    """The Job succeeded, then its pod was removed before the operator read it: attempt 2 (which finds the artifact
    published and returns AlreadyPublished) recovers it instead of leaving the model failed."""
    life = Life(model())
    life.step()
    artifact_id = artifact.artifact_id(spec_of(life.body))
    assert artifact_id
    [first] = life.jobs()
    life.world.objects[("Job", first["metadata"]["name"])] = finish(first, True)  # no pod left
    plan = life.step()
    [second] = [j for j in plan.create]
    assert second["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "2"
    assert second["spec"]["template"]["spec"]["containers"][0]["args"] == \
        first["spec"]["template"]["spec"]["containers"][0]["args"]  # the same artifact id: the fast path applies
    assert life.cond("ModelReady") == ("False", "RecoveringResult")
    life.finish_job(True, published(artifact_id))
    life.settle()
    assert life.status["artifact"]["id"] == artifact_id and life.cond("Ready") == ("True", "Serving")


def test_result_recovery_gives_up_after_a_few_attempts_in_a_row() -> None:
    life = Life(model())
    life.step()
    for attempt in range(1, decisions.MAX_RESULT_RECOVERIES + 2):
        [latest] = [j for j in life.jobs() if "conditions" not in j.get("status", {})]
        assert latest["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == str(attempt)
        life.world.objects[("Job", latest["metadata"]["name"])] = finish(latest, True)
        life.step()
    assert life.cond("ModelReady") == ("False", "ResultLost")
    assert life.status["pendingArtifact"]["state"] == "Failed"
    assert life.step().create == ()  # given up: no more Jobs until the spec changes


def test_a_model_that_overflows_in_fp16_gets_no_gpu_traffic() -> None:
    """The Job found an activation of the original weights beyond float16's range (the GPU pool serves them in
    float16 on TEI's CUDA path: inf, then NaN scores). Its INT8 artifact still serves the CPU pool; the GPU pool gets
    no traffic, and the split says why. The same model within range routes GPU first as usual."""
    for peak, gpu_percent in ((1.2e6, 0), (310.0, 100)):
        life = Life(model())
        life.step()
        artifact_id = artifact.artifact_id(spec_of(life.body))
        life.finish_job(True, published(artifact_id, quality={"spearman": 0.995, "topk_agreement": 0.97,
                                                              "fp16_peak_activation": peak}))
        life.step()
        life.settle()
        assert life.status["artifact"]["quality"]["fp16_peak_activation"] == peak
        assert life.served("cpu") == artifact_id and life.cond("Ready") == ("True", "Serving")
        traffic = life.status["traffic"]
        assert traffic["gpuPercent"] == gpu_percent, traffic
        if gpu_percent == 0:
            assert "float16" in traffic["reason"] and "1.2e+06" in traffic["reason"], traffic
