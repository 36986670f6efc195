"""A hub outage is not a wrong model: a Job that failed transiently is retried by the operator with a backoff, with
no spec edit, until the hub answers; permanent failures still wait for a fix. And the class's way to the hub (a
mirror, a proxy) and its remote-code permission reach the Job, never a tenant's own."""

from __future__ import annotations

from typing import Any

import pytest

from rerank_contracts import quantize_job
from rerank_operator.core import names
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.artifacts import job_outcome
from rerank_operator.core.builders import job as jobs
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.spec.model import HubAccess
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions, events
from rerank_operator.core.tenancy.resolve import resolve as resolve_spec
from rerank_operator.core.tenancy.violations import violations
from tests.unit.operator.rerankmodel_gen import FakeWorld, job_pod, model, owner_of, published, refused, set_, spec_of

BACKOFF = job_outcome.RetryBackoff(base_seconds=30, max_seconds=120)


def _at(seconds: int) -> str:
    """An RFC 3339 time ``seconds`` after 2025-01-01T00:00:00Z."""
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"2025-01-01T{h:02d}:{m:02d}:{s:02d}Z"


class Outage:
    """A model whose Jobs the test ends one at a time, planned at a chosen time."""

    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body
        self.world = FakeWorld()
        self.status: dict[str, Any] = {}
        self.events: list[events.Event] = []

    def step(self, seconds: int) -> plans.Plan:
        owner, spec = owner_of(self.body), spec_of(self.body)
        observed = self.world.observed()
        plan = plans.compute(owner, spec, observed, self.status, _at(seconds), backoff=BACKOFF)
        self.world.run(plan)
        new = statuses.compute(owner.generation, self.status, _at(seconds), statuses.World(spec, observed, plan))
        self.events += events.transitions(self.status, new)
        self.status = new
        return plan

    def running(self) -> dict[str, Any]:
        [job] = [j for j in self.world.of_kind("Job") if "conditions" not in j.get("status", {})]
        return job

    def fail(self, seconds: int, reason: str, message: str) -> dict[str, Any]:
        job = self.running()
        job["status"] = {"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
                                                      "lastTransitionTime": _at(seconds)}]}
        pod = job_pod(job, quantize_job.EXIT_CODES[reason], refused(reason, message))
        self.world.objects[("Pod", pod["metadata"]["name"])] = pod
        return job

    def succeed(self, artifact_id: str) -> None:
        job = self.running()
        job["status"] = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
        pod = job_pod(job, 0, published(artifact_id))
        self.world.objects[("Pod", pod["metadata"]["name"])] = pod

    def cond(self, kind: str) -> tuple[str, str, str]:
        c = conditions.find(self.status["conditions"], kind)
        assert c is not None
        return c["status"], c["reason"], c["message"]


def test_an_outage_is_retried_with_a_doubling_backoff_until_the_hub_answers() -> None:
    life = Outage(model())
    first = life.step(0)
    assert len(first.create) == 1
    down = "https://huggingface.co did not answer for BAAI/bge-reranker-v2-m3 after 4 attempts"
    life.fail(10, "HubUnavailable", down)

    waiting = life.step(11)
    assert waiting.create == () and waiting.artifact.pending is not None
    assert waiting.artifact.pending.state == "Waiting" and waiting.artifact.recheck_after == pytest.approx(29)
    status, reason, message = life.cond("ModelReady")
    assert (status, reason) == ("False", "HubUnavailable")
    assert down in message and "attempt 2 starts in 29 s" in message
    assert "nothing in the spec needs to change" in message
    assert life.status["phase"] == "Quantizing" and life.cond("Degraded")[0] == "False"
    assert [(e.type, e.reason) for e in life.events if e.reason == "HubUnavailable"] == [("Warning", "HubUnavailable")]
    assert life.step(39).create == ()  # one second early: still waiting

    retry = life.step(40)
    [second] = retry.create
    assert second["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "2"
    assert second["metadata"]["annotations"][names.ANNOTATION_TRANSIENT_RETRIES] == "1"
    assert life.status["pendingArtifact"]["attempts"] == 2
    life.step(41)
    assert [j["metadata"]["name"] for j in life.world.of_kind("Job")] == [second["metadata"]["name"]]

    # Still down: the next wait doubles (60 s), then is capped (120 s).
    life.fail(100, "HubUnavailable", down)
    assert life.step(101).artifact.recheck_after == pytest.approx(59)
    assert life.step(159).create == ()
    [third] = life.step(160).create
    assert third["metadata"]["annotations"][names.ANNOTATION_TRANSIENT_RETRIES] == "2"
    life.fail(200, "HubUnavailable", down)
    assert life.step(201).artifact.recheck_after == pytest.approx(119)
    [fourth] = life.step(320).create

    # The hub answers: the model is served, and no Job is started after it.
    life.succeed(artifact.artifact_id(spec_of(life.body)) or "")
    life.step(400)
    assert life.cond("ModelReady")[:2] == ("True", "ArtifactPublished")
    assert life.step(4000).create == ()
    assert fourth["metadata"]["annotations"][names.ANNOTATION_ATTEMPT] == "4"


def test_a_permanent_failure_after_an_outage_waits_for_a_fix() -> None:
    life = Outage(model())
    life.step(0)
    life.fail(5, "HubUnavailable", "down")
    life.step(40)
    life.fail(50, "ModelNotFound", "BAAI/bge-reranker-v2-m3 does not exist")
    assert life.step(51).create == ()
    assert life.step(100000).create == ()
    assert life.cond("ModelReady")[:2] == ("False", "ModelNotFound") and life.status["phase"] == "Failed"


def test_a_spec_change_during_the_backoff_starts_the_next_attempt_at_once() -> None:
    life = Outage(model())
    life.step(0)
    life.fail(5, "HubUnavailable", "down")
    life.step(6)
    life.body = model(set_("model.tokenSecretRef", {"name": "hf-2", "key": "token"}),
                      lambda b: b["metadata"].update(generation=2))
    assert len(life.step(7).create) == 1


def test_transient_failures_fail_the_job_at_once_for_the_operator_to_retry() -> None:
    """The quantizer retried within seconds; Kubernetes' pod backoff would only repeat that. The operator's new Job
    after minutes is the retry that spans an outage."""
    [fail_rule] = [r for r in jobs.pod_failure_policy()["rules"] if r["action"] == "FailJob"]
    codes = set(fail_rule["onExitCodes"]["values"])
    assert quantize_job.EXIT_CODES["HubUnavailable"] in codes and quantize_job.EXIT_CODES["ExportFailed"] not in codes
    assert set(quantize_job.TRANSIENT_FAILURES).isdisjoint(quantize_job.PERMANENT_FAILURES)


def test_backoff_doubles_and_is_capped() -> None:
    assert [job_outcome.RetryBackoff(30, 600).delay(n) for n in (1, 2, 3, 5, 6, 9)] == [30, 60, 120, 480, 600, 600]


# -- the class's way to the hub and its remote-code permission ---------------------------------------------------------
CLASS_HUB = {"endpoint": "https://hf-mirror.internal", "proxy": "http://proxy.internal:3128",
             "noProxy": "10.0.0.0/8,.svc"}


def _env(body: dict[str, Any]) -> dict[str, str]:
    spec = spec_of(body)
    job = jobs.build_job(owner_of(body), spec, "a1", 1, "claim")
    return {e["name"]: e.get("value", "") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_the_class_hub_reaches_the_job_and_a_tenant_cannot_set_its_own() -> None:
    tenant_spec = model(set_("model.hub", {"endpoint": "https://evil.example"}))["spec"]
    effective = resolve_spec(tenant_spec, {"modelSources": {"hub": CLASS_HUB}})
    env = _env({**model(), "spec": effective})
    assert env["HF_ENDPOINT"] == "https://hf-mirror.internal"
    assert env["HTTPS_PROXY"] == env["https_proxy"] == env["HTTP_PROXY"] == "http://proxy.internal:3128"
    assert env["NO_PROXY"] == env["no_proxy"] == "10.0.0.0/8,.svc"
    # No class hub: the tenant's own is dropped, and the Job goes to huggingface.co directly.
    alone = resolve_spec(tenant_spec, {"modelSources": {}})
    assert "hub" not in alone["model"] and "HF_ENDPOINT" not in _env({**model(), "spec": alone})
    assert "hub" not in resolve_spec(tenant_spec, None)["model"]
    assert spec_of({**model(), "spec": effective}).model.hub == HubAccess(
        "https://hf-mirror.internal", "http://proxy.internal:3128", "10.0.0.0/8,.svc")


def test_remote_code_is_passed_only_when_the_model_asks_and_the_class_allows() -> None:
    asks = model(set_("model.trustRemoteCode", True))
    job = jobs.build_job(owner_of(asks), spec_of(asks), "a1", 1, "claim")
    assert "--trust-remote-code" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    plain = jobs.build_job(owner_of(model()), spec_of(model()), "a1", 1, "claim")
    assert "--trust-remote-code" not in plain["spec"]["template"]["spec"]["containers"][0]["args"]
    assert violations(asks["spec"], {"modelSources": {}}, "std") == [
        "model.trustRemoteCode is not allowed by RerankClass std (modelSources.allowRemoteCode: false): the Job "
        "would run the Python code the model repository ships"]
    assert violations(asks["spec"], {"modelSources": {"allowRemoteCode": True}}) == []


def test_remote_code_and_the_hub_do_not_change_the_artifact() -> None:
    """The bytes depend on the weights and the recipe, not on the way they were fetched."""
    base = artifact.artifact_id(spec_of(model()))
    mirrored = resolve_spec(model()["spec"], {"modelSources": {"hub": CLASS_HUB}})
    assert artifact.artifact_id(spec_of({**model(), "spec": mirrored})) == base
