"""Which ops of a forward depend on the number of rows it holds, and whether the exact path fixes it.

Two probes, for the GPU host (they run on a CPU too, where every op is row-invariant already):

``ops``: every op a decoder forward makes, stock and the exact path's kernels, on random inputs
of 1..16 rows. Each row r of an L-row call is compared bitwise with the same row computed alone
(a 1-row call, as a classic step computes it; for attention, the row against the keys it may see;
for RoPE, at its own offset). Per op and L: bitwise equal or not, and the largest difference.

``models``: per target (checkpoint folders, and random-weight models of named shapes built in
memory), one K-row verify against K single steps (engine.identity.probe) for K = 2..16, on the
exact path by each route (``mlx``: MLX's own projections, each verify row computed as its step;
``kernels``: the engine's) and off it; then classic on the exact path against classic on stock kernels (decode
tok/s, interleaved repetitions), and the exact verify's cost by rows (engine.costcurve).

    python -m lab.probe_exact ops --out ops.json
    python -m lab.probe_exact models --target DIR [--target DIR] [--random gemma3-270m] \\
        --widths 2-16 --out models.json

Each result is written as soon as it is measured (the JSON is rewritten after every target), so a
step cut short by its time limit keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn

from blockwidth.engine import exact as exact_path
from blockwidth.engine.attention import current_backend, verify_attention
from blockwidth.engine.linear import exact_linear

MAX_ROWS = exact_path.MAX_ROWS


def _write(path: Path | None, data: dict) -> None:
    if path is None:
        print(json.dumps(data, indent=1))
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def compare_rows(full: Callable[[int], mx.array], single: Callable[[int], mx.array],
                 rows: int = MAX_ROWS) -> dict:
    """For L = 1..rows: is every row r < L of ``full(L)`` ([L, ...]) bitwise ``single(r)``
    ([...], the row computed alone)? {L: [equal, max |diff|]}."""
    alone = [single(r) for r in range(rows)]
    mx.eval(alone)
    out = {}
    for L in range(1, rows + 1):
        y = full(L)
        mx.eval(y)
        eq, diff = True, 0.0
        for r in range(L):
            a, b = y[r], alone[r]
            eq = eq and bool(mx.array_equal(a, b).item())
            diff = max(diff, float(mx.max(mx.abs(a.astype(mx.float32) - b.astype(mx.float32))).item()))
        out[L] = [eq, diff]
    return out


def _summary(res: dict) -> dict:
    bad = [L for L, (eq, _) in res.items() if not eq]
    return {"bitwise_all": not bad, "rows_differing": bad,
            "max_abs_diff": max(d for _, d in res.values()), "by_rows": res}


def ops(dtype=mx.bfloat16, path: Path | None = None, only: tuple[str, ...] = ()) -> dict:
    """Every op, stock and on the exact path, on random inputs (seeded); ``path``: the JSON is
    rewritten after every op, so a probe cut short keeps what it measured; ``only``: the ops whose
    name starts with one of these (a lease re-checks a changed kernel first)."""
    mx.random.seed(0)
    out: dict = {"backend": current_backend(), "mlx": mx.__version__, "dtype": str(dtype), "ops": {}}

    def record(name: str, fn: Callable[[], dict]) -> None:
        if only and not name.startswith(only):
            return
        t0 = time.perf_counter()
        try:
            res = _summary(fn())
        except Exception as e:  # one op's failure is that op's result, not the probe's end
            res = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        res["seconds"] = round(time.perf_counter() - t0, 3)
        out["ops"][name] = res
        if path is not None:
            _write(path, out)
        print(f"{name}: {'ERROR ' + res['error'] if 'error' in res else ('bitwise' if res['bitwise_all'] else 'differs at rows ' + str(res['rows_differing']))}",
              file=sys.stderr, flush=True)

    # norms, activations, positions (no routing: stock is what runs on the path)
    for d in (576, 640, 4096):
        x = (mx.random.normal((MAX_ROWS, d))).astype(dtype)
        w = (1 + 0.1 * mx.random.normal((d,))).astype(dtype)
        mx.eval(x, w)
        record(f"rms_norm {d}", lambda x=x, w=w: compare_rows(
            lambda L: mx.fast.rms_norm(x[None, :L], w, 1e-5)[0],
            lambda r: mx.fast.rms_norm(x[None, r:r + 1], w, 1e-5)[0, 0]))
        record(f"layer_norm {d}", lambda x=x, w=w: compare_rows(
            lambda L: mx.fast.layer_norm(x[None, :L], w, w, 1e-5)[0],
            lambda r: mx.fast.layer_norm(x[None, r:r + 1], w, w, 1e-5)[0, 0]))
        record(f"silu*mul {d}", lambda x=x: compare_rows(lambda L: (nn.silu(x[:L]) * x[:L]),
                                                         lambda r: (nn.silu(x[r:r + 1]) * x[r:r + 1])[0]))
        record(f"gelu_approx {d}", lambda x=x: compare_rows(lambda L: nn.gelu_approx(x[:L]),
                                                            lambda r: nn.gelu_approx(x[r:r + 1])[0]))
    for heads, dim, trad in ((9, 64, True), (9, 64, False), (32, 128, False), (4, 256, False)):
        q = mx.random.normal((1, heads, MAX_ROWS, dim)).astype(dtype)
        mx.eval(q)
        off = 137
        record(f"rope {heads}x{dim} traditional={trad}", lambda q=q, dim=dim, trad=trad: compare_rows(
            lambda L: mx.fast.rope(q[:, :, :L], dim, traditional=trad, base=10000.0, scale=1.0,
                                   offset=off)[0].transpose(1, 0, 2),
            lambda r: mx.fast.rope(q[:, :, r:r + 1], dim, traditional=trad, base=10000.0, scale=1.0,
                                   offset=off + r)[0, :, 0]))
    # attention against a cache: stock fused and the exact path's rows kernel, with a window too
    for nq, nkv, dim, ctx, window in ((9, 3, 64, 300, 0), (32, 8, 128, 300, 0), (4, 1, 256, 700, 512)):
        S = ctx + MAX_ROWS
        qa = mx.random.normal((1, nq, MAX_ROWS, dim)).astype(dtype)
        ka = mx.random.normal((1, nkv, S, dim)).astype(dtype)
        va = mx.random.normal((1, nkv, S, dim)).astype(dtype)
        mx.eval(qa, ka, va)
        scale = dim ** -0.5
        tag = f"{nq}/{nkv} heads D{dim} ctx {ctx}" + (f" window {window}" if window else "")
        for exact in (False, True):
            def att(L, exact=exact):
                # L verify rows at positions ctx..ctx+L-1: keys up to ctx+L
                k, v = ka[:, :, :ctx + L], va[:, :, :ctx + L]
                mask = _mask(L, ctx + L, window, exact)
                with verify_attention("auto", exact=exact):
                    return mx.fast.scaled_dot_product_attention(qa[:, :, :L], k, v, scale=scale,
                                                                mask=mask)[0].transpose(1, 0, 2)

            def alone(r, exact=exact):
                lo = max(0, ctx + r + 1 - window) if window else 0  # a 1-row step sees its window only
                k, v = ka[:, :, lo:ctx + r + 1], va[:, :, lo:ctx + r + 1]
                with verify_attention("auto", exact=exact):
                    return mx.fast.scaled_dot_product_attention(qa[:, :, r:r + 1], k, v, scale=scale,
                                                                mask=None)[0, :, 0]

            record(f"attention {tag} {'exact (rows)' if exact else 'stock'}",
                   lambda att=att, alone=alone: compare_rows(att, alone))
            if exact:  # the stock1 route: the verify's rows against classic's fused 1-row step
                record(f"attention {tag} rows against a fused 1-row step",
                       lambda att=att: compare_rows(att, lambda r: _fused_alone(qa, ka, va, ctx, r, window, scale)))
    # projections: stock, and on the exact path (exact_linear routes nn modules and as_linear)
    for (n, k) in ((1536, 576), (576, 1536), (4096, 4096)):
        x = (mx.random.normal((MAX_ROWS, k)) * 0.5).astype(dtype)
        lin = nn.Linear(k, n, bias=False)
        lin.set_dtype(dtype)
        mx.eval(x, lin.parameters())

        def dense(L, lin=lin, x=x, exact=False, route="kernels"):
            with _linear(exact, route):
                return lin(x[None, :L])[0]

        record(f"matmul bf16 {n}x{k} stock", lambda: compare_rows(lambda L: dense(L),
                                                                 lambda r: _alone(lambda y: dense(1, x=y), x, r)))
        record(f"gemv bf16 {n}x{k} exact", lambda: compare_rows(lambda L: dense(L, exact=True),
                                                               lambda r: _alone(lambda y: dense(1, x=y, exact=True), x, r)))
        record(f"gemv bf16 {n}x{k} exact against a stock 1-row step",
               lambda: compare_rows(lambda L: dense(L, exact=True), lambda r: _alone(lambda y: dense(1, x=y), x, r)))
        record(f"gather bf16 {n}x{k} mlx route against a stock 1-row step",
               lambda: compare_rows(lambda L: dense(L, exact=True, route="mlx"),
                                    lambda r: _alone(lambda y: dense(1, x=y), x, r)))
        # a biased projection: MLX's own 1-row x @ W.T + b is addmm, so the route's 1-row step is
        # gemv then the bias; each verify row must be that step
        blin = nn.Linear(k, n, bias=True)
        blin.set_dtype(dtype)
        mx.eval(blin.parameters())
        record(f"gather bf16 {n}x{k} with a bias mlx route",
               lambda blin=blin: compare_rows(lambda L: dense(L, lin=blin, exact=True, route="mlx"),
                                              lambda r: _alone(lambda y: dense(1, lin=blin, x=y, exact=True,
                                                                               route="mlx"), x, r)))
        for bits, group in ((4, 32), (4, 64), (8, 32), (8, 64), (4, 128)):
            if k % group:
                continue
            q = nn.QuantizedLinear.from_linear(lin, group_size=group, bits=bits)
            mx.eval(q.parameters())

            def quant(L, q=q, x=x, exact=False, route="kernels"):
                with _linear(exact, route):
                    return q(x[None, :L])[0]

            tag = f"{bits}-bit g{group} {n}x{k}"
            record(f"quantized_matmul {tag} stock",
                   lambda: compare_rows(lambda L: quant(L), lambda r: _alone(lambda y: quant(1, x=y), x, r)))
            record(f"qmv {tag} exact",
                   lambda: compare_rows(lambda L: quant(L, exact=True),
                                        lambda r: _alone(lambda y: quant(1, x=y, exact=True), x, r)))
            record(f"qmv {tag} exact against a stock 1-row step",
                   lambda: compare_rows(lambda L: quant(L, exact=True),
                                        lambda r: _alone(lambda y: quant(1, x=y), x, r)))
            record(f"quantized {tag} mlx route against a stock 1-row step",
                   lambda: compare_rows(lambda L: quant(L, exact=True, route="mlx"),
                                        lambda r: _alone(lambda y: quant(1, x=y), x, r)))
    # a tied head: Embedding / QuantizedEmbedding.as_linear
    emb = nn.Embedding(4096, 576)
    emb.set_dtype(dtype)
    xe = (mx.random.normal((MAX_ROWS, 576)) * 0.5).astype(dtype)
    qemb = nn.QuantizedEmbedding.from_embedding(emb, group_size=32, bits=8)
    mx.eval(emb.parameters(), qemb.parameters(), xe)
    for name, m in (("Embedding.as_linear bf16", emb), ("QuantizedEmbedding.as_linear 8-bit g32", qemb)):
        for exact, route in ((False, "kernels"), (True, "kernels"), (True, "mlx")):
            def head(L, m=m, x=xe, exact=exact, route=route):
                with _linear(exact, route):
                    return m.as_linear(x[None, :L])[0]

            label = "stock" if not exact else "exact" if route == "kernels" else "mlx route"
            record(f"{name} {label}",
                   lambda head=head: compare_rows(lambda L: head(L), lambda r: _alone(lambda y: head(1, x=y), xe, r)))
    return out


def _fused_alone(qa, ka, va, ctx, r, window, scale):
    lo = max(0, ctx + r + 1 - window) if window else 0
    return mx.fast.scaled_dot_product_attention(qa[:, :, r:r + 1], ka[:, :, lo:ctx + r + 1],
                                                va[:, :, lo:ctx + r + 1], scale=scale, mask=None)[0, :, 0]


def _mask(L: int, S: int, window: int, exact: bool):
    from blockwidth.engine.attention import WindowMask, window_array

    if not window:
        return "causal"
    return WindowMask(window) if exact else window_array(L, S, window)


def _alone(fn: Callable[[mx.array], mx.array], x: mx.array, r: int) -> mx.array:
    """Row r of ``x`` through ``fn`` as a 1-row call."""
    return fn(x[r:r + 1])[0]


class _linear:
    """The exact path's projections (exact=True, by ``route``: engine.linear.EXACT_ROUTES) or
    stock, as a context."""

    def __init__(self, exact: bool, route: str = "kernels"):
        self.exact = exact
        self.route = route
        self.cm = None

    def __enter__(self):
        if self.exact:
            self.cm = exact_linear(route=self.route)
            return self.cm.__enter__()
        return None

    def __exit__(self, *a):
        if self.cm is not None:
            return self.cm.__exit__(*a)
        return False


# --- models ------------------------------------------------------------------------------------
RANDOM = {
    # Gemma 3 270M's text shape: head size 256, one KV head, sliding window 512 (pattern 6)
    "gemma3-270m": dict(model_type="gemma3_text", hidden_size=640, num_hidden_layers=18,
                        intermediate_size=2048, num_attention_heads=4, num_key_value_heads=1,
                        head_dim=256, vocab_size=262144, sliding_window=512, sliding_window_pattern=6,
                        rms_norm_eps=1e-6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                        query_pre_attn_scalar=256, max_position_embeddings=32768),
    # the 5B pair's target layer (lab/build_gpu.py's 5b shape: hidden 8192, MLP 28672, 64/8 heads
    # of 128), two layers of it: row invariance is per layer, so depth adds nothing to the probe
    "llama-5b": dict(model_type="llama", hidden_size=8192, num_hidden_layers=2, intermediate_size=28672,
                     num_attention_heads=64, num_key_value_heads=8, vocab_size=32000, rms_norm_eps=1e-5,
                     rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=4096),
}


def random_model(spec: str):
    """A random-weight model of a named shape, ``NAME`` or ``NAME:q4`` (affine 4-bit g64)."""
    import importlib

    from mlx.utils import tree_map

    name, _, quant = spec.partition(":")
    cfg = dict(RANDOM[name])
    mod = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    args = mod.ModelArgs.from_dict(cfg)
    mx.random.seed(1)
    model = mod.Model(args)
    model.update(tree_map(lambda p: (p * 0.6).astype(mx.bfloat16) if p.dtype == mx.float32 else p,
                          model.parameters()))
    if quant == "q4":
        nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model


def _load(target: str):
    if target.startswith("random:"):
        return random_model(target[len("random:"):]), None
    from mlx_lm import load

    model, tok = load(target)
    return model, tok


def _prefix(tok, n: int, vocab: int) -> list[int]:
    """``n`` prompt tokens: a real text through the tokenizer where there is one, else a fixed
    pseudo-random sequence."""
    if tok is not None:
        text = ("def merge(intervals):\n    intervals.sort()\n    out = []\n    for a, b in intervals:\n"
                "        if out and a <= out[-1][1]:\n            out[-1][1] = max(out[-1][1], b)\n"
                "        else:\n            out.append([a, b])\n    return out\n\n") * 40
        ids = tok.encode(text)
        if len(ids) >= n:
            return ids[:n]
    return [(7919 * i + 13) % max(vocab - 2, 2) + 1 for i in range(n)]


def _decode_tok_s(pair, prompt, tokens, plan, dispatched: bool = False) -> tuple[float, list[int]]:
    """Classic's decode tok/s and tokens; ``dispatched``: every step through the path's
    dispatcher (before engine.decode.UNDISPATCHED_AFTER existed), for a before/after."""
    from blockwidth.engine import decode

    run = decode.classic(pair, prompt, tokens, exact=plan,
                         undispatched_after=None if dispatched else decode.UNDISPATCHED_AFTER)
    return run.decode_tok_s, run.tokens


class _Pair:
    def __init__(self, model):
        self.target = model
        self.context_length = None


def model_probe(target: str, widths: list[int], prefixes: tuple[int, ...], speed_tokens: int, speed_reps: int,
                curve: bool, route_names: tuple[str, ...] = ("mlx", "hybrid", "kernels"),
                speed_prompts: tuple[int, ...] = (64,), probe_repeats: int = 1, stock: bool = True) -> dict:
    from blockwidth.engine import costcurve
    from blockwidth.engine.identity import probe

    t0 = time.perf_counter()
    model, tok = _load(target)
    vocab = getattr(getattr(model, "args", None), "vocab_size", 32000)
    # the exact path by each route, side by side (the lease of 2026-12-04 also tried "stock1":
    # MLX's projections with classic's attention left on fused SDPA, not exact)
    routes = {r: exact_path.plan(model, "on", route=r) for r in route_names}
    on = next(iter(routes.values()))
    out = {"target": target, "plan": on.to_dict(), "plans": {r: p.to_dict() for r, p in routes.items()},
           "load_s": round(time.perf_counter() - t0, 2)}
    res = {}
    for n_prefix in prefixes:
        prefix = _prefix(tok, n_prefix, vocab)
        widest = max(widths, default=0)
        block_src = _prefix(tok, n_prefix + widest, vocab)[n_prefix:]
        if len(block_src) < widest:
            block_src = [(31 * i + 5) % max(vocab - 2, 2) + 1 for i in range(widest)]
        for K in widths:
            row = {}
            # stock's K-row verify is a contrast only, and its first 8-row call on SmolLM2 native
            # took 91 s once (2026-12-05): --no-stock leaves it out where the lease is short
            for name, plan in (*routes.items(), *((("stock", None),) if stock else ())):
                # each probe timed, repeated on request: a first call far slower than the second
                # is compilation (MLX JIT-compiles a new kernel on a fresh host), both slow is the
                # forward itself (the K = 8 "stall" of 2026-12-04d returned 21 s after its SIGINT)
                seconds = []
                for _ in range(max(1, probe_repeats)):
                    t1 = time.perf_counter()
                    ex = probe(model, prefix, block_src[:K], attention="auto", linear="auto", exact=plan)
                    seconds.append(round(time.perf_counter() - t1, 3))
                row[name] = {"bitwise_equal": ex.bitwise_equal, "max_abs_diff": ex.max_abs_diff,
                             "argmax_agree": sum(ex.argmax_agree), "seconds": seconds}
            res[K if n_prefix == prefixes[0] else f"{K} after {n_prefix}"] = row
            print(f"  {target} K={K} after {n_prefix}: " + ", ".join(
                f"{n} {'bitwise' if v['bitwise_equal'] else v['max_abs_diff']} "
                f"({'/'.join(f'{x:.2f}' for x in v['seconds'])} s)" for n, v in row.items()),
                  file=sys.stderr, flush=True)
    if widths:
        out["exactness"] = res
        out["prefixes"] = list(prefixes)
    for n_prompt in (speed_prompts if speed_reps else ()):
        # classic against stock classic, per prompt length: a prompt past 256 keys is where stock
        # MLX decodes through cuDNN and the exact path's off-step caches keep the vector kernel
        pair = _Pair(model)
        prompt = _prefix(tok, n_prompt, vocab)
        arms = {**routes, "stock": None}
        if "mlx" in routes:  # the mlx route's classic with its dispatcher kept in every step too
            arms["mlx-dispatched"] = routes["mlx"]
        for name, plan in arms.items():  # warm every path: kernels compile outside the clock
            _decode_tok_s(pair, prompt, 8, plan, name == "mlx-dispatched")
        speeds: dict[str, list[float]] = {k: [] for k in arms}
        texts: dict[str, list[int]] = {}
        for _ in range(speed_reps):  # interleaved, repetition by repetition
            for name, plan in arms.items():
                tps, toks = _decode_tok_s(pair, prompt, speed_tokens, plan, name == "mlx-dispatched")
                speeds[name].append(tps)
                texts.setdefault(name, toks)
        base = statistics.median(speeds["stock"])
        got = {"tok_s": speeds, "tokens": speed_tokens, "prompt_tokens": len(prompt),
               "ratio_to_stock": {k: statistics.median(v) / base for k, v in speeds.items()},
               "same_text_as_stock": {k: texts[k] == texts["stock"] for k in texts}}
        out.setdefault("classic_speed", got)  # the first prompt's, where earlier leases kept it
        out.setdefault("classic_speed_by_prompt", {})[str(len(prompt))] = got
        print(f"  {target} classic against stock, prompt {len(prompt)}: " + ", ".join(
            f"{k} {v:.3f}" for k, v in got["ratio_to_stock"].items()), file=sys.stderr, flush=True)
    if curve:
        for name, plan in routes.items():
            cc = costcurve.measure(model, list(range(1, MAX_ROWS + 1)), context=128, repeats=5, exact=plan)
            out[f"costcurve_{name}"] = cc.to_dict()
        cs = costcurve.measure(model, list(range(1, MAX_ROWS + 1)), context=128, repeats=5)
        out["costcurve_stock"] = cs.to_dict()
    out["seconds"] = round(time.perf_counter() - t0, 2)
    return out


def parse_widths(text: str) -> list[int]:
    if text.strip().lower() == "none":
        return []
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.probe_exact")
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("ops")
    p.add_argument("--out", type=Path)
    p.add_argument("--only", default="", help="comma-separated name prefixes, e.g. gemv,Embedding")
    p = sub.add_parser("models")
    p.add_argument("--target", action="append", default=[], help="a checkpoint folder, or random:NAME[:q4]")
    p.add_argument("--widths", default="2-16", help="verify widths to probe, e.g. 2-16; none: no probe")
    p.add_argument("--prefix", default="96", help="prompt tokens before the block, e.g. 96,250 (a block "
                   "from 250 straddles the 256 keys where MLX's 1-row attention may turn to cuDNN)")
    p.add_argument("--speed-tokens", type=int, default=64)
    p.add_argument("--speed-reps", type=int, default=3)
    p.add_argument("--speed-prompt", default="64", help="prompt lengths for the classic speeds, e.g. 64,400")
    p.add_argument("--curve", action="store_true", help="also the exact and stock cost curves, rows 1..16")
    p.add_argument("--routes", default="mlx,hybrid,kernels", help="the exact path's routes to probe, side by side")
    p.add_argument("--probe-repeats", type=int, default=1, metavar="N",
                   help="run each K-row probe N times, each timed (compilation shows as a slow first)")
    p.add_argument("--no-stock", dest="stock", action="store_false",
                   help="probe the exact path's routes only, not stock MLX's K-row verify beside them")
    p.add_argument("--out", type=Path)
    p.add_argument("--dump-after", type=float, default=0, metavar="S",
                   help="print every thread's stack every S seconds (a stalled eval: where it waits)")
    args = ap.parse_args(argv)
    if getattr(args, "dump_after", 0) > 0:
        import faulthandler

        faulthandler.dump_traceback_later(args.dump_after, repeat=True)
    if args.what == "ops":
        _write(args.out, ops(path=args.out, only=tuple(x for x in args.only.split(",") if x)))
        return 0
    data = {"backend": current_backend(), "mlx": mx.__version__, "models": []}
    for t in args.target:
        prefix = tuple(int(x) for x in str(args.prefix).split(",") if x.strip())
        if t.startswith("random:gemma3"):
            prefix = tuple(max(n, 600) for n in prefix[:1])  # past the 512-token window
        try:
            data["models"].append(model_probe(t, parse_widths(args.widths), prefix, args.speed_tokens,
                                              args.speed_reps, args.curve,
                                              tuple(r for r in args.routes.split(",") if r),
                                              tuple(int(x) for x in args.speed_prompt.split(",") if x.strip()),
                                              args.probe_repeats, args.stock))
        except Exception as e:
            data["models"].append({"target": t, "error": f"{type(e).__name__}: {e}",
                                   "trace": traceback.format_exc()[-3000:]})
            print(f"{t}: ERROR {e}", file=sys.stderr, flush=True)
        _write(args.out, data)
    _write(args.out, data)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
