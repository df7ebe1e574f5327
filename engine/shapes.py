"""What a checkpoint's config.json and tokenizer promise, checked against its weights before
anything is built or run.

mlx-lm builds a model from ``config.json`` first and compares it with the weights only when it
loads them: a ``num_hidden_layers`` of a million built a million layers (23 GB before the
machine ran out). And a forward indexes the embedding table with whatever ids it is given, so
a tokenizer whose ids lie past the table read beyond its end (ids just past it ran, with exit 0)
or crashed the process (SIGSEGV). So, from the safetensors headers (no MLX):

- ``check_config``: the layers, the vocabulary and the hidden size the config states are the
  ones the weights hold; what the config would build is bounded by what the weights hold, and
  the weights by the device's memory;
- ``check_token_ids``: every id the tokenizer can produce, and every id a model of the pair can
  emit, is a row of every embedding table it will be fed to. ``Pair.encode`` checks a prompt's
  ids against the same bound before any forward.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from blockwidth.engine.checkpoint import CheckpointError, read_header, weight_files
from blockwidth.policy.errors import WORDS, BlockwidthError


class ShapeError(BlockwidthError, ValueError):
    """A config, tokenizer or prompt that does not fit the weights; the message names the file,
    ``input_name`` the input it came from (``target``, ``draft``, ``prompt``)."""


def _word(key: str) -> str:
    """How a message names another input than the one it is about (``target``, ``drafter``)."""
    return WORDS.get(key, key)


# Token embeddings and output heads, as checkpoints of mlx-lm's families name them (the leaf
# module: llama's embed_tokens, gpt2's wte, mamba's and nemotron_h's embeddings, afm7's
# embedding, openelm's token_embeddings, talkie's embed, rwkv's emb, ...). Anything of a vision,
# audio or position table (gpt2's wpe) is not a token table, nor one that is not indexed by the ids
# themselves (gemma3n's embed_tokens_per_layer masks ids past its rows; longcat's n-gram
# embedders hash them).
_EMBED_LEAF = (r"(?:embed_tokens|wte|embed_in|word_embeddings|tok_embeddings|token_embeddings"
               r"|embeddings|embedding|embed|emb)")
_EMBED = re.compile(rf"(?:^|\.){_EMBED_LEAF}\.weight$")
_HEAD = re.compile(r"(?:^|\.)(?:lm_head|embed_out)\.weight$|^(?:model\.)?output\.weight$")
_NOT_TOKENS = re.compile(r"vision|visual|audio|image|pos|wpe|per_layer|embedders", re.IGNORECASE)
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|block)\.(\d+)\.")
_PACKED = {"U32", "I32", "U8", "I8", "U16", "I16"}  # integer storage of packed quantized weights

# The cost curve feeds the target a synthetic context of ids 10..209 (costcurve.context_ids).
SYNTHETIC_IDS = 210


@dataclass(frozen=True)
class Weights:
    """What one folder's safetensors headers say, read once."""

    path: Path
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: Mapping[str, str] = field(default_factory=dict)
    nbytes: int = 0

    def _rows(self, pattern: re.Pattern) -> tuple[str, int] | None:
        found = [(n, s[0]) for n, s in self.shapes.items()
                 if pattern.search(n) and not _NOT_TOKENS.search(n) and len(s) >= 1]
        return min(found, key=lambda f: f[1]) if found else None

    def parameters(self, bits: int | None = None) -> int | None:
        """Parameters in these headers (None: no weights), an MLX-quantized weight unpacked at
        ``bits`` (its packed uint32 words hold 32 / bits values each); scales and biases are not
        parameters of the model."""
        if not self.shapes:
            return None
        total = 0
        for name, shape in self.shapes.items():
            if name.endswith((".scales", ".biases")):
                continue
            n = math.prod(shape)
            base = name[: -len(".weight")] if name.endswith(".weight") else None
            if base and f"{base}.scales" in self.shapes and self.dtypes.get(name) == "U32" and bits:
                n = n * 32 // bits
            total += n
        return total

    def embedding(self) -> tuple[str, int] | None:
        """(tensor name, rows) of the smallest token embedding table, or None."""
        return self._rows(_EMBED)

    def head(self) -> tuple[str, int] | None:
        """(tensor name, rows) of the output head where it has its own weights (not tied)."""
        return self._rows(_HEAD)

    def layers(self) -> int | None:
        idx = [int(m.group(1)) for n in self.shapes if (m := _LAYER.search(n))]
        return max(idx) + 1 if idx else None

    def elements(self) -> int:
        """Weights held, counting a packed integer tensor as up to 8 values an element (4-bit
        in 32 bits), so a quantized checkpoint is never counted smaller than it is."""
        return sum(math.prod(s) * (8 if self.dtypes.get(n) in _PACKED else 1)
                   for n, s in self.shapes.items())


def read_weights(path: Path) -> Weights:
    """The folder's headers (CheckpointError when one is unreadable or corrupt)."""
    shapes: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, str] = {}
    nbytes = 0
    for f in weight_files(path):
        header = read_header(f)
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            shapes[name] = tuple(meta["shape"])
            dtypes[name] = meta["dtype"]
            begin, end = meta["data_offsets"]
            nbytes += end - begin
    return Weights(Path(path), shapes, dtypes, nbytes)


def device_memory() -> int | None:
    """What the device can hold: its own memory where MLX reports it, else physical RAM."""
    from blockwidth.engine.device import probe

    mem = probe().memory_bytes
    if mem:
        return mem
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _sizes(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The block that states the decoder's sizes (``text_config`` for multimodal configs): the
    one rule every size reader follows (policy.config)."""
    from blockwidth.policy.config import text

    return text(config)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def implied_parameters(config: Mapping[str, Any], tables: bool = True) -> int | None:
    """About how many weights a model built from ``config`` allocates (dense or mixture of
    experts), or None where the config states too little to say. ``tables``: the model holds a
    vocabulary table of its own (a DFlash drafter reads the target's: its config states the
    vocabulary it drafts in, not a table it holds)."""
    c = _sizes(config)
    h, layers = _int(c.get("hidden_size")), _int(c.get("num_hidden_layers"))
    if h is None or layers is None:
        return None
    heads = _int(c.get("num_attention_heads")) or 1
    kv = _int(c.get("num_key_value_heads")) or heads
    head_dim = _int(c.get("head_dim")) or max(h // heads, 1)
    inter = _int(c.get("intermediate_size")) or 4 * h
    experts = next((v for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if (v := _int(c.get(k)))), None)
    mlp = 3 * h * (experts * (_int(c.get("moe_intermediate_size")) or inter) if experts else inter)
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    return layers * (attention + mlp) + ((_int(c.get("vocab_size")) or 0) * h if tables else 0)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_config(config: Mapping[str, Any], weights: Weights, what: str, *,
                 builds: bool = True, tables: bool = True, memory: int | None = None) -> None:
    """Refuse a config whose sizes the weights do not hold, before a model is built from it.
    ``builds``: a model is built from this config's layer count (not an MTP head's folder,
    whose config states the target's layers). ``tables``: as implied_parameters.
    ``memory``: the device's bytes."""
    cfg = weights.path / "config.json"
    c = _sizes(config)
    where = "config.json" if c is config else "config.json text_config"
    stated = _int(c.get("num_hidden_layers"))
    held = weights.layers()
    if builds and stated is not None and held is not None and stated > held:
        raise ShapeError(f"{cfg}: num_hidden_layers = {stated:,}, but the weights hold {held} "
                         f"layers ({where} does not match its weights)", what)
    embed = weights.embedding()
    vocab = _int(c.get("vocab_size"))
    if embed is not None and vocab is not None and vocab > embed[1]:
        raise ShapeError(f"{cfg}: vocab_size = {vocab:,}, but the weights' {embed[0]} has "
                         f"{embed[1]:,} rows ({where} does not match its weights)", what)
    hidden = _int(c.get("hidden_size"))
    if (embed is not None and hidden is not None and weights.dtypes.get(embed[0]) not in _PACKED
            and len(weights.shapes[embed[0]]) == 2 and hidden != weights.shapes[embed[0]][1]):
        raise ShapeError(f"{cfg}: hidden_size = {hidden:,}, but the weights' {embed[0]} is "
                         f"{weights.shapes[embed[0]][1]:,} wide ({where} does not match its weights)", what)
    implied = implied_parameters(config, tables) if builds else None
    held_elements = weights.elements()
    # 4x: room for what the estimate cannot see (tied or shared tables, a layer of another kind);
    # a config that builds more than that is not this checkpoint's (a million layers was 23 GB).
    if implied is not None and held_elements and implied > 4 * held_elements + (1 << 20):
        raise ShapeError(f"{cfg}: its sizes describe about {implied:,} weights, but the "
                         f"safetensors hold {held_elements:,} ({where} does not match its weights)", what)
    if memory and weights.nbytes > memory:
        raise ShapeError(f"{weights.path}: its weights are {_gib(weights.nbytes)}, more than "
                         f"this device's {_gib(memory)} of memory", what)


def check_pair_memory(parts: Iterable[tuple[str, Weights]], memory: int | None) -> None:
    """The pair's weights together must fit the device (each alone is checked by check_config)."""
    parts = list(parts)
    total = sum(w.nbytes for _, w in parts)
    if memory and len(parts) > 1 and total > memory:
        names = " + ".join(f"{_word(what)} {_gib(w.nbytes)}" for what, w in parts)
        raise ShapeError(f"the pair's weights are {_gib(total)} ({names}), more than this device's "
                         f"{_gib(memory)} of memory")


def tokenizer_ids(tokenizer: Any) -> int | None:
    """One past the largest id the tokenizer can produce (its vocabulary, added tokens and
    special tokens), or None where it lists none."""
    ids: list[int] = []
    try:
        vocab = tokenizer.get_vocab()
        ids.extend(v for v in vocab.values() if isinstance(v, int))
    except Exception:  # a tokenizer without get_vocab: its special ids still count
        pass
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        try:
            v = getattr(tokenizer, attr, None)
        except Exception:
            v = None
        if isinstance(v, int) and not isinstance(v, bool):
            ids.append(v)
    return max(ids) + 1 if ids else None


@dataclass(frozen=True)
class Table:
    """One embedding table of the pair: how a message names its folder (``what``), the tensor's
    name, its rows, and the input it belongs to (``key``: ``target`` or ``draft``)."""

    what: str
    name: str
    rows: int
    key: str | None = None


def check_token_ids(tokenizer_bound: int | None, tokenizer_path: Path, tokenizer_key: str,
                    tables: Iterable[Table], heads: Iterable[Table],
                    synthetic: int = SYNTHETIC_IDS) -> int | None:
    """Every id the pair will feed a table must be one of its rows: the tokenizer's ids, the ids
    an output head can emit (its rows), and the cost curve's synthetic context. Returns the
    smallest table's rows (the bound ``Pair.encode`` checks a prompt against)."""
    tables = list(tables)
    if not tables:
        return None
    smallest = min(tables, key=lambda t: t.rows)
    if tokenizer_bound is not None and tokenizer_bound > smallest.rows:
        raise ShapeError(f"{tokenizer_path}: its tokenizer has token id {tokenizer_bound - 1:,}, but "
                         f"{smallest.what}'s embedding {smallest.name} has {smallest.rows:,} rows "
                         f"(ids 0..{smallest.rows - 1:,}): a forward would read past the table", tokenizer_key)
    for head in heads:
        if head.rows > smallest.rows:
            raise ShapeError(f"{head.what}: its output head {head.name} emits ids up to "
                             f"{head.rows - 1:,}, but {smallest.what}'s embedding {smallest.name} has "
                             f"{smallest.rows:,} rows: a drafted or decoded id would read past the table")
    if smallest.rows < synthetic:
        raise ShapeError(f"{smallest.what}: its embedding {smallest.name} has {smallest.rows} rows; the "
                         f"cost curve's context uses ids up to {synthetic - 1}")
    return smallest.rows


def pair_tables(target: Weights, drafter: Weights | None, tname: str,
                dname: str) -> tuple[list[Table], list[Table]]:
    """The token tables (embeddings) and output heads of a pair's own weights, from the headers.
    A head without weights of its own is tied to its embedding: nothing beyond its rows."""
    tables, heads = [], []
    for what, w in ((tname, target), (dname, drafter)):
        if w is None:
            continue
        embed, head = w.embedding(), w.head()
        if embed is not None:
            tables.append(Table(f"{_word(what)} {w.path}", *embed, key=what))
        if head is not None:
            heads.append(Table(f"{_word(what)} {w.path}", *head, key=what))
    return tables, heads


def module_tables(model: Any, what: str, key: str | None = None) -> list[Table]:
    """The built model's token embeddings, whatever the family calls them: every
    ``nn.Embedding`` / ``nn.QuantizedEmbedding`` module (and any module named like one above, for
    a family's own embedding class), less the tables that are not indexed by token ids. A
    quantized table packs its columns, not its rows: its rows are ``weight.shape[0]``."""
    import mlx.nn as nn

    leaf = re.compile(rf"(?:^|\.){_EMBED_LEAF}$")
    out = []
    for name, module in model.named_modules():
        shape = getattr(getattr(module, "weight", None), "shape", None)
        table = isinstance(module, (nn.Embedding, nn.QuantizedEmbedding)) or leaf.search(name)
        if table and shape and not _NOT_TOKENS.search(name):
            out.append(Table(what, name, int(shape[0]), key))
    return out


def check_ids(ids: Iterable[int], rows: int | None, where: str, key: str = "prompt") -> None:
    """Ids about to be fed to a forward (a prompt's, the input ``key``): each a row of the pair's
    tables (``where``: the model, as a message names it)."""
    if rows is None:
        return
    bad = next((i for i in ids if not 0 <= i < rows), None)
    if bad is not None:
        raise ShapeError(f"({where}): token id {bad:,} is outside the embedding's {rows:,} rows "
                         f"(the tokenizer produced an id the model has no row for)", key)


__all__ = ["CheckpointError", "ShapeError", "Table", "Weights", "check_config", "check_ids",
           "check_pair_memory", "check_token_ids", "device_memory", "implied_parameters",
           "read_weights", "tokenizer_ids"]
