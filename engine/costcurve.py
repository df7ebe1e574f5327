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

import statistics
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Sequence

import mlx.core as mx

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

    @property
    def cold_over_warm(self) -> float | None:
        return self.median_ms / self.warm_ms if self.warm_ms else None

    def to_dict(self) -> dict:
        return {"rows": self.rows, "median_ms": self.median_ms, "min_ms": self.min_ms,
                "max_ms": self.max_ms, "boundary": self.boundary, "warm_ms": self.warm_ms,
                "first_ms": self.first_ms}


@dataclass(frozen=True)
class CostCurve:
    context: int
    repeats: int
    points: tuple[Point, ...] = field(default_factory=tuple)
    attention: str = "fused"  # the verify attention the forwards of 2+ rows used
    # engine.linear's summary (mode, routed and stock calls) when not stock; None for stock
    linear: dict | None = None

    def ms(self, rows: int) -> float | None:
        for p in self.points:
            if p.rows == rows:
                return p.median_ms
        return None

    def boundaries(self) -> list[Point]:
        return [p for p in self.points if p.boundary]

    def to_dict(self) -> dict:
        out = {"context": self.context, "repeats": self.repeats, "attention": self.attention,
               "points": [p.to_dict() for p in self.points]}
        if self.linear is not None:
            out["linear"] = self.linear
        return out


def context_ids(n: int) -> list[int]:
    """The synthetic context every verify-cost measurement (this curve, the H200 probes) runs
    against: ``n`` token ids cycling through 10..209, so no special token, the same in every tool."""
    return [(7 * i + 3) % 200 + 10 for i in range(n)]


def parse_rows(text: str) -> tuple[int, ...]:
    """``1-16``, ``1,2,4,8``, ``1-8,16,32`` -> sorted unique row counts >= 1."""
    out: set[int] = set()
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                a, b = (int(x) for x in part.split("-", 1))
                out.update(range(a, b + 1))
            elif part:
                out.add(int(part))
    except ValueError:
        raise ValueError(f"--rows {text!r}: expected numbers and ranges like 1-16,24,32") from None
    if not out or min(out) < 1 or max(out) > 512:
        raise ValueError(f"--rows {text!r}: row counts must be 1..512")
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
        out.append(Point(b.rows, b.median_ms, b.min_ms, b.max_ms, mark, b.warm_ms, b.first_ms))
    return tuple(out)


def measure(model, rows: Sequence[int] = DEFAULT_ROWS, *, context: int = 128, repeats: int = 7,
            warmup: int = 2, attention=None, linear=None, warm: bool = True,
            on_progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None, prefill_step: int | None = None) -> CostCurve:
    """Time one ``rows``-row forward after a ``context``-token prefix.

    Cold: every forward at a KV length one past the previous one (as decoding
    advances), so nothing keyed on the length is ever replayed; the first
    ``warmup`` are dropped (the very first is kept apart as ``first_ms``).
    Warm (``warm=True``): the same forward repeated at one length.
    ``prefill_step``: the prefix in forwards of at most that many tokens (None: one), untimed
    (lab/probe_qmv.py keeps a fresh CUDA host from JIT-compiling a kernel only a long prefill
    would use)."""
    from mlx_lm.models.cache import make_prompt_cache

    from engine.attention import verify_attention
    from engine.kvcache import rewind as trim_prompt_cache
    from engine.linear import VerifyLinear, prepare, verify_linear

    if context < 1:
        raise ValueError(f"context = {context}: must be at least 1")
    if repeats < 1:
        raise ValueError(f"repeats = {repeats}: must be at least 1")
    if prefill_step is not None and prefill_step < 1:
        raise ValueError(f"prefill step = {prefill_step}: must be at least 1")
    prepare(linear, model)  # qmv's kernels compile before the first timed forward
    cache = make_prompt_cache(model)
    prefix = mx.array(context_ids(context), mx.uint32)
    step = prefill_step or context
    for i in range(0, context, step):
        mx.eval(model(prefix[None, i:i + step], cache=cache))
    points = []
    mode = "fused"
    # One projection block around every row count: its counts are the whole curve's.
    with verify_linear(linear) as lrouting:
        for i, k in enumerate(rows):
            x = mx.array([[(11 * j + 5) % 200 + 10 for j in range(k)]], mx.uint32)
            cold, hot, first = [], [], None
            with verify_attention(attention) as routing:
                mode = routing.mode.value
                for r in range(warmup + repeats):
                    t0 = time.perf_counter()
                    mx.eval(model(x, cache=cache))
                    dt = (time.perf_counter() - t0) * 1e3
                    trim_prompt_cache(cache, k - 1)  # keep one token: the next forward is one longer
                    if r == 0:
                        first = dt
                    if r >= warmup:
                        cold.append(dt)
                if warm:
                    for r in range(1 + repeats):
                        t0 = time.perf_counter()
                        mx.eval(model(x, cache=cache))
                        dt = (time.perf_counter() - t0) * 1e3
                        trim_prompt_cache(cache, k)  # back to the same length
                        if r >= 1:
                            hot.append(dt)
            trim_prompt_cache(cache, warmup + repeats)  # every row count starts at ``context``
            points.append(Point(k, statistics.median(cold), min(cold), max(cold),
                                warm_ms=statistics.median(hot) if hot else None, first_ms=first))
            if on_progress:
                on_progress(i + 1, len(rows))
            if cancel and cancel():
                break
    lsum = None if lrouting.mode is VerifyLinear.STOCK else lrouting.summary()
    return CostCurve(context, repeats, mark_boundaries(points), mode, lsum)


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

    def describe(self) -> str:
        return (f"w{self.width} {self.speedup:.2f}x ({self.tokens_per_round:.2f} tok/round over "
                f"draft {self.draft_ms:.2f} + verify {self.verify_ms:.2f} ms)")

    def to_dict(self) -> dict:
        return {"width": self.width, "speedup": round(self.speedup, 4),
                "tokens_per_round": round(self.tokens_per_round, 4),
                "draft_ms": round(self.draft_ms, 4), "verify_ms": round(self.verify_ms, 4)}


def predict_terms(curve: CostCurve, acceptance: float, draft_ms: float, widths: Sequence[int],
                  model: DraftCost = DraftCost.LINEAR) -> dict[int, Prediction]:
    """Per width: E(K) / (draft(K) + verify(K)) against 1 / verify(1), with both terms kept.
    ``draft_ms`` is per drafted token for a LINEAR drafter and per round for a FLAT one."""
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
        out[k] = Prediction(k, e / (d + v) * one, e, d, v)
    return out
