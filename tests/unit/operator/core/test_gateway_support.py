"""What a model's gateway supports and says of its route (core/gateway.py), and what the plan and the status make of
it: a route never carries a filter its gateway does not list; a refused route shows in RouteAccepted and Ready."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rerank_contracts import quantize_job
from rerank_contracts.guard import MIRROR_TOKEN_ENV, SAMPLER_PORT
from rerank_operator.core import gateway, platform
from rerank_operator.core.artifacts import decision as decisions
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.gateway import GatewayView
from rerank_operator.core.quality import guard_policy
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions, events
from tests.unit.operator.rerankmodel_gen import FakeWorld, model, owner_of, published, set_, spec_of

NOW = "2025-01-01T00:00:00Z"
GATEWAY = {"gateway": {"parentRefs": [{"name": "edge", "namespace": "infra"}]}}
GUARD_ON: dict[str, Any] = {"qualityGuard": {"enabled": True, "sampleFraction": 0.05}}

#: GatewayClass status as Traefik v3 publishes it (no RequestMirror), and as a mirroring implementation would.
TRAEFIK_FEATURES = ["Gateway", "HTTPRoute", "HTTPRouteRequestTimeout", "ReferenceGrant"]


def gateway_class(features: list[Any] | None) -> dict[str, Any]:
    return {"kind": "GatewayClass", "metadata": {"name": "c"},
            "status": {} if features is None else {"supportedFeatures": features}}


def view(features: frozenset[str] | None, name: str = "edge") -> GatewayView:
    return GatewayView("infra", name, "c", features)


def test_supported_features_read_both_published_shapes_and_none_is_not_an_empty_list() -> None:
    assert gateway.supported_features(gateway_class([{"name": "HTTPRoute"}, {"name": "HTTPRouteRequestMirror"}])) \
        == {"HTTPRoute", "HTTPRouteRequestMirror"}  # v1.2+: objects
    assert gateway.supported_features(gateway_class(["HTTPRoute"])) == {"HTTPRoute"}  # before: strings
    assert gateway.supported_features(gateway_class(None)) is None
    assert gateway.supported_features(gateway_class([])) is None  # an empty list says nothing either
    assert gateway.supported_features(None) is None


def test_a_feature_is_supported_only_when_every_parent_lists_it() -> None:
    mirror = frozenset({gateway.REQUEST_MIRROR})
    assert gateway.support([view(mirror)], gateway.REQUEST_MIRROR) == "supported"
    lacks = view(frozenset({"HTTPRoute"}), "b")
    assert gateway.support([view(mirror), lacks], gateway.REQUEST_MIRROR) == "unsupported"
    assert gateway.support([view(mirror), view(None, "b")], gateway.REQUEST_MIRROR) == "unknown"
    assert gateway.support([], gateway.REQUEST_MIRROR) == "unknown"


def test_views_follow_each_parent_ref_to_its_gateway_and_class() -> None:
    gateways = {("infra", "edge"): {"spec": {"gatewayClassName": "traefik"}}}
    classes = {"traefik": gateway_class(TRAEFIK_FEATURES)}
    refs = [{"name": "edge", "namespace": "infra"}, {"name": "local"}, {"name": "x", "kind": "Service"}]
    found = gateway.views(refs, "team-a", lambda ns, n: gateways.get((ns, n)), classes.get)
    assert found == (GatewayView("infra", "edge", "traefik", frozenset(TRAEFIK_FEATURES)),
                     GatewayView("team-a", "local", None, None, found=False))


def route(parents: list[dict[str, Any]], generation: int = 2) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": "m", "generation": generation},
            "status": {"parents": parents}}


def parent(*conds: tuple[str, str, str], name: str = "edge", generation: int = 2) -> dict[str, Any]:
    return {"parentRef": {"name": name, "namespace": "infra"}, "controllerName": "traefik.io/gateway-controller",
            "conditions": [{"type": t, "status": s, "reason": r, "message": f"{r} said",
                            "observedGeneration": generation} for t, s, r in conds]}


EDGE = [("infra", "edge")]


@pytest.mark.parametrize("parents,state,reason", [
    ([parent(("Accepted", "True", "Accepted"), ("ResolvedRefs", "True", "ResolvedRefs"))], "accepted", "Accepted"),
    ([parent(("Accepted", "False", "NotAllowedByListeners"))], "refused", "NotAccepted"),
    ([parent(("Accepted", "True", "Accepted"), ("ResolvedRefs", "False", "RefNotPermitted"))], "refused",
     "RefsNotResolved"),
    ([], "pending", "RoutePending"),  # no controller has reported
    ([parent(("Accepted", "True", "Accepted"), name="other")], "pending", "RoutePending"),  # not our Gateway's word
    # A refusal of an older version of the route is not held against this one.
    ([parent(("Accepted", "False", "NotAllowedByListeners"), generation=1)], "pending", "RoutePending"),
])
def test_the_route_verdict_is_what_its_parents_said(parents: list[dict[str, Any]], state: str, reason: str) -> None:
    verdict = gateway.route_verdict(route(parents), EDGE)
    assert (verdict.state, verdict.reason) == (state, reason)
    if state == "refused":
        assert "infra/edge" in verdict.message and "said" in verdict.message  # the gateway's own words


def test_a_missing_route_is_pending() -> None:
    assert gateway.route_verdict(None, EDGE).state == "pending"


# --- what the plan writes -------------------------------------------------------------------------------------------

def plan_for(gateways: tuple[GatewayView, ...], class_spec: dict[str, Any] = GUARD_ON,
             observed_route: dict[str, Any] | None = None) -> tuple[plans.Plan, dict[str, Any]]:
    body = model(set_("routing", GATEWAY))
    spec = spec_of(body)
    artifact_id = str(artifact.artifact_id(spec))
    status = {"artifact": decisions.artifact_record(quantize_job.parse_result(published(artifact_id)), artifact_id,
                                                    NOW)}
    observed = dataclasses.replace(FakeWorld().observed(), gateways=gateways, route=observed_route)
    plan = plans.compute(owner_of(body), spec, observed, status, NOW,
                         guard_settings=platform.GuardSettings.from_class(class_spec))
    new_status = statuses.compute(1, status, NOW, statuses.World(spec, observed, plan))
    return plan, new_status


def filters_of(plan: plans.Plan) -> list[str]:
    [route_] = [o for o in plan.apply if o["kind"] == "HTTPRoute"]
    return [f["type"] for f in route_["spec"]["rules"][0].get("filters") or ()]


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    found = conditions.find(status["conditions"], kind)
    assert found is not None
    return dict(found)


def test_a_guarded_model_on_a_gateway_without_request_mirror_gets_no_mirror_and_says_so() -> None:
    plan, status = plan_for((view(frozenset(TRAEFIK_FEATURES)),))
    assert filters_of(plan) == []  # nothing the gateway could fail every request on
    assert any(o["metadata"]["name"].endswith("-guard") for o in plan.apply)  # the guard still runs
    features = condition(status, conditions.GATEWAY_FEATURES)
    assert (features["status"], features["reason"]) == ("False", conditions.REASON_FEATURE_UNSUPPORTED)
    assert "Gateway infra/edge" in features["message"] and gateway.REQUEST_MIRROR in features["message"]
    assert "sampler" in features["message"]


def test_a_gateway_that_publishes_no_features_is_not_trusted_with_a_mirror() -> None:
    plan, status = plan_for((view(None),))
    assert filters_of(plan) == []
    assert "publishes no supportedFeatures" in condition(status, conditions.GATEWAY_FEATURES)["message"]


def test_a_mirror_without_its_fraction_is_not_used() -> None:
    """The route's mirror copies ``fraction`` of the requests: a gateway that mirrors but does not list the fraction
    would copy every one of them to the guard."""
    plan, status = plan_for((view(frozenset({gateway.REQUEST_MIRROR})),))
    assert filters_of(plan) == []
    assert gateway.REQUEST_PERCENTAGE_MIRROR in condition(status, conditions.GATEWAY_FEATURES)["message"]


def test_a_gateway_that_lists_request_mirror_gets_the_mirror() -> None:
    plan, status = plan_for((view(frozenset({gateway.REQUEST_MIRROR, gateway.REQUEST_PERCENTAGE_MIRROR})),))
    assert filters_of(plan) == ["RequestHeaderModifier", "RequestMirror"]
    assert condition(status, conditions.GATEWAY_FEATURES)["status"] == "True"


@pytest.mark.parametrize("sampling,features,mirrored", [
    ("Mirror", None, True),  # the platform knows its gateway mirrors, though it publishes no list
    ("Sampler", frozenset({gateway.REQUEST_MIRROR}), False),
])
def test_the_class_can_choose_the_sample_source(sampling: str, features: frozenset[str] | None,
                                                mirrored: bool) -> None:
    klass = {"qualityGuard": {**GUARD_ON["qualityGuard"], "sampling": sampling}}
    plan, status = plan_for((view(features),), klass)
    assert ("RequestMirror" in filters_of(plan)) is mirrored
    assert condition(status, conditions.GATEWAY_FEATURES)["status"] == "True"  # chosen, not worked around


def test_sample_source_without_a_gateway_is_the_replay() -> None:
    settings = platform.GuardSettings()
    assert guard_policy.sample_source(spec_of(model()), settings, ()).mode == "replay"


def test_a_refused_route_shows_in_route_accepted_and_ready() -> None:
    refused = route([parent(("Accepted", "False", "NotAllowedByListeners"), generation=1)], generation=1)
    _, status = plan_for((view(frozenset(TRAEFIK_FEATURES)),), observed_route=refused)
    accepted = condition(status, conditions.ROUTE_ACCEPTED)
    assert (accepted["status"], accepted["reason"]) == ("False", conditions.REASON_NOT_ACCEPTED)
    assert "NotAllowedByListeners" in accepted["message"]
    ready = condition(status, conditions.READY)
    assert (ready["status"], ready["reason"]) == ("False", conditions.REASON_NOT_ACCEPTED)


def test_a_model_without_a_gateway_has_no_gateway_conditions() -> None:
    body = model()
    spec = spec_of(body)
    observed = FakeWorld().observed()
    plan = plans.compute(owner_of(body), spec, observed, {}, NOW)
    before = {"conditions": [{"type": conditions.ROUTE_ACCEPTED, "status": "True", "reason": "Accepted",
                              "message": "", "lastTransitionTime": NOW, "observedGeneration": 1}]}
    status = statuses.compute(2, before, NOW, statuses.World(spec, observed, plan))
    assert conditions.find(status["conditions"], conditions.ROUTE_ACCEPTED) is None
    assert conditions.find(status["conditions"], conditions.GATEWAY_FEATURES) is None


def containers_of(plan: plans.Plan, name: str) -> dict[str, dict[str, Any]]:
    [dep] = [o for o in plan.apply if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return {c["name"]: c for c in dep["spec"]["template"]["spec"]["containers"]}


def test_without_a_mirror_the_pool_pods_sample_for_the_guard_with_its_token() -> None:
    plan, _ = plan_for((view(frozenset(TRAEFIK_FEATURES)),))
    [guard_dep] = [o for o in plan.apply if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-guard")]
    guard_env = {e["name"]: e.get("value") for e in guard_dep["spec"]["template"]["spec"]["containers"][0]["env"]}
    for pool in ("bge-m3-cpu", "bge-m3-gpu"):
        tei, sampler = containers_of(plan, pool)["tei"], containers_of(plan, pool)["sampler"]
        # The pod's serving port is the sampler's; TEI keeps its own port for probes and scrapes.
        assert [(p["name"], p["containerPort"]) for p in tei["ports"]] == [("tei", 8080)]
        assert tei["readinessProbe"]["httpGet"]["port"] == "tei"
        assert ("http", SAMPLER_PORT) in [(p["name"], p["containerPort"]) for p in sampler["ports"]]
        args = sampler["args"]
        assert args[args.index("--guard-url") + 1] == "http://bge-m3-guard.search.svc:80"
        assert float(args[args.index("--fraction") + 1]) == 0.05  # the class's sampleFraction
        # The copies carry the token the guard checks.
        assert {e["name"]: e["value"] for e in sampler["env"]} == {MIRROR_TOKEN_ENV: guard_env[MIRROR_TOKEN_ENV]}
        assert sampler["securityContext"]["readOnlyRootFilesystem"] is True


def test_with_a_mirror_the_pool_pods_front_copies_nothing_but_still_answers_the_rerank_api() -> None:
    plan, _ = plan_for((view(frozenset({gateway.REQUEST_MIRROR, gateway.REQUEST_PERCENTAGE_MIRROR})),))
    pod = containers_of(plan, "bge-m3-cpu")
    assert list(pod) == ["tei", "sampler"] and pod["tei"]["ports"][0]["name"] == "tei"
    args = pod["sampler"]["args"]
    assert "--guard-url" not in args and "--fraction" not in args and "env" not in pod["sampler"]  # no copies
    assert [args[i + 1] for i, a in enumerate(args) if a == "--model-name"][:2] == ["bge-m3", "search/bge-m3"]
    assert args[args.index("--long-documents") + 1] == "truncate"


def status_with(*conds: tuple[str, str, str]) -> dict[str, Any]:
    return {"conditions": [{"type": t, "status": s, "reason": r, "message": f"{t} {r}"} for t, s, r in conds]}


def test_a_refused_route_and_a_missing_feature_are_posted_as_warnings_once() -> None:
    refused = status_with((conditions.ROUTE_ACCEPTED, "False", conditions.REASON_NOT_ACCEPTED),
                          (conditions.GATEWAY_FEATURES, "False", conditions.REASON_FEATURE_UNSUPPORTED))
    found = events.transitions({}, refused)
    assert [(e.type, e.reason) for e in found] == [("Warning", conditions.REASON_NOT_ACCEPTED),
                                                   ("Warning", conditions.REASON_FEATURE_UNSUPPORTED)]
    assert events.transitions(refused, refused) == []  # said once
    pending = status_with((conditions.ROUTE_ACCEPTED, "Unknown", conditions.REASON_ROUTE_PENDING))
    accepted = status_with((conditions.ROUTE_ACCEPTED, "True", conditions.REASON_ROUTE_ACCEPTED))
    assert events.transitions({}, pending) == [] and events.transitions(pending, accepted) == []  # no news
    [back] = events.transitions(refused, accepted)  # a recovery is
    assert (back.type, back.reason) == ("Normal", conditions.REASON_ROUTE_ACCEPTED)
