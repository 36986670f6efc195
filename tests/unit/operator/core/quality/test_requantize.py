"""Opt-in self-healing (core/quality/requantize.py): when a round on the live sample starts, what the Job is then asked
to do, and the guard's part (the sample's mount and configuration); through the plan, the fake API server and the
status as the canary tests drive them (test_quality_acting.GuardedLife)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rerank_contracts import artifact_layout, quantize_job
from rerank_contracts.guard import CONFIG_ENV, GuardConfig, LiveSampleSettings
from rerank_operator.core.artifacts import identity as artifact
from rerank_operator.core.builders import guard
from rerank_operator.core.quality import assessment as quality
from rerank_operator.core.quality import requantize
from rerank_operator.core.spec import model as spec
from rerank_operator.core.status import compute as statuses
from rerank_operator.core.status import conditions
from tests.unit.operator.core.quality.test_quality_acting import NOW, GuardedLife, by_kind, guarded_model, plan_for
from tests.unit.operator.rerankmodel_gen import finish, job_pod, model, published, set_, spec_of

CONSENT = {"enabled": True, "maxPairs": 2000, "maxAgeHours": 48, "minIntervalHours": 6}
T0 = datetime(2025, 1, 1, tzinfo=UTC)
SAMPLE = "samples/bge-m3/live.jsonl"


def consenting(*mods: Any) -> dict[str, Any]:
    return guarded_model(set_("quantization.requantizeOnDrift", CONSENT), *mods)


def look(below: frozenset[str] = frozenset({"cpu"}), pairs: int = 500, settling: bool = False,
         served: str | None = "a1", settled_at: datetime | None = None) -> requantize.Look:
    return requantize.Look(below_floor=below, sample_pairs=pairs, settling=settling, served=served,
                           settled_at=settled_at)


POLICY = spec_of(consenting()).quantization.requantize_on_drift


def test_consent_is_parsed_and_off_by_default_and_needs_a_gateway() -> None:
    assert spec.RequantizeOnDrift(enabled=True, max_pairs=2000, max_age_hours=48, min_interval_hours=6) == POLICY
    assert spec_of(model()).quantization.requantize_on_drift == spec.RequantizeOnDrift()
    assert not spec.RequantizeOnDrift().enabled
    with pytest.raises(spec.SpecError, match=r"routing\.gateway"):
        spec_of(model(set_("quantization.requantizeOnDrift", {"enabled": True})))
    with pytest.raises(spec.SpecError, match="maxPairs"):
        spec_of(consenting(set_("quantization.requantizeOnDrift.maxPairs", 399)))
    with pytest.raises(spec.SpecError, match="recipe auto or mode static"):
        spec_of(consenting(set_("quantization.recipe", "fixed")))


def test_a_round_starts_when_the_stable_cpu_artifact_drifts_with_enough_live_pairs() -> None:
    record, event = requantize.decide(POLICY, {}, look(), T0)
    assert record == {"count": 1, "since": "2025-01-01T00:00:00Z", "fromArtifact": "a1", "samplePairs": 500,
                      "reason": "the CPU pool's artifact a1 ranks below the quality floor on live traffic"}
    assert event is not None and (event.type, event.reason) == ("Normal", conditions.REASON_REQUANTIZING)
    assert "500 pairs of live traffic" in event.message and "canary" in event.message


@pytest.mark.parametrize("case", ["no consent", "within the floor", "gpu below", "too few pairs", "settling",
                                  "nothing served"])
def test_no_round_without_drift_of_the_stable_cpu_artifact_on_enough_live_traffic(case: str) -> None:
    policy = spec.RequantizeOnDrift() if case == "no consent" else POLICY
    seen = {"within the floor": look(below=frozenset()), "gpu below": look(below=frozenset({"gpu"})),
            "too few pairs": look(pairs=requantize.MIN_SAMPLE_PAIRS - 1), "settling": look(settling=True),
            "nothing served": look(served=None)}.get(case, look())
    assert requantize.decide(policy, {}, seen, T0) == (None, None)
    previous = {"count": 2, "since": "2024-01-01T00:00:00Z"}
    assert requantize.decide(policy, previous, seen, T0) == (previous, None)  # kept as it was


def test_no_round_while_the_last_is_on_its_way_nor_within_the_interval_after_it_settled() -> None:
    first, _ = requantize.decide(POLICY, {}, look(), T0)
    assert first is not None
    # Its Job (or canary) still on its way, however long: a new round would replace that Job.
    for later in (timedelta(minutes=1), timedelta(hours=7), timedelta(days=3)):
        assert requantize.decide(POLICY, first, look(settling=True), T0 + later) == (first, None)
    # Rolled back (or promoted) at +7 h: the interval counts from then, not from the round's start.
    settled = T0 + timedelta(hours=7)
    for later in (timedelta(hours=7, minutes=1), timedelta(hours=12, minutes=59)):
        assert requantize.decide(POLICY, first, look(settled_at=settled), T0 + later) == (first, None)
    second, event = requantize.decide(POLICY, first, look(pairs=900, served="a2", settled_at=settled),
                                      T0 + timedelta(hours=13))
    assert second is not None and event is not None
    assert (second["count"], second["fromArtifact"], second["samplePairs"]) == (2, "a2", 900)


def test_what_settles_a_round_is_read_from_the_status_the_reconcile_loop_writes() -> None:
    running = requantize.Look.of({"pendingArtifact": {"state": "Canary"}, "artifact": {"id": "a1"}},
                                 frozenset({"cpu"}), 300)
    assert running.settling and running.served == "a1" and running.settled_at is None
    rolled_back = requantize.Look.of({
        "pendingArtifact": {"state": "RolledBack"},
        "artifact": {"id": "a1", "publishedAt": "2025-01-01T00:00:00Z"},
        "conditions": [{"type": "Degraded", "status": "True", "reason": conditions.REASON_CANARY_ROLLED_BACK,
                        "lastTransitionTime": "2025-01-01T09:00:00Z"}]}, frozenset({"cpu"}), 300)
    assert not rolled_back.settling and rolled_back.settled_at == T0 + timedelta(hours=9)
    failed = requantize.Look.of({"pendingArtifact": {"state": "Failed"},
                                 "artifact": {"id": "a1", "publishedAt": "2025-01-01T02:00:00Z"}}, frozenset(), 0)
    assert not failed.settling and failed.settled_at == T0 + timedelta(hours=2)


def test_the_round_plans_the_artifact_on_the_live_sample_and_names_a_new_one() -> None:
    s = spec_of(consenting())
    assert requantize.effective(s, {}, "bge-m3") is s
    one = requantize.effective(s, {"quality": {"requantization": {"count": 1}}}, "bge-m3")
    assert one.quantization.evaluation_data == spec.DataSource(path=SAMPLE)
    assert one.quantization.calibration_data is None  # mode dynamic calibrates nothing
    assert one.quantization.live_round == "1@"
    two = requantize.effective(s, {"quality": {"requantization": {"count": 2, "since": "2025-01-02T00:00:00Z"}}},
                               "bge-m3")
    again = requantize.effective(s, {"quality": {"requantization": {"count": 2, "since": "2025-03-01T00:00:00Z"}}},
                                 "bge-m3")
    ids = {artifact.artifact_id(x) for x in (s, one, two, again)}
    # Each round is one new artifact (the sample file's path is the same), a reused number too (a lost record).
    assert len(ids) == 4
    assert artifact.inputs(two)["liveRound"] == "2@2025-01-02T00:00:00Z" and "liveRound" not in artifact.inputs(s)
    static = spec_of(consenting(set_("quantization.mode", "static"),
                                set_("quantization.calibrationData", {"configMapRef": {"name": "cal", "key": "p"}})))
    again = requantize.effective(static, {"quality": {"requantization": {"count": 1}}}, "bge-m3")
    assert again.quantization.calibration_data == again.quantization.evaluation_data == spec.DataSource(path=SAMPLE)
    # Consent withdrawn: the spec's own data and artifact again, whatever rounds were recorded.
    withdrawn = spec_of(guarded_model())
    assert requantize.effective(withdrawn, {"quality": {"requantization": {"count": 3}}}, "bge-m3") is withdrawn


def test_with_consent_the_guard_keeps_its_sample_in_its_own_directory_of_the_volume() -> None:
    plan = plan_for(consenting(), {})
    pod = by_kind(plan, "Deployment")["bge-m3-guard"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == guard.SAMPLE_MOUNT)
    assert mount["subPath"] == "samples/bge-m3" and not mount.get("readOnly")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert not volume["persistentVolumeClaim"].get("readOnly")
    config = GuardConfig.from_json(next(e["value"] for e in c["env"] if e["name"] == CONFIG_ENV))
    path = f"{guard.SAMPLE_MOUNT}/{artifact_layout.LIVE_SAMPLE_FILE}"
    assert config.live_sample == LiveSampleSettings(path, 2000, 48 * 3600)
    # The path the guard writes is the path the Job reads (both relative to the volume's root).
    assert f"{mount['subPath']}/{artifact_layout.LIVE_SAMPLE_FILE}" == requantize.sample_path("bge-m3")
    # Without consent: no sample, no volume (a GPU pool is the reference, nothing to replay).
    plain = by_kind(plan_for(guarded_model(), {}), "Deployment")["bge-m3-guard"]["spec"]["template"]["spec"]
    assert "volumes" not in plain and "volumeMounts" not in plain["containers"][0]
    # Without a GPU pool the artifact stays read-only beside the writable sample directory.
    local = by_kind(plan_for(consenting(set_("pools.gpu.enabled", False)), {}), "Deployment")["bge-m3-guard"]
    mounts = {m["mountPath"]: m for m in local["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[guard.ARTIFACT_MOUNT]["readOnly"] is True and not mounts[guard.SAMPLE_MOUNT].get("readOnly")


def drifting(life: GuardedLife, pairs: int, now: datetime) -> quality.Assessment:
    """One autoscaler tick: the guard finds the stable CPU pool below the floor with ``pairs`` in its sample."""
    verdict = quality.Verdict({"cpu": quality.PoolQuality(True, 100, 500, spearman=0.9)}, live_pairs=pairs)
    out = quality.assess(life.status, verdict, None, {"gpu": 1, "cpu": 1}, "bge-m3-guard", 200,
                         drift=(spec_of(life.body).quantization.requantize_on_drift, now))
    life.status = statuses.autoscaler_part(life.status, None, [out.condition], generation=1, now=NOW,
                                           quality=out.record)
    return out


def test_a_drifting_model_is_requantized_on_its_live_sample_and_the_result_is_a_canary() -> None:
    life = GuardedLife(consenting())
    life.step()
    stable = life.finish_job()
    life.settle()
    assert life.status["artifact"]["id"] == stable

    # Too few pairs yet: the pool is out of traffic (the guard's verdict) but nothing is re-quantized.
    out = drifting(life, 120, T0)
    assert "requantization" not in out.record and out.record["livePairs"] == 120
    life.settle()
    assert [j["metadata"]["labels"]["rerank.io/artifact"] for j in life.world.of_kind("Job")] == [stable]

    out = drifting(life, 640, T0)
    assert out.record["requantization"]["count"] == 1 and out.record["requantization"]["fromArtifact"] == stable
    assert [e.reason for e in out.events] == [conditions.REASON_REQUANTIZING]
    # The round is material (written at once, even where nothing else changed); more pairs alone are not.
    prior = {**life.status, "quality": {k: v for k, v in life.status["quality"].items() if k != "requantization"}}
    assert statuses.autoscaler_patch(prior, None, [out.condition], generation=1, now=NOW, quality=out.record)
    assert not statuses.autoscaler_patch(life.status, None, [out.condition], generation=1, now=NOW,
                                         quality={**out.record, "livePairs": 641})
    life.step()
    [job] = [j for j in life.world.of_kind("Job") if j["metadata"]["labels"]["rerank.io/artifact"] != stable]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--eval-pairs") + 1] == f"{artifact_layout.VOLUME_MOUNT_PATH}/{SAMPLE}"
    assert "--calibration-pairs" not in args
    # The tenant's queries are not kept in the artifact (they expire with the sample); an ordinary Job keeps its pairs.
    assert "--no-keep-eval-pairs" in args
    assert not quantize_job.parse_args(args).keep_eval_pairs
    assert quantize_job.parse_args([a for a in args if a != "--no-keep-eval-pairs"]).keep_eval_pairs
    [first] = [j for j in life.world.of_kind("Job") if j["metadata"]["labels"]["rerank.io/artifact"] == stable]
    assert "--no-keep-eval-pairs" not in first["spec"]["template"]["spec"]["containers"][0]["args"]
    # The next tick keeps the round (no second Job, no second Event) while the guard still says the same.
    for later in (timedelta(minutes=5), timedelta(days=2)):  # its Job runs: no second round however long it takes
        again = drifting(life, 700, T0 + later)
        assert again.record["requantization"]["count"] == 1 and again.events == ()
        life.step()
        assert len(life.world.of_kind("Job")) == 2

    # The round's artifact comes from the same weights: it serves as a canary beside the stable one.
    new = job["metadata"]["labels"]["rerank.io/artifact"]
    life.world.objects[("Job", job["metadata"]["name"])] = finish(job, True)
    pod = job_pod(job, 0, published(new))
    life.world.objects[("Pod", pod["metadata"]["name"])] = pod
    life.settle()
    assert life.status["artifact"]["id"] == stable
    assert life.status["canary"]["state"] == "Running" and life.status["canary"]["artifact"]["id"] == new
    assert life.served("bge-m3-canary") == new


def test_the_round_outlives_the_guard_so_the_model_keeps_its_artifact() -> None:
    """The class turns the guard off (or the spec is unreadable for a moment): status.quality goes, the round stays,
    so the artifact is still planned on the sample and nothing rolls back to the artifact that drifted."""
    status = {"quality": {"guard": "bge-m3-guard", "belowFloor": ["cpu"],
                          "requantization": {"count": 1, "since": "2025-01-01T00:00:00Z"}}}
    after = statuses.autoscaler_part(status, None, [], generation=1, now=NOW, quality=None)
    assert after["quality"] == {"requantization": {"count": 1, "since": "2025-01-01T00:00:00Z"}}
    s = spec_of(consenting())
    assert artifact.artifact_id(requantize.effective(s, after, "bge-m3")) == artifact.artifact_id(
        requantize.effective(s, status, "bge-m3"))
    assert "quality" not in statuses.autoscaler_part({"quality": {"guard": "g"}}, None, [], generation=1, now=NOW)
