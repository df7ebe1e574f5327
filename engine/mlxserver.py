"""mlx_lm.server in this process, with blockwidth's verify-attention dispatcher active for its
multi-row forwards.

``python -m engine.mlxserver --verify-attention MODE [mlx_lm.server arguments]`` runs the
installed mlx_lm.server's own ``main()`` (its arguments, its HTTP server, its generation loop)
with one change: the thread that generates runs inside ``engine.attention.verify_attention``,
so every attention call of 2..64 query rows against a KV cache (a speculative verify, a prompt
continued from the prompt cache) takes MODE, and 1-row decode and fresh prefill keep the fused
kernel, as on the engine path. On a CPU or Metal ``auto`` means ``fused``: the route is then a
no-op (every call reaches the stock kernel), which the startup line says.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence


def _generator_class(mode: str, exact: bool = False):
    from mlx_lm import server

    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.linear import exact_linear

    class DispatchingResponseGenerator(server.ResponseGenerator):
        """mlx_lm.server's generator, whose generation thread runs with the dispatcher active
        (a context variable: the thread that enters it, and only that one); ``exact``: on the
        exact path (engine.exact), every forward of 1..16 rows, its 1-row steps and the draft
        path's verifies alike, on row-invariant kernels."""

        routing = None

        def _is_batchable(self, args):
            # mlx_lm.server's batched decode masks by array (each sequence's left padding), which
            # the rows kernel does not take: its 1-row steps would reach fused SDPA, whose rows
            # differ from the rows kernel's (lab/evidence/h200-2026-12-04b: the draft server's
            # text left classic's at character 127). On the exact path the classic server serves
            # one request at a time through generate_step, as the draft server does (it never
            # batches) and as the engine's classic does.
            return False if exact else super()._is_batchable(args)

        def _run_generate(self):
            if not getattr(self.prompt_cache.insert_cache, "aligned", False):
                self.prompt_cache.insert_cache = _aligned(self.prompt_cache.insert_cache)
                self.prompt_cache.fetch_nearest_cache = _one_left(self.prompt_cache.fetch_nearest_cache)
            with verify_attention(mode, exact=exact) as routing, \
                    (exact_linear() if exact else _nothing()) as lrouting:
                type(self).routing = routing
                try:
                    super()._run_generate()
                finally:
                    logging.info("blockwidth verify attention %s%s: %s", routing.mode.value,
                                 " (exact path)" if exact else "", routing.summary())
                    if lrouting is not None:
                        logging.info("blockwidth exact projections: %s", lrouting.summary())

    return DispatchingResponseGenerator


def _option(args: list[str], name: str) -> str | None:
    """The value of ``name`` among pass-through arguments (``--x V`` or ``--x=V``), or None."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def _aligned(insert):
    """mlx_lm.server's ``insert_cache``, storing a cache only under as many tokens as it holds rows.

    mlx_lm.server keys a finished request's cache by its prompt and the tokens it sent, and its
    LRUPromptCache trims a reused entry by that key's length. The draft path breaks that: a
    request that stops inside a speculative round leaves the target cache with the round's rows
    past the last token sent (or without the last token's row), and the draft cache at its own
    length, so a later request that reuses the entry continues from misaligned rows (measured on
    the H200, lab/evidence/h200-2026-12-04d: cached repeats that stopped after 1 token, texts that
    left classic's). Here every layer is trimmed to the rows all of them and the key have in
    common, and the entry is stored under that many tokens; an entry that cannot be trimmed that
    way is not stored (the next request prefills)."""
    from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

    def aligned(model_key, tokens, prompt_cache, **kw):
        rows = [getattr(c, "offset", None) for c in prompt_cache]
        if any(not isinstance(r, int) for r in rows):  # recurrent state: no rows to count
            return insert(model_key, tokens, prompt_cache, **kw)
        n = min([len(tokens), *rows])
        if n == 0:
            return None  # nothing to reuse
        if any(r != n for r in rows):
            if not can_trim_prompt_cache(prompt_cache):
                return None
            for c, r in zip(prompt_cache, rows):
                if r > n:
                    trim_prompt_cache([c], r - n)
        return insert(model_key, list(tokens[:n]), prompt_cache, **kw)

    aligned.aligned = True
    return aligned


def _one_left(fetch):
    """mlx_lm.server's ``fetch_nearest_cache``, never leaving a request no token to run: an entry
    stored under exactly the prompt (``_aligned`` can store one so) comes back with its last row
    trimmed and the prompt's last token to feed, as a longer entry would; one that cannot be
    trimmed is not used."""
    from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

    def one_left(model, tokens):
        cache, rest = fetch(model, tokens)
        if cache is not None and len(rest) == 0 and len(tokens) > 0:
            if not can_trim_prompt_cache(cache):
                return None, tokens
            trim_prompt_cache(cache, 1)
            return cache, tokens[-1:]
        return cache, rest

    return one_left


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def main(argv: Sequence[str] | None = None) -> int:
    from blockwidth.engine.attention import CHOICES, current_backend, effective

    ap = argparse.ArgumentParser(prog="python -m engine.mlxserver", add_help=False)
    ap.add_argument("--verify-attention", choices=CHOICES, required=True)
    ap.add_argument("--exact", choices=("on", "off"), default="off")
    ours, rest = ap.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    from mlx_lm import server

    mode = effective(ours.verify_attention)
    exact = ours.exact == "on"
    backend = current_backend()
    note = " (no-op route on this backend: every call reaches the stock kernel)" if mode.value == "fused" else ""
    if exact:
        note += ("; exact path: every forward of 1..16 rows row-invariant (each verify row as MLX's"
                 " 1-row step), one request at a time (no batched decode)"
                 if backend == "cuda" else "; exact path: nothing to route on this backend "
                 "(the CPU's kernels are row-invariant)")
        step = _option(rest, "--prefill-step-size")
        if backend == "cuda" and step is not None and step.isdigit() and int(step) > 16:
            note += (f"; --prefill-step-size {step} is past the path's 16 rows: prompt chunks are stock, so a "
                     "prefix reused from the prompt cache may differ in its last bits from one computed here")
    print(f"blockwidth: mlx_lm.server in-process, verify attention {ours.verify_attention} = "
          f"{mode.value} on {backend}{note}", file=sys.stderr, flush=True)
    # run() builds its ResponseGenerator by name from the module: this one for this process.
    server.ResponseGenerator = _generator_class(ours.verify_attention, exact)
    sys.argv = ["mlx_lm.server", *rest]
    server.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
