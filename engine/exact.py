"""The exact path: greedy speculative output byte for byte classic's, on every backend.

Greedy speculative decoding is lossless only if a ``width``-row verify computes, for each of its
rows, exactly what a 1-row step computes. On a CPU MLX does (the exactness probe shows it in every
session). On CUDA stock kernels do not: a quantized matmul of 1-7 rows (MLX's ``qmv``, one row at
a time) differs from one of 8+ (``qmm``), a bfloat16 matmul of 1 row (gemv) from one of 2+
(cuBLAS), and fused attention across row counts (cuDNN), so greedy output flips at near-ties and
no width can be saved (a real SmolLM2 on the H200: every width differed from classic).

The exact path makes every forward of 1..``MAX_ROWS`` rows against a cache, classic's 1-row
steps and the verify alike, row-invariant, by one of three routes (engine.linear.EXACT_ROUTES):

- ``mlx``: classic's steps keep MLX's own kernels and each verify row is computed as its 1-row
  step: affine quantized projections in MLX calls of at most 7 rows (its qmv, row-invariant below
  8), 16-bit ones through gather_mv (gemv's per-row code), attention by MLX's own 1-row call on the
  row's keys while they number below engine.attention.STOCK_KEYS (where MLX's 1-row attention is
  its vector kernel, never cuDNN), from there the ``rows`` kernel, classic's steps included;
- ``kernels``: every projection on engine.qmv's kernel (affine 4/8-bit, groups 32/64/128, a tied
  quantized head's ``as_linear`` too) or engine.linear's gemv kernel (16-bit), 9..16 rows in two
  calls; attention on the ``rows`` kernel (sliding windows as a WindowMask);
- ``hybrid``: the projections as ``mlx``, attention on the ``rows`` kernel at every length,
  classic's steps included: a verify's attention is one call a layer, not one a row;
- ``auto`` (the default): :func:`choose_route` times each on the target before a session and
  keeps the cheaper (MLX's own kernels keep a host-bound target's classic at stock cost; the
  engine's read a large target's weights once for every verify row).

What the path does not cover is named, never assumed exact: :func:`plan` reads the model and its
caches before a session and says, per op, what is not covered (MoE expert gathers, recurrent state
updates, attention sinks, quantized KV caches, float32 or mxfp/nvfp weights, a family whose other
ops no probe has checked). ``--exact auto`` (the default) takes the path on CUDA where every op is
covered and says why not elsewhere; ``on`` takes it where it can and marks the session "not
exact" with the ops named; ``off`` never. Rows past ``MAX_ROWS`` (prefill chunks) stay on stock
kernels: every arm prefills the same prompt the same way.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterator

from blockwidth.policy.errors import BlockwidthError

MAX_ROWS = 16  # engine.attention.EXACT_MAX_ROWS and engine.linear.EXACT_MAX_ROWS
PREFILL_STEP = 512  # on the path, classic prefills in the chunks speculative decoding does



class ExactError(BlockwidthError, ValueError):
    """A bad ``--exact`` value: the message names the choices."""


class Exact(str, Enum):
    AUTO = "auto"
    ON = "on"
    OFF = "off"


CHOICES = tuple(m.value for m in Exact)

# Families whose forwards, past the projections and attention this path routes, are made of ops
# the H200 probe found row-invariant (RMSNorm, RoPE with an offset, SiLU/GELU, residual adds,
# embedding lookups, the greedy argmax) and nothing else row-dependent: lab/probe_exact.py.
FAMILIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma3", "smollm3",
                      "olmo2", "granite", "phi3", "starcoder2", "cohere"})


def parse(value: str | Exact | None) -> Exact:
    if value is None:
        return Exact.AUTO
    if isinstance(value, Exact):
        return value
    try:
        return Exact(str(value).strip().lower())
    except ValueError:
        raise ExactError(f"exact {value!r}: expected one of {', '.join(CHOICES)}") from None


@dataclass(frozen=True)
class Plan:
    """Whether a session's forwards take the exact path, and why (one line)."""

    asked: Exact
    backend: str
    active: bool  # the routing is on for every 1..MAX_ROWS-row forward, classic's included
    exact: bool  # what the identity of a width with classic rests on: row-invariant kernels
    reason: str
    uncovered: tuple[str, ...] = ()  # ops the path does not make row-invariant, named
    route: str = "mlx"  # engine.linear.EXACT_ROUTES: how the path keeps rows row-invariant
    # choose_route's measurement: ((route, 1-row ms, ROUTE_ROWS-row ms), ...)
    route_costs: tuple = ()

    def to_dict(self) -> dict:
        out = {"asked": self.asked.value, "backend": self.backend, "active": self.active,
               "exact": self.exact, "reason": self.reason, "uncovered": list(self.uncovered),
               "max_rows": MAX_ROWS, "route": self.route}
        if self.route_costs:
            out["route_costs"] = {r: {"1": a, str(ROUTE_ROWS): b} for r, a, b in self.route_costs}
        return out

    def width_note(self, width: int) -> str | None:
        """Why ``width``'s verify is not on the path (wider than it covers), else None."""
        if self.active and width > MAX_ROWS:
            return f"width {width}: not exact, its verify is wider than the {MAX_ROWS} rows the path covers"
        return None


def _mlx_attention_words(model: Any) -> str:
    """How the mlx route computes this model's attention, in the plan's reason."""
    from blockwidth.engine.attention import VECTOR_HEADS

    head = _head_dim(getattr(model, "args", None))
    if head is not None and head not in VECTOR_HEADS:
        return f"attention of head size {head} on the rows kernel, which MLX's 1-row vector kernel does not take"
    return ("attention MLX's 1-row call at every length on the path's KV buffers, kept off multiples "
            "of 256 so that it is never cuDNN's")


def _dtype(a) -> str:
    return str(a.dtype).rsplit(".", 1)[-1]


def uncovered_ops(model: Any, cache: list | None = None, route: str = "mlx") -> list[str]:
    """What in ``model`` (and its ``cache``, mlx-lm's per-layer objects) the exact path cannot
    make row-invariant on CUDA by ``route``, one phrase an op kind; empty when every op is covered.
    Reads the modules' types, dtypes and shapes only: no forward, no device."""
    import mlx.nn as nn

    from blockwidth.engine import qmv
    from blockwidth.engine.linear import MLX_PROJECTION_ROUTES, mlx_quant_refusal

    out: dict[str, None] = {}
    args = getattr(model, "args", None)
    family = getattr(args, "model_type", None) or type(model).__module__.rsplit(".", 1)[-1]
    if family not in FAMILIES:
        out[f"the {family} family's other ops (norms, activations, positions) are not probed"] = None
    for name, m in model.named_modules():
        kind = type(m).__name__
        if "Switch" in kind or "MoE" in kind or "Expert" in kind:
            out[f"mixture-of-experts layers ({kind}: expert gathers)"] = None
        elif type(m) in (nn.QuantizedLinear, nn.QuantizedEmbedding):
            w, s = m["weight"], m["scales"]
            k = w.shape[-1] * 32 // m.bits if w.ndim == 2 else 0
            dt = _dtype(s)
            mode = getattr(m, "mode", "affine")
            if route in MLX_PROJECTION_ROUTES:
                why = mlx_quant_refusal(mode, m.bits, m.group_size)
                if why is not None:
                    out[f"quantized projections ({why})"] = None
                continue
            why = qmv.refusal("cuda", mode, m.bits, m.group_size, 1, dt, dt,
                              m.get("biases") is not None, k, tuple(w.shape), min_rows=1)
            if why is not None:
                out[f"quantized projections ({qmv.REASONS[why]})"] = None
        elif type(m) in (nn.Linear, nn.Embedding):
            w = m["weight"]
            if _dtype(w) not in ("bfloat16", "float16"):
                out[f"{_dtype(w)} projections (the gemv kernel takes bfloat16 and float16)"] = None
            elif w.ndim != 2 or w.shape[1] % 8:
                out["16-bit projections whose input width is not a multiple of 8"] = None
        elif "sinks" in m:
            out["attention sinks"] = None
    head = _head_dim(args)
    if head is not None and not (head % 32 == 0 and 32 <= head <= 256):
        out[f"attention of head size {head} (the rows kernel takes multiples of 32 up to 256)"] = None
    from mlx_lm.models import cache as mc

    for c in cache or []:
        for leaf in _leaves(c):
            kind = type(leaf).__name__
            if isinstance(leaf, mc.QuantizedKVCache) or hasattr(leaf, "bits"):
                out[f"a quantized KV cache ({kind})"] = None
            elif isinstance(leaf, mc.ArraysCache):
                out[f"recurrent state updates ({kind})"] = None
    return list(out)


def _leaves(c) -> list:
    caches = getattr(c, "caches", None)
    if caches is not None:
        return [x for s in caches for x in _leaves(s)]
    return [c]


def _head_dim(args) -> int | None:
    if args is None:
        return None
    head = getattr(args, "head_dim", None)
    if head:
        return int(head)
    hidden, heads = getattr(args, "hidden_size", None), getattr(args, "num_attention_heads", None)
    return int(hidden) // int(heads) if hidden and heads else None


def plan(model: Any, asked: str | Exact | None = None, backend: str | None = None,
         cache: list | None = None, route: str | None = None) -> Plan:
    """Whether ``model``'s session takes the exact path on ``backend`` (probed when None), and by
    which ``route`` (engine.linear.exact_route: the argument, else BLOCKWIDTH_EXACT_ROUTE)."""
    from blockwidth.engine.attention import current_backend
    from blockwidth.engine.linear import exact_route

    asked = parse(asked)
    try:
        route = exact_route(route)
    except ValueError as e:  # a bad BLOCKWIDTH_EXACT_ROUTE: one clear line, not a traceback
        raise ExactError(str(e)) from None
    backend = backend or current_backend()
    if asked is Exact.OFF:
        return Plan(asked, backend, False, backend == "cpu",
                    "off, as asked: stock kernels" + (" (row-invariant on a CPU)" if backend == "cpu" else ""),
                    route=route)
    if backend == "cpu":
        return Plan(asked, backend, False, True,
                    "nothing to route: on a CPU MLX's kernels give a K-row verify bitwise equal to K "
                    "single steps (the exactness probe checks it every session)", route=route)
    if backend != "cuda":
        return Plan(asked, backend, False, False,
                    f"{backend}: the path's kernels are CUDA source; the exactness probe says what "
                    "this backend's verify does", route=route)
    if cache is None:
        from blockwidth.engine.kvcache import make_cache

        try:
            cache = make_cache(model, slack=1)
        except Exception:  # a cache kind no rewind takes: the pair refuses it elsewhere
            cache = None
    missing = tuple(uncovered_ops(model, cache, "mlx" if route == "auto" else route))
    if not missing:
        per_row = f"each row of a verify of up to {MAX_ROWS} computed as its 1-row step"
        how = {"mlx": f"classic's steps on MLX's own kernels, {per_row} ({_mlx_attention_words(model)})",
               "auto": "the route (MLX's own kernels, the engine's, or MLX's projections with the engine's "
                       "attention) measured before the session",
               "hybrid": f"projections on MLX's own kernels, {per_row}; attention on the rows kernel at "
                         "every length, classic's steps included",
               "kernels": f"every forward of 1..{MAX_ROWS} rows on row-invariant kernels (qmv, gemv, rows "
                          "attention), classic's steps included"}[route]
        return Plan(asked, backend, True, True, f"on: {how}", route=route)
    if asked is Exact.AUTO:
        return Plan(asked, backend, False, False, "off (auto): not covered: " + "; ".join(missing), missing,
                    route=route)
    return Plan(asked, backend, True, False,
                "on, but not exact: not covered: " + "; ".join(missing), missing, route=route)


ROUTE_ROWS = 4  # choose_route prices a route by its 1-row step plus its verify of this many rows
# The routes auto times, in this order (a tie keeps the first): MLX's own kernels, MLX's
# projections with the engine's attention, the engine's kernels throughout.
ROUTE_ORDER = ("mlx", "hybrid", "kernels")


def choose_route(model: Any, p: Plan, measure=None, lockstep=None) -> Plan:
    """``p`` with its route settled. Under ``auto`` on CUDA, each route is timed on ``model``
    (a 1-row step and a ROUTE_ROWS-row verify, engine.costcurve, cold, a few passes) and the one
    with the smaller sum is taken: MLX's own kernels keep a host-bound target's classic at stock
    speed but price a verify's rows one by one (K attention calls, K weight reads); the engine's
    kernels read the weights once for every row (a 5B-shaped 4-bit target on the H200: a 1-row step
    2.58 ms against MLX's 4.77, 8 rows 1.09x one) but cost a custom-kernel call per projection
    (SmolLM2-135M: classic 0.72x of stock); ``hybrid`` keeps MLX's projections and gives
    attention, classic's included, to the rows kernel: one custom call a layer, and a verify's
    attention one call instead of one a row (on SmolLM2 the mlx route's 2-row verify cost 1.43
    1-row steps on the H200, with draft, sync and rollback under 0.25 ms of it).
    ``measure(model, plan) -> (ms at 1, ms at ROUTE_ROWS)`` (tests pass their own). A route whose ops the path does not cover is not tried.
    Elsewhere auto is ``mlx``."""
    import dataclasses

    if p.route != "auto":
        return p
    if not p.active or p.backend != "cuda":
        return dataclasses.replace(p, route="mlx")
    got = _chosen.get(id(model)) if measure is None else None
    costs = got[1] if got is not None and got[0]() is model else None
    if costs is None:
        costs = []
        for route in ROUTE_ORDER:
            if route != "mlx" and uncovered_ops(model, route=route):
                continue
            one, wide = (measure or _route_cost)(model, dataclasses.replace(p, route=route))
            costs.append((route, round(one, 3), round(wide, 3)))
        if measure is None:  # a model's routes are timed once a process (a console's sessions reuse it)
            import weakref

            _chosen[id(model)] = (weakref.ref(model), costs)
    best = min(costs, key=lambda c: c[1] + c[2])
    why = ", ".join(f"{r} {a:.2f} + {b:.2f} ms" for r, a, b in costs)
    if lockstep is not None:  # a sharded target: every rank runs rank 0's route
        agreed = lockstep.agree(best[0])
        best = next(c for c in costs if c[0] == agreed)
    return dataclasses.replace(p, route=best[0], route_costs=tuple(costs),
                               reason=f"{p.reason}; route {best[0]} (1-row step + {ROUTE_ROWS}-row verify: {why})")


_chosen: dict = {}  # id(model) -> (a weak reference to it, choose_route's costs)


def _route_cost(model: Any, p: Plan) -> tuple[float, float]:
    from blockwidth.engine import costcurve

    cc = costcurve.measure(model, (1, ROUTE_ROWS), context=64, repeats=3, warmup=1, warm=False, exact=p)
    inf = float("inf")  # a point not measured never makes its route look free
    return cc.ms(1) or inf, cc.ms(ROUTE_ROWS) or inf


@dataclass
class PathRouting:
    """What one block of the path routed: the attention's and the projections' routings."""

    attention: Any
    linear: Any
    summary_extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        out = {"attention": self.attention.summary(), "linear": self.linear.summary()}
        inexact = {**{f"attention: {k}": v for k, v in self.attention.inexact.items()},
                   **self.linear.inexact}
        out["inexact_calls"] = inexact
        out["exact"] = not inexact
        out.update(self.summary_extra)
        return out

    def counts(self) -> tuple[int, int, int, int]:
        """Calls so far: attention's, those of them MLX's own 1-row call on an off-step buffer,
        the projections', those of them MLX's own 1-row call (for :meth:`stock_since`)."""
        a, lin = self.attention, self.linear
        return (a.routed + a.passed + a.unrouted + sum(a.inexact.values()), a.off_step_calls,
                lin.routed + lin.passed + sum(lin.inexact.values()), lin.mlx_steps)

    def stock_since(self, before: tuple[int, int, int, int]) -> bool:
        """Whether every call since ``before`` (:meth:`counts`) was MLX's own call as it comes:
        each attention call a 1-row one on an off-step buffer (which cuDNN never takes, so MLX
        runs its vector kernel at any length, and no bound of STOCK_KEYS keys applies later),
        each projection a 1-row one. Then later 1-row steps on the same caches make exactly
        the calls they would make with no dispatcher at all (classic's steps run without it,
        ``undispatched_from`` in the summary)."""
        now = self.counts()
        att, off, lin, mlx = (n - b for n, b in zip(now, before))
        return att > 0 and att == off and lin > 0 and lin == mlx


@contextmanager
def path(p: Plan | None, attention_mode: str | None = None) -> Iterator[PathRouting | None]:
    """Inside this block (this thread only) every 1..MAX_ROWS-row forward takes the exact path
    when ``p`` is active; otherwise nothing changes (yields None). ``attention_mode``: the verify
    attention for what the path leaves (rows past MAX_ROWS against a cache)."""
    if p is None or not p.active:
        yield None
        return
    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.linear import exact_linear

    with verify_attention(attention_mode, exact=True, route=p.route) as att, \
            exact_linear(p.backend, p.route) as lin:
        yield PathRouting(att, lin)


@contextmanager
def undispatched() -> Iterator[None]:
    """Inside a :func:`path` block, this thread's forwards without it: MLX's own calls, with no
    projection dispatcher in front of them where no other thread holds one (the attention
    dispatcher, installed once, passes the call straight on). For a 1-row forward that
    :meth:`PathRouting.stock_since` found making only MLX's own calls on off-step caches
    (engine.kvcache.only_off_step_kv): the same calls, less the dispatcher's Python."""
    from blockwidth.engine import attention, linear

    a, lin = attention._active.set(None), linear._active.set(None)
    linear.uninstall()
    try:
        yield
    finally:
        linear.install()
        linear._active.reset(lin)
        attention._active.reset(a)


class OneRowSteps:
    """1-row forwards on the path (a cost curve's 1-row point, a round that drafts nothing) run as
    exact classic's steps: the first checked on the path, and once one made only MLX's own calls
    on off-step caches (:meth:`PathRouting.stock_since`), the later ones :func:`undispatched`.
    ``routed``: the path's block (None: off the path, nothing to do); ``cache``: the model's."""

    def __init__(self, routed: PathRouting | None, cache: list) -> None:
        from blockwidth.engine.kvcache import only_off_step_kv

        self.routed = routed if routed is not None and only_off_step_kv(cache) else None
        self.bare = False  # later 1-row forwards run undispatched
        self.undispatched = 0  # forwards that ran so

    @contextmanager
    def forward(self, rows: int) -> Iterator[None]:
        """Around a ``rows``-row forward's graph building."""
        if self.routed is None or rows != 1:
            yield
        elif self.bare:
            with undispatched():
                yield
            self.undispatched += 1
        else:
            before = self.routed.counts()
            yield
            self.bare = self.routed.stock_since(before)


def prepare(p: Plan | None, *models) -> dict[str, float]:
    """Before anything is timed: the qmv kernel instances the path needs for ``models``, at every
    row count 1..8 a call can hold (engine.qmv.prepare), so a measured forward never compiles."""
    if p is None or not p.active or p.backend != "cuda" or p.route != "kernels":
        return {}  # the mlx route runs MLX's own projections: nothing of the engine's to compile
    import mlx.nn as nn

    from blockwidth.engine import qmv

    import time

    import mlx.core as mx

    from blockwidth.engine import linear

    done = {}
    dtypes = set()
    for m in models:
        if isinstance(m, nn.Module):
            done.update(qmv.prepare(m, rows=tuple(range(1, qmv.MAX_ROWS + 1))))
            dtypes |= {mod["weight"].dtype for _, mod in m.named_modules()
                       if type(mod) in (nn.Linear, nn.Embedding) and mod["weight"].dtype in (mx.bfloat16, mx.float16)}
    for dt in sorted(dtypes, key=str):  # the gemv kernel: one compile a dtype serves every shape
        name = f"blockwidth_rows_gemv_{str(dt).rsplit('.', 1)[-1]}"
        if name not in _gemv_ready:
            t0 = time.perf_counter()
            mx.eval(linear.gemv_linear(mx.zeros((1, 8), dt), mx.zeros((32, 8), dt)))
            _gemv_ready[name] = time.perf_counter() - t0
        done[name] = _gemv_ready[name]
    return done


_gemv_ready: dict[str, float] = {}  # gemv instances compiled in this process: seconds each took
