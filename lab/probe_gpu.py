"""Where a verify forward's time goes on this device: the probe behind the CUDA choices.

A speculative round on the H200 cost more than the cost curve's forward at the
same rows (1B bf16 pair, width 2: 12.5 ms verify in the session against 7.7 ms
in the cost curve). This probe times one verify-shaped forward of a random
model of the GPU pair's target shape, cold (a KV length one past the last, as
decoding advances), under every combination of what the engine can choose:

- the attention of the verify rows (engine.attention: plain, vector, bucketed);
- the stream: MLX's default stream or mlx-lm's generation stream (the engine
  decodes on the latter);
- the bf16 projections: the stock ``x @ W.T`` (cuBLASLt for 2+ rows, whose
  algorithm heuristic MLX queries on every call), ``gather_mm`` with every row
  on one weight and sorted indices (a CUTLASS grouped GEMM: no heuristic query),
  or the engine's ``gather`` route (engine/linear.py: unsorted, MLX's gather_mv);
- what the engine adds around the forward (concatenate the block, greedy, eval).

It also times the first call at every row count 1..16 on an 8B-shaped 4-bit
random model (the target set for it: "no first call over 1 s"). Output: one JSON.

    python -m lab.probe_gpu --out probe.json [--skip-8b]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from lab import build as small
from lab.build_gpu import COMMON, SHAPES

EIGHT_B = dict(COMMON, hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
               num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)


def random_model(config: dict, quant: bool):
    model = small.make_model(config)
    model.set_dtype(mx.bfloat16)
    if quant:
        nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    return model


_stock_linear = nn.Linear.__call__


def _gather_linear(self, x):
    w = self["weight"]
    rows = x.size // x.shape[-1]
    if "bias" in self or x.ndim < 2 or not 2 <= rows <= 64:
        return _stock_linear(self, x)
    flat = x.reshape(rows, 1, x.shape[-1])
    out = mx.gather_mm(flat, w.T[None], rhs_indices=mx.zeros((rows,), mx.uint32), sorted_indices=True)
    return out.reshape(*x.shape[:-1], w.shape[0])


@contextmanager
def linear(kind: str):
    """``stock``; ``gather``: gather_mm with sorted indices (CUTLASS grouped GEMM);
    ``gathermv``: the engine's route (engine.linear, unsorted: MLX's gather_mv kernel)."""
    if kind == "gathermv":
        from blockwidth.engine.linear import verify_linear

        with verify_linear("gather"):
            yield
        return
    before = nn.Linear.__call__
    nn.Linear.__call__ = _gather_linear if kind == "gather" else _stock_linear
    try:
        yield
    finally:
        nn.Linear.__call__ = before


def cold_forwards(model, rows: int, attention: str, stream, engine_like: bool, repeats: int,
                  context: int) -> dict:
    """Median / min ms of ``repeats`` forwards at fresh lengths after ``context`` tokens."""
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.costcurve import context_ids
    from blockwidth.engine.drafters import greedy
    from blockwidth.engine.kvcache import rewind

    cache = make_prompt_cache(model)
    prefix = mx.array(context_ids(context), mx.uint32)
    mx.eval(model(prefix[None], cache=cache))
    y = mx.array([5], mx.uint32)
    drafts = mx.array([(11 * j + 5) % 200 + 10 for j in range(rows - 1)], mx.uint32)
    times, first = [], None
    with (mx.stream(stream) if stream is not None else nullcontext()):
        with verify_attention(attention):
            for r in range(repeats + 2):
                t0 = time.perf_counter()
                if engine_like:
                    block = mx.concatenate([y, drafts]) if rows > 1 else y
                    logits = model(block[None], cache=cache)[:, -rows:, :]
                    v = greedy(logits.squeeze(0))
                    mx.eval(v)
                    v.tolist()
                else:
                    mx.eval(model(mx.concatenate([y, drafts])[None] if rows > 1 else y[None], cache=cache))
                dt = (time.perf_counter() - t0) * 1e3
                rewind(cache, rows - 1)
                if r == 0:
                    first = dt
                elif r >= 2:
                    times.append(dt)
    return {"median_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "first_ms": round(first, 3)}


def linear_micro(rows_list, n: int = 50) -> dict:
    """One bf16 projection 2048 -> 6144 (the pair's MLP up) by rows: stock vs gather."""
    lin = nn.Linear(2048, 6144, bias=False)
    lin.set_dtype(mx.bfloat16)
    mx.eval(lin.parameters())
    out = {}
    for kind in ("stock", "gather", "gathermv"):
        with linear(kind):
            for rows in rows_list:
                x = mx.random.normal((1, rows, 2048)).astype(mx.bfloat16)
                try:
                    mx.eval(lin(x))
                except RuntimeError as e:  # gather_mm on a backend without bf16 support
                    out[f"{kind} {rows}"] = f"error: {e}"
                    continue
                t0 = time.perf_counter()
                for _ in range(n):
                    mx.eval(lin(x))
                out[f"{kind} {rows}"] = round((time.perf_counter() - t0) / n * 1e3, 4)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,2,3,4,8,16")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--shape", default="1b", choices=tuple(SHAPES))
    ap.add_argument("--attentions", default="plain,vector,bucketed")
    ap.add_argument("--streams", default="default,generation")
    ap.add_argument("--linears", default="stock,gathermv")
    args = ap.parse_args(argv)
    from mlx_lm.generate import generation_stream

    rows_list = [int(r) for r in args.rows.split(",")]
    result: dict = {"mlx": mx.__version__, "device": str(mx.default_device()), "context": args.context,
                    "repeats": args.repeats, "rows": rows_list}
    try:
        result["device_info"] = {k: v for k, v in mx.device_info().items() if isinstance(v, (str, int))}
    except Exception:  # noqa: BLE001 — informational only
        pass
    t_all = time.time()
    result["linear_micro"] = linear_micro(rows_list)
    print(json.dumps(result["linear_micro"]), flush=True)
    tconf = dict(COMMON, **SHAPES[args.shape][0])
    for quant in (False, True):
        name = "4bit" if quant else "bf16"
        model = random_model(tconf, quant)
        table = {}
        streams = {"default": None, "generation": generation_stream}
        for attention in args.attentions.split(","):
            for stream_name in args.streams.split(","):
                stream = streams[stream_name]
                for lin in (args.linears.split(",") if not quant else ("stock",)):
                    for engine_like in (False, True):
                        key = f"{attention}/{stream_name}/{lin}/{'engine' if engine_like else 'forward'}"
                        try:
                            with linear(lin):
                                table[key] = {r: cold_forwards(model, r, attention, stream, engine_like,
                                                               args.repeats, args.context) for r in rows_list}
                        except RuntimeError as e:
                            print(name, key, f"error: {e}", flush=True)
                            table[key] = f"error: {e}"
                            continue
                        print(name, key, {r: v["median_ms"] for r, v in table[key].items()}, flush=True)
        result[name] = table
        del model
        mx.clear_cache()
    if not args.skip_8b:
        from blockwidth.engine import costcurve

        t0 = time.time()
        model = random_model(EIGHT_B, True)
        result["8b_build_s"] = round(time.time() - t0, 1)
        for attention in ("plain", "vector"):
            curve = costcurve.measure(model, tuple(range(1, 17)), context=1000, repeats=3, attention=attention)
            result[f"8b_4bit_{attention}"] = curve.to_dict()
            print("8b", attention, [(p.rows, round(p.median_ms, 1), round(p.first_ms or 0, 1))
                                    for p in curve.points], flush=True)
    result["seconds"] = round(time.time() - t_all, 1)
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
