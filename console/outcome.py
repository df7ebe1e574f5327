"""What a finished A/B session means: the profile entry it may become, or why not,
and the headline that says so. Pure: values in, values out (no files, no probes).

The CLI and the console both ask these functions, so the words a session earns
(and their colour in the console) follow whether it can be saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from engine.ab import Session
from policy.device import Device
from policy.drafter import DrafterKind
from policy.profile import Override
from policy.quantization import Quantization
from policy.verdict import Budget, RefusalKind, Verdict, refusal


class Front(str, Enum):
    """Which front end a refusal is worded for (each names its own controls)."""

    CLI = "cli"
    CONSOLE = "console"


_REMEDY = {
    (RefusalKind.DIFFERS, Front.CLI): "--allow-nonidentical saves it, recorded as not byte-identical",
    (RefusalKind.DIFFERS, Front.CONSOLE): "the console saves only byte-identical widths "
                                          "(the headless sweep can store it, marked not byte-identical)",
    (RefusalKind.UNDECIDED, Front.CLI): "run more repetitions (-n, or --sequential)",
    (RefusalKind.UNDECIDED, Front.CONSOLE): "run more repetitions (raise n, or turn on sequential)",
}


_CLOSE = "or the widths may be too close to separate on this host"


@dataclass(frozen=True)
class SequentialRun:
    """How far an undecided sequential session got: "turn on sequential" is no remedy there;
    the budget that ended it is (or the widths are closer than this host's noise)."""

    reps: int
    max_reps: int
    max_seconds: float
    budget_out: Budget | None

    def remedy(self, front: Front) -> str:
        if front is Front.CLI:
            if self.budget_out is Budget.REPS:
                return (f"sequential mode ran out of repetitions after {self.reps} (--max-reps "
                        f"{self.max_reps}); raise --max-reps, {_CLOSE}")
            if self.budget_out is Budget.SECONDS:
                return (f"sequential mode ran out of time after {self.reps} repetitions (--max-seconds "
                        f"{self.max_seconds:g}); raise --max-seconds, {_CLOSE}")
            return f"sequential mode stopped after {self.reps} repetitions; raise -n above {self.reps}, {_CLOSE}"
        # The console's budget is fixed (its sequential box has no fields), but n repetitions
        # always run in full before the budget is looked at: n is the control that buys more.
        more = f"raise n above {self.reps} (n repetitions always run in full), {_CLOSE}"
        if self.budget_out is Budget.REPS:
            return f"sequential mode ran out of repetitions after {self.reps} (its budget is {self.max_reps}); {more}"
        if self.budget_out is Budget.SECONDS:
            return (f"sequential mode ran out of time after {self.reps} repetitions (its budget is "
                    f"{self.max_seconds:g} s); {more}")
        return f"sequential mode stopped after {self.reps} repetitions; {more}"


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    detail: str
    sequential: SequentialRun | None = None  # an undecided sequential session: its own remedy

    def say(self, front: Front = Front.CLI) -> str:
        if self.sequential is not None:
            remedy: str | None = self.sequential.remedy(front)
        else:
            remedy = _REMEDY.get((self.kind, front))
        return self.detail + (f"; {remedy}" if remedy else "")


@dataclass(frozen=True)
class PairFacts:
    """What the entry is keyed on, taken from the loaded pair (no model objects)."""

    kind: DrafterKind
    quantization: Quantization
    pair_id: str


def profile_entry(session: Session, pair: PairFacts, device: Device, *, mlx: str | None,
                  measured_at: str, record: str, allow_nonidentical: bool = False,
                  pair_specific: bool = False, path: str = "engine", concurrency: int | None = None,
                  server: dict | None = None) -> Override | Refusal:
    """The profile entry a session earns (a width, or a decline), or the refusal and why.
    ``path``, ``concurrency`` and ``server``: what measured it (the served path's level and
    mlx_lm.server's version and arguments)."""
    why = refusal(cancelled=session.cancelled, drifted=session.drift,
                  recommendation=session.recommendation, verdicts=[a.verdict for a in session.arms],
                  allow_nonidentical=allow_nonidentical)
    faster = [a for a in session.arms if a.verdict is Verdict.FASTER_DIFFERS]
    if why is RefusalKind.CANCELLED:
        return Refusal(why, "the session was cancelled")
    if why is RefusalKind.DRIFT:
        return Refusal(why, session.drift_why)
    if why is RefusalKind.DIFFERS:
        return Refusal(why, f"{', '.join(a.name for a in faster)} faster but output differs from classic")
    if why is RefusalKind.UNDECIDED:
        c = session.config
        seq = SequentialRun(session.reps, c.max_reps, c.max_seconds, session.budget_out) if c.sequential else None
        return Refusal(why, "undecided: " + _open(session), seq)
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
    }
    if width is not None:
        evidence["width_tok_s"] = session.arm(width).decode_range().to_list()
        est = session.estimates.get(width)
        if est is not None:  # the interval it won by, and what it takes to reproduce it
            evidence.update(ratio=round(est.ratio, 4), ratio_ci=est.ci.to_list(), p_value=round(est.p, 6))
    evidence["min_gain"] = session.config.min_gain
    evidence["seed"] = session.seed
    if session.workload is not None:
        evidence["workload"] = session.workload.to_dict()
    return Override(
        backend=device.backend, drafter_kind=pair.kind, width=width, decline=width is None,
        compute_capability=device.compute_capability, device_name=device.name or None,
        quant_scheme=q.scheme.value, quant_bits=q.bits,
        quant_group_size=q.group_size, pair=pair.pair_id if pair_specific else None,
        mlx=mlx, measured_at=measured_at, byte_identical=identical, evidence=evidence,
        path=path, concurrency=concurrency, server=server, group=device.group,
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


def headline(session: Session, planned_runs: int | None = None) -> Headline:
    """One line for the top of the results; its tone follows whether the result can be saved
    (policy.verdict.refusal, as the save itself)."""
    why = refusal(cancelled=session.cancelled, drifted=session.drift,
                  recommendation=session.recommendation, verdicts=[a.verdict for a in session.arms])
    if why is RefusalKind.CANCELLED:
        done = sum(len(a.runs) for a in [session.classic, *session.arms])
        # ``planned_runs`` counts the discarded warm-ups too; these are measured runs only.
        warmups = len(session.arms) + 1 if session.config.warmup else 0
        of = f" of {planned_runs - warmups}" if planned_runs else ""
        return Headline(f"cancelled after {done}{of} measured runs: no verdict, nothing to save",
                        Tone.STOPPED, False)
    if why is RefusalKind.DRIFT:
        if session.drift_could_be_noise:
            # Too few classic runs to tell drift from noise: say so, not "drifted".
            return Headline(f"not saveable: classic drift or noise, too few runs to tell "
                            f"(measured: {session.decision})", Tone.WARN, False)
        return Headline(f"not saveable: classic drifted (measured: {session.decision})", Tone.WARN, False)
    if why is RefusalKind.DIFFERS:
        return Headline("a width is faster but its output differs from classic: not saveable", Tone.WARN,
                        False)
    if why is RefusalKind.UNDECIDED:
        return Headline(f"undecided: {_open(session)}, more repetitions needed", Tone.WARN, False)
    if why is RefusalKind.NOT_MEASURED:
        return Headline("no width was measured: the drafter declined every round", Tone.WARN, False)
    if session.recommendation is not None:
        return Headline(f"width {session.recommendation} beats classic", Tone.GOOD, True)
    if any(a.verdict is Verdict.NO_GAIN for a in session.arms):
        return Headline(f"classic wins: no measured width clears the {session.config.min_gain:.0%} minimum "
                        "gain (saves as a decline)", Tone.PLAIN, True)
    return Headline("classic wins: every measured width is slower (saves as a decline)", Tone.PLAIN, True)


def _open(session: Session) -> str:
    """What leaves a session undecided: overlapping ranges, or intervals short of the bar."""
    if not session.single:
        return "intervals straddle the minimum gain"
    c = session.classic.decode_range()
    open_ = [a for a in session.arms if a.verdict is Verdict.UNDECIDED and a.runs]
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
        return (f"width {width} in effect beats classic, but w{session.recommendation} is faster", Tone.WARN)
    if v is Verdict.SLOWER:
        return (f"width {width} in effect is SLOWER than classic here", Tone.BAD)
    if v is Verdict.NO_GAIN:
        return (f"width {width} in effect does not clear the minimum gain over classic here", Tone.WARN)
    return (f"width {width} in effect: {v.value} against classic", Tone.WARN)
