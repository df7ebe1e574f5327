"""Byte identity of a width's greedy output against classic's, and the exactness probe.

On a CPU a K-row verify is bitwise equal to K single-row steps; on CUDA it is
not, so a width's greedy output can drift from classic's. These two functions
are how an operator sees that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import mlx.core as mx

CONTEXT = 4  # tokens shown either side of a divergence


@dataclass(frozen=True)
class Identity:
    identical_ids: bool
    identical_bytes: bool
    first_divergence: int | None  # token index, None when identical
    classic_len: int
    width_len: int
    before: str = ""  # shared text just before the divergence
    classic_after: str = ""
    width_after: str = ""
    margin: "Margin | None" = None  # the target's top-2 margins at the divergence, when measured

    def describe(self) -> str:
        if self.identical_ids:
            return f"byte-identical ({self.classic_len} tokens)"
        where = f"token {self.first_divergence}"
        text = (f"differs from classic at {where}: …{self.before!r} then classic "
                f"{self.classic_after!r} vs width {self.width_after!r}")
        if self.margin is not None:
            text += f"; {self.margin.describe()}"
        return text

    def to_dict(self) -> dict:
        d = asdict(self)
        d["margin"] = self.margin.to_dict() if self.margin else None
        return d


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids) if ids else ""


def compare(classic: list[int], width: list[int], tokenizer) -> Identity:
    n = next((i for i, (a, b) in enumerate(zip(classic, width)) if a != b), None)
    if n is None and len(classic) != len(width):
        n = min(len(classic), len(width))
    cb = _decode(tokenizer, classic).encode("utf-8")
    wb = _decode(tokenizer, width).encode("utf-8")
    if n is None:
        return Identity(True, cb == wb, None, len(classic), len(width))
    return Identity(
        False, cb == wb, n, len(classic), len(width),
        before=_decode(tokenizer, classic[max(n - CONTEXT, 0):n]),
        classic_after=_decode(tokenizer, classic[n:n + CONTEXT]),
        width_after=_decode(tokenizer, width[n:n + CONTEXT]),
    )


NEAR_TIE = "near-tie flip"
REAL = "real divergence"
NOT_REPRODUCED = "not reproduced"
# Classic's 1-row step chose token c over the width's w by gap_c = l[c] - l[w]; the width's
# verify row chose w by gap_w = l'[w] - l'[c]. Between the two paths l[c] - l[w] moved by
# gap_c + gap_w. The exactness probe bounds how far a verify moves any one logit on its
# block (max |diff|), so l[c] - l[w] can move by 2 x max |diff| from rounding alone; the
# threshold doubles that again because the probe sees one block, not every position. On a
# CPU the probe is bitwise (max |diff| 0): any divergence there is a real one.
MARGIN_FACTOR = 4.0


@dataclass(frozen=True)
class Margin:
    position: int
    classic_token: int
    width_token: int
    classic_gap: float  # classic's logit of its token minus its logit of the width's token
    width_gap: float  # the width's verify row: its token's logit minus classic's token's
    threshold: float
    kind: str  # NEAR_TIE, REAL or NOT_REPRODUCED

    def describe(self) -> str:
        why = (f"the two tokens' logit gap moved by {self.classic_gap + self.width_gap:.3g} "
               f"({self.classic_gap:.3g} in classic's step, {self.width_gap:.3g} in the verify) "
               f"vs threshold {self.threshold:.3g}")
        if self.kind == NOT_REPRODUCED:
            return f"{NOT_REPRODUCED}: the replay did not choose the same tokens at {self.position}"
        if self.kind == NEAR_TIE:
            return f"{NEAR_TIE}: {why}, within the verify's measured error; still not byte-identical"
        return f"{REAL}: {why}, beyond the verify's measured error — a bug, not rounding"

    def to_dict(self) -> dict:
        return asdict(self)


def classify_margin(position: int, classic_token: int, width_token: int, classic_gap: float,
                    width_gap: float, max_abs_diff: float, reproduced: bool = True) -> Margin:
    threshold = MARGIN_FACTOR * max_abs_diff
    if not reproduced:
        kind = NOT_REPRODUCED
    else:
        kind = NEAR_TIE if classic_gap + width_gap <= threshold else REAL
    return Margin(position, classic_token, width_token, classic_gap, width_gap, threshold, kind)


def divergence_margin(pair, prompt: list[int], width: int, classic_tokens: list[int],
                      width_tokens: list[int], position: int, max_abs_diff: float,
                      attention=None, linear=None, exact=None) -> Margin:
    """Replay classic and the width (same length, so every round has the session's shape)
    until ``position``, their first divergence, and read the two tokens' logits there from
    classic's 1-row step and from the verify row that emitted the width's token (with the
    session's verify ``attention`` and ``linear``, engine.linear)."""
    from blockwidth.engine.decode import classic, speculative

    c, w = classic_tokens[position], width_tokens[position]
    seen: dict[str, mx.array] = {}
    past = [False]

    def on_classic(pos: int, logits: mx.array) -> None:
        if pos == position:
            seen["classic"] = logits.reshape(-1, logits.shape[-1])[-1].astype(mx.float32)

    def on_width(start: int, rows: mx.array) -> None:
        # The last round to cover ``position`` is the one that emitted it.
        if start <= position < start + rows.shape[0]:
            seen["width"] = rows[position - start].astype(mx.float32)

    def on_progress(done: int, _total: int) -> None:
        past[0] = done > position

    classic(pair, prompt, len(classic_tokens), on_logits=on_classic, cancel=lambda: "classic" in seen,
            exact=exact)
    speculative(pair, prompt, len(width_tokens), width, attention=attention, on_logits=on_width,
                on_progress=on_progress, cancel=lambda: past[0], linear=linear, exact=exact)
    cl, wl = seen["classic"], seen["width"]
    reproduced = int(mx.argmax(cl).item()) == c and int(mx.argmax(wl).item()) == w
    return classify_margin(position, c, w, float((cl[c] - cl[w]).item()), float((wl[w] - wl[c]).item()),
                           max_abs_diff, reproduced)


@dataclass(frozen=True)
class Exactness:
    width: int
    bitwise_equal: bool
    max_abs_diff: float
    argmax_agree: tuple[bool, ...]  # per row

    def describe(self) -> str:
        if self.bitwise_equal:
            return f"width {self.width}: block verify bitwise equal to {self.width} single steps"
        bad = [i for i, ok in enumerate(self.argmax_agree) if not ok]
        return (f"width {self.width}: not bitwise equal (max |diff| {self.max_abs_diff:.3g}); "
                f"argmax agrees on {len(self.argmax_agree) - len(bad)}/{len(self.argmax_agree)} rows"
                + (f", differs on rows {bad}" if bad else ""))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["argmax_agree"] = list(self.argmax_agree)
        return d


def probe(model, prefix: list[int], block: list[int], attention=None, linear=None,
          exact=None) -> Exactness:
    """One ``len(block)``-row forward (with the session's verify ``attention`` and projections,
    ``linear``: engine.linear) against ``len(block)`` single-row steps, both after ``prefix``.
    ``exact`` (an active engine.exact plan): both on the exact path, with its caches, as the
    session's classic and speculative runs are."""
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine import exact as exact_path
    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.drafters import prefill_cache
    from blockwidth.engine.kvcache import make_cache
    from blockwidth.engine.linear import verify_linear

    if not prefix or not block:
        raise ValueError("the exactness probe needs a non-empty prefix and block")
    ids = mx.array(prefix + block[:0], mx.uint32)
    on_path = exact is not None and exact.active

    def prepared():
        cache = make_cache(model, slack=len(block), off_step_buffers=True) if on_path else make_prompt_cache(model)
        rest = prefill_cache(model, cache, ids, exact_path.PREFILL_STEP)
        model(rest[None], cache=cache)  # the last prefix token, as decoding would have
        mx.eval([c.state for c in cache])
        return cache

    with exact_path.path(exact, attention):
        cache = prepared()
        if on_path:
            wide = model(mx.array(block, mx.uint32)[None], cache=cache)[0]
        else:
            with verify_attention(attention), verify_linear(linear):
                wide = model(mx.array(block, mx.uint32)[None], cache=cache)[0]
        mx.eval(wide)
        cache = prepared()
        rows = []
        for t in block:
            # one forward an eval: a pipeline-split target (engine.distributed) sends and receives
            # inside each, and two forwards in one graph could meet their peers' in another order
            rows.append(model(mx.array([t], mx.uint32)[None], cache=cache)[0, -1])
            mx.eval(rows[-1])
    narrow = mx.stack(rows)
    w32, n32 = wide.astype(mx.float32), narrow.astype(mx.float32)
    equal = bool(mx.array_equal(wide, narrow).item())
    diff = float(mx.max(mx.abs(w32 - n32)).item())
    agree = (mx.argmax(wide, axis=-1) == mx.argmax(narrow, axis=-1)).tolist()
    return Exactness(len(block), equal, diff, tuple(bool(a) for a in agree))
