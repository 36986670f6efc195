"""rbac_rules.yaml covers what the operator does (and no more); the readiness chain reports the first problem."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rerank_operator.core.artifacts.decision import ArtifactDecision, Pending
from rerank_operator.core.builders.routing import Traffic
from rerank_operator.core.reconcile.observed import Observed
from rerank_operator.core.reconcile.plan import Plan
from rerank_operator.core.status import readiness
from tests.unit.operator.rerankmodel_gen import model, set_, spec_of

RULES = yaml.safe_load((Path(__file__).resolve().parents[3] / "operator/rerank_operator/rbac_rules.yaml").read_text())


def allowed(group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in RULES)


def test_rules_are_plain_policy_rules_without_wildcards() -> None:
    assert isinstance(RULES, list) and RULES
    for rule in RULES:
        assert set(rule) == {"apiGroups", "resources", "verbs"}
        assert "*" not in rule["resources"] + rule["verbs"] + rule["apiGroups"]


@pytest.mark.parametrize("group,resource,verbs,why", [
    ("rerank.io", "rerankmodels", ["list", "watch", "patch"],
     "an informer watches the models; the operator annotates them and removes an old finalizer"),
    ("rerank.io", "rerankmodels/status", ["patch"], "status is written with a merge patch"),
    ("rerank.io", "rerankmodels/finalizers", ["update"], "blockOwnerDeletion on children"),
    ("batch", "jobs", ["list", "watch", "create", "delete"], "Jobs are created once and cleaned up"),
    ("", "pods", ["list"], "termination messages are read from the quantizer's pods"),
    ("apps", "deployments", ["list", "watch", "create", "patch", "delete"], "server-side apply upserts"),
    ("", "services", ["list", "create", "patch", "delete"], "server-side apply upserts"),
    ("", "persistentvolumeclaims", ["get", "create", "patch"], "server-side apply upserts"),
    ("gateway.networking.k8s.io", "httproutes", ["list", "create", "patch", "delete"], "server-side apply upserts"),
    ("gateway.networking.k8s.io", "gateways", ["list", "watch"], "which GatewayClass a route's parent has"),
    ("gateway.networking.k8s.io", "gatewayclasses", ["list", "watch"], "the features a gateway supports"),
    ("", "events", ["create"], "Events on transitions"),
])
def test_what_the_operator_does_is_allowed(group: str, resource: str, verbs: list[str], why: str) -> None:
    assert all(allowed(group, resource, v) for v in verbs), why


@pytest.mark.parametrize("group,resource,verb", [
    ("", "secrets", "get"), ("", "configmaps", "get"), ("", "persistentvolumeclaims", "delete"),
    ("", "pods", "delete"), ("rbac.authorization.k8s.io", "roles", "create"),
    # Every write is a patch (server-side apply, merge patch) or a create: a PUT of a model, its status or a
    # NetworkPolicy would be a write nobody reviewed the need for. The guard's token needs no Secret access either.
    ("rerank.io", "rerankmodels", "update"), ("rerank.io", "rerankmodels/status", "update"),
    ("networking.k8s.io", "networkpolicies", "update"), ("", "secrets", "create"), ("", "secrets", "list"),
])
def test_what_the_operator_never_needs_is_not_granted(group: str, resource: str, verb: str) -> None:
    assert not allowed(group, resource, verb)


# --- readiness ---------------------------------------------------------------------------------------------------

SPEC = spec_of(model())
SERVING = Traffic(100, 0, "x")


def facts(plan: Plan, errors: tuple[str, ...] = (), observed: Observed | None = None) -> readiness.Facts:
    return readiness.Facts(SPEC, observed or Observed(), plan, errors)


def test_first_failing_check_wins() -> None:
    failed = Plan(artifact=ArtifactDecision("a", None,
                                            pending=Pending("a", "j", 1, "Failed", "QualityGateFailed", "m")),
                  traffic=SERVING)
    ready, verdict = readiness.evaluate(facts(failed, errors=("Service x: 403",)))
    assert (ready, verdict.reason) == (False, "ApplyFailed")
    ready, verdict = readiness.evaluate(facts(failed))
    assert (ready, verdict.reason) == (False, "QualityGateFailed")


def test_no_artifact_yet_means_awaiting() -> None:
    plan = Plan(artifact=ArtifactDecision("a", None), pools_deployed=False, traffic=SERVING)
    assert readiness.evaluate(facts(plan))[1].reason == "AwaitingArtifact"


def test_missing_existing_claim_is_named() -> None:
    spec = spec_of(model(set_("storage", {"existingClaim": "shared"})))
    plan = Plan(artifact=ArtifactDecision("a", {"id": "a"}), pools_deployed=True, traffic=SERVING)
    _ready, verdict = readiness.evaluate(readiness.Facts(spec, Observed(), plan))
    assert verdict.reason == "ClaimNotFound" and "shared" in verdict.message


def deployment(artifact: str, ready: int, want: int = 1, updated: int | None = None) -> dict[str, object]:
    return {"metadata": {"name": "d", "generation": 2, "annotations": {}},
            "spec": {"replicas": want, "template": {"metadata": {"annotations": {"rerank.io/artifact": artifact}}}},
            "status": {"observedGeneration": 2, "replicas": want, "readyReplicas": ready, "availableReplicas": ready,
                       "updatedReplicas": want if updated is None else updated}}


@pytest.mark.parametrize("cpu,gpu,reason", [
    (deployment("old", 1), deployment("new", 1), "RollingOut"),
    (deployment("new", 1, want=2, updated=1), deployment("new", 1), "RollingOut"),
    (deployment("new", 0), deployment("new", 1), "ReplicasUnavailable"),
    (deployment("new", 1), deployment("new", 1), "Serving"),
])
def test_pools_must_serve_the_new_artifact_and_be_available(cpu: dict, gpu: dict, reason: str) -> None:  # type: ignore[type-arg]
    plan = Plan(artifact=ArtifactDecision("new", {"id": "new"}), serving_artifact="new", pools_deployed=True,
                traffic=SERVING)
    observed = Observed(deployments={"cpu": cpu, "gpu": gpu})  # type: ignore[dict-item]
    ready, verdict = readiness.evaluate(facts(plan, observed=observed))
    assert verdict.reason == reason and ready is (reason == "Serving")
