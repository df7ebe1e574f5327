"""The lookup drafter's index proposes exactly what a scan of the context would."""

from __future__ import annotations

import random

import mlx.core as mx

from blockwidth.engine.drafters import LookupDrafter


def _scan(ctx: list[int], n: int, largest: int = 3, smallest: int = 1) -> list[int]:
    """The proposal by definition: the most recent earlier occurrence of the context's last
    ``size`` tokens (largest size first) with something after it, and what follows it."""
    for size in range(largest, smallest - 1, -1):
        if len(ctx) <= size:
            continue
        tail = ctx[-size:]
        for start in range(len(ctx) - size - 1, -1, -1):
            if ctx[start:start + size] == tail:
                follow = ctx[start + size:start + size + n]
                if follow:
                    return follow
    return []


def test_the_index_proposes_what_a_scan_of_the_context_does():
    rng = random.Random(0)
    for _ in range(120):
        vocab = rng.choice([2, 3, 5, 20, 200])  # small vocabularies: many repeated n-grams
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 50))]
        d = LookupDrafter()
        d.prefill(mx.array(prompt, mx.uint32))
        ctx = list(prompt)
        for _ in range(25):
            n = rng.randint(1, 7)
            got = d.propose(n).tolist()
            assert got == _scan(ctx, n)
            kept = rng.randint(0, len(got))
            nxt = rng.randrange(vocab)
            d.commit(got, kept, nxt)
            ctx += got[:kept] + [nxt]
