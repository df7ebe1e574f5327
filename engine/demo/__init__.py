"""The embedded demo pair: where its folders are. Importing this loads no MLX."""

from __future__ import annotations

from pathlib import Path

PAIR_DIR = Path(__file__).resolve().parent / "pair"
TARGETS = {"bf16": PAIR_DIR / "target-bf16", "4bit": PAIR_DIR / "target-4bit"}
DRAFTER = PAIR_DIR / "drafter"
DFLASH = PAIR_DIR / "dflash"  # a DFlashDraftModel, block 16, reading target layers 1, 3, 5
MTP = PAIR_DIR / "mtp"  # one DeepSeek-V3-layout NextN head
DRAFTERS = {"model": DRAFTER, "dflash": DFLASH, "mtp": MTP}


def target(variant: str = "bf16") -> Path:
    """The demo target: ``bf16`` (unquantized bfloat16) or ``4bit`` (affine 4-bit g64)."""
    try:
        return TARGETS[variant]
    except KeyError:
        raise ValueError(f"demo target {variant!r}: expected one of {', '.join(TARGETS)}") from None
