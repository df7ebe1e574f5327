"""The projections of verify forwards: a way round cuBLAS's per-call host cost on CUDA.

On CUDA, MLX sends a 16-bit ``x @ W.T`` of one row to its own gemv kernel (one
graph node), but 2+ rows to cuBLASLt: each call builds a matmul descriptor and
three layouts, asks cuBLAS's heuristic for an algorithm (nothing is cached
between calls) and captures the matmul into a child graph. A 1B target's
verify makes ~150 such calls; on the H200 one call (evaluated alone) cost 8-20 µs
more than the 1-row gemv (engine/demo/evidence/h200-2026-11-29b/probe.json,
``linear_micro``): 1.2-3 ms a verify, a large part of the ~4-5 ms by which a
verify of 2-16 rows exceeded a decode step in the decode loop (README, "On the H200").

``gather`` routes the projections of a verify-shaped input (2..64 rows) through
``mx.gather_mm`` with every row on the one weight and the indices *not* marked
sorted: on CUDA that is MLX's ``gather_mv`` kernel, one graph node that reads the
weight once per row (from L2 for all but the first) and never calls cuBLAS. (Marked
sorted, the same call takes a CUTLASS grouped GEMM, which the probe measured at
0.2 ms a call.) Quantized layers are not touched: their kernels are MLX's own.

- ``stock``: MLX's matmul, as decoding without this module;
- ``gather``: the route above, only inside :func:`verify_linear` and only in the
  thread that entered it; 1-row steps and prefill keep the stock matmul;
- ``auto``: ``stock`` everywhere, until the H200 has measured ``gather``
  (engine/demo/probe_gpu.py and probe_loop.py time both).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from enum import Enum
from typing import Iterator

import mlx.core as mx
import mlx.nn as nn

from engine.attention import current_backend, parse_mode

MIN_ROWS = 2
MAX_ROWS = 64


class VerifyLinear(str, Enum):
    AUTO = "auto"
    STOCK = "stock"
    GATHER = "gather"


CHOICES = tuple(m.value for m in VerifyLinear)


def parse(value: str | VerifyLinear | None) -> VerifyLinear:
    """The mode named by ``value``; a ValueError names the choices."""
    return parse_mode(VerifyLinear, value, "verify linear")


def effective(mode: str | VerifyLinear | None) -> VerifyLinear:
    mode = parse(mode)
    return VerifyLinear.STOCK if mode is VerifyLinear.AUTO else mode


@dataclass
class LinearRouting:
    mode: VerifyLinear
    # Weight dtypes gather_mm takes here: CUDA's gather_mv any float; the CPU's float32 only.
    dtypes: tuple = (mx.float32,)
    routed: int = 0  # verify-shaped projections sent to gather_mv
    passed: int = 0  # projections a gather block left to the stock matmul (stock: not counted)

    def summary(self) -> dict:
        return {"mode": self.mode.value, "routed_calls": self.routed, "stock_calls": self.passed}


_active: ContextVar[LinearRouting | None] = ContextVar("blockwidth_verify_linear", default=None)
_install_lock = threading.Lock()
_stock_call = None  # the stock nn.Linear.__call__


_indices: dict[int, tuple[mx.array, mx.array]] = {}


def _index_arrays(rows: int) -> tuple[mx.array, mx.array]:
    """(row i -> input i, every row -> weight 0), built and evaluated once per row count: made
    per call they would add two kernels to every projection the route exists to keep at one."""
    got = _indices.get(rows)
    if got is None:
        got = (mx.arange(rows, dtype=mx.uint32), mx.zeros((rows,), mx.uint32))
        mx.eval(got)
        _indices[rows] = got
    return got


def gather_linear(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """``x @ weight.T (+ bias)`` with every row of ``x`` as its own 1-row product on the one
    weight (``mx.gather_mm``, indices unsorted): the same arithmetic per row as a gemv."""
    d = x.shape[-1]
    rows = x.size // d
    flat = x.reshape(rows, 1, d)
    lhs, rhs = _index_arrays(rows)
    out = mx.gather_mm(flat, weight.swapaxes(-1, -2)[None], lhs_indices=lhs, rhs_indices=rhs,
                       sorted_indices=False)
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out + bias if bias is not None else out


def _dispatch(self, x):
    routing = _active.get()
    if routing is None or routing.mode is not VerifyLinear.GATHER or type(self) is not nn.Linear:
        return _stock_call(self, x)
    rows = x.size // x.shape[-1] if x.ndim else 0
    w = self["weight"]
    if not (MIN_ROWS <= rows <= MAX_ROWS) or w.dtype not in routing.dtypes:
        routing.passed += 1
        return _stock_call(self, x)
    routing.routed += 1
    return gather_linear(x, w, self["bias"] if "bias" in self else None)


_holders = 0  # gather blocks open in any thread: the dispatcher is in place only while > 0


def install() -> None:
    """Put the dispatcher in front of ``nn.Linear.__call__``. It is there only while a
    ``gather`` block is open: every other forward keeps the stock method, with no added
    Python call per projection."""
    global _stock_call, _holders
    with _install_lock:
        _holders += 1
        # Re-checked every time: a probe that swaps nn.Linear.__call__ and restores what it
        # found must not leave this module routing nothing.
        if nn.Linear.__call__ is not _dispatch:
            _stock_call = nn.Linear.__call__
            nn.Linear.__call__ = _dispatch


def uninstall() -> None:
    global _holders
    with _install_lock:
        _holders = max(_holders - 1, 0)
        if _holders == 0 and nn.Linear.__call__ is _dispatch:
            nn.Linear.__call__ = _stock_call


@contextmanager
def verify_linear(mode: str | VerifyLinear | None) -> Iterator[LinearRouting]:
    """Inside this block (this thread only), verify-shaped projections use ``mode``."""
    routing = LinearRouting(effective(mode))
    gather = routing.mode is VerifyLinear.GATHER
    if gather:
        cuda = current_backend() == "cuda"
        routing.dtypes = (mx.bfloat16, mx.float16, mx.float32) if cuda else (mx.float32,)
        install()
    token = _active.set(routing)
    try:
        yield routing
    finally:
        _active.reset(token)
        if gather:
            uninstall()
