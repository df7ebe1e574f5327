"""Rewinding a KV cache, refused where the cache cannot do it.

Speculative decoding keeps the verify's accepted rows and drops the rest by
trimming the cache. mlx-lm's ``trim_prompt_cache`` trims nothing, silently,
when any layer's cache cannot be trimmed (a sliding-window ``RotatingKVCache``
past its window): the rejected drafts would stay in the cache and the tokens
would go wrong. This says so instead.
"""

from __future__ import annotations

from policy.errors import BlockwidthError


class RewindError(BlockwidthError, ValueError):
    """The cache cannot drop the rows it was asked to; the message says which model."""


def rewind(cache, n: int, what: str = "the target") -> None:
    """Drop the last ``n`` positions of every layer's cache, or raise RewindError."""
    from mlx_lm.models.cache import trim_prompt_cache

    if n <= 0:
        return
    done = trim_prompt_cache(cache, n)
    if done != n:
        kinds = sorted({type(c).__name__ for c in cache})
        raise RewindError(f"{what}'s KV cache ({', '.join(kinds)}) dropped {done} of {n} rejected "
                          f"positions: a sliding-window cache past its window cannot rewind, so "
                          f"speculative decoding would keep rejected drafts; this model cannot be "
                          f"measured here")
