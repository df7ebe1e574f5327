"""Which part of a forward doubles its cost from 1 row to 2?

lab/probe_overlap.py measured on the H200 (random 1B pair, KV cache at
~300): evaluating a 1-row forward 3.2 ms (bf16) / 2.0 ms (4-bit), a 2-row one
6.8 / 4.1 ms, and 8 rows 7.5 / 6.2 ms; the graph build 1.5-2 ms throughout.
Routing the projections off cuBLAS (engine.linear ``gather``) and the attention
to the vector kernel (``vector``) did not close it (probe_loop). This probe
times the parts of the target's 22 layers alone, each as one graph of all
layers, evaluated and synced, at 1, 2 and 4 rows:

- ``proj``: the seven projections of every layer (stock matmul; ``proj_gather``; ``proj_gemv``
  through engine.linear's K-row kernel, with ``gemv_routed`` the calls it took, 0 on a CPU, and
  ``gemv_max_rel_err`` its products against float32 ones relative to the largest);
- ``attn``: the attention against each layer's cache (fused kernel at 1 row;
  plain, vector at 2+);
- ``rest``: norms, RoPE, the MLP's activation, the residual adds;
- ``layers``: whole layers, as the model runs them; ``forward``: the whole model.

    python -m lab.probe_parts --json [--quant]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--quant", action="store_true")
    ap.add_argument("--rows", default="1,2,4")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import mlx.core as mx
    from mlx_lm.models.base import create_attention_mask
    from mlx_lm.models.cache import make_prompt_cache

    from blockwidth.engine.attention import verify_attention
    from blockwidth.engine.costcurve import context_ids
    from lab.probe_loop import _models
    from blockwidth.engine.kvcache import rewind
    from blockwidth.engine.linear import verify_linear

    target, _ = _models(args.shape, args.quant)
    layers = target.model.layers
    d = target.args.hidden_size
    prompt = mx.array(context_ids(args.context), mx.uint32)
    cache = make_prompt_cache(target)
    mx.eval(target(prompt[None], cache=cache))
    perf = time.perf_counter

    def timed(fn, after=None) -> float:
        """Median ms of evaluating ``fn()``'s graph, the first 5 of ``reps`` dropped; ``after``
        runs untimed after each (a cache rewind)."""
        got = []
        for i in range(args.reps):
            t0 = perf()
            mx.eval(fn())
            got.append(perf() - t0)
            if after is not None:
                after()
        return round(statistics.median(got[5:]) * 1e3, 3)

    out: dict = {"mlx": mx.__version__, "device": str(mx.default_device()), "shape": args.shape,
                 "quant": args.quant, "context": args.context, "reps": args.reps}
    for k in (int(r) for r in args.rows.split(",")):
        x = mx.random.normal((1, k, d)).astype(mx.bfloat16)
        mx.eval(x)
        row: dict = {}

        def proj():
            outs = []
            for layer in layers:
                a, m = layer.self_attn, layer.mlp
                outs += [a.q_proj(x), a.k_proj(x), a.v_proj(x), a.o_proj(x), m.gate_proj(x),
                         m.up_proj(x), m.down_proj(mx.zeros((1, k, m.down_proj.weight.shape[-1]
                                                              * (8 if args.quant else 1)), x.dtype))]
            return outs

        row["proj"] = timed(proj)
        if k > 1 and not args.quant:
            with verify_linear("gather"):
                row["proj_gather"] = timed(proj)
            with verify_linear("gemv") as r:
                row["proj_gemv"] = timed(proj)
                row["gemv_routed"] = r.routed
            # the kernel's products against the stock matmul's, relative to the largest
            errs = []
            for lin in (layers[0].self_attn.q_proj, layers[0].self_attn.k_proj, layers[0].mlp.up_proj,
                        layers[0].mlp.down_proj):
                xin = mx.random.normal((1, k, lin.weight.shape[1])).astype(x.dtype)
                ref = xin.astype(mx.float32) @ lin.weight.astype(mx.float32).T
                with verify_linear("gemv"):
                    got = lin(xin).astype(mx.float32)
                errs.append((mx.abs(got - ref).max() / mx.abs(ref).max()).item())
            row["gemv_max_rel_err"] = round(max(errs), 5)

        first = layers[0].self_attn  # every layer has its shape
        q = mx.random.normal((1, first.n_heads, k, first.head_dim)).astype(x.dtype)
        mx.eval(q)

        def attn(mode: str):
            def run():
                outs = []
                with verify_attention(mode):
                    for layer, c in zip(layers, cache):
                        a = layer.self_attn
                        keys, values = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
                        mask = create_attention_mask(x, c) if k > 1 else None
                        outs.append(mx.fast.scaled_dot_product_attention(q, keys, values, scale=a.scale,
                                                                         mask=mask))
                return outs
            return run

        row["attn"] = timed(attn("auto"))
        if k > 1:
            row["attn_vector"] = timed(attn("vector"))
            row["attn_fused"] = timed(attn("fused"))

        def rest():
            outs = []
            for layer in layers:
                h = layer.input_layernorm(x)
                h = layer.self_attn.rope(h.reshape(1, k, -1, first.head_dim).transpose(0, 2, 1, 3), offset=cache[0].offset)
                g = layer.post_attention_layernorm(x + x)
                outs += [h, g * mx.sigmoid(g) * g]
            return outs

        row["rest"] = timed(rest)

        def layer_pass():
            h = x
            mask = create_attention_mask(h, cache[0]) if k > 1 else None
            with verify_attention("auto"):
                for layer, c in zip(layers, cache):
                    h = layer(h, mask, c)
            return h

        def back():
            rewind(cache, k)

        row["layers"] = timed(layer_pass, back)
        block = mx.array([11 + i for i in range(k)], mx.uint32)[None]

        def forward():  # the whole model, as probe_overlap's synced figure
            with verify_attention("auto"):
                return target(block, cache=cache)

        row["forward"] = timed(forward, back)
        out[f"rows{k}"] = row
    print(json.dumps(out, indent=None if args.json else 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
