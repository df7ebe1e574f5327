"""Verify-forward time against rows, cold and warm, and the steps where the increment jumps.

Each timed forward runs at a KV length this row count has never met (cold), as
every verify round in decoding does; beside it, the same forward repeated at
one length (warm). Where the backend caches work by shape (MLX's cuDNN
attention plans on CUDA) the two differ, and only the cold figure is what a
new request pays.

A jump (or a drop) marks a kernel boundary: on an H200 a 4-bit target goes
from the per-row quantized matvec to the quantized matmul at 8 rows, and the
time per forward falls from 34.5 ms at 7 rows to 16.4 at 8. A step is marked only
where the repeats agree (every repeat of one row count past every repeat of the
other, with at least MIN_REPEATS of them); a step the medians show but the repeats
do not is "not resolved at this n", and says how far apart the repeats were.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Sequence

import mlx.core as mx

from blockwidth.policy.errors import InputError
from blockwidth.policy.integers import IntegerError, parse_int, shorten

MAX_ROWS = 512  # row counts a cost curve takes
DEFAULT_ROWS = tuple(range(1, 17)) + (24, 32)
# Fewer repeats than this cannot tell a kernel boundary (or a prediction) from one noisy forward.
MIN_REPEATS = 3


@dataclass(frozen=True)
class Point:
    rows: int
    median_ms: float
    min_ms: float
    max_ms: float
    boundary: str = ""  # "", "jump" or "drop": the step from the previous point, where repeats agree
    warm_ms: float | None = None  # median of the same forward repeated at one KV length
    first_ms: float | None = None  # the first forward of this many rows in this process
    # Median time to put the cache back after this forward, keeping ROLLBACK_KEPT(rows) of its
    # rows (engine.kvcache.Rollback): microseconds for a trim, the recurrent work where there is
    # state. None: not measured (one row: nothing to roll back).
    rollback_ms: float | None = None
    unresolved: str = ""  # "jump" or "drop": the medians step, but the repeats do not agree
    step: str = ""  # the step from the previous point, in words (repeats and how far apart)

    @property
    def cold_over_warm(self) -> float | None:
        return self.median_ms / self.warm_ms if self.warm_ms else None

    def to_dict(self) -> dict:
        return {"rows": self.rows, "median_ms": self.median_ms, "min_ms": self.min_ms,
                "max_ms": self.max_ms, "boundary": self.boundary, "warm_ms": self.warm_ms,
                "first_ms": self.first_ms, "rollback_ms": self.rollback_ms, "unresolved": self.unresolved,
                "step": self.step}


@dataclass(frozen=True)
class CostCurve:
    context: int
    repeats: int
    points: tuple[Point, ...] = field(default_factory=tuple)
    attention: str = "fused"  # the verify attention the forwards of 2+ rows used
    # engine.linear's summary (mode, routed and stock calls) when not stock; None for stock
    linear: dict | None = None
    rollback: str = "trim"  # how the cache was put back: trim, or the recurrent method
    cancelled: bool = False  # stopped between forwards: the passes finished in full are kept

    def ms(self, rows: int) -> float | None:
        for p in self.points:
            if p.rows == rows:
                return p.median_ms
        return None

    def rollback_ms(self, rows: int) -> float | None:
        for p in self.points:
            if p.rows == rows:
                return p.rollback_ms
        return None

    def boundaries(self) -> list[Point]:
        """Steps where every repeat agrees: kernel boundaries."""
        return [p for p in self.points if p.boundary]

    def unresolved(self) -> list[Point]:
        """Steps the medians show and the repeats do not: noise, or a boundary this n cannot tell."""
        return [p for p in self.points if p.unresolved]

    def boundary_lines(self) -> list[str]:
        """What the curve says about kernel boundaries, noise labelled as noise. A curve cancelled
        before its first repeat measured nothing, and says so instead of "no kernel boundary"."""
        if not self.points:
            return ["no repeat finished before the cancel: nothing measured, no kernel boundary judged"
                    if self.cancelled else "no row count measured"]
        out = []
        if self.boundaries():
            out.append("kernel boundaries: " + "; ".join(f"{p.boundary} at {p.rows} rows ({p.step})"
                                                         for p in self.boundaries()))
        if self.unresolved():
            n = f"{self.repeats} repeat" + ("" if self.repeats == 1 else "s")
            need = f"; {MIN_REPEATS} or more tell one" if self.repeats < MIN_REPEATS else ""
            out.append(f"not resolved at this n ({n} per row count{need}): "
                       + "; ".join(f"a {p.unresolved} at {p.rows} rows ({p.step})" for p in self.unresolved()))
        if not out and self.cancelled:
            n = f"{self.repeats} repeat" + ("" if self.repeats == 1 else "s")
            out.append(f"no kernel boundary in the {n} finished before the cancel (the rest unmeasured)")
        elif not out:
            out.append("no kernel boundary: time grows smoothly with rows")
        return out

    def to_dict(self) -> dict:
        out = {"context": self.context, "repeats": self.repeats, "attention": self.attention,
               "rollback": self.rollback, "rollback_kept": "ceil(rows / 2)",
               "points": [p.to_dict() for p in self.points], "cancelled": self.cancelled}
        if self.linear is not None:
            out["linear"] = self.linear
        return out


def context_ids(n: int) -> list[int]:
    """The synthetic context every verify-cost measurement (this curve, the H200 probes) runs
    against: ``n`` token ids cycling through 10..209, so no special token, the same in every tool."""
    return [(7 * i + 3) % 200 + 10 for i in range(n)]


def parse_rows(text: str) -> tuple[int, ...]:
    """``1-16``, ``1,2,4,8``, ``1-8,16,32`` -> sorted unique row counts >= 1; InputError (rows)."""
    shown = shorten(repr(text))
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:  # each bound within 1..512 before a range is built from it
                a, b = (parse_int(x, 1, MAX_ROWS, signed=False) for x in part.split("-", 1))
                if b < a:  # "5-2" named no row at all: say so, not the bounds
                    raise InputError(f"{shown}: the range {a}-{b} runs backwards; write it {b}-{a}", "rows")
                out.update(range(a, b + 1))
            elif part:
                out.add(parse_int(part, 1, MAX_ROWS, signed=False))
    except IntegerError as e:
        if e.out_of_range:
            raise InputError(f"{shown}: row counts must be 1..{MAX_ROWS}", "rows") from None
        raise InputError(f"{shown}: expected ASCII numbers and ranges like 1-16,24,32", "rows") from None
    if not out:
        raise InputError(f"{shown}: row counts must be 1..{MAX_ROWS}", "rows")
    return tuple(sorted(out))


def mark_boundaries(points: Sequence[Point], factor: float = 2.5, floor: float = 0.05,
                    repeats: int = MIN_REPEATS) -> tuple[Point, ...]:
    """Flag steps whose per-row increment is far from the typical one.

    A ``jump``: the increment per added row exceeds ``factor`` x the median
    increment and ``floor`` of the previous time. A ``drop``: the time falls by
    more than ``floor``. Either is a boundary only where the ``repeats`` agree: at least
    MIN_REPEATS of them, and the two row counts' ranges apart in the step's direction;
    otherwise it is kept as ``unresolved`` (noise, or a boundary this n cannot tell).
    """
    pts = list(points)
    if len(pts) < 3:
        return tuple(pts)
    incs = []
    for a, b in zip(pts, pts[1:]):
        incs.append((b.median_ms - a.median_ms) / (b.rows - a.rows))
    typical = statistics.median(abs(i) for i in incs) or 1e-9
    out = [pts[0]]
    for a, b, inc in zip(pts, pts[1:], incs):
        mark = ""
        if b.median_ms < a.median_ms * (1 - floor):
            mark = "drop"
        elif inc > factor * typical and (b.median_ms - a.median_ms) > floor * a.median_ms:
            mark = "jump"
        gap = (a.min_ms - b.max_ms) if mark == "drop" else (b.min_ms - a.max_ms)
        agree = bool(mark) and repeats >= MIN_REPEATS and gap > 0
        step = ""
        if mark:
            ranges = (f"{a.min_ms:.1f}-{a.max_ms:.1f} ms at {a.rows} rows against "
                      f"{b.min_ms:.1f}-{b.max_ms:.1f} at {b.rows}")
            step = (f"{repeats} repeats each, {ranges}: {gap:.1f} ms apart" if agree
                    else f"{ranges}: the repeats overlap" if gap <= 0
                    else f"{ranges}, from {repeats} repeat{'' if repeats == 1 else 's'}")
        out.append(dataclasses.replace(b, boundary=mark if agree else "", unresolved="" if agree else mark,
                                       step=step))
    return tuple(out)


def rollback_kept(rows: int) -> int:
    """The rows a cost curve's forward keeps when its rollback is timed: half of them (rounded up),
    the middle of what a round keeps (1 .. rows - 1 when a draft is rejected)."""
    return max(1, (rows + 1) // 2)


def positions(rows: Sequence[int], repeats: int, warmup: int = 2, warm: bool = True) -> int:
    """Positions a curve's forwards take past its context: each cold forward leaves one row, and
    the widest forward (and the warm repeats, put back each time) reach ``max(rows)`` beyond."""
    return (warmup + repeats) + max(rows, default=1)


def measure(model, rows: Sequence[int] = DEFAULT_ROWS, *, context: int = 128, repeats: int = 7,
            warmup: int = 2, attention=None, linear=None, warm: bool = True,
            rollback=None, on_progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None, prefill_step: int | None = None,
            exact=None) -> CostCurve:
    """Time one ``rows``-row forward after a ``context``-token prefix, and the rollback after it.

    Cold: in passes over every row count (``warmup`` discarded passes, then ``repeats``), each
    pass one KV length past the previous one, as decoding advances, so no row count ever meets
    a length twice and nothing keyed on (rows, length) is replayed; the very first forward of
    each row count is kept apart as ``first_ms``. Passes, not a row count's repeats back to
    back: a burst of other work on the host then lands on several row counts, not on all the
    repeats of one, where it read as a kernel boundary. Warm (``warm=True``): the same forward
    repeated at one length.
    Rollback: after each cold forward the cache keeps ``rollback_kept(rows)`` of its rows through
    the engine's rollback (``rollback``: engine.kvcache.Method for recurrent state), timed, then
    the KV rows are trimmed back to the pass's length (the pass's last forward keeps one, so the
    next pass is one longer).
    ``on_progress(forwards done, forwards in all)``; ``cancel`` is checked between forwards, and
    a cancelled curve keeps the passes it finished.
    ``prefill_step``: the prefix in forwards of at most that many tokens (None: one), untimed
    (lab/probe_qmv.py keeps a fresh CUDA host from JIT-compiling a kernel only a long prefill
    would use).
    ``exact`` (an active engine.exact plan): the prefix and every forward on the exact path
    (its verify attention and projections, not ``attention`` / ``linear``), the curve's mode
    ``exact``."""
    from blockwidth.engine import exact as exact_path
    from blockwidth.engine.kvcache import DEFAULT_METHOD, Rollback, _is_state, make_cache
    from blockwidth.engine.linear import prepare

    if context < 1:
        raise ValueError(f"context = {context}: must be at least 1")
    if repeats < 1:
        raise ValueError(f"repeats = {repeats}: must be at least 1")
    if prefill_step is not None and prefill_step < 1:
        raise ValueError(f"prefill step = {prefill_step}: must be at least 1")
    stop = cancel or (lambda: False)
    rows = list(rows)
    total = len(curve_forwards(rows, context, repeats, warmup, warm)) - 1
    done = 0
    on_path = exact is not None and exact.active
    if on_path:  # qmv's kernels compile before the first timed forward
        exact_path.prepare(exact, model)
    else:
        prepare(linear, model)
    cache = make_cache(model, slack=max(rows, default=1) + warmup + repeats + 1, off_step_buffers=on_path)
    rb = Rollback(model, cache, rollback or DEFAULT_METHOD)
    kv = [c for c in rb.leaves if not _is_state(c)]
    prefix = mx.array(context_ids(context), mx.uint32)
    step = prefill_step or context

    def shorten(n: int) -> None:  # KV rows only: recurrent state's size is what it costs
        for c in kv:
            c.trim(n)

    def tick() -> None:
        nonlocal done
        done += 1
        if on_progress:
            on_progress(done, total)

    # One projection block and one attention routing around the whole curve: their counts are its.
    with exact_path.path(exact, attention) as routed:
        return _measure_passes(model, rows, context, repeats, warmup, attention, linear, warm, rb, kv,
                               cache, prefix, step, stop, tick, routed, shorten)


def _measure_passes(model, rows, context, repeats, warmup, attention, linear, warm, rb, kv, cache,
                    prefix, step, stop, tick, routed, shorten) -> CostCurve:
    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.exact import OneRowSteps
    from blockwidth.engine.kvcache import mark, restore
    from blockwidth.engine.linear import VerifyLinear, verify_linear

    for i in range(0, context, step):
        mx.eval(model(prefix[None, i:i + step], cache=cache))
    xs = {k: mx.array([[(11 * j + 5) % 200 + 10 for j in range(k)]], mx.uint32) for k in rows}
    cold: dict[int, list[float]] = {k: [] for k in rows}
    hot: dict[int, list[float]] = {k: [] for k in rows}
    backs: dict[int, list[float]] = {k: [] for k in rows}
    first: dict[int, float] = {}
    passes = 0  # cold passes finished
    stopped = stop()
    # The 1-row point as exact classic runs its steps: once a 1-row forward on the path made only
    # MLX's own calls on off-step caches, the rest go without the dispatcher (engine.exact.undispatched)
    steps = OneRowSteps(routed, cache)

    def timed(k: int, x) -> float:
        with steps.forward(k):
            t0 = time.perf_counter()
            mx.eval(model(x, cache=cache))
            dt = (time.perf_counter() - t0) * 1e3
        if steps.bare:
            routed.summary_extra["one_row_undispatched"] = True
        return dt

    with (verify_linear(linear) if routed is None else _none()) as lrouting, \
            (verify_attention(attention) if routed is None else _none()) as routing:
        mode = routing.mode.value if routing is not None else "exact"
        for r in range(warmup + repeats):
            for i, k in enumerate(rows):
                if stop():  # between forwards: one pass of a large target on a CPU is minutes
                    stopped = True
                    break
                keep = rollback_kept(k)
                with rb.verify(xs[k][0]):
                    dt = timed(k, xs[k])
                back = rb.commit(keep) * 1e3
                shorten(keep - 1 if i == len(rows) - 1 else keep)
                first.setdefault(k, dt)
                if r >= warmup:
                    cold[k].append(dt)
                    if k > 1:
                        backs[k].append(back)
                tick()
            if stopped:
                break
            passes += 1
        if warm and not stopped:
            for k in rows:
                for r in range(1 + repeats):
                    if stop():
                        stopped = True
                        break
                    m = mark(rb.leaves)
                    dt = timed(k, xs[k])
                    restore(rb.leaves, m)  # back to the same length
                    if r >= 1:
                        hot[k].append(dt)
                    tick()
                if stopped:
                    break
    kept = max(passes - warmup, 0)  # the cold repeats every row count has
    points = [Point(k, statistics.median(cold[k][:kept]), min(cold[k][:kept]), max(cold[k][:kept]),
                    warm_ms=statistics.median(hot[k]) if len(hot[k]) == repeats else None,
                    first_ms=first.get(k),
                    rollback_ms=statistics.median(backs[k][:kept]) if backs[k] else None)
              for k in rows] if kept else []
    if routed is not None:
        lsum = routed.summary()
    else:
        lsum = None if lrouting.mode is VerifyLinear.STOCK else lrouting.summary()
    how = rb.effective.value if rb.effective else "trim"
    return CostCurve(context, kept if stopped else repeats, mark_boundaries(points, repeats=kept), mode, lsum,
                     how, cancelled=stopped)


@contextmanager
def _none():
    yield None


def forward_seconds(model, rows: int = 1) -> float:
    """Seconds one ``rows``-row forward of ``model`` takes here, from a fresh cache: what the
    front ends scale to say, before a long measurement starts, how long its forwards (and, with
    ``rows`` > 1, its prefills) will be."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    x = mx.array([[11] * rows], mx.uint32)
    if rows == 1:
        mx.eval(model(x, cache=cache))  # the first pays for kernels and allocation
        cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    mx.eval(model(x, cache=cache))
    return time.perf_counter() - t0


def curve_forwards(rows: Sequence[int], context: int, repeats: int, warmup: int = 2,
                   warm: bool = True) -> list[int]:
    """The rows of every forward ``measure`` runs, in order (the prefix first)."""
    out = [context]
    for k in rows:
        out += [k] * (warmup + repeats + ((1 + repeats) if warm else 0))
    return out


# One home for the model of a round (policy.auto, which the auto width decides with): the same
# E(K) and drafting model predict a sweep's best width here.
from blockwidth.policy.auto import DraftCost, draft_cost, expected_tokens  # noqa: E402,F401 (re-exported)


@dataclass(frozen=True)
class Prediction:
    width: int
    speedup: float  # over classic
    tokens_per_round: float  # E(K)
    draft_ms: float  # drafting one round at this width, by the kind's cost model
    verify_ms: float  # one K-row verify forward, from the cost curve
    rollback_ms: float = 0.0  # putting the cache back, per round (measured; 0 for a trim)
    # The speed-up with the curve's repeats at their extremes (slowest K-row verify against the
    # fastest 1-row step, and the other way round): how far the repeats let it move.
    low: float | None = None
    high: float | None = None
    # The round's own overhead: host work after the verify (tokens to Python, acceptance, the
    # drafter's bookkeeping), per round, measured in the session's decoding (0: not measured).
    overhead_ms: float = 0.0
    # What a token costs classic: its measured decode step where the session has one (a pipelined
    # step costs less than the curve's lone 1-row forward on a host-bound target), else the curve's.
    step_ms: float | None = None
    # The share of rounds whose drafter proposed nothing (a lookup with no match in the text):
    # such a round is a 1-row step that emits one token, so it dilutes E(K) and the round's cost.
    declined: float = 0.0
    declined_ms: float | None = None  # what such a round took in the session (None: a step's cost)

    def describe(self) -> str:
        back = f" + rollback {self.rollback_ms:.2f}" if self.rollback_ms >= 0.005 else ""
        back += f" + round overhead {self.overhead_ms:.2f}" if self.overhead_ms >= 0.005 else ""
        spread = f", {self.low:.2f}-{self.high:.2f}x over the curve's repeats" if self.low is not None else ""
        terms = f"draft {self.draft_ms:.2f} + verify {self.verify_ms:.2f}{back} ms"
        if self.declined >= 0.005:  # the tokens are every round's; the terms a drafting round's
            each = f"{self.declined_ms:.2f} ms" if self.declined_ms else "a step"
            return (f"w{self.width} {self.speedup:.2f}x{spread} ({self.tokens_per_round:.2f} tok/round; "
                    f"a drafting round {terms}; {self.declined:.0%} of rounds drafted nothing, {each} each)")
        return f"w{self.width} {self.speedup:.2f}x{spread} ({self.tokens_per_round:.2f} tok/round over {terms})"

    def to_dict(self) -> dict:
        return {"width": self.width, "speedup": round(self.speedup, 4),
                "tokens_per_round": round(self.tokens_per_round, 4),
                "draft_ms": round(self.draft_ms, 4), "verify_ms": round(self.verify_ms, 4),
                "rollback_ms": round(self.rollback_ms, 4), "overhead_ms": round(self.overhead_ms, 4),
                "step_ms": None if self.step_ms is None else round(self.step_ms, 4),
                "declined": round(self.declined, 4),
                "declined_ms": None if self.declined_ms is None else round(self.declined_ms, 4),
                "low": None if self.low is None else round(self.low, 4),
                "high": None if self.high is None else round(self.high, 4)}


def rollback_per_round(curve: CostCurve, acceptance: float, width: int) -> float:
    """The curve's rollback at ``width`` rows, weighted by how often a round rolls back: a round
    rejects some draft with probability 1 - a^(K-1) (all accepted: nothing to put back)."""
    back = curve.rollback_ms(width) or 0.0
    a = min(max(acceptance, 0.0), 1.0)
    return back * (1 - a ** (width - 1))


def predict_terms(curve: CostCurve, acceptance: float, draft_ms: float, widths: Sequence[int],
                  model: DraftCost = DraftCost.LINEAR,
                  rollback_ms: dict[int, float] | None = None,
                  overhead_ms: dict[int, float] | None = None,
                  step_ms: float | None = None,
                  declined: dict[int, float] | None = None,
                  declined_ms: dict[int, float] | None = None) -> dict[int, Prediction]:
    """Per width: E(K) / (draft(K) + verify(K) + rollback(K) + overhead(K)) against one classic
    step, each term kept. ``draft_ms`` is per drafted token for a LINEAR drafter and per round
    for a FLAT one; ``rollback_ms`` per round by width where measured in decoding (a session's
    arms), else the curve's rollback weighted by how often a round rolls back; ``overhead_ms``
    the round's host work after its verify, per width where measured; ``step_ms`` classic's
    measured step (else the curve's 1-row forward: the repeats' spread is the curve's then).
    ``declined``: per width, the share q of rounds that drafted nothing (measured); such a round
    is one 1-row step for one token, so a width makes (1 - q) E(K) + q tokens in
    (1 - q) round + q step: a lookup that finds no match half the time halves what it can win.
    ``declined_ms``: what such a round measured in decoding, per width, in place of the step (it
    waits for its token, where classic's steps overlap the next one's host work: on the H100 a
    median 3.22 ms against classic's 2.91)."""
    by_rows = {p.rows: p for p in curve.points}
    one = by_rows.get(1)
    out: dict[int, Prediction] = {}
    if not one or not one.median_ms:
        return out
    for k in widths:
        p = by_rows.get(k)
        if p is None:
            continue
        d = draft_ms if model is DraftCost.FLAT else (k - 1) * draft_ms
        e = expected_tokens(acceptance, k)
        b = (rollback_ms or {}).get(k)
        b = rollback_per_round(curve, acceptance, k) if b is None else b
        o = (overhead_ms or {}).get(k) or 0.0
        s_med, s_min, s_max = (step_ms, step_ms, step_ms) if step_ms else (one.median_ms, one.min_ms, one.max_ms)
        q = min(max((declined or {}).get(k) or 0.0, 0.0), 1.0)
        t = (1 - q) * e + q

        undrafted = (declined_ms or {}).get(k)

        def ratio(verify: float, step: float) -> float:
            return t * step / ((1 - q) * (d + verify + b + o) + q * (undrafted or step))

        out[k] = Prediction(k, ratio(p.median_ms, s_med), t, d, p.median_ms, b,
                            ratio(p.max_ms, s_min), ratio(p.min_ms, s_max),
                            overhead_ms=o, step_ms=step_ms, declined=q, declined_ms=undrafted if q else None)
    return out


def best_words(best: int | None, ratio: float | None, note: str | None = None) -> str:
    """What the prediction calls its best width (``ratio``: its predicted speed-up; ``note``:
    best_resolved's words, said instead where given): where even the best is predicted slower
    than classic, that no width is (a tryout read "best width 2" beside w2 0.85x as advice)."""
    if best is not None and ratio is not None and ratio < 1:
        return f"no width predicted faster than classic (the closest: w{best}, {ratio:.2f}x)"
    return note or f"best width {best}"


PREDICTION_LABEL = "model prediction"  # the console sets it in bold


def prediction_words(best: int | None, predicted: dict[int, float] | None, note: str | None = None,
                     per_width: bool = False) -> str:
    """The prediction's line as the CLI, the console and the record's Markdown say it: labelled
    as a model, then its best width (best_words, from ``predicted``: each width's predicted
    speed-up; ``note``: best_resolved's words) and, with ``per_width``, each width's figure."""
    predicted = predicted or {}
    words = f"{PREDICTION_LABEL} (cost curve x acceptance, not a measurement): {best_words(best, predicted.get(best), note)}"
    if per_width and predicted:
        words += "  [" + ", ".join(f"w{k} {v:.2f}x" for k, v in sorted(predicted.items())) + "]"
    return words


def best_resolved(predictions: dict[int, Prediction], repeats: int) -> tuple[int | None, str]:
    """The predicted best width where the curve's repeats agree on it, and what to say: it is
    resolved when its lowest speed-up over the repeats clears every other width's highest,
    from at least MIN_REPEATS repeats; otherwise "not resolved at this n", and how far the
    repeats let the leading widths move."""
    if not predictions:
        return None, ""
    ranked = sorted(predictions.values(), key=lambda p: p.speedup, reverse=True)
    best = ranked[0]
    n = f"{repeats} repeat" + ("" if repeats == 1 else "s")
    if repeats < MIN_REPEATS:
        return None, f"best width not resolved at this n ({n} per row count; {MIN_REPEATS} or more tell it)"
    rival = next((p for p in ranked[1:] if p.high is not None and best.low is not None
                  and p.high >= best.low), None)
    if rival is not None:
        return None, (f"best width not resolved at this n ({n} per row count): w{best.width} "
                      f"{best.low:.2f}-{best.high:.2f}x and w{rival.width} {rival.low:.2f}-{rival.high:.2f}x "
                      f"overlap")
    lead = (f"; {best.low:.2f}x at worst against {ranked[1].high:.2f}x at best for w{ranked[1].width}"
            if len(ranked) > 1 else "")
    return best.width, f"best width {best.width} ({n} per row count agree{lead})"
