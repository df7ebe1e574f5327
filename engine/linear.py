"""The projections of verify forwards: a way round cuBLAS's per-call host cost on CUDA.

On CUDA, MLX sends a 16-bit ``x @ W.T`` of one row to its own gemv kernel (one
graph node), but 2+ rows to cuBLASLt: each call builds a matmul descriptor and
three layouts, asks cuBLAS's heuristic for an algorithm (nothing is cached
between calls) and captures the matmul into a child graph. A 1B target's
verify makes ~150 such calls; on the H200 one call (evaluated alone) cost 8-20 µs
more than the 1-row gemv (lab/evidence/h200-2026-11-29b/probe.json,
``linear_micro``): 1.2-3 ms a verify, a large part of the ~4-5 ms by which a
verify of 2-16 rows exceeded a decode step in the decode loop (docs/verify-attention.md).

``gather`` routes the projections of a verify-shaped input (2..64 rows) through
``mx.gather_mm`` with every row on the one weight and the indices *not* marked
sorted: on CUDA that is MLX's ``gather_mv`` kernel, one graph node that reads the
weight once per row (from L2 for all but the first) and never calls cuBLAS. (Marked
sorted, the same call takes a CUTLASS grouped GEMM, which the probe measured at
0.2 ms a call.) Quantized layers are not touched: their kernels are MLX's own.

- ``stock``: MLX's matmul, as decoding without this module;
- ``gather``: the route above, only inside :func:`verify_linear` and only in the
  thread that entered it; 1-row steps and prefill keep the stock matmul;
- ``gemv``: on CUDA, 2..8-row 16-bit projections through this module's own kernel
  (``mx.fast.cuda_kernel``): one warp per output feature reads its weight row once
  and multiplies it with every row of the input, so a K-row projection reads the
  weights once, as the 1-row gemv does. lab/probe_parts.py measured on the
  H200 that the projections are what doubles from 1 row to 2 (22 layers: 1.4 ms at
  1 row, 3.0 ms at 2, stock or ``gather``, whose gemv_gather reads the weights once
  per row); elsewhere (a CPU, quantized or float32 weights, 9+ rows, an input width that is
  not a multiple of 8 or not the weight's: :func:`gemv_fits`) stock;
- ``qmv``: on CUDA, 2..8-row affine-quantized projections (4- and 8-bit, groups 32 / 64 /
  128, bfloat16 or float16 activations; ``nn.QuantizedLinear``) through engine/qmv.py's kernel,
  which reads the quantized weights once for all rows where MLX's CUDA ``qmv`` reads them once
  per row. 1 row, 9+ rows, 16-bit weights and the floating-point modes (mxfp4, nvfp4, mxfp8)
  stay stock, each counted under its reason; on Metal (MLX has its own multi-row kernel there)
  and on a CPU nothing is routed;
- ``auto``: ``stock`` for 16-bit projections, until the H200 has measured the others in the
  decode loop (lab/probe_loop.py times them beside stock); for affine-quantized ones, ``qmv``
  at the (bits, group, rows) where a committed measurement (:data:`QMV_WINS`, each entry
  naming its record) had the kernel's verify forward faster than stock's by :data:`MARGIN`
  in every pass measured (:func:`rows_won`), on a device of the compute capability it was
  measured on; with no such record ``auto`` is stock.
"""

from __future__ import annotations

import functools
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn

from blockwidth.engine import qmv
from blockwidth.engine.attention import current_backend, parse_mode

MIN_ROWS = 2
MAX_ROWS = 64


class VerifyLinear(str, Enum):
    AUTO = "auto"
    STOCK = "stock"
    GATHER = "gather"
    GEMV = "gemv"
    QMV = "qmv"


GEMV_MAX_ROWS = 8  # the kernel keeps one float accumulator per row in registers
ROUTES = (VerifyLinear.GATHER, VerifyLinear.GEMV, VerifyLinear.QMV)  # modes with a dispatcher

MARGIN = 0.10  # auto takes a route only where it beat stock by this much in every pass


@dataclass(frozen=True)
class KernelWin:
    """A committed measurement in which the ``qmv`` kernel's verify forward beat stock's by
    MARGIN in every pass at ``rows`` (lab/probe_qmv.py's cost curves, :func:`rows_won`);
    lab/tests re-derives every entry from its record."""

    bits: int
    group_size: int
    compute_capability: str  # "9.0": the device it was measured on
    rows: tuple[int, ...]
    call: str  # engine.qmv's call strategy it was measured with
    mlx: str
    record: str  # the committed record, from the repository root


# The H200's cost curves of 2026-12-01 (8B-shaped random targets, group 64, rows 1-16, stock
# against the kernel called directly and through mx.compile; 4-bit 3 passes, 8-bit 2, direct
# only): where the kernel's verify forward beat stock's by 10 % in every pass. lab/tests
# re-derives these lines from the record (lab/probe_qmv.py printed them).
_H200_CURVES = "lab/evidence/h200-2026-12-01/qmv/curves/probe_qmv.json"
QMV_WINS: tuple[KernelWin, ...] = (
    KernelWin(4, 64, "9.0", (2, 3, 4, 5, 6, 7, 8), "compile", "0.32.4", _H200_CURVES),
    KernelWin(4, 64, "9.0", (2, 3, 4, 5, 6, 7, 8), "direct", "0.32.4", _H200_CURVES),
    # 2 rows: 14 % faster in pass 0, 3 % in pass 1
    KernelWin(8, 64, "9.0", (3, 4, 5, 6, 7, 8), "direct", "0.32.4", _H200_CURVES),
)


def rows_won(passes: list[dict[int, tuple[float, float]]], margin: float = MARGIN) -> tuple[int, ...]:
    """The row counts at which the route beat stock in every pass: ``passes`` holds, per pass,
    {rows: (stock ms, route ms)}; a row count counts only when every pass measured it and the
    route's ms was below stock's x (1 - margin) in each (the rule auto states)."""
    if not passes:
        return ()
    common = set.intersection(*(set(p) for p in passes))
    return tuple(sorted(r for r in common if all(p[r][1] < p[r][0] * (1 - margin) for p in passes)))


CHOICES = tuple(m.value for m in VerifyLinear)


def parse(value: str | VerifyLinear | None) -> VerifyLinear:
    """The mode named by ``value``; a ValueError names the choices."""
    return parse_mode(VerifyLinear, value, "verify linear")


def named(mode: str | VerifyLinear | None) -> str | None:
    """The name a header or a record gives ``mode``; None for stock (``auto`` included), which
    they leave unsaid, so a stock run reads as it did before the choice existed."""
    m = effective(mode)
    return None if m is VerifyLinear.STOCK else m.value


def max_rows(mode: str | VerifyLinear | None) -> int:
    """The most verify rows ``mode``'s route takes (gemv: its register accumulators; qmv: one
    MMA's 8 columns)."""
    m = effective(mode)
    return GEMV_MAX_ROWS if m is VerifyLinear.GEMV else qmv.MAX_ROWS if m is VerifyLinear.QMV else MAX_ROWS


def unrouted_reason(mode: str | VerifyLinear | None, backend: str | None = None) -> str:
    """Why a ``mode`` block routed nothing on ``backend`` (probed when None), for the warnings
    that say so. On CUDA the reason is the model or the rows, not the backend."""
    gemv = effective(mode) is VerifyLinear.GEMV
    backend = backend or current_backend()
    if effective(mode) is VerifyLinear.QMV:
        if backend == "cuda":
            return (f"on CUDA it takes affine 4- and 8-bit projections (groups 32, 64, 128; bfloat16 "
                    f"or float16) of {MIN_ROWS}..{qmv.MAX_ROWS} rows, and these were 16-bit, of "
                    "another quantization mode or of more rows")
        return "its kernel runs on CUDA only: " + qmv.REASONS["metal" if backend == "metal" else "cpu"]
    if backend == "cuda":
        return (f"on CUDA it takes bfloat16 or float16{'' if gemv else ' (or float32)'} projections "
                f"of {MIN_ROWS}..{max_rows(mode)} rows, and these were quantized, "
                "of another dtype or of more rows")
    if gemv:
        return "its kernel runs on CUDA only, for 16-bit weights"
    return "here gather_mm takes only float32 weights (MLX's CPU)"


def effective(mode: str | VerifyLinear | None) -> VerifyLinear:
    mode = parse(mode)
    return VerifyLinear.STOCK if mode is VerifyLinear.AUTO else mode


@dataclass
class LinearRouting:
    mode: VerifyLinear
    # Weight dtypes the route takes here: gather, CUDA's gather_mv any float and the CPU's
    # gather_mm float32 only; gemv, bfloat16 and float16 on CUDA, none elsewhere.
    dtypes: tuple = (mx.float32,)
    routed: int = 0  # verify-shaped projections sent to gather_mv or the gemv / qmv kernel
    passed: int = 0  # projections a route's block left to the stock matmul (stock: not counted)
    # qmv: the backend it routes on, and under auto the (bits, group) -> rows a record won at
    # (None: every projection the kernel takes)
    backend: str = "cpu"
    allowed: dict | None = None
    auto: bool = False
    call: str = qmv.DEFAULT_CALL  # qmv: engine.qmv's call strategy, read when the block opens
    served: dict = field(default_factory=dict)  # qmv: "N x K bits/group" -> calls the kernel took
    stock_reasons: dict = field(default_factory=dict)  # qmv: engine.qmv.REASONS key -> calls left
    _plans: dict = field(default_factory=dict, repr=False)  # call signature -> (reason, label)
    # The exact path (engine.exact): every projection of 1..EXACT_MAX_ROWS rows, 1-row steps
    # included, on a row-invariant kernel (qmv for affine 4/8-bit, gemv for 16-bit, tied
    # heads' as_linear too), 9+ rows in chunks of CHUNK_ROWS; what they cannot take is counted
    # by reason in ``inexact`` ({reason: calls}); rows past the bound (prefill) stay stock in
    # ``passed``, the same in every arm.
    exact: bool = False
    inexact: dict = field(default_factory=dict)
    route: str = "kernels"  # the exact path's route (EXACT_ROUTES): "mlx", "hybrid" or "kernels"
    mlx_steps: int = 0  # mlx/hybrid routes: 1-row projections given MLX's own call as it comes

    def summary(self) -> dict:
        out = {"mode": self.mode.value, "routed_calls": self.routed, "stock_calls": self.passed}
        if self.exact:
            out.update(mode="exact", route=self.route, served=dict(sorted(self.served.items())),
                       inexact_calls=dict(sorted(self.inexact.items())))
            if self.route == "kernels":
                out["call"] = self.call
            return out
        if self.mode is VerifyLinear.QMV:  # the other modes' records read as before
            out.update(auto=self.auto, served=dict(sorted(self.served.items())),
                       stock_reasons=dict(sorted(self.stock_reasons.items())),
                       reasons={k: qmv.REASONS.get(k, AUTO_REASON) for k in sorted(self.stock_reasons)},
                       call=self.call, kernel_compile_s=qmv.compile_seconds(),
                       compiled_in_forward=qmv.compiled_in_forward())
        return out


AUTO_REASON = ("no committed measurement had the kernel beating stock here by 10 % in every pass "
               "(engine.linear.QMV_WINS)")


def qmv_plan(backend: str, allowed: dict | None, mode: str, bits: int, group: int, rows: int,
             x_dtype: str, scales_dtype: str, has_biases: bool, width: int,
             w_shape: tuple) -> str | None:
    """None when a quantized projection goes to the qmv kernel; else the key of its reason
    (engine.qmv.REASONS, or ``auto``: not among the rows a record won at). Pure."""
    why = qmv.refusal(backend, mode, bits, group, rows, x_dtype, scales_dtype, has_biases, width, w_shape)
    if why is None and allowed is not None and rows not in allowed.get((bits, group), ()):
        return "auto"
    return why


@functools.lru_cache(maxsize=1)
def _compute_capability() -> str | None:
    try:
        info = mx.device_info()
        return f"{info['compute_capability_major']}.{info['compute_capability_minor']}"
    except Exception:  # no CUDA device, or an MLX that does not say
        return None


def auto_allowed(backend: str, compute_capability: str | None,
                 wins: tuple[KernelWin, ...] | None = None, call: str = qmv.DEFAULT_CALL) -> dict | None:
    """What ``auto`` routes to qmv here: {(bits, group): rows} from the committed wins measured
    on this compute capability with this call strategy (a win measured through mx.compile says
    nothing of the direct call: under the default, compile, the 8-bit curve measured only
    directly stays stock), or None (auto is stock) where there are none."""
    if backend != "cuda" or compute_capability is None:
        return None
    won = {}
    for w in QMV_WINS if wins is None else wins:
        if w.compute_capability == compute_capability and w.call == call and w.rows:
            won.setdefault((w.bits, w.group_size), set()).update(w.rows)
    return {k: frozenset(v) for k, v in won.items()} or None


_active: ContextVar[LinearRouting | None] = ContextVar("blockwidth_verify_linear", default=None)
_install_lock = threading.Lock()
_stock_call = None  # the stock nn.Linear.__call__
_stock_qcall = None  # the stock nn.QuantizedLinear.__call__


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


# y[r, n] = sum_d x[r, d] * w[n, d] for r < K (K <= 8): one warp per n reads w's row n once, 8
# 16-bit values (16 bytes) a lane at a time, and keeps one float sum per row of x (read from
# L1/L2: K rows of D values); the warp's lanes then add their sums. K, D and N are read at run
# time (x is [K, D], w [N, D]): one compile per dtype serves every shape and row count (a compile
# per (rows, D, N), as the template once had it, cost ~1.3 s each on the H200 and landed inside
# timed runs whenever a verify met a new row count). Row r's sum is the same sequence of
# operations whatever K is, so every row of a K-row call is its 1-row result (lab/probe_exact.py).
_GEMV_SOURCE = """
    const int K = x_shape[0];
    const int D = x_shape[1];
    const int N = w_shape[0];
    const int lane = threadIdx.x & 31;
    const int n = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (n >= N) return;
    const T* wr = w + (size_t)n * D;
    float acc[8];
    #pragma unroll
    for (int r = 0; r < 8; ++r) acc[r] = 0.0f;
    for (int i = lane * 8; i < D; i += 32 * 8) {
        const uint4 wv = *reinterpret_cast<const uint4*>(wr + i);
        const T* wp = reinterpret_cast<const T*>(&wv);
        float wf[8];
        #pragma unroll
        for (int j = 0; j < 8; ++j) wf[j] = static_cast<float>(wp[j]);
        #pragma unroll
        for (int r = 0; r < 8; ++r) {
            if (r < K) {
                const uint4 xv = *reinterpret_cast<const uint4*>(x + (size_t)r * D + i);
                const T* xp = reinterpret_cast<const T*>(&xv);
                #pragma unroll
                for (int j = 0; j < 8; ++j) acc[r] += wf[j] * static_cast<float>(xp[j]);
            }
        }
    }
    #pragma unroll
    for (int r = 0; r < 8; ++r) {
        if (r < K) {
            float v = acc[r];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
            if (lane == 0) out[(size_t)r * N + n] = static_cast<T>(v);
        }
    }
"""
_gemv_kernel = None
_gemv_calls: dict = {}  # dtype -> the mx.compile'd call (traced once per shape, then replayed)


def _gemv_call(dtype):
    """The kernel's call for one dtype through mx.compile: MLX rebuilds and hashes a custom
    kernel's source on every direct call (~20 us on the H200, per projection of every step on
    the exact path); a compiled call replays the traced primitive."""
    global _gemv_kernel
    fn = _gemv_calls.get(dtype)
    if fn is None:
        if _gemv_kernel is None:
            _gemv_kernel = mx.fast.cuda_kernel(name="blockwidth_rows_gemv", input_names=["x", "w"],
                                               output_names=["out"], source=_GEMV_SOURCE)

        def run(x2, weight):
            rows, n = x2.shape[0], weight.shape[0]
            return _gemv_kernel(inputs=[x2, weight], template=[("T", x2.dtype)],
                                grid=(n * 32, 1, 1), threadgroup=(128, 1, 1),
                                output_shapes=[(rows, n)], output_dtypes=[x2.dtype])[0]

        fn = _gemv_calls[dtype] = mx.compile(run)
    return fn


def gemv_linear(x: mx.array, weight: mx.array, bias: mx.array | None = None) -> mx.array:
    """``x @ weight.T (+ bias)`` for 1..8 rows of 16-bit ``x`` through the K-row gemv kernel
    (CUDA only; the caller checks the shapes: last dim a multiple of 8, dtypes equal)."""
    d = x.shape[-1]
    rows = x.size // d
    n = weight.shape[0]
    out = _gemv_call(x.dtype)(x.reshape(rows, d), weight)
    out = out.reshape(*x.shape[:-1], n)
    return out + bias if bias is not None else out


def gemv_fits(x_shape: tuple, x_dtype, w_shape: tuple, w_dtype, dtypes: tuple, min_rows: int = MIN_ROWS) -> bool:
    """Whether the gemv kernel computes ``x @ w.T`` exactly as its source assumes: 2..8 rows,
    a 2-D weight whose input width is x's last dim (the kernel reads D = x's last dim from every
    weight row, so a narrower weight, which the stock matmul rejects, would be read past its
    end), that width a multiple of 8 (16-byte loads, no tail), and x and w of one 16-bit dtype
    (the kernel's one type T)."""
    if not x_shape or len(w_shape) != 2:
        return False
    d = x_shape[-1]
    rows = 1
    for n in x_shape[:-1]:
        rows *= n
    return (min_rows <= rows <= GEMV_MAX_ROWS and d > 0 and d % 8 == 0 and w_shape[1] == d
            and w_shape[0] > 0 and w_dtype in dtypes and x_dtype == w_dtype)


def _name(dtype) -> str:
    return str(dtype).rsplit(".", 1)[-1]


EXACT_MAX_ROWS = 16  # the exact path's bound (engine.attention's too): DFlash trains at block 16
CHUNK_ROWS = 8  # qmv's MMA columns and gemv's register accumulators: 9..16 rows take two calls


def chunks(rows: int, size: int = CHUNK_ROWS) -> list[tuple[int, int]]:
    """[start, end) row ranges of at most ``size`` rows covering ``rows``: each chunk is one
    kernel call, and a row's result is the same whatever chunk (or call) it sits in."""
    return [(a, min(a + size, rows)) for a in range(0, rows, size)]


def _inexact(routing: LinearRouting, why: str) -> None:
    routing.inexact[why] = routing.inexact.get(why, 0) + 1


def _counted(routing: LinearRouting, why: str | None, label: str, passed: bool) -> bool:
    """Count one exact-path call: routed under ``label`` when ``why`` is None (True: the caller
    routes it); else stock, as ``passed`` (the same in every arm: prefill, a CPU) or as inexact
    under ``why``."""
    if why is None:
        routing.routed += 1
        routing.served[label] = routing.served.get(label, 0) + 1
        return True
    if passed:
        routing.passed += 1
    else:
        _inexact(routing, why)
    return False


def _mlx_step(routing: LinearRouting, x) -> bool:
    """Whether ``x`` is a 1-row step on a route of MLX's projections (counted as routed), which
    the caller gives MLX's own call before any plan is looked at: a host-bound target makes ~200
    a token."""
    if routing.route in MLX_PROJECTION_ROUTES and x.size == x.shape[-1]:
        routing.routed += 1
        routing.mlx_steps += 1
        return True
    return False


def _rows_of(x) -> tuple[int, int]:
    width = x.shape[-1] if x.ndim else 0
    return (x.size // width if width else 0), width


def _chunked(x, n: int, fns: list, *args):
    """``fns[i](chunk_i, *args)`` over the row chunks of ``x``, joined back to ``x``'s leading
    shape with ``n`` outputs (one call, no reshape, when one chunk holds every row)."""
    if len(fns) == 1:
        return fns[0](x, *args)
    rows, width = _rows_of(x)
    flat = x.reshape(rows, width)
    parts = [fn(flat[a:b], *args) for fn, (a, b) in zip(fns, chunks(rows))]
    return mx.concatenate(parts, axis=0).reshape(*x.shape[:-1], n)


# The exact path's two routes. ``mlx``: classic's 1-row steps keep MLX's own projection kernels,
# and each row of a verify is computed as its 1-row step would be: an affine quantized matmul in
# calls of at most MLX_QUANT_ROWS rows (MLX's CUDA qmv, row-invariant for 1..7 rows; 8+ go to
# qmm, lab/evidence/h200-2026-12-04b/ops.txt), a 16-bit one through mx.gather_mm with every row on
# the one weight (MLX's gather_mv runs gemv's per-row code, gemms/gemv.cu's gemv_impl, with the
# same lanes per thread as the 1-row gemv), so only attention leaves MLX's kernels (the rows
# kernel, in classic's steps too). ``kernels``: every projection of 1..16 rows, 1-row steps
# included, on the engine's qmv and gemv kernels (a custom-kernel call each: on a host-bound
# SmolLM2-135M classic ran at 0.63-0.75x of stock, docs/exact.md). BLOCKWIDTH_EXACT_ROUTE chooses.
EXACT_ROUTES = ("auto", "mlx", "hybrid", "kernels")
# Routes whose projections are MLX's own (1..7-row quantized calls, gather_mv for 16-bit): ``mlx``
# and ``hybrid``, which differ in attention only (engine.attention: hybrid's is the rows kernel
# at every length, classic's steps included, so a verify is one attention call a layer, not one a row)
MLX_PROJECTION_ROUTES = ("mlx", "hybrid")
EXACT_ROUTE_ENV = "BLOCKWIDTH_EXACT_ROUTE"
DEFAULT_EXACT_ROUTE = "auto"  # a session times each route and takes the cheapest (engine.exact.choose_route)
MLX_QUANT_ROWS = 7  # MLX's CUDA quantized matmul: qmv (one row at a time) below 8 rows, qmm from 8
MLX_QUANT = {"affine": ((4, 8), (32, 64, 128))}  # what the H200 probes found row-invariant


def exact_route(value: str | None = None) -> str:
    """The exact path's route: ``value``, else BLOCKWIDTH_EXACT_ROUTE, else the default; a
    ValueError names the choices."""
    import os

    v = (value if value is not None else os.environ.get(EXACT_ROUTE_ENV, "")).strip().lower()
    v = v or DEFAULT_EXACT_ROUTE
    if v not in EXACT_ROUTES:
        raise ValueError(f"{EXACT_ROUTE_ENV}={v!r}: expected one of {', '.join(EXACT_ROUTES)}")
    return v


def concrete_route(value: str | None = None) -> str:
    """The route a block runs: ``auto`` not resolved by a measurement (the served path) is
    ``mlx``, whose classic is MLX's own."""
    v = exact_route(value)
    return "mlx" if v == "auto" else v


def mlx_quant_refusal(mode: str, bits: int, group: int) -> str | None:
    """None when the mlx route keeps a quantized projection exact (MLX's qmv at 1..7 rows, probed
    on the H200), else why not, one phrase."""
    got = MLX_QUANT.get(mode)
    if got is None or bits not in got[0] or group not in got[1]:
        return f"{mode} {bits}-bit g{group}: MLX's row invariance at 1..7 rows not probed"
    return None


def balanced(rows: int, size: int) -> list[tuple[int, int]]:
    """[start, end) ranges of at most ``size`` rows covering ``rows``, as even as they can be
    (8 rows: 4 and 4, not 7 and 1)."""
    n = -(-rows // size)
    base, extra = divmod(rows, n)
    out, a = [], 0
    for i in range(n):
        b = a + base + (1 if i < extra else 0)
        out.append((a, b))
        a = b
    return out


def mlx_qmm(x, w, scales, biases, mode: str, bits: int, group: int):
    """MLX's own quantized matmul (what nn.QuantizedLinear calls), one call."""
    return mx.quantized_matmul(x, w, scales=scales, biases=biases, transpose=True, group_size=group,
                               bits=bits, mode=mode)


def _mlx_quantized(routing: LinearRouting, x, w, scales, biases, mode: str, bits: int, group: int,
                   stock: Callable[[], mx.array], bias=None):
    """exact_quantized on the ``mlx`` route: 1..7 rows stock as they come, 8..16 rows in stock
    calls of at most 7 (each row then computed as its 1-row step is)."""
    rows, width = _rows_of(x)
    key = ("mlx-q", rows, width, w.shape, mode, bits, group)
    plan = routing._plans.get(key)
    if plan is None:
        why = ("rows" if not 1 <= rows <= EXACT_MAX_ROWS or routing.backend != "cuda"  # a CPU: stock
               else mlx_quant_refusal(mode, bits, group))
        plan = routing._plans[key] = (why, f"{w.shape[0]}x{width} {mode}-{bits} g{group}",
                                      balanced(rows, MLX_QUANT_ROWS) if why is None else None)
    why, label, parts = plan
    # "rows": prefill, or a CPU: stock in every arm alike
    if not _counted(routing, why and f"quantized projection: {why}", label, passed=why == "rows"):
        return stock()
    if len(parts) == 1:
        return stock()
    flat = x.reshape(rows, width)
    y = mx.concatenate([mlx_qmm(flat[a:b], w, scales, biases, mode, bits, group) for a, b in parts], axis=0)
    y = y.reshape(*x.shape[:-1], w.shape[0])
    return y + bias if bias is not None else y


def _mlx_dense(routing: LinearRouting, x, weight, stock: Callable[[], mx.array], bias=None):
    """exact_dense on the ``mlx`` route: 1 row stock (MLX's gemv), 2..16 rows through gather_mv
    (gemv's per-row code); 16-bit weights only, as the kernels route."""
    rows, width = _rows_of(x)
    key = ("mlx-d", rows, width, x.dtype, weight.shape, weight.dtype)
    plan = routing._plans.get(key)
    if plan is None:
        if rows > EXACT_MAX_ROWS:
            why = ""
        elif routing.backend != "cuda":
            why = ""  # stock, as every arm: a CPU's kernels are row-invariant (gather_mv is CUDA's)
        elif weight.dtype not in _EXACT_DTYPES or x.dtype != weight.dtype or rows < 1:
            why = "16-bit projection: not bfloat16/float16 of one dtype"
        else:
            why = None
        plan = routing._plans[key] = (why, f"{weight.shape[0]}x{width} {_name(weight.dtype)}")
    why, label = plan
    if not _counted(routing, why, label, passed=why == ""):
        return stock()
    if rows == 1:
        # MLX's x @ W.T + b of one row is addmm on cuBLASLt, the bias inside the kernel; a verify
        # row is gather_mv's product, rounded, then the bias: so a biased 1-row step is gemv
        # (x @ W.T), rounded, then the bias, as every verify row is
        return stock() if bias is None else (x @ weight.T) + bias
    return gather_linear(x, weight, bias)


def exact_quantized(routing: LinearRouting, x, w, scales, biases, mode: str, bits: int, group: int,
                    stock: Callable[[], mx.array], bias=None):
    """``x @ dequant(w).T (+ bias)`` on the exact path: the qmv kernel for 1..EXACT_MAX_ROWS rows
    (in chunks of CHUNK_ROWS), else ``stock()`` (which adds its own bias) with the reason counted.
    Shared by nn.QuantizedLinear and a tied quantized head's as_linear. (MLX's own quantized
    matmul of 1..7 rows is row-invariant on the H200: the ``mlx`` route, _mlx_quantized, keeps it.)"""
    if routing.route in MLX_PROJECTION_ROUTES:
        return _mlx_quantized(routing, x, w, scales, biases, mode, bits, group, stock, bias)
    rows, width = _rows_of(x)
    key = ("exact", rows, width, x.dtype, w.shape, scales.dtype, mode, bits, group, biases is None)
    plan = routing._plans.get(key)
    if plan is None:
        n = w.shape[0]
        if not 1 <= rows <= EXACT_MAX_ROWS:
            why = "rows"
        else:
            why = qmv.refusal(routing.backend, mode, bits, group, min(rows, CHUNK_ROWS), _name(x.dtype),
                              _name(scales.dtype), biases is not None, width, tuple(w.shape), min_rows=1)
        label = f"{n}x{width} {mode}-{bits} g{group}"
        fns = None
        if why is None:
            shapes = [x.shape] if rows <= CHUNK_ROWS else [(b - a, width) for a, b in chunks(rows)]
            fns = [qmv.bound(s, n, x.dtype, bits, group, routing.call) for s in shapes]
        plan = routing._plans[key] = (why, label, fns, n)
    why, label, fns, n = plan
    if not _counted(routing, why and f"quantized projection: {qmv.REASONS.get(why, why)}", label,
                    passed=why == "rows" and rows > EXACT_MAX_ROWS):  # prefill: stock in every arm alike
        return stock()
    y = _chunked(x, n, fns, w, scales, biases)
    return y + bias if bias is not None else y


_EXACT_DTYPES = (mx.bfloat16, mx.float16)


def exact_dense(routing: LinearRouting, x, weight, stock: Callable[[], mx.array], bias=None):
    """``x @ weight.T (+ bias)`` on the exact path: the gemv kernel for 1..EXACT_MAX_ROWS rows of
    16-bit weights (in chunks of CHUNK_ROWS), else ``stock()`` (bias its own) with the reason
    counted. The plan is worked out once per call signature, as exact_quantized's is (a
    host-bound target makes ~200 of these calls a token)."""
    if routing.route in MLX_PROJECTION_ROUTES:
        return _mlx_dense(routing, x, weight, stock, bias)
    rows, width = _rows_of(x)
    key = ("dense", rows, width, x.dtype, weight.shape, weight.dtype)
    plan = routing._plans.get(key)
    if plan is None:
        if rows > EXACT_MAX_ROWS:
            why = ""  # prefill: stock in every arm alike
        elif routing.backend != "cuda":
            why = "16-bit projection: no CUDA"
        elif not (rows >= 1 and gemv_fits((min(rows, CHUNK_ROWS), width), x.dtype, weight.shape, weight.dtype,
                                          _EXACT_DTYPES, min_rows=1)):
            why = ("16-bit projection: not bfloat16/float16 of one dtype, or a width that is not a "
                   "multiple of 8")
        else:
            why = None
        plan = routing._plans[key] = (why, f"{weight.shape[0]}x{width} {_name(weight.dtype)}",
                                      len(chunks(rows)))
    why, label, parts = plan
    if not _counted(routing, why, label, passed=why == ""):
        return stock()
    y = _chunked(x, weight.shape[0], [gemv_linear] * parts, weight)
    return y + bias if bias is not None else y


def _qdispatch(self, x):
    """nn.QuantizedLinear.__call__ while a qmv block is open: the kernel, or stock with the
    reason counted. The plan is worked out once per call signature (shapes, dtypes, mode)."""
    routing = _active.get()
    if routing is not None and routing.exact and type(self) is nn.QuantizedLinear:
        if _mlx_step(routing, x):
            return _stock_qcall(self, x)
        return exact_quantized(routing, x, self["weight"], self["scales"], self.get("biases"), self.mode,
                               self.bits, self.group_size, lambda: _stock_qcall(self, x),
                               self["bias"] if "bias" in self else None)
    if routing is None or routing.mode is not VerifyLinear.QMV or type(self) is not nn.QuantizedLinear:
        return _stock_qcall(self, x)
    w, s = self["weight"], self["scales"]
    b = self.get("biases")
    width = x.shape[-1] if x.ndim else 0
    rows = x.size // width if width else 0
    key = (rows, width, x.dtype, w.shape, s.dtype, self.mode, self.bits, self.group_size, b is None)
    plan = routing._plans.get(key)
    if plan is None:
        why = qmv_plan(routing.backend, routing.allowed, self.mode, self.bits, self.group_size, rows,
                       _name(x.dtype), _name(s.dtype), b is not None, width, tuple(w.shape))
        label = f"{w.shape[0]}x{width} {self.mode}-{self.bits} g{self.group_size}"
        fn = None if why else qmv.bound(x.shape, w.shape[0], x.dtype, self.bits, self.group_size, routing.call)
        plan = routing._plans[key] = (why, label, fn)
    why, label, fn = plan
    if why is not None:
        routing.passed += 1
        routing.stock_reasons[why] = routing.stock_reasons.get(why, 0) + 1
        return _stock_qcall(self, x)
    routing.routed += 1
    routing.served[label] = routing.served.get(label, 0) + 1
    y = fn(x, w, s, b)
    return y + self["bias"] if "bias" in self else y


def _dispatch(self, x):
    routing = _active.get()
    if routing is not None and routing.exact and type(self) is nn.Linear:
        if "bias" not in self and _mlx_step(routing, x):  # (a biased one is addmm: _mlx_dense)
            return _stock_call(self, x)
        return exact_dense(routing, x, self["weight"], lambda: _stock_call(self, x),
                           self["bias"] if "bias" in self else None)
    if routing is None or routing.mode not in (VerifyLinear.GATHER, VerifyLinear.GEMV) \
            or type(self) is not nn.Linear:
        return _stock_call(self, x)
    w = self["weight"]
    bias = self["bias"] if "bias" in self else None
    if routing.mode is VerifyLinear.GEMV:
        if gemv_fits(x.shape, x.dtype, w.shape, w.dtype, routing.dtypes):
            routing.routed += 1
            return gemv_linear(x, w, bias)
        routing.passed += 1
        return _stock_call(self, x)
    rows = x.size // x.shape[-1] if x.ndim else 0
    if not (MIN_ROWS <= rows <= MAX_ROWS) or w.dtype not in routing.dtypes:
        routing.passed += 1
        return _stock_call(self, x)
    routing.routed += 1
    return gather_linear(x, w, bias)


_stock_emb = None  # the stock nn.Embedding.as_linear
_stock_qemb = None  # the stock nn.QuantizedEmbedding.as_linear


def _emb_as_linear(self, x):
    """nn.Embedding.as_linear (a tied 16-bit head) while a block is open: on the exact path the
    gemv kernel, else stock."""
    routing = _active.get()
    if routing is not None and routing.exact and type(self) is nn.Embedding:
        if _mlx_step(routing, x):
            return _stock_emb(self, x)
        return exact_dense(routing, x, self["weight"], lambda: _stock_emb(self, x))
    return _stock_emb(self, x)


def _qemb_as_linear(self, x):
    """nn.QuantizedEmbedding.as_linear (a tied quantized head, which calls mx.quantized_matmul
    itself, past nn.QuantizedLinear) while a block is open: on the exact path the qmv kernel."""
    routing = _active.get()
    if routing is not None and routing.exact and type(self) is nn.QuantizedEmbedding:
        if _mlx_step(routing, x):
            return _stock_qemb(self, x)
        return exact_quantized(routing, x, self["weight"], self["scales"], self.get("biases"),
                               getattr(self, "mode", "affine"), self.bits, self.group_size,
                               lambda: _stock_qemb(self, x))
    return _stock_qemb(self, x)


_holders = 0  # gather/gemv blocks open in any thread: the dispatcher is in place only while > 0


def install() -> None:
    """Put the dispatchers in front of ``nn.Linear.__call__`` and ``nn.QuantizedLinear.__call__``.
    They are there only while a ``gather``, ``gemv`` or ``qmv`` block is open: every other forward
    keeps the stock methods, with no added Python call per projection."""
    global _stock_call, _stock_qcall, _stock_emb, _stock_qemb, _holders
    with _install_lock:
        _holders += 1
        if nn.Embedding.as_linear is not _emb_as_linear:
            _stock_emb = nn.Embedding.as_linear
            nn.Embedding.as_linear = _emb_as_linear
        if nn.QuantizedEmbedding.as_linear is not _qemb_as_linear:
            _stock_qemb = nn.QuantizedEmbedding.as_linear
            nn.QuantizedEmbedding.as_linear = _qemb_as_linear
        # Re-checked every time: a probe that swaps nn.Linear.__call__ and restores what it
        # found must not leave this module routing nothing.
        if nn.Linear.__call__ is not _dispatch:
            _stock_call = nn.Linear.__call__
            nn.Linear.__call__ = _dispatch
        if nn.QuantizedLinear.__call__ is not _qdispatch:
            _stock_qcall = nn.QuantizedLinear.__call__
            nn.QuantizedLinear.__call__ = _qdispatch


def uninstall() -> None:
    global _holders
    with _install_lock:
        _holders = max(_holders - 1, 0)
        if _holders == 0 and nn.Linear.__call__ is _dispatch:
            nn.Linear.__call__ = _stock_call
        if _holders == 0 and nn.QuantizedLinear.__call__ is _qdispatch:
            nn.QuantizedLinear.__call__ = _stock_qcall
        if _holders == 0 and nn.Embedding.as_linear is _emb_as_linear:
            nn.Embedding.as_linear = _stock_emb
        if _holders == 0 and nn.QuantizedEmbedding.as_linear is _qemb_as_linear:
            nn.QuantizedEmbedding.as_linear = _stock_qemb


def routing_for(mode: str | VerifyLinear | None, backend: str | None = None) -> LinearRouting:
    """The routing a block of ``mode`` starts with on ``backend`` (probed when None): ``auto``
    becomes ``qmv`` limited to the committed wins on this device, or stock."""
    backend = backend or current_backend()
    asked = parse(mode)
    routing = LinearRouting(effective(asked), backend=backend)
    if routing.mode is VerifyLinear.QMV or (asked is VerifyLinear.AUTO and backend == "cuda"):
        routing.call = qmv.call_strategy()  # a bad BLOCKWIDTH_QMV_CALL stops here, named
    if asked is VerifyLinear.AUTO:
        allowed = auto_allowed(backend, _compute_capability() if backend == "cuda" else None,
                               call=routing.call)
        if allowed:
            routing.mode, routing.allowed, routing.auto = VerifyLinear.QMV, allowed, True
    return routing


@contextmanager
def verify_linear(mode: str | VerifyLinear | None) -> Iterator[LinearRouting]:
    """Inside this block (this thread only), verify-shaped projections use ``mode``."""
    routing = routing_for(mode)
    gather = routing.mode in ROUTES
    if gather:
        cuda = routing.backend == "cuda"
        if routing.mode is VerifyLinear.QMV:
            routing.dtypes = ()  # 16-bit projections stay stock: qmv routes quantized ones only
        elif routing.mode is VerifyLinear.GEMV:  # a CUDA kernel: nothing to route elsewhere
            routing.dtypes = (mx.bfloat16, mx.float16) if cuda else ()
        else:
            routing.dtypes = (mx.bfloat16, mx.float16, mx.float32) if cuda else (mx.float32,)
        install()
    token = _active.set(routing)
    try:
        yield routing
    finally:
        _active.reset(token)
        if gather:
            uninstall()


@contextmanager
def exact_linear(backend: str | None = None, route: str | None = None) -> Iterator[LinearRouting]:
    """Inside this block (this thread only), every projection of 1..EXACT_MAX_ROWS rows, and a
    tied head's as_linear, is computed row-invariantly where the route can (engine.exact):
    ``route`` (EXACT_ROUTES; None: exact_route()) says how."""
    backend = backend or current_backend()
    routing = LinearRouting(VerifyLinear.STOCK, backend=backend, exact=True, route=concrete_route(route))
    if backend == "cuda" and routing.route == "kernels":
        routing.call = qmv.call_strategy()
    install()
    token = _active.set(routing)
    try:
        yield routing
    finally:
        _active.reset(token)
        uninstall()


def prepare(mode: str | VerifyLinear | None, *models) -> dict[str, float]:
    """Before anything is timed: where ``mode`` routes to the qmv kernel here, compile the
    kernel instances ``models``' projections need (engine.qmv.prepare; under ``auto`` only
    those of the (bits, group, rows) it routes), so a measured forward never pays NVRTC;
    returns {instance: compile seconds}, empty where nothing is routed."""
    routing = routing_for(mode)
    if routing.mode is not VerifyLinear.QMV or routing.backend != "cuda":
        return {}
    done = {}
    for m in models:
        if isinstance(m, nn.Module):
            done.update(qmv.prepare(m, strategy=routing.call, allowed=routing.allowed))
    return done
