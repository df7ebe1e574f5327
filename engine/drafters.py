"""Drafters: one protocol; a draft model, prompt lookup, DFlash and MTP heads.

A drafter proposes up to ``width - 1`` tokens after the last committed token;
the verify is shared (engine.decode). ``propose`` may return a lazy array so a
model drafter's steps are never synchronised one by one. A drafter that reads
the target's hidden states (DFlash, MTP) has ``watch(model)``: a context the
engine opens around its own prefill and verify forwards, which hands it the
hidden states of those same forwards (``watching`` is a no-op for the others).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import mlx.core as mx

from blockwidth.policy.drafter import DrafterKind


class Drafter(Protocol):
    kind: DrafterKind

    def prefill(self, prompt: mx.array) -> None:
        """See the prompt (all of it; the last token is the first pending one)."""

    def propose(self, n: int) -> mx.array:
        """Up to ``n`` drafted tokens (uint32, possibly empty: the drafter declined)."""

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        """The verify kept ``accepted`` of ``drafted`` and emitted ``next_token`` after them."""


def greedy(logits: mx.array) -> mx.array:
    # The same arithmetic as mlx-lm's greedy sampler, so ties break the same way.
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return mx.argmax(logprobs, axis=-1)


def prefill_cache(model, cache, tokens: mx.array, step: int) -> mx.array:
    """Run all but the last token through ``model`` into ``cache``; return the rest."""
    while tokens.size > 1:
        n = min(step, tokens.size - 1)
        model(tokens[:n][None], cache=cache)
        mx.eval([c.state for c in cache])
        tokens = tokens[n:]
        mx.clear_cache()
    return tokens


class ModelDrafter:
    """An independent draft model with its own cache, put back on rejection.

    Its steps are one row each (after the pending token or two), so where each step left every
    layer is kept (engine.kvcache.mark: offsets, and recurrent state by reference): a rejection
    goes back to the step after the last accepted draft, whatever the layers' cache kinds."""

    kind = DrafterKind.MODEL

    def __init__(self, model, prefill_step: int = 512, width: int = 16):
        from blockwidth.engine.kvcache import _leaves, make_cache

        self.model = model
        self.cache = make_cache(model, slack=width)
        self.leaves = _leaves(self.cache)
        self.prefill_step = prefill_step
        self.pending: mx.array | None = None
        self.marks: list = []

    def prefill(self, prompt: mx.array) -> None:
        self.pending = prefill_cache(self.model, self.cache, prompt, self.prefill_step)

    def propose(self, n: int) -> mx.array:
        from blockwidth.engine.kvcache import mark

        y, ys = self.pending, []
        self.marks = []
        for _ in range(n):
            logits = self.model(y[None], cache=self.cache)[:, -1, :]
            self.marks.append(mark(self.leaves))
            y = greedy(logits)
            mx.async_eval(y)
            ys.append(y)
        return mx.concatenate(ys) if ys else mx.array([], mx.uint32)

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        from blockwidth.engine.kvcache import restore

        k = len(drafted)
        if not k:
            # A round that drafted nothing (an auto width of 1) fed the drafter nothing: its
            # pending tokens wait, with the new one, for the next round that drafts.
            self.marks = []
            self.pending = mx.concatenate([self.pending, mx.array([next_token], mx.uint32)])
            return
        # Step j fed the pending tokens (j = 0) or draft j: keep through the last accepted draft.
        if accepted < k:
            restore(self.leaves, self.marks[accepted], "the drafter")
        self.marks = []
        if accepted == k:
            # The last draft was never fed to the drafter: feed it with the next one.
            self.pending = mx.array([drafted[-1], next_token], mx.uint32)
        else:
            self.pending = mx.array([next_token], mx.uint32)


class LookupDrafter:
    """n-gram prompt lookup over the prompt and the text so far; no checkpoint.

    The most recent earlier occurrence of the context's last n tokens (n from ``max_ngram`` down
    to ``min_ngram``) with something after it, and what follows it. Each n-gram's latest start is
    kept in an index as the context grows, so a proposal is a few dict lookups, not a scan of
    the context per round (a 700-token context: ~2,000 slice comparisons a round when nothing
    matched, which a host-bound target pays in every round)."""

    kind = DrafterKind.LOOKUP

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.context: list[int] = []
        # size -> {n-gram: its latest start among those with a token after them}
        self._last: dict[int, dict[tuple, int]] = {}
        self._indexed = 0  # the context length the index covers

    def prefill(self, prompt: mx.array) -> None:
        self.context = prompt.tolist()
        self._last = {s: {} for s in range(self.min_ngram, self.max_ngram + 1)}
        self._indexed = 0
        self._index()

    def _index(self) -> None:
        """Index every n-gram that now has a token after it and was not indexed yet."""
        ctx, m = self.context, len(self.context)
        for size, last in self._last.items():
            # starts s with s + size <= m - 1 (something follows), from those not yet indexed
            for s in range(max(0, self._indexed - size), m - size):
                last[tuple(ctx[s:s + size])] = s
        self._indexed = m

    def propose(self, n: int) -> mx.array:
        ctx = self.context
        for size in range(self.max_ngram, self.min_ngram - 1, -1):
            if len(ctx) <= size:
                continue
            start = self._last.get(size, {}).get(tuple(ctx[-size:]))
            if start is not None:
                follow = ctx[start + size:start + size + n]
                if follow:
                    return mx.array(follow, mx.uint32)
        return mx.array([], mx.uint32)

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        self.context.extend(drafted[:accepted])
        self.context.append(next_token)
        self._index()


def watching(drafter: Drafter, model: Any) -> AbstractContextManager:
    """The drafter's capture around a target forward, or nothing when it reads no hidden state."""
    watch = getattr(drafter, "watch", None)
    return watch(model) if watch is not None else nullcontext()


def make_drafter(pair, width: int = 16) -> Drafter:
    """The pair's drafter for a session whose widest verify is ``width`` rows."""
    factory = getattr(pair, "drafter_factory", None)
    if factory is not None:  # the pair's own (engine.distributed: a drafter on rank 0 only)
        return factory(width)
    if pair.kind is DrafterKind.MODEL:
        return ModelDrafter(pair.drafter, width=width)
    if pair.kind is DrafterKind.LOOKUP:
        return LookupDrafter()
    if pair.kind is DrafterKind.DFLASH:
        from blockwidth.engine.dflash import DFlashDrafter

        return DFlashDrafter(pair.drafter, pair.target)
    if pair.kind is DrafterKind.MTP:
        from blockwidth.engine.mtp import MTPDrafter

        return MTPDrafter(pair.drafter, pair.target)
    raise ValueError(f"drafter kind {pair.kind.value} is not runnable here")
