"""Is the ``rows`` verify attention right, and does it make a verify cheaper? (CUDA)

engine.attention's ``rows`` mode is the engine's own CUDA kernel for 2..64 causal query rows
against the KV cache. On the H200 (2026-11-30e, random 3.5B, 16 layers) a 2-8-row verify's
attention cost 0.96-1.77 ms a forward through ``plain`` or ``vector`` against 0.35 ms for the
fused 1-row kernel, and the forward 5.6-6.9 ms against 4.0 at one row. This probe:

1. **parity**: the kernel's output against float32 attention (``plain`` on float32 copies of
   the same inputs, computed on the CPU: on the H200 (2026-11-30f), with the reference computed
   on the GPU, 203 float32 cases failed at 1e-4 to 1.3e-3 while every bf16 and f16 case passed;
   a GPU float32 matmul may use TF32, so only a CPU reference can tell a float32 kernel error) over dtypes (bf16, f16, f32), head sizes (64, 96, 128), grouped and ungrouped
   heads, 2-16 rows, KV lengths from the rows themselves to 1000, causal and unmasked, with q
   a transposed view and k / v views into a longer cache buffer (as mlx-lm's cache hands them
   over), 1080 cases, then 28 at the edges that grid leaves out (head sizes 32 and 256, a
   batch of 2, 64 rows); each case passes when its largest difference is within the dtype's
   tolerance;
2. **time**: one verify forward of a random model of the GPU pair's shape (``--shape``) at a
   fresh KV length each step, as decoding advances, built, evaluated and read (a round's
   synced cost), under ``plain``, ``vector`` and ``rows`` in ABBA order, at each row count.

    python -m lab.probe_rows --out rows.json     (CUDA; ~1-2 minutes on an H200)

Exit status 0 when every parity case passed, 1 when one failed (the pipeline then sweeps no
``rows`` arm), 2 on bad input or without CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

TOL = {"bfloat16": 2e-2, "float16": 4e-3, "float32": 1e-4}


def cases() -> list[tuple]:
    """(dtype name, B, D, n_q, n_kv, L, S, causal) of every parity case: the 1080 of the
    2026-11-30f run (batch 1, head sizes 64-128, 2-16 rows), then the edges that run left out:
    the smallest and largest head size the kernel takes (32, 256: a lane holds one value, or
    eight, and the block's shared output is largest), a batch of 2 (the batch stride), and
    64 rows (the most a verify routes) against as many keys and more."""
    out = []
    for dtype in ("bfloat16", "float16", "float32"):
        for D in (64, 96, 128):
            for n_q, n_kv in ((8, 8), (32, 8)):
                for L in (2, 3, 4, 6, 8, 16):
                    for S in sorted({L, L + 1, 257, 300, 1000}):
                        for causal in (True, False):
                            out.append((dtype, 1, D, n_q, n_kv, L, S, causal))
    for dtype in ("bfloat16", "float32"):
        for B, D, L, S in ((1, 32, 4, 300), (1, 256, 4, 300), (2, 128, 5, 77), (2, 256, 8, 1000),
                           (1, 128, 64, 64), (1, 64, 64, 1000), (2, 32, 64, 65)):
            for causal in (True, False):
                out.append((dtype, B, D, 32, 8, L, S, causal))
    return out


def parity() -> list[dict]:
    import mlx.core as mx

    from blockwidth.engine.attention import plain_attention, rows_attention, rows_fits

    mx.random.seed(1)
    results = []
    for name, B, D, n_q, n_kv, L, S, causal in cases():
        dtype = getattr(mx, name)
        cap = S + 37
        q = mx.random.normal((B, L, n_q, D)).astype(dtype).transpose(0, 2, 1, 3)
        kb = mx.random.normal((B, n_kv, cap, D)).astype(dtype)
        vb = mx.random.normal((B, n_kv, cap, D)).astype(dtype)
        k, v = kb[:, :, :S], vb[:, :, :S]
        mask = "causal" if causal else None
        scale = D ** -0.5
        fits = rows_fits(q.shape, k.shape, v.shape, (q.dtype, k.dtype, v.dtype), mask, None, scale)
        got = rows_attention(q, k, v, scale=scale, causal=causal)
        with mx.stream(mx.cpu):  # float32 as float32 (a GPU matmul may be TF32)
            ref = plain_attention(q.astype(mx.float32), k.astype(mx.float32),
                                  v.astype(mx.float32), scale=scale, mask=mask)
        err = mx.abs(got.astype(mx.float32) - ref).max().item()
        results.append({"dtype": name, "batch": B, "D": D, "heads": f"{n_q}/{n_kv}", "rows": L,
                        "keys": S, "causal": causal, "fits": fits, "max_abs_err": err,
                        "ok": fits and err <= TOL[name]})
    return results


def timing(shape: str, rows: list[int], steps: int, modes: list[str]) -> dict:
    import mlx.core as mx

    from blockwidth.engine.costcurve import context_ids
    from lab.probe_loop import _models
    from lab.probe_overlap import verify_laps

    target, _ = _models(shape, False)
    prompt = mx.array(context_ids(300), mx.uint32)
    out: dict = {}
    for k in rows:
        laps: dict = {}
        for mode in modes + modes[::-1]:  # ABBA: drift lands on every mode alike
            _, _, synced, routing = verify_laps(target, prompt, k, steps, mode)
            laps.setdefault(mode, []).extend(synced)
            out.setdefault(f"rows{k}", {}).setdefault(f"{mode}_routing", routing)
        for mode, v in laps.items():
            out[f"rows{k}"][mode] = round(statistics.median(v[5:]) * 1e3, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the JSON here (and print a summary)")
    ap.add_argument("--shape", default="3.5b", help="random model for the timing (build_gpu shapes)")
    ap.add_argument("--rows", default="2,4,6,8")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--modes", default="plain,vector,rows")
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",")]
        if not rows or any(not 2 <= r <= 64 for r in rows):
            raise ValueError
    except ValueError:
        print(f"--rows {args.rows!r}: comma-separated row counts from 2 to 64", file=sys.stderr)
        return 2
    if args.steps < 6:
        print(f"--steps {args.steps}: at least 6 (the first 5 are not timed)", file=sys.stderr)
        return 2
    import mlx.core as mx

    from blockwidth.engine.attention import CHOICES, current_backend
    from lab.build_gpu import SHAPES

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in CHOICES]
    if bad or not modes:
        print(f"--modes {args.modes!r}: choose from {', '.join(CHOICES)}", file=sys.stderr)
        return 2
    if args.shape not in SHAPES:
        print(f"--shape {args.shape!r}: one of {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if current_backend() != "cuda":
        print(f"probe_rows: the rows kernel is CUDA source; this device is {current_backend()}",
              file=sys.stderr)
        return 2
    checked = parity()  # not named ``cases``: that is the module's list of them
    failed = [c for c in checked if not c["ok"]]
    out = {"mlx": mx.__version__, "device": mx.device_info().get("device_name"),
           "parity": {"cases": len(checked), "failed": failed,
                      "max_abs_err": {d: max(c["max_abs_err"] for c in checked if c["dtype"] == d)
                                      for d in TOL},
                      "tolerance": TOL}}
    if not args.skip_timing:
        out["verify_ms"] = {"shape": args.shape, "steps": args.steps,
                            **timing(args.shape, rows, args.steps, modes)}
    text = json.dumps(out, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(json.dumps({"parity_failed": len(failed), "of": len(checked),
                      "max_abs_err": out["parity"]["max_abs_err"],
                      "verify_ms": out.get("verify_ms")}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
