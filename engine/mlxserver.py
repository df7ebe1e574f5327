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


def _generator_class(mode: str):
    from mlx_lm import server

    from blockwidth.engine.attention import verify_attention

    class DispatchingResponseGenerator(server.ResponseGenerator):
        """mlx_lm.server's generator, whose generation thread runs with the dispatcher active
        (a context variable: the thread that enters it, and only that one)."""

        routing = None

        def _run_generate(self):
            with verify_attention(mode) as routing:
                type(self).routing = routing
                try:
                    super()._run_generate()
                finally:
                    logging.info("blockwidth verify attention %s: %s", routing.mode.value,
                                 routing.summary())

    return DispatchingResponseGenerator


def main(argv: Sequence[str] | None = None) -> int:
    from blockwidth.engine.attention import CHOICES, current_backend, effective

    ap = argparse.ArgumentParser(prog="python -m engine.mlxserver", add_help=False)
    ap.add_argument("--verify-attention", choices=CHOICES, required=True)
    ours, rest = ap.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    from mlx_lm import server

    mode = effective(ours.verify_attention)
    note = " (no-op route on this backend: every call reaches the stock kernel)" if mode.value == "fused" else ""
    print(f"blockwidth: mlx_lm.server in-process, verify attention {ours.verify_attention} = "
          f"{mode.value} on {current_backend()}{note}", file=sys.stderr, flush=True)
    # run() builds its ResponseGenerator by name from the module: this one for this process.
    server.ResponseGenerator = _generator_class(ours.verify_attention)
    sys.argv = ["mlx_lm.server", *rest]
    server.main()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
