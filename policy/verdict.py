"""The verdict rules of an A/B session, pure: decode speeds in, verdicts and a decision out.

- a width **wins** only if its slowest run beats classic's fastest (disjoint ranges) and its
  output is byte-identical to classic's; overlapping ranges are **undecided**;
- **drift**: opening and closing classic ranges that do not overlap void the session for
  saving; with few runs that also happens by chance (2 / C(2k, k) for k runs a half: 1 in 3
  at n = 3), and the decision says which it can tell;
- an arm that ran no speculative round is *not measured*;
- **the interval rule** (``interval_verdict``): a win also needs the speed-up's bootstrap
  interval (``policy.stats``) above 1 + the minimum gain and its permutation p below
  ``stats.ALPHA`` (0.05: n = 3 repetitions can reach it, n = 2 cannot); an interval wholly
  below that bar is *below min gain* (decided: a decline counts it with the slower widths); across a
  workload the interval alone decides; among winners the **tie rule** (``stats.choose``)
  takes the smallest width whose interval overlaps the fastest's;
- a session is **saveable** only when it is neither cancelled nor drifted and either a width
  wins or every measured width is slower (a decline): one rule for the record, ``sweep
  --json``, the console's headline and Records tab, and the save itself.

The engine (``engine.ab``) runs the session and applies these; nothing here reads a clock,
a file or a device.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from enum import Enum
from math import comb
from typing import Iterable, Mapping, Sequence

from blockwidth.policy import stats


class Verdict(str, Enum):
    CONTROL = "control"
    WINS = "wins"
    FASTER_DIFFERS = "faster, output differs"
    SLOWER = "slower"
    UNDECIDED = "undecided"
    NOT_MEASURED = "not measured"
    # The interval lies wholly below 1 + the minimum gain: decided, and not worth the width
    # (a decline counts it with the slower ones), though it need not be slower than classic.
    NO_GAIN = "below min gain"


class Budget(str, Enum):
    """The sequential budget that ended a session still adding repetitions."""

    REPS = "repetitions"
    SECONDS = "seconds"


@dataclass(frozen=True)
class Range:
    min: float
    median: float
    max: float

    @staticmethod
    def of(values: Sequence[float]) -> "Range":
        return Range(min(values), statistics.median(values), max(values))

    def overlaps(self, other: "Range") -> bool:
        return self.min <= other.max and other.min <= self.max

    def to_list(self) -> list[float]:
        return [round(self.min, 3), round(self.median, 3), round(self.max, 3)]


DRIFT_CHANCE = 0.05


def disjoint_by_chance(a: int, b: int) -> float:
    """Chance that ``a`` and ``b`` samples of one distribution form disjoint ranges:
    all of one group below all of the other, either way round (2 / C(a+b, a))."""
    return min(1.0, 2 / comb(a + b, a)) if a and b else 1.0


def apart(*pairs: tuple[float, float]) -> int:
    """Decimals (1..3) at which each pair's two values print differently: two ranges judged
    apart by 0.05 tok/s must not read "27.1-27.1 against 27.1-27.1"."""
    return next((d for d in (1, 2, 3) if all(f"{a:.{d}f}" != f"{b:.{d}f}" for a, b in pairs)), 3)


def judge(classic: Range | None, width: Range | None, *, speculative_rounds: int,
          declined_rounds: int, identical: bool) -> tuple[Verdict, str]:
    """One width's verdict and why, from its decode tok/s range against classic's
    (``width`` None: it has no runs)."""
    if width is None:
        return Verdict.NOT_MEASURED, "no runs"
    if speculative_rounds == 0:
        return Verdict.NOT_MEASURED, "zero speculative rounds: the drafter declined every round"
    c, w = classic, width
    if w.min > c.max:
        d = apart((w.min, c.max))
        if identical:
            verdict = Verdict.WINS
            why = f"slowest {w.min:.{d}f} tok/s beats classic's fastest {c.max:.{d}f}; output byte-identical"
        else:
            verdict = Verdict.FASTER_DIFFERS
            why = (f"slowest {w.min:.{d}f} tok/s beats classic's fastest {c.max:.{d}f}, "
                   f"but output differs from classic")
    elif w.max < c.min:
        d = apart((w.max, c.min))
        verdict = Verdict.SLOWER
        why = f"fastest {w.max:.{d}f} tok/s is below classic's slowest {c.min:.{d}f}"
    else:
        verdict = Verdict.UNDECIDED
        why = f"{w.min:.1f}-{w.max:.1f} tok/s overlaps classic's {c.min:.1f}-{c.max:.1f}"
    if declined_rounds:
        why += f"; drafter declined {declined_rounds} rounds"
    return verdict, why


def opening_closing(classic_tok_s: Sequence[float]) -> tuple[Range | None, Range | None]:
    """Classic's opening and closing halves (the first half takes the odd run)."""
    if len(classic_tok_s) < 2:
        return None, None
    half = (len(classic_tok_s) + 1) // 2
    return Range.of(classic_tok_s[:half]), Range.of(classic_tok_s[half:])


@dataclass(frozen=True)
class Drift:
    drifted: bool = False  # opening and closing classic ranges do not overlap
    chance: float | None = None  # how often that happens by chance alone, for these counts
    why: str = ""


def could_be_noise(drifted: bool, chance: float | None) -> bool:
    """Classic's opening and closing runs are apart, but noise alone does that more often
    than DRIFT_CHANCE with this few runs: more classic runs would settle it."""
    return drifted and chance is not None and chance > DRIFT_CHANCE


def drift(classic_tok_s: Sequence[float], more: str) -> Drift:
    """Whether classic's opening and closing runs are apart, how likely by chance, and why."""
    opening, closing = opening_closing(classic_tok_s)
    if not (opening and closing) or opening.overlaps(closing):
        return Drift()
    half = (len(classic_tok_s) + 1) // 2
    chance = disjoint_by_chance(half, len(classic_tok_s) - half)
    lo, hi = sorted((opening, closing), key=lambda r: r.min)  # lo.max < hi.min: the gap
    d = apart((lo.max, hi.min))
    def said(r: Range) -> str:  # one run: its figure, not "199.9-199.9"
        return f"{r.min:.{d}f}" if f"{r.min:.{d}f}" == f"{r.max:.{d}f}" else f"{r.min:.{d}f}-{r.max:.{d}f}"

    span = f"opening {said(opening)} tok/s, closing {said(closing)}"
    if chance <= DRIFT_CHANCE:
        return Drift(True, chance, f"classic drifted: {span}; nothing here can be saved")
    if chance >= 1:  # one run each side: two single figures are always apart (n 1)
        return Drift(True, chance, f"classic ran once before the widths and once after ({span}): "
                                   f"two single runs never overlap, so drift cannot be told from "
                                   f"noise; nothing here can be saved until more repetitions settle it"
                                   + (f" ({more})" if more else ""))
    return Drift(True, chance, f"classic's opening and closing runs do not overlap ({span}), which "
                               f"noise alone does {chance:.0%} of the time with this few runs: drift "
                               f"or noise, it cannot tell; nothing here can be saved until more "
                               f"repetitions settle it" + (f" ({more})" if more else ""))


def warm_blind(*, warmup_shift: int, attention: str, backend: str) -> bool:
    """Every run may be warm: the warm-up had to share the session's positions, under fused
    attention on CUDA (cuDNN plans per KV length), so no win is taken from such a session."""
    return warmup_shift == 0 and attention == "fused" and backend == "cuda"


@dataclass(frozen=True)
class ArmFacts:
    """What one width's verdict is drawn from."""

    name: str
    width: int
    decode_tok_s: tuple[float, ...]  # one per measured run, in order
    speculative_rounds: int = 0
    declined_rounds: int = 0
    identical: bool = False  # its output is byte-identical to classic's

    @property
    def range(self) -> Range | None:
        return Range.of(self.decode_tok_s) if self.decode_tok_s else None


@dataclass(frozen=True)
class Decision:
    verdicts: tuple[tuple[Verdict, str], ...]  # one (verdict, why) per arm, in order
    drift: Drift
    recommendation: int | None
    decision: str
    why: str
    range_whys: tuple[str, ...] = ()  # per arm, the range rule's words before the interval's
    choice: stats.Choice | None = None  # the tie rule's pick, when the interval rule applied


def _gain(min_gain: float) -> str:
    return f"{min_gain * 100:g} %"


def _not_significant(est: stats.Estimate, alpha: float) -> str:
    """Why an interval that clears the bar is still no win: its p is not below alpha."""
    said = f"but p {est.p:.2g} is not below the {alpha:g} a win needs"
    if est.p_floor is not None and est.p_floor >= alpha:
        said += f" (these runs cannot give less than {est.p_floor:.2g}: more repetitions can)"
    return said


def interval_verdict(verdict: Verdict, why: str, est: stats.Estimate | None, *, single: bool,
                     identical: bool, min_gain: float, alpha: float = stats.ALPHA) -> tuple[Verdict, str]:
    """An arm's verdict under the interval rule, from its range verdict (``judge``'s).

    A win needs the speed-up's interval above 1 + min_gain and its permutation p below
    ``alpha`` (two runs a side can clear any bar by luck; their p cannot go below 0.1, which
    says so); an interval wholly below that bar
    is decided too (below the minimum gain). On a single prompt the range rule must agree: a
    win needs disjoint ranges as well, and a range loss stays a loss. Across a workload the
    interval alone decides (the ranges are of passes over different requests): slower when it
    lies below 1."""
    if est is None or verdict in (Verdict.NOT_MEASURED, Verdict.CONTROL):
        return verdict, why
    bar = 1 + min_gain
    said, gain = est.describe(), _gain(min_gain)
    if single:
        if verdict in (Verdict.WINS, Verdict.FASTER_DIFFERS):
            if stats.clears(est, min_gain) and not stats.significant(est, alpha):
                return Verdict.UNDECIDED, f"{why}; {said}, above the {gain} minimum gain, {_not_significant(est, alpha)}"
            if stats.clears(est, min_gain):
                return verdict, f"{why}; {said}, above the {gain} minimum gain"
            if est.ci.hi < bar:
                return Verdict.NO_GAIN, f"{why}, but {said} lies below 1 + the {gain} minimum gain"
            return Verdict.UNDECIDED, (f"{why}, but {said}: the interval's lower end is not above "
                                       f"{bar:.2f} (the {gain} minimum gain)")
        if verdict is Verdict.UNDECIDED and est.ci.hi < bar:
            return Verdict.NO_GAIN, f"{why}; {said} lies below 1 + the {gain} minimum gain"
        if verdict is Verdict.UNDECIDED:
            return verdict, f"{why}; {said}"
        return verdict, why
    if stats.clears(est, min_gain) and not stats.significant(est, alpha):
        return Verdict.UNDECIDED, f"{said}, above the {gain} minimum gain, {_not_significant(est, alpha)}"
    if stats.clears(est, min_gain):
        if identical:
            return Verdict.WINS, f"{said}, above the {gain} minimum gain; every request byte-identical"
        return Verdict.FASTER_DIFFERS, f"{said}, above the {gain} minimum gain, but output differs from classic"
    if est.ci.hi < 1:
        return Verdict.SLOWER, f"{said}: the interval lies below classic"
    if est.ci.hi < bar:
        return Verdict.NO_GAIN, f"{said} lies below 1 + the {gain} minimum gain"
    return Verdict.UNDECIDED, f"{said}: the interval straddles 1 + the {gain} minimum gain ({bar:.2f})"


def decide(classic_tok_s: Sequence[float], arms: Sequence[ArmFacts], *, cancelled: bool = False,
           reps: int = 0, blind: bool = False, more: str = "",
           estimates: Mapping[int, stats.Estimate] | None = None, min_gain: float = stats.MIN_GAIN,
           single: bool = True, control_tok_s: Sequence[float] | None = None,
           alpha: float = stats.ALPHA) -> Decision:
    """Verdicts, drift and the recommendation, from the decode speeds of a session.

    ``blind``: every run may be warm (``warm_blind``), so no win is drawn; ``more``: how to
    get more repetitions, said where the decision asks for them (the engine leaves it empty: the
    advice is each front end's, console.outcome.advice).
    ``estimates`` (per width, ``policy.stats``): the interval rule applies on top of the range
    rule (``single``: one request) or alone (a workload), and the tie rule picks the winner."""
    # ``control_tok_s``: the speed-up's control when it is not classic's own runs (stock classic,
    # faster than classic on the exact path); drift is always classic's opening against closing.
    control = control_tok_s if control_tok_s else classic_tok_s
    classic = Range.of(control) if control else None
    verdicts, range_whys = [], []
    for arm in arms:
        v, why = judge(classic, arm.range, speculative_rounds=arm.speculative_rounds,
                       declined_rounds=arm.declined_rounds, identical=arm.identical)
        range_whys.append(why)
        if estimates is not None:
            v, why = interval_verdict(v, why, estimates.get(arm.width), single=single,
                                      identical=arm.identical, min_gain=min_gain, alpha=alpha)
        # A win needs its slowest run to beat classic, and the first run at these positions is
        # cold (the warm-up ran elsewhere), so a replay-flattered arm cannot win by itself.
        if blind and v in (Verdict.WINS, Verdict.FASTER_DIFFERS):
            v, why = Verdict.UNDECIDED, ("the warm-up shared this session's positions (no room in the "
                                         "model's context) under fused attention on CUDA, so every run "
                                         "may replay cuDNN plans a new request would build; " + why)
        if cancelled and v in (Verdict.WINS, Verdict.FASTER_DIFFERS, Verdict.SLOWER, Verdict.NO_GAIN):
            # A cancelled session stopped before its repetitions were done: its ranges are
            # reported, but no verdict is drawn from them (a record read later must not say
            # "wins" or "slower" on the strength of a run the operator stopped).
            v, why = Verdict.UNDECIDED, f"cancelled after {reps} repetition(s): no verdict; " + why
        verdicts.append((v, why))
    moved = drift(classic_tok_s, more)
    winners = [(a, why) for a, (v, why) in zip(arms, verdicts) if v is Verdict.WINS]
    undecided = [a for a, (v, _) in zip(arms, verdicts) if v is Verdict.UNDECIDED]
    recommendation, choice = None, None
    if cancelled:
        decision = "cancelled"
        done = ("before a repetition finished" if reps == 0
                else f"after {reps} repetition" + ("" if reps == 1 else "s"))
        why = f"stopped {done}; the ranges so far are kept, no verdict is drawn from them"
    elif winners and estimates is not None:
        choice = stats.choose(estimates, [a.width for a, _ in winners])
        recommendation = choice.width
        decision = ("the auto width" if choice.width == "auto" else f"width {choice.width}") + " beats classic"
        why = choice.why
        if single:  # the range rule's half of the win
            why += "; " + next(rw for a, rw in zip(arms, range_whys) if a.width == choice.width)
    elif winners:
        best, why = max(winners, key=lambda aw: aw[0].range.median)
        recommendation = best.width
        decision = ("the auto width" if best.width == "auto" else f"width {best.width}") + " beats classic"
    elif undecided:
        decision = "undecided"
        why = ("ranges overlap for " if estimates is None or (single and _overlap(classic, undecided))
               else "not decided for ") + ", ".join(a.name for a in undecided)
        why += f"; {more}" if more else ""
    elif arms and all(v is Verdict.NOT_MEASURED for v, _ in verdicts):
        # not a decline: no width drafted anything to measure (a tryout's 4-token lookup
        # session read "no width beats classic here — w2: not measured")
        decision = "no width drafted a token"
        why = "; ".join(f"{a.name}: {w}" for a, (_, w) in zip(arms, verdicts))
    else:
        decision = "no width beats classic here"
        why = "; ".join(f"{a.name}: {v.value}" for a, (v, _) in zip(arms, verdicts))
    if moved.drifted:
        why += f"; {moved.why}"
    return Decision(tuple(verdicts), moved, recommendation, decision, why, tuple(range_whys), choice)


def _overlap(classic: Range | None, arms: Sequence[ArmFacts]) -> bool:
    return classic is None or any(a.range is not None and a.range.overlaps(classic) for a in arms)


# ---- what can be saved ------------------------------------------------------------------------

class RefusalKind(str, Enum):
    """Why a session's result cannot be saved as a measured override."""

    CANCELLED = "cancelled"
    DRIFT = "drift"
    DIFFERS = "output differs"
    UNDECIDED = "undecided"
    NOT_MEASURED = "not measured"


def refusal(*, cancelled: bool, drifted: bool, recommendation: int | None,
            verdicts: Iterable[Verdict], allow_nonidentical: bool = False) -> RefusalKind | None:
    """Why a session cannot be saved, or None: it can (a winning width, a faster width whose
    output differs when that is allowed, or a decline: every measured width slower)."""
    if cancelled:
        return RefusalKind.CANCELLED
    if drifted:
        return RefusalKind.DRIFT
    if recommendation is not None:
        return None
    seen = set(verdicts)
    if Verdict.FASTER_DIFFERS in seen:
        return None if allow_nonidentical else RefusalKind.DIFFERS
    if Verdict.UNDECIDED in seen:
        return RefusalKind.UNDECIDED
    if Verdict.SLOWER not in seen and Verdict.NO_GAIN not in seen:  # both decided losses
        return RefusalKind.NOT_MEASURED
    return None


def saveable(*, cancelled: bool, drifted: bool, recommendation: int | None,
             verdicts: Iterable[Verdict]) -> bool:
    """Whether a session's result can be saved as it stands (byte-identical widths only):
    what the record stores, ``sweep --json`` prints, the console colours, and save honours."""
    return refusal(cancelled=cancelled, drifted=drifted, recommendation=recommendation,
                   verdicts=verdicts) is None


def verdict_of(value: object) -> Verdict | None:
    """A verdict read back from a record (None for anything else: a record is input)."""
    try:
        return Verdict(value)
    except ValueError:
        return None
