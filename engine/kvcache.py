"""Cache rewind for every cache kind mlx-lm makes: snapshot before a verify, commit its kept rows.

A verify forward appends ``width`` rows to every layer's cache; after acceptance only the rows it
kept may remain. How a layer drops the others is chosen from its cache object:

- ``trim``: plain KV caches (``KVCache``, ``QuantizedKVCache``, ``ConcatenateKVCache``,
  ``ChunkedKVCache``) drop the tail, as mlx-lm's ``trim_prompt_cache`` does;
- ``window``: a sliding-window ``RotatingKVCache`` overwrites its oldest rows in place, so the
  rejected tail could not be dropped once it is past its window. It is replaced by a
  ``WindowCache``: the same window, rows kept in order with ``slack`` more than the window needs,
  so a round's rejected rows can be dropped; attention still sees exactly the model's window;
- ``state``: recurrent state (``ArraysCache``: gated-delta, Mamba/SSM, short convolutions) has no
  rows to drop. Its arrays from before the verify are put back and advanced by the kept rows only
  (``Rollback``: replaying the layers' recurrent mixers on their inputs captured in the verify, a
  second forward of the kept rows, or states kept per row during the verify);
- ``CacheList`` combines them per sub-cache.

Anything else is refused when the pair loads (``plan``), with one line naming the layer's cache.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import Any, Iterator

import mlx.core as mx

from blockwidth.engine.attention import mark_off_step
from blockwidth.policy.errors import BlockwidthError


class RewindError(BlockwidthError, ValueError):
    """The cache cannot drop the rows it was asked to; the message says which model and cache."""


class CacheKindError(BlockwidthError, ValueError):
    """A layer's cache kind that no rewind here handles: refused at load, the message names it."""


class How(str, Enum):
    """How a layer's cache drops the rows a verify rejected."""

    TRIM = "trim"
    WINDOW = "window"
    STATE = "state"


HOW_WORDS = {How.TRIM: "trimmed", How.WINDOW: "windowed with slack for a round's rejected rows",
             How.STATE: "restored and advanced by the kept rows"}


class Method(str, Enum):
    """How recurrent state is advanced by the kept rows after a verify (decided by measurement:
    docs/families.md)."""

    REPLAY = "replay"  # the recurrent mixers again, on their inputs captured in the verify
    REFORWARD = "reforward"  # a second target forward of the kept rows
    PER_ROW = "per-row"  # the verify runs the recurrent mixers row by row, keeping every row's state


DEFAULT_METHOD = Method.REPLAY


# ---------------------------------------------------------------------------------------------
# Kinds


def how(c: Any) -> How | tuple:
    """The rewind of one layer's cache object (a tuple of them for a CacheList); CacheKindError
    when none applies."""
    from mlx_lm.models import cache as mc

    name = type(c).__name__
    if isinstance(c, WindowCache):
        return How.WINDOW
    if isinstance(c, mc.CacheList):
        return tuple(how(s) for s in c.caches)
    if isinstance(c, mc.RotatingKVCache):
        if c.keep:
            raise CacheKindError(f"RotatingKVCache with keep={c.keep} (attention sinks kept at the "
                                 "front): its rows cannot be dropped in order")
        return How.WINDOW
    if isinstance(c, mc.ArraysCache):
        return How.STATE
    if isinstance(c, (mc.KVCache, mc.QuantizedKVCache, mc.ConcatenateKVCache, mc.ChunkedKVCache)):
        return How.TRIM
    why = ("it is not trimmable (mlx-lm says so) and its state is not a set of arrays this "
           "engine can restore" if hasattr(c, "is_trimmable") else "it is not a cache kind mlx-lm "
           "0.32 defines")
    raise CacheKindError(f"{name}: {why}")


def _flat(h) -> list[How]:
    return [x for s in h for x in _flat(s)] if isinstance(h, tuple) else [h]


@dataclass(frozen=True)
class CachePlan:
    """Per layer: the cache kind's name and how it rewinds; ``window`` the smallest sliding window."""

    kinds: tuple[str, ...]
    hows: tuple
    window: int | None

    @property
    def recurrent(self) -> bool:
        return any(h is How.STATE for x in self.hows for h in _flat(x))

    def summary(self) -> list[dict]:
        """One entry per cache kind: name, layers, how it rewinds (for inspect and records)."""
        out: dict[str, dict] = {}
        for kind, h in zip(self.kinds, self.hows):
            words = " + ".join(HOW_WORDS[x] for x in _flat(h))
            e = out.setdefault(kind, {"kind": kind, "layers": 0, "rewind": words})
            e["layers"] += 1
        return list(out.values())

    def describe(self) -> str:
        return "; ".join(f"{e['kind']} x{e['layers']}: {e['rewind']}" for e in self.summary())


def _kind_name(c: Any) -> str:
    from mlx_lm.models import cache as mc

    if isinstance(c, mc.CacheList):
        return "CacheList(" + ", ".join(_kind_name(s) for s in c.caches) + ")"
    return type(c).__name__


def plan(model: Any, what: str = "the target") -> CachePlan:
    """Classify ``model``'s caches (as mlx-lm makes them), or CacheKindError naming the first
    layer no rewind handles."""
    from mlx_lm.models import cache as mc

    try:
        caches = mc.make_prompt_cache(model)
    except Exception as e:  # a model whose make_cache itself fails cannot decode at all
        raise CacheKindError(f"{what}: mlx-lm cannot make its cache ({type(e).__name__}: {e})") from None
    hows, windows = [], []
    for i, c in enumerate(caches):
        try:
            hows.append(how(c))
        except CacheKindError as e:
            raise e.adding(before=f"{what}'s layer {i} cache is ",
                           text="; speculative decoding would keep rejected drafts, so this model is refused") from None
        for s in (c.caches if isinstance(c, mc.CacheList) else (c,)):
            if isinstance(s, mc.RotatingKVCache):
                windows.append(s.max_size)
    return CachePlan(tuple(_kind_name(c) for c in caches), tuple(hows), min(windows, default=None))


# ---------------------------------------------------------------------------------------------
# The sliding window with slack


class WindowCache:
    """A sliding-window KV cache that keeps its rows in order, ``slack`` more than the window needs.

    mlx-lm's RotatingKVCache writes in a ring once it is full, so the rows of a rejected draft
    overwrite rows that are still needed and cannot be dropped. Here the rows live in order in a
    buffer that is compacted (the oldest dropped) only when it fills, always keeping the last
    ``window - 1 + slack`` rows: a rejected tail of up to ``slack`` rows is dropped by moving the
    end back. Each forward is given only the rows its queries may see (the last ``window - 1``
    before it, and its own), and a mask for the window when several rows are queried, so the
    attention sees exactly what mlx-lm's window does.
    """

    step = 256

    def __init__(self, window: int, slack: int, off_step_buffer: bool = False):
        self.window = window
        self.off_step = bool(off_step_buffer)  # the exact path's: see make_cache
        self.max_size = window  # what code written for RotatingKVCache reads as the window
        self.keep = 0
        self.slack = max(int(slack), 1)
        self.keys = None
        self.values = None
        self.offset = 0  # positions seen (RoPE offset): absolute
        self.start = 0  # absolute position of the buffer's first row

    def _rows(self) -> int:
        return self.offset - self.start

    def _visible(self) -> int:
        """Rows before the next query that it may see."""
        return min(self._rows(), self.window - 1)

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        S = keys.shape[2]
        used = self._rows()
        if self.keys is None or used + S > self.keys.shape[2]:
            kept = min(used, self.window - 1 + self.slack)
            size = (off_step(kept + S, self.step) if self.off_step
                    else (kept + S + self.step - 1) // self.step * self.step)
            B, H, _, Dk = keys.shape
            new_k = mx.zeros((B, H, size, Dk), keys.dtype)
            new_v = mx.zeros((B, H, size, values.shape[3]), values.dtype)
            if self.keys is not None and kept:
                new_k[..., :kept, :] = self.keys[..., used - kept:used, :]
                new_v[..., :kept, :] = self.values[..., used - kept:used, :]
            self.keys, self.values = new_k, new_v
            self.start = self.offset - kept
            used = kept
        self.keys[..., used:used + S, :] = keys
        self.values[..., used:used + S, :] = values
        lo = max(0, used - (self.window - 1))
        self.offset += S
        k = self.keys[..., lo:used + S, :]
        if self.off_step:
            mark_off_step(k)
        return k, self.values[..., lo:used + S, :]

    def make_mask(self, N: int, window_size: int | None = None, return_array: bool = False):
        from mlx_lm.models.base import create_causal_mask

        from blockwidth.engine.attention import WindowMask, exact_active

        w = min(window_size or self.window, self.window)
        seen = self._visible()
        # On the exact path (engine.exact) the window goes to the rows kernel as a WindowMask,
        # which reads each row's keys as a 1-row step does; elsewhere an array mask, as mlx-lm's.
        exact = exact_active() and not return_array
        if N > 1:
            if seen + N > w or return_array:
                return WindowMask(w) if exact else create_causal_mask(N, seen, window_size=w)
            return "causal"
        if seen + 1 > w:  # a model window smaller than this cache's
            return WindowMask(w) if exact else create_causal_mask(1, seen, window_size=w)
        return None

    def is_trimmable(self) -> bool:
        return True

    def can_trim(self, n: int) -> bool:
        rows = self._rows() - n
        return n <= self.offset and (self.start == 0 or rows >= self.window - 1)

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        if not self.can_trim(n):
            raise RewindError(f"sliding-window cache: dropping {n} rows would leave "
                              f"{self._rows() - n} of the {self.window - 1} the window needs "
                              f"(slack {self.slack})")
        self.offset -= n
        return n

    def size(self) -> int:
        return min(self._rows(), self.window)

    @property
    def state(self):
        return self.keys, self.values

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


def _off_step_kv():
    """mlx-lm's KVCache with its buffer never a multiple of 256 rows (built on first use, so that
    importing this module does not import mlx-lm)."""
    global _OffStep
    if _OffStep is None:
        from mlx_lm.models.cache import KVCache

        class OffStepKVCache(KVCache):
            """KVCache whose buffer holds one row past a multiple of ``step``: MLX's CUDA 1-row
            attention then always takes its vector kernel, whose arithmetic depends on the keys
            a row sees and nothing else (engine.attention, STOCK_KEYS). The rows it hands out are
            marked as such for the exact path's dispatcher."""

            def update_and_fetch(self, keys, values):
                prev, S = self.offset, keys.shape[2]
                if self.keys is None or prev + S > self.keys.shape[2]:
                    B, H, _, Dk = keys.shape
                    size = off_step(prev + S, self.step)
                    new_k = mx.zeros((B, H, size, Dk), keys.dtype)
                    new_v = mx.zeros((B, H, size, values.shape[3]), values.dtype)
                    if self.keys is not None and prev:
                        new_k[..., :prev, :] = self.keys[..., :prev, :]
                        new_v[..., :prev, :] = self.values[..., :prev, :]
                    self.keys, self.values = new_k, new_v
                self.offset += S
                self.keys[..., prev:self.offset, :] = keys
                self.values[..., prev:self.offset, :] = values
                k, v = self.keys_and_values()
                mark_off_step(k)
                return k, v

        _OffStep = OffStepKVCache
    return _OffStep


_OffStep = None


def only_off_step_kv(cache: list) -> bool:
    """Whether every layer's cache is the exact path's off-step KVCache: no window (a window
    cache may hand a 1-row step a mask once it is full) and no recurrent state, so a 1-row step's
    attention is the same call at every length (engine.decode.classic drops the dispatcher only
    then)."""
    kind = _off_step_kv()
    return bool(cache) and all(type(c) is kind for c in cache)


def off_step(rows: int, step: int = 256) -> int:
    """A buffer size for ``rows`` rows: the next multiple of ``step``, plus one row, so never a
    multiple of 256 (where MLX's CUDA 1-row attention may turn to cuDNN)."""
    return (rows + step - 1) // step * step + 1


def make_cache(model: Any, slack: int, off_step_buffers: bool = False) -> list:
    """mlx-lm's cache for ``model``, every sliding window given ``slack`` rows beyond it.
    ``off_step_buffers`` (the exact path's caches): every KV buffer one row past a multiple of
    256, so MLX's 1-row attention on CUDA is its vector kernel at every length (off_step)."""
    from mlx_lm.models import cache as mc

    def swap(c):
        if isinstance(c, mc.CacheList):
            c.caches = tuple(swap(s) for s in c.caches)
            return c
        if isinstance(c, mc.RotatingKVCache) and not isinstance(c, WindowCache):
            how(c)  # keep > 0 is refused
            return WindowCache(c.max_size, slack, off_step_buffers)
        if off_step_buffers and type(c) is mc.KVCache:
            return _off_step_kv()()
        return c

    return [swap(c) for c in mc.make_prompt_cache(model)]


# ---------------------------------------------------------------------------------------------
# Marks: where each layer stood


def _leaves(cache: list) -> list:
    from mlx_lm.models import cache as mc

    out = []
    for c in cache:
        out.extend(_leaves(list(c.caches)) if isinstance(c, mc.CacheList) else [c])
    return out


def _is_state(c: Any) -> bool:
    from mlx_lm.models import cache as mc

    return isinstance(c, mc.ArraysCache)


@dataclass
class Mark:
    """Each leaf cache's offset (rows) or its state arrays (recurrent), at one moment."""

    offsets: list
    states: list


def mark(leaves: list) -> Mark:
    offsets, states = [], []
    for c in leaves:
        if _is_state(c):
            offsets.append(None)
            # the arrays are replaced, never written in place, by every mlx-lm mixer: a list of
            # the references is a snapshot
            states.append((list(c.cache), c.lengths, c.left_padding))
        else:
            offsets.append(c.offset)
            states.append(None)
    return Mark(offsets, states)


def restore(leaves: list, m: Mark, what: str = "the target") -> None:
    """Every leaf back to ``m``: KV caches trimmed to their offsets, recurrent arrays put back."""
    for c, off, st in zip(leaves, m.offsets, m.states):
        if st is not None:
            c.cache, c.lengths, c.left_padding = list(st[0]), st[1], st[2]
        elif c.offset > off:
            n = c.offset - off
            try:
                done = c.trim(n)
            except RewindError as e:
                raise e.adding(before=f"{what}'s ") from None
            if done != n:
                raise RewindError(f"{what}'s {type(c).__name__} dropped {done} of {n} rows")


def rewind(cache: list, n: int, what: str = "the target") -> None:
    """Drop the last ``n`` rows of every layer of a cache that holds rows only (KV caches, windows),
    or RewindError with nothing dropped: recurrent state has no rows to drop (``Rollback``
    restores it), and mlx-lm's RotatingKVCache cannot drop rows once past its window."""
    if n <= 0:
        return
    leaves = _leaves(cache)
    for c in leaves:
        if _is_state(c):
            raise RewindError(f"{what}'s {type(c).__name__} holds recurrent state, which has no rows "
                              "to drop: it is restored and advanced instead (engine.kvcache.Rollback)")
        ok = c.can_trim(n) if isinstance(c, WindowCache) else getattr(c, "is_trimmable", lambda: False)()
        if not ok:
            window = f"a sliding window of {c.max_size} past its size" if hasattr(c, "max_size") else "it"
            raise RewindError(f"{what}'s {type(c).__name__} cannot drop {n} rejected rows: {window} "
                              "cannot rewind, so speculative decoding would keep rejected drafts")
    for c in leaves:
        c.trim(n)


# ---------------------------------------------------------------------------------------------
# Taps on the recurrent mixers


_TAPPED: dict[type, type] = {}
_HOOKS: dict[int, Any] = {}
# Per model (by id, checked against a weak reference): which module each recurrent leaf cache (by
# its index among the leaves) is handed to, found in a first verify and kept for later runs.
_FOUND: dict[int, tuple[Any, dict[int, Any]]] = {}


def _tap_class(cls: type) -> type:
    sub = _TAPPED.get(cls)
    if sub is None:
        def __call__(self, *args, **kwargs):
            hook = _HOOKS.get(id(self))
            if hook is None:
                return cls.__call__(self, *args, **kwargs)
            return hook(self, cls, args, kwargs)

        sub = type(f"Rewound{cls.__name__}", (cls,), {"__call__": __call__})
        _TAPPED[cls] = sub
    return sub


def _rows_of(x: Any, rows: int, lo: int, hi: int) -> Any:
    """``x`` cut to rows lo:hi when it is a per-row array of this call (axis 1 of length rows)."""
    if isinstance(x, mx.array) and x.ndim >= 2 and x.shape[1] == rows:
        return x[:, lo:hi]
    return x


def _cut(args: tuple, kwargs: dict, rows: int, lo: int, hi: int) -> tuple[tuple, dict]:
    return (tuple(_rows_of(a, rows, lo, hi) for a in args),
            {k: _rows_of(v, rows, lo, hi) for k, v in kwargs.items()})


def _join(outs: list) -> Any:
    first = outs[0]
    if isinstance(first, mx.array):
        return mx.concatenate(outs, axis=1) if first.ndim >= 2 else first
    if isinstance(first, tuple):
        return tuple(_join([o[i] for o in outs]) for i in range(len(first)))
    return outs[-1]


# ---------------------------------------------------------------------------------------------
# mlx-lm's gated-delta recurrence, where it runs as ops (every backend but Metal)


def _gated_delta():
    try:
        from mlx_lm.models import gated_delta
    except ImportError:  # an mlx-lm without it: replay runs the recurrence again
        return None
    return gated_delta if hasattr(gated_delta, "_gated_delta_step_ops") else None


def _recording_ops(g, sink: list):
    """mlx-lm's ``gated_delta_ops`` (the same step function, in the same order), also keeping the
    state after every step in ``sink``: a replay then takes the kept rows' state from the verify
    instead of running the recurrence again."""
    def ops(q, k, v, gate, beta, state=None, mask=None):
        B, T, Hk, Dk = q.shape
        Hv, Dv = v.shape[-2:]
        if state is None:
            state = mx.zeros((B, Hv, Dv, Dk), dtype=mx.float32)
        if (repeat := Hv // Hk) > 1:
            q = mx.repeat(q, repeat, -2)
            k = mx.repeat(k, repeat, -2)
        ys, states = [], []
        for t in range(T):
            y, state = g._gated_delta_step_ops(q[:, t], k[:, t], v[:, t], gate[:, t], beta[:, t],
                                               state, None if mask is None else mask[:, t])
            ys.append(y)
            states.append(state)
        sink.append(states)
        return mx.stack(ys, axis=1), state
    return ops


def _recorded_ops(states: list):
    """In a replay of T kept rows: the verify's state after row T, no recurrence (its output is
    never evaluated: nothing the cache holds depends on it)."""
    def ops(q, k, v, gate, beta, state=None, mask=None):
        B, T = q.shape[:2]
        Hv, Dv = v.shape[-2:]
        return mx.zeros((B, T, Hv, Dv), dtype=q.dtype), states[T - 1]
    return ops


# ---------------------------------------------------------------------------------------------
# The rollback of one cache list


class Rollback:
    """Rewinds one model's cache list round by round: ``verify(block)`` around the verify forward
    (snapshot, and the method's capture), then ``commit(kept)`` with the rows that stay.

    Only caches with recurrent state need more than a trim: their arrays from before the verify
    are put back and advanced by the kept rows, by ``method``. A recurrent cache whose mixer (the
    module the layer hands its cache to) cannot be found falls back to a second forward."""

    def __init__(self, model: Any, cache: list, method: Method | str = DEFAULT_METHOD,
                 what: str = "the target"):
        self.model = model
        self.cache = cache
        self.what = what
        self.leaves = _leaves(cache)
        self.states = [c for c in self.leaves if _is_state(c)]
        self.method = Method(method) if self.states else None
        self._state_ids = {id(c): c for c in self.states}
        self._mixers: dict[int, Any] | None = None  # cache id -> the module it is handed to
        found = _FOUND.get(id(model))
        if found is not None and found[0]() is model:
            index = {i: c for i, c in enumerate(self.leaves)}
            if set(found[1]) == {i for i, c in index.items() if _is_state(c)}:
                self._mixers = {id(index[i]): m for i, m in found[1].items()}
        self._mark: Mark | None = None
        self._block: mx.array | None = None
        self._rows = 0
        self._calls: list[tuple] = []  # replay: (module, class, cache, args, kwargs, rows) per call
        self._per_row: dict[int, list] = {}  # per-row: cache id -> state after each row
        self.fallback = ""  # why a reforward replaced the chosen method, if it did

    @property
    def effective(self) -> Method | None:
        return Method.REFORWARD if self.fallback else self.method

    # -- the verify ---------------------------------------------------------------------------

    @contextmanager
    def verify(self, block: mx.array) -> Iterator[None]:
        """Around the verify forward of ``block`` (its rows, 1-D)."""
        self._mark = mark(self.leaves)
        self._block = block
        self._rows = int(block.size)
        self._calls, self._per_row = [], {}
        if self.method in (None, Method.REFORWARD) or self.fallback:
            yield
            return
        modules = self._candidates()
        saved = []
        for m in modules:
            saved.append((m, type(m)))
            _HOOKS[id(m)] = self._hook
            m.__class__ = _tap_class(type(m))
        self._inside = False
        self._seen: dict[int, Any] = {}
        self._steps: dict[int, list] = {}  # cache id -> per-step states of its recurrence calls
        g = _gated_delta() if self.method is Method.REPLAY else None
        ops = g.gated_delta_ops if g is not None else None
        if g is not None:
            self._sink: list = []
            g.gated_delta_ops = _recording_ops(g, self._sink)
        try:
            yield
        finally:
            if g is not None:
                g.gated_delta_ops = ops
            for m, cls in saved:
                m.__class__ = cls
                _HOOKS.pop(id(m), None)
        if self._mixers is None:
            if len(self._seen) == len(self.states):
                self._mixers = dict(self._seen)
                where = {id(c): i for i, c in enumerate(self.leaves)}
                _FOUND[id(self.model)] = (weakref.ref(self.model),
                                          {where[k]: m for k, m in self._mixers.items()})
            else:
                self.fallback = (f"{len(self.states) - len(self._seen)} recurrent cache(s) are never "
                                 "handed to a module on their own (read inside a CacheList): a "
                                 "second forward advances them")

    def _candidates(self) -> list:
        """The modules to tap: the ones found in the first verify, or until then every module of
        the model (the outermost one handed a recurrent cache is its layer or its mixer: a replay
        evaluates only what the state depends on, so either costs the same)."""
        if self._mixers is not None:
            return list({id(m): m for m in self._mixers.values()}.values())
        out, seen = [], set()
        for _, m in self.model.named_modules():
            if m is not self.model and id(m) not in seen:
                seen.add(id(m))
                out.append(m)
        return out

    def _hook(self, module, cls, args, kwargs):
        c = next((a for a in (*args, *kwargs.values()) if id(a) in self._state_ids), None)
        if c is None or self._inside:
            return cls.__call__(module, *args, **kwargs)
        self._seen[id(c)] = module
        rows = self._rows  # the verify's rows: axis 1 of every per-row argument
        self._inside = True
        try:
            if self.method is Method.PER_ROW and rows and rows > 1:
                states, outs = [], []
                for t in range(rows):
                    a, k = _cut(args, kwargs, rows, t, t + 1)
                    outs.append(cls.__call__(module, *a, **k))
                    states.append((list(c.cache), c.lengths, c.left_padding))
                self._per_row[id(c)] = states
                return _join(outs)
            self._calls.append((module, cls, c, args, kwargs, rows))
            sink = getattr(self, "_sink", None)
            before = len(sink) if sink is not None else 0
            out = cls.__call__(module, *args, **kwargs)
            if sink is not None:
                new = sink[before:]
                # one recurrence of this call's rows: its states stand in for a second one
                self._steps[id(c)] = new[0] if len(new) == 1 and len(new[0]) == rows else None
            return out
        finally:
            self._inside = False

    # -- the commit ---------------------------------------------------------------------------

    def commit(self, kept: int) -> float:
        """Keep the verify's first ``kept`` rows; returns the seconds it took (the recurrent
        work evaluated, so the time is the rollback's own)."""
        t0 = time.perf_counter()
        k, m = self._rows, self._mark
        self._mark = None
        if m is None or kept >= k:
            return 0.0
        if not self.states:
            restore(self.leaves, _partial(m, self.leaves, k - kept), self.what)
            return time.perf_counter() - t0
        method = self.effective
        if method is Method.REFORWARD:
            restore(self.leaves, m, self.what)
            self.model(self._block[None, :kept], cache=self.cache)
        else:
            restore(self.leaves, _partial(m, self.leaves, k - kept), self.what)
            if method is Method.PER_ROW and self._per_row:
                for c in self.states:
                    st = self._per_row.get(id(c))
                    if st is not None:
                        c.cache, c.lengths, c.left_padding = list(st[kept - 1][0]), st[kept - 1][1], st[kept - 1][2]
            else:
                g = _gated_delta()
                for module, cls, c, args, kwargs, rows in self._calls:
                    a, kw = _cut(args, kwargs, rows, 0, kept) if rows else (args, kwargs)
                    steps = getattr(self, "_steps", {}).get(id(c))
                    if g is None or not steps:
                        cls.__call__(module, *a, **kw)
                        continue
                    ops, g.gated_delta_ops = g.gated_delta_ops, _recorded_ops(steps)
                    try:
                        cls.__call__(module, *a, **kw)
                    finally:
                        g.gated_delta_ops = ops
        mx.eval([c.cache for c in self.states])
        self._calls, self._per_row, self._steps = [], {}, {}
        return time.perf_counter() - t0


def _partial(m: Mark, leaves: list, drop: int) -> Mark:
    """A mark for the KV leaves at their current offsets less ``drop`` rows, recurrent state at
    ``m`` (put back before it is advanced)."""
    offsets = [None if o is None else c.offset - drop for c, o in zip(leaves, m.offsets)]
    return Mark(offsets, m.states)


def plan_config(config: dict) -> CachePlan:
    """The cache plan of the model mlx-lm builds for ``config``, without its weights (the model's
    parameters stay unevaluated); CacheKindError when mlx-lm cannot build it or a kind is refused."""
    import json

    from mlx_lm.utils import _get_classes

    if not config.get("model_type"):
        raise CacheKindError("config.json names no model_type: mlx-lm cannot build it")
    try:
        model_class, args_class = _get_classes(config)
        model = model_class(args_class.from_dict(json.loads(json.dumps(config))))
    except Exception as e:
        text = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        raise CacheKindError(f"mlx-lm cannot build model_type {config.get('model_type')!r} ({text})") from None
    return plan(model, "the model")
