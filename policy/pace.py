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

# Verdicts, the exactness probe and the cost curve after the runs: the default first session on
# the 2-core CPU spent 253 s for 237 s of runs (2026-12-04, @mixed, n 2).
OVERHEAD = 1.07


@dataclass(frozen=True)
class Pace:
    """Seconds per token on this host, as a pilot measured them."""

    prefill_s: float  # classic's prefill, per prompt token
    spec_prefill_s: float  # a speculative arm's prefill (a model drafter prefills too)
    decode_s: float  # classic's decode, per new token
    spec_decode_s: float  # at ``width``, per new token
    width: int

    def run_s(self, prompt_tokens: int, new_tokens: int, speculative: bool) -> float:
        if speculative:
            return prompt_tokens * self.spec_prefill_s + new_tokens * self.spec_decode_s
        return prompt_tokens * self.prefill_s + new_tokens * self.decode_s

    def describe(self) -> str:
        def rate(s: float) -> str:
            return f"{1 / s:.0f}" if s > 0 else "-"

        return (f"pilot: decode classic {rate(self.decode_s)} tok/s, w{self.width} {rate(self.spec_decode_s)}; "
                f"prefill {rate(self.prefill_s)} tok/s")

    def to_dict(self) -> dict:
        return {"prefill_s_per_token": self.prefill_s, "spec_prefill_s_per_token": self.spec_prefill_s,
                "decode_s_per_token": self.decode_s, "spec_decode_s_per_token": self.spec_decode_s,
                "width": self.width}


@dataclass(frozen=True)
class Shape:
    """What a session will run: its requests' (prompt tokens, new tokens), its widths and budget."""

    requests: tuple[tuple[int, int], ...]
    widths: int  # speculative arms (auto counts as one)
    n: int
    sequential: bool = False
    max_reps: int = 12
    max_seconds: float = 600.0


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


def _pass(pace: Pace, shape: Shape) -> float:
    return sum(pace.run_s(p, t, False) + shape.widths * pace.run_s(p, t, True) for p, t in shape.requests)


def _warmup(pace: Pace, shape: Shape) -> float:
    p, t = shape.requests[0]
    return pace.run_s(p, t, False) + shape.widths * pace.run_s(p, t, True)


def _closing(pace: Pace, shape: Shape) -> float:
    return sum(pace.run_s(p, t, False) for p, t in shape.requests)


def seconds(pace: Pace, shape: Shape, reps: int) -> float:
    """Warm-ups, ``reps`` passes, classic's closing pass and what follows the runs."""
    return (_warmup(pace, shape) + reps * _pass(pace, shape) + _closing(pace, shape)) * OVERHEAD


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
