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
from blockwidth.engine.checkpoint import Checkpoint, CheckpointError, pair_key, read_checkpoint, tensor_dtypes_of  # noqa: E402
from blockwidth.policy.config import context_length, size  # noqa: E402
from blockwidth.policy.drafter import DrafterKind, detect_drafter, kind_problem, pairing_problem  # noqa: E402
from blockwidth.policy.errors import BlockwidthError  # noqa: E402
from blockwidth.policy.text import folder_label  # noqa: E402
from blockwidth.policy.quantization import ConfigError, Quantization  # noqa: E402

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
    which each front end words its way (the command line's --target, the console's field).
    What another reader found (a config, a weights header, a shape, a cache kind, a drafter's
    format) reaches the front end as that reader raised it, never re-wrapped in a PairError."""


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
    checkpoints: dict[str, Checkpoint] = field(default_factory=dict)  # each folder, read once
    # the target's tensors' dtypes (checkpoint.tensor_dtypes: weights, scales): on a CPU the
    # scales' dtype moves a quantized verify's cost 8-60x, so records and saved entries carry it
    target_dtypes: dict = field(default_factory=dict)

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
        return context_length(self.target_config)

    @property
    def window(self) -> int | None:
        """The target's smallest sliding window (None: no sliding-window layer)."""
        return self.caches.window if self.caches is not None else None

    def describe(self) -> str:
        if self.kind is DrafterKind.MTP and self.drafter_path is None:
            d = "the target's own MTP layers"
        else:
            d = folder_label(self.drafter_path) if self.drafter_path else "prompt lookup"
        return f"{folder_label(self.target_path)} [{self.quantization.describe()}] + {d} ({self.kind.value})"


def check_folder(path: Path | Checkpoint, what: str) -> Checkpoint:
    """The folder read once and checked before any loader sees it: the config's sizes, the files
    the loaders open, every weights header (PairError about ``what``)."""
    ckpt = read_checkpoint(path, what)
    path, config = ckpt.path, ckpt.config
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
        weights = ckpt.weights  # every header, checked
    except CheckpointError as e:
        raise e.about(what) from None
    if not weights.shapes:
        raise PairError(f"{path}: no *.safetensors weights", what)
    return ckpt


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
    settle(model)
    return model


def settle(model) -> None:
    """Evaluate every array the model holds, private ones too, in this (the loading) thread.

    mlx-lm evaluates the parameters only; an array a module builds for itself and keeps under a
    private name (gemma4_text's ProportionalRoPE ``_freqs``) stays a lazy graph on this thread's
    stream, and MLX's streams are per thread: the session's worker that first evaluated it failed
    with "There is no Stream(cpu, 0) in current thread"."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    # an nn.Module is a dict of everything it holds, private names included: tree_flatten walks it
    held = [a for _, a in tree_flatten(model) if isinstance(a, mx.array)]
    mx.eval(held)


def _cache_plan(model, path: Path, what: str):
    from blockwidth.engine.kvcache import plan

    return plan(model, f"{what} {path}")  # a CacheKindError names the kind it cannot rewind


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


def _same_tokenizer_files(a: Checkpoint, b: Checkpoint) -> bool:
    """Both folders hold the same tokenizer files, byte for byte (then nothing needs loading)."""
    try:
        da, db = a.tokenizer_digests, b.tokenizer_digests
    except OSError:
        return False
    return bool(da) and da == db


def vocabulary_mismatch(target: Path | Checkpoint, drafter: Path | Checkpoint, *,
                        target_tokenizer: Any = None, sizes_only: bool = False) -> str | None:
    """Why a model drafter cannot draft for this target (it must share the target's tokenizer),
    or None (``sizes_only``: the configs' vocab sizes alone); the reason is about the ``draft``
    input (``PairError(why, "draft")``). The one rule
    for the pair load (both paths) and for ``resolve``, which loads no model: the configs' vocab
    sizes first, then the tokenizers themselves, loaded only when their files differ. A config or
    tokenizer that cannot be read raises PairError naming its input."""
    tname, dname = "target", "draft"
    # configs only: resolve may meet a hub checkpoint fetched without its weights
    tck, dck = read_checkpoint(target, tname), read_checkpoint(drafter, dname)
    target, drafter = tck.path, dck.path
    tconfig, dconfig = tck.config, dck.config
    tv, dv = size(tconfig, "vocab_size"), size(dconfig, "vocab_size")  # text_config's, where nested
    for role, path, v in ((tname, target, tv), (dname, drafter, dv)):
        if v is None:  # a config of {} said "differs from target's None"
            raise PairError(f"{path / 'config.json'}: states no vocab_size, so the pair's vocabularies "
                            f"cannot be compared (not a model checkpoint's config?)", role)
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
    if _same_tokenizer_files(tck, dck):
        return None
    tok = target_tokenizer if target_tokenizer is not None else _load_tokenizer(target, tname, tconfig)
    a, b = _vocab(tok), _vocab(_load_tokenizer(drafter, dname, dconfig))
    if a and b and a != b:
        return (f"{drafter}: tokenizer of {len(b)} tokens differs from target "
                f"{target}'s {len(a)}; a model drafter must share the target's tokenizer")
    return None


def _millions(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e5 else f"{n:,}"


def swapped(target: Path | str | Checkpoint, drafter: Path | str | Checkpoint) -> str | None:
    """Why a model drafter is no drafter for this target (it has more parameters: the two were
    likely given the wrong way round), or None; about the ``draft`` input. Counted from the
    safetensors headers the checkpoints hold, a packed quantized tensor at its bits (a 4-bit
    target is not counted smaller than it is); a folder without weights (a hub checkpoint
    resolved from its configs) is not judged. The one rule for the pair load and for ``resolve``."""
    try:
        tck = target if isinstance(target, Checkpoint) else read_checkpoint(target, "target")
        dck = drafter if isinstance(drafter, Checkpoint) else read_checkpoint(drafter, "draft")
        from blockwidth.engine.checkpoint import module_bits

        t = tck.weights.parameters(tck.quantization.bits, module_bits(tck.config))
        d = dck.weights.parameters(dck.quantization.bits, module_bits(dck.config))
    except (CheckpointError, ConfigError, BlockwidthError, KeyError, TypeError, ValueError):
        return None  # each load reports its own unreadable file, naming it
    if not t or not d or d <= t:
        return None
    return (f"{dck.path}: {_millions(d)} parameters, more than the target's {_millions(t)} ({tck.path}); a "
            f"drafter must be smaller than its target: are the target and drafter the wrong way round?")


def check_shapes(tconfig: dict, tweights: shapes.Weights, tname: str, dconfig: dict | None,
                 dweights: shapes.Weights | None, dname: str, *, builds: bool = True,
                 tables: bool = True) -> None:
    """Before anything is built: the configs' sizes against their weights, and the weights against
    the device's memory (PairError, naming its input: ``tname`` or ``dname``). ``builds``: the
    drafter is built from its config's layer count (not an MTP head's folder, whose config states
    the target's). ``tables``: the drafter holds a vocabulary table of its own (not DFlash)."""
    memory = shapes.device_memory()
    shapes.check_config(tconfig, tweights, tname, memory=memory)
    if dweights is not None and dconfig is not None:
        shapes.check_config(dconfig, dweights, dname, memory=memory, builds=builds, tables=tables)
        shapes.check_pair_memory([(tname, tweights), (dname, dweights)], memory)


def token_rows(tokenizer: Any, target: Path, tweights: shapes.Weights, dweights: shapes.Weights | None,
               tname: str, dname: str, model: Any = None) -> int:
    """Before any forward: every id the tokenizer can produce, and every id an output head of the
    pair can emit, is a row of every embedding table it meets (``dweights``: a drafter with tables
    of its own). The rows of the smallest table, which a prompt's ids are checked against."""
    tables, heads = shapes.pair_tables(tweights, dweights, tname, dname)
    if tweights.embedding() is None and model is not None:  # named as the headers do not say
        tables += shapes.module_tables(model, f"target {target}", tname)
    rows = shapes.check_token_ids(shapes.tokenizer_ids(tokenizer), target, tname, tables, heads)
    if rows is None:
        raise PairError(f"{target}: no token embedding found (in the weights"
                        f"{' or the built model' if model is not None else ''}) to check the "
                        f"tokenizer's ids against", tname)
    return rows


@dataclass(frozen=True)
class CheckedPair:
    """A pair that passed every check made before a model is built: the one pair check of the
    engine path (load_pair) and the served path (engine.session.served.served_pair)."""

    target: Checkpoint
    drafter: Checkpoint | None
    kind: DrafterKind
    tokenizer: Any  # the target's, loaded once (mlx_lm TokenizerWrapper)
    quantization: Quantization


def check_pair(target: Path | str | Checkpoint, drafter: Path | str | Checkpoint | None = None,
               kind: DrafterKind | str | None = None) -> CheckedPair:
    """Read each folder once and check the pair before anything is built: the configs' sizes
    against their weights and the device, the drafter kind, the vocabulary (sizes, then the
    tokenizers themselves), the quantization sidecar. PairError names its input (``target`` or
    ``draft``)."""
    tname, dname = "target", "draft"
    tck = check_folder(target, tname)
    dck = None
    if kind is not None:
        kind = DrafterKind(kind)
    if drafter is None:
        kind = kind or DrafterKind.LOOKUP
    else:
        dck = check_folder(drafter, dname)
        detected = detect_drafter(dck.config)
        wrong = kind_problem(kind, detected, dck.path)  # model on a DFlash checkpoint: one line
        if wrong:
            raise PairError(wrong.message, wrong.input_name)
        kind = kind or detected.kind
    if kind not in RUNNABLE:
        raise PairError(f"drafter kind {kind.value}: the embedded engine runs only "
                        f"{', '.join(k.value for k in RUNNABLE)}; `blockwidth resolve` still "
                        f"resolves a width for {kind.value}")
    problem = pairing_problem(kind, dck.path if dck is not None else None)  # the one rule every front end refuses by
    if problem:
        raise PairError(problem.message, problem.input_name)

    if kind is DrafterKind.MODEL:  # the configs' sizes first: nothing is loaded for a refusal
        why = vocabulary_mismatch(tck, dck, sizes_only=True) or swapped(tck, dck)
        if why:
            raise PairError(why, dname)
    try:
        quantization = tck.quantization  # reads the sidecar: a broken one is the target's error
    except ConfigError as e:
        raise e.about(tname) from None
    check_shapes(tck.config, tck.weights, tname, dck.config if dck is not None else None,
                 dck.weights if dck is not None else None, dname, builds=kind is not DrafterKind.MTP,
                 tables=kind is not DrafterKind.DFLASH)
    tokenizer = _load_tokenizer(tck.path, tname, tck.config)
    if kind is DrafterKind.MODEL:  # then the tokenizers themselves, before any model is built
        why = vocabulary_mismatch(tck, dck, target_tokenizer=tokenizer)
        if why:
            raise PairError(why, dname)
    return CheckedPair(tck, dck, kind, tokenizer, quantization)


def load_pair(target: Path | str, drafter: Path | str | None = None,
              kind: DrafterKind | str | None = None, *,
              target_loader: Callable[[Path], Any] | None = None, drafter_model: bool = True) -> Pair:
    """Load a pair. ``drafter=None`` means the lookup drafter. A PairError names the input it
    is about (``target`` or ``draft``). ``target_loader``: loads the target's model instead of
    mlx-lm's ``load_model`` (a shard of it: engine.distributed); with ``drafter_model=False`` a
    model drafter is checked but its weights are not loaded (a rank that does not draft).
    Each folder is read once (engine.checkpoint.Checkpoint) and what was read is passed down;
    mlx-lm's own loaders read config.json and the tokenizer files again, as they are written."""
    tname, dname = "target", "draft"
    checked = check_pair(target, drafter, kind)
    tck, dck, kind, tokenizer = checked.target, checked.drafter, checked.kind, checked.tokenizer
    target = tck.path
    own = dck.weights if kind is DrafterKind.MODEL else None  # dflash and mtp read the target's tables
    model = target_loader(target) if target_loader is not None else _load_model(target, tname)
    rows = token_rows(tokenizer, target, tck.weights, own, tname, dname, model)
    dtypes = tensor_dtypes_of(tck.weights)
    pair = Pair(model, tokenizer, target, tck.config, checked.quantization.with_tensors(dtypes["weights"]),
                kind, fingerprints={"target": tck.fingerprint}, caches=_cache_plan(model, target, tname),
                token_rows=rows, checkpoints={"target": tck}, target_dtypes=dtypes)
    if dck is not None:
        pair.checkpoints["drafter"] = dck
    if kind is DrafterKind.MODEL:
        if drafter_model:  # a rank that does not draft checks the drafter but holds none
            pair.drafter = _load_model(dck.path, dname)
            pair.drafter_caches = _cache_plan(pair.drafter, dck.path, dname)
        pair.drafter_path = dck.path
        pair.fingerprints["drafter"] = dck.fingerprint
    elif kind in (DrafterKind.DFLASH, DrafterKind.MTP):
        from blockwidth.engine import dflash, mtp

        # a DrafterFormatError or a TargetShapeError says what does not fit, as it is
        if kind is DrafterKind.DFLASH:
            pair.drafter = dflash.load(dck.path, model, tck.config, config=dck.config)
        else:
            source = dck if dck is not None else tck
            pair.drafter = mtp.load(dck.path if dck is not None else None, model, target, tck.config,
                                    head_config=dck.config if dck is not None else None,
                                    tensor_names=source.weights.shapes.keys())
        settle(pair.drafter)
        if dck is not None:
            pair.drafter_path = dck.path
            pair.fingerprints["drafter"] = dck.fingerprint
    return pair
