"""Host cost of the exact path's routing, per projection call, against stock (this CPU): the
kernels are replaced by functions that return at once, so what is timed is the Python and graph
work a host-bound target pays ~200 times a token on CUDA; the ``mlx`` route's 1-row step is the stock
call itself behind the route's plan lookup. Then one layer's attention call of a K-row forward
(SmolLM2-135M's 9/3 heads, head size 64, 300 keys on an off-step buffer) on the ``mlx`` route
(a call a row: slices, MLX's 1-row call, a concatenation) and the ``hybrid`` route (one rows-kernel
call), the kernels again returning at once. `python -m lab.bench_route_host`."""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn

from blockwidth.engine import linear, qmv

CALLS = 20000
REPEATS = 5  # attention_host: each figure the least of this many, interleaved


def per_call_us(fn) -> float:
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn()
    return 1e6 * (time.perf_counter() - t0) / CALLS


def main() -> None:
    dense = nn.Linear(576, 1536, bias=False)  # SmolLM2-135M's gate/up shape
    dense.set_dtype(mx.bfloat16)
    quant = nn.QuantizedLinear.from_linear(dense, group_size=32, bits=4)
    x = mx.zeros((1, 1, 576), mx.bfloat16)
    out = mx.zeros((1, 1, 1536), mx.bfloat16)
    # the kernels return at once, and the qmv plan takes every shape: the route alone is timed
    linear.gemv_linear = lambda x, w, b=None: out
    qmv.bound = lambda shape, n, dt, bits, group, call: (lambda x, w, s, b: out)
    qmv.refusal = lambda *a, **k: None
    stock = per_call_us(lambda: dense(x)), per_call_us(lambda: quant(x))
    with linear.exact_linear("cuda", route="kernels") as routing:
        routed = per_call_us(lambda: dense(x)), per_call_us(lambda: quant(x))
    print(f"stock: dense {stock[0]:.2f} quantized {stock[1]:.2f} us; kernels route (fake kernel): "
          f"dense {routed[0]:.2f} quantized {routed[1]:.2f} us")
    print(routing.summary())
    # the mlx route: a 1-row step is the stock call behind the route's plan lookup
    with linear.exact_linear("cuda", route="mlx") as routing:
        routed = per_call_us(lambda: dense(x)), per_call_us(lambda: quant(x))
    print(f"mlx route (stock call): dense {routed[0]:.2f} quantized {routed[1]:.2f} us")
    print(routing.summary())



def attention_host(rows=(1, 2, 4, 8, 16)) -> dict:
    """Microseconds of host work a layer's attention call costs per route, at each row count."""
    from blockwidth.engine import attention

    q_heads, kv_heads, d, keys = 9, 3, 64, 300
    k = mx.zeros((1, kv_heads, keys, d), mx.bfloat16)
    one = mx.zeros((1, q_heads, 1, d), mx.bfloat16)
    outs = {L: mx.zeros((1, q_heads, L, d), mx.bfloat16) for L in rows}
    real = attention._fused, attention.rows_attention, attention.current_backend
    attention.install()
    attention._fused = lambda q, k, v, *a, **kw: one if q.shape[2] == 1 else outs[q.shape[2]]
    attention.rows_attention = lambda q, k, v, **kw: outs[q.shape[2]]
    attention.current_backend = lambda: "cuda"
    got = {}
    try:
        for L in rows:
            q = mx.zeros((1, q_heads, L, d), mx.bfloat16)
            mask = None if L == 1 else "causal"
            call = lambda: mx.fast.scaled_dot_product_attention(q, k, k, scale=0.125, mask=mask)  # noqa: E731
            for _ in range(REPEATS):  # interleaved; the least disturbed of the repeats kept
                t = per_call_us(call)
                by = got.setdefault("stock", {})
                by[L] = min(t, by.get(L, t))
                for route in ("mlx", "hybrid"):
                    with attention.verify_attention(None, exact=True, route=route) as routing:
                        routing.off_step_keys = k  # the path's own cache: MLX's 1-row call at any length
                        t = per_call_us(call)
                    by = got.setdefault(route, {})
                    by[L] = min(t, by.get(L, t))
    finally:
        attention._fused, attention.rows_attention, attention.current_backend = real
    for route, by in got.items():
        print(f"attention, {route} (least of {REPEATS}): " + ", ".join(f"{L} rows {us:.2f} us" for L, us in by.items()))
    return got


if __name__ == "__main__":
    main()
    attention_host()
