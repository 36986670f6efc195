"""The recipe search as a pure function of (candidates, evaluate, budget): fake evaluate callables and a fake clock
stand in for building and scoring models, so the choice, the failure handling and the time budget are tested
without the ML stack. Also the one rule for reporting numbers (quantizer_job.steps.common.results)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from quantizer_job.steps.common import results
from quantizer_job.steps.common.errors import JobError
from quantizer_job.steps.recipe_search import search
from quantizer_job.steps.recipe_search.recipes import Recipe

pytestmark = pytest.mark.quantizer

NAN = float("nan")


class Clock:
    """Seconds since the Job started; each evaluation advances it by its cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def recipes(*names: str) -> list[Recipe]:
    return [Recipe(name=n) for n in names]


def trial(recipe: Recipe, spearman: float, pps: float, passed: bool = True) -> search.Trial:
    return search.Trial(recipe=recipe, path=Path(f"/work/{recipe.name}/model.onnx"),
                        quality={"spearman": spearman, "topk_agreement": 1.0},
                        speed={"int8_pairs_per_s": pps, "speedup": pps / 100.0, "size_ratio": 0.26},
                        why=[] if passed else [f"spearman {spearman} < 0.99"])


def evaluate_from(table: dict[str, tuple[float, float, bool] | JobError], clock: Clock | None = None,
                  cost: float = 0.0):
    """An evaluate callable that looks each recipe's outcome up in ``table`` and spends ``cost`` seconds."""
    calls: list[str] = []

    def evaluate(i: int, recipe: Recipe) -> search.Trial:
        calls.append(recipe.name)
        if clock is not None:
            clock.now += cost
        outcome = table[recipe.name]
        if isinstance(outcome, JobError):
            raise outcome
        sp, pps, ok = outcome
        return trial(recipe, sp, pps, ok)

    return evaluate, calls


def no_deadline() -> search.Budget:
    return search.Budget(seconds=1e9, elapsed=Clock())


def test_the_fastest_passing_recipe_wins_not_the_first_nor_the_best_ranking() -> None:
    evaluate, calls = evaluate_from({"a": (0.999, 100.0, True), "b": (0.995, 300.0, True),
                                     "c": (0.9999, 900.0, False)})
    res = search.search(recipes("a", "b", "c"), evaluate, no_deadline())
    assert calls == ["a", "b", "c"]
    assert res.best is not None and res.best.recipe.name == "b"
    assert [t["name"] for t in res.tried] == ["a", "b", "c"]
    assert [t["passed"] for t in res.tried] == [True, True, False]


def test_without_a_passing_recipe_the_best_ranking_failure_is_reported_and_nan_ranks_last() -> None:
    evaluate, _ = evaluate_from({"nan": (NAN, 999.0, False), "low": (0.90, 500.0, False),
                                 "high": (0.97, 100.0, False)})
    res = search.search(recipes("nan", "low", "high"), evaluate, no_deadline())
    assert res.best is not None and res.best.recipe.name == "high" and not res.best.passed
    nan_line = res.tried[0]
    assert nan_line["spearman"] is None  # JSON has no NaN: not measured is null


def test_a_failing_recipe_is_recorded_and_the_search_goes_on_in_auto_mode() -> None:
    err = JobError("QuantizationFailed", "shape inference failed")
    evaluate, calls = evaluate_from({"broken": err, "ok": (0.995, 200.0, True)})
    res = search.search(recipes("broken", "ok"), evaluate, no_deadline())
    assert calls == ["broken", "ok"]
    assert res.best is not None and res.best.recipe.name == "ok"
    assert res.tried[0] == {"name": "broken", "passed": False, "error": "QuantizationFailed"}
    assert res.failures == [("broken", err)]


def test_a_fixed_recipe_that_fails_fails_the_search() -> None:
    evaluate, _ = evaluate_from({"fixed": JobError("QuantizationFailed", "boom")})
    with pytest.raises(JobError, match="boom"):
        search.search(recipes("fixed"), evaluate, no_deadline(), tolerate_failures=False)


def test_nothing_built_means_no_best() -> None:
    evaluate, _ = evaluate_from({"x": JobError("QuantizationFailed", "boom")})
    res = search.search(recipes("x"), evaluate, no_deadline())
    assert res.best is None and res.trials == [] and res.tried[0]["error"] == "QuantizationFailed"


def test_the_search_stops_when_the_slowest_candidate_would_overrun_the_budget() -> None:
    # 10 s per candidate, budget 40 s, stop at 85 % (34 s) with a 1.2x margin: after 1 (10 + 12 <= 34) and
    # 2 (20 + 12 <= 34) the next fits; after 3 (30 + 12 > 34) it does not.
    clock = Clock()
    names = ("r1", "r2", "r3", "r4", "r5")
    evaluate, calls = evaluate_from({n: (0.995, 100.0 + i, True) for i, n in enumerate(names)}, clock, cost=10.0)
    res = search.search(recipes(*names), evaluate, search.Budget(seconds=40.0, elapsed=clock))
    assert calls == ["r1", "r2", "r3"]
    assert res.skipped == ["r4", "r5"]
    assert res.best is not None and res.best.recipe.name == "r3"


def test_the_first_candidate_is_tried_even_past_the_budget() -> None:
    clock = Clock()
    clock.now = 1000.0
    evaluate, calls = evaluate_from({"a": (0.995, 100.0, True), "b": (0.995, 200.0, True)}, clock, cost=5.0)
    res = search.search(recipes("a", "b"), evaluate, search.Budget(seconds=60.0, elapsed=clock))
    assert calls == ["a"] and res.skipped == ["b"]


def test_budget_uses_the_slowest_candidate_so_far() -> None:
    clock = Clock()
    budget = search.Budget(seconds=100.0, elapsed=clock)
    clock.now = 50.0
    assert budget.allows(None)
    assert budget.allows(29.0)  # 50 + 34.8 <= 85
    assert not budget.allows(30.0)  # 50 + 36 > 85


def test_reported_numbers_leave_out_what_is_not_finite_and_round_the_rest() -> None:
    q = {"spearman": 0.9987654321, "topk_agreement": NAN, "max_abs_diff": math.inf, "pairs": 840, "note": "x"}
    assert results.rounded(q) == {"spearman": 0.99877, "pairs": 840.0}
    assert results.rounded(q, 2) == {"spearman": 1.0, "pairs": 840.0}
    assert results.finite_values(q) == {"spearman": 0.9987654321, "pairs": 840.0}
    assert results.round_finite(NAN, 3) is None and results.round_finite(1.23456, 3) == 1.235


def test_a_large_models_search_skips_what_could_not_serve_faster_than_a_pass() -> None:
    """``skip_slower_after_pass`` (large models): after a candidate passes, later ones with the same kernels and at
    least as many FFN layers kept FP32 are skipped; a faster kind (another mode, fewer FP32 layers) is still tried,
    and errors or gate failures before the pass skip nothing."""
    emb8 = Recipe(name="emb8")
    ffn33 = Recipe(name="ffn33", fp32_ffn_down=1 / 3)
    table: dict[str, tuple[float, float, bool] | JobError] = {
        "emb8": (0.984, 300.0, False), "broken": JobError("QuantizationFailed", "boom"),
        "ffn33": (0.995, 260.0, True), "emb-fp32": (0.996, 290.0, True), "ffn100": (0.998, 200.0, True),
        "static": (0.993, 310.0, True)}
    cands = [emb8, Recipe(name="broken"), ffn33, Recipe(name="emb-fp32", embeddings="fp32"),
             Recipe(name="ffn100", fp32_ffn_down=1.0), Recipe(name="static", mode="static")]
    evaluate, calls = evaluate_from(table)
    res = search.search(cands, evaluate, no_deadline(), skip_slower_after_pass=True)
    # emb-fp32 keeps no FFN layer FP32: it could be faster than ffn33, so it is tried; ffn100 could not; static is
    # another kind of kernel.
    assert calls == ["emb8", "broken", "ffn33", "emb-fp32", "static"]
    assert res.skipped == ["ffn100"] and res.skipped_why.startswith(search.SLOWER) and "ffn100" in res.skipped_why
    assert search.not_faster(ffn33, emb8) and not search.not_faster(emb8, ffn33)
    evaluate, calls = evaluate_from(table)  # without the flag every candidate is tried
    res = search.search(cands, evaluate, no_deadline())
    assert calls == list(table) and res.skipped == [] and res.skipped_why == ""
