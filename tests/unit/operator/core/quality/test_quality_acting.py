"""The operator's side of the quality guard (issue 27): who gets a guard and what it is made of, reading its verdict
from what the real guard exports, and acting on it (routing, the autoscaler's policy, the status, Events)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quality_guard import compare, detector, endpoints, replay
from quality_guard.checks import Guard
from rerank_contracts import artifact_layout, quantize_job
from rerank_contracts.guard import (
    CONFIG_ENV,
    LOCAL_REFERENCE,
    MIRROR_TOKEN_ENV,
    MIRROR_TOKEN_HEADER,
    SAMPLER_PORT,
    Floor,
    GuardConfig,
)
from rerank_operator.core import gateway, names, platform
from rerank_operator.core.artifacts import decision as decisions
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.autoscale import split as splits
from rerank_operator.core.autoscale.history import History
from rerank_operator.core.autoscale.policy import Current, decide
from rerank_operator.core.autoscale.signals import Signals
from rerank_operator.core.builders import guard
from rerank_operator.core.gateway import GatewayView
from rerank_operator.core.quality import assessment as quality
from rerank_operator.core.quality import guard_policy
from rerank_operator.core.reconcile import plan as plans
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions
from rerank_operator.core.tenancy import network
from tests.unit.operator.core.autoscale.autoscale_helpers import pool, spec
from tests.unit.operator.rerankmodel_gen import FakeWorld, model, owner_of, published, set_, spec_of

NOW = "2025-01-01T00:00:00Z"
GATEWAY = {"gateway": {"parentRefs": [{"name": "edge", "namespace": "infra"}]}}
CLASS_SPEC: dict[str, Any] = {"qualityGuard": {"enabled": True, "sampleFraction": 0.02, "callsPerSecond": 3}}
SETTINGS = platform.GuardSettings.from_class(CLASS_SPEC)


def guarded_model(*mods: Any) -> dict[str, Any]:
    return model(set_("routing", GATEWAY), *mods)


def served(artifact_id: str) -> dict[str, Any]:
    result = quantize_job.parse_result(published(artifact_id, max_input_tokens=510))
    return {"artifact": decisions.artifact_record(result, artifact_id, NOW)}


#: The model's parent Gateway, on a class that lists RequestMirror (the guard's copy is the route's mirror).
MIRRORING = (GatewayView("infra", "edge", "envoy",
                         frozenset({gateway.REQUEST_MIRROR, gateway.REQUEST_PERCENTAGE_MIRROR})),)


def plan_for(body: dict[str, Any], status: dict[str, Any], world: FakeWorld | None = None,
             settings_: platform.GuardSettings | None = SETTINGS,
             gateways: tuple[GatewayView, ...] = MIRRORING) -> plans.Plan:
    world = world or FakeWorld()
    spec = spec_of(body)
    full = {**served(str(artifact.artifact_id(spec))), **status}
    observed = dataclasses.replace(world.observed(), gateways=gateways)
    return plans.compute(owner_of(body), spec, observed, full, NOW, guard_settings=settings_)


def by_kind(plan: plans.Plan, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in plan.apply if o["kind"] == kind}


# --- who is guarded, and the guard's objects ------------------------------------------------------------------------

def test_the_class_turns_the_guard_on_with_its_budget() -> None:
    assert platform.GuardSettings.from_class({}) is None
    assert platform.GuardSettings.from_class({"qualityGuard": {"enabled": False}}) is None
    assert platform.GuardSettings(sample_fraction=0.02, calls_per_second=3.0) == SETTINGS


@pytest.mark.parametrize("mods,why", [
    ((set_("pools.cpu.enabled", False),), "no CPU pool"),
    ((set_("quantization.enabled", False),), "quantization is disabled"),
])
def test_a_model_that_cannot_be_checked_gets_no_guard_and_says_why(mods: tuple[Any, ...], why: str) -> None:
    body = guarded_model(*mods)
    reason = guard_policy.unavailable(spec_of(body))
    assert reason is not None and why in reason
    assert guard_policy.unavailable(spec_of(guarded_model())) is None
    assert guard_policy.unavailable(spec_of(model())) is None  # without a Gateway: the guard replays (below)
    # FP32 in the guard:
    assert guard_policy.unavailable(spec_of(guarded_model(set_("pools.gpu.enabled", False)))) is None


@pytest.mark.parametrize("gateway", [True, False], ids=["mirrored", "replayed"])
def test_without_a_gpu_pool_the_guard_scores_fp32_from_the_served_artifacts_original_weights(gateway: bool) -> None:
    body = (guarded_model if gateway else model)(set_("pools.gpu.enabled", False))
    plan = plan_for(body, {})
    pod = by_kind(plan, "Deployment")["bge-m3-guard"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    config = GuardConfig.from_json(next(e["value"] for e in c["env"] if e["name"] == CONFIG_ENV))
    served = str(artifact.artifact_id(spec_of(body)))
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts[guard.ARTIFACT_MOUNT] == {"name": "models", "mountPath": guard.ARTIFACT_MOUNT, "readOnly": True,
                                            "subPath": f"{artifact_layout.ARTIFACTS_DIR}/{served}"}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": plan.claim, "readOnly": True}
    # PyTorch needs a writable temporary directory under the read-only root filesystem (it creates one at import).
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]] and not mounts["/tmp"].get("readOnly")
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HOME"] == "/tmp" and env["HF_HUB_OFFLINE"] == "1"
    # What the guard process makes of it: the FP32 reference over the mounted original/, and no GPU Service asked.
    assert config.reference == LOCAL_REFERENCE and config.reference_model == (
        f"{guard.ARTIFACT_MOUNT}/{artifact_layout.ORIGINAL_SUBDIR}")
    # It truncates long pairs as the checked pool does: the pool's token budget (the artifact's 510) and auto-truncate.
    cpu_args = by_kind(plan, "Deployment")["bge-m3-cpu"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert config.reference_max_batch_tokens == int(cpu_args[cpu_args.index("--max-batch-tokens") + 1]) == 510
    assert config.reference_auto_truncate == spec_of(body).cpu.tei.auto_truncate
    assert Guard(config).local is not None
    assert config.pools == {"cpu": "http://bge-m3-cpu.search.svc:80"} and "reference" not in config.api_key_env
    assert config.calls_per_sample == 2  # the budget counts the FP32 scoring as a call
    assert (config.replay is None) == gateway
    # The guard holds the weights: room for them, unless the class says otherwise.
    assert c["resources"] == {k: dict(v) for k, v in guard.LOCAL_REFERENCE_RESOURCES.items()}
    assert SETTINGS is not None
    sized = platform.GuardSettings(resources={"limits": {"memory": "20Gi"}})
    own = guard.build_guard_deployment(owner_of(body), spec_of(body), sized, (), claim="c", artifact_id=served)
    assert own["spec"]["template"]["spec"]["containers"][0]["resources"] == {"limits": {"memory": "20Gi"}}


def test_a_guard_gets_the_api_keys_of_the_pools_it_calls_only() -> None:
    key = {"apiKeySecretRef": {"name": "tei-key", "key": "k"}}
    old = {"apiKeySecretRef": {"name": "old", "key": "k"}}
    body = guarded_model(set_("pools.cpu.tei", key), set_("pools.gpu.tei", old), set_("pools.gpu.enabled", False))
    assert SETTINGS is not None
    c = guard.build_guard_deployment(owner_of(body), spec_of(body), SETTINGS, ())["spec"]["template"]["spec"][
        "containers"][0]
    secrets = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if "valueFrom" in e}
    assert secrets == {"tei-key"}  # the disabled GPU pool's Secret may be gone: it must not block the guard pod


def test_the_guard_deployment_runs_the_guard_with_the_models_floor_and_budget() -> None:
    body = guarded_model(set_("quantization.qualityGate", {"minSpearman": 0.995, "minTopKAgreement": 0.8,
                                                           "topK": 5}))
    assert SETTINGS is not None
    dep = guard.build_guard_deployment(owner_of(body), spec_of(body), SETTINGS, below_floor={"cpu"})
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["command"][:3] == ["python", "-m", "quality_guard.server"]
    raw = next(e["value"] for e in c["env"] if e["name"] == CONFIG_ENV)
    config = GuardConfig.from_json(raw)  # what the guard process will parse
    assert (config.namespace, config.model) == ("search", "bge-m3")
    assert config.floor == Floor(min_spearman=0.995, min_topk_agreement=0.8) and config.k == 5
    assert config.pools == {"cpu": "http://bge-m3-cpu.search.svc:80"}
    assert config.reference == "http://bge-m3-gpu.search.svc:80"
    assert config.calls_per_second == 3.0 and config.fraction == 1.0  # the mirror samples
    assert config.below_floor == ("cpu",)
    assert Guard(config).detectors["cpu"].state == "below_floor"  # a restarted guard keeps the verdict
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["image"] == spec_of(body).quantization.image
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert names.LABEL_POOL not in labels  # never selected as a pool, by the model Service or the autoscaler
    svc = guard.build_guard_service(owner_of(body))
    assert all(labels.get(k) == v for k, v in svc["spec"]["selector"].items())


def test_api_keys_of_the_pools_reach_the_guard_from_their_secrets() -> None:
    key = {"apiKeySecretRef": {"name": "tei-key", "key": "k"}}
    body = guarded_model(set_("pools.cpu.tei", key), set_("pools.gpu.tei", key))
    assert SETTINGS is not None
    c = guard.build_guard_deployment(owner_of(body), spec_of(body), SETTINGS, ())["spec"]["template"]["spec"][
        "containers"][0]
    config = GuardConfig.from_json(next(e["value"] for e in c["env"] if e["name"] == CONFIG_ENV))
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in c["env"] if "valueFrom" in e}
    assert set(secrets) == set(config.api_key_env.values()) and len(secrets) == 2
    environ = {var: f"key-of-{name}" for name, var in config.api_key_env.items()}
    assert endpoints.api_keys(config, environ) == {config.reference: "key-of-reference",
                                                 config.pools["cpu"]: "key-of-cpu"}


def test_the_route_mirrors_the_class_fraction_to_the_guard_and_the_plan_adds_the_guard() -> None:
    plan = plan_for(guarded_model(), {})
    route = by_kind(plan, "HTTPRoute")["bge-m3"]
    header, mirror = route["spec"]["rules"][0]["filters"]  # the token first, so the mirrored copy carries it
    assert mirror["type"] == "RequestMirror"
    assert mirror["requestMirror"]["backendRef"] == {"name": "bge-m3-guard", "port": names.SERVICE_PORT}
    fraction = mirror["requestMirror"]["fraction"]
    assert fraction["numerator"] / fraction["denominator"] == pytest.approx(0.02)
    assert "bge-m3-guard" in by_kind(plan, "Deployment") and "bge-m3-guard" in by_kind(plan, "Service")
    assert header["type"] == "RequestHeaderModifier" and list(header["requestHeaderModifier"]) == ["set"]
    ((sent,),) = [header["requestHeaderModifier"]["set"]]
    assert sent["name"] == MIRROR_TOKEN_HEADER and len(sent["value"]) >= 32


def test_the_guard_takes_only_the_token_its_route_sets_and_keeps_it_across_reconciles() -> None:
    """The token on the route is the one the guard's pod is given; a second reconcile (or another replica after a
    failover) reads it back from the guard's Deployment instead of making a new one; a guard made anew gets a new
    one."""
    world = FakeWorld()
    body = guarded_model()
    first = plan_for(body, {}, world)
    world.run(first)
    second = plan_for(body, {}, world)

    def token_of(plan: plans.Plan) -> tuple[str, str]:
        route = world.objects[("HTTPRoute", "bge-m3")] if not by_kind(plan, "HTTPRoute") else by_kind(
            plan, "HTTPRoute")["bge-m3"]
        sent = route["spec"]["rules"][0]["filters"][0]["requestHeaderModifier"]["set"][0]["value"]
        dep = by_kind(plan, "Deployment").get("bge-m3-guard") or world.objects[("Deployment", "bge-m3-guard")]
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        config = GuardConfig.from_json(env[CONFIG_ENV])
        assert config.mirror_token_env == MIRROR_TOKEN_ENV
        return sent, str(env[MIRROR_TOKEN_ENV])

    sent, given_ = token_of(first)
    assert sent == given_
    assert token_of(second) == (sent, given_)
    world.run(second)  # the pools are ready now: the split moved; from here on nothing is re-applied
    settled = plan_for(body, {}, world)
    assert not {"HTTPRoute", "Deployment"} & {o["kind"] for o in settled.apply}
    elsewhere = plan_for(body, {})  # a model whose guard does not exist yet (another one, or after a re-create)
    assert by_kind(elsewhere, "HTTPRoute")["bge-m3"]["spec"]["rules"][0]["filters"][0]["requestHeaderModifier"][
        "set"][0]["value"] != sent


def test_without_a_gateway_the_guard_replays_the_served_artifacts_evaluation_pairs() -> None:
    body = model()  # no routing.gateway: nothing to mirror from
    plan = plan_for(body, {})
    dep = by_kind(plan, "Deployment")["bge-m3-guard"]
    pod = dep["spec"]["template"]["spec"]
    (mount,) = pod["containers"][0]["volumeMounts"]
    served = str(artifact.artifact_id(spec_of(body)))
    assert mount == {"name": "models", "mountPath": guard.ARTIFACT_MOUNT, "readOnly": True,
                     "subPath": f"{artifact_layout.ARTIFACTS_DIR}/{served}"}
    assert pod["volumes"][0]["persistentVolumeClaim"] == {"claimName": plan.claim, "readOnly": True}
    env = pod["containers"][0]["env"]
    config = GuardConfig.from_json(next(e["value"] for e in env if e["name"] == CONFIG_ENV))
    assert config.replay == f"{guard.ARTIFACT_MOUNT}/{artifact_layout.EVALUATION_FILE}"
    assert config.replay_per_second == pytest.approx(3.0 / 2)  # the budget: a replay costs the pool + the reference
    assert "HTTPRoute" not in {o["kind"] for o in plan.apply}
    # With a Gateway it mirrors instead, and mounts nothing.
    mirrored = by_kind(plan_for(guarded_model(), {}), "Deployment")["bge-m3-guard"]["spec"]["template"]["spec"]
    assert "volumes" not in mirrored and "volumeMounts" not in mirrored["containers"][0]


def test_replayed_bodies_are_rankings_of_at_most_16_texts_and_the_replayer_paces_them(tmp_path: Path) -> None:
    pairs = tmp_path / "evaluation.jsonl"
    lines = [{"query": "q1", "text": f"t{i}"} for i in range(40)] + [{"query": "q2", "text": "a"},
                                                                      {"query": "q2", "text": "b"},
                                                                      {"query": "q3", "text": "alone"}]
    pairs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    bodies = replay.replay_bodies(str(pairs))
    assert [(b["query"], len(b["texts"])) for b in bodies] == [("q1", replay.REPLAY_MAX_TEXTS), ("q2", 2)]
    assert set(bodies[0]["texts"]) <= {f"t{i}" for i in range(40)}

    class Counting:
        def __init__(self) -> None:
            self.n = 0

        def submit(self, body: Any) -> bool:
            self.n += 1
            return True

    sink = Counting()
    replayer = replay.Replayer(sink, bodies, per_second=50.0).start()  # type: ignore[arg-type]
    time.sleep(0.5)
    replayer.stop()
    assert 10 <= sink.n <= 30  # ~25 at 50/s over 0.5 s, paced rather than burst


def test_a_guard_that_is_no_longer_wanted_is_deleted_and_the_mirror_goes() -> None:
    world = FakeWorld()
    body = guarded_model()
    for _ in range(3):
        world.run(plan_for(body, {}, world))
    assert ("Deployment", "bge-m3-guard") in world.objects
    assert plan_for(body, {}, world).writes == 0  # idle once applied
    off = plan_for(body, {}, world, settings_=None)
    assert {(r.kind, r.name) for r in off.delete} >= {("Deployment", "bge-m3-guard"), ("Service", "bge-m3-guard")}
    route = by_kind(off, "HTTPRoute")["bge-m3"]
    assert "filters" not in route["spec"]["rules"][0]


def test_the_network_policy_admits_the_guard_when_the_namespace_is_not() -> None:
    body = guarded_model()
    rclass = {"spec": {"network": {"allowSameNamespace": False}, **CLASS_SPEC}}
    policy = network.build_network_policy(body, rclass)
    assert policy is not None
    peers = policy["spec"]["ingress"][0]["from"]
    guard_pod = guard.build_guard_deployment(owner_of(body), spec_of(body), SETTINGS or platform.GuardSettings(),
                                             ())["spec"]["template"]["metadata"]["labels"]
    assert any(all(guard_pod.get(k) == v for k, v in p.get("podSelector", {}).get("matchLabels", {}).items())
               and "namespaceSelector" not in p and p.get("podSelector", {}).get("matchLabels") for p in peers)
    unguarded = network.build_network_policy(body, {"spec": {"network": {"allowSameNamespace": False}}})
    assert unguarded is not None and not unguarded["spec"].get("ingress")


def test_the_network_policy_lets_a_guarded_models_pool_pods_sample_for_its_guard() -> None:
    """On a gateway without RequestMirror the pool pods' sampler serves on its own port and posts the copies to the
    guard: both are admitted, for this model's own serving pods only."""
    body = guarded_model()
    policy = network.build_network_policy(body, {"spec": {"network": {"routingNamespaces": ["infra"]}, **CLASS_SPEC}})
    assert policy is not None
    tei, guard_ingress = policy["spec"]["ingress"]
    assert {p["port"] for p in tei["ports"]} == {names.TEI_PORT, SAMPLER_PORT}
    assert names.GUARD_PORT not in {p["port"] for p in tei["ports"]}  # the policy selects the guard's pod too
    pools = {"podSelector": {"matchLabels": {names.LABEL_NAME: names.APP_NAME, names.LABEL_INSTANCE: "bge-m3",
                                             names.LABEL_SERVING: "true"}}}
    assert pools in guard_ingress["from"] and guard_ingress["ports"] == [{"protocol": "TCP", "port": names.GUARD_PORT}]
    plain = network.build_network_policy(body, {"spec": {"network": {"routingNamespaces": ["infra"]}}})
    assert plain is not None  # every model's pods run the front (the rerank API): its port is open, no guard's is
    assert [p["port"] for p in plain["spec"]["ingress"][0]["ports"]] == [names.TEI_PORT, SAMPLER_PORT]


# --- the verdict, as the real guard exports it --------------------------------------------------------------------

def guard_with(state: str) -> Guard:
    """A real guard whose CPU pool is healthy or reversed (a ranking upside down), fed until it has decided."""
    evidence = detector.Settings(window=20, min_samples=10, recovery_window=40, check_every=1, max_failure_rate=0.1)
    config = GuardConfig(namespace="search", model="bge-m3", pools={"cpu": "http://cpu"}, reference="http://gpu",
                         evidence=dataclasses.asdict(evidence), fraction=1.0, calls_per_second=1e6)

    def post(base: str, body: Any) -> list[float]:
        scores = [float(len(t)) for t in body["texts"]]
        return [-s for s in scores] if base == "http://cpu" and state == "broken" else scores

    g = Guard(config, post=post)
    body = {"query": "q", "texts": [f"passage {'x' * i}" for i in range(8)]}
    for _ in range(30):
        assert g.offer(body)
        g.check(body)
    return g


def test_the_verdict_is_read_from_what_the_real_guard_exports() -> None:
    healthy = quality.parse_metrics(guard_with("healthy").metrics().decode(), "search", "bge-m3")
    assert healthy.error is None and healthy.below_floor == frozenset()
    assert healthy.pools["cpu"].window_requests == 20 and healthy.pools["cpu"].spearman == pytest.approx(1.0)
    broken = quality.parse_metrics(guard_with("broken").metrics().decode(), "search", "bge-m3")
    assert broken.below_floor == {"cpu"}
    # Why it flipped, in the guard's words: what the condition quotes (fixed until the next transition).
    assert "10 of the last 10 sampled requests failed" in broken.pools["cpu"].reason
    assert healthy.pools["cpu"].reason == "no evidence yet"
    cond = quality.condition(broken, None, frozenset({"cpu"}), {"gpu": 1, "cpu": 1})
    assert broken.pools["cpu"].reason in cond.message
    assert broken.pools["cpu"].spearman is not None and broken.pools["cpu"].spearman < 0
    # Another model's page (a misrouted address) is no verdict at all, and neither is an error page.
    other = quality.parse_metrics(guard_with("broken").metrics().decode(), "search", "other")
    assert other.error is not None and not other.pools
    assert quality.parse_metrics("<html>oops</html>", "search", "bge-m3").error is not None


def test_a_guard_without_figures_yet_is_pending_not_verified() -> None:
    fresh = Guard(GuardConfig(namespace="search", model="bge-m3", pools={"cpu": "a"}, reference="b"),
                         post=lambda base, body: [0.0])
    verdict = quality.parse_metrics(fresh.metrics().decode(), "search", "bge-m3")
    cond = quality.condition(verdict, None, frozenset(), {"gpu": 1, "cpu": 1})
    assert (cond.status, cond.reason) == ("Unknown", conditions.REASON_GUARD_PENDING)


# --- acting on it ---------------------------------------------------------------------------------------------------

def below(*pools: str) -> quality.Verdict:
    return quality.Verdict({p: quality.PoolQuality(below_floor=p in pools, window_requests=100, spearman=0.93,
                                                   spearman_low=0.91, topk_agreement=0.7) for p in ("cpu",)})


def test_assess_flips_the_condition_posts_events_and_keeps_the_verdict_when_the_guard_is_silent() -> None:
    ready = {"gpu": 2, "cpu": 1}
    out = quality.assess({}, below("cpu"), None, ready, "bge-m3-guard")
    assert out.below_floor == {"cpu"} and out.record["belowFloor"] == ["cpu"]
    assert (out.condition.status, out.condition.reason) == ("False", conditions.REASON_BELOW_FLOOR)
    assert "0.93" in out.condition.message and "GPU pool" in out.condition.message
    assert [(e.type, e.reason) for e in out.events] == [("Warning", conditions.REASON_BELOW_FLOOR)]
    status = {"quality": out.record}
    for silent in (None, quality.Verdict(error="timed out")):  # no ready pod, or no answer: keep the pool out
        kept = quality.assess(status, silent, None, ready, "bge-m3-guard")
        assert kept.below_floor == {"cpu"} and kept.events == () and kept.condition.status == "False"
    back = quality.assess(status, below(), None, ready, "bge-m3-guard")
    assert back.below_floor == frozenset() and back.condition.status == "True"
    assert [(e.type, e.reason) for e in back.events] == [("Normal", conditions.REASON_QUALITY_RESTORED)]
    gone = quality.assess(status, None, "no CPU pool", ready, "bge-m3-guard")
    assert gone.below_floor == frozenset() and gone.condition.reason == conditions.REASON_GUARD_NOT_APPLICABLE


def test_a_model_checked_against_fp32_in_the_guard_says_so() -> None:
    ref = guard.reference_of(spec_of(model(set_("pools.gpu.enabled", False))))
    assert ref == guard.REFERENCE_FP32 and guard.reference_of(spec_of(model())) == platform.REFERENCE
    out = quality.assess({}, below("cpu"), None, {"cpu": 1, "gpu": 0}, "bge-m3-guard", reference=ref)
    assert out.record["reference"] == "fp32" and "FP32 of the original weights" in out.condition.message
    assert "vs the GPU pool" not in out.condition.message
    # Nothing else can serve: the CPU pool keeps its traffic, and the condition says so.
    assert "it keeps serving: the model has no other pool" in out.condition.message
    back = quality.assess({"quality": out.record}, below(), None, {"cpu": 1}, "bge-m3-guard", reference=ref)
    assert back.condition.status == "True" and "vs FP32 of the original weights" in back.condition.message


def test_routing_keeps_traffic_away_from_a_pool_below_the_floor_only_while_the_other_can_serve() -> None:
    s = spec_of(guarded_model(set_("routing.policy", "fixed"), set_("routing.weights", {"gpu": 50, "cpu": 50})))
    assert splits.split(s, 2, 2).cpu_percent == 50
    assert (splits.split(s, 2, 2, below_floor={"cpu"}).cpu_percent,
            splits.split(s, 2, 2, below_floor={"gpu"}).gpu_percent) == (0, 0)
    assert splits.split(s, 0, 2, below_floor={"cpu"}).cpu_percent == 100  # a worse ranking beats no answer
    assert splits.split(s, 2, 2, below_floor={"cpu", "gpu"}).cpu_percent == 50  # nothing better to send it to
    # The reconcile loop reads it from the status the autoscaler recorded (once the pools have ready replicas).
    body = guarded_model(set_("routing.policy", "fixed"), set_("routing.weights", {"gpu": 50, "cpu": 50}))
    world = FakeWorld()
    for _ in range(2):
        world.run(plan_for(body, {}, world))
    plan = plan_for(body, {"quality": {"guard": "bge-m3-guard", "belowFloor": ["cpu"]}}, world)
    weights = {b["name"]: b["weight"] for b in by_kind(plan, "HTTPRoute")["bge-m3"]["spec"]["rules"][0]["backendRefs"]}
    assert weights == {"bge-m3-gpu": 100, "bge-m3-cpu": 0}


def test_the_policy_sizes_the_gpu_for_everything_while_the_cpu_pool_is_below_the_floor() -> None:
    # A burst the GPU cannot take alone: normally part of it spills to the CPU pool.
    hot = Signals(pool(2, rate=400, p95=600, queue=30), pool(2, rate=100, p95=200))
    normal = decide(spec(gpu=(1, 10)), hot, Current(2, 2, 20), History(), 10_000.0)
    assert normal.cpu_percent > 0
    guarded = decide(spec(gpu=(1, 10)), Signals(hot.gpu, hot.cpu, below_floor=frozenset({"cpu"})),
                     Current(2, 2, 20), History(), 10_000.0)
    assert guarded.cpu_percent == 0 and guarded.gpu_replicas > 2
    assert "quality floor" in guarded.reason


@settings(max_examples=200, deadline=None)
@given(gpu_ready=st.integers(0, 4), cpu_ready=st.integers(0, 4), cpu_percent=st.integers(0, 100),
       rate=st.floats(0, 800), p95=st.floats(10, 2000), quality_below=st.sampled_from(["cpu", "gpu"]))
def test_a_pool_below_the_floor_never_gets_traffic_while_the_other_has_ready_replicas(
        gpu_ready: int, cpu_ready: int, cpu_percent: int, rate: float, p95: float, quality_below: str) -> None:
    signals = Signals(pool(gpu_ready, rate=rate, p95=p95), pool(cpu_ready, rate=rate / 4, p95=p95),
                      below_floor=frozenset({quality_below}))
    d = decide(spec(gpu=(1, 4), cpu=(1, 6)), signals, Current(max(gpu_ready, 1), max(cpu_ready, 1), cpu_percent),
               History(), 10_000.0)
    other_ready = cpu_ready if quality_below == "gpu" else gpu_ready
    share = d.cpu_percent if quality_below == "cpu" else d.gpu_percent
    if other_ready > 0:
        assert share == 0, d.reason


def test_the_autoscalers_status_part_carries_the_quality_record_and_its_condition() -> None:
    out = quality.assess({}, below("cpu"), None, {"gpu": 1, "cpu": 1}, "bge-m3-guard")
    patch = statuses.autoscaler_patch({}, None, [out.condition], generation=3, now=NOW, quality=out.record)
    assert patch["quality"]["belowFloor"] == ["cpu"]
    (cond,) = patch["conditions"]
    assert (cond["type"], cond["observedGeneration"]) == (conditions.QUALITY_VERIFIED, 3)
    # Same verdict, new figures: nothing material, nothing written.
    again = quality.assess(patch, below("cpu"), None, {"gpu": 1, "cpu": 1}, "bge-m3-guard")
    assert statuses.autoscaler_patch(patch, None, [again.condition], generation=3, now=NOW,
                                     quality=again.record) == {}
    # The class turns the guard off: the record and the condition go.
    off = statuses.autoscaler_patch(patch, None, [], generation=3, now=NOW)
    assert off["quality"] is None and off["conditions"] == []


def test_compare_agreement_is_what_the_detector_is_fed() -> None:
    # The guard's own comparison of a reversed ranking: the request counts as failed (what flips a pool).
    a = compare.agreement([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0], k=3, raw=False)
    assert detector.Detector().failed(a)


# --- canary rollouts ------------------------------------------------------------------------------------------------

class GuardedLife:
    """plan -> fake API server -> status, for a guarded model (as test_lifecycle.Life, with the class's guard), and
    the autoscaler's half: the guard's verdict recorded as the autoscaler records it."""

    def __init__(self, body: dict[str, Any], settings_: platform.GuardSettings | None = SETTINGS) -> None:
        self.body, self.settings = body, settings_
        self.world = FakeWorld()
        self.status: dict[str, Any] = {}
        self.events: list[str] = []

    def step(self, body: dict[str, Any] | None = None) -> plans.Plan:
        from rerank_operator.core.status import events
        self.body = body or self.body
        owner, spec = owner_of(self.body), spec_of(self.body)
        observed = self.world.observed()
        plan = plans.compute(owner, spec, observed, self.status, NOW, guard_settings=self.settings)
        self.world.run(plan)
        new = statuses.compute(owner.generation, self.status, NOW, statuses.World(spec, observed, plan))
        self.events += [e.reason for e in events.transitions(self.status, new)]
        self.status = new
        return plan

    def settle(self) -> None:
        for _ in range(4):
            if self.step().writes == 0:
                break
        assert self.step().writes == 0

    def finish_job(self) -> str:
        from tests.unit.operator.rerankmodel_gen import finish, job_pod
        desired = str(artifact.artifact_id(spec_of(self.body)))
        [job] = [j for j in self.world.of_kind("Job") if "conditions" not in j.get("status", {})]
        self.world.objects[("Job", job["metadata"]["name"])] = finish(job, True)
        pod = job_pod(job, 0, published(desired))
        self.world.objects[("Pod", pod["metadata"]["name"])] = pod
        return desired

    def guard_says(self, canary: quality.PoolQuality) -> quality.Assessment:
        """One autoscaler tick: the guard's verdict (the CPU pool healthy, the canary as given), recorded."""
        verdict = quality.Verdict({"cpu": quality.PoolQuality(False, 100, 500), names.CANARY: canary})
        assert self.settings is not None
        out = quality.assess(self.status, verdict, None, {"gpu": 1, "cpu": 1}, "bge-m3-guard",
                             self.settings.canary_requests)
        patch = statuses.autoscaler_patch(self.status, None, [out.condition], generation=1, now=NOW,
                                          quality=out.record)
        self.status = statuses.autoscaler_part(self.status, None, [out.condition], generation=1, now=NOW,
                                               quality=out.record) if patch else self.status
        return out

    def cond(self, kind: str) -> tuple[str, str]:
        c = conditions.find(self.status["conditions"], kind)
        assert c is not None
        return c["status"], c["reason"]

    def served(self, name: str) -> str | None:
        from rerank_operator.core.builders import deployment
        return deployment.served_artifact(self.world.objects.get(("Deployment", name)))


def new_recipe(body: dict[str, Any]) -> dict[str, Any]:
    """The same weights, another artifact: what a class default or a quantization setting change does."""
    changed = set_("quantization.perChannel", False)
    out = json.loads(json.dumps(body))
    changed(out)
    out["metadata"]["generation"] = 2
    return out


def canary_running() -> tuple[GuardedLife, str, str]:
    life = GuardedLife(guarded_model())
    life.step()
    stable = life.finish_job()
    life.settle()
    assert life.status["artifact"]["id"] == stable and life.status["artifact"]["source"]
    life.step(new_recipe(life.body))
    canary = life.finish_job()
    life.settle()
    return life, stable, canary


def test_a_new_artifact_from_the_same_weights_first_serves_as_a_canary() -> None:
    life, stable, canary = canary_running()
    assert life.status["artifact"]["id"] == stable  # the stable artifact keeps serving
    assert life.status["canary"]["state"] == "Running" and life.status["canary"]["artifact"]["id"] == canary
    assert life.served("bge-m3-cpu") == stable and life.served("bge-m3-canary") == canary
    assert life.world.objects[("Deployment", "bge-m3-canary")]["spec"]["replicas"] == 1
    assert names.LABEL_POOL not in life.world.objects[("Deployment", "bge-m3-canary")]["spec"]["template"][
        "metadata"]["labels"]
    route = life.world.objects[("HTTPRoute", "bge-m3")]
    weights = {b["name"]: b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]}
    assert weights["bge-m3-canary"] / sum(weights.values()) == pytest.approx(0.05)
    env = life.world.objects[("Deployment", "bge-m3-guard")]["spec"]["template"]["spec"]["containers"][0]["env"]
    config = GuardConfig.from_json(next(e["value"] for e in env if e["name"] == CONFIG_ENV))
    assert set(config.pools) == {"cpu", names.CANARY}
    assert life.cond("Ready") == ("False", conditions.REASON_CANARY) and life.status["phase"] == "Progressing"
    assert life.cond("Degraded")[0] == "False"


def test_a_canary_within_the_floor_is_promoted_after_enough_compared_requests() -> None:
    life, stable, canary = canary_running()
    assert SETTINGS is not None
    early = life.guard_says(quality.PoolQuality(False, 100, SETTINGS.canary_requests - 1))
    assert early.record["canary"]["verdict"] == "running" and not early.canary_decided
    life.settle()
    assert life.status["canary"]["state"] == "Running"
    done = life.guard_says(quality.PoolQuality(False, 100, SETTINGS.canary_requests))
    assert done.record["canary"]["verdict"] == "promote" and done.canary_decided
    life.settle()
    assert life.status["artifact"]["id"] == canary and "canary" not in life.status
    assert life.served("bge-m3-cpu") == life.served("bge-m3-gpu") == canary
    assert ("Deployment", "bge-m3-canary") not in life.world.objects
    assert ("Service", "bge-m3-canary") not in life.world.objects
    assert life.cond("Ready") == ("True", conditions.REASON_SERVING)
    weights = [b["name"] for b in life.world.objects[("HTTPRoute", "bge-m3")]["spec"]["rules"][0]["backendRefs"]]
    assert "bge-m3-canary" not in weights and stable != canary


def test_a_canary_below_the_floor_is_rolled_back_and_not_tried_again() -> None:
    life, stable, _ = canary_running()
    out = life.guard_says(quality.PoolQuality(True, 60, 60, spearman=0.9))
    assert out.record["canary"]["verdict"] == "rollback" and out.canary_decided
    life.settle()
    assert life.status["artifact"]["id"] == stable and life.served("bge-m3-cpu") == stable
    assert life.status["canary"]["state"] == "RolledBack" and "0.9" in life.status["canary"]["message"]
    assert ("Deployment", "bge-m3-canary") not in life.world.objects
    assert life.cond("Degraded") == ("True", conditions.REASON_CANARY_ROLLED_BACK)
    assert life.cond("Ready") == ("False", conditions.REASON_CANARY_ROLLED_BACK)
    assert life.status["phase"] == "Degraded" and conditions.REASON_CANARY_ROLLED_BACK in life.events
    jobs = len(life.world.of_kind("Job"))
    life.settle()  # nothing more: no new Job, no new canary, for this spec
    assert len(life.world.of_kind("Job")) == jobs and life.status["canary"]["state"] == "RolledBack"
    # A later guard that forgot everything does not undo the decision.
    assert life.guard_says(quality.PoolQuality(False, 100, 1000)).record.get("canary") is None


def test_other_weights_or_no_guard_publish_at_once_as_before() -> None:
    life = GuardedLife(guarded_model())
    life.step()
    life.finish_job()
    life.settle()
    newer = guarded_model(set_("model.revision", "0" * 40), lambda b: b["metadata"].update(generation=2))
    life.step(newer)
    published_id = life.finish_job()
    life.settle()
    assert life.status["artifact"]["id"] == published_id and "canary" not in life.status  # a new GPU reference too
    unguarded, _, canary = canary_running()
    unguarded.settings = None  # the class turns the guard off mid-canary: nobody left to judge, it serves
    unguarded.settle()
    assert unguarded.status["artifact"]["id"] == canary and "canary" not in unguarded.status


def test_argo_cd_shows_progressing_during_a_canary_and_degraded_after_a_rollback() -> None:
    from tests.unit.project.test_argocd_health import HEALTH_LUA, run_health  # Lua 5.1 as Argo CD runs it

    def health(status: dict[str, Any]) -> tuple[str, str]:
        return run_health(HEALTH_LUA.read_text(), {"metadata": {"generation": 2}, "status": status})

    life, _, _ = canary_running()
    assert health(life.status)[0] == "Progressing" and "Canary" in health(life.status)[1]
    life.guard_says(quality.PoolQuality(True, 60, 60, spearman=0.9))
    life.settle()
    assert health(life.status)[0] == "Degraded" and "CanaryRolledBack" in health(life.status)[1]


def test_without_a_gateway_there_is_no_canary_to_route_to() -> None:
    life = GuardedLife(model())  # guarded (replaying), no Gateway: no third backend for a canary
    life.step()
    life.finish_job()
    life.settle()
    life.step(new_recipe(life.body))
    published_id = life.finish_job()
    life.settle()
    assert life.status["artifact"]["id"] == published_id and "canary" not in life.status
    assert ("Deployment", "bge-m3-guard") in life.world.objects
