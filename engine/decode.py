"""Classic and speculative greedy decoding with an instrumented round loop.

Both loops mirror mlx-lm's ``generate_step`` / ``speculative_generate_step``
arithmetic (same prefill chunks, same greedy sampler, same verify blocks), so
their tokens are the same; what they add is a clock read per round. Prefill is
timed apart from decode. EOS is ignored: runs are fixed-length measurements.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Callable, Protocol

import mlx.core as mx

from blockwidth.engine import exact as exact_path
from blockwidth.engine.attention import VerifyAttention, verify_attention
from blockwidth.engine.drafters import Drafter, greedy, make_drafter, prefill_cache, watching
from blockwidth.engine.kvcache import DEFAULT_METHOD, Method, RewindError, Rollback, make_cache, only_off_step_kv
from blockwidth.engine.linear import VerifyLinear, prepare, verify_linear
from blockwidth.policy.auto import AUTO
from blockwidth.policy.errors import BlockwidthError
from blockwidth.policy.profile import num_draft_tokens


class DecodeError(BlockwidthError, ValueError):
    """Bad decode input: the message names it."""


@dataclass(frozen=True)
class Round:
    """One verify round. On a *split* round the engine synchronised after drafting,
    so draft_s and verify_s are apart; on other rounds (to cost nothing extra, as
    mlx-lm does) draft and verify run as one graph and verify_s holds both."""

    drafted: int
    accepted: int
    emitted: int
    draft_s: float
    verify_s: float
    sync_s: float
    split: bool = True
    # Putting the cache back to the kept rows after the verify (engine.kvcache.Rollback): a trim
    # costs microseconds; recurrent state is restored and advanced, its work evaluated here.
    rollback_s: float = 0.0


@dataclass
class DecodeRun:
    width: int | str | None  # None: classic; "auto" (policy.auto.AUTO): a width per round
    tokens: list[int]
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    rounds: list[Round] = field(default_factory=list)
    attention: dict | None = None  # speculative runs: the verify attention and what it routed
    # The GPU's clocks read just before and after the run by an A/B session (engine.session.host
    # ClockWatch): {"before": {...}, "after": {...}}; None where there is no NVIDIA GPU.
    clocks: dict | None = None
    # The host's share of the run (engine.session.host.host_delta: wall, main-thread and process CPU
    # seconds, stolen seconds, context switches, the CPU at each end), read by an A/B session.
    host: dict | None = None
    # Speculative runs: how the target's cache was rolled back each round (engine.kvcache).
    rollback: dict | None = None
    # An auto-width run (width "auto"): the width of every round, and the controller's record of
    # the run (engine.auto.Run.to_dict: its start state, probes, switches) that replays them.
    widths: list[int] | None = None
    auto: dict | None = None

    @property
    def classic(self) -> bool:
        return self.width is None

    @property
    def linear_routed(self) -> int:
        """Verify projections engine.linear routed in this run (0 for stock and classic runs)."""
        return ((self.attention or {}).get("linear") or {}).get("routed_calls", 0)

    @property
    def decode_tok_s(self) -> float:
        return len(self.tokens) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def e2e_tok_s(self) -> float:
        t = self.prefill_s + self.decode_s
        return len(self.tokens) / t if t > 0 else 0.0

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def speculative_rounds(self) -> int:
        """Rounds that verified at least one drafted token."""
        return sum(1 for r in self.rounds if r.drafted > 0)

    @property
    def declined_rounds(self) -> int:
        """Rounds whose drafter proposed nothing at a speculative width (an auto round at width
        1 drafted nothing by choice: not a decline)."""
        if self.classic:
            return 0
        widths = self.widths or [2] * len(self.rounds)
        return sum(1 for r, w in zip(self.rounds, widths) if r.drafted == 0 and w > 1)

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted(self) -> float | None:
        n = self.speculative_rounds
        return self.accepted / n if n else None

    @property
    def emitted_per_verify(self) -> float:
        return len(self.tokens) / len(self.rounds) if self.rounds else 0.0

    def summary(self) -> dict:
        return {
            "width": self.width, "tokens": len(self.tokens), "prompt_tokens": self.prompt_tokens,
            "prefill_s": self.prefill_s, "decode_s": self.decode_s,
            "decode_tok_s": self.decode_tok_s, "e2e_tok_s": self.e2e_tok_s,
            "rounds": len(self.rounds), "speculative_rounds": self.speculative_rounds,
            "declined_rounds": self.declined_rounds, "drafted": self.drafted,
            "accepted": self.accepted, "acceptance": self.acceptance,
            "mean_accepted": self.mean_accepted, "emitted_per_verify": self.emitted_per_verify,
            "attention": self.attention, "gpu_clocks": self.clocks, "host_cpu": self.host,
            "rollback": self.rollback, "rollback_ms": round(self.rollback_s * 1e3, 4),
            **({"widths": self.widths, "auto": self.auto} if self.auto is not None else {}),
        }

    @property
    def rollback_s(self) -> float:
        return sum(r.rollback_s for r in self.rounds)

    def rounds_table(self) -> list[list[float]]:
        """Per-round diagnostics as compact rows, one column per ROUND_COLUMNS name."""
        return [[r.drafted, r.accepted, r.emitted, round(r.draft_s * 1e3, 4),
                 round(r.verify_s * 1e3, 4), round(r.sync_s * 1e3, 4), int(r.split),
                 round(r.rollback_s * 1e3, 4)]
                for r in self.rounds]


# The columns of a record's rounds_detail rows (rollback_ms is new in this order's last place, so a
# reader of the first seven reads older records and newer ones alike).
ROUND_COLUMNS = ("drafted", "accepted", "emitted", "draft_ms", "verify_ms", "sync_ms", "split",
                 "rollback_ms")


Progress = Callable[[int, int], None]  # (tokens so far, tokens wanted)


class WidthSource(Protocol):
    """A width per round (engine.auto.Run): called with the rounds so far before each round,
    closed with all of them after the last."""

    widths: list[int]

    @property
    def cap(self) -> int: ...  # the widest width it can take: what caches and drafters are sized for

    def __call__(self, rounds: list[Round]) -> int: ...

    def close(self, rounds: list[Round]) -> None: ...

    def to_dict(self) -> dict: ...


# Diagnostic replays only (never a timed run): (position of the first token these
# logits choose, logits rows [k, vocab]) for every forward that emits tokens.
LogitsHook = Callable[[int, mx.array], None]


def _check(prompt: list[int], max_tokens: int, context: int | None) -> None:
    if not prompt:
        raise DecodeError("prompt: empty (it must hold at least one token)")
    if max_tokens < 1:
        raise DecodeError(f"max tokens = {max_tokens}: must be at least 1")
    if context is not None and len(prompt) + max_tokens > context:
        raise DecodeError(f"prompt of {len(prompt)} tokens + {max_tokens} new tokens exceeds the "
                          f"target's context of {context}")


def _stream():
    from mlx_lm.generate import generation_stream

    return generation_stream


# Exact classic's steps checked on the path before the rest may run without its dispatcher
# (engine.exact.PathRouting.stock_since): on the mlx route, off-step caches, CUDA.
UNDISPATCHED_AFTER = 2


def classic(pair, prompt: list[int], max_tokens: int, *, on_progress: Progress | None = None,
            cancel: Callable[[], bool] | None = None, on_logits: LogitsHook | None = None,
            exact: exact_path.Plan | None = None,
            undispatched_after: int | None = UNDISPATCHED_AFTER) -> DecodeRun:
    """Greedy decoding of the target alone (mirrors mlx_lm.generate_step). ``exact`` (an active
    engine.exact plan): every step on the exact path, with the caches and prefill chunks the
    speculative loop uses, so a width's output can be compared with this one byte for byte.
    ``undispatched_after``: the steps checked before the rest may run without the path's
    dispatcher; None keeps it for every step (a before/after of what dropping it saves)."""
    from mlx_lm.models.cache import make_prompt_cache

    _check(prompt, max_tokens, pair.context_length)
    model = pair.target
    on_path = exact is not None and exact.active
    cache = make_cache(model, slack=1, off_step_buffers=True) if on_path else make_prompt_cache(model)
    exact_path.prepare(exact, model)
    tokens: list[int] = []
    rounds: list[Round] = []

    made = [0]

    def step(y):
        logits = model(y[None], cache=cache)[:, -1, :]
        if on_logits is not None:
            on_logits(made[0], logits)
            made[0] += 1
        return greedy(logits)

    with mx.stream(_stream()), ExitStack() as on_the_path:
        routed = on_the_path.enter_context(exact_path.path(exact))
        t0 = time.perf_counter()
        rest = prefill_cache(model, cache, mx.array(prompt, mx.uint32),
                             exact_path.PREFILL_STEP if on_path else 2048)
        t1 = time.perf_counter()
        before = routed.counts() if routed is not None else None
        y = step(rest)
        mx.async_eval(y)
        last = t1
        for n in range(max_tokens):
            if n + 1 < max_tokens:
                if (n + 1 == undispatched_after and routed is not None and only_off_step_kv(cache)
                        and routed.stock_since(before)):
                    # every call of the steps so far was MLX's own, as it comes: the rest make
                    # the same calls with no dispatcher in front of each (its Python was ~3 % of
                    # a host-bound target's step)
                    on_the_path.close()
                    routed.summary_extra["undispatched_from"] = n + 1
                nxt = step(y)
                mx.async_eval(nxt)
            tokens.append(y.item())
            now = time.perf_counter()
            rounds.append(Round(0, 0, 1, 0.0, now - last, 0.0))
            last = now
            if on_progress is not None:
                on_progress(n + 1, max_tokens)
            if cancel is not None and cancel():
                break
            if n % 256 == 0:
                mx.clear_cache()
            if n + 1 < max_tokens:
                y = nxt
        t2 = time.perf_counter()
    run = DecodeRun(None, tokens, len(prompt), t1 - t0, t2 - t1, rounds)
    if routed is not None:
        run.attention = {"exact": routed.summary()}
    return run


SPLIT_EVERY = 8


def speculative(pair, prompt: list[int], max_tokens: int, width: int | WidthSource, *,
                drafter: Drafter | None = None, on_progress: Progress | None = None,
                cancel: Callable[[], bool] | None = None, split_every: int = SPLIT_EVERY,
                attention: str | VerifyAttention | None = None,
                on_logits: LogitsHook | None = None, linear: str | None = None,
                rollback: Method | str = DEFAULT_METHOD,
                exact: exact_path.Plan | None = None) -> DecodeRun:
    """Speculative greedy decoding at ``width`` rows per verify (mirrors
    mlx_lm.speculative_generate_step with num_draft_tokens = width - 1).

    ``attention`` chooses the attention of the multi-row forwards against a
    cache (the verify, and a draft model's catch-up) — engine.attention; 1-row
    steps and prefill keep the fused kernel. None means ``auto``.

    ``linear`` chooses the projections of those forwards (engine.linear: ``stock``, or
    ``gather`` / ``gemv`` for 16-bit targets and ``qmv`` for affine-quantized ones on CUDA);
    stock (None, ``auto`` where it means stock) stays out of the summary, so a stock run's
    record reads as it did before the choice existed.

    Every ``split_every``-th round synchronises after drafting to time draft and
    verify apart; the others overlap them as mlx-lm does (a sync per round cost
    up to 10% at width 2 on a CPU).

    ``rollback`` chooses how recurrent state is advanced by the kept rows (engine.kvcache.Method);
    KV caches trim and sliding windows drop their rejected tail whatever it says.

    ``width`` is an int, or a width source (engine.auto's Run) asked for each round's width
    with the rounds so far: width 1 then verifies the pending token alone (nothing drafted).

    ``exact`` (an active engine.exact plan): the prefill, every verify and every 1-row forward
    on the exact path (it chooses the verify's attention and projections: ``linear`` is not
    used; ``attention`` takes only what the path leaves, verifies wider than it covers)."""
    source = None if isinstance(width, int) else width
    if source is None and width < 2:
        raise DecodeError(f"width = {width!r}: a speculative width is at least 2 (1 is classic)")
    if source is not None and not (callable(source) and hasattr(source, "close")
                                   and hasattr(source, "cap")):
        raise DecodeError(f"width = {width!r}: expected an integer or a width source")
    _check(prompt, max_tokens, pair.context_length)
    model = pair.target
    widest = width if source is None else source.cap  # what caches and drafters are sized for
    drafter = drafter or make_drafter(pair, widest)
    cache = make_cache(model, slack=widest, off_step_buffers=exact is not None and exact.active)
    rb = Rollback(model, cache, rollback)
    tokens: list[int] = []
    rounds: list[Round] = []
    ids = mx.array(prompt, mx.uint32)
    perf = time.perf_counter
    on_path = exact is not None and exact.active
    # qmv: its kernels compile here, before the clock starts (a no-op once compiled, and for
    # every other mode)
    if on_path:
        exact_path.prepare(exact, model, getattr(pair, "drafter", None))
    else:
        prepare(linear, model, getattr(pair, "drafter", None))

    with mx.stream(_stream()), exact_path.path(exact, attention) as routed:
        t0 = perf()
        drafter.prefill(ids)
        with watching(drafter, model):  # DFlash / MTP read the hidden states of this forward
            y = prefill_cache(model, cache, ids, exact_path.PREFILL_STEP)
        t1 = perf()
        with (verify_attention(attention) if not on_path else _nothing()) as routing, \
                (verify_linear(linear) if not on_path else _nothing()) as lrouting:
            try:
                _rounds(model, cache, rb, drafter, y, tokens, rounds, max_tokens,
                        (lambda _: width) if source is None else source, split_every,
                        on_progress, cancel, on_logits, routed)
            except RewindError:
                raise  # the cache that cannot put the rows back, as it is
        t2 = perf()
    if routed is not None:
        summary = {"mode": "exact", "exact": routed.summary()}
    else:
        summary = routing.summary()
        if lrouting.mode is not VerifyLinear.STOCK:
            summary["linear"] = lrouting.summary()
    if source is None:
        run = DecodeRun(width, tokens, len(prompt), t1 - t0, t2 - t1, rounds, summary)
    else:
        source.close(rounds)
        run = DecodeRun(AUTO, tokens, len(prompt), t1 - t0, t2 - t1, rounds, summary,
                        widths=list(source.widths), auto=source.to_dict())
    run.rollback = {"method": rb.effective.value if rb.effective else "trim",
                    "fallback": rb.fallback or None}
    return run


@contextmanager
def _nothing():
    yield None


def _rounds(model, cache, rb, drafter, y, tokens, rounds, max_tokens, width_of, split_every,
            on_progress, cancel, on_logits, routed=None) -> None:
    """``routed`` (the exact path's PathRouting): a round that drafts nothing is a 1-row step;
    once one such step made only MLX's own calls on off-step caches (PathRouting.stock_since),
    the later ones run without the dispatcher (engine.exact.undispatched), as exact classic's
    steps do (``undispatched_rounds`` in the summary)."""
    perf = time.perf_counter
    steps = exact_path.OneRowSteps(routed, cache)
    while len(tokens) < max_tokens:
        width = width_of(rounds)
        ta = perf()
        want = min(max_tokens - len(tokens), num_draft_tokens(width))
        drafts = drafter.propose(want)
        split = len(rounds) % split_every == 0
        if split:
            mx.eval(drafts)
        tb = perf()
        block = mx.concatenate([y, drafts]) if drafts.size else y
        k = block.size
        # ... and of the verify: no second target forward
        with watching(drafter, model), rb.verify(block), steps.forward(k):
            logits = model(block[None], cache=cache)[:, -k:, :]
        if steps.undispatched:
            routed.summary_extra["undispatched_rounds"] = steps.undispatched
        if on_logits is not None:
            on_logits(len(tokens), logits.squeeze(0))
        verified = greedy(logits.squeeze(0))
        mx.eval(verified)
        tc = perf()
        verified = verified.tolist()
        drafted = drafts.tolist()
        n = 0
        room = max_tokens - len(tokens)
        while n < len(drafted) and verified[n] == drafted[n] and n < room:
            n += 1
        emit = verified[: n + 1] if n < room else verified[:n]
        tokens.extend(emit)
        back = rb.commit(n + 1)  # the block's first n + 1 rows stay: y and the accepted drafts
        nxt = verified[n]
        drafter.commit(drafted, n, nxt)
        y = mx.array([nxt], mx.uint32)
        td = perf()
        if split:
            rounds.append(Round(len(drafted), n, len(emit), tb - ta, tc - tb, td - tc - back,
                                True, back))
        else:
            rounds.append(Round(len(drafted), n, len(emit), 0.0, tc - ta, td - tc - back, False,
                                back))
        if on_progress is not None:
            on_progress(len(tokens), max_tokens)
        if cancel is not None and cancel():
            break


def decode(pair, prompt: list[int], max_tokens: int, width: int | WidthSource | None, **kw) -> DecodeRun:
    """Classic when ``width`` is None, else speculative at ``width`` (a width source: auto)."""
    if width is None:
        kw.pop("drafter", None)
        return classic(pair, prompt, max_tokens, **kw)
    return speculative(pair, prompt, max_tokens, width, **kw)
