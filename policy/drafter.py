"""Drafter kinds, and what a drafter checkpoint says about itself."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping


class DrafterKind(str, Enum):
    MODEL = "model"  # a small independent draft model, same tokenizer
    LOOKUP = "lookup"  # n-gram prompt lookup, no checkpoint
    DFLASH = "dflash"
    MTP = "mtp"
    EAGLE = "eagle"


@dataclass(frozen=True)
class DrafterInfo:
    kind: DrafterKind
    declared_width: int | None  # rows per round the checkpoint says it was made for
    detail: str  # how the kind and width were read


def _archs(config: Mapping[str, Any]) -> list[str]:
    a = config.get("architectures")
    return [str(x) for x in a] if isinstance(a, list) else []


def _declared(config: Mapping[str, Any], kind: DrafterKind) -> tuple[int | None, str]:
    # DFlash drafters declare the block they were trained for: that is a width.
    v = config.get("block_size")
    if isinstance(v, int) and not isinstance(v, bool) and kind is DrafterKind.DFLASH:
        return v, f"block_size {v}"
    # Others declare drafted tokens per round: width = that + 1.
    for key in ("num_speculative_tokens", "num_draft_tokens", "speculative_num_steps"):
        v = config.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v + 1, f"{key} {v} (width {v + 1})"
    spec = config.get("speculative_config")
    if isinstance(spec, Mapping):
        v = spec.get("num_speculative_tokens")
        if isinstance(v, int) and not isinstance(v, bool):
            return v + 1, f"speculative_config.num_speculative_tokens {v} (width {v + 1})"
    return None, ""


def detect_drafter(config: Any) -> DrafterInfo:
    """Kind and declared width from a drafter's parsed config.json."""
    if not isinstance(config, Mapping):
        return DrafterInfo(DrafterKind.MODEL, None, "config is not an object; assumed a draft model")
    archs = _archs(config)
    joined = " ".join(archs).lower()
    model_type = str(config.get("model_type", "")).lower()
    if "dflash" in joined or "dflash" in model_type:
        kind, why = DrafterKind.DFLASH, f"architectures {archs or model_type} name DFlash"
    elif "eagle" in joined or "eagle" in model_type:
        kind, why = DrafterKind.EAGLE, f"architectures {archs or model_type} name EAGLE"
    elif ("mtp" in joined or "nextn" in joined or "mtp" in model_type
          or config.get("num_nextn_predict_layers") and not config.get("num_hidden_layers")):
        kind, why = DrafterKind.MTP, f"architectures {archs or model_type} name MTP / next-n"
    else:
        kind, why = DrafterKind.MODEL, f"an ordinary causal LM ({', '.join(archs) or model_type or '?'})"
    width, wwhy = _declared(config, kind)
    return DrafterInfo(kind, width, why + (f"; declares {wwhy}" if wwhy else ""))


def read_drafter(path: Path) -> DrafterInfo:
    from policy.quantization import read_config

    return detect_drafter(read_config(Path(path)))
