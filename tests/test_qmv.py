"""engine/qmv.py's kernel on this CPU: its launch arithmetic, its refusals, and its arithmetic.

The CUDA kernel cannot run here, so :func:`emulate` replays its source lane by lane in numpy:
the same pointers (rows clamped at N - 1, x row 0 for lanes past M, chunk c on warp c % warps),
the same words and shifts per MMA fragment (``qmv_nib``: ``(w >> sh) & 0x000F000F | MAGIC``),
the same ``byte_perm`` of x into B fragments, the PTX m16n8k16 fragment layouts, the same
per-group ``y += s * P + (b - OFF s) * xs`` in float32 and the same shared-memory sum. Its
result is compared with MLX's own dequantization of MLX's own quantization (``mx.quantize``,
``mx.dequantize``, ``mx.quantized_matmul`` on the CPU): a wrong nibble order, word, scale or
group index gives an error of the size of the output, thousands of times the bound.
"""

import numpy as np
import mlx.core as mx
import pytest

from blockwidth.engine import qmv

LANES = np.arange(32)
G_, T_ = LANES >> 2, LANES & 3


def _f16bits_to_f32(h: np.ndarray, bf: bool) -> np.ndarray:
    h = h.astype(np.uint32) & 0xFFFF
    if bf:
        return (h << 16).view(np.float32)
    return h.astype(np.uint16).view(np.float16).astype(np.float32)


def _halves(v: np.ndarray, bf: bool) -> tuple[np.ndarray, np.ndarray]:
    v = v.astype(np.uint32)
    return _f16bits_to_f32(v & 0xFFFF, bf), _f16bits_to_f32(v >> 16, bf)


def _byte_perm(x: np.ndarray, y: np.ndarray, sel: int) -> np.ndarray:
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    out = np.zeros_like(x)
    for i in range(4):
        out |= b[(sel >> (4 * i)) & 0xF] << (8 * i)
    return out


def _mma(d: list, a: list, b0: np.ndarray, b1: np.ndarray, bf: bool) -> None:
    """d[4][32] += A @ B per the PTX m16n8k16 layouts: a0 (row g, k 2t..2t+1), a1 (row g+8),
    a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..); b0 (k 2t..2t+1, col g), b1 (k 2t+8..);
    c0/c1 (row g, cols 2t, 2t+1), c2/c3 (row g+8)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    for reg, (dr, dk) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
        lo, hi = _halves(a[reg], bf)
        A[G_ + dr, 2 * T_ + dk], A[G_ + dr, 2 * T_ + dk + 1] = lo, hi
    for reg, dk in enumerate((0, 8)):
        lo, hi = _halves((b0, b1)[reg], bf)
        B[2 * T_ + dk, G_], B[2 * T_ + dk + 1, G_] = lo, hi
    D = (A @ B).astype(np.float32)  # exact products (16-bit x 16-bit), float32 sums
    d[0] += D[G_, 2 * T_]
    d[1] += D[G_, 2 * T_ + 1]
    d[2] += D[G_ + 8, 2 * T_]
    d[3] += D[G_ + 8, 2 * T_ + 1]


def _nib(w: np.ndarray, sh: int, magic: int) -> np.ndarray:
    return ((w >> np.uint32(sh)) & np.uint32(0x000F000F)) | np.uint32(magic)


def emulate(x_bits, wq, s_bits, b_bits, bits: int, group: int, bf: bool, u: int, warps: int):
    """SOURCE, lane by lane: x_bits [M, K] uint16, wq [N, K bits / 32] uint32, s_bits / b_bits
    [N, K / group] uint16 -> (y before rounding [M, N] float32)."""
    M, K = x_bits.shape
    N = wq.shape[0]
    L, WPG, NB = group // 4, group * bits // 32, group // 16
    WL, XV = L * bits // 32, L // 8
    OFF = 128.0 if bf else 1024.0
    OFFB = 17 * OFF if bits == 8 else OFF
    MAGIC = 0x43004300 if bf else 0x64006400
    ONE2 = np.full(32, 0x3F803F80 if bf else 0x3C003C00, np.uint32)
    GT = K // group
    NCH = GT // u
    xw = x_bits.astype(np.uint32)
    y = np.full((M, N), np.nan, np.float32)
    for blk in range(-(-N // 16)):
        row0 = blk * 16
        ra, rb = np.minimum(row0 + G_, N - 1), np.minimum(row0 + G_ + 8, N - 1)
        xrow = np.where(G_ < M, G_, 0)
        red = np.zeros((warps, 4, 32), np.float32)
        for warp in range(warps):
            acc = [np.zeros(32, np.float32) for _ in range(4)]
            for c in range(warp, NCH, warps):
                for uu in range(u):
                    grp = c * u + uu
                    word0 = T_ * WL + grp * WPG  # wa = w + ra * WPR + t * WL + (c U + u) WPG
                    qa = wq[ra[:, None], word0[:, None] + np.arange(WL)]
                    qb = wq[rb[:, None], word0[:, None] + np.arange(WL)]
                    b0, b1 = [None] * NB, [None] * NB
                    for v in range(XV):  # uint4 v: inputs x[row, t L + grp G + 8 v .. + 8]
                        e = T_ * L + grp * group + 8 * v
                        X = [xw[xrow, e + 2 * i] | (xw[xrow, e + 2 * i + 1] << 16) for i in range(4)]
                        if bits == 4:
                            pairs = ((X[0], X[2]), (X[1], X[3]))
                        else:
                            pairs = ((X[0], X[1]), (X[2], X[3]))
                        for h, (p, q) in enumerate(pairs):
                            b0[2 * v + h] = _byte_perm(p, q, 0x5410)
                            b1[2 * v + h] = _byte_perm(p, q, 0x7632)
                    xs = [np.zeros(32, np.float32) for _ in range(4)]
                    for j in range(NB):
                        _mma(xs, [ONE2] * 4, b0[j], b1[j], bf)
                    cc = [np.zeros(32, np.float32) for _ in range(4)]
                    if bits == 4:
                        for j in range(NB):
                            wa, wb, sh = qa[:, j >> 1], qb[:, j >> 1], (j & 1) * 8
                            _mma(cc, [_nib(wa, sh, MAGIC), _nib(wb, sh, MAGIC), _nib(wa, sh + 4, MAGIC),
                                      _nib(wb, sh + 4, MAGIC)], b0[j], b1[j], bf)
                    else:
                        hh = [np.zeros(32, np.float32) for _ in range(4)]
                        for j in range(NB):
                            wa, wb = qa[:, j], qb[:, j]
                            _mma(cc, [_nib(wa, 0, MAGIC), _nib(wb, 0, MAGIC), _nib(wa, 8, MAGIC),
                                      _nib(wb, 8, MAGIC)], b0[j], b1[j], bf)
                            _mma(hh, [_nib(wa, 4, MAGIC), _nib(wb, 4, MAGIC), _nib(wa, 12, MAGIC),
                                      _nib(wb, 12, MAGIC)], b0[j], b1[j], bf)
                        cc = [np.float32(16) * hh[e] + cc[e] for e in range(4)]
                    # QmvS: U consecutive 16-bit values as U / 2 words, value u in half u & 1
                    s0 = _f16bits_to_f32(s_bits[ra, grp], bf)
                    s8 = _f16bits_to_f32(s_bits[rb, grp], bf)
                    o0 = _f16bits_to_f32(b_bits[ra, grp], bf) - np.float32(OFFB) * s0
                    o8 = _f16bits_to_f32(b_bits[rb, grp], bf) - np.float32(OFFB) * s8
                    acc[0] = s0 * cc[0] + (o0 * xs[0] + acc[0])
                    acc[1] = s0 * cc[1] + (o0 * xs[1] + acc[1])
                    acc[2] = s8 * cc[2] + (o8 * xs[2] + acc[2])
                    acc[3] = s8 * cc[3] + (o8 * xs[3] + acc[3])
            red[warp] = np.stack(acc)
        for idx in range(128):
            s = np.float32(0)
            for w2 in range(warps):
                s = s + red[w2, idx >> 5, idx & 31]
            ln, e = idx & 31, idx >> 5
            n = row0 + (ln >> 2) + (e >> 1) * 8
            m = 2 * (ln & 3) + (e & 1)
            if m < M and n < N:
                assert np.isnan(y[m, n])  # every output written once
                y[m, n] = s
    assert not np.isnan(y).any()  # ... and every one written
    return y


def _case(n, k, rows, bits, group, dtype, seed=0):
    rng = np.random.default_rng(seed + 7 * n + k + 1000 * bits + group)
    dt = getattr(mx, dtype)
    w = mx.array(rng.standard_normal((n, k)).astype(np.float32) * 0.05).astype(dt)
    x = mx.array(rng.standard_normal((rows, k)).astype(np.float32)).astype(dt)
    wq, s, b = mx.quantize(w, group_size=group, bits=bits)
    return x, wq, s, b


def _bits16(a: mx.array) -> np.ndarray:
    return np.array(a.view(mx.uint16))


CASES = [
    # (N, K, rows, bits, group, dtype): N not a multiple of 16, K not of 512, every group and
    # bits, both dtypes, 1..8 rows
    (40, 192, 3, 4, 64, "bfloat16"),
    (24, 96, 8, 4, 32, "bfloat16"),
    (16, 384, 5, 4, 128, "bfloat16"),
    (33, 320, 2, 8, 64, "bfloat16"),
    (17, 160, 7, 8, 32, "float16"),
    (48, 256, 1, 8, 128, "bfloat16"),
    (20, 448, 6, 4, 64, "float16"),
    (8, 128, 4, 4, 128, "float16"),
]


@pytest.mark.parametrize("n, k, rows, bits, group, dtype", CASES)
def test_the_kernels_arithmetic_is_mlxs_dequantized_product(n, k, rows, bits, group, dtype):
    x, wq, s, b = _case(n, k, rows, bits, group, dtype)
    lc = qmv.launch(n, k, rows, bits, group)
    bf = dtype == "bfloat16"
    y = emulate(_bits16(x), np.array(wq), _bits16(s), _bits16(b), bits, group, bf, lc.u, lc.warps)
    # the exact affine product: MLX's dequantization with float32 scales and biases (q * s + b
    # in float32, no 16-bit rounding of the weights), in float64
    deq = np.array(mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=group,
                                 bits=bits)).astype(np.float64)
    x64 = np.array(x.astype(mx.float32)).astype(np.float64)
    ref = x64 @ deq.T
    scale = np.abs(x64) @ np.abs(deq).T
    assert np.abs(y - ref).max() <= 1e-4 * scale.max(), np.abs(y - ref).max() / scale.max()
    # rounded to the output dtype, it passes the parity rule lab/probe_qmv.py applies on the GPU
    # against the CPU's float32 quantized_matmul
    out = y.astype(np.float16) if not bf else np.array(mx.array(y).astype(mx.bfloat16).astype(mx.float32))
    cpu = np.array(mx.quantized_matmul(x.astype(mx.float32), wq, s.astype(mx.float32), b.astype(mx.float32),
                                       transpose=True, group_size=group, bits=bits, stream=mx.cpu))
    verdict = qmv.parity(np.asarray(out, np.float64), cpu.astype(np.float64), dtype)
    assert verdict["ok"], verdict


@pytest.mark.parametrize("u, warps", [(1, 3), (2, 8), (4, 1)])
def test_every_chunk_split_gives_the_same_product(u, warps):
    """Chunks over warps: more warps than chunks (idle warps add zeros), one warp doing all, and
    uneven shares; the sum is the same product whatever the split."""
    n, k, rows, bits, group = 24, 512, 4, 4, 64
    x, wq, s, b = _case(n, k, rows, bits, group, "bfloat16", seed=3)
    y = emulate(_bits16(x), np.array(wq), _bits16(s), _bits16(b), bits, group, True, u, warps)
    deq = np.array(mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=group,
                                 bits=bits)).astype(np.float64)
    x64 = np.array(x.astype(mx.float32)).astype(np.float64)
    assert np.abs(y - x64 @ deq.T).max() <= 1e-4 * (np.abs(x64) @ np.abs(deq).T).max()


def test_a_wrong_nibble_order_would_fail():
    """The check can fail: the same emulation with the two nibbles of every code pair swapped
    (high code first, as another packing would have it) is far outside the bound."""
    n, k, rows, bits, group = 16, 128, 2, 4, 64
    x, wq, s, b = _case(n, k, rows, bits, group, "bfloat16", seed=5)
    w = np.array(wq)
    swapped = ((w & 0x0F0F0F0F) << 4) | ((w >> 4) & 0x0F0F0F0F)
    y = emulate(_bits16(x), swapped, _bits16(s), _bits16(b), bits, group, True, 2, 2)
    deq = np.array(mx.dequantize(wq, s.astype(mx.float32), b.astype(mx.float32), group_size=group,
                                 bits=bits)).astype(np.float64)
    x64 = np.array(x.astype(mx.float32)).astype(np.float64)
    assert np.abs(y - x64 @ deq.T).max() > 1e-2 * (np.abs(x64) @ np.abs(deq).T).max()


# --- launch arithmetic ------------------------------------------------------------------------
@pytest.mark.parametrize("n, k, bits, group, u, warps", [
    (14336, 4096, 4, 64, 4, 4),  # wide: 4 warps, 256 codes a chunk (the probe's best)
    (28672, 8192, 4, 64, 4, 4),
    (4096, 4096, 4, 64, 4, 8),
    (4096, 14336, 4, 64, 4, 8),  # 224 groups: 56 chunks of 4
    (1024, 4096, 4, 64, 8, 8),  # narrow: 512 codes a chunk (the probe's best at N = 1024)
    (4096, 4096, 4, 32, 8, 8),
    (4096, 4096, 4, 128, 2, 8),
    (4096, 4096, 8, 64, 2, 8),  # 8-bit: half the codes, the same weight bytes a chunk
    (4096, 4096, 8, 128, 1, 8),
    (1024, 4096, 8, 128, 2, 8),
    (4096, 576, 4, 64, 1, 8),  # 9 groups: u 1
    (4096, 640, 4, 64, 2, 4),  # 10 groups: u 2, 5 chunks: 4 warps
    (40, 192, 4, 64, 1, 2),  # 3 groups, narrow: u 1 (8 and 4 do not divide 3), 3 chunks: 2 warps
    (100, 64, 4, 64, 1, 1),  # one group: one warp
])
def test_launch_picks_u_and_warps_by_the_rule(n, k, bits, group, u, warps):
    lc = qmv.launch(n, k, 3, bits, group)
    assert (lc.u, lc.warps) == (u, warps)
    assert lc.groups % lc.u == 0 and lc.warps <= max(lc.chunks, 1)
    assert lc.blocks == -(-n // 16) and lc.blocks * 16 >= n > (lc.blocks - 1) * 16
    assert lc.grid == (lc.blocks * lc.warps * 32, 1, 1) and lc.threadgroup == (lc.warps * 32, 1, 1)
    assert lc.warps <= qmv.MAX_WARPS
    # MLX launches ceil(grid / threadgroup) blocks of the threadgroup: one per 16 weight rows
    assert -(-lc.grid[0] // lc.threadgroup[0]) == lc.blocks
    assert lc.words_per_row == k * bits // 32


def test_every_instance_launch_can_pick_keeps_its_chunk_in_the_register_budget():
    """u x group stays within the chunk's codes (512 for 4-bit narrow, 256 for 8-bit narrow):
    the instances nvcc compiled without spills here (4-bit group 128 u 8 and 8-bit group 128
    u 8 spill; launch never picks them)."""
    seen = set()
    for n in (16, 1024, 2048, 4096, 8192, 152064):
        for k in range(128, 20000, 64):
            for bits in qmv.BITS:
                for group in qmv.GROUPS:
                    if k % group:
                        continue
                    lc = qmv.launch(n, k, 2, bits, group)
                    seen.add((bits, group, lc.u))
                    assert lc.u * group <= qmv.CHUNK_CODES[bits] * 2
    assert (4, 128, 8) not in seen and (8, 128, 8) not in seen and (8, 64, 8) not in seen


# --- refusals ---------------------------------------------------------------------------------
def _why(**kw):
    args = dict(backend="cuda", mode="affine", bits=4, group=64, rows=4, x_dtype="bfloat16",
                scales_dtype="bfloat16", has_biases=True, x_width=4096, w_shape=(1024, 512))
    args.update(kw)
    return qmv.refusal(**args)


def test_refusals_name_their_reason():
    assert _why() is None
    assert _why(bits=8, w_shape=(1024, 1024)) is None
    assert _why(group=32) is None and _why(group=128) is None
    assert _why(rows=2) is None and _why(rows=8) is None and _why(x_dtype="float16", scales_dtype="float16") is None
    assert _why(backend="cpu") == "cpu"
    assert _why(backend="metal") == "metal" and "qmv_wide" in qmv.REASONS["metal"]
    for mode in ("mxfp4", "nvfp4", "mxfp8"):
        assert _why(mode=mode) == "mode"
    assert "mxfp4" in qmv.REASONS["mode"] and "nvfp4" in qmv.REASONS["mode"]
    for bits in (2, 3, 5, 6):
        assert _why(bits=bits, w_shape=(1024, 4096 * bits // 32)) == "bits"
    assert _why(group=16) == "group"
    assert _why(rows=1) == "rows" and _why(rows=9) == "rows" and _why(rows=0) == "rows"
    assert _why(x_dtype="float32", scales_dtype="float32") == "dtype"
    assert _why(scales_dtype="float16") == "dtype"  # one type T for x, scales and biases
    assert _why(has_biases=False) == "dtype"
    assert _why(w_shape=(1024, 256)) == "shape"  # the weight is narrower than x
    assert _why(w_shape=(4, 1024, 512)) == "shape"
    assert _why(x_width=96, w_shape=(1024, 12)) == "shape"  # not a whole number of groups
    assert set(qmv.REASONS) == {"cpu", "metal", "mode", "bits", "group", "rows", "dtype", "shape"}


# --- the source handed to MLX -----------------------------------------------------------------
def test_the_source_mlx_gets_is_the_source_without_comments():
    src = qmv.source_for(4, 64, "bfloat16", 4)
    assert src.startswith("constexpr int BITS = 4;\nconstexpr int G = 64;\nconstexpr int U = 4;\n"
                          "constexpr bool BF = true;\nusing T = __nv_bfloat16;\n")
    assert "using T = __half;" in qmv.source_for(8, 32, "float16", 2)
    body = src.split("using T = __nv_bfloat16;\n", 1)[1]
    code = [ln.strip() for ln in qmv.SOURCE.splitlines() if ln.strip() and not ln.strip().startswith("//")]
    assert body.splitlines() == code
    assert "//" not in body and not any(ln[:1].isspace() for ln in src.splitlines())
    # MLX passes a shape (ndim) only for names it finds followed by _shape (_ndim): x's shape
    # and rank, w's shape, nothing else (the kernel's parameters are what it reads)
    for name, shape, ndim in (("x", True, True), ("w", True, False), ("scales", False, False),
                              ("biases", False, False)):
        assert (f"{name}_shape" in src) is shape and (f"{name}_ndim" in src) is ndim
        assert f"{name}_strides" not in src
    assert qmv.instance_name(4, 64, "bfloat16", 4) == "blockwidth_qmv_b4_g64_u4_bf16"


def test_the_call_strategy_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(qmv.CALL_ENV, raising=False)
    assert qmv.call_strategy() == qmv.DEFAULT_CALL == "compile"  # the H200's steadier call
    monkeypatch.setenv(qmv.CALL_ENV, "direct")
    assert qmv.call_strategy() == "direct"
    monkeypatch.setenv(qmv.CALL_ENV, " Compile ")
    assert qmv.call_strategy() == "compile"
    monkeypatch.setenv(qmv.CALL_ENV, "graph")
    with pytest.raises(ValueError, match="direct, compile"):
        qmv.call_strategy()


# --- the parity rule --------------------------------------------------------------------------
def test_the_parity_rule_passes_output_rounding_and_fails_a_wrong_group():
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((4, 300)) * 3
    rounded = np.array(mx.array(ref.astype(np.float32)).astype(mx.bfloat16).astype(mx.float32), np.float64)
    assert qmv.parity(rounded, ref, "bfloat16")["ok"]
    assert qmv.parity(ref.astype(np.float16).astype(np.float64), ref, "float16")["ok"]
    wrong = rounded.copy()
    wrong[:, :8] *= 1.03  # one group's scale off by 3 %
    assert not qmv.parity(wrong, ref, "bfloat16")["ok"]
    assert not qmv.parity(rounded + 0.02 * np.abs(ref).max(), ref, "bfloat16")["ok"]
    bad = rounded.copy()
    bad[0, 0] = np.nan
    assert not qmv.parity(bad, ref, "bfloat16")["ok"]


# --- routing (engine.linear's qmv mode) ---------------------------------------------------------
import mlx.nn as nn  # noqa: E402

from blockwidth.engine import linear  # noqa: E402
from blockwidth.engine.linear import KernelWin, auto_allowed, qmv_plan, routing_for, rows_won, verify_linear  # noqa: E402

_QSTOCK = nn.QuantizedLinear.__call__


def _plan(**kw):
    args = dict(backend="cuda", allowed=None, mode="affine", bits=4, group=64, rows=4, x_dtype="bfloat16",
                scales_dtype="bfloat16", has_biases=True, width=4096, w_shape=(1024, 512))
    args.update(kw)
    return qmv_plan(**args)


def test_auto_routes_only_the_rows_a_record_won_at():
    assert _plan() is None  # explicit qmv: every projection the kernel takes
    allowed = {(4, 64): frozenset({2, 3, 4})}
    assert _plan(allowed=allowed, rows=3) is None
    assert _plan(allowed=allowed, rows=5) == "auto"  # measured, not won
    assert _plan(allowed=allowed, bits=8, w_shape=(1024, 1024)) == "auto"  # never measured
    assert _plan(allowed=allowed, rows=9) == "rows"  # the kernel's own limit comes first
    assert "10 %" in linear.AUTO_REASON


def test_rows_won_asks_for_ten_percent_in_every_pass():
    p1 = {1: (10.0, 10.5), 2: (13.0, 11.0), 4: (21.0, 11.5), 8: (16.0, 12.0)}
    p2 = {1: (10.0, 10.4), 2: (13.0, 11.9), 4: (21.0, 11.2), 8: (16.0, 15.0)}
    # rows 2: 15 % then 8.5 % faster (not every pass); 8: 25 % then 6 %
    assert rows_won([p1, p2]) == (4,)
    assert rows_won([p1]) == (2, 4, 8)
    assert rows_won([p1, {4: (21.0, 11.0)}]) == (4,)  # a row count not in every pass is not won
    assert rows_won([]) == ()
    assert rows_won([{2: (10.0, 9.0)}]) == ()  # exactly 10 %: not faster by more


def test_auto_is_stock_without_a_record_and_qmv_where_one_won():
    win = KernelWin(4, 64, "9.0", (2, 3, 4, 5, 6, 7, 8), "direct", "0.32.4", "lab/evidence/x/qmv.json")
    assert auto_allowed("cuda", "9.0", ()) is None
    assert auto_allowed("cuda", "9.0", (win,), call="direct") == {(4, 64): frozenset(range(2, 9))}
    assert auto_allowed("cuda", "12.1", (win,), call="direct") is None  # another device: not measured there
    assert auto_allowed("cuda", "9.0", (win,), call="compile") is None  # another call strategy
    assert auto_allowed("cuda", "9.0", (win,)) is None  # ... which the default (compile) is
    assert auto_allowed("metal", None, (win,)) is None and auto_allowed("cpu", None, (win,)) is None
    # on this CPU auto is stock whatever the table says, and adds nothing to a projection
    r = routing_for("auto")
    assert r.mode is linear.VerifyLinear.STOCK and not r.auto
    with verify_linear("auto"):
        assert nn.QuantizedLinear.__call__ is _QSTOCK


def test_the_committed_wins_route_only_what_the_h200_measured_under_each_call():
    """QMV_WINS as committed (lab/tests re-derives it from the H200's record): on a compute
    capability 9.0 device auto takes 4-bit group 64 at 2..8 rows under either call strategy
    and 8-bit group 64 at 3..8 only under ``direct``, the one strategy its curve was measured
    with; any other group, device or backend stays stock."""
    from tests.conftest import ROOT

    assert linear.QMV_WINS and all((ROOT / w.record).is_file() for w in linear.QMV_WINS)
    assert auto_allowed("cuda", "9.0", call="compile") == {(4, 64): frozenset(range(2, 9))}
    assert auto_allowed("cuda", "9.0", call="direct") == {(4, 64): frozenset(range(2, 9)),
                                                         (8, 64): frozenset(range(3, 9))}
    for cc in ("8.0", "10.0", "12.1", None):
        assert auto_allowed("cuda", cc) is None
    assert auto_allowed("metal", "9.0") is None and auto_allowed("cpu", "9.0") is None
    allowed = auto_allowed("cuda", "9.0", call="compile")
    assert _plan(allowed=allowed, rows=2) is None and _plan(allowed=allowed, rows=8) is None
    assert _plan(allowed=allowed, group=128) == "auto"  # group 128: never measured
    assert _plan(allowed=allowed, bits=8, w_shape=(1024, 1024)) == "auto"  # 8-bit under compile


def _layers():
    """Projections of every kind a qmv block meets, with the reason each must stay stock for."""
    mx.random.seed(4)

    def q(n, k, bits, group, mode="affine", bias=False):
        lin = nn.Linear(k, n, bias=bias)
        lin.set_dtype(mx.bfloat16)
        return nn.QuantizedLinear.from_linear(lin, group_size=group, bits=bits, mode=mode)

    bf = nn.Linear(256, 40)
    bf.set_dtype(mx.bfloat16)
    return {
        "a4": (q(40, 256, 4, 64), None), "a4b": (q(40, 256, 4, 32, bias=True), None),
        "a8": (q(24, 256, 8, 128), None), "a3": (q(40, 256, 3, 64), "bits"),
        "mx": (q(40, 256, 4, 32, mode="mxfp4"), "mode"), "bf": (bf, "16-bit"),
    }


def test_a_qmv_block_on_a_cpu_routes_nothing_and_says_why():
    layers = _layers()
    x = mx.random.normal((1, 4, 256)).astype(mx.bfloat16)
    with verify_linear("qmv") as r:
        outs = {k: lay(x) for k, (lay, _) in layers.items()}
        assert r.routed == 0
        assert r.stock_reasons == {"cpu": 5} and r.passed == 5  # the 16-bit one is not qmv's
    for k, (lay, _) in layers.items():
        assert mx.array_equal(outs[k], lay(x)).item()
    assert nn.QuantizedLinear.__call__ is _QSTOCK
    s = r.summary()
    assert s["mode"] == "qmv" and s["served"] == {} and s["reasons"]["cpu"] == qmv.REASONS["cpu"]
    assert s["call"] in qmv.CALLS and isinstance(s["kernel_compile_s"], dict)
    assert "no CUDA" in linear.unrouted_reason("qmv", "cpu")
    assert "qmv_wide" in linear.unrouted_reason("qmv", "metal")
    assert "affine 4- and 8-bit" in linear.unrouted_reason("qmv", "cuda")
    assert linear.max_rows("qmv") == 8


def test_on_cuda_the_block_sends_2_to_8_rows_of_affine_4_and_8_bit_projections_to_the_kernel(monkeypatch):
    """The dispatcher's rule with the backend said to be CUDA: the kernel's call is replaced
    by the CPU's quantized matmul (the kernel is CUDA source), counted, so what reaches it,
    with which arguments, and what the block records can be checked here."""
    sent = []

    def on_cpu(x_shape, n, dt, bits, group, strategy="direct"):
        def run(x, w, s, b):
            sent.append((x.shape, bits, group))
            assert (tuple(x.shape), w.shape[0], x.dtype) == (tuple(x_shape), n, dt)
            return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=bits)
        return run

    monkeypatch.setattr(linear, "current_backend", lambda: "cuda")
    monkeypatch.setattr(qmv, "bound", on_cpu)
    layers = _layers()
    for rows, routed in ((1, False), (2, True), (5, True), (8, True), (9, False)):
        x = mx.random.normal((1, rows, 256)).astype(mx.bfloat16)
        sent.clear()
        with verify_linear("qmv") as r:
            got = {k: lay(x) for k, (lay, _) in layers.items()}
        for k, (lay, why) in layers.items():
            assert mx.allclose(got[k], lay(x), atol=1e-2).item(), k  # the bias, the reshape
        if routed:
            assert r.routed == 3 and sent == [((1, rows, 256), 4, 64), ((1, rows, 256), 4, 32),
                                              ((1, rows, 256), 8, 128)]
            assert r.stock_reasons == {"bits": 1, "mode": 1}
            assert r.served == {"40x256 affine-4 g64": 1, "40x256 affine-4 g32": 1, "24x256 affine-8 g128": 1}
        else:
            assert r.routed == 0 and not sent and r.stock_reasons == {"rows": 3, "bits": 1, "mode": 1}
    assert nn.QuantizedLinear.__call__ is _QSTOCK


@pytest.mark.parametrize("call", [None, "direct"])
def test_on_a_cuda_9_0_device_auto_routes_what_the_h200_won_under_the_call_in_use(monkeypatch, call):
    """auto with the committed QMV_WINS on a device said to be CUDA 9.0: the default call
    (compile) takes the 4-bit group-64 projection at 2..8 rows and nothing else (group 32 and
    the 8-bit one were not measured compiled); ``direct`` takes the 8-bit group-64 one too
    at 3..8 rows, the rows its curve won at. The strategy reaches the kernel's call."""
    sent = []

    def on_cpu(x_shape, n, dt, bits, group, strategy):
        def run(x, w, s, b):
            sent.append((bits, group, strategy))
            return mx.quantized_matmul(x, w, s, b, transpose=True, group_size=group, bits=bits)
        return run

    if call is None:
        monkeypatch.delenv(qmv.CALL_ENV, raising=False)
    else:
        monkeypatch.setenv(qmv.CALL_ENV, call)
    monkeypatch.setattr(linear, "current_backend", lambda: "cuda")
    monkeypatch.setattr(linear, "_compute_capability", lambda: "9.0")
    monkeypatch.setattr(qmv, "bound", on_cpu)
    mx.random.seed(5)

    def q(n, bits, group):
        lin = nn.Linear(256, n)
        lin.set_dtype(mx.bfloat16)
        return nn.QuantizedLinear.from_linear(lin, group_size=group, bits=bits)

    layers = {"4/64": q(40, 4, 64), "4/32": q(40, 4, 32), "8/64": q(24, 8, 64), "8/128": q(24, 8, 128)}
    strategy = call or "compile"
    for rows in (1, 2, 3, 8, 9):
        x = mx.random.normal((1, rows, 256)).astype(mx.bfloat16)
        sent.clear()
        with verify_linear("auto") as r:
            for lay in layers.values():
                lay(x)
        want = []
        if 2 <= rows <= 8:
            want.append((4, 64, strategy))
            if strategy == "direct" and rows >= 3:
                want.append((8, 64, strategy))
        assert sent == want, (rows, call)
        assert r.auto and r.call == strategy and r.summary()["call"] == strategy
        if 2 <= rows <= 8:
            assert r.stock_reasons == {"auto": 4 - len(want)}
    assert nn.QuantizedLinear.__call__ is _QSTOCK


@pytest.mark.parametrize("call", ["compile", "direct"])
def test_prepare_under_auto_compiles_and_traces_only_what_auto_routes(monkeypatch, call):
    """Before the clock, auto on a CUDA 9.0 device compiles the instances of the (bits, group)
    it routes, and under compile traces their shapes at the rows it routes: the 8-bit
    projection, stock under the default call, costs no compile; explicit qmv prepares all."""
    from blockwidth import engine  # engine.attention below
    import blockwidth.engine.attention  # noqa: F401
    compiled, traced = [], []
    monkeypatch.setenv(qmv.CALL_ENV, call)
    monkeypatch.setattr(linear, "current_backend", lambda: "cuda")
    monkeypatch.setattr(engine.attention, "current_backend", lambda: "cuda")
    monkeypatch.setattr(linear, "_compute_capability", lambda: "9.0")
    monkeypatch.setattr(qmv, "compile_instance", lambda *inst: compiled.append(inst) or 1.0)
    monkeypatch.setattr(qmv, "matmul", lambda x, w, s, b, bits, group, strategy:
                        traced.append((bits, x.shape[1], strategy)) or mx.zeros((1,)))

    def q(n, bits, group):
        lin = nn.Linear(256, n)
        lin.set_dtype(mx.bfloat16)
        return nn.QuantizedLinear.from_linear(lin, group_size=group, bits=bits)

    model = nn.Sequential(q(40, 4, 64), q(24, 8, 64))
    done = linear.prepare("auto", model)
    if call == "compile":
        assert [i[:2] for i in compiled] == [(4, 64)] and set(done) == {qmv.instance_name(*compiled[0])}
        assert traced == [(4, r, "compile") for r in range(2, 9)]
    else:  # direct: the 8-bit wins too (3..8 rows), and nothing is traced
        assert sorted(i[:2] for i in compiled) == [(4, 64), (8, 64)] and traced == []
    compiled.clear(), traced.clear()
    linear.prepare("qmv", model)
    assert sorted(i[:2] for i in compiled) == [(4, 64), (8, 64)]
    assert len(traced) == (14 if call == "compile" else 0)
    assert linear.prepare("stock", model) == {}


def test_a_qmv_speculative_run_on_the_4bit_demo_pair_keeps_classics_tokens(demo_pairs):
    from blockwidth.engine.decode import classic, speculative
    from blockwidth.engine.demo.prompts import DEMO_PROMPTS

    pair = demo_pairs(None, "4bit")
    ids = pair.tokenizer.encode(DEMO_PROMPTS[1])
    run = speculative(pair, ids, 24, 4, linear="qmv")
    assert run.tokens == classic(pair, ids, 24).tokens
    lin = run.attention["linear"]
    assert lin["mode"] == "qmv" and lin["routed_calls"] == 0 and lin["stock_reasons"].get("cpu", 0) > 0
    assert "linear" not in speculative(pair, ids, 8, 4).attention  # auto on a CPU: stock


def test_each_instance_header_holds_only_the_loads_and_the_mma_it_uses():
    h = qmv.header_for(4, 64, "bfloat16", 4)  # 2 words a lane a group, 4 scales a chunk
    assert h.count("struct QmvW") == 1 and h.count("struct QmvS") == 1
    w, sc = h.split("struct QmvS")
    assert "uint32_t v[2];" in w.split("struct QmvW")[1] and "uint32_t v[2];" in sc
    assert ".bf16.bf16.f32" in h and ".f16.f16.f32" not in h and "//" not in h
    h8 = qmv.header_for(8, 128, "float16", 1)  # 8 words (two v4 loads), one u16 scale
    assert "uint32_t v[8];" in h8 and "ld.global.nc.L1::no_allocate.u16" in h8 and ".f16.f16.f32" in h8
    for bits in qmv.BITS:
        for group in qmv.GROUPS:
            for u in (1, 2, 4, 8):
                assert qmv.header_for(bits, group, "float16", u)  # every instance has its pieces


def test_a_bad_call_strategy_is_one_line_and_exit_2_before_any_model_loads():
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), BLOCKWIDTH_QMV_CALL="graph")
    for cmd in (["costcurve", "--rows", "1-2"], ["sweep", "--widths", "2", "-n", "1"]):
        out = subprocess.run([sys.executable, "-m", "blockwidth", *cmd, "--verify-linear", "qmv"],
                             capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        assert out.returncode == 2 and out.stderr.strip().splitlines() == [
            "blockwidth: error: BLOCKWIDTH_QMV_CALL='graph': expected one of direct, compile"], out.stderr
    # auto on a CPU never reads it: a stock block opens whatever it says
    os.environ["BLOCKWIDTH_QMV_CALL"] = "graph"
    try:
        with verify_linear("auto") as r:
            assert r.mode is linear.VerifyLinear.STOCK
    finally:
        del os.environ["BLOCKWIDTH_QMV_CALL"]
