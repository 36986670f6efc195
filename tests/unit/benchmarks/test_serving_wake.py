"""benchmarks/serving_wake's reading of the p95 after a wake: from when on it stays back at the steady figure."""

from __future__ import annotations

from typing import Any

from benchmarks.serving_wake import back_to_steady_after, windows


def rows(*p95s: float | None) -> list[dict[str, Any]]:
    return [{"t": 5.0 * i, "n": 0 if p is None else 10, "p95_ms": p} for i, p in enumerate(p95s)]


def test_back_from_the_first_window_that_stays_within_the_tolerance() -> None:
    assert back_to_steady_after(rows(900, 600, 310, 320, 300), 300) == 10.0
    assert back_to_steady_after(rows(300, 310), 300) == 0.0


def test_a_window_over_it_later_starts_the_count_again() -> None:
    assert back_to_steady_after(rows(300, 900, 300, 300), 300) == 10.0
    assert back_to_steady_after(rows(300, 300, 900), 300) is None


def test_windows_without_answers_are_skipped_and_nothing_to_compare_is_none() -> None:
    assert back_to_steady_after(rows(900, None, 300), 300) == 10.0
    assert back_to_steady_after(rows(None, None), 300) is None
    assert back_to_steady_after(rows(300), None) is None


def test_the_windows_come_from_the_samples_sent_in_them_and_only_answered_ones_count() -> None:
    samples = [(0.5, 200, 0.9), (1.0, 200, 0.3), (6.0, 200, 0.31), (7.0, 503, 5.0), (12.0, 200, 0.2)]
    out = windows(samples)
    assert [r["n"] for r in out] == [2, 1, 1]
    assert back_to_steady_after(out, 300) == 5.0
