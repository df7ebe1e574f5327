"""The auto width against hindsight, pure: the per-request oracle and the best single fixed width.

On a workload every arm ran every request. The **oracle** takes, for each request, the fixed arm
(classic or a width) that was fastest on it, in hindsight; the **best single fixed** arm is the
one fastest over the whole workload. Each figure is an aggregate, total new tokens over total
decode time, every request weighing by its own tokens and time as in ``policy.stats``; a
request's time for an arm is the mean of its runs there. ``auto``'s aggregate is reported as a
share of the oracle's and of the best fixed arm's, each with a bootstrap interval drawn as
``policy.stats.bootstrap`` draws (requests with replacement, then each arm's runs within each
drawn request), the oracle's and the best arm's picks made again in every replicate, so that
the interval carries hindsight's own luck. Seeded: a record reproduces its figures.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence

from blockwidth.policy import stats
from blockwidth.policy.stats import Interval, Requests, StatsError


def _mean_time(runs) -> tuple[float, float]:
    """(tokens, seconds) of a request's mean run."""
    n = len(runs)
    return sum(t for t, _ in runs) / n, sum(s for _, s in runs) / n


def _figures(per_arm: Mapping[Hashable, Sequence[tuple[float, float]]], auto_key: Hashable):
    """From each arm's (tokens, seconds) per request: (oracle, best fixed arm, its aggregate,
    auto's aggregate, the oracle's pick per request)."""
    fixed = [k for k in per_arm if k != auto_key]
    n_req = len(per_arm[auto_key])
    picks, tok, secs = [], 0.0, 0.0
    for j in range(n_req):
        # the fastest fixed arm on this request: the highest tokens per second (ties: the first)
        k = max(fixed, key=lambda a: per_arm[a][j][0] / per_arm[a][j][1] if per_arm[a][j][1] > 0 else math.inf)
        picks.append(k)
        tok += per_arm[k][j][0]
        secs += per_arm[k][j][1]
    oracle = tok / secs if secs > 0 else math.inf

    def agg(a):
        s = sum(x[1] for x in per_arm[a])
        return sum(x[0] for x in per_arm[a]) / s if s > 0 else math.inf

    best = max(fixed, key=agg)
    return oracle, best, agg(best), agg(auto_key), picks


@dataclass(frozen=True)
class Shares:
    """auto against hindsight on one workload."""

    auto_tok_s: float
    oracle_tok_s: float
    best_fixed: Hashable  # the fastest single fixed arm (None: classic)
    best_fixed_tok_s: float
    of_oracle: float  # auto / oracle
    of_oracle_ci: Interval
    of_best: float  # auto / best single fixed
    of_best_ci: Interval
    picks: tuple  # the oracle's arm per request (None: classic)
    requests: int
    seed: int
    resamples: int

    def describe(self, name=lambda k: "classic" if k is None else f"w{k}") -> str:
        return (f"auto {self.auto_tok_s:.1f} tok/s is {self.of_oracle:.1%} of the per-request oracle's "
                f"{self.oracle_tok_s:.1f} (95 % CI {self.of_oracle_ci.lo:.1%}-{self.of_oracle_ci.hi:.1%}) "
                f"and {self.of_best:.1%} of the best single fixed arm, {name(self.best_fixed)} at "
                f"{self.best_fixed_tok_s:.1f} (95 % CI {self.of_best_ci.lo:.1%}-{self.of_best_ci.hi:.1%}), "
                f"over {self.requests} requests")

    def to_dict(self, name=lambda k: "classic" if k is None else f"w{k}") -> dict:
        return {"auto_tok_s": round(self.auto_tok_s, 3), "oracle_tok_s": round(self.oracle_tok_s, 3),
                "best_fixed": name(self.best_fixed), "best_fixed_tok_s": round(self.best_fixed_tok_s, 3),
                "of_oracle": round(self.of_oracle, 4), "of_oracle_ci": self.of_oracle_ci.to_list(),
                "of_best": round(self.of_best, 4), "of_best_ci": self.of_best_ci.to_list(),
                "oracle_picks": [name(k) for k in self.picks], "requests": self.requests,
                "seed": self.seed, "resamples": self.resamples,
                "oracle": "per request, the fixed arm (classic or a width) fastest there in hindsight",
                "interval": "percentile bootstrap as policy.stats (requests, then runs); the oracle's "
                            "and the best arm's picks are made again in every replicate"}


def shares(arms: Mapping[Hashable, Requests], auto_key: Hashable, *, seed: int,
           resamples: int = stats.RESAMPLES, level: float = stats.LEVEL) -> Shares:
    """auto's aggregate as a share of the per-request oracle's and of the best single fixed
    arm's. ``arms``: every arm (classic as None, each width, and auto under ``auto_key``) with,
    per request, each run's (new tokens, decode seconds); every arm ran every request."""
    if auto_key not in arms or len(arms) < 2:
        raise StatsError("the oracle needs the auto arm and at least one fixed arm")
    n_req = len(arms[auto_key])
    for k, req in arms.items():
        if len(req) != n_req or any(not runs for runs in req):
            raise StatsError(f"{k}: every arm needs a run on each of the {n_req} requests")
    keys = list(arms)
    point = {k: [_mean_time(runs) for runs in arms[k]] for k in keys}
    oracle, best, best_agg, auto_agg, picks = _figures(point, auto_key)
    rng = random.Random(seed)
    below = stats._below  # the same stream as stats.bootstrap: random() only
    of_oracle, of_best = [], []
    for _ in range(resamples):
        drawn = [below(n_req, rng) for _ in range(n_req)]
        rep = {}
        for k in keys:
            rows = []
            for j in drawn:
                runs = arms[k][j]
                rows.append(_mean_time([runs[below(len(runs), rng)] for _ in range(len(runs))]))
            rep[k] = rows
        o, _, b, a, _ = _figures(rep, auto_key)
        of_oracle.append(a / o if o > 0 else math.inf)
        of_best.append(a / b if b > 0 else math.inf)
    return Shares(auto_agg, oracle, best, best_agg, auto_agg / oracle, stats.percentile_interval(of_oracle, level),
                  auto_agg / best_agg, stats.percentile_interval(of_best, level), tuple(picks), n_req,
                  seed, resamples)
