"""The A/B session: widths against classic, measured the way docs/method.md says.

- a discarded warm-up of every arm, then repetitions interleaved arm by arm
  (classic, w_a, w_b, ...), and one closing classic run, so drift spreads
  across the table instead of pooling at one end;
- min / median / max of decode tok/s (prefill excluded) and end-to-end tok/s;
- sequential mode adds interleaved repetitions until every arm is decided or
  the budget (repetitions or seconds) runs out;
- a **workload** (several requests) runs every arm on every request, each repetition a
  pass over the requests with the arms' order rotated request by request, and classic
  closes with a pass of its own; byte identity is checked per request; the arms' figures
  are per pass (one run of every request), and the verdict is the interval rule's alone;
- every arm's speed-up over classic has a seeded bootstrap interval and a permutation
  p-value (``policy.stats``); a win needs the interval's lower end above 1 + the minimum
  gain (on a single prompt, the disjoint ranges too), and among winners the smallest width
  whose interval overlaps the best's is chosen.

The verdict rules (wins, undecided, drift, the interval and tie rules, what is saveable) are
``policy.verdict``'s; this module runs the session and applies them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from blockwidth.engine import attention, costcurve, kvcache, linear
from blockwidth.engine import exact as exact_path
from blockwidth.engine.session import host
from blockwidth.engine import auto as auto_width
from blockwidth.engine.decode import DecodeError, DecodeRun, decode
from blockwidth.engine.kvcache import RewindError
from blockwidth.engine.identity import Exactness, Identity, compare, divergence_margin, probe
from blockwidth.engine.workload import PROMPT, Prepared, prepare
from blockwidth.policy import oracle as hindsight, stats
from blockwidth.policy import verdict as rules
from blockwidth.policy.auto import AUTO, DEFAULT_AUTO_MAX
from blockwidth.policy.workload import Request, Workload
from blockwidth.policy.verdict import DRIFT_CHANCE, Budget, Range, Verdict, disjoint_by_chance  # noqa: F401 (re-exported)


REPLAY_FACTOR = 1.5  # first run at a position this much slower than repeats: replay-flattered
STOCK_CLASSIC = "classic-stock"  # the arm of classic on stock kernels, beside exact classic


def per_token_acceptance(runs: list[DecodeRun]) -> float | None:
    """The per-token acceptance a of (1 - a^K) / (1 - a), estimated geometrically over
    ``runs``: accepted / (accepted + rounds that rejected a draft)."""
    acc = sum(r.accepted for r in runs)
    rej = sum(1 for run in runs for x in run.rounds if x.accepted < x.drafted)
    return acc / (acc + rej) if acc + rej else None


def _whole_ms(rounds: list) -> float | None:
    """Mean wall time of ``rounds`` in ms (draft, verify, the host work after it, rollback)."""
    if not rounds:
        return None
    return sum(x.draft_s + x.verify_s + x.sync_s + x.rollback_s for x in rounds) / len(rounds) * 1e3


@dataclass
class Arm:
    width: int | None
    runs: list[DecodeRun] = field(default_factory=list)
    verdict: Verdict = Verdict.UNDECIDED
    why: str = ""
    identity: Identity | None = None
    range_why: str = ""  # the range rule's words, before the interval rule's (one request)
    # Classic on stock kernels beside classic on the exact path (engine.exact): the speed-up's
    # control when it is the faster of the two; identity is always judged against exact classic.
    stock: bool = False

    @property
    def name(self) -> str:
        if self.width is None:
            return STOCK_CLASSIC if self.stock else "classic"
        return AUTO if self.width == AUTO else f"w{self.width}"

    @property
    def auto(self) -> bool:
        return self.width == AUTO

    def trajectory(self) -> list[list[int]]:
        """An auto arm's width by round, one list per run (empty for a fixed arm)."""
        return [list(r.widths) for r in self.runs if r.widths is not None]

    def decode_range(self) -> Range | None:
        return Range.of([r.decode_tok_s for r in self.runs]) if self.runs else None

    def e2e_range(self) -> Range | None:
        return Range.of([r.e2e_tok_s for r in self.runs]) if self.runs else None

    @property
    def acceptance(self) -> float | None:
        d = sum(r.drafted for r in self.runs)
        return sum(r.accepted for r in self.runs) / d if d else None

    @property
    def per_token_acceptance(self) -> float | None:
        return per_token_acceptance(self.runs)

    @property
    def draft_ms_per_round(self) -> float | None:
        """Median drafting time of a round that drafted, from the split rounds only."""
        split = [x.draft_s * 1e3 for r in self.runs for x in r.rounds if x.split and x.drafted]
        return statistics.median(split) if split else None

    @property
    def rollback_ms_per_round(self) -> float | None:
        """Mean time putting the cache back per round (rounds that kept every row count 0)."""
        rounds = [x for r in self.runs for x in r.rounds]
        return sum(x.rollback_s for x in rounds) / len(rounds) * 1e3 if rounds else None

    def _kinds_of_rounds(self) -> tuple[list, list, int] | None:
        """(rounds whose drafter proposed nothing at a speculative width, rounds that verified
        drafts, every round), as DecodeRun.declined_rounds counts them (an auto round at width 1
        drafted nothing by choice: neither); None for classic or a served run."""
        if self.width is None or not self.runs or not all(hasattr(r, "rounds") for r in self.runs):
            return None
        declined, drafted, total = [], [], 0
        for r in self.runs:
            total += len(r.rounds)
            for x, w in zip(r.rounds, r.widths or [2] * len(r.rounds)):
                if x.drafted:
                    drafted.append(x)
                elif w > 1:
                    declined.append(x)
        return declined, drafted, total

    @property
    def declined_share(self) -> float | None:
        """The share of this arm's rounds whose drafter proposed nothing (a 1-row step each)."""
        kinds = self._kinds_of_rounds()
        return len(kinds[0]) / kinds[2] if kinds and kinds[2] else None

    @property
    def declined_round_ms(self) -> float | None:
        """Mean wall time of a round whose drafter proposed nothing (a 1-row step that waits for
        its token), or None where none declined."""
        kinds = self._kinds_of_rounds()
        return _whole_ms(kinds[0]) if kinds else None

    def drafted_round_mean(self, part: str) -> float | None:
        """A part of a round (``rollback_s``, ``sync_s``) in ms, over the rounds that verified
        drafts only: the prediction weighs them by the share of such rounds itself."""
        kinds = self._kinds_of_rounds()
        if not kinds or not kinds[1]:
            return None
        return sum(getattr(x, part) for x in kinds[1]) / len(kinds[1]) * 1e3

    def round_breakdown(self, step_ms: float | None) -> dict | None:
        """A round's wall time by part (ms, mean over the split rounds, where draft and verify
        are timed apart), the whole round's mean over every round, and against ``step_ms``
        (classic's measured step): what a round costs beside the token it must beat."""
        if self.width is None or not self.runs or not all(hasattr(r, "rounds") for r in self.runs):
            return None
        split = [x for r in self.runs for x in r.rounds if x.split]
        rounds = [x for r in self.runs for x in r.rounds]
        if not rounds:
            return None

        def mean(v):
            return round(sum(v) / len(v) * 1e3, 4) if v else None

        whole = sum(r.decode_s for r in self.runs) / len(rounds) * 1e3
        out = {"draft_ms": mean([x.draft_s for x in split]), "verify_ms": mean([x.verify_s for x in split]),
               "overhead_ms": mean([x.sync_s for x in split]), "rollback_ms": mean([x.rollback_s for x in split]),
               "round_ms": round(whole, 4), "split_rounds": len(split), "rounds": len(rounds),
               "tokens_per_round": round(sum(len(r.tokens) if not isinstance(r.tokens, int) else r.tokens
                                             for r in self.runs) / len(rounds), 4),
               "classic_step_ms": None if step_ms is None else round(step_ms, 4)}
        if step_ms:
            out["round_over_step"] = round(whole / step_ms, 4)
        # The rounds that drafted nothing apart from those that verified drafts: a declined round
        # is a 1-row step that waits for its token (classic's overlap the next step's host work)
        declined, drafted, _ = self._kinds_of_rounds()
        if declined:
            out["declined_rounds"] = len(declined)
            out["declined_round_ms"] = round(_whole_ms(declined), 4)
            out["drafted_round_ms"] = round(_whole_ms(drafted), 4) if drafted else None
        return out

    @property
    def draft_ms_per_token(self) -> float | None:
        """From the split rounds only: the others do not time drafting apart."""
        split = [x for r in self.runs for x in r.rounds if x.split and x.drafted]
        d = sum(x.drafted for x in split)
        return sum(x.draft_s for x in split) / d * 1e3 if d else None


@dataclass
class Event:
    kind: str  # session, warmup, arm, progress, rep, phase, exactness, costcurve, done, cancelled
    arm: str = ""
    rep: int = 0
    tokens: int = 0
    total: int = 0
    message: str = ""
    run: int = 0  # runs finished before this one
    runs: int = 1  # runs planned (sequential mode may add more)
    closing: bool = False  # the closing classic bracket, not a repetition
    phase: str = "runs"  # runs, exactness, divergence, costcurve: which stage run/runs count (a
    # front end branches on it, never on ``message``, which is prose)
    elapsed: float = 0.0  # seconds since the session started (the sequential budget's clock)
    request: str = ""  # a workload's request id ("" for a single prompt)
    # "rep": the session as its finished repetitions left it, for a front end to show the figures
    # so far (read it in the callback: the session goes on changing after it returns)
    session: Any = field(default=None, repr=False, compare=False)

    @property
    def fraction(self) -> float:
        """How far the whole session is, from this event alone (so events may be dropped)."""
        part = self.tokens / self.total if self.total else 0.0
        return min((self.run + part) / max(self.runs, 1), 1.0)


@dataclass(frozen=True)
class AbConfig:
    widths: tuple[int, ...]
    prompt: str
    n: int = 3
    max_tokens: int = 64
    sequential: bool = False
    max_reps: int = 12
    max_seconds: float = 600.0
    warmup: bool = True
    exactness: bool = True
    predict: bool = True
    verify_attention: str = "auto"  # engine.attention: auto | fused | plain | bucketed | vector
    verify_linear: str = "auto"  # engine.linear: auto | stock | gather | gemv | qmv
    workload: Workload | None = None  # several requests; None: ``prompt`` alone
    min_gain: float = stats.MIN_GAIN  # a win's interval must clear 1 + this
    seed: int | None = None  # the statistics' seed; None: drawn when the session starts
    resamples: int = stats.RESAMPLES
    rollback: str = kvcache.DEFAULT_METHOD.value  # how recurrent state follows the kept rows
    exact: str = "auto"  # engine.exact: auto | on | off (the exact path for every 1..16-row forward)

    @property
    def request_count(self) -> int:
        return len(self.workload.requests) if self.workload is not None else 1
    # The auto arm's widest width (widths holding "auto"); None: the widest fixed width swept,
    # or policy.auto.DEFAULT_AUTO_MAX when auto is swept alone.
    auto_max: int | None = None

    @property
    def fixed_widths(self) -> tuple[int, ...]:
        return tuple(w for w in dict.fromkeys(self.widths) if w != AUTO)

    @property
    def auto_cap(self) -> int | None:
        """The auto arm's widest width, None when no auto arm is swept."""
        if AUTO not in self.widths:
            return None
        return self.auto_max or max(self.fixed_widths, default=DEFAULT_AUTO_MAX)

    @property
    def widest(self) -> int:
        """The widest verify any arm may run: what the warm-up and the curve make room for."""
        return max([*self.fixed_widths, self.auto_cap or 2])

    @property
    def planned_runs(self) -> int:
        """Warm-ups, n interleaved repetitions of every arm on every request, and the closing
        classic pass."""
        arms = 1 + len(dict.fromkeys(self.widths)) + int(self.stock_classic)
        k = self.request_count
        return arms * (self.n * k + int(self.warmup)) + k

    # Set by run_session when the exact path is on: classic on stock kernels runs beside it.
    stock_classic: bool = False


def single_request(prompt: str, ids: list[int], max_tokens: int) -> Prepared:
    """The session's one prompt as a prepared request."""
    return Prepared(Request("1", prompt=prompt, line=1), tuple(ids), max_tokens, PROMPT)


@dataclass
class RequestArms:
    """One request of a session: its prepared prompt and every arm's runs on it."""

    prepared: Prepared
    classic: Arm
    arms: list[Arm]
    stock: Arm | None = None  # classic on stock kernels, when the session is on the exact path
    control: Arm | None = None  # the speed-up's control: classic, or stock classic when faster

    @property
    def id(self) -> str:
        return self.prepared.id

    def arm(self, width: int | None) -> Arm:
        if width == STOCK_CLASSIC:
            return self.stock
        return self.classic if width is None else next(a for a in self.arms if a.width == width)

    def ratio(self, width: int) -> float | None:
        """This request's speed-up of ``width``: its total tokens over total decode time,
        against the control's on this request (classic, or stock classic where faster)."""
        a = self.arm(width)
        control = self.control or self.classic
        if not a.runs or not control.runs:
            return None
        return stats.ratio([_samples(a)], [_samples(control)])

    @property
    def measured(self) -> bool:
        """Classic and every arm ran on this request (a cancelled session may have stopped
        before some did): only then does it have a best width, classic included."""
        return bool(self.classic.runs) and all(a.runs for a in self.arms)

    def best(self) -> int | None:
        """The fixed width with the highest speed-up on this request whose output is classic's;
        None when none is faster than classic (auto is not a fixed width: the oracle's column),
        or when the request was not measured on every arm (``measured``)."""
        if not self.measured:
            return None
        got = [(r, a.width) for a in self.arms
               if not a.auto and a.identity is not None and a.identity.identical_ids
               and (r := self.ratio(a.width)) is not None and r > 1]
        return max(got)[1] if got else None

    def to_dict(self) -> dict:
        return {**self.prepared.to_dict(), "best": self.best(), "measured": self.measured,
                "ratios": {a.name: (round(r, 4) if (r := self.ratio(a.width)) is not None else None)
                           for a in self.arms}}


def _samples(arm: Arm) -> list[tuple[float, float]]:
    """Each run's (new tokens, decode seconds); a served run counts its tokens itself."""
    return [(r.tokens if isinstance(r.tokens, int) else len(r.tokens), r.decode_s) for r in arm.runs]


def pass_run(width: int | None, runs: list[DecodeRun]) -> DecodeRun:
    """One pass of a workload as one run: every request's tokens, times and rounds together,
    so an arm's figures (tok/s, acceptance, rounds) read per pass."""
    first, last = runs[0], runs[-1]
    clocks = ({"before": first.clocks["before"], "after": last.clocks["after"]}
              if first.clocks and last.clocks else None)
    widths = [w for r in runs for w in r.widths] if all(r.widths is not None for r in runs) else None
    return DecodeRun(width, [t for r in runs for t in r.tokens], sum(r.prompt_tokens for r in runs),
                     sum(r.prefill_s for r in runs), sum(r.decode_s for r in runs),
                     [x for r in runs for x in r.rounds], attention=first.attention, clocks=clocks,
                     widths=widths)


@dataclass
class Session:
    config: AbConfig
    prompt_ids: list[int]
    classic: Arm
    arms: list[Arm]
    order: list[str] = field(default_factory=list)  # arm names in the order they ran
    drift: bool = False  # opening and closing classic ranges do not overlap
    drift_chance: float | None = None  # how often that happens by chance alone, for these counts
    drift_why: str = ""
    recommendation: int | None = None
    decision: str = ""
    why: str = ""
    exactness: dict[int, Exactness] = field(default_factory=dict)
    curve: costcurve.CostCurve | None = None
    curve_skipped: str = ""  # why there is no cost curve (and so no prediction), when there is none
    # The auto arm's controller (process-wide: engine.auto.shared) and what it was on entry, so
    # the record keeps its costs and parameters; None when no auto arm is swept.
    auto: auto_width.Controller | None = None
    oracle: hindsight.Shares | None = None  # auto against hindsight (policy.oracle), when it ran
    predicted: dict[int, float] = field(default_factory=dict)
    predicted_best: int | None = None  # None also when the curve's repeats do not resolve it
    predicted_note: str = ""  # the prediction's best width, or "not resolved at this n" and why
    prediction: dict[int, costcurve.Prediction] = field(default_factory=dict)  # both terms per width
    draft_cost: costcurve.DraftCost = costcurve.DraftCost.LINEAR
    draft_cost_ms: float = 0.0  # the measured unit: per round (flat) or per drafted token (linear)
    drafter_kind: str = ""
    warmup: dict[str, DecodeRun] = field(default_factory=dict)  # discarded from the statistics
    warmup_shift: int = 0  # positions the warm-up ran ahead of the session's (0: same positions)
    attention: str = ""  # the verify attention in effect (auto resolved for this backend)
    backend: str = ""  # cuda, metal or cpu
    reps: int = 0
    # Sequential mode only: which budget stopped it while it still wanted repetitions (None: it
    # did not stop on a budget), so a refusal can name the one to raise.
    budget_out: Budget | None = None
    # Seconds from the start at which each repetition (a workload's pass) ended: with the runs'
    # own times, what an undecided session's advice computes its budget from.
    rep_ends: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    cancelled: bool = False
    started_at: float = field(default_factory=time.time)
    # The requests, each with every arm's runs on it. With one request its arms are the
    # session's own (``classic`` and ``arms`` are requests[0]'s); with several, the
    # session's arms hold one run per pass (``pass_run``).
    requests: list[RequestArms] = field(default_factory=list)
    seed: int = 0  # of the bootstrap and the permutations: the record reproduces from it
    estimates: dict[int, stats.Estimate] = field(default_factory=dict)  # per width with runs
    no_interval: str = ""  # why there are no estimates though every arm ran (stats.StatsError's words)
    # A workload whose requests carry classes (policy.workload: "class"): each class's speed-up
    # with its own interval, {class: (request ids, {width: Estimate})}; not a verdict
    by_class: dict[str, tuple[tuple[str, ...], dict[int, stats.Estimate]]] = field(default_factory=dict)
    choice: stats.Choice | None = None  # the tie rule's pick among the winners
    # The exact path (engine.exact.Plan): whether every 1..16-row forward took row-invariant
    # kernels, and why; with it on, stock classic runs beside exact classic and the speed-up's
    # control is the faster of the two (``baseline``).
    exact: Any = None
    stock: Arm | None = None
    baseline: str = "classic"

    @property
    def control(self) -> Arm:
        """The arm speed-ups are measured against: classic, or stock classic where faster."""
        return self.stock if self.baseline == STOCK_CLASSIC and self.stock is not None else self.classic

    @property
    def workload(self) -> Workload | None:
        return self.config.workload

    @property
    def per_request(self) -> list[RequestArms]:
        """The requests; a session built by hand from arms alone is its prompt's one request."""
        if self.requests:
            return self.requests
        return [RequestArms(single_request(self.config.prompt, self.prompt_ids, self.config.max_tokens),
                            self.classic, self.arms)]

    @property
    def single(self) -> bool:
        """One request: the disjoint-range rule applies beside the interval."""
        return len(self.requests) <= 1

    @property
    def prompt_sha256(self) -> str:
        if self.config.workload is not None:
            return self.config.workload.sha256
        return hashlib.sha256(self.config.prompt.encode("utf-8")).hexdigest()

    def differing_requests(self, width: int) -> list[str]:
        """Ids of the requests on which ``width``'s output is not classic's."""
        return [r.id for r in self.per_request
                if (i := r.arm(width).identity) is not None and not i.identical_ids]

    def stats_samples(self) -> tuple[list[list[tuple[float, float]]], dict[int, list]]:
        """(classic, {width: ...}): per request, each run's (new tokens, decode seconds), for
        every width that ran on every request: what ``policy.stats`` is given."""
        classic = [_samples(r.control or r.classic) for r in self.per_request]
        arms = {}
        for w in (a.width for a in self.arms):
            got = [_samples(r.arm(w)) for r in self.per_request]
            if all(got):
                arms[w] = got
        return classic, arms

    def classic_step_ms(self) -> float | None:
        """The control's measured decode step, ms a token (median over its runs): what a round
        must beat per token it emits."""
        runs = self.control.runs
        per = [r.decode_s / len(r.tokens) * 1e3 for r in runs
               if not isinstance(r.tokens, int) and r.tokens and r.decode_s > 0]
        return statistics.median(per) if per else None

    def opening_closing(self) -> tuple[Range | None, Range | None]:
        return rules.opening_closing([r.decode_tok_s for r in self.classic.runs])

    @property
    def saveable(self) -> bool:
        """blockwidth.policy.verdict.saveable: not cancelled, not drifted, and a win or a decline."""
        return rules.saveable(cancelled=self.cancelled, drifted=self.drift,
                              recommendation=self.recommendation,
                              verdicts=[a.verdict for a in self.arms])

    @property
    def drift_could_be_noise(self) -> bool:
        """Classic's opening and closing runs are apart, but noise alone does that more often
        than DRIFT_CHANCE with this few runs: more classic runs would settle it."""
        return rules.could_be_noise(self.drift, self.drift_chance)

    def cold_arms(self, factor: float = 2.0) -> dict[str, float]:
        """Arms whose discarded warm-up decoded ``factor``x slower than their median run.

        On CUDA, MLX builds a cuDNN attention plan per (rows, KV length) and keeps
        a bounded number (MLX_CUDA_SDPA_CACHE_SIZE): a first pass at new positions
        pays for every plan, so a warm table can flatter a width."""
        out = {}
        first = self.requests[0] if self.requests else None  # the warm-up ran on its prompt
        arms = [first.classic, *first.arms] if first else [self.classic, *self.arms]
        for arm in arms:
            w = self.warmup.get(arm.name)
            if w is not None and arm.runs:
                med = statistics.median(r.decode_s for r in arm.runs)
                if med > 0 and w.decode_s / med >= factor:
                    out[arm.name] = w.decode_s / med
        return out

    def replayed_arms(self, factor: float = REPLAY_FACTOR) -> dict[str, float]:
        """Arms whose first measured run (the first at these positions: the warm-up ran
        elsewhere) was ``factor``x slower than their later runs: the later runs replayed
        something the first built for these exact positions (on CUDA, fused attention's
        cuDNN plans per KV length). A new request would pay the first run's price."""
        out = {}
        if not self.warmup_shift:
            return out
        for arm in [self.classic, *self.arms]:
            if len(arm.runs) >= 3:
                later = statistics.median(r.decode_s for r in arm.runs[1:])
                if later > 0 and arm.runs[0].decode_s / later >= factor:
                    out[arm.name] = arm.runs[0].decode_s / later
        return out

    def verify_overhead(self, factor: float = 3.0) -> dict[str, float]:
        """Arms whose verify inside decoding cost ``factor``x the cost curve's forward of as
        many rows: something is rebuilt per round (on CUDA, a thrashed cuDNN plan cache)."""
        out = {}
        if self.curve is None:
            return out
        for arm in self.arms:
            if arm.auto:
                continue  # its verifies are at many widths: each fixed arm's figure covers them
            ref = self.curve.ms(arm.width)
            times = [x.verify_s * 1e3 for r in arm.runs for x in r.rounds if x.split and x.drafted]
            if ref and times:
                ratio = statistics.median(times) / ref
                if ratio >= factor:
                    out[arm.name] = ratio
        return out

    def warnings(self) -> list[str]:
        """What makes this table flatter or punish a width more than service would."""
        out = []
        if self.no_interval:
            zero = [a.name for a in [self.classic, *self.arms] if any(r.decode_s <= 0 for r in a.runs)]
            out.append(f"no speed-up interval: {self.no_interval}"
                       + (f" ({', '.join(zero)} had runs whose tokens all came at once)" if zero else "")
                       + "; the verdicts rest on the ranges alone, and every run is in the record")
        cold = self.cold_arms()
        if cold:
            listed = ", ".join(f"{k} {v:.1f}x" for k, v in cold.items())
            if self.warmup_shift:
                out.append(f"first (warm-up) pass was slower: {listed}. It ran at other positions, "
                           "so this is first-use work (kernels compiled, memory allocated) that a "
                           "server pays once; the check that matters per request is the first "
                           "measured run against its repeats.")
            else:
                out.append(f"first (warm-up) pass was slower: {listed}. The warm-up shared the "
                           "session's positions (no room in the model's context to move it), so the "
                           "table may be warm: a width that meets new positions in service may pay "
                           "this every round (on CUDA: cuDNN attention plans per KV length, cached up "
                           "to MLX_CUDA_SDPA_CACHE_SIZE).")
        # The causes named below (cuDNN plans per KV length) are CUDA's. A first CPU session on
        # a shared host met both warnings with their CUDA reasons and "try plain", which changes
        # nothing there: elsewhere they are said as what was seen, with the host's load as a cause.
        cuda = self.backend == "cuda"
        replay = self.replayed_arms()
        if replay:
            seen = ("first run at the session's positions was slower than the repeats: " + ", ".join(
                f"{k} {v:.1f}x" for k, v in replay.items()))
            if cuda:
                out.append(seen + ". The repeats replayed what it built for those exact positions, "
                           "which a new request cannot; a win is still judged on the slowest run, "
                           "which is the first"
                           + (f" (verify attention {self.attention}; try plain)" if self.attention == "fused"
                              else "") + ".")
            else:
                out.append(seen + f". On {self.backend or 'this backend'} nothing is known to be "
                           "rebuilt per position, so the host's other load is the likelier cause; a "
                           "win is still judged on the slowest run, which is the first.")
        spread = host.clock_spread([r.clocks["before"] for a in (self.classic, *self.arms)
                                    for r in a.runs if r.clocks])
        if spread:
            out.append(f"the GPU's SM clock moved between runs, {spread[0]}-{spread[1]} MHz: runs "
                       "compared across arms met different clocks (each sample's gpu_clocks in the "
                       "record says which)")
        slow = self.verify_overhead()
        if slow:
            listed = ", ".join(f"{k} {v:.0f}x" for k, v in slow.items())
            out.append(f"verify inside decoding cost {listed} the cost curve's forward of as many rows: "
                       + ("something is rebuilt every round (on CUDA, MLX's cuDNN attention plan cache, "
                          "MLX_CUDA_SDPA_CACHE_SIZE, is too small for these widths and positions)."
                          if cuda else "something costs more per round inside decoding than alone, or "
                          "the host was busier than while the cost curve ran."))
        out += self._linear_warnings()
        return out

    def _linear_warnings(self) -> list[str]:
        """Arms whose verify projections the chosen route never took: their figures are stock's.
        A width-w verify has w rows, and the route takes 2..MAX_ROWS (gather) or 2..GEMV_MAX_ROWS
        (gemv) of them: a gemv sweep over widths 2..16 routes at w8 and not at w12."""
        mode = linear.effective(self.config.verify_linear)
        if mode not in linear.ROUTES:
            return []
        ran = [arm for arm in self.arms if arm.runs]
        idle = [arm for arm in ran if not sum(r.linear_routed for r in arm.runs)]
        if not idle:
            return []
        if len(idle) < len(ran):
            return [f"verify linear {mode.value} routed no projection at "
                    f"{', '.join(a.name for a in idle)}: it takes verifies of "
                    f"{linear.MIN_ROWS}..{linear.max_rows(mode)} "
                    "rows (a width's rows), so those arms' figures are stock's."]
        return [f"verify linear {mode.value} routed no projection: "
                f"{linear.unrouted_reason(mode, self.backend or None)}, so the projections stayed on "
                "the stock matmul and the figures are stock's."]

    def prediction_line(self, per_width: bool = False) -> str:
        """The prediction as the front ends say it (costcurve.prediction_words); ``per_width``:
        with each width's predicted speed-up."""
        return costcurve.prediction_words(self.predicted_best, self.predicted, self.predicted_note, per_width)

    def prediction_lines(self) -> list[str]:
        """The prediction with both of its terms, so an operator sees why a width wins."""
        if not self.prediction:
            return []
        unit = "per round, any width" if self.draft_cost is costcurve.DraftCost.FLAT else "per drafted token"
        lines = [f"{self.prediction_line()}; {self.drafter_kind} drafting is {self.draft_cost.value}: "
                 f"{self.draft_cost_ms:.2f} ms {unit}"]
        lines += [f"  {p.describe()}" for _, p in sorted(self.prediction.items())]
        return lines

    def round_lines(self) -> list[str]:
        """Each width's round by part against classic's step: where a round's time goes."""
        step = self.classic_step_ms()
        out = []
        for a in self.arms:
            b = a.round_breakdown(step)
            if not b or b["draft_ms"] is None:
                continue
            parts = (f"draft {b['draft_ms']:.2f} + verify {b['verify_ms']:.2f} + after the verify "
                     f"{b['overhead_ms']:.2f} + rollback {b['rollback_ms']:.2f}")
            against = (f"; {b['round_over_step']:.2f}x classic's step of {step:.2f} ms, "
                       f"{b['tokens_per_round']:.2f} tokens a round" if step else "")
            apart = (f"; {b['declined_rounds']} drafted nothing, {b['declined_round_ms']:.2f} ms each, the others "
                     f"{b['drafted_round_ms']:.2f}" if b.get("declined_rounds") and b.get("drafted_round_ms") else "")
            out.append(f"  {a.name:<5} round {b['round_ms']:.2f} ms ({parts} ms in the split rounds){against}{apart}")
        return (["round by part (mean ms; the split rounds time draft and verify apart):"] + out) if out else []

    def rollback_line(self) -> str:
        """How the target's cache went back to the kept rows each round, and what it cost."""
        runs = [r for a in self.arms for r in a.runs]
        if not runs or not hasattr(runs[0], "rollback"):
            return ""  # a served run: the server's cache is its own, not timed from here
        info = runs[0].rollback or {}
        method = info.get("method") or "trim"
        how = ("KV rows trimmed" if method == "trim" else
               f"recurrent state restored and advanced by the kept rows ({method}"
               + (f"; {info['fallback']}" if info.get("fallback") else "") + ")")
        per = [(a.name, a.rollback_ms_per_round) for a in self.arms if a.rollback_ms_per_round is not None]
        if all(v < 0.005 for _, v in per):
            return f"rollback: {how}, under 0.01 ms a round"
        return f"rollback: {how}; ms a round " + ", ".join(f"{n} {v:.2f}" for n, v in per)

    def arm(self, width: int) -> Arm:
        for a in self.arms:
            if a.width == width:
                return a
        raise KeyError(width)


def _facts(arm: Arm, session: Session | None = None) -> rules.ArmFacts:
    """What a verdict is drawn from. Across a workload, identical means on every request."""
    identical = arm.identity is not None and arm.identity.identical_ids
    if session is not None and not session.single:
        identical = not session.differing_requests(arm.width)
    # Every round of an auto arm is its controller's decision, speculating or not (width 1): it
    # is measured even when it never speculated, as classic inside the speculative loop.
    spec = sum(len(r.rounds) if arm.auto else r.speculative_rounds for r in arm.runs)
    return rules.ArmFacts(arm.name, arm.width, tuple(r.decode_tok_s for r in arm.runs), spec,
                          sum(r.declined_rounds for r in arm.runs), identical)


def judge(classic: Arm, arm: Arm) -> None:
    """Set ``arm.verdict`` and ``arm.why`` from its runs against classic's (policy.verdict.judge)."""
    f = _facts(arm)
    arm.verdict, arm.why = rules.judge(classic.decode_range(), f.range,
                                       speculative_rounds=f.speculative_rounds,
                                       declined_rounds=f.declined_rounds, identical=f.identical)


def _by_class(session: Session, classic: list, arms: dict) -> dict:
    """Each class of request's speed-up and interval, drawn as the workload's are (the same seed),
    where the requests carry two classes or more: a workload whose kinds disagree is undecided
    as a whole (on the H100, lookup over edits: 0.79x to 1.50x by request), and this says which
    kind a width served, for a workload of its own to decide."""
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(session.per_request):
        group = r.prepared.request.group
        if group is not None:
            groups.setdefault(group, []).append(i)
    if len(groups) < 2:
        return {}
    out = {}
    for group, idx in groups.items():
        try:
            est = stats.estimates([classic[i] for i in idx], {w: [a[i] for i in idx] for w, a in arms.items()},
                                  seed=session.seed, resamples=session.config.resamples)
        except stats.StatsError:
            continue
        out[group] = (tuple(session.per_request[i].id for i in idx), est)
    return out


def decide(session: Session) -> None:
    """Verdicts, drift, the estimates and the recommendation, from the samples in ``session``
    (policy.stats for the estimates, policy.verdict.decide for the rules)."""
    c = session.config
    session.estimates = {}
    # A cancelled session has no verdict to draw an interval for (and a workload's bootstrap
    # takes seconds on a busy CPU, between the cancel and the screen saying it stopped).
    session.no_interval = ""
    choose_baseline(session)
    classic, arms = session.stats_samples()  # against the control just chosen
    if arms and all(classic) and not session.cancelled:
        try:
            session.estimates = stats.estimates(classic, arms, seed=session.seed, resamples=c.resamples)
        except stats.StatsError as e:
            # An arm whose runs took no decode time (the served path: a stream that sent every
            # token in one chunk) has no speed-up to bound: the ranges judge alone, the session
            # and its record stand, and the warnings say why there is no interval (it
            # was exit 2 with the measured runs lost).
            session.no_interval = str(e)
    session.by_class = {}
    if session.estimates:
        session.by_class = _by_class(session, classic, arms)
    control = session.control
    d = rules.decide([r.decode_tok_s for r in session.classic.runs], [_facts(a, session) for a in session.arms],
                     control_tok_s=([r.decode_tok_s for r in control.runs] if control is not session.classic
                                    else None),
                     # how to get more repetitions is each front end's to say (console.outcome.advice)
                     cancelled=session.cancelled, reps=session.reps,
                     blind=rules.warm_blind(warmup_shift=session.warmup_shift,
                                            attention=session.attention, backend=session.backend),
                     estimates=session.estimates, min_gain=c.min_gain, single=session.single)
    for arm, (verdict, why), range_why in zip(session.arms, d.verdicts, d.range_whys):
        arm.verdict, arm.why, arm.range_why = verdict, why, range_why
    session.drift, session.drift_chance, session.drift_why = d.drift.drifted, d.drift.chance, d.drift.why
    session.recommendation, session.decision, session.why = d.recommendation, d.decision, d.why
    session.choice = d.choice


def choose_baseline(session: Session) -> None:
    """On the exact path, the speed-up's control is the faster (median decode tok/s, every run
    of the session's arm) of exact classic and stock classic, so a width never wins by a slower
    baseline; the choice is set on the session and every request."""
    stock = session.stock
    session.baseline = "classic"
    if stock is not None and stock.runs and session.classic.runs:
        fast = statistics.median(r.decode_tok_s for r in stock.runs)
        if fast > statistics.median(r.decode_tok_s for r in session.classic.runs):
            session.baseline = STOCK_CLASSIC
    for r in session.per_request:
        r.control = r.stock if session.baseline == STOCK_CLASSIC else None


def _all_decided(session: Session) -> bool:
    """Sequential mode stops when every arm is decided and drift is settled either way."""
    decide(session)
    if session.drift_could_be_noise:
        return False  # cannot yet tell drift from noise: more classic runs settle it
    return all(a.verdict is not Verdict.UNDECIDED for a in session.arms)


def warmup_prompt(ids: list[int], max_tokens: int, width: int,
                  context: int | None) -> tuple[list[int], int]:
    """The warm-up's prompt, at positions the session never visits, so the warm-up compiles
    kernels without building anything keyed on the session's exact KV lengths: the session's
    prompt led by filler (its first token) when the model's context has room above, else the
    prompt cut short enough that the warm-up ends before the session starts. Returns
    (prompt, shift): positions moved (+ above, - below), 0 when neither fits."""
    need = max_tokens + width + 1
    if context is None or len(ids) + need + max_tokens + width <= context:
        return [ids[0]] * need + list(ids), need
    if len(ids) > need:
        return list(ids[:len(ids) - need]), -need
    return list(ids), 0


def seed_of(config: AbConfig) -> int:
    """The statistics' seed: the config's, else a fresh one (the record keeps it)."""
    return config.seed if config.seed is not None else secrets.randbelow(2**32)


def _prepare(pair, config: AbConfig) -> list[Prepared]:
    """The session's requests, every id of each checked against the pair's embedding tables
    (engine.shapes) before any forward."""
    from blockwidth.engine.shapes import check_ids

    rows, where = getattr(pair, "token_rows", None), f"target {getattr(pair, 'target_path', '')}"
    if config.workload is None:
        if not config.prompt:
            raise DecodeError("prompt: empty")
        prepared = [single_request(config.prompt, pair.tokenizer.encode(config.prompt), config.max_tokens)]
    else:
        prepared = prepare(config.workload, pair.tokenizer, config.max_tokens)  # a WorkloadError names the request
    for p in prepared:  # a ShapeError names the prompt or the request, as it is
        check_ids(p.ids, rows, where if config.workload is None else f"request {p.id}, {where}")
    return prepared


def _rotated(arms: list[Arm], k: int) -> list[Arm]:
    """The arms' order for a workload's k-th request: rotated by k, so no width always runs
    right after classic (where a cache or clock left by classic would meet it)."""
    if not arms:
        return arms
    k %= len(arms)
    return arms[k:] + arms[:k]


def _add_pass(session: Session, widths: list[int | None]) -> None:
    """One run per arm in ``widths`` on the session's own (workload) arms: its last pass."""
    for w in widths:
        agg = session.classic if w is None else session.stock if w == STOCK_CLASSIC else session.arm(w)
        runs = [r.arm(w).runs for r in session.requests]
        if all(len(x) > len(agg.runs) for x in runs):
            got = [x[len(agg.runs)] for x in runs]
            combine = getattr(type(got[0]), "combine_pass", None)  # a served run combines itself
            agg.runs.append(combine(w, got) if combine is not None else pass_run(w, got))


def interleave(session: Session, one: Callable[..., object], *, cancel: threading.Event,
               emit: Callable[[Event], None], t_start: float, lockstep=None) -> None:
    """The session's schedule, whatever runs an arm: a discarded warm-up of every arm (on the
    first request), n passes, each every request with its arms interleaved (classic first, the
    widths rotated request by request), more in sequential mode while an arm is undecided and
    the budget lasts, and the closing classic pass. ``one(arm, rep, keep=True, closing=False)``
    runs one request's arm once and records it (``keep=False``: the warm-up); a workload's own
    arms get each finished pass (``pass_run``). The engine's decode loop and the served path
    (engine.session.served) both run through here. ``lockstep`` (the ranks of a sharded target,
    engine.distributed): the seconds budget is rank 0's clock's."""
    config = session.config
    requests = session.per_request
    many = len(requests) > 1
    if config.warmup:
        first = requests[0]
        for arm in [first.classic, *([first.stock] if first.stock else []), *first.arms]:
            emit(Event("warmup", arm.name))
            one(arm, 0, keep=False)
            if cancel.is_set():
                break

    def budget_out() -> Budget | None:
        if session.reps >= config.max_reps:
            return Budget.REPS
        if time.monotonic() - t_start >= config.max_seconds:
            return Budget.SECONDS
        return None

    if lockstep is not None:
        local = budget_out

        def budget_out() -> Budget | None:  # noqa: F811 (every rank stops where rank 0 does)
            return lockstep.agree(local(), Budget)

    def one_pass(rep: int, active: list[int]) -> None:
        for k, req in enumerate(requests):
            for arm in [req.classic, *([req.stock] if req.stock else []),
                        *_rotated([req.arm(w) for w in active], k)]:
                one(arm, rep)
                if cancel.is_set():
                    return

    rep = 0
    while True:
        while not cancel.is_set():
            rep += 1
            if rep > config.n:
                if not config.sequential or _all_decided(session):
                    break
                session.budget_out = budget_out()
                if session.budget_out is not None:
                    break
            active = session.arms if rep <= config.n else [
                a for a in session.arms if a.verdict is Verdict.UNDECIDED] or session.arms
            one_pass(rep, [a.width for a in active])
            if cancel.is_set():
                break
            if many:
                _add_pass(session, [None, *([STOCK_CLASSIC] if session.stock else []),
                                    *(a.width for a in active)])
            session.reps = rep
            session.rep_ends.append(time.monotonic() - t_start)
            emit(Event("rep", rep=rep, message=f"repetition {rep} done", elapsed=time.monotonic() - t_start,
                       session=session))
        if cancel.is_set():
            break
        for req in requests:  # the closing bracket: classic on every request
            one(req.classic, session.reps + 1, closing=True)
            if cancel.is_set():
                break
        if cancel.is_set():
            break
        if many:
            _add_pass(session, [None])
        # Drift is judged with the closing run, which the loop above could not see, and the
        # closing run can be classic's fastest: in sequential mode a closing run that leaves
        # drift and noise apart only by chance, or that takes an arm's win back (undecided
        # again), sends the session back for more repetitions (that run stays a classic run).
        if not config.sequential or _all_decided(session):
            break
        session.budget_out = budget_out()
        if session.budget_out is not None:
            break
        rep = session.reps


def against_hindsight(session: Session) -> hindsight.Shares | None:
    """The auto arm's aggregate as a share of the per-request oracle's and of the best single
    fixed arm's (policy.oracle), from the session's samples and seed; None without an auto arm
    and a fixed one that ran every request, or for a cancelled session."""
    if session.auto is None or session.cancelled:
        return None
    classic, arms = session.stats_samples()
    if AUTO not in arms or not all(classic):
        return None
    try:
        return hindsight.shares({None: classic, **arms}, AUTO, seed=session.seed,
                             resamples=session.config.resamples)
    except stats.StatsError:
        return None


def _controller(pair, session: Session, config: AbConfig, reach: int, shortest: int,
                emit: Callable[[Event], None], cancel: threading.Event) -> auto_width.Controller | None:
    """The process's auto controller for this pair and these verify settings: calibrated (its cost
    curve measured) the first time a process asks, past every position this session visits
    (``reach``) where the model's context leaves room, so no arm meets work the calibration left
    behind; else below the shortest prompt."""
    cap = config.auto_cap
    ctx = reach + config.widest
    room = 2 + 5 + cap + 1  # calibrate()'s cold forwards (2 warm-up, 5 timed) grow the cache by one each
    if pair.context_length is not None and ctx + room > pair.context_length:
        ctx = max(1, shortest // 2)
    emit(Event("phase", "auto", run=0, runs=1, phase="costcurve", message="auto: calibrating"))
    return auto_width.shared(pair, attention=session.attention, linear=config.verify_linear,
                             max_width=cap, context=ctx, rollback=config.rollback, cancel=cancel.is_set)


def run_session(pair, config: AbConfig, *, on_event: Callable[[Event], None] | None = None,
                cancel: threading.Event | None = None, lockstep=None) -> Session:
    """Run an A/B session on a loaded pair. Raises DecodeError for bad input. ``lockstep``: this
    process is one rank of a sharded target's group (engine.distributed.Lockstep), whose ranks
    compare tokens and take rank 0's timings after every run."""
    emit = on_event or (lambda e: None)
    cancel = cancel or threading.Event()
    widths = tuple(dict.fromkeys(config.widths))
    if not widths:
        raise DecodeError("widths: give at least one width to compare")
    for w in widths:
        if w != AUTO and (not isinstance(w, int) or isinstance(w, bool) or w < 2):
            raise DecodeError(f"width {w!r}: a speculative width is at least 2 (1 is classic)")
    if config.auto_max is not None and config.auto_max < 2:
        raise DecodeError(f"auto max width {config.auto_max}: at least 2")
    fixed = config.fixed_widths
    if config.n < 1:
        raise DecodeError(f"n = {config.n}: at least one repetition per arm")
    if not 0 <= config.min_gain < 1:
        raise DecodeError(f"min gain {config.min_gain}: expected a fraction from 0 up to 1")
    prepared = _prepare(pair, config)
    backend = attention.current_backend()
    plan = exact_path.plan(pair.target, config.exact, backend)
    plan = exact_path.choose_route(pair.target, plan, lockstep=lockstep)  # auto on CUDA: the cheaper route
    if plan.active:  # classic on stock kernels beside exact classic: the faster is the control
        config = dataclasses.replace(config, stock_classic=True)

    def stock_arm() -> Arm | None:
        return Arm(None, verdict=Verdict.CONTROL, stock=True) if plan.active else None

    requests = [RequestArms(p, Arm(None, verdict=Verdict.CONTROL), [Arm(w) for w in widths], stock_arm())
                for p in prepared]
    many = len(requests) > 1
    if many:
        classic, arms, stock = Arm(None, verdict=Verdict.CONTROL), [Arm(w) for w in widths], stock_arm()
    else:
        classic, arms, stock = requests[0].classic, requests[0].arms, requests[0].stock
    ids = list(prepared[0].ids)
    seed = seed_of(config)
    if lockstep is not None:
        seed = lockstep.agree(seed)  # the verdicts' bootstrap: rank 0's seed on every rank
    session = Session(config, ids, classic, arms, requests=requests, seed=seed)
    session.exact, session.stock = plan, stock
    session.backend = backend
    session.attention = attention.effective(config.verify_attention, session.backend).value
    # The verify projections of every speculative forward this session runs: the arms, and the
    # exactness probe, divergence replay and cost curve that judge and predict them.
    lin = config.verify_linear
    warm_ids, session.warmup_shift = warmup_prompt(ids, prepared[0].max_tokens, config.widest,
                                                   pair.context_length)
    t_start = time.monotonic()
    emit(Event("session", message=f"{len(widths)} widths, n={config.n}, {config.max_tokens} tokens"
                                  + (f", {len(requests)} requests" if many else "")))
    if config.auto_cap is not None:
        reach = max([len(p.ids) + p.max_tokens for p in prepared] + [len(warm_ids) + prepared[0].max_tokens])
        session.auto = _controller(pair, session, config, reach, min(len(p.ids) for p in prepared),
                                   emit, cancel)

    started = [0]  # runs begun so far
    clocks = host.ClockWatch()

    owner = {id(a): r for r in requests for a in [r.classic, *r.arms, *([r.stock] if r.stock else [])]}

    def one(arm: Arm, rep: int, keep: bool = True, closing: bool = False) -> DecodeRun | None:
        if cancel.is_set():
            return None  # cancelled between runs (while a verdict was drawn): start nothing
        req = owner[id(arm)]
        index = started[0]
        started[0] += 1
        runs = max(config.planned_runs, started[0])
        rid = req.id if many else ""
        total = req.prepared.max_tokens
        emit(Event("arm", arm.name, rep, 0, total, run=index, runs=runs, closing=closing, request=rid,
                   elapsed=time.monotonic() - t_start))
        kw = {} if arm.width is None else {"attention": session.attention, "linear": lin,
                                           "rollback": config.rollback}
        kw["exact"] = None if arm.stock else plan  # every arm on the path but stock classic
        if arm.auto and session.auto is None:
            return None  # cancelled while the controller was calibrating: nothing to run
        width = session.auto.run() if arm.auto else arm.width  # auto: a width per round
        before, host_before = clocks.read(), host.host_reading()
        if cancel.is_set():
            return None  # cancelled while the run was announced and the clocks read (CI saw one start)
        run = decode(pair, list(req.prepared.ids) if keep else warm_ids, total, width, **kw,
                     on_progress=lambda k, t: emit(Event("progress", arm.name, rep, k, t, run=index,
                                                         runs=runs, closing=closing, request=rid,
                                                         elapsed=time.monotonic() - t_start)),
                     cancel=cancel.is_set)
        run.host = host.host_delta(host_before, host.host_reading())
        if before is not None:
            run.clocks = {"before": before, "after": clocks.read()}
        if lockstep is not None:
            lockstep.run(run)
        if keep and not cancel.is_set():
            arm.runs.append(run)
            session.order.append(f"{req.id}/{arm.name}" if many else arm.name)
        elif not keep:
            session.warmup[arm.name] = run
        return run

    # NVML (opened by the watch) is shut down however the runs end: a decode error or an
    # exception from on_event mid-session must not leave it initialised in the process.
    try:
        interleave(session, one, cancel=cancel, emit=emit, t_start=t_start, lockstep=lockstep)
    finally:
        clocks.close()

    for req in requests:
        reference = req.classic.runs[0].tokens if req.classic.runs else None
        for arm in req.arms:
            if reference is not None and arm.runs:
                idents = [compare(reference, r.tokens, pair.tokenizer) for r in arm.runs]
                arm.identity = next((i for i in idents if not i.identical_ids), idents[0])
    first = requests[0]
    reference = first.classic.runs[0].tokens if first.classic.runs else None

    if config.exactness and not cancel.is_set() and reference:
        # A stage of its own (seconds on a large target): the bar must not sit at 100 % meanwhile.
        for i, w in enumerate(fixed):  # auto's rounds are at widths these and the identity cover
            if cancel.is_set():
                break
            block = reference[:w]
            emit(Event("phase", f"w{w}", run=i, runs=len(fixed), phase="exactness"))
            if cancel.is_set():
                break  # cancelled as the stage was shown: its probe does not start
            if len(block) == w:
                session.exactness[w] = probe(pair.target, ids, block, session.attention, lin, exact=plan)
                emit(Event("exactness", f"w{w}", message=session.exactness[w].describe()))

    if not cancel.is_set():
        for req in requests:
            ref = req.classic.runs[0].tokens if req.classic.runs else None
            req_ids = list(req.prepared.ids)
            for arm in req.arms:
                if cancel.is_set():
                    break  # each margin is a probe and two decodes: a cancel stops between them
                ident = arm.identity
                if ident is None or ident.identical_ids or ident.first_divergence is None:
                    continue
                if ident.first_divergence >= min(ident.classic_len, ident.width_len):
                    continue  # one is a prefix of the other: no position to compare
                if arm.auto:
                    continue  # no one width to replay: its rounds are in the record
                ex = session.exactness.get(arm.width) if req is first else None
                if ex is None:
                    block = ref[:arm.width] if ref else []
                    ex = (probe(pair.target, req_ids, block, session.attention, lin, exact=plan)
                          if len(block) == arm.width else None)
                # a stage of its own on screen (the bar would sit at the probe's last width)
                emit(Event("phase", f"{arm.name}" + (f" on {req.id}" if many else ""), run=len(fixed),
                           runs=len(fixed), phase="divergence", message="divergence margin"))
                if cancel.is_set():
                    break
                differing = next((r for r in arm.runs if r.tokens != ref), arm.runs[0])  # as identity
                margin = divergence_margin(pair, req_ids, arm.width, ref, differing.tokens,
                                           ident.first_divergence, ex.max_abs_diff if ex else 0.0,
                                           session.attention, lin, exact=plan)
                arm.identity = dataclasses.replace(ident, margin=margin)
    if many:
        # The session's arm speaks for the workload: the first request whose output differs,
        # else the first request's (identical) comparison.
        for arm in session.arms:
            idents = [r.arm(arm.width).identity for r in requests]
            idents = [i for i in idents if i is not None]
            if idents:
                arm.identity = next((i for i in idents if not i.identical_ids), idents[0])

    if config.predict and not cancel.is_set():
        measured = [a for a in session.arms if a.per_token_acceptance is not None and not a.auto]
        if measured:
            rows = sorted({1, *fixed})
            # Past every position the session visited, so no cold forward replays its work
            # (where the model's context leaves room for that); else at the session's prompt;
            # else (a context too short for even that) no curve, and the record says why.
            longest = max(len(p.ids) + p.max_tokens for p in prepared)
            ctx = max(longest, len(warm_ids) + prepared[0].max_tokens) + config.widest
            room = costcurve.positions(rows, repeats=5)
            limit = pair.context_length
            if limit is not None and ctx + room > limit:
                ctx = len(ids)
            if limit is not None and ctx + room > limit:
                session.curve_skipped = (f"cost curve skipped: its {room} positions past the "
                                         f"{ctx}-token prompt exceed the target's context of {limit}")
            else:
                emit(Event("phase", run=0, runs=len(rows), phase="costcurve"))
                try:
                    session.curve = costcurve.measure(
                        pair.target, rows, repeats=5, context=ctx, attention=session.attention,
                        linear=lin, rollback=config.rollback, exact=plan,
                        on_progress=lambda i, n: emit(Event("phase", run=i, runs=n, phase="costcurve")),
                        cancel=cancel.is_set)
                except (RewindError, ValueError) as e:  # the arms' figures stand without it
                    session.curve_skipped = f"cost curve skipped: {e}"
        elif not session.curve_skipped:
            session.curve_skipped = ("cost curve skipped: no arm drafted a token, so there is no "
                                     "acceptance to predict with")
        if measured and session.curve is not None:
            acc = statistics.median(a.per_token_acceptance for a in measured)
            # the kind says how drafting grows with width: flat for a block drafter, linear else
            session.drafter_kind = pair.kind.value
            session.draft_cost = costcurve.draft_cost(pair.kind.value)
            if session.draft_cost is costcurve.DraftCost.FLAT:
                drafts = [a.draft_ms_per_round for a in measured if a.draft_ms_per_round is not None]
            else:
                drafts = [a.draft_ms_per_token for a in measured if a.draft_ms_per_token is not None]
            draft_ms = statistics.median(drafts) if drafts else 0.0
            session.draft_cost_ms = draft_ms
            def per_width(get: Callable[[Arm], float | None]) -> dict[int, float]:
                return {a.width: v for a in measured if (v := get(a)) is not None}

            session.prediction = costcurve.predict_terms(
                session.curve, acc, draft_ms, fixed, session.draft_cost,
                # rollback and host work per round that verified drafts: the prediction weighs
                # those rounds by their share, and prices the declined ones whole (below)
                per_width(lambda a: a.drafted_round_mean("rollback_s")),
                # the round's host work after its verify, measured; the 1-row baseline stays the
                # curve's, measured beside the verifies it is divided by (classic's session step
                # met other noise: on a busy host it made w2 read 7.7x)
                per_width(lambda a: a.drafted_round_mean("sync_s")),
                declined=per_width(lambda a: a.declined_share),
                declined_ms=per_width(lambda a: a.declined_round_ms))
            session.predicted = {k: p.speedup for k, p in session.prediction.items()}
            # Only where the curve's repeats agree on it: a 1-row forward caught by the host's
            # noise once predicted w2 at 5.42x against ~1.1x measured.
            session.predicted_best, session.predicted_note = costcurve.best_resolved(
                session.prediction, session.curve.repeats)
            emit(Event("costcurve", message=session.predicted_note or "no prediction"))

    session.cancelled = cancel.is_set()
    decide(session)
    session.oracle = against_hindsight(session)
    session.elapsed_s = time.monotonic() - t_start
    emit(Event("cancelled" if session.cancelled else "done", message=session.decision))
    return session
