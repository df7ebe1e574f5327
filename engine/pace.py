"""The pilot: a few decoded tokens, classic and at one width, that price a session on this host
before it starts (policy.pace does the arithmetic)."""

from __future__ import annotations

from typing import Callable

from blockwidth.engine.decode import decode
from blockwidth.policy.pace import Pace

PILOT_TOKENS = 8  # per timed run: enough to see a decode rate, a second or two on a busy CPU


def pilot(pair, ids: list[int], width: int, *, tokens: int = PILOT_TOKENS,
          cancel: Callable[[], bool] | None = None) -> Pace | None:
    """Classic, then ``width``, on ``ids``: each run once short (first use: kernels compile,
    memory is allocated; not timed) and once timed. None when cancelled, or when a run took no
    time to divide by."""
    stop = cancel or (lambda: False)
    timed = []
    for w in (None, width):
        for n in (2, tokens):
            if stop():
                return None
            run = decode(pair, list(ids), n, w, cancel=stop)
        timed.append(run)
    c, s = timed
    if min(c.decode_s, s.decode_s) <= 0 or not c.tokens or not s.tokens:
        return None
    prompt = max(len(ids), 1)
    return Pace(c.prefill_s / prompt, s.prefill_s / prompt, c.decode_s / len(c.tokens),
                s.decode_s / len(s.tokens), width)
