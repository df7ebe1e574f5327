"""What a finished A/B session means: the profile entry it may become, or why not,
and the headline that says so. Pure: values in, values out (no files, no probes).

The CLI and the console both ask these functions, so the words a session earns
(and their colour in the console) follow whether it can be saved.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import Enum
from typing import Any, Mapping

from blockwidth.engine.ab import Session
from blockwidth.policy import stats
from blockwidth.policy.auto import AUTO
from blockwidth.policy.device import Device
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.profile import Entry
from blockwidth.policy.quantization import Quantization
from blockwidth.policy.text import shown
from blockwidth.policy.verdict import Budget, RefusalKind, Verdict, refusal


class Front(str, Enum):
    """Which front end a refusal is worded for (each names its own controls)."""

    CLI = "cli"
    CONSOLE = "console"


_REMEDY = {
    (RefusalKind.DIFFERS, Front.CLI): "--allow-nonidentical saves it, recorded as not byte-identical",
    (RefusalKind.DIFFERS, Front.CONSOLE): "the console saves only byte-identical widths "
                                          "(the headless sweep can store it, marked not byte-identical)",
}

# How many new tokens a run may be raised to by the advice (runs of more are minutes on a CPU).
MAX_ADVISED_TOKENS = 512


# How many repetitions the advice adds at least, and the most a reps field is advised to.
MORE_REPS = 2


def _round_up(seconds: float) -> int:
    """A budget as an operator types it: whole tens of seconds (fives under a minute)."""
    step = 10 if seconds >= 60 else 5
    return int(math.ceil(seconds / step) * step)


@dataclass(frozen=True)
class MoreRuns:
    """What would decide an undecided session, from its facts: one piece of advice, worded
    for the front end that shows it (the console's fields, or the sweep's flags).

    Under the range rule a width wins or loses only when its range and classic's are apart,
    and more repetitions only widen both ranges: once they overlap, no budget parts them, so
    "more repetitions" is no advice there; longer runs (more tokens each) are, as they average
    out a busy host's noise, in a new session. More repetitions do settle classic's drift
    against noise, and a verdict that waits on an interval rather than on the ranges.

    ``rep_s`` (what one more repetition of the arms still open cost here, from their runs) and
    ``last_rep_at`` (seconds from the start to the end of the last repetition) make the amount
    a measured one: the budget at which a new session runs ``more`` repetitions past these."""

    overlap: bool  # an undecided width's range overlaps classic's
    sequential: bool
    reps: int
    max_reps: int
    max_seconds: float
    budget_out: Budget | None
    tokens: int
    rep_s: float | None = None
    last_rep_at: float | None = None
    # A workload's width whose requests disagree across the bar: (name, lowest and highest
    # speed-up of one request), where the requests-only interval (policy.stats.request_spread)
    # straddles it, so more repetitions cannot decide it.
    spread: tuple[str, float, float] | None = None
    own_traffic: bool = False  # the workload is the operator's file, not a built-in one

    @property
    def more(self) -> int:
        """Repetitions to add: two, or half as many again as ran (a single prompt's are cheap)."""
        return max(MORE_REPS, self.reps // 2)

    def seconds_for_more(self) -> int | None:
        """The seconds budget under which ``more`` repetitions follow the last one: a repetition
        starts while the budget is not spent, so the last of them must start before it ends
        (the budget sits half a repetition past that start, against the host's noise)."""
        if self.rep_s is None or self.last_rep_at is None:
            return None
        return _round_up(self.last_rep_at + (self.more - 0.5) * self.rep_s)

    def raises(self) -> list[tuple[str, str, int]]:
        """(flag, console field, value) for each budget to raise so that ``more`` repetitions
        follow this session's, from its measured times (empty where they are not measured, or the
        session did not stop on a budget)."""
        secs = self.seconds_for_more()
        if secs is None or self.budget_out is None:
            return []
        out = []
        if self.budget_out is Budget.SECONDS or secs > self.max_seconds:
            out.append(("--max-seconds", "secs", max(secs, _round_up(self.max_seconds + 1))))
        if self.reps + self.more > self.max_reps:
            out.append(("--max-reps", "reps", self.reps + self.more))
        return out

    def say(self, front: Front) -> str:
        cli = front is Front.CLI
        if self.overlap:
            to = min(self.tokens * 4, MAX_ADVISED_TOKENS)
            if to <= self.tokens:
                return (f"even with {self.tokens}-token runs the widths may be too close to separate "
                        "on this host")
            where = f"rerun with --max-tokens {to}" if cli else f"raise the tokens field to {to}"
            return f"more repetitions cannot part them; {where} (longer runs even out this host's noise)"
        if self.spread is not None:
            name, lo, hi = self.spread
            head = (f"{name}'s requests disagree ({lo:.2f}x to {hi:.2f}x by request), so more "
                    f"repetitions narrow the run noise but not that spread and cannot decide it; ")
            if self.own_traffic:  # already the traffic served: it was told to measure what it measured
                return head + ("more requests of each kind do, or a workload per kind of request "
                               "(they may want different widths)")
            other = "--workload FILE" if cli else "the prompt field (@FILE)"
            return head + f"the workload's mix does: measure the traffic you serve ({other}, JSONL)"
        if not self.sequential:
            return ("add --sequential (it adds repetitions until decided)" if cli
                    else "turn on sequential (it adds repetitions until decided)")
        raise_ = self.raises()
        if self.seconds_for_more() is not None and self.budget_out is not None:
            # measured: how long a repetition of the open arms took, and the budget for more
            said = (" ".join(f"{flag} {v}" for flag, _, v in raise_) if cli
                    else " and ".join(f"the {name} field to {v}" for _, name, v in raise_))
            ran = ("it ran out of time" if self.budget_out is Budget.SECONDS else "it stopped")
            return (f"{ran} after {self.reps} repetitions ({self.rep_s:.0f} s a repetition here): "
                    + (f"rerun with {said}" if cli else f"raise {said}") + f" for {self.more} more")
        if self.budget_out is Budget.SECONDS:
            secs = f"{self.max_seconds * 2:g}"
            return (f"it ran out of time after {self.reps} repetitions: "
                    + (f"rerun with --max-seconds {secs}" if cli else f"raise the secs field to {secs}"))
        reps = max(self.max_reps, self.reps) * 2
        return (f"it stopped after {self.reps} repetitions: "
                + (f"rerun with --max-reps {reps}" if cli else f"raise the reps field to {reps}"))


def rep_seconds(session: Session) -> float | None:
    """What one more repetition costs here: the median time (prefill and decode) of a run of
    classic and of every arm still undecided (all arms when none is: drift that may be noise
    sends them all again), from this session's own runs; a workload's arms hold its passes."""
    open_ = [a for a in session.arms if a.verdict is Verdict.UNDECIDED and a.runs] or session.arms
    total = 0.0
    for arm in [session.classic, *open_]:
        times = [getattr(r, "prefill_s", 0.0) + getattr(r, "decode_s", 0.0) for r in arm.runs]
        if not times:
            return None
        total += statistics.median(times)
    return total


def more_runs(session: Session) -> MoreRuns:
    """Whether a width waits on ranges that more repetitions cannot part: on a single prompt a
    win needs the width's range apart from classic's, and a range only widens; one whose
    interval says faster than the bar (or that has no interval) is blocked there. Across a
    workload, or where the interval leans below the bar, more repetitions do decide."""
    c = session.config
    classic = session.classic.decode_range()
    open_ = [a for a in session.arms if a.verdict is Verdict.UNDECIDED and a.runs]
    estimates = getattr(session, "estimates", {}) or {}
    bar = 1 + getattr(c, "min_gain", 0.0)

    def blocked(arm) -> bool:
        if not getattr(session, "single", True) or classic is None:
            return False
        if not arm.decode_range().overlaps(classic):
            return False
        est = estimates.get(arm.width)
        return est is None or est.ratio > bar

    ends = getattr(session, "rep_ends", None) or []
    return MoreRuns(any(blocked(a) for a in open_), c.sequential, session.reps, c.max_reps,
                    c.max_seconds, session.budget_out, c.max_tokens,
                    rep_seconds(session) if ends else None, ends[-1] if ends else None,
                    _spread(session, open_, bar),
                    c.workload is not None and not getattr(c.workload, "builtin", True))


def _spread(session: Session, open_, bar: float) -> tuple[str, float, float] | None:
    """The first open width of a workload whose requests-only interval straddles the bar:
    what its repetitions cannot settle (policy.stats.request_spread). The width best on most
    requests is asked first, so that the headline names the width the next step runs; where
    its requests-only interval clears the bar, repetitions can decide it, and no spread is
    named."""
    if getattr(session, "single", True) or not open_:
        return None
    if any(a.verdict is Verdict.WINS for a in session.arms):
        # a width already won: another width's spread is not what stands before a save (SmolLM2
        # spelling: w2 won, classic drifted or was noisy, and the advice spoke of w3's requests)
        return None
    classic, arms = session.stats_samples()
    favoured = (_best_count(session) or (None, 0))[0]
    for arm in sorted(open_, key=lambda a: a.width != favoured):
        reqs = arms.get(arm.width)
        if not reqs or not all(classic):
            continue
        try:
            ci, lo, hi = stats.request_spread(classic, reqs, seed=session.seed)
        except stats.StatsError:
            continue
        if ci.lo <= bar <= ci.hi:
            return arm.name, lo, hi
        if arm.width == favoured and ci.lo > bar:
            # its requests agree enough that repetitions can still make it a win: say that, not
            # another width's spread (SmolLM2 proofreading: w2 1.10x [1.02, 1.18], its requests
            # alone [1.032, 1.174], was told only that w3's requests disagree)
            return None
    return None


@dataclass(frozen=True)
class NextStep:
    """The one step the console runs for an undecided session (its ``n`` key): the fields it
    sets, then a run. ``requests``: a workload's requests to run instead (written to a JSONL
    file, which the prompt field then names)."""

    says: str  # what the key does, in words
    fields: tuple[tuple[str, Any], ...]  # (field id, value): widths, n, tokens, reps, secs, prompt, sequential
    requests: tuple = ()  # policy.workload.Request, when the step runs a part of the workload

    def field(self, name: str) -> Any:
        return dict(self.fields).get(name)


def next_step(session: Session) -> NextStep | None:
    """The step the advice names, as fields to set and run (None: nothing to run, or neither
    undecided nor drifted). A drift beyond noise: the same fields again, on a quiet host.
    Ranges that overlap: longer runs; a workload whose requests disagree: the requests where the
    width best on most of them was best, on their own; a budget spent: the budget its own
    repetitions' times ask for; sequential off: on."""
    if session.cancelled:
        return None
    why = refusal(cancelled=session.cancelled, drifted=session.drift,
                  recommendation=session.recommendation, verdicts=[a.verdict for a in session.arms])
    if why is RefusalKind.DRIFT and not session.drift_could_be_noise:
        # the host's speed moved during the session (a tryout's ran beside a test suite): the
        # same fields again, once the host is quiet, are what settles it; no field would
        return NextStep("runs it again as set (classic's speed moved during this one: run it "
                        "on a quiet host)", ())
    if not (why is RefusalKind.UNDECIDED or (why is RefusalKind.DRIFT and session.drift_could_be_noise)):
        return None
    m = more_runs(session)
    if m.overlap:
        to = min(m.tokens * 4, MAX_ADVISED_TOKENS)
        return NextStep(f"runs it again with {to}-token runs", (("tokens", to),)) if to > m.tokens else None
    if m.spread is not None:
        return _where_best(session)
    if not m.sequential:
        return NextStep("runs it again with sequential on", (("sequential", True),))
    raise_ = m.raises()
    if raise_:
        said = " and ".join(f"{name} {v}" for _, name, v in raise_)
        return NextStep(f"runs it again with {said} (for {m.more} more repetitions)",
                        tuple((name, v) for _, name, v in raise_))
    if m.budget_out is Budget.SECONDS:
        return NextStep(f"runs it again with secs {m.max_seconds * 2:g}", (("secs", m.max_seconds * 2),))
    if m.budget_out is Budget.REPS:
        reps = max(m.max_reps, m.reps) * 2
        return NextStep(f"runs it again with reps {reps}", (("reps", reps),))
    return None


def _best_count(session: Session) -> tuple[Any, int] | None:
    """(the width best on most measured requests, on how many), or None."""
    counts: dict[Any, int] = {}
    for r in session.per_request:
        best = r.best()  # None where the request was not measured on every arm
        if best is not None:
            counts[best] = counts.get(best, 0) + 1
    if not counts:
        return None
    return max(counts.items(), key=lambda wk: (wk[1], -wk[0] if isinstance(wk[0], int) else 0))


def _where_best(session: Session) -> NextStep | None:
    """A workload whose requests disagree: the width best on most requests, on those requests
    alone, as a workload of their own (what traffic like them gets; the rest is another mix)."""
    measured = [r for r in session.per_request if r.measured]
    picked = _best_count(session)
    if picked is None:
        return None
    width, k = picked
    if k < 2 or k == len(session.per_request):
        return None
    reqs = tuple(r.prepared.request for r in measured if r.best() == width)
    return NextStep(f"runs w{width} against classic on the {k} requests where it was best "
                    f"(a workload of their own)", (("widths", str(width)), ("prompt", "@")), reqs)


def advice(session: Session, front: Front) -> str | None:
    """The one piece of advice an undecided (or drift-or-noise) session gets, or None."""
    why = refusal(cancelled=session.cancelled, drifted=session.drift,
                  recommendation=session.recommendation, verdicts=[a.verdict for a in session.arms])
    if why is RefusalKind.UNDECIDED or (why is RefusalKind.DRIFT and session.drift_could_be_noise):
        # More classic runs would settle drift against noise, but a width whose range overlaps
        # classic's stays undecided whatever they show: then longer runs are the advice.
        return more_runs(session).say(front)
    return None


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    detail: str
    more: MoreRuns | None = None  # undecided, or drift that may be noise: what would decide it

    def say(self, front: Front = Front.CLI) -> str:
        remedy = self.more.say(front) if self.more is not None else _REMEDY.get((self.kind, front))
        return self.detail + (f"; {remedy}" if remedy else "")


@dataclass(frozen=True)
class PairFacts:
    """What the entry is keyed on, taken from the loaded pair (no model objects)."""

    kind: DrafterKind
    quantization: Quantization
    pair_id: str
    # the names every reason that matches the entry repeats (policy.profile.Entry.measured_on)
    target_name: str | None = None
    drafter_name: str | None = None
    target_dtypes: Mapping[str, str | None] | None = None  # checkpoint.tensor_dtypes of the target


def profile_entry(session: Session, pair: PairFacts, device: Device, *, mlx: str | None,
                  measured_at: str, record: str, allow_nonidentical: bool = False,
                  pair_specific: bool = False, route: str = "engine", concurrency: int | None = None,
                  server: dict | None = None) -> Entry | Refusal:
    """The profile entry a session earns (a width, or a decline), or the refusal and why.
    ``route`` (the entry's ``path``), ``concurrency`` and ``server``: what measured it (the served path's level and
    mlx_lm.server's version and arguments)."""
    why = refusal(cancelled=session.cancelled, drifted=session.drift,
                  recommendation=session.recommendation, verdicts=[a.verdict for a in session.arms],
                  allow_nonidentical=allow_nonidentical)
    faster = [a for a in session.arms if a.verdict is Verdict.FASTER_DIFFERS]
    if why is RefusalKind.CANCELLED:
        return Refusal(why, "the session was cancelled")
    if why is RefusalKind.DRIFT:
        return Refusal(why, session.drift_why, more_runs(session) if session.drift_could_be_noise else None)
    if why is RefusalKind.DIFFERS:
        return Refusal(why, f"{', '.join(a.name for a in faster)} faster but output differs from classic")
    if why is RefusalKind.UNDECIDED:
        return Refusal(why, "undecided: " + _open(session), more_runs(session))
    if why is RefusalKind.NOT_MEASURED:
        return Refusal(why, "no width was measured (the drafter declined every round)")
    width, identical = session.recommendation, True
    if width is None and faster:  # allowed: the fastest, recorded as not byte-identical
        width, identical = max(faster, key=lambda a: a.decode_range().median).width, False
    q = pair.quantization
    c = session.classic.decode_range()
    evidence: dict[str, Any] = {
        "n": session.reps, "classic_tok_s": c.to_list(), "prompt_sha256": session.prompt_sha256,
        "prompt_tokens": sum(len(r.prepared.ids) for r in session.per_request),
        "new_tokens": session.config.max_tokens,
        "record": record, "decision": session.decision,
        "widths": list(session.config.widths),  # what a decline declined: --check re-tries them
        # what it was measured on, in words a later resolution repeats (a generic entry is then
        # read for other pairs too, and must say it came from this one)
        # (escaped as a terminal shows them: a profile refuses a string holding a control character)
        "measured_on": {k: shown(v) for k, v in (("target", pair.target_name), ("drafter", pair.drafter_name),
                                                 ("pair", pair.pair_id),
                                                 # a workload is named below; its session's
                                                 # prompt field is the unused built-in one
                                                 ("prompt", None if session.workload is not None
                                                  else " ".join(session.config.prompt.split())[:60]))
                        if v},
    }
    if width is not None:
        evidence["width_tok_s"] = session.arm(width).decode_range().to_list()
        est = session.estimates.get(width)
        if est is not None:  # the interval it won by, and what it takes to reproduce it
            evidence.update(ratio=round(est.ratio, 4), ratio_ci=est.ci.to_list(), p_value=round(est.p, 6))
    if getattr(pair, "target_dtypes", None):  # what the cost was measured on (scales: 8-60x on a CPU)
        evidence["target_dtypes"] = {k: v for k, v in pair.target_dtypes.items() if v}
    evidence["min_gain"] = session.config.min_gain
    evidence["seed"] = session.seed
    plan_ = getattr(session, "exact", None)
    if plan_ is not None:  # how identity was had (engine.exact), and the speed-ups' control
        evidence["exact"] = {"asked": plan_.asked.value, "active": plan_.active, "exact": plan_.exact,
                             "control": getattr(session, "baseline", "classic")}
    if session.workload is not None:
        evidence["workload"] = {k: shown(v) if isinstance(v, str) else v
                                for k, v in session.workload.to_dict().items()}
    plan = None
    if width == AUTO:  # the auto arm won: its plan, and the fixed width for what cannot adapt
        plan = session.auto.plan()
        width = plan.static_width
    return Entry(
        backend=device.backend, drafter_kind=pair.kind, width=width, decline=width is None, auto=plan,
        compute_capability=device.compute_capability, device_name=device.name or None,
        quant_scheme=q.scheme.value, quant_bits=q.bits,
        quant_group_size=q.group_size, pair=pair.pair_id if pair_specific else None,
        mlx=mlx, measured_at=measured_at, byte_identical=identical, evidence=evidence,
        path=route, concurrency=concurrency, server=server, group=device.group,
    )


class Tone(str, Enum):
    """How a headline may look: only a result that can be saved as a win is GOOD."""

    GOOD = "good"  # a width wins and can be saved
    PLAIN = "plain"  # classic wins; a decline can be saved
    WARN = "warn"  # nothing can be saved: undecided, differs, drift, not measured
    BAD = "bad"  # the width in effect loses to classic
    STOPPED = "stopped"  # cancelled


@dataclass(frozen=True)
class Headline:
    text: str
    tone: Tone
    saveable: bool


# Drift that noise alone could make at this few runs, as the headline and the console's save
# refusal say it (they said it in two ways that drifted apart)
DRIFT_OR_NOISE = "not saveable yet: too few classic runs to tell drift from noise"


def headline(session: Session, planned_runs: int | None = None, front: Front = Front.CLI) -> Headline:
    """One line for the top of the results; its tone follows whether the result can be saved
    (policy.verdict.refusal, as the save itself). An undecided session (or drift that may be
    noise) carries its one piece of advice, worded for ``front``."""
    why = refusal(cancelled=session.cancelled, drifted=session.drift,
                  recommendation=session.recommendation, verdicts=[a.verdict for a in session.arms])
    if why is RefusalKind.CANCELLED:
        # every request's runs: a workload's own arms hold only the passes it finished
        done = sum(len(a.runs) for r in session.per_request for a in [r.classic, *r.arms])
        # ``planned_runs`` counts the discarded warm-ups too; these are measured runs only.
        warmups = len(session.arms) + 1 if session.config.warmup else 0
        # past the planned runs (sequential added repetitions) "of" would read "197 of 160"
        of = f" of {planned_runs - warmups}" if planned_runs and done <= planned_runs - warmups else ""
        return Headline(f"cancelled after {done}{of} measured runs: no verdict, nothing to save",
                        Tone.STOPPED, False)
    if why is RefusalKind.DRIFT:
        if session.drift_could_be_noise:
            # Too few classic runs to tell drift from noise: say so, not "drifted".
            # Lead with the cause: a tryout read "classic drift or noise" at n 1, its widths
            # plainly slower, as a problem with the measurement rather than too few repetitions.
            return Headline(f"{DRIFT_OR_NOISE} at n {session.reps} (measured: {session.decision}); "
                            f"{advice(session, front)}", Tone.WARN, False)
        return Headline(f"not saveable: classic drifted (measured: {session.decision})", Tone.WARN, False)
    if why is RefusalKind.DIFFERS:
        return Headline("a width is faster but its output differs from classic: not saveable", Tone.WARN,
                        False)
    if why is RefusalKind.UNDECIDED:
        return Headline(f"undecided: {_open(session)}; {advice(session, front)}", Tone.WARN, False)
    if why is RefusalKind.NOT_MEASURED:
        return Headline("no width was measured: the drafter declined every round", Tone.WARN, False)
    if session.recommendation is not None:
        lead = "the auto width" if session.recommendation == AUTO else f"width {session.recommendation}"
        return Headline(f"{lead} beats classic{tie_note(session)}", Tone.GOOD, True)
    if any(a.verdict is Verdict.NO_GAIN for a in session.arms):
        return Headline(f"classic wins: no measured width clears the {session.config.min_gain:.0%} minimum "
                        "gain (saves as a decline)", Tone.PLAIN, True)
    return Headline("classic wins: every measured width is slower (saves as a decline)", Tone.PLAIN, True)


def _arm_name(width) -> str:
    return str(width) if isinstance(width, str) else f"w{width}"


def tie_note(session: Session) -> str:
    """Where the tie rule chose a width that is not the fastest winner: said in the table's words
    ("chosen", "fastest"), so no sentence calls a width faster than the one the table marks."""
    c = getattr(session, "choice", None)
    if c is None or c.width == c.best:
        return ""
    return (f" (chosen by the tie rule: {_arm_name(c.best)} is the fastest, but its interval overlaps "
            f"{_arm_name(c.width)}'s, so not measurably faster)")


def _open(session: Session) -> str:
    """What leaves a session undecided: overlapping ranges, or intervals short of the bar; a
    workload's names the widths still open when others are decided (the tryout read "intervals
    straddle" beside a w2 the table called slower)."""
    open_ = [a for a in session.arms if a.verdict is Verdict.UNDECIDED and a.runs]
    if not session.single:
        if open_ and any(a.runs and a.verdict is not Verdict.UNDECIDED for a in session.arms):
            names = ", ".join(a.name for a in open_)
            return (f"{names}'s interval straddles the minimum gain" if len(open_) == 1
                    else f"the intervals of {names} straddle the minimum gain")
        return "intervals straddle the minimum gain"
    c = session.classic.decode_range()
    if c is None or any(a.decode_range().overlaps(c) for a in open_):
        return "ranges overlap"
    return "intervals do not clear the minimum gain"


def in_effect_note(session: Session, width: int | None) -> tuple[str, Tone] | None:
    """What the session says about the width in effect, and how loudly to say it."""
    if width is None or session.cancelled:
        return None
    try:
        arm = session.arm(width)
    except KeyError:
        return (f"width {width} in effect was not measured in this session", Tone.WARN)
    v = arm.verdict
    if v is Verdict.WINS and session.recommendation == width:
        return (f"width {width} in effect is the best measured here", Tone.GOOD)
    if v is Verdict.WINS:
        # in the table's words: the tie rule's pick is "chosen", the highest speed-up "fastest"
        c, pick = session.choice, session.recommendation
        chosen = _arm_name(pick) if pick is not None else "another width"
        if c is not None and c.best == width:
            return (f"width {width} in effect is the fastest here, but the tie rule chooses {chosen}: "
                    f"w{width} is not measurably faster", Tone.WARN)
        if c is not None and c.best != pick:
            return (f"width {width} in effect beats classic; the tie rule chooses {chosen} "
                    f"({_arm_name(c.best)} is the fastest)", Tone.WARN)
        return (f"width {width} in effect beats classic; {chosen} is chosen (the fastest)", Tone.WARN)
    # another width won: said beside the one in effect, so the top and the session's headline
    # ("width 2 beats classic") do not read as two answers (a tryout's)
    won = ""
    if session.recommendation is not None and session.recommendation != width:
        won = f"; {_arm_name(session.recommendation)} beats classic" + (" (s saves it)" if session.saveable else "")
    if v is Verdict.SLOWER:
        return (f"width {width} in effect is SLOWER than classic here{won}", Tone.BAD)
    if v is Verdict.NO_GAIN:
        return (f"width {width} in effect does not clear the minimum gain over classic here{won}", Tone.WARN)
    return (f"width {width} in effect: {v.value} against classic{won}", Tone.WARN)
