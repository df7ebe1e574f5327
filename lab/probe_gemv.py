"""Small-M projections on CUDA: stock matmul against K-row gemv kernels that read each weight
row once, with NPW output features a warp (x's chunk then serves NPW rows of w; NPW 1 is
engine.linear's ``gemv``), at the 3.5B pair's projection shapes by default.

Each figure is the median over ``--reps`` of one evaluation of 2 x ``--copies`` calls, each on
its own copy of the weight (so no call reads another's weight from L2), divided by the calls.
Without CUDA only the stock matmul is timed (the kernels are CUDA source).

    python -m lab.probe_gemv --json     (~1 minute on an H200)
"""
from __future__ import annotations

import argparse
import json
import sys
import time

SRC = """
    const int lane = threadIdx.x & 31;
    const int n0 = ((blockIdx.x * blockDim.x + threadIdx.x) >> 5) * NPW;
    if (n0 >= N) return;
    float acc[NPW][K];
    #pragma unroll
    for (int p = 0; p < NPW; ++p)
        #pragma unroll
        for (int r = 0; r < K; ++r) acc[p][r] = 0.0f;
    for (int i = lane * 8; i < D; i += 32 * 8) {
        float xf[K][8];
        #pragma unroll
        for (int r = 0; r < K; ++r) {
            const uint4 xv = *reinterpret_cast<const uint4*>(x + (size_t)r * D + i);
            const T* xp = reinterpret_cast<const T*>(&xv);
            #pragma unroll
            for (int j = 0; j < 8; ++j) xf[r][j] = static_cast<float>(xp[j]);
        }
        #pragma unroll
        for (int p = 0; p < NPW; ++p) {
            if (n0 + p < N) {
                const uint4 wv = *reinterpret_cast<const uint4*>(w + (size_t)(n0 + p) * D + i);
                const T* wp = reinterpret_cast<const T*>(&wv);
                #pragma unroll
                for (int j = 0; j < 8; ++j) {
                    const float wf = static_cast<float>(wp[j]);
                    #pragma unroll
                    for (int r = 0; r < K; ++r) acc[p][r] += wf * xf[r][j];
                }
            }
        }
    }
    #pragma unroll
    for (int p = 0; p < NPW; ++p) {
        #pragma unroll
        for (int r = 0; r < K; ++r) {
            float v = acc[p][r];
            #pragma unroll
            for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
            if (lane == 0 && n0 + p < N) out[(size_t)r * N + n0 + p] = static_cast<T>(v);
        }
    }
"""


def _positive_ints(text: str) -> list[int] | None:
    """``1,2,4`` as [1, 2, 4]; None unless every item is a positive integer."""
    try:
        vals = [int(v) for v in text.split(",")]
    except ValueError:
        return None
    return vals if all(v > 0 for v in vals) else None


def _shapes(text: str) -> dict[str, tuple[int, int]] | None:
    """``name=NxD,...`` as {name: (N, D)}; None unless every item has a new name, N and D
    positive and D a multiple of 8 (the kernel reads x and w 8 values at a time)."""
    shapes: dict[str, tuple[int, int]] = {}
    for item in text.split(","):
        name, sep, nd = item.partition("=")
        dims = nd.split("x")
        if not (name and sep and len(dims) == 2 and all(d.isdigit() for d in dims)) or name in shapes:
            return None
        n, d = int(dims[0]), int(dims[1])
        if n <= 0 or d <= 0 or d % 8:
            return None
        shapes[name] = (n, d)
    return shapes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--npw", default="1,2,4,8")
    ap.add_argument("--copies", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--shapes", default="q/o=4096x4096,k/v=1024x4096,gate/up=14336x4096,down=4096x14336",
                    help="name=NxD,... : weights of N output features over D inputs")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    # bad input: one line naming it, exit 2 (not a traceback, or a division by zero at --copies 0);
    # explicit checks, not asserts, which python -O drops
    shapes = _shapes(args.shapes)
    if shapes is None:
        print(f"--shapes {args.shapes}: name=NxD items, distinct names, N and D positive, D a multiple of 8",
              file=sys.stderr)
        return 2
    rows, npws = _positive_ints(args.rows), _positive_ints(args.npw)
    for flag, text, vals in (("--rows", args.rows, rows), ("--npw", args.npw, npws)):
        if vals is None:
            print(f"{flag} {text}: comma-separated positive integers", file=sys.stderr)
            return 2
    for flag, val in (("--copies", args.copies), ("--reps", args.reps)):
        if val < 1:
            print(f"{flag} {val}: at least 1", file=sys.stderr)
            return 2
    import mlx.core as mx

    cuda = mx.default_device() == mx.gpu and mx.cuda.is_available()
    kern = (mx.fast.cuda_kernel(name="probe_rows_gemv", input_names=["x", "w"], output_names=["out"], source=SRC)
            if cuda else None)

    def gemv(x, w, npw):
        m, d = x.shape
        n = w.shape[0]
        warps = (n + npw - 1) // npw
        threads = (warps * 32 + 127) // 128 * 128
        return kern(inputs=[x, w], template=[("T", x.dtype), ("K", m), ("D", d), ("N", n), ("NPW", npw)],
                    grid=(threads, 1, 1), threadgroup=(128, 1, 1), output_shapes=[(m, n)],
                    output_dtypes=[x.dtype])[0]

    out = {"mlx": mx.__version__, "device": str(mx.default_device()), "us_per_call": {}}
    for name, (n, d) in shapes.items():
        ws = [mx.random.normal((n, d)).astype(mx.bfloat16) * 0.02 for _ in range(args.copies)]
        mx.eval(ws)
        res = {}
        for m in rows:
            x = mx.random.normal((m, d)).astype(mx.bfloat16)
            ref = (x.astype(mx.float32) @ ws[0].astype(mx.float32).T)
            variants = {"stock": lambda w: x @ w.T}
            for p in (npws if cuda else []):
                variants[f"gemv{p}"] = (lambda p: lambda w: gemv(x, w, p))(p)
            for vname, f in variants.items():
                err = (mx.abs(f(ws[0]).astype(mx.float32) - ref).max() / mx.abs(ref).max()).item()
                times = []
                for _ in range(args.reps):
                    mx.eval([f(w) for w in ws])
                    t0 = time.perf_counter()
                    mx.eval([f(w) for w in ws] + [f(w) for w in ws])
                    times.append((time.perf_counter() - t0) / (2 * len(ws)) * 1e6)
                times.sort()
                res[f"{vname} m{m}"] = {"us": round(times[len(times) // 2], 1), "rel_err": round(err, 5)}
        out["us_per_call"][f"{name} {n}x{d}"] = res
        del ws
    print(json.dumps(out) if args.json else json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
