"""The recipe search: try candidate recipes within the time budget and choose one. A pure function of
(candidates, evaluate, budget): building and scoring a recipe is the ``evaluate`` callable the pipeline passes in,
and the clock is the budget's, so the choice can be tested without the ML stack.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.common.results import round_finite
from quantizer_job.steps.evaluation import serving
from quantizer_job.steps.recipe_search.recipes import Recipe


@dataclass(frozen=True)
class Trial:
    """One recipe built and scored: where its model is, how it ranks and runs, why it fails the gate (empty: passes)."""

    recipe: Recipe
    path: Path
    quality: dict[str, float]
    speed: dict[str, float]
    why: list[str]

    @property
    def passed(self) -> bool:
        return not self.why


@dataclass(frozen=True)
class Budget:
    """When to stop trying recipes: a next candidate must be expected (the slowest so far, with ``margin``) to end
    before ``stop_share`` of ``seconds``, so verifying the best and publishing it still fit in the Job's deadline."""

    seconds: float
    #: Seconds since the Job started.
    elapsed: Callable[[], float]
    stop_share: float = 0.85
    margin: float = 1.2

    def allows(self, slowest_candidate: float | None) -> bool:
        if slowest_candidate is None:
            return True
        return self.elapsed() + slowest_candidate * self.margin <= self.seconds * self.stop_share


#: Why ``skip_slower_after_pass`` left a candidate out.
SLOWER = "a passing candidate runs the same kernels with no more layers kept FP32 (these could not serve faster)"


def not_faster(recipe: Recipe, passed: Recipe) -> bool:
    """``recipe`` runs the kernels ``passed`` runs, with at least as many FFN layers kept FP32: it may rank better,
    never serve faster (the embedding table's precision changes the bytes, not the speed)."""
    return (recipe.mode == passed.mode and recipe.optimization_level == passed.optimization_level
            and recipe.operators == passed.operators and recipe.per_channel == passed.per_channel
            and recipe.fast_gelu == passed.fast_gelu and recipe.multi_head_attention == passed.multi_head_attention
            and recipe.fp32_ffn_down >= passed.fp32_ffn_down)


@dataclass(frozen=True)
class SearchResult:
    """Every trial that produced a model, the chosen one, the report lines, and what was skipped or failed."""

    trials: list[Trial]
    best: Trial | None
    #: One compact line per recipe tried (manifest, Job result, ``status.artifact.recipe.tried``).
    tried: list[dict[str, Any]]
    skipped: list[str] = field(default_factory=list)
    failures: list[tuple[str, JobError]] = field(default_factory=list)
    #: Why the ``skipped`` recipes were not tried ("<reason>: <names>", "; "-separated).
    skipped_why: str = ""


def tried_line(trial: Trial) -> dict[str, Any]:
    """One line of the recipe search, compact: the termination message holds at most 4 KB."""
    q, s = trial.quality, trial.speed
    return {"name": trial.recipe.name, "passed": trial.passed, "spearman": round_finite(q["spearman"], 5),
            "topk": round_finite(q["topk_agreement"], 4), "int8_pairs_per_s": round_finite(s["int8_pairs_per_s"], 2),
            "speedup": round_finite(s["speedup"], 3), "size_ratio": round_finite(s["size_ratio"], 3),
            **({"spread": [round_finite(s["speedup_low"], 2), round_finite(s["speedup_high"], 2)]}
               if "speedup_low" in s and "speedup_high" in s else {})}


def choose(trials: Sequence[Trial]) -> Trial | None:
    """The fastest trial (served-like speedup) that passes the gate, where a speed difference inside the
    measurement's spread is a tie that goes to the better ranking (``serving.prefer``); else the best-ranking
    failure (for the report); None if none."""
    passing = [t for t in trials if t.passed]
    if passing:
        found = {str(i): (serving.of_speed(t.speed), (t.quality["spearman"], t.quality["topk_agreement"]))
                 for i, t in enumerate(passing)}
        return passing[int(serving.prefer(found))]
    if not trials:
        return None
    return max(trials, key=lambda t: t.quality["spearman"] if math.isfinite(t.quality["spearman"]) else -2.0)


def search(candidates: Sequence[Recipe], evaluate: Callable[[int, Recipe], Trial], budget: Budget, *,
           tolerate_failures: bool = True, skip_slower_after_pass: bool = False) -> SearchResult:
    """Evaluate ``candidates`` in order (most promising first) while the budget allows another one.

    ``evaluate(index, recipe)`` builds and scores one recipe, raising :class:`JobError` when it cannot. With
    ``tolerate_failures`` (``--recipe auto``) a failing recipe is recorded and the search goes on; without it (one
    fixed recipe) the error is the Job's. The first candidate is always tried. ``skip_slower_after_pass`` (large
    models, where each candidate costs about a minute): once a candidate passes the gate, the later ones that
    cannot serve faster (``not_faster``) are not tried.
    """
    trials: list[Trial] = []
    tried: list[dict[str, Any]] = []
    failures: list[tuple[str, JobError]] = []
    slowest: float | None = None
    passed: list[Recipe] = []
    not_tried: dict[str, list[str]] = {SLOWER: [], "time budget": []}
    for i, recipe in enumerate(candidates):
        if i > 0 and not budget.allows(slowest):
            not_tried["time budget"] = [r.name for r in candidates[i:]]
            break
        if skip_slower_after_pass and any(not_faster(recipe, p) for p in passed):
            not_tried[SLOWER].append(recipe.name)
            continue
        started = budget.elapsed()
        trial = None
        try:
            trial = evaluate(i, recipe)
            trials.append(trial)
            tried.append(tried_line(trial))
        except JobError as exc:
            if not tolerate_failures:
                raise
            failures.append((recipe.name, exc))
            tried.append({"name": recipe.name, "passed": False, "error": exc.reason})
        slowest = max(slowest or 0.0, budget.elapsed() - started)
        if trial is not None and trial.passed:
            passed.append(recipe)
    skipped = [name for names in not_tried.values() for name in names]
    why = "; ".join(f"{reason}: {', '.join(names)}" for reason, names in not_tried.items() if names)
    return SearchResult(trials=trials, best=choose(trials), tried=tried, skipped=skipped, failures=failures,
                        skipped_why=why)
