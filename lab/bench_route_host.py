"""Host cost of the exact path's routing, per projection call, against stock (this CPU): the
kernels are replaced by functions that return at once, so what is timed is the Python and graph
work a host-bound target pays ~200 times a token on CUDA; the ``mlx`` route's 1-row step is the stock
call itself behind the route's plan lookup. `python -m lab.bench_route_host`."""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn

from blockwidth.engine import linear, qmv

CALLS = 20000


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


if __name__ == "__main__":
    main()
