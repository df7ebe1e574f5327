"""Soak: one long speculative session of many verify rounds, each at a new KV length.

With stock fused attention on CUDA every round builds a cuDNN plan, and after
2 x MLX_CUDA_SDPA_CACHE_SIZE misses MLX raises "Cache thrashing": a long
session or a server dies. This runs ``--rounds`` rounds (restarting the decode
when the model's context is full) and reports whether it survived, the round
it failed at, and the time per round in windows along the way.

    python -m lab.soak --target T --draft D --rounds 2000 --width 2 --verify-attention auto
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

# Checked when the arguments are parsed: a bad name stops the tool before any model loads.
from blockwidth.console.request import add_verify_attention, add_verify_linear  # the product's declarations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--width", type=int, default=2)
    add_verify_attention(ap)
    add_verify_linear(ap)
    ap.add_argument("--prompt", default="def main(argv=None):\n    parser = argparse.ArgumentParser(")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from blockwidth.engine.attention import effective
    from blockwidth.engine.decode import speculative
    from blockwidth.engine.pair import load_pair

    pair = load_pair(args.target, args.draft)
    ids = pair.tokenizer.encode(args.prompt)
    room = (pair.context_length or 4096) - len(ids) - args.width - 1
    count = [0]  # rounds so far, across decodes (on_progress fires once a round)
    runs, error, per_round = 0, None, []

    def tick(_k, _n):
        count[0] += 1

    t0 = time.perf_counter()
    try:
        while count[0] < args.rounds:
            # enough tokens for the rounds still wanted (a round emits 1..width tokens)
            want = min(room, (args.rounds - count[0]) * args.width)
            run = speculative(pair, ids, want, args.width, attention=args.verify_attention,
                              linear=args.verify_linear,
                              on_progress=tick, cancel=lambda: count[0] >= args.rounds)
            runs += 1
            per_round += [r.verify_s + r.draft_s + r.sync_s for r in run.rounds]
    except Exception as e:  # MLX raises RuntimeError("... Cache thrashing ...")
        error = f"{type(e).__name__}: {e}"
    windows = [round(statistics.median(per_round[i:i + 250]) * 1e3, 3)
               for i in range(0, len(per_round), 250)]
    out = {"verify_attention": effective(args.verify_attention).value, "width": args.width,
           "rounds_wanted": args.rounds, "rounds_done": count[0], "decodes": runs,
           "survived": error is None, "error": error, "seconds": round(time.perf_counter() - t0, 1),
           "median_ms_per_round_by_250": windows}
    print(json.dumps(out, indent=None if args.json else 1))
    return 0 if error is None else 1


if __name__ == "__main__":
    sys.exit(main())
