"""The pilot: a few decoded tokens, classic and at one width, that price a session on this host
before it starts (policy.pace does the arithmetic)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from blockwidth.engine.decode import decode
from blockwidth.policy.errors import BlockwidthError
from blockwidth.policy.pace import Pace

PILOT_TOKENS = 8  # per timed run: enough to see a decode rate, a second or two on a busy CPU
# The longest prompt a pilot times classic on, to see what context costs (policy.pace.Pace): a
# workload's longest request, cut to this many tokens, and to a prefill of half the short runs'
# time (at least LONG_MIN_S): SmolLM2 bf16 on the 2-core CPU prefills 21-25 tokens a second, and
# its 512 tokens took the pilot from 20 s to 46 s; and only where it is well past the pilot's own.
LONG_CAP = 512
LONG_MIN_RATIO = 1.5
LONG_SHARE = 0.5
LONG_MIN_S = 2.0


def long_prompt(ids: list[int], longest: list[int] | None, room: int | None = None) -> list[int] | None:
    """The prompt a pilot times classic's context cost on: ``longest``'s last LONG_CAP tokens
    (fewer where the context has only ``room`` for the prompt), or None where it is not well past
    ``ids`` (then every request is priced at ``ids``' rates)."""
    if not longest:
        return None
    cap = LONG_CAP if room is None else min(LONG_CAP, room)
    if cap <= 0:
        return None
    cut = list(longest[-cap:])
    return cut if len(cut) >= LONG_MIN_RATIO * max(len(ids), 1) else None


def pilot(pair, ids: list[int], width: int, *, tokens: int = PILOT_TOKENS,
          cancel: Callable[[], bool] | None = None, longest: list[int] | None = None,
          wide: int | None = None, long_share: float = LONG_SHARE) -> Pace | None:
    """Classic, then ``width``, on ``ids``: each run once short (first use: kernels compile,
    memory is allocated; not timed) and once timed, and so ``wide`` where it is wider (a session's
    widest width: a token costs more at a wider width); then classic once, timed, on the longest
    request (``long_prompt``, no longer than ``long_share`` of the short runs' time prefills)
    where one is given and well past ``ids``. None when cancelled, or when a run took no time to divide by."""
    stop = cancel or (lambda: False)
    t0 = time.monotonic()
    timed = []
    ctx = getattr(pair, "context_length", None)
    fits = wide is not None and (ctx is None or len(ids) + tokens + wide <= ctx)
    widths = (None, width, *([wide] if fits and wide > width else []))
    for w in widths:
        for n in (2, tokens):
            if stop():
                return None
            run = decode(pair, list(ids), n, w, cancel=stop)
        timed.append(run)
    c, s, *far_w = timed
    if min(c.decode_s, s.decode_s) <= 0 or not c.tokens or not s.tokens:
        return None
    prompt = max(len(ids), 1)
    pace = Pace(c.prefill_s / prompt, s.prefill_s / prompt, c.decode_s / len(c.tokens),
                s.decode_s / len(s.tokens), width, at_tokens=len(ids), new_tokens=len(c.tokens))
    if far_w and far_w[0].decode_s > 0 and far_w[0].tokens:
        pace = replace(pace, wide_width=wide, wide_decode_s=far_w[0].decode_s / len(far_w[0].tokens))
    room = ctx - tokens - 8 if ctx is not None else LONG_CAP
    spent = time.monotonic() - t0
    affordable = int(max(LONG_MIN_S, long_share * spent) / pace.prefill_s) if pace.prefill_s > 0 else LONG_CAP
    far = long_prompt(ids, longest, min(room, affordable))
    if far is None:
        return pace
    if stop():
        return None
    try:
        run = decode(pair, far, tokens, None, cancel=stop)
    except (BlockwidthError, ValueError, RuntimeError):  # the long prompt only: keep what was timed
        return pace
    if stop():
        return None
    if run.decode_s <= 0 or not run.tokens:
        return pace
    return replace(pace, long_tokens=len(far), long_prefill_s=run.prefill_s / len(far),
                   long_decode_s=run.decode_s / len(run.tokens))
