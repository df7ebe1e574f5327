"""MTP: multi-token-prediction heads, chained, on the target's last hidden state.

A head predicts the token after next from the target's final-normed hidden
state ``h[t]`` and the embedding of the token ``x[t+1]``:
``logits = lm_head(norm(block(proj(concat(enorm(embed(x[t+1])), hnorm(h[t]))))))``,
where ``block`` is one decoder layer of the target's own kind with its own KV
cache. Wider widths chain: the next step feeds the head's own output back as
the hidden state (head ``s mod k`` for step ``s`` with ``k`` heads), so the
drafting cost is linear in width.

Three published layouts, read from the target checkpoint itself (mlx-lm drops
these tensors when it loads the target) or from a separate head checkpoint:

- DeepSeek-V3 / GLM (``num_nextn_predict_layers``): ``model.layers.{N+i}.`` with
  ``enorm``, ``hnorm``, ``eh_proj``, ``shared_head.norm`` and the block's own
  tensors, N the target's layer count; concat(embedding, hidden); the chained
  hidden is the block output before ``shared_head.norm``.
- Qwen3.5 / Qwen3-Next (``mtp_num_hidden_layers``): ``mtp.`` with
  ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``, ``fc``, ``layers.{j}.``, ``norm``;
  concat(embedding, hidden); the chained hidden is the normed output.
- MiMo (``num_nextn_predict_layers``): ``model.mtp_layers.{i}.`` with
  ``token_layernorm``, ``hidden_layernorm``, ``input_proj``, ``final_layernorm``;
  concat(hidden, embedding); the chained hidden is the normed output.

A head's own copies of the embedding and LM head (``embed_tokens``,
``shared_head.head``) are the target's and are not loaded: the target's are used.
With k > 1 heads, every head's cache is fed the target's hidden states (a
shortcut: strictly, head i reads head i-1's outputs).
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

import mlx.core as mx
import mlx.nn as nn

from blockwidth.engine import hidden
from blockwidth.engine import dflash
from blockwidth.engine.dflash import DrafterFormatError
from blockwidth.policy.config import size, text
from blockwidth.policy.drafter import DrafterKind

# Target families whose decoder block this engine can build for a head (mlx-lm's TransformerBlock),
# and the hybrid ones whose head is one of their full-attention decoder layers (mlx-lm's class).
BLOCK_FAMILIES = ("llama", "qwen2", "qwen3", "mimo", "mistral")
HYBRID_BLOCKS = {"qwen3_5": ("qwen3_5", "DecoderLayer", "TextModelArgs"),
                 "qwen3_5_moe": ("qwen3_5", "DecoderLayer", "TextModelArgs"),
                 "qwen3_next": ("qwen3_next", "Qwen3NextDecoderLayer", "ModelArgs")}
# Norms a Qwen 3.5 / Qwen3-Next checkpoint in its published (Hugging Face) layout stores as
# weight - 1 (its RMSNorm scales by 1 + weight); mlx-lm adds 1 to the target's when it converts
# them, and a head read from the same checkpoint needs the same.
_SHIFTED_NORMS = ("enorm.weight", "hnorm.weight", "norm.weight", ".input_layernorm.weight",
                  ".post_attention_layernorm.weight", ".q_norm.weight", ".k_norm.weight")


class Layout(str, Enum):
    DEEPSEEK = "deepseek-v3"
    QWEN35 = "qwen3.5"
    MIMO = "mimo"


# internal name <- published name, per layout (the rest of a head's tensors are its block's)
_NAMES = {
    Layout.DEEPSEEK: {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "proj", "shared_head.norm": "norm"},
    Layout.QWEN35: {"pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "fc": "proj",
                    "norm": "norm"},
    Layout.MIMO: {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "proj",
                  "final_layernorm": "norm"},
}
_SHARED = ("embed_tokens.", "shared_head.head.")  # the target's own, not loaded


def head_count(config: dict) -> int:
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        v = size(config, key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


class Head(nn.Module):
    def __init__(self, d: int, eps: float, blocks: list, layout: Layout):
        super().__init__()
        self.enorm = nn.RMSNorm(d, eps=eps)
        self.hnorm = nn.RMSNorm(d, eps=eps)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.blocks = blocks
        self.norm = nn.RMSNorm(d, eps=eps)
        self.hidden_first = layout is Layout.MIMO
        self.chain_prenorm = layout is Layout.DEEPSEEK

    def __call__(self, h: mx.array, e: mx.array, cache: list | None = None) -> tuple[mx.array, mx.array]:
        """(normed output for the LM head, hidden to chain) for hidden ``h`` and embeddings ``e``."""
        from mlx_lm.models.base import create_attention_mask

        parts = [self.hnorm(h), self.enorm(e)] if self.hidden_first else [self.enorm(e), self.hnorm(h)]
        x = self.proj(mx.concatenate(parts, axis=-1))
        cache = cache or [None] * len(self.blocks)
        mask = create_attention_mask(x, cache[0])
        for blk, c in zip(self.blocks, cache):
            x = blk(x, mask, c)
        out = self.norm(x)
        return out, (x if self.chain_prenorm else out)


class MTPModel(nn.Module):
    def __init__(self, heads: list[Head], layout: Layout, source: str):
        super().__init__()
        self.heads = heads
        self.layout = layout
        self.source = source  # what it was loaded from, for describe()

    def make_cache(self) -> list[list]:
        from mlx_lm.models.cache import KVCache

        return [[KVCache() for _ in h.blocks] for h in self.heads]


def build_block(target_config: dict, where: str) -> nn.Module:
    mt = target_config.get("model_type")
    if mt in HYBRID_BLOCKS:
        module, layer, args = HYBRID_BLOCKS[mt]
        mod = importlib.import_module(f"mlx_lm.models.{module}")
        a = getattr(mod, args).from_dict(dict(text(target_config)))
        # a full-attention layer: every full_attention_interval-th one
        return getattr(mod, layer)(a, getattr(a, "full_attention_interval", 4) - 1)
    if mt not in BLOCK_FAMILIES:
        raise DrafterFormatError(f"{where}: target model_type {mt}: this engine builds MTP blocks for "
                                 f"{', '.join(BLOCK_FAMILIES + tuple(HYBRID_BLOCKS))}")
    mod = importlib.import_module(f"mlx_lm.models.{mt}")
    return mod.TransformerBlock(mod.ModelArgs.from_dict(target_config))


def _published_norms(source: Path) -> bool:
    """Whether a Qwen 3.5-family checkpoint is in its published layout (conv1d weights not yet
    converted by mlx-lm: (C, 1, K)), whose norms are stored as weight - 1."""
    from blockwidth.engine.checkpoint import read_header

    for f in sorted(Path(source).glob("*.safetensors")):
        for k, meta in read_header(f).items():
            if k.endswith("conv1d.weight") and isinstance(meta, dict):
                shape = meta.get("shape") or []
                return len(shape) == 3 and shape[-1] != 1
    return False


def _detect(keys: set[str], n_layers: int) -> Layout | None:
    if any(k.startswith(f"model.layers.{n_layers}.") and ".eh_proj." in k for k in keys):
        return Layout.DEEPSEEK
    if "mtp.fc.weight" in keys or "mtp.fc.scales" in keys:
        return Layout.QWEN35
    if any(k.startswith("model.mtp_layers.") for k in keys):
        return Layout.MIMO
    return None


def _prefixes(layout: Layout, count: int, n_layers: int) -> list[str]:
    if layout is Layout.DEEPSEEK:
        return [f"model.layers.{n_layers + i}." for i in range(count)]
    if layout is Layout.MIMO:
        return [f"model.mtp_layers.{i}." for i in range(count)]
    return ["mtp."]


def _internal(layout: Layout, rest: str) -> str | None:
    """A head's tensor name (after its prefix) -> this module's name; None for the shared ones."""
    if rest.startswith(_SHARED):
        return None
    for pub, mine in _NAMES[layout].items():
        if rest.startswith(pub + "."):
            return mine + rest[len(pub):]
    if layout is Layout.QWEN35:
        m = re.match(r"layers\.(\d+)\.(.*)", rest)
        return f"blocks.{m.group(1)}.{m.group(2)}" if m else rest
    return "blocks.0." + rest


def _read_weights(path: Path, prefixes: tuple[str, ...]) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        for k, v in mx.load(str(f)).items():
            if k.startswith(prefixes):
                out[k] = v
    return out


def load(head_path: Path | None, target: Any, target_path: Path, target_config: dict, *,
         head_config: dict | None = None, tensor_names: Iterable[str] | None = None) -> MTPModel:
    """MTP heads for ``target``: from ``head_path``, or from the target checkpoint when None.
    ``head_config`` and ``tensor_names`` (the source folder's tensors): as the pair load read them
    (engine.checkpoint.Checkpoint), so no file is read twice."""
    from mlx.utils import tree_flatten

    source = Path(head_path) if head_path else Path(target_path)
    where = f"MTP head {source}" if head_path else f"target {source}"
    if not head_path:
        config = target_config
    else:
        config = dflash.read_config(source) if head_config is None else head_config
    count = head_count(config)
    if not count:
        raise DrafterFormatError(f"{where}: no MTP layers (num_nextn_predict_layers / "
                                 f"mtp_num_hidden_layers absent or 0)")
    if head_path:
        for key, what in (("model_type", "architecture"), ("hidden_size", "hidden size"),
                          ("vocab_size", "vocabulary"), ("num_hidden_layers", "layer count")):
            if size(config, key) is not None and size(config, key) != size(target_config, key):
                raise DrafterFormatError(f"{where}: made for another architecture: {key} "
                                         f"{size(config, key)}, the target's is {size(target_config, key)}")
    n_layers = size(target_config, "num_hidden_layers") or hidden.depth(target)
    keys = set(tensor_names) if tensor_names is not None else set()
    for f in sorted(source.glob("*.safetensors")) if tensor_names is None else ():
        from blockwidth.engine.checkpoint import read_header

        keys.update(k for k in read_header(f) if k != "__metadata__")
    layout = _detect(keys, n_layers)
    if layout is None:
        raise DrafterFormatError(f"{where}: no MTP tensors in a known layout (model.layers.{n_layers}"
                                 f".eh_proj: DeepSeek-V3; mtp.fc: Qwen3.5; model.mtp_layers.0: MiMo)")
    prefixes = _prefixes(layout, 1 if layout is Layout.QWEN35 else count, n_layers)
    raw = _read_weights(source, tuple(prefixes))
    d = size(target_config, "hidden_size")
    eps = float(size(target_config, "rms_norm_eps", 1e-6))
    shift = (layout is Layout.QWEN35 and target_config.get("model_type") in HYBRID_BLOCKS
             and _published_norms(source))
    per_head: list[dict[str, mx.array]] = []
    published: dict[str, str] = {}  # internal name -> the checkpoint's, for messages
    for p in prefixes:
        mine = {}
        for k, v in raw.items():
            if k.startswith(p):
                name = _internal(layout, k[len(p):])
                if name is not None and "rotary_emb" not in name:
                    mine[name] = v
                    published[p + name] = k
        if not mine:
            raise DrafterFormatError(f"{where}: declares {count} MTP layers, but no tensor starts with {p}")
        per_head.append(mine)
    heads = []
    for p, w in zip(prefixes, per_head):
        n_blocks = 1 + max((int(k.split(".")[1]) for k in w if k.startswith("blocks.")), default=0)
        head = Head(d, eps, [build_block(target_config, where) for _ in range(n_blocks)], layout)
        q = config.get("quantization") or target_config.get("quantization")
        if any(k.endswith(".scales") for k in w):
            if not isinstance(q, dict):
                raise DrafterFormatError(f"{where}: quantized MTP tensors but no quantization in config.json")
            nn.quantize(head, group_size=q.get("group_size", 64), bits=q.get("bits", 4),
                        mode=q.get("mode", "affine"), class_predicate=lambda path, m, w=w: f"{path}.scales" in w)
        want = dict(tree_flatten(head.parameters()))
        missing = sorted(set(want) - set(w))
        if missing:
            raise DrafterFormatError(f"{where}: {layout.value} layout, but its {missing[0]} is missing "
                                     f"under {p}: not a head for a {target_config.get('model_type')} target")
        extra = sorted(set(w) - set(want))
        if extra:
            raise DrafterFormatError(f"{where}: tensor {published[p + extra[0]]} does not fit the "
                                     f"target's {target_config.get('model_type')} block: a head for "
                                     f"another architecture")
        for k, v in w.items():
            if tuple(v.shape) != tuple(want[k].shape):
                raise DrafterFormatError(f"{where}: tensor {published[p + k]} has shape {tuple(v.shape)}, the "
                                         f"target's block needs {tuple(want[k].shape)}: a head for "
                                         f"another architecture")
        if shift:
            w = {k: (v + 1.0 if k.endswith(_SHIFTED_NORMS) and v.ndim == 1 else v) for k, v in w.items()}
        head.load_weights(list(w.items()))
        heads.append(head)
    model = MTPModel(heads, layout, str(source))
    mx.eval(model.parameters())
    model.eval()
    return model


@dataclass
class _Rows:
    hidden: mx.array  # (1, R, d): target final hidden states at positions t
    tokens: list[int]  # the R tokens at positions t + 1


class MTPDrafter:
    """The Drafter protocol for chained MTP heads; ``forwards`` counts head forwards."""

    kind = DrafterKind.MTP

    def __init__(self, model: MTPModel, target: Any):
        self.model = model
        self.embed = hidden.embed(target)
        self.head = hidden.lm_head(target)
        self.caches = model.make_cache()
        self.staged: list[mx.array] = []
        self.rows: _Rows | None = None
        self.prompt: list[int] = []
        self.speculative = [0] * len(model.heads)  # chained cache rows per head, dropped at commit
        self.forwards = 0
        self.received: list[mx.array] = []

    def watch(self, model: Any) -> hidden.Capture:
        return hidden.Capture(model, (hidden.FINAL,), lambda s: self.staged.append(s[hidden.FINAL]))

    def _take(self) -> mx.array | None:
        if not self.staged:
            return None
        out = self.staged[0] if len(self.staged) == 1 else mx.concatenate(self.staged, axis=1)
        self.staged = []
        return out

    def prefill(self, prompt: mx.array) -> None:
        self.prompt = prompt.tolist()

    def _step(self, i: int, h: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array]:
        self.forwards += 1
        return self.model.heads[i](h, self.embed(tokens[None]), self.caches[i])

    def propose(self, n: int) -> mx.array:
        if self.rows is None:
            first = self._take()  # from prefill: hidden at positions 0..R-1, tokens 1..R
            if first is not None and first.shape[1]:
                self.rows = _Rows(first, self.prompt[1:first.shape[1] + 1])
        if n < 1:
            return mx.array([], mx.uint32)  # an auto width of 1: the rows wait for the next draft
        rows, self.rows = self.rows, None
        if rows is None:
            return mx.array([], mx.uint32)
        self.received.append(rows.hidden)
        toks = mx.array(rows.tokens, mx.uint32)
        out, chain = self._step(0, rows.hidden, toks)
        for i in range(1, len(self.model.heads)):
            self._step(i, rows.hidden, toks)  # keep every head's cache on the committed text
        y = mx.argmax(self.head(out[:, -1:]), axis=-1)[0]
        ys, chain = [y], chain[:, -1:]
        for s in range(1, n):
            i = s % len(self.model.heads)
            out, chain = self._step(i, chain, y)
            self.speculative[i] += 1
            y = mx.argmax(self.head(out), axis=-1)[0]
            ys.append(y)
        return mx.concatenate(ys).astype(mx.uint32)

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        for i, k in enumerate(self.speculative):
            if k:
                for c in self.caches[i]:
                    c.trim(k)
        self.speculative = [0] * len(self.model.heads)
        verify = self._take()
        if verify is not None:
            new = _Rows(verify[:, : accepted + 1], list(drafted[:accepted]) + [next_token])
            if self.rows is not None:  # rows kept by rounds that drafted nothing come first
                new = _Rows(mx.concatenate([self.rows.hidden, new.hidden], axis=1),
                            self.rows.tokens + new.tokens)
            self.rows = new
