"""Host time of a classic 1-row step, stock against the exact path's ``mlx`` route.

On a host-bound target (SmolLM2-135M on the H200: ~4-6 ms a token, most of it Python and kernel
launches) what the exact path adds to classic is the dispatchers' Python per call. That time is
the same on any backend: this probe measures it where no GPU is, as the time to *build* one
step's graph (the model's __call__ up to the argmax, before mx.eval), for

- ``stock``: mlx-lm's own cache, no dispatcher block open (the session's stock classic arm);
- ``path``: the exact path's block (engine.exact.path) with the ``mlx`` route and CUDA's code
  paths taken (engine.attention.current_backend reads "cuda"; below 256 keys and on the path's
  off-step buffers every 1-row call is MLX's own, so nothing CUDA-only runs) and off-step caches.

Interleaved, ``--reps`` passes of ``--steps`` steps each, medians of per-step build times.

    python -m lab.probe_host MODEL_DIR [MODEL_DIR ...] [--steps 64] [--reps 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def _steps(model, cache, first, steps, block):
    import mlx.core as mx

    y = first
    out = []
    for _ in range(steps):
        with block():
            t0 = time.perf_counter()
            logits = model(y[None], cache=cache)
            y = mx.argmax(logits[0, -1:], axis=-1)
            t1 = time.perf_counter()
        mx.eval(y)
        out.append((t1 - t0) * 1e3)
    return out


def measure(folder: str, steps: int, reps: int, prompt_len: int = 64) -> dict:
    import contextlib

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine import attention, exact, kvcache

    model, _ = load(folder)
    prompt = mx.array([(i * 7919) % 1000 + 10 for i in range(prompt_len)])
    plan = exact.Plan(asked=exact.Exact.ON, backend="cuda", active=True, exact=True, reason="probe",
                      route="mlx")
    real_backend = attention.current_backend
    ways = {}

    def run(way):
        if way == "stock":
            cache = make_prompt_cache(model)
            block = contextlib.nullcontext
        else:
            cache = kvcache.make_cache(model, 8, off_step_buffers=True)
            block = lambda: exact.path(plan)  # noqa: E731
        mx.eval(model(prompt[None], cache=cache))
        first = mx.array([prompt[-1].item()])
        return _steps(model, cache, first, steps, block)

    attention.current_backend = lambda: "cuda"
    try:
        for rep in range(reps + 1):  # the first pass warms both, unrecorded
            for way in ("stock", "path"):
                t = run(way)
                if rep:
                    ways.setdefault(way, []).extend(t)
    finally:
        attention.current_backend = real_backend
    med = {w: statistics.median(t) for w, t in ways.items()}
    return {"model": folder, "steps": steps, "reps": reps, "build_ms_median": med,
            "path_over_stock": med["path"] / med["stock"],
            "added_ms": med["path"] - med["stock"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = [measure(m, a.steps, a.reps) for m in a.models]
    for r in rows:
        m = r["build_ms_median"]
        print(f"{r['model']}: build a 1-row step: stock {m['stock']:.3f} ms, path {m['path']:.3f} ms "
              f"(+{r['added_ms']:.3f} ms, {r['path_over_stock']:.3f}x)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
