"""Verify-forward time against rows, cold and warm, and the steps where the increment jumps.

Each timed forward runs at a KV length this row count has never met (cold), as
every verify round in decoding does; beside it, the same forward repeated at
one length (warm). Where the backend caches work by shape (MLX's cuDNN
attention plans on CUDA) the two differ, and only the cold figure is what a
new request pays.

A jump (or a drop) marks a kernel boundary: on an H200 a 4-bit target goes
from the per-row quantized matvec to the quantized matmul at 8 rows, and the
time per forward falls from 34.5 ms at 7 rows to 16.4 at 8.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Sequence

import mlx.core as mx

from policy.errors import InputError
from policy.integers import IntegerError, parse_int, shorten

MAX_ROWS = 512  # row counts a cost curve takes
DEFAULT_ROWS = tuple(range(1, 17)) + (24, 32)


@dataclass(frozen=True)
class Point:
    rows: int
    median_ms: float
    min_ms: float
    max_ms: float
    boundary: str = ""  # "", "jump" or "drop": the step from the previous point
    warm_ms: float | None = None  # median of the same forward repeated at one KV length
    first_ms: float | None = None  # the first forward of this many rows in this process
    # Median time to put the cache back after this forward, keeping ROLLBACK_KEPT(rows) of its
    # rows (engine.kvcache.Rollback): microseconds for a trim, the recurrent work where there is
    # state. None: not measured (one row: nothing to roll back).
    rollback_ms: float | None = None

    @property
    def cold_over_warm(self) -> float | None:
        return self.median_ms / self.warm_ms if self.warm_ms else None

    def to_dict(self) -> dict:
        return {"rows": self.rows, "median_ms": self.median_ms, "min_ms": self.min_ms,
                "max_ms": self.max_ms, "boundary": self.boundary, "warm_ms": self.warm_ms,
                "first_ms": self.first_ms, "rollback_ms": self.rollback_ms}


@dataclass(frozen=True)
class CostCurve:
    context: int
    repeats: int
    points: tuple[Point, ...] = field(default_factory=tuple)
    attention: str = "fused"  # the verify attention the forwards of 2+ rows used
    # engine.linear's summary (mode, routed and stock calls) when not stock; None for stock
    linear: dict | None = None
    rollback: str = "trim"  # how the cache was put back: trim, or the recurrent method

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
        return [p for p in self.points if p.boundary]

    def to_dict(self) -> dict:
        out = {"context": self.context, "repeats": self.repeats, "attention": self.attention,
               "rollback": self.rollback, "rollback_kept": "ceil(rows / 2)",
               "points": [p.to_dict() for p in self.points]}
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


def mark_boundaries(points: Sequence[Point], factor: float = 2.5, floor: float = 0.05) -> tuple[Point, ...]:
    """Flag steps whose per-row increment is far from the typical one.

    A ``jump``: the increment per added row exceeds ``factor`` x the median
    increment and ``floor`` of the previous time. A ``drop``: the time falls by
    more than ``floor``.
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
        out.append(dataclasses.replace(b, boundary=mark))
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
            cancel: Callable[[], bool] | None = None, prefill_step: int | None = None) -> CostCurve:
    """Time one ``rows``-row forward after a ``context``-token prefix, and the rollback after it.

    Cold: every forward at a KV length one past the previous one (as decoding
    advances), so nothing keyed on the length is ever replayed; the first
    ``warmup`` are dropped (the very first is kept apart as ``first_ms``).
    Warm (``warm=True``): the same forward repeated at one length.
    Rollback: after each cold forward the cache keeps ``rollback_kept(rows)`` of its rows through
    the engine's rollback (``rollback``: engine.kvcache.Method for recurrent state), timed, then
    the rows past the first are trimmed so the next forward is one longer.
    ``prefill_step``: the prefix in forwards of at most that many tokens (None: one), untimed
    (lab/probe_qmv.py keeps a fresh CUDA host from JIT-compiling a kernel only a long prefill
    would use)."""
    from engine.attention import verify_attention
    from engine.kvcache import DEFAULT_METHOD, Rollback, _is_state, make_cache, mark, restore
    from engine.linear import VerifyLinear, prepare, verify_linear

    if context < 1:
        raise ValueError(f"context = {context}: must be at least 1")
    if repeats < 1:
        raise ValueError(f"repeats = {repeats}: must be at least 1")
    if prefill_step is not None and prefill_step < 1:
        raise ValueError(f"prefill step = {prefill_step}: must be at least 1")
    prepare(linear, model)  # qmv's kernels compile before the first timed forward
    cache = make_cache(model, slack=max(rows, default=1) + warmup + repeats + 1)
    rb = Rollback(model, cache, rollback or DEFAULT_METHOD)
    kv = [c for c in rb.leaves if not _is_state(c)]
    prefix = mx.array(context_ids(context), mx.uint32)
    step = prefill_step or context
    for i in range(0, context, step):
        mx.eval(model(prefix[None, i:i + step], cache=cache))
    points = []
    mode = "fused"

    def shorten(n: int) -> None:  # KV rows only: recurrent state's size is what it costs
        for c in kv:
            c.trim(n)

    # One projection block around every row count: its counts are the whole curve's.
    with verify_linear(linear) as lrouting:
        for i, k in enumerate(rows):
            x = mx.array([[(11 * j + 5) % 200 + 10 for j in range(k)]], mx.uint32)
            cold, hot, backs, first = [], [], [], None
            keep = rollback_kept(k)
            with verify_attention(attention) as routing:
                mode = routing.mode.value
                for r in range(warmup + repeats):
                    with rb.verify(x[0]):
                        t0 = time.perf_counter()
                        mx.eval(model(x, cache=cache))
                        dt = (time.perf_counter() - t0) * 1e3
                    back = rb.commit(keep) * 1e3
                    shorten(keep - 1)  # keep one row: the next forward is one longer
                    if r == 0:
                        first = dt
                    if r >= warmup:
                        cold.append(dt)
                        if k > 1:
                            backs.append(back)
                if warm:
                    for r in range(1 + repeats):
                        m = mark(rb.leaves)
                        t0 = time.perf_counter()
                        mx.eval(model(x, cache=cache))
                        dt = (time.perf_counter() - t0) * 1e3
                        restore(rb.leaves, m)  # back to the same length
                        if r >= 1:
                            hot.append(dt)
            shorten(warmup + repeats)  # every row count starts at ``context``
            points.append(Point(k, statistics.median(cold), min(cold), max(cold),
                                warm_ms=statistics.median(hot) if hot else None, first_ms=first,
                                rollback_ms=statistics.median(backs) if backs else None))
            if on_progress:
                on_progress(i + 1, len(rows))
            if cancel and cancel():
                break
    lsum = None if lrouting.mode is VerifyLinear.STOCK else lrouting.summary()
    how = rb.effective.value if rb.effective else "trim"
    return CostCurve(context, repeats, mark_boundaries(points), mode, lsum, how)


def expected_tokens(acceptance: float, width: int) -> float:
    """Tokens emitted per round at per-token acceptance ``a``: (1 - a^K) / (1 - a)."""
    a = min(max(acceptance, 0.0), 1.0)
    if a >= 1.0:
        return float(width)
    return (1 - a ** width) / (1 - a)


class DraftCost(str, Enum):
    """How a drafter's time per round grows with the width."""

    FLAT = "flat"  # one drafter forward proposes the whole block (DFlash): same cost at any width
    LINEAR = "linear"  # one forward per drafted token (a draft model, chained MTP heads, lookup)


def draft_cost(kind: str) -> DraftCost:
    return DraftCost.FLAT if kind == "dflash" else DraftCost.LINEAR


@dataclass(frozen=True)
class Prediction:
    width: int
    speedup: float  # over classic
    tokens_per_round: float  # E(K)
    draft_ms: float  # drafting one round at this width, by the kind's cost model
    verify_ms: float  # one K-row verify forward, from the cost curve
    rollback_ms: float = 0.0  # putting the cache back, per round (measured; 0 for a trim)

    def describe(self) -> str:
        back = f" + rollback {self.rollback_ms:.2f}" if self.rollback_ms >= 0.005 else ""
        return (f"w{self.width} {self.speedup:.2f}x ({self.tokens_per_round:.2f} tok/round over "
                f"draft {self.draft_ms:.2f} + verify {self.verify_ms:.2f}{back} ms)")

    def to_dict(self) -> dict:
        return {"width": self.width, "speedup": round(self.speedup, 4),
                "tokens_per_round": round(self.tokens_per_round, 4),
                "draft_ms": round(self.draft_ms, 4), "verify_ms": round(self.verify_ms, 4),
                "rollback_ms": round(self.rollback_ms, 4)}


def rollback_per_round(curve: CostCurve, acceptance: float, width: int) -> float:
    """The curve's rollback at ``width`` rows, weighted by how often a round rolls back: a round
    rejects some draft with probability 1 - a^(K-1) (all accepted: nothing to put back)."""
    back = curve.rollback_ms(width) or 0.0
    a = min(max(acceptance, 0.0), 1.0)
    return back * (1 - a ** (width - 1))


def predict_terms(curve: CostCurve, acceptance: float, draft_ms: float, widths: Sequence[int],
                  model: DraftCost = DraftCost.LINEAR,
                  rollback_ms: dict[int, float] | None = None) -> dict[int, Prediction]:
    """Per width: E(K) / (draft(K) + verify(K) + rollback(K)) against 1 / verify(1), each term
    kept. ``draft_ms`` is per drafted token for a LINEAR drafter and per round for a FLAT one;
    ``rollback_ms`` per round by width where measured in decoding (a session's arms), else the
    curve's rollback weighted by how often a round rolls back."""
    one = curve.ms(1)
    out: dict[int, Prediction] = {}
    if not one:
        return out
    for k in widths:
        v = curve.ms(k)
        if v is None:
            continue
        d = draft_ms if model is DraftCost.FLAT else (k - 1) * draft_ms
        e = expected_tokens(acceptance, k)
        b = (rollback_ms or {}).get(k)
        b = rollback_per_round(curve, acceptance, k) if b is None else b
        out[k] = Prediction(k, e / (d + v + b) * one, e, d, v, b)
    return out
