"""Pooling runs over seeds and comparing controllers at equal cost: a baseline's sweep reduced to its Pareto
frontier and interpolated at the policy's cost (`cost_matched`), the strongest baseline so matched
(`best_matched`), and the per-group summary that the targets and the report read (`summarize`). A controller that
spends more avoids more violations; only at equal cost does a ratio of violations say which controls better."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from .attribution import CAUSES
from .controllers import BASELINES, BOUNDS


def _sweep(pooled: dict[str, dict[str, float]], name: str) -> list[tuple[float, float, float]]:
    """A controller's swept settings as (tuning factor, cost, violations), from its pooled `name@f` rows."""
    return [(float(label.split("@")[1]), e["cost_usd"], e["violation_s"]) for label, e in pooled.items()
            if label.startswith(f"{name}@")]


def _frontier(points: list[tuple[float, float, float]]) -> list[tuple[float, float, float]]:
    """The Pareto frontier of (tuning factor, cost, violations) points as (cost, violations, factor), cheapest
    first: a setting that costs more and violates no less than a cheaper one is dominated and dropped."""
    frontier: list[tuple[float, float, float]] = []
    for c, v, f in sorted((c, v, f) for f, c, v in points):
        if not frontier or v < frontier[-1][1]:
            frontier.append((c, v, f))
    return frontier


def cost_matched(points: list[tuple[float, float, float]], cost: float) -> dict[str, Any]:
    """Violations a baseline would have at `cost`: linear interpolation along its sweep's Pareto frontier.

    `points` are (tuning factor, cost, violations). Settings that cost more and violate more than another are
    dominated and dropped (a team would never pick them); outside the swept costs the nearest end is reported,
    flagged `extrapolated`.
    """
    frontier = _frontier(points)
    if cost <= frontier[0][0] or len(frontier) == 1:
        c, v, f = frontier[0] if cost <= frontier[0][0] else frontier[-1]
        return {"violation_s": v, "cost_usd": c, "f": f, "extrapolated": abs(cost - c) > 1e-9}
    if cost >= frontier[-1][0]:
        c, v, f = frontier[-1]
        return {"violation_s": v, "cost_usd": c, "f": f, "extrapolated": cost > c}
    for (c0, v0, f0), (c1, v1, f1) in itertools.pairwise(frontier):
        if c0 <= cost <= c1:
            w = 0.0 if c1 == c0 else (cost - c0) / (c1 - c0)
            return {"violation_s": round(v0 + w * (v1 - v0), 1), "cost_usd": round(cost, 3),
                    "f": round(f0 + w * (f1 - f0), 3), "extrapolated": False}
    raise AssertionError("unreachable")


def violation_matched(points: list[tuple[float, float, float]], violations: float) -> dict[str, Any]:
    """What a baseline would cost at `violations`: linear interpolation along its sweep's Pareto frontier, the
    converse of `cost_matched` (the same frontier, read along the other axis).

    Why both: a ratio of violations at equal cost hides a controller that buys nothing with its money (on traffic no
    controller can serve, all settings violate alike, and the dearer one looks no worse). Outside the frontier's
    violations the nearest end is reported, flagged `extrapolated`: fewer violations than any setting reached (the
    dearest end: the baseline cannot match them at any swept cost, `beyond` is True) or more than its cheapest had.
    """
    frontier = _frontier(points)
    cheapest, dearest = frontier[0], frontier[-1]
    if violations >= cheapest[1]:
        c, v, f = cheapest
        return {"violation_s": v, "cost_usd": c, "f": f, "extrapolated": violations > v, "beyond": False}
    if violations < dearest[1]:
        c, v, f = dearest
        return {"violation_s": v, "cost_usd": c, "f": f, "extrapolated": True, "beyond": True}
    for (c0, v0, f0), (c1, v1, f1) in itertools.pairwise(frontier):
        if v1 <= violations <= v0:
            w = 0.0 if v0 == v1 else (v0 - violations) / (v0 - v1)
            return {"violation_s": violations, "cost_usd": round(c0 + w * (c1 - c0), 3),
                    "f": round(f0 + w * (f1 - f0), 3), "extrapolated": False, "beyond": False}
    raise AssertionError("unreachable")


def cheapest_matched(pooled: dict[str, dict[str, float]], violations: float) -> dict[str, Any] | None:
    """The baseline that reaches `violations` at the least cost (`violation_matched`). A baseline that cannot
    reach them at any swept setting is left out (it has no cost at those violations); None when none can."""
    best = None
    for name in BASELINES:
        points = _sweep(pooled, name)
        if len(points) < 2:
            continue
        matched = violation_matched(points, violations)
        if matched["beyond"]:
            continue
        if best is None or matched["cost_usd"] < best["cost_usd"]:
            best = {"baseline": name, **matched}
    return best


def summarize(rows: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    """Pooled figures per controller, the strongest baseline, and the cost-matched comparison."""
    pooled: dict[str, dict[str, float]] = {}
    causes: dict[str, dict[str, int]] = {}
    late_sums: dict[str, list[float]] = {}
    for row in rows:
        v, label = row["controller"].split("|", 1)
        if v != variant:
            continue
        entry = pooled.setdefault(label, {"violation_s": 0, "cost_usd": 0.0, "split_reversals": 0,
                                          "split_travel_pct": 0, "spike_episodes": 0})
        for key in ("violation_s", "cost_usd", "split_reversals", "split_travel_pct", "spike_episodes"):
            entry[key] += row.get(key, 0)
        late = late_sums.setdefault(label, [0.0, 0])
        late[0] += row.get("late_fraction", 0.0)
        late[1] += 1
        for cause, seconds in row.get("causes", {}).items():
            causes.setdefault(label, dict.fromkeys(CAUSES, 0))[cause] += seconds
    for label, entry in pooled.items():
        entry["cost_usd"] = round(entry["cost_usd"], 2)
        entry["late_fraction_mean"] = round(late_sums[label][0] / late_sums[label][1], 5)
    if "policy" not in pooled:
        return {}
    policy = pooled["policy"]
    baselines = {}
    for name, tuning in BASELINES.items():
        points = _sweep(pooled, name)
        if not points:
            continue
        default = pooled[f"{name}@{tuning['f']}"]
        matched = cost_matched(points, policy["cost_usd"]) if len(points) > 1 else None
        at_violations = violation_matched(points, policy["violation_s"]) if len(points) > 1 else None
        baselines[name] = {
            "default": {**default, "f": tuning["f"]},
            "cost_matched": matched,
            "policy_violation_ratio_default": violation_ratio(policy["violation_s"], default["violation_s"]),
            "policy_cost_ratio_default": round(policy["cost_usd"] / default["cost_usd"], 3),
            "policy_violation_ratio_matched": None if matched is None else violation_ratio(policy["violation_s"],
                                                                                   matched["violation_s"]),
            "violation_matched": at_violations,
            "policy_cost_ratio_matched": None if at_violations is None or at_violations["beyond"]
            else round(policy["cost_usd"] / at_violations["cost_usd"], 3),
        }
    strongest = min(baselines, key=lambda n: (baselines[n]["cost_matched"] or baselines[n]["default"])
                    ["violation_s"]) if baselines else None
    ablations = {}
    for label, entry in pooled.items():
        if label.startswith("ablation:"):
            best = best_matched(pooled, entry["cost_usd"])
            ablations[label.split(":", 1)[1]] = {**entry, "vs_best_cost_matched": best}
    bounds = {}
    for name in BOUNDS:
        points = _sweep(pooled, name)
        if len(points) > 1:
            bounds[name] = {**cost_matched(points, policy["cost_usd"]),
                            "at_policy_violations": violation_matched(points, policy["violation_s"])}
    best = best_matched(pooled, policy["cost_usd"])
    return {"policy": policy, "hpa_util": pooled.get("hpa_util@0.7"), "baselines": baselines, "bounds": bounds,
            "strongest_baseline": strongest, "policy_vs_best_cost_matched": best,
            "policy_vs_cheapest_at_violations": cheapest_matched(pooled, policy["violation_s"]),
            "ablations": ablations, "attribution": _attribution(pooled, causes, policy["cost_usd"],
                                                                 [best["baseline"]] if best else [])}


def _attribution(pooled: dict[str, dict[str, float]], causes: dict[str, dict[str, int]], cost: float,
                 names: Sequence[str]) -> dict[str, Any]:
    """Violation-seconds by cause (`attribute`) for the policy and, for each named baseline and each bound, its swept
    setting whose pooled cost is nearest the policy's (causes are counted per run, so they are not interpolated)."""
    out: dict[str, Any] = {}
    if "policy" in causes:
        out["policy"] = causes["policy"]
    for name in [*names, *BOUNDS]:
        labels = [label for label in pooled if label.startswith(f"{name}@") and label in causes]
        if labels:
            label = min(labels, key=lambda lb: abs(pooled[lb]["cost_usd"] - cost))
            out[name] = {"setting": label, "cost_usd": pooled[label]["cost_usd"],
                         "violation_s": pooled[label]["violation_s"],
                         "spike_episodes": pooled[label]["spike_episodes"], **causes[label]}
    return out


def best_matched(pooled: dict[str, dict[str, float]], cost: float) -> dict[str, Any] | None:
    """The baseline with the fewest violations once cost-matched to `cost`.

    A baseline none of whose settings costs as little as `cost` / 1.05 cannot be matched (it would be compared
    with more money than the candidate had): it is left out here and stays visible in the per-baseline table."""
    best = None
    for name in BASELINES:
        points = _sweep(pooled, name)
        if len(points) < 2 or min(c for _, c, _ in points) > cost * 1.05:
            continue
        matched = cost_matched(points, cost)
        if best is None or matched["violation_s"] < best["violation_s"]:
            best = {"baseline": name, **matched}
    return best


def violation_ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b > 0 else (0.0 if a == 0 else math.inf)
