"""How long an A/B session takes on this host, from a pilot's measured rates: pure arithmetic.

A pilot (``engine.pace``) decodes a few tokens of one request, classic and at one width, and
keeps four rates: prefill and decode seconds per token, each for classic and for a speculative
arm (whose prefill feeds a model drafter too). A session's runs are then priced request by
request: prefill counts, for a short run on a CPU it is half of the time or more (a pre-run
estimate that left it out said 9.2 s for a run of minutes). What the session schedules (warm-ups,
n interleaved passes, classic's closing pass, sequential passes while the budget lasts) is
``engine.ab.interleave``'s; this prices it, and says whether a session can reach the repetitions
a win needs (``stats.runs_for``) inside its budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from blockwidth.policy import stats

# Between and around the runs (their records, the verdicts' bootstrap): the demo pair over
# @mixed spent 86.7 s for 82.3 s of runs, of which about 4 s was the exactness probe and the cost
# curve (``after_s``, priced apart: on SmolLM2 with one prompt they were a third of the session,
# and an estimate of 31 s ran 47).
OVERHEAD = 1.02
# What a session runs with no pilot to price it after its runs, as a share of them (the share
# the demo pair's first session spent on them all, 2026-12-04).
AFTER_SHARE = 0.05
# The cost curve's passes over its row counts (engine.ab: warm-up 2, repeats 5), each timed
# cold and warm.
CURVE_PASSES = 2 * (2 + 5)


@dataclass(frozen=True)
class Pace:
    """Seconds per token on this host, as a pilot measured them.

    A token costs more the longer the context it attends over: on the 2-core CPU the demo
    target's prefill took 1.5 ms a token at 26 prompt tokens and 2.5 at 780, its decode 5.1 ms
    a token and 8.0 (2026-12-04, @mixed). A pilot that also times classic on a longer prompt
    (``long_tokens`` > 0) prices each request at its own length, linearly between (and beyond)
    the two; without one every request is priced at the short prompt's rates (an estimate of
    65 s for a run of 87 s)."""

    prefill_s: float  # classic's prefill, per prompt token
    spec_prefill_s: float  # a speculative arm's prefill (a model drafter prefills too)
    decode_s: float  # classic's decode, per new token
    spec_decode_s: float  # at ``width``, per new token
    width: int
    at_tokens: int = 0  # the prompt those four were timed on
    new_tokens: int = 0  # new tokens a timed run decoded
    long_tokens: int = 0  # a longer prompt classic was timed on too (0: none)
    long_prefill_s: float = 0.0  # classic's prefill there, per prompt token
    long_decode_s: float = 0.0  # classic's decode after it, per new token
    wide_width: int = 0  # a wider width the pilot timed too (0: none)
    wide_decode_s: float = 0.0  # at ``wide_width``, per new token

    def spec_rate(self, width: int | str | None = None) -> float:
        """A speculative arm's decode seconds per new token at ``width``: linear in the width
        between (and past) the two the pilot timed; ``width``'s own where it timed one only,
        or for auto (a width per round) and None. On the demo pair over @mixed w2 took 6.9 ms a
        token and w4 8.6, w8 13.0: every arm priced at w2's said 82 s for a run of 105."""
        if (not isinstance(width, int) or self.wide_width <= self.width or width <= self.width):
            return self.spec_decode_s
        slope = (self.wide_decode_s - self.spec_decode_s) / (self.wide_width - self.width)
        return max(self.spec_decode_s + slope * (width - self.width), 0.5 * self.spec_decode_s)

    def _slopes(self) -> tuple[float, float]:
        """Seconds per token added by each token of context: prefill's, decode's (never below 0)."""
        if self.long_tokens <= self.at_tokens:
            return 0.0, 0.0
        span = self.long_tokens - self.at_tokens
        return (max(0.0, (self.long_prefill_s - self.prefill_s) / span),
                max(0.0, (self.long_decode_s - self.decode_s) / span))

    def prefill_total_s(self, prompt_tokens: int) -> float:
        """Classic's prefill of a prompt this long."""
        sp, _ = self._slopes()
        return prompt_tokens * (self.prefill_s + sp * max(prompt_tokens - self.at_tokens, 0))

    def step_s(self, context: int) -> float:
        """One classic step (a 1-row forward) after ``context`` tokens."""
        _, sd = self._slopes()
        return self.decode_s + sd * max(context - (self.at_tokens + self.new_tokens / 2), 0)

    def run_s(self, prompt_tokens: int, new_tokens: int, speculative: bool,
              width: int | str | None = None) -> float:
        """Seconds for one run: a prompt's prefill and its new tokens, classic or speculative
        (at ``width``, where the pilot timed two widths: ``spec_rate``)."""
        sp, sd = self._slopes()
        # at the pilot's own length or shorter, its rates; longer, what each token of context adds
        # (a speculative arm's in proportion to its own rates: its verify attends over as much)
        more_prompt = max(prompt_tokens - self.at_tokens, 0)
        more_ctx = max(prompt_tokens + new_tokens / 2 - (self.at_tokens + self.new_tokens / 2), 0)
        if speculative:
            pre = self.spec_prefill_s + sp * more_prompt * (self.spec_prefill_s / self.prefill_s if self.prefill_s > 0 else 1)
            rate = self.spec_rate(width)
            dec = rate + sd * more_ctx * (rate / self.decode_s if self.decode_s > 0 else 1)
        else:
            pre = self.prefill_s + sp * more_prompt
            dec = self.decode_s + sd * more_ctx
        return prompt_tokens * pre + new_tokens * dec

    def describe(self) -> str:
        def rate(s: float) -> str:
            return f"{1 / s:.0f}" if s > 0 else "-"

        wide = f", w{self.wide_width} {rate(self.wide_decode_s)}" if self.wide_width > self.width else ""
        said = (f"pilot: decode classic {rate(self.decode_s)} tok/s, w{self.width} {rate(self.spec_decode_s)}"
                f"{wide}; prefill {rate(self.prefill_s)} tok/s")
        if self.long_tokens > self.at_tokens:
            said += (f"; after {self.long_tokens} prompt tokens classic {rate(self.long_decode_s)}, "
                     f"prefill {rate(self.long_prefill_s)}")
        return said

    def to_dict(self) -> dict:
        return {"prefill_s_per_token": self.prefill_s, "spec_prefill_s_per_token": self.spec_prefill_s,
                "decode_s_per_token": self.decode_s, "spec_decode_s_per_token": self.spec_decode_s,
                "width": self.width, "at_tokens": self.at_tokens, "new_tokens": self.new_tokens,
                "long_tokens": self.long_tokens, "long_prefill_s_per_token": self.long_prefill_s,
                "long_decode_s_per_token": self.long_decode_s, "wide_width": self.wide_width,
                "wide_decode_s_per_token": self.wide_decode_s}


@dataclass(frozen=True)
class Shape:
    """What a session will run: its requests' (prompt tokens, new tokens), its widths and budget."""

    requests: tuple[tuple[int, int], ...]
    widths: int  # speculative arms (auto counts as one)
    n: int
    sequential: bool = False
    max_reps: int = 12
    max_seconds: float = 600.0
    arm_widths: tuple = ()  # each speculative arm's width (or "auto"); () prices each alike

    def spec_widths(self) -> tuple:
        return self.arm_widths if self.arm_widths else (None,) * self.widths


@dataclass(frozen=True)
class Plan:
    """What a session of these fields can do here, priced by a pilot."""

    need: int  # repetitions a win needs (its p can fall below stats.ALPHA)
    reached: int  # repetitions the session runs at least (n) or may add within its budget
    first_s: float  # seconds to the end of its n repetitions (closing pass and after included)
    need_s: float  # seconds to the end of ``need`` repetitions
    pass_s: float  # one repetition: every arm on every request
    start_need_s: float  # seconds from the start at which the ``need``-th repetition starts
    reached_s: float  # seconds to the end of ``reached`` repetitions (sequential: what it adds)

    @property
    def can_decide(self) -> bool:
        return self.reached >= self.need

    def seconds_for_need(self) -> int:
        """A seconds budget under which the ``need``-th repetition starts (budgets are checked
        before a repetition starts): half a repetition of slack past that start, in tens."""
        return max(10, int(math.ceil((self.start_need_s + 0.5 * self.pass_s) / 10) * 10))


def _arms(pace: Pace, shape: Shape, p: int, t: int) -> float:
    """Every arm once on a request of ``p`` prompt and ``t`` new tokens."""
    return pace.run_s(p, t, False) + sum(pace.run_s(p, t, True, w) for w in shape.spec_widths())


def _pass(pace: Pace, shape: Shape) -> float:
    return sum(_arms(pace, shape, p, t) for p, t in shape.requests)


def _warmup(pace: Pace, shape: Shape) -> float:
    return _arms(pace, shape, *shape.requests[0])


def _closing(pace: Pace, shape: Shape) -> float:
    return sum(pace.run_s(p, t, False) for p, t in shape.requests)


def after_s(pace: Pace, shape: Shape) -> float:
    """What a session runs after its runs (engine.ab), priced: the exactness probe of each fixed
    width (the first request's prefill, then about width + 2 forwards) and the cost curve (the
    prefill of a context past every request, then its passes over rows 1 and each fixed width,
    a row costing about a step: on a CPU every row costs; on a GPU the curve is milliseconds).
    0 where the shape names no widths (nothing to price it by)."""
    fixed = sorted({w for w in shape.arm_widths if isinstance(w, int) and not isinstance(w, bool)})
    if not fixed or not shape.requests:
        return 0.0
    p0 = shape.requests[0][0]
    probe = sum(pace.prefill_total_s(p0) + (w + 2) * pace.step_s(p0) for w in fixed)
    ctx = max(p + t for p, t in shape.requests) + max(fixed)
    curve = pace.prefill_total_s(ctx) + CURVE_PASSES * sum({1, *fixed}) * pace.step_s(ctx)
    return probe + curve


def seconds(pace: Pace, shape: Shape, reps: int) -> float:
    """Warm-ups, ``reps`` passes, classic's closing pass and what follows the runs."""
    return (_warmup(pace, shape) + reps * _pass(pace, shape) + _closing(pace, shape)) * OVERHEAD + after_s(pace, shape)


def plan(pace: Pace, shape: Shape, need: int | None = None) -> Plan:
    """How far a session of ``shape`` gets on this host: its n repetitions always run; in
    sequential mode another starts while the seconds budget (from the start) is not spent and
    the repetitions budget allows (the most it may add, if nothing is decided sooner)."""
    need = need or stats.runs_for()
    one = _pass(pace, shape)
    reached = shape.n
    if shape.sequential:
        while reached < shape.max_reps and (_warmup(pace, shape) + reached * one) * OVERHEAD < shape.max_seconds:
            reached += 1
            if reached >= need:
                break
    return Plan(need, reached, seconds(pace, shape, shape.n), seconds(pace, shape, max(need, shape.n)),
                one * OVERHEAD, (_warmup(pace, shape) + (need - 1) * one) * OVERHEAD,
                seconds(pace, shape, reached))


def minutes(s: float) -> str:
    """A duration as an operator reads an estimate: seconds under two minutes, else minutes."""
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


class Clock:
    """A running session's seconds left, from its own runs. Each run is priced by the pilot
    (``Pace.run_s`` at its request's length; with no pilot, every run alike) and the prices are
    scaled by what the runs finished so far took against their price: a pre-run estimate is one
    request's pilot (the drafts' acceptance and the host's load move it: 65 s said for 87 s on the
    demo pair over @mixed), this one is the session's own. What follows the runs (the exactness
    probe, the cost curve) is priced by ``after_s``, scaled alike; with no pilot, AFTER_SHARE of
    the runs."""

    def __init__(self, pace: Pace | None, shape: Shape, ids: tuple[str, ...] = ()):
        self._pace = pace
        # a workload's request ids in order (a single prompt's runs carry no id: "")
        self._lengths = dict(zip(ids or ("",), shape.requests))
        prices = [self._price(p, t, w) for p, t in shape.requests for w in ("classic", *shape.spec_widths())]
        self._mean = sum(prices) / len(prices) if prices else 1.0
        self._after = after_s(pace, shape) if pace is not None else None
        # runs start one after another (engine.ab numbers them in order): the runs before the one
        # under way are summed as they finish, so each call is a few operations (the CLI's
        # progress line asks once a token, during timed decodes)
        self._done = 0.0  # the prices of the runs before the one under way
        self._price_now: float | None = None  # the run under way's price
        self._run, self._start = 0, 0.0  # the run under way, and the session's clock as it began
        self._origin: float | None = None  # the clock as the first run began (auto calibrates before it)

    def _price(self, prompt: int, new: int, width: int | str | None) -> float:
        """A run's price; ``width`` "classic" for classic's, else a speculative arm's width."""
        if self._pace is None:
            return 1.0
        if width == "classic":
            return self._pace.run_s(prompt, new, False)
        return self._pace.run_s(prompt, new, True, width)

    def started(self, run: int, elapsed: float, request: str = "", arm: str = "") -> None:
        """Run ``run`` (0-based) started ``elapsed`` seconds into the session."""
        length = self._lengths.get(request)
        if length is None and len(self._lengths) == 1:  # one request: its runs carry no id
            length = next(iter(self._lengths.values()))
        width = ("classic" if arm.startswith("classic")
                 else int(arm[1:]) if arm[:1] == "w" and arm[1:].isdigit() else arm or None)
        if self._price_now is not None and run > self._run:
            self._done += self._price_now
        if self._origin is None:
            self._origin = elapsed
        self._price_now = self._mean if length is None else self._price(*length, width)
        self._run, self._start = run, elapsed

    def left_s(self, runs: int, now: float, after: bool = True) -> float | None:
        """Seconds left to the end of ``runs`` runs and what follows them (``after`` False: the
        runs alone), at ``now`` seconds into the session; None before a run has finished (nothing
        measured to scale by)."""
        spent = self._start - (self._origin or 0.0)  # the runs' time, not what came before them
        if self._run < 1 or self._done <= 0 or spent <= 0:
            return None
        scale = spent / self._done
        current = self._price_now if self._price_now is not None else self._mean
        left = max(runs - self._run - 1, 0)
        this = max(current * scale - (now - self._start), 0.0)
        tail = self._after if self._after is not None else AFTER_SHARE * self._mean * runs
        # what the pilot does not time (between runs) is priced on the runs still to come, the
        # one under way included: a session's last run has only its own share left to pay
        overhead = (OVERHEAD - 1) * scale * (current + left * self._mean)
        return this + left * self._mean * scale + overhead + (scale * tail if after else 0.0)
