"""auto against hindsight (policy.oracle): the per-request oracle and the best single fixed arm on
fixed samples, worked by hand; seeded intervals; samples it cannot use refused."""

import pytest

from blockwidth.policy import oracle
from blockwidth.policy.stats import StatsError

# Two requests of 10 tokens, one run per arm each: times in seconds
ARMS = {None: [[(10, 1.0)], [(10, 1.0)]],
        2: [[(10, 0.5)], [(10, 2.0)]],
        4: [[(10, 0.8)], [(10, 0.9)]],
        "auto": [[(10, 0.6)], [(10, 1.0)]]}


def test_the_oracle_and_the_best_fixed_arm_by_hand():
    s = oracle.shares(ARMS, "auto", seed=1, resamples=200)
    # the oracle: w2 on request 1 (0.5 s), w4 on request 2 (0.9 s): 20 tokens in 1.4 s
    assert s.picks == (2, 4) and s.oracle_tok_s == pytest.approx(20 / 1.4)
    # one arm for the whole workload: classic 20 / 2.0, w2 20 / 2.5, w4 20 / 1.7 -> w4
    assert s.best_fixed == 4 and s.best_fixed_tok_s == pytest.approx(20 / 1.7)
    assert s.auto_tok_s == pytest.approx(20 / 1.6)
    assert s.of_oracle == pytest.approx(1.4 / 1.6) and s.of_best == pytest.approx(1.7 / 1.6)
    assert s.of_oracle_ci.lo <= s.of_oracle <= s.of_oracle_ci.hi
    # auto can beat the best single arm (it adapts per request) but not a per-request oracle
    # that ran its picks: its replicates stay at or under 1 here
    assert s.of_oracle_ci.hi <= 1.0 and s.of_best_ci.hi > 1.0
    d = s.to_dict()
    assert d["best_fixed"] == "w4" and d["oracle_picks"] == ["w2", "w4"] and d["of_oracle_ci"] == s.of_oracle_ci.to_list()
    assert "87.5% of the per-request oracle" in s.describe()


def test_classic_is_among_the_oracles_arms():
    arms = {None: [[(10, 0.5)]], 2: [[(10, 1.0)]], "auto": [[(10, 0.5)]]}
    s = oracle.shares(arms, "auto", seed=0, resamples=50)
    assert s.picks == (None,) and s.best_fixed is None and s.of_oracle == pytest.approx(1.0)


def test_a_request_time_is_the_mean_of_its_runs_and_the_interval_is_seeded():
    arms = {None: [[(8, 1.0), (8, 3.0)], [(8, 1.0), (8, 1.0)], [(8, 2.0), (8, 2.2)]],
            3: [[(8, 0.5), (8, 1.5)], [(8, 1.2), (8, 1.4)], [(8, 1.0), (8, 1.1)]],
            "auto": [[(8, 0.9), (8, 1.1)], [(8, 1.0), (8, 1.2)], [(8, 1.0), (8, 1.2)]]}
    a = oracle.shares(arms, "auto", seed=7, resamples=300)
    # request 1: classic 2.0 s, w3 1.0 s -> w3; request 2: classic 1.0, w3 1.3 -> classic; 3: w3
    assert a.picks == (3, None, 3)
    assert a.oracle_tok_s == pytest.approx(24 / (1.0 + 1.0 + 1.05))
    assert a == oracle.shares(arms, "auto", seed=7, resamples=300)  # a record reproduces it
    assert a.of_oracle_ci != oracle.shares(arms, "auto", seed=8, resamples=300).of_oracle_ci


def test_samples_it_cannot_use_are_refused():
    with pytest.raises(StatsError, match="auto arm and at least one fixed arm"):
        oracle.shares({None: [[(1, 1.0)]]}, "auto", seed=0)
    with pytest.raises(StatsError, match="every arm needs a run on each"):
        oracle.shares({None: [[(1, 1.0)], []], "auto": [[(1, 1.0)], [(1, 1.0)]]}, "auto", seed=0)
