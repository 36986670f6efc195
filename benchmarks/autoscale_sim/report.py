"""The report: the JSON (`report_for`: parameters, summaries per group, targets, rows) and the same as markdown
tables (`markdown`). Both are built from the rows alone, so `--from-rows` rebuilds them from an earlier run's
JSON without simulating again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .controllers import BASELINES
from .matching import summarize, violation_ratio
from .targets import seed_bootstrap, targets
from .traffic import HELD_OUT


def report_for(rows: list[dict[str, Any]], parameters: dict[str, Any], variants: Sequence[str]) -> dict[str, Any]:
    """The JSON report: parameters, pooled summaries per shape / diurnal seed / tuning and held-out seeds, rows."""
    report: dict[str, Any] = {"parameters": parameters, "summary": {}, "rows": rows}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["shape"], []).append(row)
        if row["shape"] == "diurnal":
            key = "diurnal_held_out" if row["seed"] in HELD_OUT else "diurnal_tuning"
            groups.setdefault(key, []).append(row)
            groups.setdefault(f"diurnal_seed{row['seed']}", []).append(row)
    for group, group_rows in groups.items():
        for variant in variants:
            summary = summarize(group_rows, variant)
            if summary:
                report["summary"][f"{group}|{variant}"] = summary
    report["targets"] = targets(report["summary"], variants)
    for key, target in report["targets"].items():
        group, variant = key.split("|")
        spread = seed_bootstrap(groups.get(group, []), variant, target["goal"])
        if spread:
            target["seed_bootstrap"] = spread
    return report


def markdown(report: dict[str, Any]) -> str:
    """The report as tables a reader can check by eye: issue 12's targets, then per shape and variant one row per
    seed and a pooled one. Each cell is the policy's or a baseline's violation-seconds and cost; a baseline's cell
    gives its default setting, then (after the arrow) its violations cost-matched to the policy on that seed, so the
    per-seed ratios scatter around the pooled one instead of hiding behind it."""
    variants = sorted({row["controller"].split("|", 1)[0] for row in report["rows"]}, key=_variant_order)
    lines = ["## Targets (policy / best baseline: violations at matched cost; cost at matched violations)", "",
             "| shape | variant | ratio | goal | met | seeds 5-95% (met in) | against | cost ratio | cost against | "
             "oracle ratio | foresight ratio | change vs nominal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, target in report["targets"].items():
        shape, variant = key.split("|")
        change, spread = target.get("change_vs_nominal"), target.get("seed_bootstrap")
        cost = target.get("cost_ratio")
        lines.append(f"| {shape} | {variant} | {target['ratio']}{'*' if target.get('extrapolated') else ''} | "
                     f"{target['goal']} | {'yes' if target['met'] else 'no'} | "
                     f"{_spread_text(spread)} | "
                     f"{target['against']} | {'' if cost is None else cost} | "
                     f"{target.get('cost_against') or 'none reaches it'} | {target.get('oracle_ratio', '')} | "
                     f"{target.get('foresight_ratio', '')} | "
                     f"{'' if change is None else f'{change:+.1%}'} |")
    names = [n for n in BASELINES if any(r["controller"].split("|", 1)[1].startswith(f"{n}@")
                                         for r in report["rows"])]
    by_shape: dict[str, list[dict[str, Any]]] = {}
    for row in report["rows"]:
        by_shape.setdefault(row["shape"], []).append(row)
    for shape, rows in by_shape.items():
        for variant in variants:
            seeds = sorted({r["seed"] for r in rows})
            per_seed = [(str(seed), summarize([r for r in rows if r["seed"] == seed], variant)) for seed in seeds]
            table = [(label, entry) for label, entry in [*per_seed, ("pooled", summarize(rows, variant))] if entry]
            if not table:
                continue
            lines += ["", f"## {shape}, {variant}: violation-s ($), baselines default -> cost-matched", "",
                      "| seed | policy | " + " | ".join(names) + " | best matched | ratio |",
                      "|---|---|" + "---|" * len(names) + "---|---|"]
            lines += [_markdown_row(label, entry, names) for label, entry in table]
    return "\n".join(lines) + "\n"


def _spread_text(spread: dict[str, Any] | None) -> str:
    return "" if not spread else f"{spread['p05']}-{spread['p95']} ({spread['met_share']:.0%})"


def _markdown_row(label: str, entry: dict[str, Any], names: Sequence[str]) -> str:
    policy = entry["policy"]
    cells = [label, f"{policy['violation_s']:.0f} (${policy['cost_usd']:.0f})"]
    for name in names:
        baseline = entry["baselines"].get(name)
        if baseline is None:
            cells.append("")
            continue
        default, matched = baseline["default"], baseline["cost_matched"]
        text = f"{default['violation_s']:.0f} (${default['cost_usd']:.0f})"
        if matched is not None:
            text += f" -> {matched['violation_s']:.0f}{'*' if matched['extrapolated'] else ''}"
        cells.append(text)
    best = entry.get("policy_vs_best_cost_matched")
    cells += ([f"{best['baseline']} {best['violation_s']:.0f}", str(violation_ratio(policy["violation_s"],
                                                                           best["violation_s"]))]
              if best else ["", ""])
    return "| " + " | ".join(cells) + " |"


def _variant_order(variant: str) -> tuple[int, str]:
    order = ("nominal", "delay10", "cpu90")
    return (order.index(variant) if variant in order else len(order), variant)
