"""Built-in measured defaults and the per-kind fallback constants.

Every row names the record it was measured in and the MLX version (or pin) it
was measured under. No row goes in without a committed or public record.
"""

from __future__ import annotations

from dataclasses import dataclass

from policy.device import Backend, Device
from policy.drafter import DrafterKind
from policy.quantization import Quantization, Scheme


@dataclass(frozen=True)
class MeasuredDefault:
    drafter_kind: DrafterKind
    backend: Backend
    compute_capability: str | None  # None: any device of the backend
    scheme: Scheme
    bits: int | None  # None: any bit width of the scheme
    width: int
    mlx: str
    record: str
    evidence: str
    # Whether the winning width's greedy output matched classic's byte for byte in that
    # record (None: the record did not say). On CUDA a K-row verify is not bitwise equal to
    # K single steps, so a row can win on speed and still differ at a near-tie.
    byte_identical: bool | None = None

    def matches(self, kind: DrafterKind, device: Device, quant: Quantization) -> bool:
        return (
            kind is self.drafter_kind
            and device.backend is self.backend
            and (self.compute_capability is None or device.compute_capability == self.compute_capability)
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
