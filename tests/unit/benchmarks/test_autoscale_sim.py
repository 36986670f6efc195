"""The spillover benchmark's own bookkeeping (`benchmarks/autoscale_sim/`): issue 12's conclusions rest on its
cost-matching, its attribution of violation-seconds and its count of spike episodes, so those are pinned here on
small worked cases, and the world model on cases whose answer follows from capacity alone."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from benchmarks.autoscale_sim import (
    attribution,
    cli,
    controllers,
    matching,
    observation,
    report,
    simulation,
    targets,
    traffic,
    world,
)

# (tuning factor, cost, violations); f=0.6 costs more than f=0.5 and violates more: dominated, never interpolated.
POINTS = [(0.5, 100.0, 50.0), (0.6, 110.0, 60.0), (0.7, 120.0, 30.0), (0.9, 140.0, 10.0)]


@pytest.mark.parametrize("cost, violations, f, extrapolated", [
    (110.0, 40.0, 0.6, False),      # halfway from (100, 50) to (120, 30); the dominated (110, 60) is ignored
    (130.0, 20.0, 0.8, False),
    (120.0, 30.0, 0.7, False),
    (90.0, 50.0, 0.5, True),        # below every swept cost: the cheapest end, flagged
    (150.0, 10.0, 0.9, True),       # above: the dearest end, flagged
])
def test_cost_matched_interpolates_along_the_pareto_frontier(cost: float, violations: float, f: float,
                                                             extrapolated: bool) -> None:
    matched = matching.cost_matched(POINTS, cost)
    assert matched["violation_s"] == pytest.approx(violations)
    assert matched["f"] == pytest.approx(f)
    assert matched["extrapolated"] is extrapolated


def test_attribution_windows_follow_the_start_ups_and_the_delay() -> None:
    gpu = world.PoolModel("gpu", 120, 0.05, 120, 1, 6, 1.0)
    nominal, delayed = world.Realism(), world.Realism(delay_s=10)
    attribute = attribution.attribute
    late_enough = 1000   # past any cold start
    assert attribute(100, -1, nominal, gpu, False, 1e9) == "cold_start"
    assert attribute(late_enough, 45, nominal, gpu, False, 1e9) == "spike_bridge"   # CPU start-up 40 s passed
    assert attribute(late_enough, 45, delayed, gpu, False, 1e9) == "spike_onset"    # 40 s + the 10 s delay
    assert attribute(late_enough, 125, nominal, gpu, False, 1e9) == "spike_late"
    assert attribute(late_enough, 125, delayed, gpu, False, 1e9) == "spike_bridge"
    assert attribute(late_enough, -1, nominal, gpu, True, 1e9) == "stale_scrape"
    assert attribute(late_enough, -1, nominal, gpu, False, 30) == "scale_down"
    assert attribute(late_enough, -1, nominal, gpu, False, 1e9) == "ramp_or_noise"


def _fixed(gpu_replicas: int) -> object:
    """A controller that always asks for the same GPU replicas and sends the CPU pool nothing."""
    def make() -> object:
        return lambda view: (gpu_replicas, 1, 0.0)
    return make


def test_spike_episodes_count_the_spikes_a_controller_let_through() -> None:
    gpu = world.PoolModel("gpu", 120, 0.05, 120, 1, 6, 1.0)
    cpu = world.PoolModel("cpu", 10.0, 0.12, 40.0, 1, 32, 0.2)
    rates = np.full(3600, 100.0)
    spikes = [(1000, 1120, 400.0), (2000, 2120, 20.0), (3000, 3120, 400.0)]   # two past 2 GPUs' capacity, one not
    for a, b, height in spikes:
        rates[a:b] += height
    runs = [simulation.RunSpec("nominal|two_gpus", _fixed(2), world.Realism(scrape_failure=0.0)),
            simulation.RunSpec("nominal|six_gpus", _fixed(6), world.Realism(scrape_failure=0.0))]
    two, six = simulation.simulate(rates, runs, gpu, cpu, 0.5, seed=1, spikes=spikes)
    assert two["spike_episodes"] == 2            # 500 rps on 2 x 120: both big spikes, not the small one
    assert two["causes"]["spike_onset"] > 0 and two["causes"]["spike_late"] > 0
    assert six["spike_episodes"] == 0            # 6 x 120 rps serve 500 within 0.5 s
    assert six["violation_s"] <= two["violation_s"]


def test_delay_cost_per_episode_and_what_it_implies() -> None:
    nominal = {"policy": {"violation_s": 1000, "spike_episodes": 20},
               "attribution": {"oracle": {"setting": "oracle@0.8", "violation_s": 1500, "spike_episodes": 25}}}
    delayed = {"policy": {"violation_s": 1400, "spike_episodes": 21},
               "attribution": {"oracle": {"setting": "oracle@0.8", "violation_s": 1800, "spike_episodes": 25}}}
    cost = targets._delay_cost(nominal, delayed)
    assert cost["policy_s"] == pytest.approx(400 / 20)
    assert cost["policy_change"] == pytest.approx(0.4)
    assert cost["floor_change"] == pytest.approx(world.DELAY_S * 20 / 1000)
    assert cost["oracle_s"] == pytest.approx(300 / 25)
    assert cost["oracle_paced_change"] == pytest.approx(300 / 25 * 20 / 1000)
    # Different oracle settings in the two variants would compare two controllers: no oracle figure then.
    delayed["attribution"]["oracle"]["setting"] = "oracle@0.9"
    assert "oracle_s" not in targets._delay_cost(nominal, delayed)
    assert targets._delay_cost({"policy": {"violation_s": 0, "spike_episodes": 0}}, delayed) is None


def _row(shape: str, seed: int, controller: str, violations: int, cost: float) -> dict[str, object]:
    return {"shape": shape, "seed": seed, "controller": controller, "violation_s": violations, "cost_usd": cost,
            "late_fraction": 0.0, "causes": {}, "spike_episodes": 0}


def test_markdown_tables_have_a_row_per_seed_and_the_cost_matched_ratio() -> None:
    # Seed 1: the policy has 100 violation-s at $10; cap_spill's two settings are (cost 8, 300) and (cost 12, 100),
    # so at $10 it would have 200 (halfway), a ratio of 0.5. Seed 2 doubles everything (ratio 0.5 again); pooled:
    # policy 300 at $30, cap_spill (24, 900) and (36, 300) -> 600 at $30.
    rows = []
    for seed, k in ((1, 1), (2, 2)):
        rows += [_row("flat", seed, "nominal|policy", 100 * k, 10.0 * k),
                 _row("flat", seed, "nominal|cap_spill@0.8", 300 * k, 8.0 * k),
                 _row("flat", seed, "nominal|cap_spill@0.6", 100 * k, 12.0 * k)]
    text = report.markdown(report.report_for(rows, {}, ["nominal"]))
    table = [line for line in text.splitlines() if line.startswith("| ") and "cap_spill" in line]
    by_seed = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table}
    assert set(by_seed) >= {"1", "2", "pooled"}
    assert by_seed["1"][1] == "100 ($10)" and by_seed["1"][-2:] == ["cap_spill 200", "0.5"]
    assert by_seed["2"][-2:] == ["cap_spill 400", "0.5"]
    assert by_seed["pooled"][-2:] == ["cap_spill 600", "0.5"]
    assert "300 ($8) -> 200" in by_seed["1"]            # the default setting (f=0.8), then cost-matched
    target_lines = [line for line in text.splitlines() if line.startswith("| flat | nominal |")]
    assert target_lines and "| 0.5 | 1.0 | yes |  | cap_spill |" in target_lines[0]     # two seeds: too few to resample


def _seeds_with_ratios(ratios: list[float]) -> list[dict[str, object]]:
    """Per seed: the policy has 100 violation-s at $10 and cap_spill's cheaper setting costs exactly $10 with
    100 / ratio, so each seed's cost-matched ratio is `ratio`; pooled, the ratio is the seeds' harmonic mean."""
    rows: list[dict[str, object]] = []
    for seed, ratio in enumerate(ratios, start=1):
        rows += [_row("diurnal", seed, "nominal|policy", 100, 10.0),
                 _row("diurnal", seed, "nominal|cap_spill@0.8", round(100 / ratio), 10.0),
                 _row("diurnal", seed, "nominal|cap_spill@0.6", round(50 / ratio), 12.0)]
    return rows


def test_seed_bootstrap_is_tight_when_every_seed_agrees() -> None:
    spread = targets.seed_bootstrap(_seeds_with_ratios([0.5] * 6), "nominal", 0.5)
    assert spread["p05"] == spread["median"] == spread["p95"] == 0.5
    assert spread["met_share"] == 1.0 and spread["draws"] == 1000
    assert targets.seed_bootstrap(_seeds_with_ratios([0.5] * 3), "nominal", 0.5) is None   # too few seeds to resample
    assert targets.seed_bootstrap(_seeds_with_ratios([0.5] * 6), "delay10", 0.5) is None   # no rows of that variant


def test_seed_bootstrap_shows_a_target_that_rests_on_the_seeds_drawn() -> None:
    # Two seeds at 0.25, two at 1.0: a draw of k seeds at 0.25 pools to 4 / (3k + 4), within the 0.5 goal when
    # k >= 2, which a draw of 4 seeds with replacement gives with probability 11/16.
    spread = targets.seed_bootstrap(_seeds_with_ratios([0.25, 0.25, 1.0, 1.0]), "nominal", 0.5)
    assert spread["p05"] < spread["median"] < spread["p95"]
    assert spread["p05"] >= 0.25 and spread["p95"] <= 1.0
    assert abs(spread["met_share"] - 11 / 16) < 0.05
    result = report.report_for(_seeds_with_ratios([0.25, 0.25, 1.0, 1.0]), {}, ["nominal"])
    assert result["targets"]["diurnal|nominal"]["ratio"] == 0.4                        # harmonic mean, met
    assert f"({spread['met_share']:.0%})" in report.markdown(result)


# --- cadence: the baselines at production defaults or at the policy's own -------------------------------------------

def test_an_hpa_synced_every_5s_grows_no_faster_than_its_15s_scale_up_policy_allows() -> None:
    """100% or 4 pods per 15 s is a limit over time: three syncs inside one period double the pool once."""
    hpa = controllers.Hpa(world.PoolModel("gpu", 10.0, 0.05, 120.0, 1, 64, 1.0))
    grown, current = [], 4
    for now in range(0, 35, 5):
        current = hpa.desired(now, current, current, [10.0])  # always ten times the target
        grown.append(current)
    assert grown == [8, 8, 8, 16, 16, 16, 32]
    at_15s = controllers.Hpa(world.PoolModel("gpu", 10.0, 0.05, 120.0, 1, 64, 1.0))
    assert [at_15s.desired(t, c, c, [10.0]) for t, c in ((0, 4), (15, 8), (30, 16))] == [8, 16, 32]


def test_the_baselines_rate_window_is_the_views() -> None:
    scrapes = [observation.Scrape(t, 1, 10.0 * t, 10.0 * t, 0.0, 0.0, np.zeros(0)) for t in range(0, 61, 5)]
    scrapes[-1] = observation.Scrape(60, 1, scrapes[-2].requests + 100.0, 0.0, 0.0, 0.0, np.zeros(0))  # a burst

    def view(window: int) -> observation.View:
        return observation.View(60, [1, 1], [0, 0], [1, 1], 0.0, [deque(scrapes), deque()], [False, False],
                                 rate_window=window)
    assert view(60).prom_rate(0) == pytest.approx((550 + 100) / 60)  # the burst diluted over a minute
    assert view(15).prom_rate(0) == pytest.approx((650 - 450) / 15)  # the scrapes at 45..60 s: the burst seen


@pytest.mark.parametrize("flags, message", [
    (["--baseline-period-s", "4"], "must divide 15"),
    (["--baseline-period-s", "5", "--baseline-lag-s", "5"], "below --baseline-period-s"),
    (["--baseline-period-s", "5", "--baseline-lag-s", "0", "--rate-window-s", "5"], "two scrapes"),
])
def test_a_cadence_the_world_cannot_run_is_refused(flags: list[str], message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--quick", *flags])
    assert message in capsys.readouterr().err


# --- recorded traces: replayed as recorded, both ratios, held-out parts ---------------------------------------------

@pytest.mark.parametrize("violations, cost, extrapolated, beyond", [
    (40.0, 110.0, False, False),    # halfway from (100, 50) to (120, 30); the dominated (110, 60) is ignored
    (20.0, 130.0, False, False),
    (50.0, 100.0, False, False),    # exactly the cheapest setting's violations
    (70.0, 100.0, True, False),     # more than even the cheapest setting had: its cost, flagged
    (5.0, 140.0, True, True),       # fewer than the dearest setting reached: it cannot match them at any swept cost
])
def test_violation_matched_reads_the_same_frontier_along_the_cost_axis(violations: float, cost: float,
                                                                      extrapolated: bool, beyond: bool) -> None:
    matched = matching.violation_matched(POINTS, violations)
    assert matched["cost_usd"] == pytest.approx(cost)
    assert matched["extrapolated"] is extrapolated and matched["beyond"] is beyond


def test_the_cost_target_names_the_cheapest_baseline_at_the_policys_violations() -> None:
    # The policy: 100 violation-s at $15. cap_spill reaches 100 at $12 (its dearer setting), hpa_rps at $14
    # (halfway between (10, 150) and (18, 50)), keda never (its best is 200): the cheapest is cap_spill, 1.25x.
    rows = [_row("trace:x", 1, f"nominal|{label}", violations, cost) for label, violations, cost in (
        ("policy", 100, 15.0), ("cap_spill@0.8", 300, 8.0), ("cap_spill@0.6", 100, 12.0), ("hpa_rps@0.7", 150, 10.0),
        ("hpa_rps@0.4", 50, 18.0), ("keda@0.7", 400, 5.0), ("keda@0.4", 200, 9.0))]
    result = report.report_for(rows, {}, ["nominal"])
    target = result["targets"]["trace:x|nominal"]
    assert (target["cost_ratio"], target["cost_against"], target["cost_met"]) == (1.25, "cap_spill", False)
    assert target["goal"] == 0.9                                                   # issue 60's goal on recorded traffic
    hpa = result["summary"]["trace:x|nominal"]["baselines"]["hpa_rps"]
    assert hpa["violation_matched"]["cost_usd"] == pytest.approx(14.0) and hpa["policy_cost_ratio_matched"] == 1.071
    assert result["summary"]["trace:x|nominal"]["baselines"]["keda"]["policy_cost_ratio_matched"] is None
    cheaper = report.report_for([{**rows[0], "cost_usd": 11.0}, *rows[1:]], {}, ["nominal"])["targets"]
    assert cheaper["trace:x|nominal"]["cost_met"] is True


def test_a_recorded_trace_is_read_as_written_and_refused_otherwise(tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text("t_s,requests\n0,1\n1,0\n2,4\n")
    assert traffic.recorded(good).tolist() == [1.0, 0.0, 4.0]
    for text, message in (("s,n\n0,1\n", "header"), ("t_s,requests\n0,1\n2,3\n", "second 2 where 1"),
                          ("t_s,requests\n0,-1\n", "finite count"), ("t_s,requests\n0,x\n", ":2: expected"),
                          ("t_s,requests\n", "no rows")):
        bad = tmp_path / "bad.csv"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            traffic.recorded(bad)


def test_a_trace_is_scaled_so_its_busiest_minute_has_the_asked_rate() -> None:
    counts = np.zeros(600)
    counts[100:160] = 3.0           # the busiest minute: 3 requests/s
    counts[300] = 50.0              # one second's burst: 50 in a minute, under a mean of 1/s
    rates = traffic.scaled(counts, 600.0)
    assert traffic.busiest_minute(rates) == pytest.approx(600.0)
    assert rates[300] == pytest.approx(50 * 200.0)                               # every second alike: x200
    assert traffic.held_out_from(600) == 420                                    # the last 30% held out


def test_a_recorded_trace_is_replayed_whole_and_reported_in_its_two_parts(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(3)
    path = tmp_path / "bursty.csv"
    counts = rng.poisson(2.0, 1800) * (rng.random(1800) < 0.4)
    path.write_text("t_s,requests\n" + "".join(f"{t},{c}\n" for t, c in enumerate(counts)))
    out = tmp_path / "report.json"
    cli.main(["--shapes", "", "--traces", str(path), "--trace-seeds", "1", "--variants", "nominal",
              "--baselines", "hpa_rps", "--out", str(out)])
    result = json.loads(out.read_text())
    rows = {(r["shape"], r["controller"]): r for r in result["rows"]}
    for controller in ("nominal|policy", "nominal|hpa_rps@0.7"):
        whole, tuning, held = (rows[(f"trace:bursty{part}", controller)] for part in ("", "@tuning", "@held_out"))
        assert tuning["violation_s"] + held["violation_s"] == whole["violation_s"]
        assert tuning["cost_usd"] + held["cost_usd"] == pytest.approx(whole["cost_usd"], abs=0.002)
        assert held["cost_usd"] > 0
    assert {"trace:bursty|nominal", "trace:bursty@held_out|nominal"} <= set(result["targets"])
    busiest = result["parameters"]["trace_busiest_minute_rps"]
    assert busiest == pytest.approx(0.8 * (6 * 113.6 + 32 * 4.3), rel=0.02)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli.main(["--shapes", "", "--traces", str(tmp_path / "missing.csv")])
    assert "--traces" in capsys.readouterr().err
