"""Drafter kinds, and what a drafter checkpoint says about itself."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from blockwidth.policy.errors import BlockwidthError


class DrafterKind(str, Enum):
    MODEL = "model"  # a small independent draft model, same tokenizer
    LOOKUP = "lookup"  # n-gram prompt lookup, no checkpoint
    DFLASH = "dflash"
    MTP = "mtp"
    EAGLE = "eagle"


class PairingError(BlockwidthError):
    """A drafter kind that cannot run with (or without) the drafter checkpoint given."""


def pairing_problem(kind: DrafterKind | str | None, drafter: object | None) -> PairingError | None:
    """Why this kind cannot run with (or without) this drafter checkpoint, or None. One rule for
    every front end: ``sweep`` refused these at once while the console opened and said "pair
    not loaded". The error names the drafter input (``draft``); each front end words it."""
    if kind is None:
        return None
    kind = DrafterKind(kind)
    if kind in (DrafterKind.MODEL, DrafterKind.DFLASH) and drafter is None:
        return PairingError(f"missing: drafter kind {kind.value} needs a drafter checkpoint folder", "draft")
    if kind is DrafterKind.LOOKUP and drafter is not None:
        return PairingError(f"{drafter} given with drafter kind lookup: prompt lookup uses no checkpoint",
                            "draft")
    return None


# Kinds whose checkpoints are not causal LMs: mlx-lm cannot load one as a draft model (it raised
# "Received 25 parameters not in model" from deep in the load).
_NOT_A_MODEL = ("dflash", "mtp", "eagle")


def kind_problem(kind: "DrafterKind | str | None", detected: "DrafterInfo", drafter: object) -> PairingError | None:
    """Why the kind given cannot load this drafter checkpoint, or None: ``model`` on a checkpoint
    detected as a DFlash, MTP or EAGLE drafter (one line, about the ``kind`` input; each front end
    words it). Other disagreements (a kind given over an ordinary LM's detection) are the
    operator's call and stay allowed."""
    if kind is None:
        return None
    kind = DrafterKind(kind)
    if kind is DrafterKind.MODEL and detected.kind.value in _NOT_A_MODEL:
        return PairingError(f"model: {drafter} is a {detected.kind.value} drafter ({detected.detail}), not a "
                            f"draft model mlx-lm can load; kind {detected.kind.value} loads it (or leave the "
                            f"kind out: it is detected)", "kind")
    return None


@dataclass(frozen=True)
class DrafterInfo:
    kind: DrafterKind
    declared_width: int | None  # rows per round the checkpoint says it was made for
    detail: str  # how the kind and width were read
    target_layers: tuple[int, ...] | None = None  # target hidden states it reads (DFlash: layer ids)
    reads_final_hidden: bool = False  # MTP: the target's final-normed hidden state

    def needs(self) -> str:
        """What the drafter reads from the target, in words."""
        if self.target_layers:
            return "hidden states of target layers " + ", ".join(map(str, self.target_layers))
        if self.reads_final_hidden:
            return "the target's final hidden state"
        return "nothing (token ids only)"


def _dflash(config: Mapping[str, Any], key: str) -> Any:
    # DFlash settings live in dflash_config in newer checkpoints, at the top level in older ones
    sub = config.get("dflash_config")
    if isinstance(sub, Mapping) and key in sub:
        return sub[key]
    return config.get(key)


def _archs(config: Mapping[str, Any]) -> list[str]:
    a = config.get("architectures")
    return [str(x) for x in a] if isinstance(a, list) else []


def _declared(config: Mapping[str, Any], kind: DrafterKind) -> tuple[int | None, str]:
    # DFlash drafters declare the block they were trained for: that is a width.
    v = _dflash(config, "block_size")
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
    layers = None
    if kind is DrafterKind.DFLASH:
        ids = _dflash(config, "target_layer_ids")
        if isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            layers = tuple(ids)
    return DrafterInfo(kind, width, why + (f"; declares {wwhy}" if wwhy else ""), layers,
                       kind is DrafterKind.MTP)


def read_drafter(path: Path) -> DrafterInfo:
    from blockwidth.policy.config import read_config

    return detect_drafter(read_config(Path(path)))
