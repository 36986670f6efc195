"""Scale to zero in the reconcile loop's plan: the route of a model going to, at or waking from zero points at the
activator with the contract's signed headers; the namespace's ReferenceGrant; the replicas; Ready; the operator's
flags and the model's NetworkPolicy peer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from rerank_contracts import activator
from rerank_operator import main
from rerank_operator.core import platform
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.reconcile.observed import Observed
from rerank_operator.core.settings import Settings
from rerank_operator.core.status import conditions, readiness
from rerank_operator.core.tenancy import tenant
from tests.unit.operator.rerankmodel_gen import FakeWorld, model, owner_of, set_, spec_of

KEY = b"k" * 40
ACTIVATOR = platform.Activator("http://act.rerank-system.svc:8080", "rerank-system", "act", 8080, KEY)
NOW = "2026-12-05T00:00:00Z"
GATEWAY = {"parentRefs": [{"name": "edge", "namespace": "infra"}]}


def sleepy(*more: Any) -> dict[str, Any]:
    return model(set_("quantization.enabled", False), set_("pools.gpu", {"enabled": False}),
                 set_("pools.cpu", {"minReplicas": 0, "maxReplicas": 4}),
                 set_("autoscaling", {"enabled": True, "idleSeconds": 120}), set_("routing", {"gateway": GATEWAY}),
                 *more)


def status_at(phase: str | None, cpu: int) -> dict[str, Any]:
    decision: dict[str, Any] = {"cpuReplicas": cpu, "gpuPercent": 0, "cpuPercent": 100, "reason": "test"}
    if phase is not None:
        decision["scaleToZero"] = phase
    return {"autoscaling": {"lastDecision": decision}}


def plan_for(body: dict[str, Any], status: dict[str, Any], observed: Observed | None = None,
             activator: platform.Activator | None = ACTIVATOR) -> plans.Plan:
    return plans.compute(owner_of(body), spec_of(body), observed or Observed(), status, NOW, activator=activator)


def route_of(plan: plans.Plan) -> dict[str, Any]:
    return next(o for o in plan.apply if o["kind"] == "HTTPRoute")


@pytest.mark.parametrize("phase", ["draining", "asleep", "waking"])
def test_a_model_going_to_at_or_waking_from_zero_is_routed_to_the_activator_with_signed_headers(phase: str) -> None:
    body = sleepy()
    plan = plan_for(body, status_at(phase, 0 if phase == "asleep" else 1))
    rule = route_of(plan)["spec"]["rules"][0]
    assert rule["timeouts"] == {"request": "60s"}
    assert rule["backendRefs"] == [{"group": "", "kind": "Service", "name": "act", "namespace": "rerank-system",
                                    "port": 8080, "weight": 1}]
    headers = {h["name"]: h["value"] for f in rule["filters"] for h in f["requestHeaderModifier"]["set"]}
    model_key, upstream = headers[activator.MODEL_HEADER], headers[activator.UPSTREAM_HEADER]
    assert model_key == "search/bge-m3" and upstream == "http://bge-m3-cpu.search.svc:80"
    # Verifies as the activator does.
    assert headers[activator.TOKEN_HEADER] == activator.token(KEY, model_key, upstream)
    assert activator.upstream_allowed(model_key, upstream)
    assert plan.zero == phase
    assert plan.replicas["cpu"] == (0 if phase == "asleep" else 1)


def test_awake_the_route_points_at_the_pools_and_without_an_activator_nothing_changes() -> None:
    body = sleepy()
    awake = route_of(plan_for(body, status_at("awake", 1)))["spec"]["rules"][0]
    assert [b["name"] for b in awake["backendRefs"]] == ["bge-m3-cpu"] and "filters" not in awake
    alone = route_of(plan_for(body, status_at("asleep", 0), activator=None))["spec"]["rules"][0]
    assert [b["name"] for b in alone["backendRefs"]] == ["bge-m3-cpu"]


def test_the_namespace_gets_one_reference_grant_for_the_activator_service() -> None:
    (grant,) = plan_for(sleepy(), status_at("awake", 1)).grants
    assert grant["metadata"]["namespace"] == "rerank-system"
    assert grant["spec"]["from"] == [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute",
                                      "namespace": "search"}]
    assert grant["spec"]["to"] == [{"group": "", "kind": "Service", "name": "act"}]
    # a model that never goes to zero asks for none
    normal = model(set_("quantization.enabled", False), set_("routing", {"gateway": GATEWAY}))
    assert plan_for(normal, {}).grants == ()


def test_a_new_model_that_may_sleep_starts_awake_on_one_cpu_replica() -> None:
    assert plan_for(sleepy(), {}).replicas["cpu"] == 1


def test_at_zero_the_model_is_ready_and_says_so() -> None:
    body = sleepy()
    world = FakeWorld()
    world.run(plan_for(body, status_at("awake", 1)))
    plan = plan_for(body, status_at("asleep", 0), world.observed())
    world.run(plan)
    plan = plan_for(body, status_at("asleep", 0), world.observed())
    ready, verdict = readiness.evaluate(readiness.Facts(spec_of(body), world.observed(), plan))
    assert ready and verdict.reason == conditions.REASON_SCALED_TO_ZERO and "asleep" in verdict.message


def test_the_model_network_policy_admits_the_activator_only_for_models_that_may_sleep() -> None:
    rclass = {"metadata": {"name": "c"}, "spec": {"network": {"routingNamespaces": ["infra"]}}}
    settings = Settings(operator_namespace="rerank-system", activator=ACTIVATOR)
    peer = {"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                                        "values": ["rerank-system"]}]},
            "podSelector": {"matchLabels": activator.POD_LABELS}}

    def tei_peers(body: dict[str, Any]) -> list[Any]:
        effective = body["spec"]
        policy = tenant.network_policy(body, tenant.Tenancy(rclass, effective), settings, spec_of(body))
        assert policy is not None
        return list(policy["spec"]["ingress"][0]["from"])

    assert peer in tei_peers(sleepy())
    assert peer not in tei_peers(model())


def test_the_operator_takes_the_activator_from_three_flags_together(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_bytes(KEY + b"\n")

    def parsed(**flags: str) -> platform.Activator | None:
        args = argparse.Namespace(activator_url="", activator_service="", activator_key_file="")
        for name, value in flags.items():
            setattr(args, name, value)
        return main.activator_from(args)

    got = parsed(activator_url="http://act.ns.svc:8080/", activator_service="ns/act:8080",
                 activator_key_file=str(key))
    assert got == platform.Activator("http://act.ns.svc:8080", "ns", "act", 8080, KEY)
    assert parsed() is None
    with pytest.raises(ValueError, match="go together"):
        parsed(activator_url="http://act.ns.svc:8080")
    with pytest.raises(ValueError, match="namespace"):
        parsed(activator_url="http://a:1", activator_service="act", activator_key_file=str(key))
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    with pytest.raises(ValueError, match="at least 32"):
        parsed(activator_url="http://a:1", activator_service="ns/act:8080", activator_key_file=str(short))
