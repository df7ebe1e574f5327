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

from blockwidth.engine import shapes  # noqa: E402
from blockwidth.engine.checkpoint import CheckpointError, fingerprint, pair_key  # noqa: E402
from blockwidth.policy.config import size  # noqa: E402
from blockwidth.policy.drafter import DrafterKind, detect_drafter, pairing_problem  # noqa: E402
from blockwidth.policy.errors import BlockwidthError  # noqa: E402
from blockwidth.policy.quantization import ConfigError, Quantization, classify, read_config, read_sidecar  # noqa: E402

RUNNABLE = (DrafterKind.MODEL, DrafterKind.LOOKUP, DrafterKind.DFLASH, DrafterKind.MTP)
_READ_BY_LOADERS = {".json", ".model", ".jinja", ".txt", ".tiktoken", ".jsonl", ".safetensors"}
_MAX_LOADER_BYTES = 512 << 20  # the largest published tokenizer.json is tens of MiB


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
    token_rows: int | None = None  # rows of the pair's smallest embedding table (engine.shapes)

    def encode(self, text: str, what: str = "prompt") -> list[int]:
        """The prompt's ids, each checked to be a row of every embedding table it will meet
        (shapes.ShapeError, about the input ``what``)."""
        ids = list(self.tokenizer.encode(text))
        shapes.check_ids(ids, self.token_rows, f"target {self.target_path}", what)
        return ids
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


def _check_folder(path: Path, what: str) -> tuple[dict, shapes.Weights]:
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
        # ...and read them whole: bounded here as our own reader bounds what it reads
        if f.suffix in _READ_BY_LOADERS and f.suffix != ".safetensors" and f.stat().st_size > _MAX_LOADER_BYTES:
            raise PairError(f"{f}: {f.stat().st_size / 2**20:,.0f} MiB is over the "
                            f"{_MAX_LOADER_BYTES >> 20} MiB a tokenizer or config file may have", what)
    try:
        weights = shapes.read_weights(path)  # every header, checked
    except CheckpointError as e:
        raise PairError(e.message, what) from None
    if not weights.shapes:
        raise PairError(f"{path}: no *.safetensors weights", what)
    return config, weights


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
    from blockwidth.engine.kvcache import CacheKindError, plan

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


def _same_tokenizer_files(a: Path, b: Path) -> bool:
    """Both folders hold the same tokenizer files, byte for byte (then nothing needs loading)."""
    import hashlib

    def file_digest(f: Path) -> str:
        h = hashlib.sha256()
        with open(f, "rb") as fh:  # in blocks: a tokenizer file can be large
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def digest(p: Path) -> dict[str, str]:
        return {f.name: file_digest(f) for f in sorted(p.iterdir())
                if f.name.startswith("tokenizer") and f.is_file()}

    try:
        da, db = digest(a), digest(b)
    except OSError:
        return False
    return bool(da) and da == db


def vocabulary_mismatch(target: Path, drafter: Path, *, tconfig: dict | None = None,
                        dconfig: dict | None = None, target_tokenizer: Any = None,
                        sizes_only: bool = False) -> str | None:
    """Why a model drafter cannot draft for this target (it must share the target's tokenizer),
    or None (``sizes_only``: the configs' vocab sizes alone); the reason is about the ``draft``
    input (``PairError(why, "draft")``). The one rule
    for the pair load and for ``resolve``, which loads no model: the configs' vocab sizes first,
    then the tokenizers themselves, loaded only when their files differ. A config or tokenizer
    that cannot be read raises PairError naming its input."""
    tname, dname = "target", "draft"
    target, drafter = Path(target), Path(drafter)
    # configs only: resolve may meet a hub checkpoint fetched without its weights
    def config_of(path: Path, role: str) -> dict:
        try:
            return read_config(path)
        except ConfigError as e:
            raise PairError(e.message, role) from None

    tconfig = tconfig if tconfig is not None else config_of(target, tname)
    dconfig = dconfig if dconfig is not None else config_of(drafter, dname)
    tv, dv = size(tconfig, "vocab_size"), size(dconfig, "vocab_size")  # text_config's, where nested
    if tv != dv:
        return (f"{drafter}: vocabulary of {dv} tokens differs from target "
                f"{target}'s {tv}; a model drafter must share the target's tokenizer")
    if sizes_only:  # the pair load, before it loads anything
        return None
    if not any(p.name.startswith("tokenizer") for p in drafter.iterdir()):
        return None
    # What the tokenizer loaders open without asking must be regular files (a FIFO blocks the
    # load forever), as the pair load checks before it reads anything.
    for role, folder in ((tname, target), (dname, drafter)):
        for f in sorted(folder.iterdir()):
            if f.suffix in _READ_BY_LOADERS and not f.is_file():
                raise PairError(f"{f}: is not a regular file", role)
    if _same_tokenizer_files(target, drafter):
        return None
    tok = target_tokenizer if target_tokenizer is not None else _load_tokenizer(target, tname, tconfig)
    a, b = _vocab(tok), _vocab(_load_tokenizer(drafter, dname, dconfig))
    if a and b and a != b:
        return (f"{drafter}: tokenizer of {len(b)} tokens differs from target "
                f"{target}'s {len(a)}; a model drafter must share the target's tokenizer")
    return None


def check_shapes(tconfig: dict, tweights: shapes.Weights, tname: str, dconfig: dict | None,
                 dweights: shapes.Weights | None, dname: str, *, builds: bool = True,
                 tables: bool = True) -> None:
    """Before anything is built: the configs' sizes against their weights, and the weights against
    the device's memory (PairError, naming its input: ``tname`` or ``dname``). ``builds``: the
    drafter is built from its config's layer count (not an MTP head's folder, whose config states
    the target's). ``tables``: the drafter holds a vocabulary table of its own (not DFlash)."""
    try:
        memory = shapes.device_memory()
        shapes.check_config(tconfig, tweights, tname, memory=memory)
        if dweights is not None and dconfig is not None:
            shapes.check_config(dconfig, dweights, dname, memory=memory, builds=builds, tables=tables)
            shapes.check_pair_memory([(tname, tweights), (dname, dweights)], memory)
    except shapes.ShapeError as e:
        raise PairError(e.message, e.input_name) from None


def token_rows(tokenizer: Any, target: Path, tweights: shapes.Weights, dweights: shapes.Weights | None,
               tname: str, dname: str, model: Any = None) -> int:
    """Before any forward: every id the tokenizer can produce, and every id an output head of the
    pair can emit, is a row of every embedding table it meets (``dweights``: a drafter with tables
    of its own). The rows of the smallest table, which a prompt's ids are checked against."""
    tables, heads = shapes.pair_tables(tweights, dweights, tname, dname)
    if tweights.embedding() is None and model is not None:  # named as the headers do not say
        tables += shapes.module_tables(model, f"target {target}", tname)
    try:
        rows = shapes.check_token_ids(shapes.tokenizer_ids(tokenizer), target, tname, tables, heads)
    except shapes.ShapeError as e:
        raise PairError(e.message, e.input_name) from None
    if rows is None:
        raise PairError(f"{target}: no token embedding found (in the weights"
                        f"{' or the built model' if model is not None else ''}) to check the "
                        f"tokenizer's ids against", tname)
    return rows


def load_pair(target: Path | str, drafter: Path | str | None = None,
              kind: DrafterKind | str | None = None, *,
              target_loader: Callable[[Path], Any] | None = None, drafter_model: bool = True) -> Pair:
    """Load a pair. ``drafter=None`` means the lookup drafter. A PairError names the input it
    is about (``target`` or ``draft``). ``target_loader``: loads the target's model instead of
    mlx-lm's ``load_model`` (a shard of it: engine.distributed); with ``drafter_model=False`` a
    model drafter is checked but its weights are not loaded (a rank that does not draft)."""
    target = Path(target)
    tname, dname = "target", "draft"
    tconfig, tweights = _check_folder(target, tname)
    dweights = None
    if kind is not None:
        kind = DrafterKind(kind)
    if drafter is None:
        kind = kind or DrafterKind.LOOKUP
    else:
        drafter = Path(drafter)
        dconfig, dweights = _check_folder(drafter, dname)
        kind = kind or detect_drafter(dconfig).kind
    if kind not in RUNNABLE:
        raise PairError(f"drafter kind {kind.value}: the embedded engine runs only "
                        f"{', '.join(k.value for k in RUNNABLE)}; `blockwidth resolve` still "
                        f"resolves a width for {kind.value}")
    problem = pairing_problem(kind, drafter)  # the one rule every front end refuses by
    if problem:
        raise PairError(problem.message, problem.input_name)

    if kind is DrafterKind.MODEL:  # the configs' sizes first: nothing is loaded for a refusal
        why = vocabulary_mismatch(target, drafter, tconfig=tconfig, dconfig=dconfig,
                                  sizes_only=True)
        if why:
            raise PairError(why, dname)
    try:
        sidecar = read_sidecar(target)
    except ConfigError as e:
        raise PairError(e.message, tname) from None
    own = dweights if kind is DrafterKind.MODEL else None  # dflash and mtp read the target's tables
    check_shapes(tconfig, tweights, tname, dconfig if dweights is not None else None, dweights, dname,
                 builds=kind is not DrafterKind.MTP, tables=kind is not DrafterKind.DFLASH)
    tokenizer = _load_tokenizer(target, tname, tconfig)
    if kind is DrafterKind.MODEL:  # then the tokenizers themselves, before any model is built
        why = vocabulary_mismatch(target, drafter, tconfig=tconfig, dconfig=dconfig,
                                  target_tokenizer=tokenizer)
        if why:
            raise PairError(why, dname)
    model = target_loader(target) if target_loader is not None else _load_model(target, tname)
    rows = token_rows(tokenizer, target, tweights, own, tname, dname, model)
    pair = Pair(model, tokenizer, target, tconfig, classify(tconfig, sidecar), kind,
                fingerprints={"target": fingerprint(target)}, caches=_cache_plan(model, target, tname),
                token_rows=rows)
    if kind is DrafterKind.MODEL:
        if drafter_model:  # a rank that does not draft checks the drafter but holds none
            pair.drafter = _load_model(drafter, dname)
            pair.drafter_caches = _cache_plan(pair.drafter, drafter, dname)
        pair.drafter_path = drafter
        pair.fingerprints["drafter"] = fingerprint(drafter)
    elif kind in (DrafterKind.DFLASH, DrafterKind.MTP):
        from blockwidth.engine import dflash, mtp
        from blockwidth.engine.hidden import TargetShapeError

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
