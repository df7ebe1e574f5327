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
- ``auto``: ``plain`` on CUDA (measured best there, see README), ``fused``
  elsewhere (Metal and CPU have no per-length plan).

Every model family mlx-lm loads reaches attention through
``mx.fast.scaled_dot_product_attention`` at call time, so the choice is made by
one dispatcher installed there, active only inside :func:`verify_attention`
and only in the thread that entered it.
"""

from __future__ import annotations

import argparse
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


def add_arg(parser: argparse.ArgumentParser) -> None:
    """``--verify-attention``, as every command and tool that decodes declares it: one default, one
    help, and the choices checked as the arguments are parsed, so a bad name stops before any
    model loads."""
    parser.add_argument("--verify-attention", choices=CHOICES, default=VerifyAttention.AUTO.value,
                        help="attention of verify forwards (2..64 rows against the KV cache): auto = "
                             "plain on CUDA (no per-length cuDNN plan), fused elsewhere")


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
        return {"mode": self.mode.value, "routed_calls": self.routed, "fused_calls": self.passed,
                "unrouted_calls": self.unrouted, "buckets": sorted(self.buckets)}


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


def _dispatch(q, k, v, *args, scale=None, mask=None, sinks=None, **kwargs):
    routing = _active.get()
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
    if routing.mode is VerifyAttention.PLAIN:
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
                     any_shape: bool = False) -> Iterator[Routing]:
    """Inside this block (this thread only), verify-shaped attention uses ``mode``
    (``any_shape``: every attention call does, e.g. a drafter's training forward)."""
    install()
    routing = Routing(effective(mode, backend), any_shape)
    token = _active.set(routing)
    try:
        yield routing
    finally:
        _active.reset(token)
