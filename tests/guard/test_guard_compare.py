"""quality_guard.compare on hand-worked requests: every expected figure is worked out here, not read back."""

from __future__ import annotations

import math

import numpy as np
import pytest

from quality_guard.compare import FP16_MAX, agreement, sigmoid

REF = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]  # passages 0..5, best first


def test_identical_ranking_agrees_fully() -> None:
    a = agreement(REF, REF)
    assert a.spearman == 1.0
    assert a.topk == 1.0
    assert a.max_abs_diff == 0.0
    assert not a.broken


def test_same_order_other_scale_still_ranks_the_same() -> None:
    a = agreement(REF, [s / 2 for s in REF])
    assert a.spearman == pytest.approx(1.0)
    assert a.topk == 1.0
    assert a.max_abs_diff == pytest.approx(0.45)  # the largest score, 0.9, halved


def test_reversed_ranking_is_minus_one_and_shares_no_top3() -> None:
    a = agreement(REF, REF[::-1])
    assert a.spearman == pytest.approx(-1.0)
    assert a.topk == 0.0  # top-3 {0,1,2} vs {3,4,5}


def test_a_swap_across_the_top3_boundary() -> None:
    # passages 2 and 3 trade places: top-3 becomes {0, 1, 3}; ranks differ by 1 at two places of six.
    pool = [0.9, 0.8, 0.6, 0.7, 0.5, 0.4]
    a = agreement(REF, pool)
    n = 6
    assert a.spearman == pytest.approx(1 - 6 * 2 / (n * (n * n - 1)))
    assert a.topk == pytest.approx(2 / 3)


def test_a_swap_inside_the_top3_keeps_top3_agreement() -> None:
    a = agreement(REF, [0.8, 0.9, 0.7, 0.6, 0.5, 0.4])
    assert a.topk == 1.0
    assert a.spearman < 1.0


def test_k_is_configurable() -> None:
    pool = [0.9, 0.8, 0.6, 0.7, 0.5, 0.4]
    assert agreement(REF, pool, k=1).topk == 1.0
    assert agreement(REF, pool, k=4).topk == 1.0  # {0,1,2,3} either way
    assert agreement(REF, pool, k=3).topk == pytest.approx(2 / 3)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_pool_scores_are_broken(bad: float) -> None:
    pool = list(REF)
    pool[4] = bad
    a = agreement(REF, pool)
    assert a.broken
    assert a.nonfinite == 1
    assert math.isnan(a.spearman) and math.isnan(a.topk)
    assert a.max_abs_diff == math.inf


def test_saturated_probabilities_are_broken_even_if_the_order_survives() -> None:
    # An FP16 overflow to +inf becomes exactly 1.0 after the sigmoid; the top two tie at the bound.
    pool = [1.0, 1.0, 0.7, 0.6, 0.5, 0.4]
    a = agreement(REF, pool)
    assert a.saturated == 2
    assert a.broken
    assert a.nonfinite == 0


def test_a_reference_at_the_bound_does_not_make_the_pool_saturated() -> None:
    ref = [1.0, 0.8, 0.7, 0.6]
    assert agreement(ref, ref).saturated == 0


def test_raw_scores_saturate_at_the_fp16_maximum() -> None:
    ref = [9.0, 3.0, -1.0, -4.0]
    a = agreement(ref, [FP16_MAX, 3.0, -1.0, -4.0], raw=True)
    assert a.saturated == 1 and a.broken
    # 9.0 is no bound for a raw logit (as a probability it would be past 1)
    assert agreement(ref, ref, raw=True).saturated == 0


def test_fewer_than_two_passages_say_nothing_about_the_ranking() -> None:
    a = agreement([0.3], [0.2])
    assert math.isnan(a.spearman) and math.isnan(a.topk)
    assert not a.broken
    assert a.max_abs_diff == pytest.approx(0.1)


def test_topk_needs_more_than_k_passages() -> None:
    a = agreement([0.9, 0.5, 0.1], [0.1, 0.5, 0.9])
    assert math.isnan(a.topk)
    assert a.spearman == pytest.approx(-1.0)


def test_ties_get_average_ranks() -> None:
    # reference ranks: 1, 2.5, 2.5, 4 (ascending); pool strictly increasing 1, 2, 3, 4.
    ref, pool = [0.1, 0.5, 0.5, 0.9], [0.1, 0.4, 0.6, 0.9]
    rx, ry = np.array([1, 2.5, 2.5, 4]), np.array([1.0, 2, 3, 4])
    rx, ry = rx - rx.mean(), ry - ry.mean()
    expected = float((rx * ry).sum() / math.sqrt((rx * rx).sum() * (ry * ry).sum()))
    assert agreement(ref, pool).spearman == pytest.approx(expected)


def test_a_constant_reference_cannot_rank_and_a_constant_pool_ranks_nothing() -> None:
    assert math.isnan(agreement([0.5, 0.5, 0.5], [0.1, 0.2, 0.3]).spearman)
    assert agreement([0.1, 0.2, 0.3], [0.5, 0.5, 0.5]).spearman == 0.0


def test_shapes_and_reference_are_checked() -> None:
    with pytest.raises(ValueError):
        agreement([0.1, 0.2], [0.1])
    with pytest.raises(ValueError):
        agreement([0.1, math.nan], [0.1, 0.2])


def test_sigmoid_is_teis_probability_and_saturates_in_float32() -> None:
    got = sigmoid([0.0, 2.0, math.inf, -math.inf, math.nan, 40.0])
    assert got.dtype == np.float32
    assert got[0] == 0.5
    assert got[1] == pytest.approx(1 / (1 + math.exp(-2.0)), rel=1e-6)
    assert got[2] == 1.0 and got[3] == 0.0 and math.isnan(got[4])
    assert got[5] == 1.0  # float32 cannot tell sigmoid(40) from 1
