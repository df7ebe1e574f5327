"""Built-in measured defaults and the per-kind fallback constants.

Every row names the record it was measured in and the MLX version (or pin) it
was measured under. No row goes in without a committed or public record.
"""

from __future__ import annotations

from dataclasses import dataclass

from blockwidth.policy.device import Backend, Device, mismatch
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.quantization import Quantization, Scheme


@dataclass(frozen=True)
class MeasuredDefault:
    drafter_kind: DrafterKind
    backend: Backend
    compute_capability: str | None  # None: any device of the backend
    scheme: Scheme
    bits: int | None  # None: any bit width of the scheme
    width: int | None  # None: every width the record measured was slower (decode classically)
    mlx: str
    record: str
    evidence: str
    # Whether the winning width's greedy output matched classic's byte for byte in that
    # record (None: the record did not say). On CUDA a K-row verify is not bitwise equal to
    # K single steps, so a row can win on speed and still differ at a near-tie.
    byte_identical: bool | None = None
    # The widths the record measured slower than classic. A width a drafter declares (or the
    # per-kind constant) that is among them is never the first answer: a committed measurement
    # on this device class outranks a declaration, which is a training choice, not a timing.
    slower: tuple[int, ...] = ()
    # Whether ``width`` beat classic in the record; False: it is the fastest width the record
    # did not measure slower, not a win (said in the reason).
    won: bool = True

    def matches(self, kind: DrafterKind, device: Device, quant: Quantization) -> bool:
        return (
            kind is self.drafter_kind
            and mismatch(device, self.backend, self.compute_capability) is None
            and quant.scheme is self.scheme
            and (self.bits is None or quant.bits == self.bits)
        )


TABLE: tuple[MeasuredDefault, ...] = (
    MeasuredDefault(
        drafter_kind=DrafterKind.DFLASH,
        backend=Backend.CUDA,
        compute_capability="12.1",
        scheme=Scheme.AFFINE,
        bits=None,
        width=4,
        mlx="pin 81ba1c6a",
        record="draft-block-width-default-gb10-2026-09-20 (mlxcel project)",
        evidence="width 4 served 67.22-67.91 tok/s vs classic 57.98-58.71; width 16 41.88-41.97",
        byte_identical=None,  # the mlxcel record compared throughput only
        slower=(16,),
    ),
    # The ninth H200 build (docs/gpu-builds.md, "Ninth build"): a 5.17B Llama-shaped bf16 target and a
    # one-layer model drafter distilled from it, widths swept against classic with n = 5.
    # bf16: every width from 3 up won on prompt 0 (best 12); on prompt 6, where fewer drafted
    # tokens are kept, 8 won and 12 / 16 fell back, so 8 is the width that won on both.
    MeasuredDefault(
        drafter_kind=DrafterKind.MODEL,
        backend=Backend.CUDA,
        compute_capability="9.0",
        scheme=Scheme.NONE,
        bits=None,
        width=8,
        mlx="0.32.4",
        record="lab/evidence/h200-2026-11-30g/sweeps/records-rows-bf16-p6/"
        "session-20261130T123339Z-0ce44d32-11806.json",
        evidence="prompt 6: width 8 574-593 tok/s vs classic 358-381 (12: 489-496, 16: 440-444); "
        "prompt 0 (records-rows-bf16): width 8 887-1003, 12 1085-1128 vs classic 215-381",
        byte_identical=True,
    ),
    # 4-bit: under stock MLX a 2-7-row verify runs the per-row qmv kernel, whose cost grows with
    # every row, and widths 2-7 lost to classic (2026-11-30g: 0.79-0.83x; 8-16 won under qmm).
    # With engine/qmv.py's multi-row kernel, which --verify-linear auto routes 2-8-row 4-bit
    # group-64 projections to on cc 9.0 (engine.linear.QMV_WINS), every width 2-8 won on the
    # 2026-12-02 build's pair, and 8 was the fastest (16, back on qmm, ran below it).
    MeasuredDefault(
        drafter_kind=DrafterKind.MODEL,
        backend=Backend.CUDA,
        compute_capability="9.0",
        scheme=Scheme.AFFINE,
        bits=4,
        width=8,
        mlx="0.32.4",
        record="lab/evidence/h200-2026-12-02/records-qmv-4bit-p0/"
        "session-20261202T022616Z-4f4ed87b-1032.json",
        evidence="prompt 0, verify linear qmv: width 8 1301-1357 tok/s vs classic 319-320 (2: 488-508, "
        "4: 774-816, 16: 1119-1125); stock's 2-7 lost on 2026-11-30g's pair (241-266 vs 304-319)",
        byte_identical=True,
    ),
    # The CPU sweeps of docs/dflash-mtp.md ("The seeds' scenario, on the demo pair"): the demo
    # DFlash drafter, which declares block_size 16, on the 2-core CPU, widths 2-8, 10-16, n = 1.
    # A CPU's verify grows with every row while a block drafter's acceptance per drafted token
    # falls with the block, so 16 was the slowest width or nearly (2x slower on bf16, 5x on
    # 4-bit). These rows are there so that the declared 16 is not the CPU's first answer: on
    # bf16 no width won (n = 1 cannot tell drift from noise), and 4 is the fastest width not
    # measured slower; on 4-bit every width was slower, so the first answer is classic.
    MeasuredDefault(
        drafter_kind=DrafterKind.DFLASH,
        backend=Backend.CPU,
        compute_capability=None,
        scheme=Scheme.NONE,
        bits=None,
        width=4,
        mlx="0.32.4",
        record="lab/records/sweep-dflash-bf16-cpu.json",
        evidence="width 4 135.8 tok/s against classic 104.3-137.9 (undecided at n = 1); 10-16 slower, "
        "width 16 69.2",
        byte_identical=True,
        slower=(10, 12, 14, 16),
        won=False,
    ),
    MeasuredDefault(
        drafter_kind=DrafterKind.DFLASH,
        backend=Backend.CPU,
        compute_capability=None,
        scheme=Scheme.AFFINE,
        bits=4,
        width=None,
        mlx="0.32.4",
        record="lab/records/sweep-dflash-4bit-cpu.json",
        evidence="classic 27.1 tok/s; every width slower: best width 2 19.5, width 16 4.2",
        byte_identical=True,
        slower=(2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16),
        won=False,
    ),
    # The demo's 4-bit target with its model drafter on the 2-core CPU (examples/records, the
    # decline the example profile ships): n = 7, 32 tokens, every width slower (w4 0.65x). Without
    # this row the pair's first answer was the unmeasured per-kind 4, which that record measured
    # slower: the resolver's first word contradicted the project's own evidence (a first operator met it).
    MeasuredDefault(
        drafter_kind=DrafterKind.MODEL,
        backend=Backend.CPU,
        compute_capability=None,
        scheme=Scheme.AFFINE,
        bits=4,
        width=None,
        mlx="0.32.4",
        record="examples/records/cpu-demo-4bit-decline.json",
        evidence="demo 4-bit target + model drafter, n = 7, 32 tokens: classic 8.6-13.5 tok/s "
        "(median 10.8); width 4 5.3-7.8 (7.0), width 8 4.9-8.0 (6.2): every width slower",
        byte_identical=True,
        slower=(4, 8),
        won=False,
    ),
)

# Unmeasured constants: what each kind uses when nothing above applies.
# dflash 16 is the block the public DFlash drafters train for; model 4 is
# mlx-lm's CLI and server default of 3 drafted tokens; lookup, mtp and eagle
# take the same modest 4. None of these is a measurement.
KIND_FALLBACK: dict[DrafterKind, int] = {
    DrafterKind.DFLASH: 16,
    DrafterKind.MTP: 4,
    DrafterKind.MODEL: 4,
    DrafterKind.LOOKUP: 4,
    DrafterKind.EAGLE: 4,
}


def lookup(kind: DrafterKind, device: Device, quant: Quantization) -> MeasuredDefault | None:
    for row in TABLE:
        if row.matches(kind, device, quant):
            return row
    return None
