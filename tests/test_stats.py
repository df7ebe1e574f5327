"""blockwidth.policy.stats against figures worked out by hand on fixed samples."""

from __future__ import annotations

import itertools
import math

import pytest

from blockwidth.policy import stats
from blockwidth.policy.stats import Estimate, Interval


# ---- the permutation p-value ------------------------------------------------------------------

@pytest.mark.parametrize("n, expected", [(3, 0.05), (4, 0.0143), (5, 0.00397)])
def test_disjoint_ranges_give_one_over_c_2n_n(n, expected):
    """All n of the arm above all n of classic: U = n^2, and only one labelling of the 2n
    values reaches it, so p = 1 / C(2n, n): 1/20, 1/70, 1/252."""
    arm = [100.0 + i for i in range(n)]
    classic = [90.0 + i for i in range(n)]
    test = stats.mann_whitney(arm, classic)
    assert test.u == n * n
    assert test.method == "exact"
    assert test.p == pytest.approx(1 / math.comb(2 * n, n))
    assert round(test.p, 5 if n == 5 else 4) == expected
    assert stats.disjoint_p(n, n) == pytest.approx(test.p)


def test_classic_closing_run_makes_the_disjoint_win_rarer():
    """With classic's closing run a session has n and n + 1 runs: 1 / C(7, 3) = 1/35 at n = 3."""
    assert stats.mann_whitney([5, 6, 7], [1, 2, 3, 4]).p == pytest.approx(1 / 35)


def test_p_value_of_an_overlap_by_hand():
    """x = 3, 5, 6 against y = 1, 2, 4: U = 2 + 3 + 3 = 8 of 9. Of the 20 ways to pick which
    three ranks are x's, U >= 8 needs rank sum >= 14: {4, 5, 6} (U = 9) and {3, 5, 6} (U = 8)."""
    test = stats.mann_whitney([3, 5, 6], [1, 2, 4])
    assert test.u == 8
    assert test.p == pytest.approx(2 / 20)


def test_p_value_with_ties_by_hand():
    """x = 2, 3, 3 against y = 1, 2, 3: U = 1.5 + 2.5 + 2.5 = 6.5. Pooled midranks
    1, 2.5, 2.5, 5, 5, 5; x's sum is 12.5. Of the 20 subsets of three, those summing to
    >= 12.5: the three 5s (one subset) and two 5s with a 2.5 (3 x 2 = 6): p = 7/20."""
    test = stats.mann_whitney([2, 3, 3], [1, 2, 3])
    assert test.u == 6.5
    assert test.p == pytest.approx(7 / 20)


def test_u_statistic_agrees_with_the_ranks():
    x, y = [3.0, 1.0, 4.0, 1.0, 5.0], [9.0, 2.0, 6.0, 5.0]
    assert stats.mann_whitney(x, y).u == stats.u_statistic(x, y) == 3.5


def test_p_value_direction_is_one_sided():
    assert stats.mann_whitney([1, 2, 3], [4, 5, 6]).p == 1.0  # every labelling has U >= 0


def test_above_the_exact_limit_monte_carlo_floor_and_agreement():
    """12 a side is 2.7 million labellings: seeded relabellings instead. Disjoint: no relabelling
    reaches U = 144 (1 in 2.7 million each), so p is its floor, 1 / (1 + 9,999)."""
    big = stats.mann_whitney([100.0 + i for i in range(12)], [float(i) for i in range(12)], seed=7)
    assert big.method == "monte carlo"
    assert big.p == pytest.approx(1 / 10_000)
    # forced onto the Monte Carlo path, a small case lands near its exact value
    x, y = [3, 5, 6, 8, 9], [1, 2, 4, 7, 10]
    exact = stats.mann_whitney(x, y).p
    mc = stats.mann_whitney(x, y, exact_limit=1, seed=3)
    assert mc.method == "monte carlo"
    assert abs(mc.p - exact) < 0.02
    assert stats.mann_whitney(x, y, exact_limit=1, seed=3) == mc  # seeded: the same again


def test_mann_whitney_refuses_an_empty_side():
    with pytest.raises(stats.StatsError):
        stats.mann_whitney([], [1.0])


# ---- the bootstrap -----------------------------------------------------------------------------

def test_quantile_type_7_by_hand():
    assert stats.quantile([1, 2, 3, 4], 0.5) == 2.5
    assert stats.quantile([1, 2, 3, 4], 0.025) == pytest.approx(1 + 0.075)
    assert stats.quantile([5], 0.9) == 5


def test_aggregate_is_tokens_over_time_not_a_mean_of_rates():
    # 10 tokens in 1 s and 10 in 4 s: 20 / 5 = 4 tok/s (the mean of rates would say 6.25)
    assert stats.aggregate([[(10, 1.0), (10, 4.0)]]) == 4.0
    assert stats.ratio([[(10, 0.5)]], [[(10, 1.0)]]) == 2.0


def test_bootstrap_one_request_by_hand():
    """Classic is 10 tok/s on every run; the width ran 10 tokens in 1 s and in 0.5 s. A resample
    of its two runs is (1 s, 1 s) with chance 1/4 (ratio 20/2/10 = 1), one of each with 1/2
    (20/1.5/10 = 4/3), (0.5 s, 0.5 s) with 1/4 (20/1/10 = 2). The 2.5 % and 97.5 % quantiles
    fall inside the outer quarters: the interval is exactly [1, 2]; the point ratio is 4/3."""
    classic = [[(10, 1.0), (10, 1.0), (10, 1.0)]]
    arm = [[(10, 1.0), (10, 0.5)]]
    est = stats.estimates(classic, {4: arm}, seed=11)[4]
    assert est.ratio == pytest.approx(4 / 3)
    assert est.ci == Interval(1.0, 2.0)
    reps = stats.bootstrap(classic, {4: arm}, seed=11)[4]
    assert sorted(set(round(r, 6) for r in reps)) == [1.0, 1.333333, 2.0]
    assert reps.count(2.0) / len(reps) == pytest.approx(0.25, abs=0.03)


def test_bootstrap_resamples_requests_by_hand():
    """Two requests, every run alike within each: classic 10 tokens in 1 s on both; the width 10
    in 0.5 s on request A and 10 in 1 s on B. Drawing the requests: (A, A) with chance 1/4 gives
    20/1 against 20/2 = 2; (A, B) or (B, A), 1/2, gives 20/1.5 against 10 = 4/3; (B, B), 1/4,
    gives 1. Interval [1, 2] again, and the point ratio is the whole workload's 4/3."""
    classic = [[(10, 1.0)] * 3, [(10, 1.0)] * 3]
    arm = [[(10, 0.5)] * 3, [(10, 1.0)] * 3]
    est = stats.estimates(classic, {"w8": arm}, seed=5)["w8"]
    assert est.ratio == pytest.approx(4 / 3)
    assert est.ci == Interval(1.0, 2.0)


def test_bootstrap_of_constant_samples_is_a_point():
    classic = [[(16, 2.0)] * 4]
    arm = [[(16, 1.0)] * 3]
    est = stats.estimates(classic, {2: arm}, seed=1)[2]
    assert (est.ratio, est.ci.lo, est.ci.hi) == (2.0, 2.0, 2.0)
    assert est.p == pytest.approx(1 / 35)  # ties within each side, all of one above the other


def test_bootstrap_matches_the_exact_bootstrap_distribution():
    """On a sample small enough to enumerate every resample, the seeded replicates' quantiles land
    near the exact bootstrap quantiles (Monte Carlo error only)."""
    classic = [[(10, 1.0), (10, 1.1), (10, 0.9)]]
    arm = [[(10, 0.7), (10, 0.8), (10, 0.6)]]
    exact = []
    for cs in itertools.product(classic[0], repeat=3):
        for ws in itertools.product(arm[0], repeat=3):
            exact.append(stats.ratio([list(ws)], [list(cs)]))
    reps = stats.bootstrap(classic, {2: arm}, seed=2)[2]
    for q in (0.025, 0.5, 0.975):
        assert stats.quantile(reps, q) == pytest.approx(stats.quantile(exact, q), rel=0.02)


def test_bootstrap_is_seeded():
    classic = [[(10, 1.0), (10, 1.2), (10, 0.9), (10, 1.05)], [(20, 2.2), (20, 2.0), (20, 1.9), (20, 2.1)]]
    arm = [[(10, 0.7), (10, 0.8), (10, 0.75)], [(20, 1.6), (20, 1.9), (20, 1.7)]]
    a = stats.estimates(classic, {3: arm}, seed=42)
    b = stats.estimates(classic, {3: arm}, seed=42)
    c = stats.estimates(classic, {3: arm}, seed=43)
    assert a == b
    assert a[3].ci != c[3].ci  # another seed, other replicates
    assert a[3].ci.lo < a[3].ratio < a[3].ci.hi


def test_bootstrap_refuses_mismatched_requests():
    with pytest.raises(stats.StatsError):
        stats.bootstrap([[(1, 1.0)]], {2: [[(1, 1.0)], [(1, 1.0)]]}, seed=0)
    with pytest.raises(stats.StatsError):
        stats.bootstrap([[]], {2: [[(1, 1.0)]]}, seed=0)


def test_passes_take_the_kth_run_of_every_request():
    # pass 1: 10 + 20 tokens in 1 + 2 s = 10; pass 2: 30 in 1.5 + 1.5 = 10; a third run on one
    # request only does not make a pass
    assert stats.passes([[(10, 1.0), (10, 1.5), (10, 9.0)], [(20, 2.0), (20, 1.5)]]) == [10.0, 10.0]


# ---- the rules ---------------------------------------------------------------------------------

def _est(r, lo, hi):
    return Estimate(r, Interval(lo, hi), 0.01, "exact")


def test_clears_needs_the_lower_end_above_one_plus_the_gain():
    assert stats.clears(_est(1.2, 1.031, 1.3))
    assert not stats.clears(_est(1.2, 1.03, 1.3))
    assert stats.clears(_est(1.2, 1.01, 1.3), min_gain=0.0)
    assert not stats.clears(_est(1.2, 1.01, 1.3), min_gain=0.05)


def test_tie_rule_takes_the_smallest_width_that_overlaps_the_best():
    """w8 is fastest (1.45x, 1.35-1.55); w4 (1.40x, 1.28-1.52) overlaps it; w2 (1.20x, 1.10-1.30)
    does not: width 4 is chosen, and the why-line says so."""
    figures = {2: _est(1.20, 1.10, 1.30), 4: _est(1.40, 1.28, 1.52), 8: _est(1.45, 1.35, 1.55)}
    choice = stats.choose(figures, [2, 4, 8])
    assert (choice.width, choice.best) == (4, 8)
    assert "smallest winning width whose interval overlaps the best's" in choice.why
    assert "w8" in choice.why and "not measurably faster" in choice.why


def test_tie_rule_keeps_the_best_when_no_smaller_width_overlaps():
    figures = {2: _est(1.10, 1.05, 1.15), 4: _est(1.40, 1.30, 1.50), 8: _est(1.38, 1.28, 1.48)}
    choice = stats.choose(figures, [2, 4, 8])
    assert (choice.width, choice.best) == (4, 4)
    assert choice.why.startswith("width 4 is the fastest winner")
    assert "w2 also wins" in choice.why


def test_tie_rule_only_among_winners_and_equal_ratios_go_small():
    figures = {2: _est(1.40, 1.30, 1.50), 4: _est(1.40, 1.31, 1.49), 8: _est(1.50, 1.45, 1.55)}
    assert stats.choose(figures, [4, 8]).width == 4  # w2 overlaps, but it did not win
    assert stats.choose(figures, [2, 4]).best == 2  # equal ratios: the smaller width is the best
    assert stats.choose(figures, []) is None


def test_estimate_serialises_what_sweep_json_shows():
    d = _est(1.23456, 1.1, 1.3).to_dict()
    assert d == {"ratio": 1.2346, "ratio_ci": [1.1, 1.3], "p_value": 0.01, "p_method": "exact"}


def test_an_interval_is_printed_rounded_outwards():
    """SmolLM2 + lookup on proofreading (real-cpu-2026-12-04c): 1.0252-1.1753 printed "[1.03,
    1.18]" beside "straddles the 1.03 minimum gain". Printed outwards, the low end is below the
    bar it misses, and an end that is already two digits stays as it is."""
    assert Interval(1.0252, 1.1753).shown() == ("1.02", "1.18")
    assert Interval(0.76, 0.83).shown() == ("0.76", "0.83")
    assert Interval(0.7549, 0.8301).shown() == ("0.75", "0.84")
    est = Estimate(1.0979, Interval(1.0252, 1.1753), 0.000583, "exact")
    assert est.describe() == "1.10x (95 % CI 1.02-1.18, p 0.00058)"
