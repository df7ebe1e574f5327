"""The auto width's decision, pure: a round's cost by width, an acceptance estimate, and the width
that maximises predicted tokens per second, with hysteresis and a deterministic re-entry probe.

A round at width K verifies K rows (K - 1 drafted tokens and the pending one). At per-position
acceptance a it emits E(K) = (1 - a^K) / (1 - a) tokens on average and costs

    draft(K) + verify(K) + rollback(K) x (1 - a^(K-1)) + the loop's own time per round,

draft(K) being flat per round (a block drafter) or per drafted token (the others). The controller
picks the K with the highest E(K) / cost(K). K = 1 verifies the pending token alone: classic
decoding inside the speculative loop, nothing drafted. At K = 1 nothing is learnt about
acceptance, so after ``probe_every`` such rounds one round probes at the best speculative width;
a probe that does not bring speculation back doubles the wait, up to ``2 ** max_backoff`` times.

Acceptance is geometric evidence (kept drafts, rejections), exponentially weighted per request
and pooled over every request the controller has seen; a request's estimate leans on the pool
until its own evidence outweighs ``prior_weight`` positions. Every function here is a function of
its arguments: the same costs, parameters, start state and observations give the same widths,
which is what lets a record replay its trajectory (``replay``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Iterable, Mapping, Sequence

from blockwidth.policy.errors import BlockwidthError

AUTO = "auto"  # the arm, the sweep's width list and the profile entry say it so
DEFAULT_AUTO_MAX = 16  # widest width the controller considers unless told otherwise (--auto-max)
# The width bound every width this tool takes is held to (policy.profile.MAX_WIDTH is this one):
# a plan's max_width and its cost curve's row counts too, so that an auto entry cannot answer
# --num-draft-tokens 999 or have --check --measure calibrate 100,000 rows.
WIDTH_BOUND = 64


class AutoError(BlockwidthError, ValueError):
    """Costs or parameters the controller cannot decide from; the message names the value."""


class DraftCost(str, Enum):
    """How a drafter's time per round grows with the width."""

    FLAT = "flat"  # one drafter forward proposes the whole block (DFlash): same cost at any width
    LINEAR = "linear"  # one forward per drafted token (a draft model, chained MTP heads, lookup)


def draft_cost(kind: str) -> DraftCost:
    return DraftCost.FLAT if kind == "dflash" else DraftCost.LINEAR


def expected_tokens(acceptance: float, width: int) -> float:
    """Tokens emitted per round at per-token acceptance ``a``: (1 - a^K) / (1 - a)."""
    a = min(max(acceptance, 0.0), 1.0)
    if a >= 1.0:
        return float(width)
    return (1 - a ** width) / (1 - a)


def reject_chance(acceptance: float, width: int) -> float:
    """How often a round at ``width`` rejects a draft, so that the cache has rows to put back:
    1 - a^(K-1) (every draft kept: nothing to roll back)."""
    a = min(max(acceptance, 0.0), 1.0)
    return 1 - a ** (width - 1) if width > 1 else 0.0


def _int_keys(d: Mapping[Any, Any], what: str, *, positive: bool = False) -> dict[int, float]:
    """Times by row count, each row count 1..WIDTH_BOUND; ``positive``: every time above 0 (a
    verify that takes no time makes a round free, and a rate divides by it)."""
    if len(d) > WIDTH_BOUND:
        raise AutoError(f"{what}: {len(d):,} row counts; at most {WIDTH_BOUND} (the width bound)")
    out = {}
    for k, v in d.items():
        rows = k if isinstance(k, int) and not isinstance(k, bool) else None
        if isinstance(k, str) and k.isascii() and k.isdigit() and len(k) <= 3:
            rows = int(k)
        if rows is None or not 1 <= rows <= WIDTH_BOUND:
            raise AutoError(f"{what}: row count {_said(k)} is not an integer 1..{WIDTH_BOUND} (the width bound)")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 \
                or (positive and v <= 0):
            least = "above 0" if positive else "0 or more"
            raise AutoError(f"{what}[{rows}] = {_said(v)}: expected a time in ms, {least}")
        out[rows] = float(v)
    return dict(sorted(out.items()))


def _said(v: Any, limit: int = 40) -> str:
    """A value as a message quotes it: a profile is input, and one line stays short."""
    text = repr(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Costs:
    """What a round costs on this device and pair, in ms: the cost curve's verify forward by rows,
    drafting by the kind's model, rollback by rows where the cache needs more than a trim, and
    the loop's own time per round (any width)."""

    verify_ms: Mapping[int, float]
    draft: DraftCost = DraftCost.LINEAR
    draft_ms: float = 0.0  # per drafted token (LINEAR) or per round (FLAT)
    rollback_ms: Mapping[int, float] = field(default_factory=dict)
    overhead_ms: float = 0.0

    def __post_init__(self) -> None:
        v = _int_keys(self.verify_ms, "verify_ms", positive=True)
        if 1 not in v:
            raise AutoError("verify_ms needs the 1-row forward (K = 1 is the option to stop "
                            "speculating), and it must take some time")
        object.__setattr__(self, "verify_ms", v)
        object.__setattr__(self, "rollback_ms", _int_keys(self.rollback_ms, "rollback_ms"))
        object.__setattr__(self, "draft", DraftCost(self.draft))
        for name in ("draft_ms", "overhead_ms"):
            x = getattr(self, name)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
                raise AutoError(f"{name} = {x!r}: expected a time in ms, 0 or more")

    @property
    def widths(self) -> tuple[int, ...]:
        return tuple(self.verify_ms)

    def draft_at(self, width: int, draft_ms: float | None = None) -> float:
        d = self.draft_ms if draft_ms is None else draft_ms
        if width <= 1:
            return 0.0
        return d if self.draft is DraftCost.FLAT else (width - 1) * d

    def round_ms(self, width: int, acceptance: float, *, draft_ms: float | None = None,
                 overhead_ms: float | None = None) -> float:
        back = self.rollback_ms.get(width, 0.0) * reject_chance(acceptance, width)
        over = self.overhead_ms if overhead_ms is None else overhead_ms
        return self.draft_at(width, draft_ms) + self.verify_ms[width] + back + over

    def rate(self, width: int, acceptance: float, **kw: float | None) -> float:
        """Predicted tokens per ms at ``width``: E(K) / the round's cost (K = 1: one token)."""
        e = 1.0 if width <= 1 else expected_tokens(acceptance, width)
        return e / self.round_ms(width, acceptance, **kw)

    def to_dict(self) -> dict[str, Any]:
        return {"verify_ms": {str(k): round(v, 4) for k, v in self.verify_ms.items()},
                "draft": self.draft.value, "draft_ms": round(self.draft_ms, 4),
                "rollback_ms": {str(k): round(v, 4) for k, v in self.rollback_ms.items()},
                "overhead_ms": round(self.overhead_ms, 4)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Costs":
        """The inverse of to_dict (a record's or a profile entry's costs); AutoError when bad."""
        if not isinstance(d, Mapping) or not isinstance(d.get("verify_ms"), Mapping):
            raise AutoError("costs: expected a table with verify_ms by rows")
        try:
            draft = DraftCost(d.get("draft", "linear"))
        except ValueError:
            raise AutoError(f"costs: draft = {d.get('draft')!r}: expected flat or linear") from None
        return Costs(d["verify_ms"], draft, d.get("draft_ms", 0.0), d.get("rollback_ms") or {},
                     d.get("overhead_ms", 0.0))


@dataclass(frozen=True)
class Params:
    """The controller's settings (a record stores them, so a replay uses the same)."""

    max_width: int = DEFAULT_AUTO_MAX
    hysteresis: float = 0.05  # leave the current width only for a predicted rate this much higher
    request_decay: float = 0.97  # per speculative round: a request's evidence, about 30 rounds
    pooled_decay: float = 0.99  # the pool's, about 100 rounds over every request
    prior_weight: float = 4.0  # a request's estimate holds the pool's as this many positions
    cold_acceptance: float = 0.6  # before any evidence at all, held as cold_weight positions
    cold_weight: float = 8.0
    probe_every: int = 8  # rounds at K = 1 before a probe
    max_backoff: int = 3  # the wait doubles per failed probe, at most 2 ** this times
    time_weight: float = 0.2  # of each new timing in the learnt draft and loop times
    stop_sd: float = 1.0  # stop speculating only if it would not pay this many standard errors up

    def __post_init__(self) -> None:
        if not isinstance(self.max_width, int) or not 1 <= self.max_width <= WIDTH_BOUND:
            raise AutoError(f"max width {_said(self.max_width)}: expected an integer 1..{WIDTH_BOUND} "
                            f"(the width bound)")
        for name in ("request_decay", "pooled_decay", "time_weight"):
            if not 0 < getattr(self, name) <= 1:
                raise AutoError(f"{name} = {getattr(self, name)!r}: expected a fraction in (0, 1]")
        if not 0 <= self.cold_acceptance <= 1:
            raise AutoError(f"cold_acceptance = {self.cold_acceptance!r}: expected 0..1")
        if self.hysteresis < 0 or self.stop_sd < 0 or self.prior_weight <= 0 or self.cold_weight <= 0:
            raise AutoError("hysteresis and stop_sd must be 0 or more, prior and cold weights above 0")
        if self.probe_every < 1 or self.max_backoff < 0:
            raise AutoError("probe_every must be 1 or more, max_backoff 0 or more")

    def probe_wait(self, failed: int) -> int:
        return self.probe_every * 2 ** min(failed, self.max_backoff)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Params":
        known = {k: v for k, v in d.items() if k in Params.__dataclass_fields__}
        return Params(**known)


@dataclass(frozen=True)
class Evidence:
    """Exponentially weighted geometric evidence: drafts kept, and rounds that rejected one."""

    kept: float = 0.0
    rejected: float = 0.0

    @property
    def positions(self) -> float:
        return self.kept + self.rejected

    def seen(self, drafted: int, accepted: int, decay: float) -> "Evidence":
        if drafted <= 0:
            return self
        return Evidence(decay * self.kept + accepted,
                        decay * self.rejected + (1.0 if accepted < drafted else 0.0))

    def estimate(self, prior: float, weight: float) -> float:
        return (self.kept + weight * prior) / (self.positions + weight)


@dataclass(frozen=True)
class State:
    """Everything the controller carries from one round to the next."""

    width: int = 0  # the width it holds (0: no round yet)
    pooled: Evidence = Evidence()
    request: Evidence = Evidence()
    idle: int = 0  # rounds at K = 1 since the last speculative round
    failed_probes: int = 0  # probes in a row that did not bring speculation back
    probing: bool = False  # the round just decided is a probe
    draft_ms: float | None = None  # learnt from split rounds; None: the costs' own
    overhead_ms: float | None = None  # learnt from every round; None: the costs' own
    rounds: int = 0
    requests: int = 0

    def pool_estimate(self, p: Params) -> float:
        return self.pooled.estimate(p.cold_acceptance, p.cold_weight)

    def acceptance(self, p: Params) -> float:
        """This request's per-position acceptance, leaning on the pool's as ``prior_weight``."""
        return self.request.estimate(self.pool_estimate(p), p.prior_weight)

    def spread(self, p: Params) -> float:
        """The standard error of ``acceptance``: binomial, on the request's positions and the
        pool's weight in it."""
        a = self.acceptance(p)
        return math.sqrt(a * (1 - a) / (self.request.positions + p.prior_weight))

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "pooled": [self.pooled.kept, self.pooled.rejected],
                "request": [self.request.kept, self.request.rejected], "idle": self.idle,
                "failed_probes": self.failed_probes, "probing": self.probing,
                "draft_ms": self.draft_ms, "overhead_ms": self.overhead_ms, "rounds": self.rounds,
                "requests": self.requests}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "State":
        return State(d["width"], Evidence(*d["pooled"]), Evidence(*d["request"]), d["idle"],
                     d["failed_probes"], d["probing"], d["draft_ms"], d["overhead_ms"],
                     d["rounds"], d["requests"])


@dataclass(frozen=True)
class Observation:
    """One round as the controller learns from it. Times are in ms as the record rounds them
    (engine.decode's rounds table), so a replay from a record sees what the live run saw."""

    width: int
    drafted: int
    accepted: int
    draft_ms: float | None = None  # a split round's drafting (None: drafting was not timed apart)
    sync_ms: float | None = None  # the loop's own time after the verify


@dataclass(frozen=True)
class Decision:
    width: int
    why: str
    state: State  # the state with this decision taken: pass it to observe() after the round
    acceptance: float
    rates: Mapping[int, float]  # predicted tokens per ms by width
    probe: bool = False
    switched: bool = False


def candidates(costs: Costs, p: Params) -> tuple[int, ...]:
    return tuple(k for k in costs.widths if k <= p.max_width)


def rates(state: State, costs: Costs, p: Params, acceptance: float | None = None) -> dict[int, float]:
    a = state.acceptance(p) if acceptance is None else acceptance
    return {k: costs.rate(k, a, draft_ms=state.draft_ms, overhead_ms=state.overhead_ms)
            for k in candidates(costs, p)}


def best_of(r: Mapping[int, float], widths: Iterable[int] | None = None) -> int:
    """The width of the highest rate; a tie goes to the smaller width."""
    ks = list(r if widths is None else widths)
    return max(ks, key=lambda k: (r[k], -k))


def static_width(costs: Costs, acceptance: float, p: Params = Params(), speculative: bool = True) -> int:
    """The width a consumer that cannot adapt (mlx_lm.server) should take at ``acceptance``:
    the best predicted one, among speculative widths when ``speculative``."""
    r = {k: costs.rate(k, acceptance) for k in candidates(costs, p)}
    spec = [k for k in r if k >= 2]
    return best_of(r, spec if speculative and spec else None)


def reentry(state: State, costs: Costs, p: Params) -> float | None:
    """The lowest acceptance at which some speculative width beats K = 1 by the hysteresis
    margin (to 1e-4), or None when none does even at acceptance 1: then probing is pointless."""

    def beats(a: float) -> bool:
        r = rates(state, costs, p, a)
        return any(v > r[1] * (1 + p.hysteresis) for k, v in r.items() if k >= 2)

    if not beats(1.0):
        return None
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if beats(mid) else (mid, hi)
    return hi


def decide(state: State, costs: Costs, p: Params) -> Decision:
    """The next round's width."""
    a = state.acceptance(p)
    r = rates(state, costs, p, a)
    best = best_of(r)
    cur = state.width
    failed = state.failed_probes
    doubt = ""
    if best == 1 and cur >= 2 and p.stop_sd > 0:
        # Stopping is the costly mistake (at K = 1 nothing more is learnt): stop only when even
        # ``stop_sd`` standard errors above the estimate speculation would not pay.
        hi = min(1.0, a + p.stop_sd * state.spread(p))
        up = rates(state, costs, p, hi)
        if best_of(up) != 1 and cur in r:
            best = cur
            doubt = f"; not stopping: at {hi:.3f} ({p.stop_sd:g} sd up) speculation pays"
    if cur in r and r[best] <= r[cur] * (1 + p.hysteresis):
        width = cur
        why = (f"holds {cur}: best {best} predicts {r[best] * 1e3:.1f} tok/s, within "
               f"{p.hysteresis:.0%} of {r[cur] * 1e3:.1f}" if best != cur else f"holds {cur}: best")
    else:
        width = best
        why = (f"{cur} -> {best}: {r[best] * 1e3:.1f} tok/s predicted against "
               f"{r[cur] * 1e3:.1f}" if cur in r else f"starts at {best}")
    why += f" at acceptance {a:.3f}{doubt}"
    if state.probing:  # the round just observed was a probe: did it bring speculation back?
        failed = failed + 1 if width == 1 else 0
    probe = False
    idle = state.idle
    if width == 1 and idle >= p.probe_wait(failed):
        even = reentry(state, costs, p)
        if even is not None:
            at = max(a, even)
            spec = rates(state, costs, p, at)
            width, probe, idle = best_of(spec, [k for k in spec if k >= 2]), True, 0
            why = (f"probe at {width} after {p.probe_wait(failed)} rounds at 1 ({failed} failed "
                   f"probes before): the width speculation would come back at, from acceptance "
                   f"{even:.3f}; {a:.3f} is not learnt at K = 1")
    switched = width != cur
    new = replace(state, width=width if not probe else cur, probing=probe, failed_probes=failed,
                  idle=idle)
    # A probe does not move the width the controller holds: after it, hysteresis compares with
    # the width it left (1), so one lucky probe round does not bring speculation back alone.
    return Decision(width, why, new, a, r, probe, switched)


def _ewma(old: float | None, new: float, weight: float) -> float:
    return new if old is None else (1 - weight) * old + weight * new


def observe(state: State, obs: Observation, costs: Costs, p: Params) -> State:
    """The state after a round at ``obs.width``."""
    s = replace(state, rounds=state.rounds + 1,
                pooled=state.pooled.seen(obs.drafted, obs.accepted, p.pooled_decay),
                request=state.request.seen(obs.drafted, obs.accepted, p.request_decay),
                idle=state.idle + 1 if obs.width <= 1 else 0)
    if obs.draft_ms is not None and obs.drafted > 0:
        unit = obs.draft_ms if costs.draft is DraftCost.FLAT else obs.draft_ms / obs.drafted
        s = replace(s, draft_ms=_ewma(state.draft_ms, unit, p.time_weight))
    if obs.sync_ms is not None:
        s = replace(s, overhead_ms=_ewma(state.overhead_ms, obs.sync_ms, p.time_weight))
    return s


def begin_request(state: State, p: Params) -> State:
    """A new request: its own evidence starts empty (the pool stays). Should its first round
    come out at K = 1 (the pool says stop, or nothing is known yet), it probes at once: its
    acceptance is its own."""
    idle = max(state.idle, p.probe_wait(state.failed_probes)) if state.width <= 1 else state.idle
    return replace(state, request=Evidence(), requests=state.requests + 1, idle=idle,
                   probing=False)


def replay(state: State, costs: Costs, p: Params,
           rounds: Sequence[tuple[int, int, float | None, float | None]]) -> tuple[list[int], State]:
    """The widths a controller in ``state`` picks for a request whose rounds went as ``rounds``
    (drafted, accepted, draft ms or None, sync ms or None), and its state after them. The start
    state is the one before ``begin_request``."""
    s = begin_request(state, p)
    widths = []
    for drafted, accepted, draft_ms, sync_ms in rounds:
        d = decide(s, costs, p)
        widths.append(d.width)
        s = observe(d.state, Observation(d.width, drafted, accepted, draft_ms, sync_ms), costs, p)
    return widths, s


@dataclass(frozen=True)
class Plan:
    """An ``auto`` profile entry: the costs the controller was built on, the pooled acceptance it
    had learnt when the session was saved, and its widest width. A consumer that cannot adapt
    (mlx_lm.server: one ``num_draft_tokens`` for the process) takes ``static_width``."""

    costs: Costs
    acceptance: float
    max_width: int = DEFAULT_AUTO_MAX

    def __post_init__(self) -> None:
        a = self.acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1:
            raise AutoError(f"acceptance = {a!r}: expected a fraction 0..1")
        Params(max_width=self.max_width)  # the same bound as the controller's
        if not any(k >= 2 for k in candidates(self.costs, Params(max_width=self.max_width))):
            raise AutoError("verify_ms has no row count from 2 to max_width: no speculative width")

    @property
    def static_width(self) -> int:
        return static_width(self.costs, self.acceptance, Params(max_width=self.max_width))

    def describe(self) -> str:
        c = self.costs
        rows = [k for k in c.widths if k <= self.max_width]
        unit = "per round" if c.draft is DraftCost.FLAT else "per drafted token"
        return (f"built on verify {rows[0]}..{rows[-1]} rows at "
                f"{min(c.verify_ms[k] for k in rows):.1f}-{max(c.verify_ms[k] for k in rows):.1f} ms, "
                f"{c.draft.value} drafting {c.draft_ms:.2f} ms {unit}, pooled acceptance "
                f"{self.acceptance:.2f}")

    def to_dict(self) -> dict[str, Any]:
        return {"acceptance": round(self.acceptance, 4), "max_width": self.max_width,
                **self.costs.to_dict()}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Plan":
        if not isinstance(d, Mapping):
            raise AutoError("expected a table {acceptance, max_width, verify_ms, draft, draft_ms, ...}")
        unknown = set(d) - {"acceptance", "max_width", "verify_ms", "draft", "draft_ms",
                            "rollback_ms", "overhead_ms"}
        if unknown:
            raise AutoError(f"unknown keys {sorted(unknown)}")
        if "acceptance" not in d:
            raise AutoError("acceptance is missing (the pooled acceptance it was saved with)")
        mw = d.get("max_width", DEFAULT_AUTO_MAX)
        if isinstance(mw, bool) or not isinstance(mw, int) or not 2 <= mw <= WIDTH_BOUND:
            raise AutoError(f"max_width = {_said(mw)}: expected an integer 2..{WIDTH_BOUND} (the width bound)")
        return Plan(Costs.from_dict(d), d["acceptance"], mw)
