"""Host cost of the exact path's routing, per projection call, against stock (this CPU): the
kernels are replaced by functions that return at once, so what is timed is the Python and graph
work a host-bound target pays ~200 times a token on CUDA. `python -m lab.bench_route_host`."""
import time, mlx.core as mx, mlx.nn as nn
from blockwidth.engine import linear, qmv
lin = nn.Linear(576, 1536, bias=False); lin.set_dtype(mx.bfloat16)
q = nn.QuantizedLinear.from_linear(lin, group_size=32, bits=4)
x = mx.zeros((1, 1, 576), mx.bfloat16)
out = mx.zeros((1, 1, 1536), mx.bfloat16)
linear.gemv_linear = lambda x, w, b=None: out
qmv.bound = lambda shape, n, dt, bits, group, call: (lambda x, w, s, b: out)
qmv.refusal = lambda *a, **k: None
N = 20000
def bench(f):
    t0 = time.perf_counter()
    for _ in range(N): f()
    return 1e6 * (time.perf_counter() - t0) / N
s_dense, s_q = bench(lambda: lin(x)), bench(lambda: q(x))
with linear.exact_linear("cuda") as r:
    e_dense, e_q = bench(lambda: lin(x)), bench(lambda: q(x))
print(f"stock: dense {s_dense:.2f} quantized {s_q:.2f} us; exact route (fake kernel): dense {e_dense:.2f} quantized {e_q:.2f} us")
print(r.summary() if hasattr(r,'summary') else '')
