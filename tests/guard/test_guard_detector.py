"""quality_guard.detector: broken streams are caught within the benchmark's budget, healthy ones never, and the
state has hysteresis (a property test over stationary and switching streams)."""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quality_guard.compare import Agreement, agreement, sigmoid
from quality_guard.detector import Detector, Settings, average_ranks, kl_bernoulli, rate_exceeds, rate_within
from quantizer_job.steps.evaluation import metrics
from rerank_contracts.guard import Floor
from rerank_contracts.quantize_job import DEFAULT_MIN_SPEARMAN, DEFAULT_MIN_TOPK_AGREEMENT

FLOOR = Floor()  # the Job's gate: 0.99 / 0.9


#: Distinct requests scored per kind of pool; streams draw from them with replacement (as the benchmark draws held-out
#: queries), so a long stream costs a detector update per request, not a comparison.
BANK = 3000


@functools.cache
def bank(noise: float, shift: float, broken: float) -> tuple[Agreement, ...]:
    """Requests of 15 passages scored for real (by compare.agreement, as TEI's probabilities): reference logits
    spread like the trained fixture's; the pool adds ``noise`` to every logit and ``shift`` (a standard deviation)
    to all logits of a request; a ``broken`` share of requests has one NaN score (an overflow)."""
    g = np.random.default_rng(int(1000 * noise + 100 * shift + 10 * broken))
    out = []
    for _ in range(BANK):
        ref = g.normal(0.0, 0.8) + g.normal(-2.0, 1.6, 15)
        pool = ref + g.normal(0.0, noise, 15) + g.normal(0.0, shift)
        if g.random() < broken:
            pool[int(g.integers(15))] = np.nan
        out.append(agreement(sigmoid(ref), sigmoid(pool)))
    return tuple(out)


def stream(rng: random.Random, *, noise: float, shift: float = 0.0, broken: float = 0.0) -> Iterator[Agreement]:
    """A stationary stream of such requests, drawn with replacement by ``rng``."""
    requests = bank(noise, shift, broken)
    while True:
        yield requests[rng.randrange(BANK)]


def healthy(seed: int) -> Iterator[Agreement]:
    return stream(random.Random(seed), noise=0.1)  # pooled Spearman ~0.998, top-3 ~0.96


def first_transition(d: Detector, it: Iterator[Agreement], limit: int) -> int | None:
    for i in range(1, limit + 1):
        if d.observe(next(it)):
            return i
    return None


def test_the_floor_defaults_to_the_jobs_gate() -> None:
    assert (FLOOR.min_spearman, FLOOR.min_topk_agreement) == (DEFAULT_MIN_SPEARMAN, DEFAULT_MIN_TOPK_AGREEMENT)
    assert (DEFAULT_MIN_SPEARMAN, DEFAULT_MIN_TOPK_AGREEMENT) == (0.99, 0.9)  # docs/quantization.md's gate


@pytest.mark.parametrize("seed", range(5))
def test_a_pool_ranking_worse_is_caught_within_200_requests(seed: int) -> None:
    d = Detector(FLOOR)
    at = first_transition(d, stream(random.Random(seed), noise=0.5), 200)  # Spearman ~0.96, top-3 ~0.80
    assert at is not None and at >= d.settings.min_samples
    assert d.state == "below_floor"
    assert "below the floor" in d.reason


@pytest.mark.parametrize("seed", range(5))
def test_broken_scores_are_caught_by_the_failure_test(seed: int) -> None:
    d = Detector(FLOOR)  # otherwise healthy rankings: only the failures can tell
    at = first_transition(d, stream(random.Random(seed), noise=0.1, broken=0.2), 200)
    assert at is not None
    assert "failed" in d.reason


def test_a_spearman_drop_alone_is_caught() -> None:
    d = Detector(FLOOR)  # every request's ranking nearly intact, but its scores shifted: the Job's pooled Spearman
    at = first_transition(d, stream(random.Random(3), noise=0.05, shift=0.6), 200)
    assert at is not None and d.reason.startswith("Spearman"), d.reason
    per_request = d.status().figures.request_spearman
    assert math.isnan(per_request.mean) or per_request.mean > 0.99  # what a per-request mean would have missed


@pytest.mark.parametrize("seed", range(3))
def test_a_healthy_pool_stays_silent(seed: int) -> None:
    true_topk = float(np.mean([a.topk for a in bank(0.1, 0.0, 0.0)]))  # the stream's own top-3 mean
    d = Detector(FLOOR)
    it, covered = healthy(seed), 0
    for _ in range(50):  # 50 disjoint windows of 100 requests
        assert first_transition(d, it, d.settings.window) is None
        f = d.status().figures
        assert f.requests == d.settings.window and f.failures == 0
        covered += f.topk.low <= true_topk <= f.topk.high
    assert covered >= 42  # a 95% interval: 47.5 of 50 expected; 42 or fewer has probability < 0.2%


def test_a_pool_right_at_the_floor_does_not_flap() -> None:
    d = Detector(FLOOR)  # pooled Spearman ~0.99 and top-3 ~0.9: the floor itself
    it = stream(random.Random(11), noise=0.26)
    for _ in range(5000):
        d.observe(next(it))
    assert d.transitions <= 1


def test_recovery_takes_the_longer_window_and_is_decided_on_new_requests() -> None:
    d = Detector(FLOOR)
    bad = stream(random.Random(1), noise=0.6)
    at = first_transition(d, bad, 200)
    assert at is not None
    back = first_transition(d, healthy(2), 5000)
    assert back is not None and back >= d.settings.recovery_window
    assert d.state == "healthy" and d.transitions == 2
    assert "lower bound" in d.reason


def test_every_episode_waits_for_its_own_recovery_window() -> None:
    d = Detector(FLOOR)
    rng = random.Random(8)
    for episode in range(3):  # broken, recovered, broken again ...: old evidence never decides a new episode
        assert first_transition(d, stream(rng, noise=0.6), 200) is not None
        below_at = d.since
        assert first_transition(d, healthy(100 + episode), 5000) is not None
        assert d.since - below_at >= d.settings.recovery_window
    assert d.transitions == 6


def test_a_pool_still_broken_never_recovers() -> None:
    d = Detector(FLOOR)
    first_transition(d, stream(random.Random(5), noise=0.5), 200)
    assert d.state == "below_floor"
    assert first_transition(d, stream(random.Random(6), noise=0.5), 2000) is None


def test_requests_without_a_ranking_are_no_evidence() -> None:
    d = Detector(FLOOR)
    for _ in range(500):  # one passage each: nothing to rank, nothing broken
        assert not d.observe(agreement([0.3], [0.2]))
    f = d.status().figures
    assert f.spearman.n == 0 and math.isnan(f.spearman.mean) and f.failures == 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0, 3.0]) | st.floats(-5, 5), min_size=1, max_size=60))
def test_average_ranks_are_the_jobs_ranks(xs: list[float]) -> None:
    assert np.array_equal(average_ranks(np.array(xs)), metrics.rankdata(xs))


NO_FLOOR = Floor(min_spearman=-1.0, min_topk_agreement=0.0)  # never below: the figures of a whole window


def test_pooled_spearman_is_the_jobs_statistic_over_the_window() -> None:
    d = Detector(NO_FLOOR)
    reqs = list(bank(0.3, 0.2, 0.0)[:100])
    for a in reqs:
        d.observe(a)
    f = d.status().figures.spearman
    ref = np.concatenate([a.reference for a in reqs])
    got = np.concatenate([a.pool for a in reqs])
    assert f.n == 100
    assert f.mean == pytest.approx(metrics.spearman(ref, got), abs=1e-12)
    assert f.low < f.mean < f.high


def test_pooled_interval_is_about_as_wide_as_the_spread_between_windows() -> None:
    # the jackknife's standard error against the spread of the statistic over 30 independent windows
    reqs = bank(0.3, 0.2, 0.0)
    estimates, halves = [], []
    for w in range(30):
        d = Detector(NO_FLOOR)
        for a in reqs[w * 100:(w + 1) * 100]:
            d.observe(a)
        f = d.status().figures.spearman
        estimates.append(f.mean)
        halves.append((f.high - f.low) / 2)
    sd_between = float(np.std(estimates, ddof=1))
    se_jackknife = float(np.mean(halves)) / 1.959963984540054
    assert 0.6 < se_jackknife / sd_between < 1.6


def test_chernoff_helpers() -> None:
    assert kl_bernoulli(0.02, 0.02) == 0.0
    assert kl_bernoulli(0.0, 0.5) == pytest.approx(math.log(2))
    assert not rate_exceeds(2, 100, 0.02, 1e-6)  # exactly the allowed rate
    assert rate_exceeds(30, 100, 0.02, 1e-6)
    assert rate_within(0, 1000, 0.02, 0.01) and not rate_within(20, 1000, 0.02, 0.01)


def test_settings_enforce_hysteresis() -> None:
    with pytest.raises(ValueError):
        Settings(window=100, recovery_window=50)
    with pytest.raises(ValueError):
        Settings(window=10, min_samples=20)
    # A recovery window too short to ever show the failure rate under its limit would keep a pool out for good.
    with pytest.raises(ValueError, match="needs at least 188"):
        Settings(window=20, min_samples=10, recovery_window=40)
    quick = Settings(window=20, min_samples=10, recovery_window=40, max_failure_rate=0.1)
    assert rate_within(0, quick.recovery_window, quick.max_failure_rate, 0.5 * math.erfc(quick.z_recover / 2 ** 0.5))


# --- the property: stationary streams flip at most once; switching streams recover only after the window ---------
QUALITIES: dict[str, dict[str, float]] = {
    "healthy": dict(noise=0.1),  # pooled Spearman ~0.998, top-3 ~0.96
    "healthy-noisier": dict(noise=0.15),  # ~0.996, ~0.95
    "ranking-broken": dict(noise=0.5),  # ~0.96, ~0.80
    "spearman-broken": dict(noise=0.05, shift=0.6),  # rankings intact, scores shifted per request
    "scores-broken": dict(noise=0.1, broken=0.25),
}
BROKEN = {"ranking-broken", "spearman-broken", "scores-broken"}


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(QUALITIES)), seed=st.integers(0, 2**32 - 1), length=st.integers(200, 3000))
def test_stationary_streams_flip_at_most_once(kind: str, seed: int, length: int) -> None:
    d = Detector(FLOOR)
    it = stream(random.Random(seed), **QUALITIES[kind])
    flips = [i for i in range(1, length + 1) if d.observe(next(it))]
    assert len(flips) <= 1
    if kind in BROKEN:
        assert flips and flips[0] <= 200, "a broken stream is caught within 200 requests"
        assert d.state == "below_floor"
    else:
        assert not flips and d.state == "healthy"


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(bad=st.sampled_from(sorted(BROKEN)), good=st.sampled_from(["healthy", "healthy-noisier"]),
       seed=st.integers(0, 2**32 - 1), bad_length=st.integers(200, 600), recovery=st.integers(300, 600))
def test_flips_back_only_after_the_recovery_window(bad: str, good: str, seed: int, bad_length: int,
                                                  recovery: int) -> None:
    d = Detector(FLOOR, Settings(recovery_window=recovery))
    rng = random.Random(seed)
    b, g = stream(rng, **QUALITIES[bad]), stream(rng, **QUALITIES[good])
    went_below = first_transition(d, b, bad_length)
    assert went_below is not None and d.state == "below_floor"
    below_at = d.since
    for _ in range(bad_length - went_below):  # the rest of the broken spell keeps it below
        assert not d.observe(next(b))
    assert first_transition(d, g, 4 * recovery) is not None
    assert d.since - below_at >= recovery  # a full recovery window after going below
    assert d.transitions == 2
    assert first_transition(d, g, 1000) is None  # and it stays back
