"""A multi-row affine-quantized matmul for CUDA: 2..8 verify rows read each weight once.

MLX 0.32.4's CUDA build sends a quantized projection of 2..7 rows to its per-row ``qmv``
kernel, which reads the weights once per row (and 8+ rows to ``qmm``): a 4-row verify of a
4-bit target costs ~3.5x its 1-row forward on the H200. This kernel (``mx.fast.cuda_kernel``)
computes ``y[M, N] = x[M, K] @ dequant(w)[N, K]^T`` for M = 1..8 on the tensor cores with the
weights as the A operand ("swap AB"), so one ``mma.sync.m16n8k16`` serves every row and the
weights are read once for all of them (the design the probe in ``shared/probes/qmv`` measured:
1.04-1.07x of one row's device time at 8 rows).

MLX's affine layout: ``w`` uint32 words of 32 / bits codes, low bits first; per row and group
of ``group`` inputs a scale ``s`` and a bias ``b`` (the activations' dtype), ``W = q * s + b``.

- **A operand**: the raw codes as 16-bit floats ``OFF + q`` (bf16: 128 + q, f16: 1024 + q;
  exact), made by one shift and one ``lop3`` per pair of codes: ``(w >> sh) & 0x000F000F |
  MAGIC``. An 8-bit code is split into its two nibbles, one MMA each (16 * hi + lo).
- **Per group**: ``P[n, m] = sum (OFF + q) x`` from the weight MMAs and ``xs[m] = sum x`` from
  MMAs with an all-ones A (so ``xs`` lands in the C layout), then in float32
  ``y += s * P + (b - OFF * s) * xs`` (8-bit: ``s * (16 P_hi + P_lo) + (b - 17 OFF s) * xs``).
  The scale is applied after the MMA: no dequantized weight is ever rounded.
- **Lanes**: a warp owns 16 weight rows; lane (g, t) = (lane / 4, lane % 4) holds rows g and
  g + 8, and within every group the ``group / 4`` contiguous codes ``[t group/4, (t+1)
  group/4)`` (4-bit group 64: 8 bytes, one ``v2`` load) and the same inputs of x row g (rows
  >= M read row 0 and are never stored). The k order inside a group is permuted the same way
  for A and B (B rebuilt with ``byte_perm``), which an MMA's sum does not see.
- **Block**: ``warps`` warps on the same 16 rows split K into chunks of ``u`` groups (chunk c
  to warp c % warps); one shared-memory sum; rows >= N read row N - 1 and are not stored.
  Each chunk's loads sit in their own conditional block (in one straight-line block ptxas sank
  them next to their uses, one DRAM round trip per group: the probe's finding).

M, N and K are read at run time (``x_shape``, ``w_shape``) and the warps from the block, so one
compile serves every shape and row count of a (bits, group, dtype, u); the kernel object for
each is built once (:func:`kernel`). Host cost per call is what this route fights (the probe:
~21 us a custom-kernel call against 6.6 for ``quantized_matmul``), so the call's arguments are
prepared once per shape, the source handed to MLX is stripped of comments and indentation (MLX
rebuilds and hashes it on every call), and each call runs through ``mx.compile`` (no
Python-side rebuild: the traced primitive is replayed), the default since the H200 measured it
steadier (:data:`DEFAULT_CALL`); ``BLOCKWIDTH_QMV_CALL=direct`` calls the kernel object.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

BITS = (4, 8)
GROUPS = (32, 64, 128)
DTYPES = ("bfloat16", "float16")
MAX_ROWS = 8  # the MMA's n: one instruction serves 8 rows
TILE = 16  # weight rows per warp (the MMA's m)
MAX_WARPS = 16  # the shared-memory sum is sized for this many
# codes per lane between two sums: 4-bit 256 (the probe's best, u = 4 at group 64), 512 for
# narrow projections (few blocks: more bytes in flight per warp; the probe's best at N = 1024);
# 8-bit half of that (the same bytes of weights per chunk)
CHUNK_CODES = {4: 256, 8: 128}
NARROW_N = 2048
WIDE_N = 8192  # from here 4 warps a block (the probe's best on 14336 and 28672 rows), else 8
CALLS = ("direct", "compile")
CALL_ENV = "BLOCKWIDTH_QMV_CALL"
# The default call: compile. On the H200 (lab/evidence/h200-2026-12-01/qmv/curves) the 8B 4-bit
# verify of 2-8 rows took 7.3-8.9 ms through mx.compile at 19 of its 21 (pass, rows) points
# (the others 11.4-11.5), and 7.8-14.3 called directly, above 10 ms at 13 of 21 (all 7 of
# pass 0); per projection in a chain, 10-28 us against 13-38 (docs/qmv.md).
DEFAULT_CALL = "compile"


@dataclass(frozen=True)
class Launch:
    """Where one call runs: the kernel instance (bits, group, u) and its grid. Pure arithmetic,
    checked on the CPU (tests/test_qmv.py)."""

    n: int
    k: int
    rows: int
    bits: int
    group: int
    u: int  # groups per chunk (a template constant: the registers hold one chunk)
    warps: int  # warps a block (read by the kernel from blockDim)
    blocks: int  # one per 16 weight rows

    @property
    def grid(self) -> tuple[int, int, int]:
        # mx.fast.cuda_kernel's grid is in threads (Metal's convention), not blocks
        return (self.blocks * self.warps * 32, 1, 1)

    @property
    def threadgroup(self) -> tuple[int, int, int]:
        return (self.warps * 32, 1, 1)

    @property
    def groups(self) -> int:
        return self.k // self.group

    @property
    def chunks(self) -> int:
        return self.groups // self.u

    @property
    def words_per_row(self) -> int:
        return self.k * self.bits // 32


def launch(n: int, k: int, rows: int, bits: int, group: int) -> Launch:
    """The launch of an ``n`` x ``k`` projection of ``rows`` rows (the caller checked the shape
    with :func:`refusal`). ``u`` is the largest of 8, 4, 2, 1 that fits the chunk's codes and
    divides the groups (so no chunk is partial and every scale load is aligned); the warps are
    4 or 8 as the probe measured best, never more than there are chunks to share."""
    groups = k // group
    target = CHUNK_CODES[bits] * (2 if n <= NARROW_N else 1)
    u = next(c for c in (8, 4, 2, 1) if c * group <= max(target, group) and groups % c == 0)
    chunks = groups // u
    warps = 4 if n >= WIDE_N else 8
    while warps > 1 and warps > chunks:
        warps //= 2
    return Launch(n, k, rows, bits, group, u, warps, -(-n // TILE))


# --- refusals: why a projection stays on the stock quantized matmul --------------------------
# (key, reason) pairs: the key counts in a record, the reason is said once per key.
REASONS = {
    "cpu": "a CPU has no CUDA: MLX's own quantized matmul runs",
    "metal": "MLX's Metal build has its own multi-row quantized kernel (qmv_wide); this kernel is "
             "CUDA source",
    "mode": "its codes are floating point with shared power-of-two scales and no bias (mxfp4, "
            "nvfp4, mxfp8): the kernel reads affine codes, q * scale + bias",
    "bits": "the kernel unpacks 4- and 8-bit codes (3-, 5- and 6-bit codes straddle 32-bit "
            "words; 2-bit is not written)",
    "group": "the kernel takes groups of 32, 64 or 128",
    "rows": f"the kernel takes 2..{MAX_ROWS} rows (one MMA's 8 columns); 1 row is MLX's qmv, "
            "9+ its qmm",
    "dtype": "the kernel takes bfloat16 or float16 activations with scales and biases of the "
             "same dtype",
    "shape": "the weight is not a 2-D affine matrix of the input's width",
}


def refusal(backend: str, mode: str, bits: int, group: int, rows: int, x_dtype: str,
            scales_dtype: str, has_biases: bool, x_width: int, w_shape: tuple,
            min_rows: int = 2) -> str | None:
    """None when the kernel computes this projection exactly as its source assumes; else the
    key of :data:`REASONS` that keeps it on the stock quantized matmul. Pure: names in, a name
    out (dtypes as MLX names them: ``bfloat16``). ``min_rows`` 1: the exact path (engine.exact),
    which sends 1-row steps to the kernel too (it computes M = 1..8)."""
    if backend != "cuda":
        return "metal" if backend == "metal" else "cpu"
    if mode != "affine":
        return "mode"
    if bits not in BITS:
        return "bits"
    if group not in GROUPS:
        return "group"
    if not min_rows <= rows <= MAX_ROWS:
        return "rows"
    if x_dtype not in DTYPES or scales_dtype != x_dtype or not has_biases:
        return "dtype"
    if (len(w_shape) != 2 or w_shape[0] < 1 or w_shape[1] * 32 // bits != x_width
            or x_width % group or x_width < group):
        return "shape"
    return None


# --- the parity rule -------------------------------------------------------------------------
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # 8 and 11 significant bits
SUM_MARGIN = 2.0 ** -12  # of max |ref|: the float32 sums' error, with room (see parity)
L2_FACTOR, L2_FLOOR = 1.25, 2.0 ** -14


def round_to(values, dtype: str):
    """float64 ``values`` rounded to ``dtype`` (to nearest, ties to even) and back, in numpy."""
    import numpy as np

    v = np.asarray(values, np.float64)
    if dtype == "float16":
        return v.astype(np.float16).astype(np.float64)
    bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def parity(y, ref, dtype: str) -> dict:
    """Whether the kernel's output ``y`` (its dtype's values, as float64) is the affine product
    ``ref`` (float32 on the CPU: MLX's quantized_matmul on float32 inputs, scales and biases)
    up to rounding. Numpy arrays in, a verdict with its figures out.

    Why these bounds. The kernel forms every product exactly (a 16-bit code times a 16-bit
    input fits float32's 24 bits) and sums in float32; what it adds to ``ref``'s own float32
    error is (a) rounding the output to ``dtype``, at most the unit roundoff u |y| (bf16:
    2^-8, f16: 2^-11, 8 and 11 significant bits), and (b) the float32 sums, whose largest
    term is the per-group offset (b - 128 s) sum(x) (17 x 128 for 8-bit, 1024 for f16): at
    K = 14336 their error estimates to ~1e-5 of max |ref|, where 2^-12 = 2.4e-4 leaves a 20x
    margin. So (1) max |y - ref| <= (u + 2^-12) max |ref|. And since y is ref rounded to
    ``dtype`` but for the elements that the float32 sums push across a rounding boundary, (2)
    its relative L2 error is at most 1.25x that of rounding ``ref`` itself (the floor; rounding
    a Gaussian to bf16 gives 1.66e-3) + 2^-14: a systematic error too small for (1), such as
    one group's scale off by a few percent, fails (2). (3) No value is NaN or infinite."""
    import numpy as np

    y = np.asarray(y, np.float64)
    ref = np.asarray(ref, np.float64)
    finite = bool(np.isfinite(y).all())
    peak = float(np.abs(ref).max()) or 1.0
    norm = float(np.linalg.norm(ref)) or 1.0
    err = np.abs(np.where(np.isfinite(y), y, 0.0) - ref)
    max_rel = float(err.max()) / peak
    l2 = float(np.linalg.norm(err)) / norm
    floor = float(np.linalg.norm(round_to(ref, dtype) - ref)) / norm
    max_tol = UNIT_ROUNDOFF[dtype] + SUM_MARGIN
    l2_tol = L2_FACTOR * floor + L2_FLOOR
    return {"ok": finite and max_rel <= max_tol and l2 <= l2_tol, "finite": finite,
            "max_abs_over_max_ref": max_rel, "max_tol": max_tol, "rel_l2": l2, "rel_l2_tol": l2_tol,
            "rel_l2_of_rounding": floor}


# --- the kernel source ------------------------------------------------------------------------
# The header, in pieces: an instance gets only the load widths, the MMA and the conversion it
# uses (MLX concatenates and hashes the whole source on every call).
_H_COMMON = r"""
#define QDI __device__ __forceinline__
// two codes (bits sh..sh+3 and 16+sh..16+sh+3 of w) -> 16-bit floats {OFF + q_lo, OFF + q_hi}:
// one lop3 with the exponent pattern in a register (as two immediates it took two LOP3s)
QDI uint32_t qmv_nib(uint32_t w, int sh, uint32_t magic) {
  uint32_t r;
  asm("lop3.b32 %0, %1, 0x000F000F, %2, 0xEA;" : "=r"(r) : "r"(w >> sh), "r"(magic));
  return r;
}
"""
# QmvW: the WL consecutive words of one weight row a lane reads per group (4, 8, 16 or 32
# bytes), L1 not allocated
_H_WORDS = {
    1: r"""
struct QmvW {
  uint32_t v[1];
  QDI void load(const uint32_t* p) { asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v[0]) : "l"(p)); }
};
""",
    2: r"""
struct QmvW {
  uint32_t v[2];
  QDI void load(const uint32_t* p) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
  }
};
""",
    4: r"""
struct QmvW {
  uint32_t v[4];
  QDI void load(const uint32_t* p) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
  }
};
""",
    8: r"""
struct QmvW {
  uint32_t v[8];
  QDI void load(const uint32_t* p) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v[4]), "=r"(v[5]), "=r"(v[6]), "=r"(v[7]) : "l"(p + 4));
  }
};
""",
}
# QmvS: U consecutive 16-bit scales (or biases) of one row, as U / 2 words (U = 1: one u16)
_H_SCALES = {
    1: r"""
struct QmvS {
  uint32_t v[1];
  QDI void load(const void* p) {
    unsigned short h;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(h) : "l"(p));
    v[0] = h;
  }
};
""",
    2: r"""
struct QmvS {
  uint32_t v[1];
  QDI void load(const void* p) { asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v[0]) : "l"(p)); }
};
""",
    4: r"""
struct QmvS {
  uint32_t v[2];
  QDI void load(const void* p) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "l"(p));
  }
};
""",
    8: r"""
struct QmvS {
  uint32_t v[4];
  QDI void load(const void* p) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3]) : "l"(p));
  }
};
""",
}
# the MMA (bf16 or f16 inputs, float32 sums) and the 16-bit value in the low (HI false) or
# high half of a word, as a float
_H_TYPE = {
    "bfloat16": r"""
QDI void qmv_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <bool HI>
QDI float qmv_f(uint32_t v) { return __uint_as_float(HI ? (v & 0xFFFF0000u) : (v << 16)); }
""",
    "float16": r"""
QDI void qmv_mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <bool HI>
QDI float qmv_f(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(HI ? (v >> 16) : (v & 0xFFFFu)))); }
""",
}


def header_for(bits: int, group: int, dtype: str, u: int) -> str:
    """The header one instance needs: its weight-load width (group / 4 codes a lane: group * bits
    / 128 words), its scale-load width (u), its dtype's MMA and conversion."""
    return _strip(_H_COMMON + _H_WORDS[group * bits // 128] + _H_SCALES[u] + _H_TYPE[dtype])


# The body. Inputs x [..., K] (T; M rows in all, any leading shape), w [N, K * BITS / 32] uint32, scales / biases [N, K / G] (T);
# output y [M, N] (T). Constants written in front of it per instance (source_for): BITS, G,
# U, BF (bfloat16, else float16); the header's QmvW holds the WL words of one row and group a
# lane reads, QmvS the U scales of one chunk.
SOURCE = r"""
  constexpr int L = G / 4;
  constexpr int WL = L * BITS / 32;
  constexpr int XV = L / 8;
  constexpr int WPG = G * BITS / 32;
  constexpr int NB = G / 16;
  constexpr float OFF = BF ? 128.f : 1024.f;
  constexpr float OFFB = BITS == 8 ? 17.f * OFF : OFF;
  constexpr uint32_t ONE2 = BF ? 0x3F803F80u : 0x3C003C00u;
  static_assert(XV >= 1 && WL >= 1 && (U == 1 || U == 2 || U == 4 || U == 8), "bad instance");
  const int K = x_shape[x_ndim - 1];
  int M = 1;
  for (int i = 0; i < x_ndim - 1; ++i) M *= x_shape[i];
  const int N = w_shape[0];
  const int NW = blockDim.x >> 5;
  const int GT = K / G;
  const int NCH = GT / U;
  const int WPR = K / 32 * BITS;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int row0 = blockIdx.x * 16;
  const uint32_t MAGIC = (BF ? 0x43004300u : 0x64006400u) + ((uint32_t)M >> 30);
  const int ra = min(row0 + g, N - 1);
  const int rb = min(row0 + g + 8, N - 1);
  const uint32_t* wa = w + (size_t)ra * WPR + t * WL + warp * U * WPG;
  const uint32_t* wb = w + (size_t)rb * WPR + t * WL + warp * U * WPG;
  const T* sa = scales + (size_t)ra * GT + warp * U;
  const T* sb = scales + (size_t)rb * GT + warp * U;
  const T* ba = biases + (size_t)ra * GT + warp * U;
  const T* bb = biases + (size_t)rb * GT + warp * U;
  const T* xp = x + (size_t)(g < M ? g : 0) * K + t * L + warp * U * G;
  const int WSTEP = NW * U * WPG;
  const int SSTEP = NW * U;
  const int XSTEP = NW * U * G;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  struct Buf {
    QmvW wa[U];
    QmvW wb[U];
    uint4 xv[U][XV];
    QmvS sa, sb, ba, bb;
  };
  auto load = [&](Buf& B) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      B.wa[u].load(wa + u * WPG);
      B.wb[u].load(wb + u * WPG);
    }
    B.sa.load(sa);
    B.sb.load(sb);
    B.ba.load(ba);
    B.bb.load(bb);
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int v = 0; v < XV; ++v) B.xv[u][v] = __ldg(reinterpret_cast<const uint4*>(xp + u * G + v * 8));
    }
    wa += WSTEP;
    wb += WSTEP;
    sa += SSTEP;
    sb += SSTEP;
    ba += SSTEP;
    bb += SSTEP;
    xp += XSTEP;
  };
  auto compute = [&](const Buf& B) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      // B fragments: b0 = inputs of k slots 2t, 2t+1 and b1 of 2t+8, 2t+9, matching the codes
      // that qmv_nib puts in a0 / a2 (4-bit word: codes {0,4} {1,5} | {2,6} {3,7}; 8-bit
      // word: codes {0,2} {1,3}, once per nibble)
      uint32_t b0[NB], b1[NB];
#pragma unroll
      for (int v = 0; v < XV; ++v) {
        const uint4 X = B.xv[u][v];
        if constexpr (BITS == 4) {
          b0[2 * v] = __byte_perm(X.x, X.z, 0x5410);
          b1[2 * v] = __byte_perm(X.x, X.z, 0x7632);
          b0[2 * v + 1] = __byte_perm(X.y, X.w, 0x5410);
          b1[2 * v + 1] = __byte_perm(X.y, X.w, 0x7632);
        } else {
          b0[2 * v] = __byte_perm(X.x, X.y, 0x5410);
          b1[2 * v] = __byte_perm(X.x, X.y, 0x7632);
          b0[2 * v + 1] = __byte_perm(X.z, X.w, 0x5410);
          b1[2 * v + 1] = __byte_perm(X.z, X.w, 0x7632);
        }
      }
      float xs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < NB; ++j) qmv_mma(xs, ONE2, ONE2, ONE2, ONE2, b0[j], b1[j]);
      float c[4] = {0.f, 0.f, 0.f, 0.f};
      if constexpr (BITS == 4) {
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const uint32_t qa = B.wa[u].v[j >> 1], qb = B.wb[u].v[j >> 1];
          const int sh = (j & 1) * 8;
          qmv_mma(c, qmv_nib(qa, sh, MAGIC), qmv_nib(qb, sh, MAGIC), qmv_nib(qa, sh + 4, MAGIC),
                      qmv_nib(qb, sh + 4, MAGIC), b0[j], b1[j]);
        }
      } else {
        float h[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < NB; ++j) {
          const uint32_t qa = B.wa[u].v[j], qb = B.wb[u].v[j];
          qmv_mma(c, qmv_nib(qa, 0, MAGIC), qmv_nib(qb, 0, MAGIC), qmv_nib(qa, 8, MAGIC),
                      qmv_nib(qb, 8, MAGIC), b0[j], b1[j]);
          qmv_mma(h, qmv_nib(qa, 4, MAGIC), qmv_nib(qb, 4, MAGIC), qmv_nib(qa, 12, MAGIC),
                      qmv_nib(qb, 12, MAGIC), b0[j], b1[j]);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) c[e] = fmaf(16.f, h[e], c[e]);
      }
      float s0, s8, o0, o8;
      if (u & 1) {
        s0 = qmv_f<true>(B.sa.v[u >> 1]);
        s8 = qmv_f<true>(B.sb.v[u >> 1]);
        o0 = qmv_f<true>(B.ba.v[u >> 1]);
        o8 = qmv_f<true>(B.bb.v[u >> 1]);
      } else {
        s0 = qmv_f<false>(B.sa.v[u >> 1]);
        s8 = qmv_f<false>(B.sb.v[u >> 1]);
        o0 = qmv_f<false>(B.ba.v[u >> 1]);
        o8 = qmv_f<false>(B.bb.v[u >> 1]);
      }
      o0 = fmaf(-OFFB, s0, o0);
      o8 = fmaf(-OFFB, s8, o8);
      acc[0] = fmaf(s0, c[0], fmaf(o0, xs[0], acc[0]));
      acc[1] = fmaf(s0, c[1], fmaf(o0, xs[1], acc[1]));
      acc[2] = fmaf(s8, c[2], fmaf(o8, xs[2], acc[2]));
      acc[3] = fmaf(s8, c[3], fmaf(o8, xs[3], acc[3]));
    }
  };
  // each chunk's loads in their own conditional block (else ptxas sinks them to their uses)
  int c = warp;
  Buf cur;
  if (c < NCH) load(cur);
#pragma unroll 1
  for (; c < NCH; c += NW) {
    compute(cur);
    if (c + NW < NCH) load(cur);
  }
  __shared__ float red[16 * 128];
#pragma unroll
  for (int e = 0; e < 4; ++e) red[(warp * 4 + e) * 32 + lane] = acc[e];
  __syncthreads();
  for (int idx = threadIdx.x; idx < 128; idx += NW * 32) {
    float s = 0.f;
    for (int w2 = 0; w2 < NW; ++w2) s += red[w2 * 128 + idx];
    const int ln = idx & 31, e = idx >> 5;
    const int n = row0 + (ln >> 2) + (e >> 1) * 8;
    const int m = 2 * (ln & 3) + (e & 1);
    if (m < M && n < N) y[(size_t)m * N + n] = static_cast<T>(s);
  }
"""


def _strip(text: str) -> str:
    """The source as MLX gets it: no comment lines, no indentation, no blank lines (MLX
    concatenates and hashes the whole source on every call; the code is unchanged)."""
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("//"):
            lines.append(line)
    return "\n".join(lines) + "\n"


def instance_name(bits: int, group: int, dtype: str, u: int) -> str:
    return f"blockwidth_qmv_b{bits}_g{group}_u{u}_{'bf16' if dtype == 'bfloat16' else 'f16'}"


def source_for(bits: int, group: int, dtype: str, u: int) -> str:
    """The body of one instance: its constants, then :data:`SOURCE` (T, the activations' type,
    is MLX's own for the dtype)."""
    t = "__nv_bfloat16" if dtype == "bfloat16" else "__half"
    consts = (f"constexpr int BITS = {bits};\nconstexpr int G = {group};\nconstexpr int U = {u};\n"
              f"constexpr bool BF = {'true' if dtype == 'bfloat16' else 'false'};\nusing T = {t};\n")
    return consts + _strip(SOURCE)


# --- kernel objects, compile times, calls ------------------------------------------------------
_lock = threading.Lock()
_kernels: dict[tuple, object] = {}  # (bits, group, dtype, u) -> mx.fast.cuda_kernel
_compiled: dict[str, float] = {}  # instance name -> seconds its first (compiling) call took
_calls: dict[tuple, Callable] = {}  # (bits, group, dtype, u) -> its mx.compile'd call
_ready: set[tuple] = set()  # instances compiled (keys of _kernels that have run once)
_lazy: set[str] = set()  # instances first compiled inside a forward, not by prepare()


def call_strategy() -> str:
    """How a routed projection reaches the kernel: ``compile`` (the default, :data:`DEFAULT_CALL`:
    through ``mx.compile``, the traced primitive is replayed, nothing rebuilt in Python) or
    ``direct`` (the kernel object's call, its arguments prepared once per shape);
    ``BLOCKWIDTH_QMV_CALL`` chooses, so the GPU host can measure either."""
    v = os.environ.get(CALL_ENV, DEFAULT_CALL).strip().lower() or DEFAULT_CALL
    if v not in CALLS:
        raise ValueError(f"{CALL_ENV}={v!r}: expected one of {', '.join(CALLS)}")
    return v


def kernel(bits: int, group: int, dtype: str, u: int):
    """The ``mx.fast.cuda_kernel`` of one instance, built once per process (CUDA only)."""
    key = (bits, group, dtype, u)
    k = _kernels.get(key)
    if k is None:
        import mlx.core as mx

        with _lock:
            k = _kernels.get(key)
            if k is None:
                k = mx.fast.cuda_kernel(name=instance_name(*key), input_names=["x", "w", "scales", "biases"],
                                        output_names=["y"], source=source_for(*key),
                                        header=header_for(*key))
                _kernels[key] = k
    return k


def _dtype(name: str):
    import mlx.core as mx

    return getattr(mx, name)


_fns: dict[tuple, Callable] = {}  # (x shape, n, x dtype, bits, group, strategy) -> fn(x, w, s, b)


def _direct(inst: tuple) -> Callable:
    """fn(x, w, s, b) -> y through the kernel object's call; the launch worked out per shape."""
    kern = kernel(*inst)
    bits, group, dtype, _ = inst
    dt = _dtype(dtype)

    def run(x, w, scales, biases):
        n = w.shape[0]
        lc = launch(n, x.shape[-1], x.size // x.shape[-1], bits, group)
        return kern(inputs=[x, w, scales, biases], grid=lc.grid, threadgroup=lc.threadgroup,
                    output_shapes=[(*x.shape[:-1], n)], output_dtypes=[dt])[0]

    return run


def _prepared(x_shape: tuple, n: int, dt, bits: int, group: int, strategy: str) -> Callable:
    """The call for one signature, made once: ``direct`` binds the launch's arguments (a call
    is then one dict lookup and the kernel object's call); ``compile`` is the instance's
    ``mx.compile``d function (MLX traces it once per shape, then replays the primitive)."""
    import mlx.core as mx

    k = x_shape[-1]
    rows = 1
    for d in x_shape[:-1]:
        rows *= d
    dtype = str(dt).rsplit(".", 1)[-1]
    lc = launch(n, k, rows, bits, group)
    inst = (bits, group, dtype, lc.u)
    if inst not in _ready:  # not prepared: compiled here, and the record says it was
        compile_instance(*inst)
        _lazy.add(instance_name(*inst))
    if strategy == "compile":
        fn = _calls.get(inst)
        if fn is None:
            fn = _calls[inst] = mx.compile(_direct(inst))
        return fn
    kern = kernel(*inst)
    kw = dict(grid=lc.grid, threadgroup=lc.threadgroup, output_shapes=[(*x_shape[:-1], n)],
              output_dtypes=[dt])
    return lambda x, w, s, b: kern(inputs=[x, w, s, b], **kw)[0]


def bound(x_shape: tuple, n: int, dt, bits: int, group: int, strategy: str = "direct") -> Callable:
    """fn(x, w, scales, biases) -> y for one call signature (``x_shape``, N, dtype, bits,
    group), made once: what a dispatcher keeps per signature so a call adds nothing else."""
    key = (x_shape, n, dt, bits, group, strategy)
    fn = _fns.get(key)
    if fn is None:
        fn = _fns[key] = _prepared(tuple(x_shape), n, dt, bits, group, strategy)
    return fn


def matmul(x, w, scales, biases, bits: int, group: int, strategy: str = "direct"):
    """``x @ dequantize(w, scales, biases).T`` through the kernel, for ``x`` of 1..8 rows in
    any leading shape (the caller checked :func:`refusal`); CUDA only."""
    return bound(x.shape, w.shape[0], x.dtype, bits, group, strategy)(x, w, scales, biases)


def compile_instance(bits: int, group: int, dtype: str, u: int) -> float:
    """Compile one instance now (NVRTC, through a tiny call evaluated at once) and return the
    seconds it took; later calls find it compiled. Timed here, not inside a measured forward."""
    import mlx.core as mx

    name = instance_name(bits, group, dtype, u)
    if name in _compiled:
        return _compiled[name]
    k = group * u
    dt = _dtype(dtype)
    x = mx.zeros((1, 1, k), dt)
    w = mx.zeros((TILE, k * bits // 32), mx.uint32)
    s = mx.zeros((TILE, u), dt)
    mx.eval(x, w, s)
    t0 = time.perf_counter()
    lc = launch(TILE, k, 1, bits, group)
    y = kernel(bits, group, dtype, u)(inputs=[x, w, s, s], grid=lc.grid, threadgroup=lc.threadgroup,
                                      output_shapes=[(1, 1, TILE)], output_dtypes=[dt])[0]
    mx.eval(y)
    _compiled[name] = time.perf_counter() - t0
    _ready.add((bits, group, dtype, u))
    return _compiled[name]


def compile_seconds() -> dict[str, float]:
    """Every instance compiled in this process, with the seconds its compile took."""
    return dict(_compiled)


def compiled_in_forward() -> list[str]:
    """Instances compiled by a routed call rather than by :func:`prepare` (their compile
    landed in whatever forward made that call)."""
    return sorted(_lazy)


def instances_for(model) -> dict[tuple, set]:
    """The kernel instances a verify of ``model`` needs: (bits, group, dtype, u) -> the (N, K)
    of the nn.QuantizedLinear projections that take it (rows 2; every row count shares the
    instance)."""
    import mlx.nn as nn

    from blockwidth.engine.attention import current_backend

    backend = current_backend()
    out: dict[tuple, set] = {}
    for _, m in model.named_modules():
        # a tied quantized head (QuantizedEmbedding.as_linear) too: the exact path routes it
        if type(m) not in (nn.QuantizedLinear, nn.QuantizedEmbedding):
            continue
        w, s = m["weight"], m["scales"]
        dtype = str(s.dtype).rsplit(".", 1)[-1]
        k = w.shape[-1] * 32 // m.bits if w.ndim == 2 else 0
        if refusal(backend, m.mode, m.bits, m.group_size, 2, dtype, dtype, m.get("biases") is not None,
                   k, tuple(w.shape)):
            continue
        lc = launch(w.shape[0], k, 2, m.bits, m.group_size)
        out.setdefault((m.bits, m.group_size, dtype, lc.u), set()).add((w.shape[0], k))
    return out


def prepare(model, rows: tuple[int, ...] = tuple(range(2, MAX_ROWS + 1)),
            strategy: str | None = None, allowed: dict | None = None) -> dict[str, float]:
    """Compile every instance ``model``'s verify needs (and, under ``compile``, trace each
    projection shape at each row count) before anything is timed; returns {instance: compile
    seconds}. ``allowed`` ({(bits, group): rows}, what ``auto`` routes here; None: everything)
    leaves out what will stay stock. Cheap when already done (the kernels are built once per
    process)."""
    import mlx.core as mx

    strategy = strategy or call_strategy()
    done = {}
    for inst, shapes in instances_for(model).items():
        bits, group, dtype, _ = inst
        if allowed is not None and (bits, group) not in allowed:
            continue
        done[instance_name(*inst)] = compile_instance(*inst)
        if strategy != "compile":
            continue
        dt = _dtype(dtype)
        for n, k in sorted(shapes):
            w = mx.zeros((n, k * bits // 32), mx.uint32)
            s = mx.zeros((n, k // group), dt)
            for r in (r for r in rows if allowed is None or r in allowed[(bits, group)]):  # x is [1, rows, K]
                if ((1, r, k), n, dt, bits, group, strategy) not in _fns:
                    mx.eval(matmul(mx.zeros((1, r, k), dt), w, s, s, bits, group, strategy))
    return done


def available() -> bool:
    """Whether this process can run the kernel (an MLX with a CUDA device)."""
    from blockwidth.engine.attention import current_backend

    return current_backend() == "cuda"

