"""Is engine.qmv's kernel right, and does it make a quantized verify cheaper? (CUDA)

engine/linear.py's ``qmv`` mode sends a verify's 2..8-row affine-quantized projections to
engine/qmv.py's kernel, which reads the quantized weights once for all rows (MLX 0.32.4's CUDA
``qmv`` reads them once per row: a 4-row verify of an 8B 4-bit target cost 2.5x its 1-row
forward on the H200). This probe, in one process:

1. **compile**: every kernel instance the cases and the model need, timed (NVRTC through
   ``mx.fast.cuda_kernel``); a failure prints MLX's error, NVRTC's log included, in full, and
   writes the instance's generated source to ``OUT/src/`` (``emit`` writes them all);
2. **parity**: the kernel's output (NaN-filled before the call, so an unwritten output shows)
   against MLX's ``quantized_matmul`` computed on the CPU in float32 (float32 x, scales and
   biases: the exact affine product), for 4 and 8 bits, groups 32 / 64 / 128, rows 1..8, N not
   a multiple of the 16-row tile, K not a multiple of 512, bfloat16 and float16; each case
   passes by ``engine.qmv.parity`` (its docstring derives the bound from 16-bit output
   rounding); stock's GPU error against the same reference beside it at rows 1..7 (its
   ``qmv``; at 8 rows stock is ``qmm``, JIT-compiled at first use: ``--stock-qmm``); and the
   product's call path (``direct``, ``compile``) bitwise equal to the checked call; no case
   starts past 35 % of ``--budget-s``;
3. **projections**: the 8B layer's projections (q/o 4096x4096, k/v 1024x4096, gate/up
   14336x4096, down 4096x14336; 4-bit group 64) at rows 1..8, stock against the kernel
   called ``direct`` and through ``mx.compile``: the first call (cold), the median of calls
   evaluated one by one (warm; weight copies rotated past the L2), a chain of calls evaluated
   once, and the host's share (building the chain, per call);
4. **curves**: the verify forward of an 8B-shaped random 4-bit Llama (lab.synthetic), rows
   1..16, by engine.costcurve (wall clock, each forward at a fresh KV length, cold and warm),
   stock, ``qmv`` direct and ``qmv`` compile in rotated order, ``--passes`` times; then the
   rows at which ``qmv`` beat stock by 10 % in every pass (engine.linear.rows_won: the rule
   ``auto`` follows) and the ``QMV_WINS`` entries they would make; stock and ``qmv`` logits of
   one forward side by side; with time left, the same for an 8-bit target. Prefixes go in
   16-token forwards (PREFILL_STEP).

Where the time goes on a fresh host is NVRTC: 17 kernel instances at 1.3-2.5 s each, and MLX's
own JIT-compiled kernels at their first use, above all stock's CUTLASS ``qmm`` (8+ rows: 15-50
s per kernel, dtype, bits, group and row tile; MLX keeps their PTX in its cache directory, which
a fresh host has empty). On 2026-12-01 the parity took 232 s, ~200 of them in the 13 ``qmm``
modules its 8-row stock calls compiled; now the probe meets two (the 4- and 8-bit 16-row tile
the curves need at rows 8-16), and the record's ``sections`` give each section's seconds and
the modules MLX compiled in it. ``--sections`` runs a part (``compile,parity`` first, then
``projections,curves``: a section compiles what it needs itself), to split the probe over two
calls of a harness that stops a command at a fixed time.

    python -m lab.probe_qmv --out DIR          (CUDA: ~3 minutes on a fresh H200, estimated)
    python -m lab.probe_qmv --out DIR          (no CUDA: the CPU parts on tiny shapes, seconds)
    python -m lab.probe_qmv emit --out DIR     (every instance's generated .cu, for nvcc)
    python -m lab.probe_qmv ncu --out DIR      (a workload for Nsight Compute: device time)
    python -m lab.probe_qmv ncu-parse --csv RAW --labels DIR/ncu_labels.json --out DIR/ncu.json

Writes DIR/probe_qmv.json (rewritten after every section: a later failure loses nothing) and
DIR/log.txt. Exit 0 when every parity case passed, 1 when one failed, 2 on bad input or a
non-tiny --shape without CUDA.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

SHAPES = ("8b", "tiny")
LAYER_8B = (("q/o", 4096, 4096), ("k/v", 1024, 4096), ("gate/up", 14336, 4096), ("down", 4096, 14336))
LAYER_TINY = (("q/o", 256, 256), ("k/v", 128, 256), ("gate/up", 512, 256), ("down", 256, 512))
CURVE_ROWS = tuple(range(1, 17))
STRATEGIES = ("direct", "compile")


def parity_cases(tiny: bool) -> list[tuple[int, int, int, int, str]]:
    """(bits, group, N, K, dtype) of every parity case (each at rows 1..8). Every bits x group
    at a narrow N = 1000 (62.5 tiles) with K = 4096 and at N = 4104 with a K that is no
    multiple of 512 (2880: 45 groups of 64, 90 of 32; 2944: 23 of 128); the 8B projections
    and the odd-sized chunks (u = 1, 2) at 4-bit group 64; float16 at group 64."""
    if tiny:
        return [(4, 64, 40, 192, "bfloat16"), (8, 32, 24, 96, "bfloat16"), (4, 128, 17, 384, "float16")]
    out = []
    for bits, group in itertools.product((4, 8), (32, 64, 128)):
        out.append((bits, group, 1000, 4096, "bfloat16"))
        out.append((bits, group, 4104, 2944 if group == 128 else 2880, "bfloat16"))
    out += [(4, 64, 14336, 4096, "bfloat16"), (4, 64, 4096, 14336, "bfloat16"),
            (4, 64, 40, 640, "bfloat16"), (4, 64, 2050, 576, "bfloat16"),
            (4, 64, 1000, 4096, "float16"), (4, 64, 4104, 2880, "float16"), (8, 64, 1000, 4096, "float16")]
    return out


class Record:
    """The probe's JSON, rewritten whole (temp file + rename) after every section."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict = {"kind": "qmv-probe"}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        os.replace(tmp, self.path)


class Log:
    def __init__(self, path: Path):
        self.f = path.open("a", encoding="utf-8")
        self.t0 = time.time()

    def __call__(self, *parts) -> None:
        line = f"[{time.time() - self.t0:6.1f}s] " + " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()

    @property
    def elapsed(self) -> float:
        return time.time() - self.t0


def generated_source(bits: int, group: int, dtype: str, u: int) -> tuple[str, str]:
    """(kernel name, source) as MLX 0.32's ``build_kernel`` (mlx/backend/cuda/custom_kernel.cpp)
    assembles them for engine.qmv's inputs: default header, header, the signature (x with its
    shape and rank, w with its shape, scales, biases, y), the instance's source."""
    from blockwidth.engine import qmv

    name = "custom_kernel_" + qmv.instance_name(bits, group, dtype, u)
    t = "__nv_bfloat16" if dtype == "bfloat16" else "__half"
    s = '\n#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
    s += qmv.header_for(bits, group, dtype, u)
    s += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n"
    s += (f"__global__ void {name}(\n    const {t}* x,\n    const __grid_constant__ Shape x_shape,\n"
          f"    const __grid_constant__ int x_ndim,\n    const uint32_t* w,\n"
          f"    const __grid_constant__ Shape w_shape,\n    const {t}* scales,\n    const {t}* biases,\n"
          f"    {t}* y) {{\n")
    s += qmv.source_for(bits, group, dtype, u)
    s += "\n}\n\n} // namespace mlx::core::cu\n"
    return name, s


def all_instances():
    from blockwidth.engine import qmv

    return list(itertools.product(qmv.BITS, qmv.GROUPS, qmv.DTYPES, (1, 2, 4, 8)))


# --- helpers on the device ------------------------------------------------------------------
def _quantized(n: int, k: int, bits: int, group: int, dtype: str, seed: int):
    import mlx.core as mx

    dt = getattr(mx, dtype)
    w = (mx.random.normal((n, k), key=mx.random.key(seed)) * 0.02).astype(dt)
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    mx.eval(wq, s, b)
    return wq, s, b


def checked_call(x, wq, s, b, bits: int, group: int):
    """The kernel on ``x`` [rows, K] with its output filled with NaN first: an output the kernel
    never writes stays NaN (the product's call leaves it uninitialised)."""
    from blockwidth.engine import qmv

    rows, k = x.shape
    lc = qmv.launch(wq.shape[0], k, rows, bits, group)
    dtype = str(x.dtype).rsplit(".", 1)[-1]
    return qmv.kernel(bits, group, dtype, lc.u)(
        inputs=[x, wq, s, b], grid=lc.grid, threadgroup=lc.threadgroup, output_shapes=[(rows, wq.shape[0])],
        output_dtypes=[x.dtype], init_value=float("nan"))[0]


def _np(a):
    import mlx.core as mx
    import numpy as np

    return np.array(a.astype(mx.float32)).astype(np.float64)


def ptx_cache_dir() -> Path:
    """Where MLX's CUDA build keeps the PTX of what it JIT-compiles (its own kernels, such as
    the CUTLASS ``qmm``, and custom kernels): ``MLX_PTX_CACHE_DIR``, else the temp directory's
    ``mlx/<version>/ptx`` (mlx/backend/cuda/jit_module.cpp). A fresh host's is empty."""
    import tempfile

    import mlx.core as mx

    env = os.environ.get("MLX_PTX_CACHE_DIR")
    return Path(env) if env else Path(tempfile.gettempdir()) / "mlx" / mx.__version__ / "ptx"


def jit_modules() -> set[str]:
    """The modules in MLX's PTX cache now (names as MLX gives them, without .ptx)."""
    d = ptx_cache_dir()
    try:
        return {str(p.relative_to(d))[:-4] for p in d.rglob("*.ptx")}
    except OSError:
        return set()


# --- sections ---------------------------------------------------------------------------------
def section_compile(log: Log, out: Path, cases, cuda: bool) -> dict:
    """Compile every instance the parity cases and the 8B projections need (each once)."""
    from blockwidth.engine import qmv

    need = set()
    for bits, group, n, k, dtype in cases:
        need.add((bits, group, dtype, qmv.launch(n, k, 2, bits, group).u))
    for _, n, k in LAYER_8B:
        need.add((4, 64, "bfloat16", qmv.launch(n, k, 2, 4, 64).u))
    res = {}
    if not cuda:
        log("compile: refused (no CUDA): instances the GPU run would compile:",
            ", ".join(qmv.instance_name(*i) for i in sorted(need)))
        return {"refused": "no CUDA", "instances": [qmv.instance_name(*i) for i in sorted(need)]}
    for inst in sorted(need):
        name = qmv.instance_name(*inst)
        try:
            sec = qmv.compile_instance(*inst)
            res[name] = {"s": sec}
            log(f"compile {name}: {sec:.2f} s")
        except Exception as e:  # NVRTC's log is in the message: print it whole
            (out / "src").mkdir(exist_ok=True)
            kname, src = generated_source(*inst)
            (out / "src" / f"{kname}.cu").write_text(src)
            res[name] = {"error": str(e), "source": f"src/{kname}.cu"}
            log(f"compile {name}: FAILED\n{e}\n(source: {out / 'src' / (kname + '.cu')})")
    return res


STOCK_QMV_ROWS = range(1, 8)  # stock's per-row qmv kernel, built into MLX: no compile at first use
PARITY_SHARE = 0.35  # of --budget-s: past it no parity case starts (the H200's full set: ~10 s)


def section_parity(log: Log, cases, cuda: bool, compiled: dict, budget: float = math.inf,
                   stock_qmm: bool = False) -> tuple[dict, bool]:
    """Every case at rows 1..8: the kernel against the CPU's float32 reference, stock's GPU
    error beside it. Stock's error is read at rows 1..7 only (its ``qmv``) unless ``stock_qmm``:
    at 8 rows stock is MLX's ``qmm``, JIT-compiled CUTLASS (``qmm_sm80`` where N is a multiple
    of 128, ``qmm_naive`` elsewhere), one NVRTC compile of 15-35 s per (kernel, dtype, bits,
    group, row tile) on a host whose MLX PTX cache is empty: 13 of them were ~200 of the 205 s
    the H200's parity took on 2026-12-01 (the CPU's reference for all 19 shapes took 5.8 s on a
    2-core CPU). Past ``budget`` (the probe's clock) no case starts: the rest are listed as
    skipped and the section is not complete."""
    import mlx.core as mx
    import numpy as np

    from blockwidth.engine import qmv

    results, all_ok, t0, skipped = [], True, time.time(), []
    for ci, (bits, group, n, k, dtype) in enumerate(cases):
        if log.elapsed > budget:
            skipped.append({"bits": bits, "group": group, "n": n, "k": k, "dtype": dtype})
            continue
        tc = time.time()
        wq, s, b = _quantized(n, k, bits, group, dtype, 100 + ci)
        x8 = mx.random.normal((8, k), key=mx.random.key(7 + ci)).astype(getattr(mx, dtype))
        mx.eval(x8)
        t_ref = time.time()
        with mx.stream(mx.cpu):  # float32 as float32: the exact affine product (no TF32)
            ref8 = mx.quantized_matmul(x8.astype(mx.float32), wq, s.astype(mx.float32), b.astype(mx.float32),
                                       transpose=True, group_size=group, bits=bits)
            mx.eval(ref8)
        ref8 = np.array(ref8).astype(np.float64)
        secs = {"setup": t_ref - tc, "reference": time.time() - t_ref, "stock": 0.0, "kernel": 0.0}
        u = qmv.launch(n, k, 2, bits, group).u
        name = qmv.instance_name(bits, group, dtype, u)
        for rows in range(1, 9):
            x = x8[:rows]
            case = {"bits": bits, "group": group, "n": n, "k": k, "rows": rows, "dtype": dtype,
                    "u": u, "warps": qmv.launch(n, k, rows, bits, group).warps}
            t1 = time.time()
            if rows in STOCK_QMV_ROWS or stock_qmm:
                st = mx.quantized_matmul(x, wq, s, b, transpose=True, group_size=group, bits=bits)
                case["stock"] = qmv.parity(_np(st), ref8[:rows], dtype)
            else:
                case["stock"] = "not run: qmm (JIT-compiled at first use; --stock-qmm runs it)"
            t2 = time.time()
            secs["stock"] += t2 - t1
            if not cuda:
                case["kernel"] = "refused: no CUDA"
            elif "error" in compiled.get(name, {"error": "not compiled"}):
                case["kernel"] = "not compiled"
                all_ok = False
            else:
                try:
                    y = checked_call(x, wq, s, b, bits, group)
                    v = qmv.parity(_np(y), ref8[:rows], dtype)
                    case["kernel"] = v
                    if rows in (2, 8):  # the product's calls compute exactly the checked call
                        same = {}
                        for strat in STRATEGIES:
                            got = qmv.matmul(x[None], wq, s, b, bits, group, strat)[0]
                            same[strat] = bool(mx.array_equal(got, y).item())
                        case["product_call_equal"] = same
                        v["ok"] = v["ok"] and all(same.values())
                    if not v["ok"]:
                        all_ok = False
                        log("parity FAILED", json.dumps(case))
                except Exception as e:
                    case["kernel"] = {"ok": False, "error": str(e)}
                    all_ok = False
                    log("parity ERROR", json.dumps({kk: vv for kk, vv in case.items() if kk != "stock"}), "\n", e)
            secs["kernel"] += time.time() - t2
            results.append(case)
        results[-1]["seconds"] = {kk: round(vv, 3) for kk, vv in secs.items()}  # the case's, on its row 8
        kv = [c["kernel"] for c in results[-8:] if isinstance(c["kernel"], dict) and "max_abs_over_max_ref" in c["kernel"]]
        sv = [c["stock"]["max_abs_over_max_ref"] for c in results[-8:] if isinstance(c["stock"], dict)]
        log(f"parity {bits}-bit g{group} {n}x{k} {dtype}: kernel worst max/max "
            + (f"{max(v['max_abs_over_max_ref'] for v in kv):.2e} rel_l2 {max(v['rel_l2'] for v in kv):.2e} "
               f"(tol {kv[0]['max_tol']:.2e})" if kv else "-")
            + f"; stock worst {max(sv):.2e}; s " + " ".join(f"{kk} {vv:.2f}" for kk, vv in secs.items()))
        del wq, s, b
        mx.clear_cache()
    passed = sum(1 for c in results if isinstance(c["kernel"], dict) and c["kernel"].get("ok"))
    summary = {"cases": len(results), "kernel_passed": passed, "all_ok": all_ok and cuda and not skipped,
               "complete": not skipped, "skipped": skipped, "stock_rows": list(range(1, 9)) if stock_qmm
               else list(STOCK_QMV_ROWS), "seconds": time.time() - t0, "results": results}
    log(f"parity: {passed} of {len(results)} kernel cases passed" + ("" if cuda else " (no CUDA: stock only)")
        + (f"; {len(skipped)} shapes skipped at the budget" if skipped else ""))
    return summary, all_ok


def _impls(cuda: bool, bits: int = 4, group: int = 64):
    import mlx.core as mx

    from blockwidth.engine import qmv

    out = {"stock": lambda x, w, s, b: mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=bits)}
    if cuda:
        for strat in STRATEGIES:
            out[f"qmv-{strat}"] = (lambda st: lambda x, w, s, b: qmv.matmul(x, w, s, b, bits, group, st))(strat)
    return out


def section_projections(log: Log, layer, cuda: bool, reps: int, budget: float, tiny: bool) -> dict:
    import mlx.core as mx

    from blockwidth.engine import qmv

    res = {}
    all_rows = (1, 2, 8) if tiny else tuple(range(1, 9))
    if cuda:  # NVRTC before any clock (a no-op where the compile section ran)
        for _, n, k in layer:
            qmv.compile_instance(4, 64, "bfloat16", qmv.launch(n, k, 2, 4, 64).u)
    for label, n, k in layer:
        nbytes = n * k // 2 + 2 * 2 * n * (k // 64)
        copies = 2 if tiny else min(64, max(2, math.ceil(160e6 / nbytes)))
        ws = [_quantized(n, k, 4, 64, "bfloat16", 1000 + i) for i in range(copies)]
        chain = 4 if tiny else max(copies, min(4 * copies, 200))
        for rows in all_rows:
            xs = [mx.random.normal((1, rows, k), key=mx.random.key(rows * 10 + i)).astype(mx.bfloat16) for i in range(4)]
            mx.eval(xs)
            for name, f in _impls(cuda).items():
                t1 = time.perf_counter()
                mx.eval(f(xs[0], *ws[0]))
                first = time.perf_counter() - t1
                per = []
                for i in range(reps):
                    w = ws[(i + 1) % copies]
                    t1 = time.perf_counter()
                    mx.eval(f(xs[i % 4], *w))
                    per.append(time.perf_counter() - t1)
                builds, chains = [], []
                for _ in range(3):
                    t1 = time.perf_counter()
                    ys = [f(xs[i % 4], *ws[i % copies]) for i in range(chain)]
                    t2 = time.perf_counter()
                    mx.eval(ys)
                    chains.append((time.perf_counter() - t1) / chain)
                    builds.append((t2 - t1) / chain)
                warm = statistics.median(per)
                res[f"{n}x{k}/r{rows}/{name}"] = {
                    "projection": label, "n": n, "k": k, "rows": rows, "impl": name, "first_us": first * 1e6,
                    "warm_us": warm * 1e6, "warm_runs_us": [p * 1e6 for p in per],
                    "chain_us": statistics.median(chains) * 1e6, "build_us": statistics.median(builds) * 1e6,
                    "chain": chain, "copies": copies, "weight_bytes": nbytes,
                    "chain_GBps": nbytes / statistics.median(chains) / 1e9}
        line = []
        for rows in (1, 2, 8) if tiny else (1, 2, 4, 8):
            cells = [f"{nm.replace('qmv-', '')} {res[f'{n}x{k}/r{rows}/{nm}']['warm_us']:.0f}/"
                     f"{res[f'{n}x{k}/r{rows}/{nm}']['chain_us']:.0f}" for nm in _impls(cuda)]
            line.append(f"r{rows}: " + " ".join(cells))
        log(f"projection {label} {n}x{k} us warm/chain:", " | ".join(line))
        del ws
        mx.clear_cache()
        if log.elapsed > budget:
            log("projections: stopped at the budget")
            break
    return res


# The prefixes go in 16-token forwards: stock's qmm for 9-16 rows (MLX's 16-row tile, which the
# curves' rows 9-16 compile anyway); one 64- or 128-token forward would JIT-compile the 64-row
# tile as well, per bits, at first use (47 s for 4-bit on the H200, 2026-12-01).
PREFILL_STEP = 16


def _curve(model, mode: str, strategy: str, rows, repeats: int):  # noqa: D103
    from blockwidth.engine import costcurve

    os.environ["BLOCKWIDTH_QMV_CALL"] = strategy
    c = costcurve.measure(model, rows, context=128, repeats=repeats, warmup=2, linear=mode,
                          prefill_step=PREFILL_STEP)
    return c.to_dict()


def _logits_side_by_side(model, cuda: bool) -> dict:
    """One forward at rows 2, 4, 8 after the same prefix, stock and qmv: how far apart their
    logits are and whether the argmax (the greedy token) agrees."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine.costcurve import context_ids
    from blockwidth.engine.kvcache import rewind
    from blockwidth.engine.linear import verify_linear

    out = {}
    if not cuda:
        return {"refused": "no CUDA"}
    cache = make_prompt_cache(model)
    ids = mx.array(context_ids(64), mx.uint32)
    for i in range(0, 64, PREFILL_STEP):
        mx.eval(model(ids[None, i:i + PREFILL_STEP], cache=cache))
    for rows in (2, 4, 8):
        x = mx.array([[(11 * j + 5) % 200 + 10 for j in range(rows)]], mx.uint32)
        got = {}
        for mode in ("stock", "qmv"):
            with verify_linear(mode) as r:
                got[mode] = _np(model(x, cache=cache)[0])
                routed = r.routed
            rewind(cache, rows)
        a, b = got["stock"], got["qmv"]
        out[f"rows{rows}"] = {"max_abs_diff_over_max": float(np.abs(a - b).max() / np.abs(a).max()),
                              "argmax_agree": float((a.argmax(-1) == b.argmax(-1)).mean()), "qmv_routed": routed}
    return out


def section_curves(log: Log, shape: str, quant: str, cuda: bool, passes: int, repeats: int,
                   strategies, budget: float, rows=CURVE_ROWS, save=lambda res: None) -> dict:
    import mlx.core as mx

    from blockwidth.engine import qmv
    from lab import synthetic

    t1 = time.time()
    model, config = synthetic.build(shape, quant)
    mx.eval(model.parameters())
    res = {"shape": shape, "quant": quant, "quantization": config.get("quantization"),
           "build_s": time.time() - t1, "passes": []}
    log(f"curves {shape} {quant}: model built in {res['build_s']:.1f} s")
    arms = [("stock", "direct")] + ([("qmv", s) for s in strategies] if cuda else [])
    if cuda:  # every compile before any clock: kernels, then (compile) the traces per shape
        for _, strat in arms[1:]:
            t2 = time.time()
            got = qmv.prepare(model, strategy=strat)
            res[f"prepare_{strat}"] = {"s": time.time() - t2, "kernels": got}
            log(f"prepare {strat}: {time.time() - t2:.2f} s, kernels {got}")
        res["logits"] = _logits_side_by_side(model, cuda)
        log("logits stock vs qmv:", json.dumps(res["logits"]))
    for p in range(passes):
        order = arms[p % len(arms):] + arms[:p % len(arms)]  # rotated: drift spreads over the arms
        one = {}
        for mode, strat in order:
            name = mode if mode == "stock" else f"qmv-{strat}"
            one[name] = _curve(model, mode, strat, rows, repeats)
            pts = {pt["rows"]: pt for pt in one[name]["points"]}
            log(f"pass {p} {name}: ms " + " ".join(f"{r}:{pts[r]['median_ms']:.2f}" for r in rows if r in pts)
                + (f"  routed {one[name]['linear']['routed_calls']} stock {one[name]['linear']['stock_calls']}"
                   if one[name].get("linear") else ""))
        res["passes"].append({"order": [m if m == "stock" else f"qmv-{s}" for m, s in order], "curves": one})
        save(res)  # a pass measured is a pass kept, whatever happens to the next
        if log.elapsed > budget and p + 1 < passes:
            log(f"curves: stopped after pass {p} at the budget")
            break
    res["kernel_compile_s"] = qmv.compile_seconds()
    res["compiled_in_forward"] = qmv.compiled_in_forward()
    del model
    mx.clear_cache()
    return res


def derive_auto(curves: dict, compute_capability: str | None) -> list[dict]:
    """Per qmv call strategy: the rows at which its verify forward beat stock by 10 % in every
    pass (engine.linear.rows_won, cold medians), as QMV_WINS entries would hold them."""
    from blockwidth.engine.linear import rows_won

    q = (curves.get("quantization") or {})
    out = []
    names = {n for p in curves.get("passes", []) for n in p["curves"] if n != "stock"}
    for name in sorted(names):
        passes = []
        for p in curves["passes"]:
            if name not in p["curves"] or "stock" not in p["curves"]:
                continue
            st = {pt["rows"]: pt["median_ms"] for pt in p["curves"]["stock"]["points"]}
            qv = {pt["rows"]: pt["median_ms"] for pt in p["curves"][name]["points"]}
            passes.append({r: (st[r], qv[r]) for r in st if r in qv})
        won = rows_won(passes)
        out.append({"bits": q.get("bits"), "group_size": q.get("group_size"), "compute_capability": compute_capability,
                    "call": name.split("-", 1)[1], "passes": len(passes), "rows": list(won)})
    return out


def win_entries(auto: list[dict], mlx_version: str, record: str) -> list[str]:
    """The engine.linear.QMV_WINS lines the auto rows make (rows won 2..8 only: what qmv routes)."""
    lines = []
    for a in auto:
        rows = tuple(r for r in a["rows"] if 2 <= r <= 8)
        if rows and a["compute_capability"]:
            lines.append(f'KernelWin({a["bits"]}, {a["group_size"]}, "{a["compute_capability"]}", {rows}, '
                         f'"{a["call"]}", "{mlx_version}", "{record}"),')
    return lines


def env_info() -> dict:
    import mlx.core as mx

    info = {"mlx": mx.__version__, "python": sys.version.split()[0]}
    try:
        info["device"] = {k: v if isinstance(v, (int, float, str)) else str(v) for k, v in mx.device_info().items()}
    except Exception as e:
        info["device"] = str(e)
    return info


def run(args) -> int:
    from blockwidth.engine import qmv

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = Log(out / "log.txt")
    cuda = qmv.available()
    if not cuda and args.shape != "tiny":
        print(f"probe_qmv: --shape {args.shape} needs CUDA (the kernel is CUDA source); without it only "
              "--shape tiny runs, the CPU parts", file=sys.stderr)
        return 2
    tiny = args.shape == "tiny"
    if tiny:  # a dry run of the harness: the fewest calls that exercise every path
        args.reps, args.passes, args.repeats, args.bits8 = 2, 1, 1, False
    rec = Record(out / "probe_qmv.json")
    env = env_info()
    rec.put("env", env)
    rec.put("cuda", cuda)
    if not cuda:
        log("probe_qmv: no CUDA here: the kernel's compile, parity, timings and cost curves are refused; "
            "the CPU parts (the float32 reference, stock's parity, stock's timings and cost curve) run on tiny shapes")
    cc = None
    if isinstance(env["device"], dict) and "compute_capability_major" in env["device"]:
        cc = f"{env['device']['compute_capability_major']}.{env['device']['compute_capability_minor']}"
    log("env", json.dumps(env))
    ok = True
    cases = parity_cases(tiny)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    compiled = {}
    timing: dict = {}
    rec.put("ptx_cache", {"dir": str(ptx_cache_dir()), "modules_at_start": len(jit_modules())})

    class section:  # each section's seconds and the modules MLX JIT-compiled during it, recorded
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            self.t0, self.before = time.time(), jit_modules()

        def __exit__(self, *exc):
            new = sorted(jit_modules() - self.before)
            timing[self.name] = {"s": round(time.time() - self.t0, 2), "jit_compiled": new}
            rec.put("sections", timing)
            if new:
                log(f"{self.name}: MLX JIT-compiled {len(new)} module(s) at first use: {', '.join(new)}")
            return False

    if "compile" in sections or "parity" in sections:
        with section("compile"):
            try:
                compiled = section_compile(log, out, cases, cuda)
            except Exception:
                compiled = {"error": traceback.format_exc()}
                log("compile section ERROR\n" + compiled["error"])
            rec.put("compile", compiled)
    if "parity" in sections:
        with section("parity"):
            try:
                par, ok = section_parity(log, cases, cuda, compiled, args.budget_s * PARITY_SHARE, args.stock_qmm)
                rec.put("parity", par)
            except Exception:
                ok = False
                rec.put("parity", {"error": traceback.format_exc()})
                log("parity section ERROR\n" + rec.data["parity"]["error"])
    if "projections" in sections:
        with section("projections"):
            try:
                rec.put("projections", section_projections(log, LAYER_TINY if tiny else LAYER_8B, cuda, args.reps,
                                                           args.budget_s * 0.45, tiny))
            except Exception:
                rec.put("projections", {"error": traceback.format_exc()})
                log("projections section ERROR\n" + rec.data["projections"]["error"])
    if "curves" in sections:
        for quant in ("affine-4", "affine-8"):
            if quant == "affine-8" and (not args.bits8 or log.elapsed > args.budget_s * 0.7):
                log(f"curves {quant}: skipped" + ("" if args.bits8 else " (--no-bits8)")
                    + (f" (budget: {log.elapsed:.0f} s gone)" if args.bits8 else ""))
                continue
            key = "curves" if quant == "affine-4" else "curves_8bit"
            with section(key):
                try:
                    cur = section_curves(log, args.shape, quant, cuda, args.passes if quant == "affine-4" else 2,
                                         args.repeats, STRATEGIES, args.budget_s * 0.9,
                                         (1, 2, 4) if tiny else CURVE_ROWS, lambda res, key=key: rec.put(key, res))
                    rec.put(key, cur)
                    auto = derive_auto(cur, cc) if cuda else []
                    rec.put(f"auto_{quant}", auto)
                    lines = win_entries(auto, env["mlx"], "lab/evidence/<session>/probe_qmv.json")
                    rec.put(f"wins_{quant}", lines)
                    log(f"auto {quant}:", json.dumps(auto), "\n  QMV_WINS entries: " + ("\n  ".join(lines) or "none"))
                except Exception:
                    rec.put(key, {"error": traceback.format_exc()})
                    log(f"curves {quant} ERROR\n" + rec.data[key]["error"])
    rec.put("elapsed_s", log.elapsed)
    par = rec.data.get("parity")
    rec.put("parity_ok", ok if cuda and par else None)
    if not par:
        said = "not run"
    elif not cuda:
        said = "of the kernel refused (no CUDA)"
    elif not ok:
        said = "FAILED"
    elif par.get("skipped"):
        said = f"ok in the {par['cases'] // 8} shapes run, {len(par['skipped'])} skipped at the budget"
    else:
        said = "ok"
    log(f"done in {log.elapsed:.0f} s: parity {said}; "
        + ", ".join(f"{k} {v['s']:.0f} s" for k, v in timing.items()) + f"; wrote {out / 'probe_qmv.json'}")
    return 0 if ok else 1


# --- device time under Nsight Compute ---------------------------------------------------------
def ncu_workload(args) -> int:
    """Stock and the kernel at the 8B projections, rows 1, 2, 4, 8, each call between two
    marker kernels, so the ncu log splits into calls (run under ncu with --cache-control all)."""
    import mlx.core as mx

    from blockwidth.engine import qmv

    if not qmv.available():
        print("probe_qmv ncu: needs CUDA", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    marks = {nm: mx.fast.cuda_kernel(name=nm, input_names=["a"], output_names=["o"],
                                     source="if (threadIdx.x == 0) o[0] = a[0];") for nm in ("qmvmarkA", "qmvmarkB")}
    m_in = mx.zeros((1,), mx.float32)

    def mark(nm):
        mx.eval(marks[nm](inputs=[m_in], grid=(32, 1, 1), threadgroup=(32, 1, 1), output_shapes=[(1,)],
                          output_dtypes=[mx.float32])[0])

    labels = []
    for label, n, k in LAYER_8B:
        ws = [_quantized(n, k, 4, 64, "bfloat16", 300 + i) for i in range(2)]
        for rows in (1, 2, 4, 8):
            x = mx.random.normal((1, rows, k)).astype(mx.bfloat16)
            mx.eval(x)
            for name, f in (("stock", _impls(True)["stock"]), ("qmv", _impls(True)["qmv-direct"])):
                mx.eval(f(x, *ws[0]))  # compile outside the labelled calls
                for r in range(3):
                    mark("qmvmarkA")
                    mx.eval(f(x, *ws[r % 2]))
                    mark("qmvmarkB")
                    labels.append(f"{n}x{k}/r{rows}/{name}")
        del ws
        mx.clear_cache()
    (out / "ncu_labels.json").write_text(json.dumps(labels))
    print(f"probe_qmv ncu: {len(labels)} labelled calls")
    return 0


def ncu_parse(args) -> int:
    """ncu's raw CSV (gpu__time_duration.sum) -> per label median device us and GB/s."""
    import csv

    labels = json.loads(Path(args.labels).read_text())
    with open(args.csv, encoding="utf-8") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rd = csv.reader(lines)
    hdr = next(rd)
    ki = hdr.index("Kernel Name")
    vi = hdr.index("gpu__time_duration.sum")
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
    unit, rows = 1e-3, []
    for r in rd:
        if len(r) <= max(ki, vi):
            continue
        if not r[ki]:  # the units row
            unit = scale.get(r[vi].strip(), unit)
            continue
        try:
            rows.append((r[ki], float(r[vi].replace(",", "")) * unit))
        except ValueError:
            continue
    calls, cur, inside = [], [], False
    for name, us in rows:
        if "qmvmarkA" in name:
            cur, inside = [], True
        elif "qmvmarkB" in name:
            if inside:
                calls.append(cur)
            inside = False
        elif inside:
            cur.append((name, us))
    per: dict[str, list] = {}
    for lab, ks in zip(labels, calls):
        per.setdefault(lab, []).append((sum(v for _, v in ks), [n[:60] for n, _ in ks]))
    res = {}
    for lab, lst in per.items():
        n, k = (int(v) for v in lab.split("/")[0].split("x"))
        us = statistics.median(v for v, _ in lst)
        res[lab] = {"device_us": us, "runs_us": [v for v, _ in lst], "kernels": lst[0][1],
                    "GBps": (n * k // 2 + 4 * n * (k // 64)) / us / 1e3}
        print(f"{lab:28s} {us:8.2f} us  {res[lab]['GBps']:6.0f} GB/s  {lst[0][1][:1]}")
    Path(args.out).write_text(json.dumps({"calls": len(calls), "labels": len(labels), "device": res}, indent=1))
    return 0


def emit(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for inst in all_instances():
        name, src = generated_source(*inst)
        (out / f"{name}.cu").write_text(src)
    print(f"wrote {len(all_instances())} sources to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", nargs="?", default="run", choices=("run", "emit", "ncu", "ncu-parse"))
    ap.add_argument("--out", required=True, help="folder for the record, the log and sources")
    ap.add_argument("--shape", choices=SHAPES, default="8b")
    ap.add_argument("--sections", default="compile,parity,projections,curves")
    ap.add_argument("--passes", type=int, default=3, help="cost-curve passes (each arm once a pass)")
    ap.add_argument("--repeats", type=int, default=5, help="timed forwards per row count")
    ap.add_argument("--reps", type=int, default=15, help="warm calls per projection timing")
    ap.add_argument("--budget-s", type=float, default=230, help="stop starting optional work after this")
    ap.add_argument("--no-bits8", dest="bits8", action="store_false", help="skip the 8-bit cost curves")
    ap.add_argument("--stock-qmm", action="store_true",
                    help="parity: read stock's error at 8 rows too (MLX's qmm, JIT-compiled at first use: "
                         "15-35 s per kernel, dtype, bits and group on a fresh host)")
    ap.add_argument("--csv", help="ncu-parse: ncu's raw CSV")
    ap.add_argument("--labels", help="ncu-parse: the workload's labels")
    args = ap.parse_args(argv)
    for flag, v in (("--passes", args.passes), ("--repeats", args.repeats), ("--reps", args.reps)):
        if v < 1:
            print(f"probe_qmv: {flag} {v}: at least 1", file=sys.stderr)
            return 2
    bad = [s for s in args.sections.split(",") if s.strip() and s.strip() not in ("compile", "parity", "projections", "curves")]
    if bad:
        print(f"probe_qmv: --sections {args.sections}: unknown {', '.join(bad)} (compile, parity, projections, curves)",
              file=sys.stderr)
        return 2
    if args.cmd == "emit":
        return emit(args)
    if args.cmd == "ncu":
        return ncu_workload(args)
    if args.cmd == "ncu-parse":
        if not (args.csv and args.labels):
            print("probe_qmv ncu-parse: --csv and --labels are needed", file=sys.stderr)
            return 2
        return ncu_parse(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
