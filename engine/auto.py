"""The process-wide auto width: one controller per pair and verify settings, alive as long as the
process, across requests and sessions.

It keeps this device's and pair's costs (the verify cost curve measured once, when it is first
asked for, with engine.costcurve; drafting and the loop's own time learnt from the rounds) and
the acceptance evidence (per request and pooled), and hands the decode loop a width per round
(``Controller.run``: what ``engine.decode.speculative`` takes in place of an int). The decisions
are ``policy.auto``'s; every input they see is recorded (the costs and parameters, the state each
request started from, the rounds as the record rounds them), so a record replays its widths.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from blockwidth.policy import auto as rule
from blockwidth.policy.auto import AUTO, DEFAULT_AUTO_MAX, Costs, Observation, Params, State  # noqa: F401 (re-exported)


def _ms(seconds: float) -> float:
    # As engine.decode.DecodeRun.rounds_table rounds them: what a record keeps is what was seen.
    return round(seconds * 1e3, 4)


def observation(width: int, r) -> Observation:
    """What the controller learns from one engine.decode.Round."""
    return Observation(width, r.drafted, r.accepted, _ms(r.draft_s) if r.split else None, _ms(r.sync_s))


def costs_from_curve(curve, kind: str, draft_ms: float = 0.0, overhead_ms: float = 0.0) -> Costs:
    """Costs from a measured engine.costcurve.CostCurve: its cold medians by rows, its rollback by
    rows where it measured one (a trim is too small to count), drafting by the kind's model."""
    verify = {p.rows: p.median_ms for p in curve.points}
    back = {p.rows: p.rollback_ms for p in curve.points if getattr(p, "rollback_ms", None)}
    if getattr(curve, "rollback", "trim") == "trim":
        back = {}
    return Costs(verify, rule.draft_cost(kind), draft_ms, back, overhead_ms)


def calibrate(pair, *, max_width: int = DEFAULT_AUTO_MAX, context: int = 128, attention=None, linear=None,
              repeats: int = 5, rollback: str | None = None,
              cancel: Callable[[], bool] | None = None) -> tuple[Costs, Any]:
    """Measure this pair's costs once: the target's verify forward at 1..max_width rows (cold, as
    decoding meets them) and, for a draft model, its one-row step (the draft cost per token; the
    other kinds' drafting is learnt from the first timed rounds). Returns (costs, the curve)."""
    from blockwidth.engine import costcurve

    rows = tuple(range(1, max_width + 1))
    curve = costcurve.measure(pair.target, rows, context=context, repeats=repeats, warm=False,
                              attention=attention, linear=linear, rollback=rollback, cancel=cancel)
    draft_ms = 0.0
    if pair.kind.value == "model" and pair.drafter is not None:
        step = costcurve.measure(pair.drafter, (1,), context=context, repeats=repeats, warm=False)
        draft_ms = step.ms(1) or 0.0
    return costs_from_curve(curve, pair.kind.value, draft_ms), curve


@dataclass
class Run:
    """One request's widths: what engine.decode's round loop calls once per round with the rounds
    so far (``__call__``), and ``close`` after the last; then its record (``to_dict``)."""

    controller: "Controller"
    start: State  # the controller's state before this request began
    widths: list[int] = field(default_factory=list)
    probes: list[int] = field(default_factory=list)  # round indices that were probes
    switches: list[list] = field(default_factory=list)  # [round, from, to, why]
    seen: int = 0  # rounds already observed

    @property
    def cap(self) -> int:
        """The widest width this run can take: what caches and drafters are sized for."""
        return max(rule.candidates(self.controller.costs, self.controller.params))

    def __call__(self, rounds: list) -> int:
        return self.controller._next(self, rounds)

    def close(self, rounds: list) -> None:
        self.controller._close(self, rounds)

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start.to_dict(), "widths": list(self.widths), "probes": list(self.probes),
                "switches": [list(s) for s in self.switches]}


class Controller:
    """The stateful auto width for one pair and its verify settings. Thread-safe: a round's
    decision and observation run under one lock, so requests from several threads interleave
    their rounds through one pool (as one server process would)."""

    def __init__(self, costs: Costs, params: Params = Params(), state: State | None = None,
                 curve: Any = None):
        self.costs = costs
        self.params = params
        self.state = state or State()
        self.curve = curve  # the engine.costcurve.CostCurve the costs were built on, when measured
        self._lock = threading.Lock()

    def run(self) -> Run:
        """A width source for one request (its own evidence starts now; the pool carries on)."""
        with self._lock:
            start = self.state
            self.state = rule.begin_request(self.state, self.params)
        return Run(self, start)

    def _observe(self, run: Run, rounds: list) -> None:
        while run.seen < len(rounds):
            i = run.seen
            self.state = rule.observe(self.state, observation(run.widths[i], rounds[i]), self.costs,
                                      self.params)
            run.seen += 1

    def _next(self, run: Run, rounds: list) -> int:
        with self._lock:
            self._observe(run, rounds)
            d = rule.decide(self.state, self.costs, self.params)
            self.state = d.state
            i = len(run.widths)
            if d.probe:
                run.probes.append(i)
            elif d.switched:
                run.switches.append([i, run.widths[-1] if run.widths else run.start.width, d.width,
                                     d.why])
            run.widths.append(d.width)
            return d.width

    def _close(self, run: Run, rounds: list) -> None:
        with self._lock:
            self._observe(run, rounds)

    def acceptance(self) -> float:
        """The pooled per-position acceptance: what a consumer that cannot adapt should plan for."""
        return self.state.pool_estimate(self.params)

    def plan(self) -> rule.Plan:
        """What a profile entry keeps: the costs with the draft and loop times it has learnt, the
        pooled acceptance, its widest width."""
        c, st = self.costs, self.state
        costs = Costs(c.verify_ms, c.draft, c.draft_ms if st.draft_ms is None else st.draft_ms,
                      c.rollback_ms, c.overhead_ms if st.overhead_ms is None else st.overhead_ms)
        return rule.Plan(costs, self.acceptance(), self.params.max_width)

    def static_width(self) -> int:
        """The fixed width this controller's costs and pooled acceptance predict best (>= 2)."""
        return rule.static_width(self.costs, self.acceptance(), self.params)

    def to_dict(self) -> dict[str, Any]:
        """Its inputs, as a record keeps them once per session: the costs, the parameters and the
        curve they were measured from (its context and rows)."""
        out = {"costs": self.costs.to_dict(), "params": self.params.to_dict(),
               "pooled_acceptance": round(self.acceptance(), 4), "static_width": self.static_width()}
        if self.curve is not None:
            out["curve"] = self.curve.to_dict()
        return out


_SHARED: dict[tuple, Controller] = {}
_SHARED_LOCK = threading.Lock()


def key(pair, attention: str | None, linear: str | None, max_width: int,
        rollback: str | None = None) -> tuple:
    from blockwidth.engine.kvcache import DEFAULT_METHOD

    method = getattr(rollback, "value", rollback) or DEFAULT_METHOD.value  # None: the default method
    return (pair.pair_id, pair.kind.value, attention or "auto", linear or "auto", max_width, method)


def shared(pair, *, attention: str | None = None, linear: str | None = None,
           max_width: int = DEFAULT_AUTO_MAX, context: int = 128, rollback: str | None = None,
           cancel: Callable[[], bool] | None = None) -> Controller | None:
    """The process's controller for this pair and verify settings, calibrated on first use
    (None when ``cancel`` stopped the calibration: a part-measured curve is never kept)."""
    k = key(pair, attention, linear, max_width, rollback)  # the rollback method: its costs too
    with _SHARED_LOCK:
        c = _SHARED.get(k)
        if c is None:
            if cancel is not None and cancel():
                return None
            curve = None
            try:
                costs, curve = calibrate(pair, max_width=max_width, context=context,
                                         attention=attention, linear=linear, rollback=rollback,
                                         cancel=cancel)
            except rule.AutoError:
                if cancel is not None and cancel():
                    return None
                raise
            if cancel is not None and cancel():
                return None
            c = _SHARED[k] = Controller(costs, Params(max_width=max_width), curve=curve)
        return c


def forget() -> None:
    """Drop every process-wide controller (a test's fresh process)."""
    with _SHARED_LOCK:
        _SHARED.clear()


def replay(costs: Costs, params: Params, start: State, rounds_detail: list[list]) -> list[int]:
    """The widths a run's record says its controller chose, recomputed from the record alone:
    the costs and parameters, the state the request started from, and its rounds as the record
    keeps them (engine.decode.ROUND_COLUMNS: drafted, accepted, emitted, draft_ms, verify_ms,
    sync_ms, split, ...)."""
    rows = [(r[0], r[1], r[3] if r[6] else None, r[5]) for r in rounds_detail]
    return rule.replay(start, costs, params, rows)[0]
