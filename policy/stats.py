"""The statistics behind a verdict: a permutation p-value, a bootstrap interval of the speed-up,
the win rule and the tie rule. Pure: values in, values out; seeded, so a record reproduces its
own figures from its own samples.

The unit of a sample is one run: (new tokens, decode seconds). A request has several runs per
arm (its repetitions); a workload has several requests. An arm's **aggregate** is its total new
tokens over its total decode time, and the **speed-up** of a width is the ratio of its aggregate
to classic's. Every request weighs by its own tokens and time, as it would in service.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence, TypeVar

from blockwidth.policy.errors import BlockwidthError

K = TypeVar("K", bound=Hashable)

Sample = tuple[float, float]  # (new tokens, decode seconds) of one run
Requests = Sequence[Sequence[Sample]]  # per request, its runs

MIN_GAIN = 0.03  # a win must be at least 3 % faster, at the interval's lower end
LEVEL = 0.95  # the interval's coverage
# A win's permutation p must be below this too: a bootstrap interval of two runs a side can clear
# the bar by luck (n = 2 printed "1.74x [1.11, 2.63] p 0.1 wins"), and no p of so few runs can be
# small. With classic's closing run the smallest p is 1 / C(2n + 1, n): 0.1 at n = 2, 1/35 at 3.
ALPHA = 0.05
RESAMPLES = 4000  # bootstrap replicates: the 2.5 % quantile rests on ~100 of them
EXACT_LIMIT = 100_000  # arrangements enumerated exactly (n = 9 a side with classic's closing run)
PERMUTATIONS = 9_999  # Monte Carlo relabellings above the limit: p is at least 1 / 10,000


class StatsError(BlockwidthError, ValueError):
    """Samples the statistics cannot be computed from (none, no time, unequal requests)."""


# ---- the permutation (Mann-Whitney) p-value ---------------------------------------------------

def u_statistic(x: Sequence[float], y: Sequence[float]) -> float:
    """Mann-Whitney U of ``x`` against ``y``: pairs where x is larger, ties counting one half."""
    return sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y)


def _doubled_midranks(values: Sequence[float]) -> list[int]:
    """Twice each value's midrank in ``values`` (integers, so sums compare exactly)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = i + j + 2  # 2 x the mean of ranks i+1 .. j+1
        i = j + 1
    return ranks


@dataclass(frozen=True)
class Test:
    """A one-sided test that ``x`` is larger than ``y``: U, its p-value and how p was found."""

    u: float
    p: float
    method: str  # "exact" (every arrangement counted) or "monte carlo" (seeded relabellings)


def mann_whitney(x: Sequence[float], y: Sequence[float], *, seed: int = 0,
                 permutations: int = PERMUTATIONS, exact_limit: int = EXACT_LIMIT) -> Test:
    """The one-sided permutation p-value of "x is larger than y" with the U statistic.

    p is the share of the C(m+n, m) ways of labelling the pooled values m "x" and n "y" whose U
    is at least the observed one (ties take midranks, so p is exact with ties too). When x is
    entirely above y, U = mn and p = 1 / C(m+n, m): 1/20 = 0.05 at 3 a side, 1/70 at 4, 1/252
    at 5. Up to ``exact_limit`` arrangements are enumerated; above it, ``permutations`` seeded
    random relabellings give p = (1 + hits) / (1 + permutations), a valid p-value (never below
    the chance it claims) whose floor is 1 / (1 + permutations)."""
    m, n = len(x), len(y)
    if not m or not n:
        raise StatsError("a test needs at least one sample on each side")
    pooled = list(x) + list(y)
    ranks = _doubled_midranks(pooled)
    observed = sum(ranks[:m])  # 2 x (U + m(m+1)/2): the same order as U
    u = observed / 2 - m * (m + 1) / 2
    total = math.comb(m + n, m)
    if total <= exact_limit:
        hits = sum(1 for c in itertools.combinations(ranks, m) if sum(c) >= observed)
        return Test(u, hits / total, "exact")
    rng = random.Random(seed)
    hits = 0
    idx = list(range(m + n))
    for _ in range(permutations):
        _shuffle(idx, rng)
        if sum(ranks[i] for i in idx[:m]) >= observed:
            hits += 1
    return Test(u, (1 + hits) / (1 + permutations), "monte carlo")


def disjoint_p(m: int, n: int) -> float:
    """The chance, under no difference, that all m samples of one arm beat all n of another
    (the disjoint-range win): 1 / C(m+n, m)."""
    return 1 / math.comb(m + n, m)


# ---- the bootstrap interval of the speed-up ---------------------------------------------------

def _below(n: int, rng: random.Random) -> int:
    # random() is the one stream Python promises to keep for a seed across versions;
    # randrange and choices may change how they consume it.
    return min(int(rng.random() * n), n - 1)


def _shuffle(items: list, rng: random.Random) -> None:
    for i in range(len(items) - 1, 0, -1):
        j = _below(i + 1, rng)
        items[i], items[j] = items[j], items[i]


def aggregate(requests: Requests) -> float:
    """Total new tokens over total decode seconds, over every run of every request."""
    tokens = sum(t for runs in requests for t, _ in runs)
    secs = sum(s for runs in requests for _, s in runs)
    if secs <= 0:
        raise StatsError("no decode time to divide by")
    return tokens / secs


def ratio(arm: Requests, classic: Requests) -> float:
    """The speed-up: the arm's aggregate over classic's."""
    return aggregate(arm) / aggregate(classic)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile of ``values`` by linear interpolation between order statistics (the
    usual "type 7" definition: numpy's default, statistics.quantiles' inclusive method)."""
    s = sorted(values)
    if not s:
        raise StatsError("no values")
    h = (len(s) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (h - lo) * (s[hi] - s[lo])


def _check_shape(classic: Requests, arms: Mapping[K, Requests]) -> None:
    if not classic or any(not runs for runs in classic):
        raise StatsError("classic needs at least one run on every request")
    for k, req in arms.items():
        if len(req) != len(classic):
            raise StatsError(f"{k}: {len(req)} requests, classic has {len(classic)}")
        if any(not runs for runs in req):
            raise StatsError(f"{k}: no run on some request")


def bootstrap(classic: Requests, arms: Mapping[K, Requests], *, seed: int,
              resamples: int = RESAMPLES) -> dict[K, list[float]]:
    """Bootstrap replicates of every arm's speed-up over classic.

    One replicate draws the requests with replacement (as many as there are; with one request
    it is always that one), then, for each drawn request, the runs of every arm (classic too)
    with replacement, as many as the arm had there; its speed-up is the ratio of the resampled
    aggregates. Requests are drawn once per replicate for all arms, so every arm's replicate
    sees the same mix; classic is drawn once per replicate and shared. Resampling both stages
    counts the run-to-run noise twice over, a little: the interval errs wide, not narrow."""
    _check_shape(classic, arms)
    rng = random.Random(seed)
    keys = list(arms)
    n_req = len(classic)
    out: dict[K, list[float]] = {k: [] for k in keys}
    sides = [classic] + [arms[k] for k in keys]
    for _ in range(resamples):
        picks = [_below(n_req, rng) for _ in range(n_req)]
        aggs = []
        for side in sides:
            tok = secs = 0.0
            for j in picks:
                runs = side[j]
                for _ in range(len(runs)):
                    t, s = runs[_below(len(runs), rng)]
                    tok += t
                    secs += s
            aggs.append(tok / secs if secs > 0 else math.inf)
        base = aggs[0]
        for k, a in zip(keys, aggs[1:]):
            out[k].append(a / base if base > 0 else math.inf)
    return out


@dataclass(frozen=True)
class Interval:
    lo: float
    hi: float

    def overlaps(self, other: "Interval") -> bool:
        return self.lo <= other.hi and other.lo <= self.hi

    def to_list(self, digits: int = 4) -> list[float]:
        return [round(self.lo, digits), round(self.hi, digits)]

    def shown(self, digits: int = 2) -> tuple[str, str]:
        """Its ends as printed, rounded outwards (the low end down, the high end up): a lower
        end of 1.0252 printed as 1.03 sat beside "straddles the 1.03 minimum gain"."""
        f = 10 ** digits
        # the small nudge keeps an end stored at exactly two digits (0.76 is 0.7599999...) where it is
        lo, hi = math.floor(self.lo * f + 1e-9) / f, math.ceil(self.hi * f - 1e-9) / f
        return f"{lo:.{digits}f}", f"{hi:.{digits}f}"


def request_spread(classic: Requests, arm: Requests, *, seed: int, resamples: int = RESAMPLES,
                   level: float = LEVEL) -> tuple[Interval, float, float]:
    """What more repetitions cannot narrow: the speed-up's interval when only the requests are
    drawn (each request's runs all kept, as if its run-to-run noise were gone), and the lowest
    and highest speed-up of one request. ``bootstrap`` draws the runs as well, so its interval
    shrinks towards this one as repetitions are added, never below it: where this one straddles
    a bar, no number of repetitions of this workload decides against that bar."""
    _check_shape(classic, {"arm": arm})
    rng = random.Random(seed)
    tok_c = [sum(t for t, _ in runs) for runs in classic]
    sec_c = [sum(s for _, s in runs) for runs in classic]
    tok_a = [sum(t for t, _ in runs) for runs in arm]
    sec_a = [sum(s for _, s in runs) for runs in arm]
    n = len(classic)
    reps = []
    for _ in range(resamples):
        picks = [_below(n, rng) for _ in range(n)]
        c = sum(tok_c[j] for j in picks) / max(sum(sec_c[j] for j in picks), 1e-12)
        a = sum(tok_a[j] for j in picks) / max(sum(sec_a[j] for j in picks), 1e-12)
        reps.append(a / c)
    per = [(tok_a[j] / sec_a[j]) / (tok_c[j] / sec_c[j]) for j in range(n) if sec_a[j] > 0 and sec_c[j] > 0]
    if not per:
        raise StatsError("request_spread: no request took any decode time")
    return percentile_interval(reps, level), min(per), max(per)


def percentile_interval(replicates: Sequence[float], level: float = LEVEL) -> Interval:
    tail = (1 - level) / 2
    return Interval(quantile(replicates, tail), quantile(replicates, 1 - tail))


@dataclass(frozen=True)
class Estimate:
    """A width's speed-up over classic: the point ratio, its interval, its p-value."""

    ratio: float
    ci: Interval
    p: float
    p_method: str
    # The smallest p these counts can give (every run of the arm above every run of classic's):
    # when it is not below ALPHA, no result of this many runs is a win; more runs are.
    p_floor: float | None = None

    def describe(self) -> str:
        return f"{self.ratio:.2f}x (95 % CI {'-'.join(self.ci.shown())}, p {self.p:.2g})"

    def to_dict(self) -> dict:
        return {"ratio": round(self.ratio, 4), "ratio_ci": self.ci.to_list(),
                "p_value": round(self.p, 6), "p_method": self.p_method}


def estimates(classic: Requests, arms: Mapping[K, Requests], *, seed: int,
              resamples: int = RESAMPLES, level: float = LEVEL) -> dict[K, Estimate]:
    """Every arm's Estimate against classic, from the samples alone and ``seed``.

    The p-value compares the arm's passes with classic's: a pass is one run of every request
    (the k-th run of each), summarised by its aggregate; with one request a pass is a run."""
    _check_shape(classic, arms)
    reps = bootstrap(classic, arms, seed=seed, resamples=resamples)
    c_pass = passes(classic)
    out = {}
    for k, req in arms.items():
        a_pass = passes(req)
        test = mann_whitney(a_pass, c_pass, seed=seed)
        out[k] = Estimate(ratio(req, classic), percentile_interval(reps[k], level), test.p, test.method,
                          disjoint_p(len(a_pass), len(c_pass)))
    return out


def passes(requests: Requests) -> list[float]:
    """The aggregate of each pass: the k-th run of every request (as many passes as the
    fewest runs any request has)."""
    count = min(len(runs) for runs in requests)
    out = []
    for k in range(count):
        tok = sum(runs[k][0] for runs in requests)
        secs = sum(runs[k][1] for runs in requests)
        out.append(tok / secs if secs > 0 else math.inf)
    return out


# ---- the rules --------------------------------------------------------------------------------

def clears(est: Estimate, min_gain: float = MIN_GAIN) -> bool:
    """The interval rule: the speed-up's lower end is above 1 + min_gain."""
    return est.ci.lo > 1 + min_gain


def significant(est: Estimate, alpha: float = ALPHA) -> bool:
    """The p rule: the permutation p-value is below ``alpha`` (a win needs it beside the interval)."""
    return est.p < alpha


def runs_for(alpha: float = ALPHA, closing: int = 1) -> int:
    """The fewest runs (or passes) a side at which a win's p can fall below ``alpha``, with
    ``closing`` extra classic runs (its closing bracket): the smallest n with 1 / C(2n + closing, n)
    below alpha."""
    n = 1
    while disjoint_p(n, n + closing) >= alpha:
        n += 1
    return n


@dataclass(frozen=True)
class Choice:
    width: int
    best: int  # the winner with the highest speed-up
    why: str


def _rank(w) -> tuple[int, int]:
    """The tie rule's order: fixed widths by size, then auto (policy.auto.AUTO), which needs a
    controller and which a server that takes one width cannot run."""
    return (1, 0) if isinstance(w, str) else (0, w)


def _name(w) -> str:
    return str(w) if isinstance(w, str) else f"w{w}"


def _lead(w) -> str:
    return f"the {w} width" if isinstance(w, str) else f"width {w}"


def choose(figures: Mapping[int, Estimate], winners: Iterable[int]) -> Choice | None:
    """The tie rule: among the winning widths, the smallest whose interval overlaps the best's.

    A larger width that is not measurably faster (its interval overlaps a smaller one's) costs
    more per round and loses more when acceptance falls, so the smaller one is chosen. Two
    95 % intervals that overlap may still differ at 5 %: overlap is the cautious side, it
    prefers the smaller width whenever the evidence for the larger one is not plain. ``auto``
    ranks after every fixed width: it is chosen only when it is measurably faster than each."""
    ws = sorted(set(winners), key=_rank)
    if not ws:
        return None
    # equal ratios: the smaller width
    best = max(ws, key=lambda w: (figures[w].ratio, tuple(-x for x in _rank(w))))
    top = figures[best]
    pick = next(w for w in ws if figures[w].ci.overlaps(top.ci))
    if pick == best:
        why = f"{_lead(best)} is the fastest winner: {top.describe()}"
        smaller = [w for w in ws if _rank(w) < _rank(best)]
        if smaller:
            why += (f"; {', '.join(_name(w) for w in smaller)} also win{'s' if len(smaller) == 1 else ''}, "
                    f"but {'its interval lies' if len(smaller) == 1 else 'their intervals lie'} below the best's")
    else:
        why = (f"{_lead(pick)} at {figures[pick].describe()} is the smallest winning width whose "
               f"interval overlaps the best's ({_name(best)} {top.describe()}): {_name(best)} is not "
               f"measurably faster, and a smaller width costs less per round"
               + (" (auto ranks after every fixed width: a server takes one width)" if best == "auto" else ""))
    return Choice(pick, best, why)
