"""Load a target and a drafter from local folders with mlx-lm.

Never a hub download (paths are checked before mlx-lm sees them, and the hub is
switched offline), never checkpoint code: a folder that asks for it is refused
before mlx-lm or transformers see it (``read_config``), and both are told
``trust_remote_code=False`` so that nothing can prompt on stdin either.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from engine.checkpoint import CheckpointError, fingerprint, pair_key, read_header, weight_files  # noqa: E402
from policy.config import size  # noqa: E402
from policy.drafter import DrafterKind, detect_drafter  # noqa: E402
from policy.errors import BlockwidthError  # noqa: E402
from policy.quantization import ConfigError, Quantization, classify, read_config, read_sidecar  # noqa: E402

RUNNABLE = (DrafterKind.MODEL, DrafterKind.LOOKUP, DrafterKind.DFLASH, DrafterKind.MTP)
_READ_BY_LOADERS = {".json", ".model", ".jinja", ".txt", ".tiktoken", ".jsonl", ".safetensors"}


# Sizes every architecture reads from config.json. transformers validates them only inside
# the tokenizer load (it reads the config to pick the tokenizer class), so a bad one was
# reported as "tokenizer cannot be loaded"; checked here, the message names the file and key.
_SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings")


class PairError(BlockwidthError):
    """A pair that cannot be loaded: what is wrong, and which input (``target`` or ``draft``),
    which each front end words its way (the command line's --target, the console's field)."""


@dataclass
class Pair:
    target: Any  # mlx_lm model
    tokenizer: Any  # mlx_lm TokenizerWrapper
    target_path: Path
    target_config: dict
    quantization: Quantization
    kind: DrafterKind
    drafter: Any | None = None  # mlx_lm model (model), DFlashModel (dflash), MTPModel (mtp)
    drafter_path: Path | None = None
    fingerprints: dict[str, str] = field(default_factory=dict)
    caches: Any = None  # engine.kvcache.CachePlan of the target: its cache kinds and their rewinds
    drafter_caches: Any = None  # the same for a model drafter
    # builds the drafter (given the widest verify) instead of engine.drafters.make_drafter: a
    # drafter on rank 0 of a group (engine.distributed)
    drafter_factory: Callable[[int], Any] | None = None

    @property
    def pair_id(self) -> str:
        return pair_key(self.fingerprints["target"], self.fingerprints.get("drafter"))

    @property
    def context_length(self) -> int | None:
        v = size(self.target_config, "max_position_embeddings")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def window(self) -> int | None:
        """The target's smallest sliding window (None: no sliding-window layer)."""
        return self.caches.window if self.caches is not None else None

    def describe(self) -> str:
        if self.kind is DrafterKind.MTP and self.drafter_path is None:
            d = "the target's own MTP layers"
        else:
            d = self.drafter_path.name if self.drafter_path else "prompt lookup"
        return f"{self.target_path.name} [{self.quantization.describe()}] + {d} ({self.kind.value})"


def _check_folder(path: Path, what: str) -> dict:
    path = Path(path)
    try:
        config = read_config(path)
    except ConfigError as e:
        raise PairError(e.message, what) from None
    for key in _SIZE_KEYS:
        v = size(config, key)
        # None is a stated "not set" (some configs write head_dim: null); bool is not a size
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise PairError(f"{path / 'config.json'}: {key} = {v!r}: expected a positive integer", what)
    # mlx-lm and transformers open these without asking what they are: a FIFO would block
    # the load forever, /dev/zero would never end.
    for f in sorted(path.iterdir()):
        if f.suffix in _READ_BY_LOADERS and not f.is_file():
            raise PairError(f"{f}: is not a regular file", what)
    try:
        files = weight_files(path)
    except CheckpointError as e:
        raise PairError(e.message, what) from None
    if not files:
        raise PairError(f"{path}: no *.safetensors weights", what)
    for f in files:
        try:
            read_header(f)
        except CheckpointError as e:
            raise PairError(e.message, what) from None
    return config


def _one_line(e: Exception, limit: int = 300) -> str:
    """An exception from mlx-lm or transformers as one bounded line (theirs span several)."""
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _load_model(path: Path, what: str):
    from mlx_lm.utils import load_model

    try:
        model, _ = load_model(path, lazy=False, trust_remote_code=False)
    except KeyError as e:  # a key mlx-lm reads from config.json is missing
        raise PairError(f"{path}: mlx-lm cannot load it: a key it reads is missing "
                        f"({e.args[0]!r}, in config.json or the weights)", what) from None
    except Exception as e:  # mlx-lm raises many kinds for a bad checkpoint
        raise PairError(f"{path}: mlx-lm cannot load it ({_one_line(e)})", what) from None
    return model


def _cache_plan(model, path: Path, what: str):
    from engine.kvcache import CacheKindError, plan

    try:
        return plan(model, f"{what} {path}")
    except CacheKindError as e:
        raise PairError(str(e)) from None


def _load_tokenizer(path: Path, what: str, config: dict):
    from mlx_lm.utils import load_tokenizer

    try:
        # An explicit False makes transformers refuse custom code instead of asking on stdin.
        return load_tokenizer(path, tokenizer_config_extra={"trust_remote_code": False},
                              eos_token_ids=size(config, "eos_token_id"))
    except Exception as e:
        raise PairError(f"{path}: tokenizer cannot be loaded ({_one_line(e)})", what) from None


def _vocab(tokenizer) -> dict:
    try:
        return tokenizer.get_vocab()
    except Exception:
        return {}


def load_pair(target: Path | str, drafter: Path | str | None = None,
              kind: DrafterKind | str | None = None, *,
              target_loader: Callable[[Path], Any] | None = None, drafter_model: bool = True) -> Pair:
    """Load a pair. ``drafter=None`` means the lookup drafter. A PairError names the input it
    is about (``target`` or ``draft``). ``target_loader``: loads the target's model instead of
    mlx-lm's ``load_model`` (a shard of it: engine.distributed); with ``drafter_model=False`` a
    model drafter is checked but its weights are not loaded (a rank that does not draft)."""
    target = Path(target)
    tname, dname = "target", "draft"
    tconfig = _check_folder(target, tname)
    if kind is not None:
        kind = DrafterKind(kind)
    if drafter is None:
        kind = kind or DrafterKind.LOOKUP
    else:
        drafter = Path(drafter)
        dconfig = _check_folder(drafter, dname)
        kind = kind or detect_drafter(dconfig).kind
    if kind not in RUNNABLE:
        raise PairError(f"drafter kind {kind.value}: the embedded engine runs only "
                        f"{', '.join(k.value for k in RUNNABLE)}; `blockwidth resolve` still "
                        f"resolves a width for {kind.value}")
    if kind in (DrafterKind.MODEL, DrafterKind.DFLASH) and drafter is None:
        raise PairError(f"missing: drafter kind {kind.value} needs a drafter checkpoint folder", "draft")
    if kind is DrafterKind.LOOKUP and drafter is not None:
        raise PairError(f"{drafter} given with drafter kind lookup: prompt lookup uses no checkpoint", "draft")

    model = target_loader(target) if target_loader is not None else _load_model(target, tname)
    tokenizer = _load_tokenizer(target, tname, tconfig)
    pair = Pair(model, tokenizer, target, tconfig, classify(tconfig, read_sidecar(target)), kind,
                fingerprints={"target": fingerprint(target)}, caches=_cache_plan(model, target, tname))
    if kind is DrafterKind.MODEL:
        tv = size(tconfig, "vocab_size")
        dv = size(dconfig, "vocab_size")
        if tv != dv:
            raise PairError(f"{drafter}: vocabulary of {dv} tokens differs from target "
                            f"{target}'s {tv}; a model drafter must share the target's tokenizer", dname)
        if any(p.name.startswith("tokenizer") for p in drafter.iterdir()):
            dtok = _load_tokenizer(drafter, dname, dconfig)
            a, b = _vocab(tokenizer), _vocab(dtok)
            if a and b and a != b:
                raise PairError(f"{drafter}: tokenizer of {len(b)} tokens differs from target "
                                f"{target}'s {len(a)}; a model drafter must share the target's tokenizer", dname)
        if drafter_model:  # a rank that does not draft checks the drafter but holds none
            pair.drafter = _load_model(drafter, dname)
            pair.drafter_caches = _cache_plan(pair.drafter, drafter, dname)
        pair.drafter_path = drafter
        pair.fingerprints["drafter"] = fingerprint(drafter)
    elif kind in (DrafterKind.DFLASH, DrafterKind.MTP):
        from engine import dflash, mtp
        from engine.hidden import TargetShapeError

        try:
            if kind is DrafterKind.DFLASH:
                pair.drafter = dflash.load(drafter, model, tconfig)
            else:
                pair.drafter = mtp.load(drafter, model, target, tconfig)
        except (dflash.DrafterFormatError, TargetShapeError) as e:
            raise PairError(str(e)) from None
        if drafter is not None:
            pair.drafter_path = drafter
            pair.fingerprints["drafter"] = fingerprint(drafter)
    return pair
