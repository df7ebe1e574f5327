"""Is a verify slow because its host work and its GPU work run one after the other?

A classic step of the 1B pair costs ~3-4.5 ms inside the decode loop and a
4-row verify ~6-9 ms, whatever the projections (``gather``) or the attention
(``vector``) do. The classic loop builds and submits step n+1 while the GPU
runs step n (``async_eval``, as mlx-lm's ``generate_step``); a speculative
round cannot know its next input before the verify's tokens come back, so the
host's work (building the graph, MLX encoding the kernels) and the GPU's work
add up. This probe times, on a random model of the GPU pair's shape with a KV
cache, one forward of 1 and of K rows four ways:

- ``pipelined``: the classic loop (next step submitted before this one is read);
- ``synced``: build, evaluate, read, one after the other (what a round does);
- ``build``: the graph construction alone (the model call, nothing evaluated);
- ``eval``: the evaluation of an already built graph, to the tokens on the host.

    python -m lab.probe_overlap --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def verify_laps(target, prompt, k: int, steps: int, attention: str) -> tuple[list, list, list, dict]:
    """``steps`` verify forwards of ``k`` rows on a cache freshly prefilled with ``prompt``, each at
    a KV length one past the last (a round that kept nothing), under ``attention``: seconds of
    graph building, of evaluation to the tokens on the host, and of both, and the routing's
    summary."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.decode import greedy
    from blockwidth.engine.kvcache import rewind

    perf = time.perf_counter
    cache = make_prompt_cache(target)
    mx.eval(target(prompt[None], cache=cache))
    block = mx.array([11 + i for i in range(k)], mx.uint32)
    build, ev, synced = [], [], []
    with verify_attention(attention) as routing:  # auto, as a verify runs: no cuDNN plan per KV length
        for _ in range(steps):
            t0 = perf()
            toks = greedy(target(block[None], cache=cache)[0, -k:, :])
            t1 = perf()
            toks.tolist()
            t2 = perf()
            build.append(t1 - t0)
            ev.append(t2 - t1)
            synced.append(t2 - t0)
            rewind(cache, k - 1)  # a round that accepted nothing: the cache grows by one a round
    return build, ev, synced, routing.summary()


def main(argv: list[str] | None = None) -> int:
    from blockwidth.engine.attention import CHOICES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--quant", action="store_true")
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--attention", default="auto", choices=CHOICES,
                    help="verify attention of the 2+-row forwards (engine.attention's choices)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine.costcurve import context_ids
    from blockwidth.engine.decode import greedy
    from lab.probe_loop import _models

    target, _ = _models(args.shape, args.quant)
    prompt = mx.array(context_ids(300), mx.uint32)
    out: dict = {"mlx": mx.__version__, "device": str(mx.default_device()), "shape": args.shape,
                   "quant": args.quant, "steps": args.steps, "attention": args.attention}
    perf = time.perf_counter
    ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731

    # pipelined classic: what engine.decode.classic does
    cache = make_prompt_cache(target)
    mx.eval(target(prompt[None], cache=cache))
    y = greedy(target(prompt[-1:][None], cache=cache)[:, -1, :])
    mx.async_eval(y)
    laps, last = [], perf()
    for _ in range(args.steps):
        nxt = greedy(target(y[None], cache=cache)[:, -1, :])
        mx.async_eval(nxt)
        y.item()
        now = perf()
        laps.append(now - last)
        last = now
        y = nxt
    out["pipelined_1row_ms"] = ms(laps[5:])

    for k in (int(r) for r in args.rows.split(",")):
        build, ev, synced, _ = verify_laps(target, prompt, k, args.steps, args.attention)
        out[f"rows{k}"] = {"build_ms": ms(build[5:]), "eval_ms": ms(ev[5:]), "synced_ms": ms(synced[5:])}
    text = json.dumps(out, indent=None if args.json else 1)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
