"""Benchmark: this engine against mlx-lm, side by side in one process, on the demo pair.

    make bench            (or: python -m lab.bench [--n 5] [--tokens 128] [--target bf16|4bit])

For classic and for widths 2, 4, 8, runs this engine and mlx-lm
(``generate_step`` / ``speculative_generate_step`` with num_draft_tokens =
width - 1) interleaved, n times each, timing whole generations the same way,
and reports per pair of runs the ratio engine / mlx-lm tok/s and whether the
tokens are identical. Target: median ratio >= 0.97 everywhere, tokens identical.

``--target T --draft D --prompts-file P.json --fresh`` runs another pair on a
list of prompts, a new prompt for every repetition (nothing an earlier run built
for those positions can be replayed), after a discarded warm-up of each mode
on a prompt that is not measured. On CUDA this is where the engine's verify
attention meets mlx-lm's stock fused attention.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import mlx.core as mx

# Checked when the arguments are parsed: a bad name stops the tool before any model loads.
from blockwidth.console.request import add_verify_attention, add_verify_linear  # the product's declarations


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--target", default="bf16", help="bf16 | 4bit (the demo targets) or a target folder")
    ap.add_argument("--widths", default="2,4,8")
    ap.add_argument("--device", choices=("default", "cpu"), default="default",
                    help="cpu: run on the CPU even where MLX has a GPU")
    ap.add_argument("--draft", help="drafter folder (default: the demo drafter)")
    ap.add_argument("--prompts-file", help="JSON list of prompts (default: the demo prompts)")
    ap.add_argument("--fresh", action="store_true",
                    help="a new prompt for every repetition; the first prompt only warms up")
    add_verify_attention(ap)
    add_verify_linear(ap)
    ap.add_argument("--json-out", help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    from blockwidth.engine.demo.prompts import DEMO_PROMPTS, PromptsFileError, read_prompts

    try:  # before any model loads: a bad file costs no minutes
        texts = read_prompts(args.prompts_file) if args.prompts_file is not None else list(DEMO_PROMPTS)
    except PromptsFileError as e:
        print(e, file=sys.stderr)
        return 2
    if args.fresh and len(texts) < args.n + 1:
        ap.error(f"--fresh needs n + 1 = {args.n + 1} prompts; {len(texts)} given")
    if args.device == "cpu":
        mx.set_default_device(mx.cpu)  # before mlx-lm makes its generation stream

    from mlx_lm.generate import generate_step, speculative_generate_step

    from blockwidth.engine import demo
    from blockwidth.engine.decode import classic, speculative
    from blockwidth.engine.pair import load_pair

    if args.target in ("bf16", "4bit"):
        pair = load_pair(demo.target(args.target), args.draft or demo.DRAFTER)
    else:
        pair = load_pair(args.target, args.draft or demo.DRAFTER)
    prompts = [pair.tokenizer.encode(t) for t in texts]
    modes: list[int | None] = [None] + [int(w) for w in args.widths.split(",")]
    if args.fresh:
        # New text is not enough: plans are keyed on shapes, and equal-length prompts visit
        # the same KV lengths. Lead repetition r's prompt with filler so that its positions
        # are disjoint from every other repetition's (and the warm-up's).
        step = args.tokens + max(m or 1 for m in modes) + 1
        prompts = [[p[0]] * (r * step) + p for r, p in enumerate(prompts[:args.n + 1])]
        longest = max(len(p) for p in prompts) + step
        if pair.context_length is not None and longest > pair.context_length:
            ap.error(f"--fresh: {args.n} repetitions of {args.tokens} tokens at disjoint positions need "
                     f"{longest} positions; the target has {pair.context_length}")
    current = [prompts[0]]

    def ours(width):
        ids = current[0]
        if width is None:
            return classic(pair, ids, args.tokens).tokens
        return speculative(pair, ids, args.tokens, width, attention=args.verify_attention,
                           linear=args.verify_linear).tokens

    def theirs(width):
        prompt = mx.array(current[0])
        if width is None:
            return [t for t, _ in generate_step(prompt, pair.target, max_tokens=args.tokens)]
        return [t for t, _, _ in speculative_generate_step(
            prompt, pair.target, pair.drafter, num_draft_tokens=width - 1, max_tokens=args.tokens)]

    def timed(fn, width):
        t0 = time.perf_counter()
        toks = fn(width)
        dt = time.perf_counter() - t0
        return toks, len(toks) / dt, dt

    print(f"bench: {pair.describe()}, {len(prompts[0])}-token prompt, {args.tokens} new tokens, "
          f"n={args.n}{', a fresh prompt each repetition' if args.fresh else ''}, "
          f"MLX {mx.__version__} on {mx.default_device()}, engine verify attention {args.verify_attention}",
          flush=True)
    for m in modes:  # warm-up, discarded
        timed(ours, m), timed(theirs, m)
    ratios: dict = {m: [] for m in modes}
    speeds: dict = {m: ([], []) for m in modes}
    seconds: dict = {m: ([], []) for m in modes}
    identical = {m: True for m in modes}
    engine_first: list[bool] = []
    for rep in range(args.n):
        if args.fresh:
            current[0] = prompts[rep + 1]
        # alternate which goes first, so neither always runs on a warmer host
        engine_first.append(rep % 2 == 0)
        for m in modes:
            first, second = (ours, theirs) if engine_first[-1] else (theirs, ours)
            a, b = timed(first, m), timed(second, m)
            (o_toks, o, o_s), (t_toks, t, t_s) = (a, b) if engine_first[-1] else (b, a)
            identical[m] &= o_toks == t_toks
            ratios[m].append(o / t)
            speeds[m][0].append(o)
            speeds[m][1].append(t)
            seconds[m][0].append(o_s)
            seconds[m][1].append(t_s)

    def order(m) -> str:
        """Each arm's median seconds when it ran first in its pair and when it ran second: with --fresh the first run at a new prompt pays its first-use work (2026-11-30g:
        the classic ratio followed the order, the engine paying 0.13-0.20 s, mlx-lm 0.06-0.08)."""
        med = lambda xs: f"{statistics.median(xs):.3f}" if xs else "-"  # noqa: E731
        eng, mlx = seconds[m]
        pick = lambda xs, want: [x for x, f in zip(xs, engine_first) if f is want]  # noqa: E731
        return (f"order: first in its pair engine {med(pick(eng, True))} s, mlx-lm {med(pick(mlx, False))} s; "
                f"second engine {med(pick(eng, False))} s, mlx-lm {med(pick(mlx, True))} s (medians)")
    ok = True
    print(f"{'mode':>8}  {'engine tok/s (med)':>18}  {'mlx-lm tok/s (med)':>18}  {'ratio min/med/max':>22}  tokens")
    for m in modes:
        name = "classic" if m is None else f"w{m}"
        r = ratios[m]
        med = statistics.median(r)
        ok &= med >= 0.97 and identical[m]
        print(f"{name:>8}  {statistics.median(speeds[m][0]):18.1f}  {statistics.median(speeds[m][1]):18.1f}  "
              f"{min(r):6.3f} {med:6.3f} {max(r):6.3f}  {'identical' if identical[m] else 'DIFFER'}")
        print(f"{'':>8}  per pair: " + " ".join(f"{x:.3f}" for x in r))
        if args.n >= 2:
            print(f"{'':>8}  {order(m)}")
    print("target (median ratio >= 0.97, identical tokens):", "met" if ok else "NOT met")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump({"pair": pair.describe(), "tokens": args.tokens, "n": args.n, "fresh": args.fresh,
                       "engine_first": engine_first,
                       "verify_attention": args.verify_attention, "verify_linear": args.verify_linear, "mlx": mx.__version__,
                       "modes": {("classic" if m is None else f"w{m}"): {
                           "engine_tok_s": speeds[m][0], "mlx_lm_tok_s": speeds[m][1],
                           "engine_s": seconds[m][0], "mlx_lm_s": seconds[m][1],
                           "ratios": ratios[m], "identical": identical[m]} for m in modes}}, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
