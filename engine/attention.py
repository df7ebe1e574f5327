"""The attention that verify forwards use: the engine's way round per-length cuDNN plans.

On CUDA, ``mx.fast.scaled_dot_product_attention`` sends 2+ query rows to cuDNN
and MLX caches each cuDNN plan keyed on the exact KV length. A verify round
is at a new KV length every time, so stock ("fused") attention builds a plan
every round (tens of ms, 35 s for the first one at some shapes) and, after
2 x ``MLX_CUDA_SDPA_CACHE_SIZE`` misses, raises "Cache thrashing". The engine
therefore chooses the attention of multi-row forwards against a KV cache (the
verify shape, 2..64 query rows) and leaves 1-row decode and prefill on the
fused kernel:

- ``fused``: stock ``mx.fast.scaled_dot_product_attention``;
- ``plain``: matmul, mask, float32 softmax, matmul (the arithmetic of MLX's own
  fallback), no plan at all: the first round at a length costs what a repeat costs;
- ``bucketed``: the fused call with K/V zero-padded up to a multiple of 256 and
  the padding masked, so one plan serves every length in a bucket;
- ``vector``: MLX's own vector attention kernel (the one 1-row decode uses when
  cuDNN does not take it), which handles up to 3 causal query rows: the rows go
  in chunks of at most 3, each against the keys it may see, in float32 (cuDNN
  takes only 16-bit inputs, so float32 reaches the vector kernel on every
  length, with no plan and no cuBLAS call);
- ``rows``: the engine's own CUDA kernel (``mx.fast.cuda_kernel``) for 2..64
  causal query rows: one launch a layer, a block per (query head, row) whose 32
  warps stride the keys that row may see, online softmax in float32, read
  straight from the cache's strided view (no copy, no float32 cast, no mask
  array, no plan); where it cannot run (no CUDA, an array mask, sinks, a head
  size that is not a multiple of 32 up to 256) the call goes to ``plain``;
- ``auto``: ``plain`` on CUDA (measured best there, see docs/verify-attention.md), ``fused``
  elsewhere (Metal and CPU have no per-length plan).

Every model family mlx-lm loads reaches attention through
``mx.fast.scaled_dot_product_attention`` at call time, so the choice is made by
one dispatcher installed there, active only inside :func:`verify_attention`
and only in the thread that entered it.
"""

from __future__ import annotations

import struct
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import Enum
from typing import Iterator

import mlx.core as mx

MIN_ROWS = 2
MAX_ROWS = 64
BUCKET = 256


class VerifyAttention(str, Enum):
    AUTO = "auto"
    FUSED = "fused"
    PLAIN = "plain"
    BUCKETED = "bucketed"
    VECTOR = "vector"
    ROWS = "rows"


CHOICES = tuple(m.value for m in VerifyAttention)


def parse_mode(kind: type[Enum], value, label: str):
    """The member of ``kind`` (a str Enum with an ``AUTO``) named by ``value``, None meaning
    ``AUTO``; a ValueError names ``label`` and the choices. Serves every verify-time choice."""
    if value is None:
        return kind.AUTO
    if isinstance(value, kind):
        return value
    try:
        return kind(str(value).strip().lower())
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ValueError(f"{label} {value!r}: expected one of {choices}") from None


def parse(value: str | VerifyAttention | None) -> VerifyAttention:
    """The mode named by ``value``; a ValueError names the choices."""
    return parse_mode(VerifyAttention, value, "verify attention")


def effective(mode: str | VerifyAttention | None, backend: str | None = None) -> VerifyAttention:
    """What ``mode`` means on ``backend`` (``cuda``, ``metal``, ``cpu``; probed when None)."""
    mode = parse(mode)
    if mode is not VerifyAttention.AUTO:
        return mode
    if backend is None:
        backend = current_backend()
    return VerifyAttention.PLAIN if backend == "cuda" else VerifyAttention.FUSED


def current_backend() -> str:
    if mx.default_device().type == mx.cpu:
        return "cpu"
    try:
        return "cuda" if mx.cuda.is_available() else "metal"
    except AttributeError:
        return "metal"


@dataclass
class Routing:
    """What the dispatcher did inside one ``verify_attention`` block."""

    mode: VerifyAttention
    any_shape: bool = False  # route every call, not only verify shapes (training forwards)
    routed: int = 0  # verify-shaped calls handled by ``mode``
    passed: int = 0  # calls left to the fused kernel (1 row, prefill, no cache)
    unrouted: int = 0  # verify-shaped calls with arguments the dispatcher does not know (fused)
    fallback: int = 0  # ``rows`` calls its kernel could not take (no CUDA, a mask array): plain
    cuda: bool = False  # the backend is CUDA (``rows`` runs its kernel only there)
    # The exact path (engine.exact): every call of 1..EXACT_MAX_ROWS query rows, with or without
    # a cache, goes to the ``rows`` kernel, 1-row decode included, so a row's result does not
    # depend on how many rows its forward holds; calls the kernel cannot take are counted here
    # ({reason: calls}) and the exact path says it was not exact.
    exact: bool = False
    inexact: dict = field(default_factory=dict)
    route: str = "kernels"  # the exact path's route (engine.linear.EXACT_ROUTES)
    stock_rows: int = 0  # mlx route: rows computed by MLX's own 1-row attention
    off_step_calls: int = 0  # mlx route: 1-row calls given MLX's own call on an off-step buffer
    # The keys the last off-step cache handed out (engine.kvcache.make_cache): a call on them may
    # give MLX's 1-row attention any number of keys (mark_off_step)
    off_step_keys: object = field(default=None, repr=False)
    buckets: set[int] = field(default_factory=set)
    # The additive causal mask of the current verify shape: every layer of one forward
    # asks for the same (rows, keys), so it is built once per forward, not once per layer.
    _mask_key: tuple | None = field(default=None, repr=False)
    _mask: mx.array | None = field(default=None, repr=False)

    def causal_mask(self, rows: int, keys: int, dtype) -> mx.array:
        key = (rows, keys, dtype)
        if key != self._mask_key:
            self._mask_key, self._mask = key, _additive(_causal(rows, keys), dtype)
        return self._mask

    def summary(self) -> dict:
        out = {"mode": self.mode.value, "routed_calls": self.routed, "fused_calls": self.passed,
               "unrouted_calls": self.unrouted, "buckets": sorted(self.buckets)}
        if self.mode is VerifyAttention.ROWS:  # the other modes' records read as before
            out["plain_fallback_calls"] = self.fallback
        if self.exact:
            out.update(exact=True, inexact_calls=dict(sorted(self.inexact.items())), route=self.route)
            if self.route == "mlx":
                out["stock_rows"] = self.stock_rows
        return out


EXACT_MAX_ROWS = 16  # the exact path's row bound (DFlash drafters are trained at block 16)


class WindowMask(str):
    """``"causal"`` within a sliding window of ``window`` keys: what the engine's WindowCache
    (engine.kvcache) hands a forward on the exact path, so that the ``rows`` kernel takes the
    window itself, reading every row's keys in the order a 1-row step reads them (an array mask
    would send the call to ``plain``, whose matmuls are not row-invariant on CUDA). Anything
    else that meets one gets the equivalent array (:func:`window_array`)."""

    window: int

    def __new__(cls, window: int) -> "WindowMask":
        s = super().__new__(cls, "causal")
        s.window = int(window)
        return s


def window_array(rows: int, keys: int, window: int) -> mx.array:
    """The boolean mask a WindowMask stands for: bottom-right causal, each row its last
    ``window`` keys (mlx-lm's create_causal_mask with window_size)."""
    q = mx.arange(keys - rows, keys)[:, None]
    k = mx.arange(keys)[None]
    return (q >= k) & (q < k + window)


def exact_active() -> bool:
    """Whether this thread is inside an exact-path block (engine.exact)."""
    r = _active.get()
    return r is not None and r.exact


_active: ContextVar[Routing | None] = ContextVar("blockwidth_verify_attention", default=None)
_install_lock = threading.Lock()
_fused = None  # the stock mx.fast.scaled_dot_product_attention


def _causal(rows: int, keys: int) -> mx.array:
    # Bottom-right aligned, as the fused kernel treats "causal" when rows < keys.
    q = mx.arange(keys - rows, keys)[:, None]
    return q >= mx.arange(keys)[None]


def _additive(mask: mx.array, dtype) -> mx.array:
    if mask.dtype == mx.bool_:
        return mx.where(mask, mx.array(0.0, dtype), mx.array(-mx.inf, dtype))
    return mask if mask.dtype == dtype else mask.astype(dtype)


def plain_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask=None,
                    sinks: mx.array | None = None) -> mx.array:
    """softmax(q k^T * scale + mask) v without a fused kernel (MLX's fallback arithmetic)."""
    dtype = q.dtype
    B, n_q, L, _ = q.shape
    n_kv = k.shape[1]
    S = k.shape[2]
    reps = n_q // n_kv
    q = q * mx.array(scale, dtype)
    if reps > 1:
        q = q.reshape(B, n_kv, reps, L, -1)
        k = mx.expand_dims(k, 2)
        v = mx.expand_dims(v, 2)
    scores = q @ k.swapaxes(-1, -2)
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"attention mask {mask!r}: only 'causal' is understood")
        mask = _causal(L, S)
    if mask is not None:
        add = _additive(mask, scores.dtype)
        if reps > 1 and add.ndim == 4:
            if add.shape[1] == n_q and n_q != 1:
                add = mx.broadcast_to(add, (add.shape[0], n_q, L, S))  # rows may be broadcast
                add = add.reshape(add.shape[0], n_kv, reps, L, S)
            else:
                add = mx.expand_dims(add, 2)
        scores = scores + add
    if sinks is not None:
        # One extra logit per head that takes probability mass and no value.
        s = sinks.astype(scores.dtype).reshape((n_kv, reps) if reps > 1 else (n_q,))
        s = mx.broadcast_to(s.reshape(*s.shape, 1, 1), (*scores.shape[:-1], 1))
        probs = mx.softmax(mx.concatenate([s, scores], axis=-1), axis=-1, precise=True)[..., 1:]
    else:
        probs = mx.softmax(scores, axis=-1, precise=True)
    out = probs @ v
    if reps > 1:
        out = out.reshape(B, n_q, L, -1)
    return out


def bucketed_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask=None,
                       sinks: mx.array | None = None, routing: Routing | None = None) -> mx.array:
    """The fused call on K/V padded to a multiple of ``BUCKET`` with the padding masked,
    so every KV length in a bucket shares one cuDNN plan."""
    L = q.shape[2]
    S = k.shape[2]
    P = -(-S // BUCKET) * BUCKET
    if routing is not None:
        routing.buckets.add(P)
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"attention mask {mask!r}: only 'causal' is understood")
        mask = _causal(L, S)
    add = _additive(mask, q.dtype) if mask is not None else mx.zeros((L, S), q.dtype)
    if P > S:
        pad = [(0, 0)] * (k.ndim - 2) + [(0, P - S), (0, 0)]
        k = mx.pad(k, pad)
        v = mx.pad(v, pad)
        mpad = [(0, 0)] * (add.ndim - 1) + [(0, P - S)]
        add = mx.pad(add, mpad, constant_values=-mx.inf)
    while add.ndim < 4:
        add = add[None]
    kw = {"sinks": sinks} if sinks is not None else {}
    return _fused(q, k, v, scale=scale, mask=add, **kw)


VECTOR_ROWS = 3  # MLX's vector kernel takes fewer than 4 query rows


def vector_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float, mask=None,
                     sinks: mx.array | None = None) -> mx.array:
    """Causal verify attention through the fused vector kernel: chunks of at most
    ``VECTOR_ROWS`` query rows, each against the keys up to its last row (so the
    kernel's bottom-right causal mask is the verify's), in float32."""
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        return plain_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)  # an array mask
    dtype = q.dtype
    L = q.shape[2]
    S = k.shape[2]
    q32, k32, v32 = q.astype(mx.float32), k.astype(mx.float32), v.astype(mx.float32)
    kw = {"sinks": sinks.astype(mx.float32)} if sinks is not None else {}
    outs = []
    for r0 in range(0, L, VECTOR_ROWS):
        r1 = min(r0 + VECTOR_ROWS, L)
        end = S - L + r1  # the keys row r1 - 1 may see
        outs.append(_fused(q32[:, :, r0:r1], k32[:, :, :end], v32[:, :, :end], scale=scale,
                           mask="causal", **kw))
    out = outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=2)
    return out.astype(dtype)


# One block per (query head, row, batch): its 32 warps take keys j = warp, warp + 32, ... up
# to the last key the row may see (bottom-right causal, as the fused kernel aligns rows <
# keys), each lane holding D / 32 of the query, the running output and, per key, a partial
# dot product that the warp sums; each warp keeps an online softmax (max, sum, output) and the
# block merges the 32 of them through shared memory. Strides come from the arrays, so the KV
# cache's view is read where it lies. Scores in the log2 domain (scale * log2 e, exp2f).
# SCALE_BITS carries the float scale as a template int: one compiled kernel per model.
_ROWS_SOURCE = """
    constexpr int WARPS = 32;
    constexpr int PER = D / 32;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int h = blockIdx.x;
    const int row = blockIdx.y;
    const int b = blockIdx.z;
    const int n_q = q_shape[1];
    const int L = q_shape[2];
    const int S = k_shape[2];
    const int limit = CAUSAL ? S - L + row + 1 : S;
    // a sliding window: the row's last WINDOW keys, walked from the window's first key so that
    // every warp takes the keys it takes in a 1-row step at the same position
    const int lo = WINDOW > 0 ? max(0, limit - WINDOW) : 0;
    const float qscale = __int_as_float(SCALE_BITS) * 1.4426950408889634f;
    const float neg_inf = __int_as_float(0xff800000);  // MLX 0.32.4's kernel header has no inf
    const T* qp = q + b * q_strides[0] + h * q_strides[1] + row * q_strides[2];
    const T* kp = k + b * k_strides[0] + (h / GQA) * k_strides[1];
    const T* vp = v + b * v_strides[0] + (h / GQA) * v_strides[1];
    float qf[PER];
    float o[PER];
    #pragma unroll
    for (int e = 0; e < PER; ++e) {
        qf[e] = static_cast<float>(qp[(lane * PER + e) * q_strides[3]]) * qscale;
        o[e] = 0.0f;
    }
    float m = neg_inf;
    float l = 0.0f;
    for (int j = lo + warp; j < limit; j += WARPS) {
        const T* kr = kp + j * k_strides[2];
        float s = 0.0f;
        #pragma unroll
        for (int e = 0; e < PER; ++e) s += qf[e] * static_cast<float>(kr[(lane * PER + e) * k_strides[3]]);
        #pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
        const float nm = fmaxf(m, s);
        const float f = exp2f(m - nm);
        const float p = exp2f(s - nm);
        l = l * f + p;
        const T* vr = vp + j * v_strides[2];
        #pragma unroll
        for (int e = 0; e < PER; ++e) o[e] = o[e] * f + p * static_cast<float>(vr[(lane * PER + e) * v_strides[3]]);
        m = nm;
    }
    __shared__ float sm_m[WARPS];
    __shared__ float sm_l[WARPS];
    __shared__ float sm_o[WARPS][D + 1];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
    __syncthreads();
    float big = neg_inf;
    #pragma unroll
    for (int w = 0; w < WARPS; ++w) big = fmaxf(big, sm_m[w]);
    const float mine = m == neg_inf ? 0.0f : exp2f(m - big);
    #pragma unroll
    for (int e = 0; e < PER; ++e) sm_o[warp][lane * PER + e] = o[e] * mine;
    __syncthreads();
    if (threadIdx.x < D) {
        float total = 0.0f;
        float acc = 0.0f;
        #pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            const float wm = sm_m[w];
            total += wm == neg_inf ? 0.0f : sm_l[w] * exp2f(wm - big);
            acc += sm_o[w][threadIdx.x];
        }
        out[(((size_t)b * n_q + h) * L + row) * D + threadIdx.x] = static_cast<T>(acc / total);
    }
"""
_rows_kernel = None
ROWS_DTYPES = (mx.bfloat16, mx.float16, mx.float32)


def rows_fits(q_shape: tuple, k_shape: tuple, v_shape: tuple, dtypes: tuple, mask, sinks,
              scale) -> bool:
    """Whether the ``rows`` kernel computes this call exactly as its source assumes: 4-D q, k, v
    of one dtype it takes, k and v alike, a head size that is a multiple of 32 up to 256 (a lane
    holds D / 32 values; the block has 1024 threads for the final sums), query heads a whole
    multiple of the KV heads, no more rows than keys, a causal or no mask (no array), no sinks,
    and a positive float scale."""
    if len(q_shape) != 4 or len(k_shape) != 4 or tuple(k_shape) != tuple(v_shape):
        return False
    B, n_q, L, D = q_shape
    kb, n_kv, S, kd = k_shape
    if len(set(dtypes)) != 1 or dtypes[0] not in ROWS_DTYPES:
        return False
    if not (kb == B and kd == D and D % 32 == 0 and 32 <= D <= 256 and n_kv > 0
            and n_q % n_kv == 0 and 1 <= L <= S):
        return False
    if sinks is not None or not (mask is None or (isinstance(mask, str) and mask == "causal")):
        return False
    if isinstance(mask, WindowMask) and mask.window < 1:
        return False
    return isinstance(scale, (int, float)) and scale > 0


def rows_attention(q: mx.array, k: mx.array, v: mx.array, *, scale: float,
                   causal: bool = True, window: int = 0) -> mx.array:
    """Verify attention through the ``rows`` CUDA kernel (the caller checks ``rows_fits``);
    ``window`` > 0: each row sees its last ``window`` keys only. The launch's arguments are
    worked out once per call signature: on the path classic makes this call once a layer a token
    past 256 keys, and its host time is the path's cost on a host-bound target."""
    global _rows_kernel
    if _rows_kernel is None:
        _rows_kernel = mx.fast.cuda_kernel(name="blockwidth_rows_attention",
                                           input_names=["q", "k", "v"], output_names=["out"],
                                           source=_ROWS_SOURCE, ensure_row_contiguous=False)
    key = (q.shape, k.shape[1], q.dtype, bool(causal), scale, int(window))
    kw = _rows_launch.get(key)
    if kw is None:
        B, n_q, L, D = q.shape
        bits = struct.unpack("<i", struct.pack("<f", float(scale)))[0]
        kw = _rows_launch[key] = dict(
            template=[("T", q.dtype), ("D", D), ("GQA", n_q // k.shape[1]), ("CAUSAL", bool(causal)),
                      ("SCALE_BITS", bits), ("WINDOW", int(window))],
            grid=(n_q * 1024, L, B), threadgroup=(1024, 1, 1), output_shapes=[(B, n_q, L, D)],
            output_dtypes=[q.dtype])
    return _rows_kernel(inputs=[q, k, v], **kw)[0]


_rows_launch: dict = {}  # (q shape, KV heads, dtype, causal, scale, window) -> the launch's arguments


# The mlx route's attention. Below STOCK_KEYS keys MLX's 1-row attention is its own vector kernel
# (mlx/backend/cuda/scaled_dot_product_attention.cpp, use_cudnn_for_decoding: cuDNN decodes only
# from 256 keys, and then only a cache slice whose buffer is a multiple of 256 rows, which a
# verify's cache growth need not keep), whose per-row arithmetic depends on the row's keys only.
# So there classic's step is MLX's own call, and each verify row is that same call on the keys
# the row may see. The exact path's own caches keep every buffer one row past a multiple of 256
# (engine.kvcache.off_step), which cuDNN's decode test never takes: on their keys the bound does
# not apply, and every row at every length is MLX's vector kernel (mark_off_step). On keys from
# any other cache (the served path's), from STOCK_KEYS keys classic's steps and the verify's rows
# take the rows kernel. The choice is per row, by its own number of keys, so a row is computed
# the same way in a 1-row step and in any verify. Head sizes the vector kernel takes: VECTOR_HEADS.
STOCK_KEYS = 256
VECTOR_HEADS = (64, 96, 128)


def mark_off_step(k) -> None:
    """Called by the exact path's caches (engine.kvcache.make_cache with off-step buffers) with
    the keys they hand a layer's attention: a buffer one row past a multiple of 256 is never
    cuDNN's (its decode test wants a multiple of 256), so MLX's 1-row call on these keys, or on
    a slice of them, is its vector kernel at any length, and the STOCK_KEYS bound does not apply."""
    r = _active.get()
    if r is not None:
        r.off_step_keys = k


def _vector_fits(q, k, v, mask, sinks) -> bool:
    """Whether the mlx route may give rows of this call to MLX's own 1-row attention."""
    return (q.ndim == 4 and k.ndim == 4 and tuple(k.shape) == tuple(v.shape) and q.shape[-1] == k.shape[-1]
            and q.shape[-1] in VECTOR_HEADS and q.dtype == k.dtype == v.dtype and sinks is None
            and (mask is None or (isinstance(mask, str) and mask == "causal")))


def mlx_attention(routing: Routing, q, k, v, scale, mask):
    """The mlx route (the caller checked _vector_fits): the rows that see fewer than STOCK_KEYS
    keys (a row's keys: its causal prefix, cut to its window when the mask is a WindowMask)
    through MLX's own 1-row call, each on its own keys; the rest, the last rows, which see the
    most, in one rows-kernel call. None when no row is MLX's (the caller routes the call)."""
    L, S = q.shape[2], k.shape[2]
    if mask is None and L > 1:  # no causal mask: not a verify (every row sees every key)
        return None
    window = mask.window if isinstance(mask, WindowMask) else 0
    bound = S + 1 if k is routing.off_step_keys else STOCK_KEYS  # an off-step buffer: every row
    spans = []
    for r in range(L):
        limit = S - L + r + 1
        lo = max(0, limit - window) if window else 0
        if limit - lo >= bound:
            break
        spans.append((lo, limit))
    if not spans or (len(spans) < L and not rows_fits(q.shape, k.shape, v.shape, (q.dtype, k.dtype, v.dtype),
                                                       mask, None, scale)):
        return None  # no row for MLX, or the kernel cannot take the rest: the caller routes the call
    routing.stock_rows += len(spans)
    if L == 1 and spans[0] == (0, S):  # classic's step: MLX's call as it comes
        return _fused(q, k, v, scale=scale, mask=None)
    parts = [_fused(q[:, :, r:r + 1], k[:, :, lo:limit], v[:, :, lo:limit], scale=scale, mask=None)
             for r, (lo, limit) in enumerate(spans)]
    if len(spans) < L:
        parts.append(rows_attention(q[:, :, len(spans):], k, v, scale=scale, causal=True, window=window))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)


def _exact(routing: Routing, q, k, v, args, kwargs, scale, mask, sinks):
    """The exact path's attention: 1..EXACT_MAX_ROWS query rows to the ``rows`` kernel; what it
    cannot take is counted by reason and goes where it would have gone off the path."""
    L = q.shape[2] if q.ndim == 4 else 0
    if args or kwargs or q.ndim != 4 or not 1 <= L <= EXACT_MAX_ROWS:
        if 1 <= L <= EXACT_MAX_ROWS:
            routing.inexact["arguments the dispatcher does not know"] = \
                routing.inexact.get("arguments the dispatcher does not know", 0) + 1
        routing.passed += 1  # prefill chunks past the bound: stock, the same in every arm
        return None
    if routing.route == "mlx" and routing.cuda and _vector_fits(q, k, v, mask, sinks):
        out = mlx_attention(routing, q, k, v, scale, mask)
        if out is not None:
            routing.routed += 1
            return out
    if routing.cuda and rows_fits(q.shape, k.shape, v.shape, (q.dtype, k.dtype, v.dtype), mask, sinks, scale):
        routing.routed += 1
        return rows_attention(q, k, v, scale=scale, causal=mask is not None,
                              window=mask.window if isinstance(mask, WindowMask) else 0)
    why = ("sinks" if sinks is not None else "an array mask" if mask is not None and not isinstance(mask, str)
           else "no CUDA" if not routing.cuda else "a shape the rows kernel does not take")
    routing.inexact[why] = routing.inexact.get(why, 0) + 1
    return None


def _dispatch(q, k, v, *args, scale=None, mask=None, sinks=None, **kwargs):
    routing = _active.get()
    if routing is not None and routing.exact:
        if (routing.route == "mlx" and mask is None and not args and not kwargs and q.ndim == 4
                and q.shape[2] == 1 and k.ndim == 4 and (k.shape[2] < STOCK_KEYS or k is routing.off_step_keys)
                and routing.cuda and _vector_fits(q, k, v, mask, sinks)):
            # classic's step below STOCK_KEYS keys, or on an off-step buffer: MLX's own call (what
            # mlx_attention gives a 1-row call), before anything else is looked at: a host-bound
            # target makes this call once a layer a token, and every microsecond of Python here
            # is the exact path's cost
            routing.routed += 1
            routing.stock_rows += 1
            if k is routing.off_step_keys:
                routing.off_step_calls += 1
            return _fused(q, k, v, scale=scale, mask=None)
        out = _exact(routing, q, k, v, args, kwargs, scale, mask, sinks)
        if out is not None:
            return out
        if isinstance(mask, WindowMask):  # off the kernel: the window as the array it stands for
            mask = window_array(q.shape[2], k.shape[2], mask.window)
    if isinstance(mask, WindowMask):  # never reaches a stock kernel as plain "causal"
        mask = window_array(q.shape[2], k.shape[2], mask.window)
    if (routing is None or routing.mode in (VerifyAttention.FUSED, VerifyAttention.AUTO)
            or args or kwargs or q.ndim != 4
            or (not routing.any_shape
                and (not (MIN_ROWS <= q.shape[2] <= MAX_ROWS) or k.shape[2] <= q.shape[2]))):
        # Not a verify shape (1-row decode, prefill, no cache) or nothing to route.
        if routing is not None:
            routing.passed += 1
            if (args or kwargs) and q.ndim == 4 and MIN_ROWS <= q.shape[2] <= MAX_ROWS:
                routing.unrouted += 1  # e.g. stream=: left on the stock kernel, and counted
        kw = dict(kwargs)
        if sinks is not None:
            kw["sinks"] = sinks
        return _fused(q, k, v, *args, scale=scale, mask=mask, **kw)
    routing.routed += 1
    if routing.mode is VerifyAttention.ROWS:
        if routing.cuda and rows_fits(q.shape, k.shape, v.shape, (q.dtype, k.dtype, v.dtype),
                                      mask, sinks, scale):
            return rows_attention(q, k, v, scale=scale, causal=mask is not None)
        routing.fallback += 1  # and on to plain's path below
    if routing.mode in (VerifyAttention.PLAIN, VerifyAttention.ROWS):
        if isinstance(mask, str) and mask == "causal":
            mask = routing.causal_mask(q.shape[2], k.shape[2], q.dtype)
        return plain_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    if routing.mode is VerifyAttention.VECTOR:
        return vector_attention(q, k, v, scale=scale, mask=mask, sinks=sinks)
    return bucketed_attention(q, k, v, scale=scale, mask=mask, sinks=sinks, routing=routing)


def install() -> None:
    """Put the dispatcher in front of ``mx.fast.scaled_dot_product_attention`` (once).
    Outside a ``verify_attention`` block it calls the stock kernel unchanged."""
    global _fused
    with _install_lock:
        if _fused is None:
            _fused = mx.fast.scaled_dot_product_attention
            mx.fast.scaled_dot_product_attention = _dispatch


@contextmanager
def verify_attention(mode: str | VerifyAttention | None, backend: str | None = None,
                     any_shape: bool = False, exact: bool = False, route: str | None = None) -> Iterator[Routing]:
    """Inside this block (this thread only), verify-shaped attention uses ``mode``
    (``any_shape``: every attention call does, e.g. a drafter's training forward; ``exact``:
    the exact path, engine.exact, every call of 1..EXACT_MAX_ROWS rows on the ``rows``
    kernel, and ``mode`` for what is left)."""
    install()
    routing = Routing(effective(mode, backend), any_shape, exact=exact)
    routing.cuda = current_backend() == "cuda"  # where the kernel can run, whatever "auto" means
    if exact:
        from blockwidth.engine.linear import concrete_route

        routing.route = concrete_route(route)
    token = _active.set(routing)
    try:
        yield routing
    finally:
        _active.reset(token)
