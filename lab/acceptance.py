"""Measure the demo pair's per-drafted-token acceptance with mlx-lm's own loop.

    python -m lab.acceptance DIR [--width 4] [--tokens 128]

An independent check on the built weights (the engine reports the same
quantity through its own round loop).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.generate import speculative_generate_step

from blockwidth.engine.demo.prompts import DEMO_PROMPTS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    args = ap.parse_args(argv)
    drafter, _ = load(str(args.dir / "drafter"))
    for variant in ("target-bf16", "target-4bit"):
        target, tok = load(str(args.dir / variant))
        for prompt in DEMO_PROMPTS:
            ids = mx.array(tok.encode(prompt))
            out, from_draft = [], 0
            for t, _, d in speculative_generate_step(
                ids, target, drafter, num_draft_tokens=args.width - 1, max_tokens=args.tokens
            ):
                out.append(t)
                from_draft += bool(d)
            rounds = len(out) - from_draft
            drafted = rounds * (args.width - 1)
            print(f"{variant} acceptance {from_draft / drafted:.3f} "
                  f"({from_draft}/{drafted}) prompt {prompt[:24]!r}")
            print(tok.decode(out)[:300].replace("\n", "\n    | "))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
