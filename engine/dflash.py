"""DFlash: a block-diffusion drafter that proposes a whole block in one forward.

The published format (z-lab's ``*-DFlash-b16`` family, ``DFlashDraftModel``):
``config.json`` holds a Qwen3-style decoder (``hidden_size`` equal to the
target's, ``num_hidden_layers`` draft layers), ``block_size``, and
``dflash_config`` with ``target_layer_ids`` (0-based target decoder layers whose
outputs it reads) and ``mask_token_id`` (both also accepted at the top level).
The weights are ``fc`` (the concatenated target hidden states projected to one
hidden), ``hidden_norm``, ``layers.N.*`` and ``norm``; the drafter has no
embedding or LM head of its own, it uses the target's.

One round: the target's hidden states at those layers for the positions just
committed are projected (``hidden_norm(fc(concat))``) and appended to each draft
layer's keys and values; the block ``[last token, mask, mask, ...]`` of ``width``
rows attends to that context and to itself (no causal mask), and row j's logits
propose the token at row j. As in the reference implementation, the width is
the block size of that round (its ``block_size`` argument): ``block_size`` in the
checkpoint is the block it was trained for and the width it declares; a wider
block runs, outside what it was trained on. One forward drafts the whole
block, so on a GPU its cost is flat in width.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from blockwidth.engine import hidden
from blockwidth.policy.config import ConfigError, size
from blockwidth.policy.config import read_config as config_file
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.errors import BlockwidthError

ARCHITECTURE = "DFlashDraftModel"


class DrafterFormatError(BlockwidthError, ValueError):
    """A drafter checkpoint this engine refuses; the message is one line naming what is wrong."""


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class DFlashSpec:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    block_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_target_layers: int | None
    sliding_window: int | None
    layer_types: tuple[str, ...]
    attention_bias: bool
    causal: bool


def dflash_value(config: dict, key: str) -> Any:
    """A DFlash setting: ``dflash_config`` first, then the top level (both are published)."""
    sub = config.get("dflash_config")
    if isinstance(sub, dict) and key in sub:
        return sub[key]
    return config.get(key)


def parse_spec(config: dict, where: str) -> DFlashSpec:
    """The drafter's own shape from its config; one-line DrafterFormatError when it is not DFlash."""
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    if ARCHITECTURE not in archs:
        other = ", ".join(map(str, archs)) or "none"
        extra = " (DFlash2's candidate selector and convolutions are not run here)" if any(
            "DFlash2" in str(a) for a in archs) else ""
        raise DrafterFormatError(f"{where}: architectures [{other}] is not {ARCHITECTURE}{extra}")
    need = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
            "vocab_size")
    for key in need:
        if not _int(config.get(key)) or config[key] < 1:
            raise DrafterFormatError(f"{where}: config.json has no positive integer {key}")
    ids = dflash_value(config, "target_layer_ids")
    if not isinstance(ids, list) or not ids or not all(_int(i) is not None for i in ids):
        raise DrafterFormatError(f"{where}: no target_layer_ids (a list of target layer numbers, in "
                                 f"dflash_config or at the top level)")
    mask = dflash_value(config, "mask_token_id")
    if _int(mask) is None:
        raise DrafterFormatError(f"{where}: no mask_token_id (in dflash_config or at the top level): "
                                 f"a DFlash block needs a mask token")
    block = dflash_value(config, "block_size")
    block = 16 if block is None else block  # the reference implementation's default
    if _int(block) is None or block < 2:
        raise DrafterFormatError(f"{where}: block_size {block!r} is not an integer of at least 2")
    heads = config["num_attention_heads"]
    kv = _int(config.get("num_key_value_heads")) or heads
    head_dim = _int(config.get("head_dim")) or config["hidden_size"] // heads
    n = config["num_hidden_layers"]
    types = config.get("layer_types") or ["full_attention"] * n
    if not isinstance(types, list) or len(types) != n or set(types) - {"full_attention", "sliding_attention"}:
        raise DrafterFormatError(f"{where}: layer_types {types!r} is not {n} of full_attention / "
                                 f"sliding_attention")
    window = _int(config.get("sliding_window"))
    if "sliding_attention" in types and not window:
        raise DrafterFormatError(f"{where}: sliding_attention layers without a sliding_window")
    rope = config.get("rope_scaling") or config.get("rope_parameters")
    theta = config.get("rope_theta") or (rope or {}).get("rope_theta") or 10000.0
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type")) in (None, "default"):
        rope = None
    causal = config.get("is_causal")
    return DFlashSpec(
        hidden_size=config["hidden_size"], num_hidden_layers=n, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"], rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta), rope_scaling=rope if isinstance(rope, dict) else None,
        max_position_embeddings=_int(config.get("max_position_embeddings")) or 32768,
        block_size=block, target_layer_ids=tuple(ids), mask_token_id=mask,
        num_target_layers=_int(config.get("num_target_layers")), sliding_window=window,
        layer_types=tuple(types), attention_bias=bool(config.get("attention_bias", False)),
        causal=bool(causal) if causal is not None else False,
    )


def check_against_target(spec: DFlashSpec, where: str, target_config: dict, target_depth: int) -> None:
    """Refuse a drafter made for another target: layers, hidden size, vocabulary, mask token."""
    bad = [i for i in spec.target_layer_ids if not 0 <= i < target_depth]
    if bad:
        raise DrafterFormatError(f"{where}: target_layer_ids {list(spec.target_layer_ids)} name layer "
                                 f"{bad[0]}, but the target has {target_depth} layers (0..{target_depth - 1})")
    if spec.num_target_layers is not None and spec.num_target_layers != target_depth:
        raise DrafterFormatError(f"{where}: made for a {spec.num_target_layers}-layer target "
                                 f"(num_target_layers), the target has {target_depth}")
    th = size(target_config, "hidden_size")
    if th != spec.hidden_size:
        raise DrafterFormatError(f"{where}: hidden_size {spec.hidden_size} differs from the target's "
                                 f"{th}; DFlash reads the target's hidden states and embeddings")
    tv = size(target_config, "vocab_size")
    if tv != spec.vocab_size:
        raise DrafterFormatError(f"{where}: vocabulary of {spec.vocab_size} tokens differs from the "
                                 f"target's {tv}")
    if not 0 <= spec.mask_token_id < (tv or 0):
        raise DrafterFormatError(f"{where}: mask_token_id {spec.mask_token_id} is outside the target's "
                                 f"vocabulary of {tv}")


class Attention(nn.Module):
    def __init__(self, spec: DFlashSpec, sliding: bool):
        super().__init__()
        d, h, kv, hd = spec.hidden_size, spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
        self.n_heads, self.n_kv, self.head_dim = h, kv, hd
        self.scale = hd ** -0.5
        self.q_proj = nn.Linear(d, h * hd, bias=spec.attention_bias)
        self.k_proj = nn.Linear(d, kv * hd, bias=spec.attention_bias)
        self.v_proj = nn.Linear(d, kv * hd, bias=spec.attention_bias)
        self.o_proj = nn.Linear(h * hd, d, bias=spec.attention_bias)
        self.q_norm = nn.RMSNorm(hd, eps=spec.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=spec.rms_norm_eps)
        self.window = spec.sliding_window if sliding else None
        self.causal = spec.causal

    def _kv(self, x: mx.array, rope, offset) -> tuple[mx.array, mx.array]:
        B, L, _ = x.shape
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv, -1).transpose(0, 2, 1, 3)
        return rope(k, offset=offset), v

    def __call__(self, x: mx.array, ctx: mx.array | None, rope, cache=None,
                 ctx_keys: tuple[mx.array, mx.array] | None = None,
                 block_offset: Any = None, mask: mx.array | None = None) -> mx.array:
        """Decoding: ``cache`` holds the context's keys and values, ``ctx`` the new context rows.
        Training: ``ctx_keys`` are the context keys/values and ``block_offset``/``mask`` given."""
        B, L, _ = x.shape
        if cache is not None:
            if ctx is not None and ctx.shape[1]:
                k, v = self._kv(ctx, rope, cache.offset)
                ck, cv = cache.update_and_fetch(k, v)
            elif cache.offset:
                ck, cv = cache.keys[..., :cache.offset, :], cache.values[..., :cache.offset, :]
            else:
                ck = cv = None
            block_offset = cache.offset
            if self.window or self.causal:
                mask = block_mask(mx.array([block_offset]), L, 0 if ck is None else ck.shape[2],
                                  self.window, self.causal)
        else:
            ck, cv = ctx_keys
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        q = rope(q, offset=block_offset)
        kb, vb = self._kv(x, rope, block_offset)
        keys = kb if ck is None else mx.concatenate([mx.broadcast_to(ck, (B, *ck.shape[1:])), kb], axis=2)
        values = vb if cv is None else mx.concatenate([mx.broadcast_to(cv, (B, *cv.shape[1:])), vb], axis=2)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def block_mask(starts: mx.array, block: int, ctx_len: int, window: int | None = None,
               causal: bool = False) -> mx.array:
    """(N, 1, block, ctx_len + block) booleans: block n sees context positions before ``starts[n]``
    (within ``window`` when sliding) and its own block (all of it, or causally)."""
    q = starts[:, None] + mx.arange(block)[None, :]  # (N, block) absolute query positions
    kpos = mx.arange(ctx_len)[None, None, :]
    ctx = kpos < starts[:, None, None]
    if window:
        ctx = ctx & (q[:, :, None] - kpos < window)
    ctx = mx.broadcast_to(ctx, (starts.shape[0], block, ctx_len))
    own = mx.ones((block, block), dtype=mx.bool_)
    if causal:
        own = mx.tril(own)
    own = mx.broadcast_to(own[None], (starts.shape[0], block, block))
    return mx.concatenate([ctx, own], axis=2)[:, None]


class MLP(nn.Module):
    def __init__(self, d: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, inter, bias=False)
        self.up_proj = nn.Linear(d, inter, bias=False)
        self.down_proj = nn.Linear(inter, d, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, spec: DFlashSpec, i: int):
        super().__init__()
        self.self_attn = Attention(spec, spec.layer_types[i] == "sliding_attention")
        self.mlp = MLP(spec.hidden_size, spec.intermediate_size)
        self.input_layernorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(spec.hidden_size, eps=spec.rms_norm_eps)

    def __call__(self, x, ctx, rope, cache=None, **kw):
        h = x + self.self_attn(self.input_layernorm(x), ctx, rope, cache, **kw)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashModel(nn.Module):
    """The draft network (weights named as in the published checkpoints)."""

    def __init__(self, spec: DFlashSpec):
        super().__init__()
        from mlx_lm.models.rope_utils import initialize_rope

        self.spec = spec
        d = spec.hidden_size
        self.fc = nn.Linear(len(spec.target_layer_ids) * d, d, bias=False)
        self.hidden_norm = nn.RMSNorm(d, eps=spec.rms_norm_eps)
        self.layers = [Layer(spec, i) for i in range(spec.num_hidden_layers)]
        self.norm = nn.RMSNorm(d, eps=spec.rms_norm_eps)
        self._rope = initialize_rope(spec.head_dim, base=spec.rope_theta, traditional=False,
                                     scaling_config=spec.rope_scaling,
                                     max_position_embeddings=spec.max_position_embeddings)

    def context(self, feats: mx.array) -> mx.array:
        """Concatenated target hidden states -> one hidden per position."""
        return self.hidden_norm(self.fc(feats))

    def __call__(self, x: mx.array, feats: mx.array | None, cache: list) -> mx.array:
        """Decoding: ``x`` the embedded block, ``feats`` the new context rows; final-normed hidden."""
        ctx = self.context(feats) if feats is not None else None
        for layer, c in zip(self.layers, cache):
            x = layer(x, ctx, self._rope, c)
        return self.norm(x)

    def train_forward(self, x: mx.array, feats: mx.array, starts: mx.array, seq: mx.array) -> mx.array:
        """Training: ``x`` (N, block, d) embedded blocks, ``feats`` (S, ctx, F) context rows of S
        sequences, ``seq`` (N,) which sequence each block reads, ``starts`` (N,) where it begins."""
        ctx = self.context(feats)
        mask = block_mask(starts, x.shape[1], feats.shape[1], None, self.spec.causal)
        for layer in self.layers:
            k, v = layer.self_attn._kv(ctx, self._rope, 0)
            k, v = k[seq], v[seq]
            x = layer(x, None, self._rope, None, ctx_keys=(k, v), block_offset=starts, mask=mask)
        return self.norm(x)

    def make_cache(self) -> list:
        from mlx_lm.models.cache import KVCache

        return [KVCache() for _ in self.layers]


def read_config(path: Path) -> dict:
    """The drafter's config.json through policy.config's reader, refused as a drafter format."""
    try:
        return config_file(path)
    except ConfigError as e:
        raise DrafterFormatError(str(e)) from None


def _weights(path: Path) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(mx.load(str(f)))
    return out


def load_model(path: Path, spec: DFlashSpec, config: dict, where: str) -> DFlashModel:
    """Build the network and load the checkpoint, refusing missing, extra or misshapen tensors."""
    from mlx.utils import tree_flatten

    weights = {k.removeprefix("model."): v for k, v in _weights(path).items()
               if "rotary_emb" not in k}
    model = DFlashModel(spec)
    q = config.get("quantization")
    if isinstance(q, dict) and any(k.endswith(".scales") for k in weights):
        nn.quantize(model, group_size=q.get("group_size", 64), bits=q.get("bits", 4),
                    mode=q.get("mode", "affine"),
                    class_predicate=lambda p, m: f"{p}.scales" in weights)
    want = dict(tree_flatten(model.parameters()))
    missing = sorted(set(want) - set(weights))
    if missing:
        raise DrafterFormatError(f"{where}: tensor {missing[0]} is missing"
                                 + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                                 + f"; not a {ARCHITECTURE} checkpoint of this config")
    extra = sorted(set(weights) - set(want))
    if extra:
        raise DrafterFormatError(f"{where}: unexpected tensor {extra[0]}"
                                 + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for k, v in weights.items():
        if tuple(v.shape) != tuple(want[k].shape):
            raise DrafterFormatError(f"{where}: tensor {k} has shape {tuple(v.shape)}, the config "
                                     f"implies {tuple(want[k].shape)}")
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    model.eval()
    return model


def load(path: Path, target: Any, target_config: dict, config: dict | None = None) -> DFlashModel:
    """A DFlash drafter for ``target``, from a local folder; DrafterFormatError names what is wrong.
    ``config``: the drafter's config.json as the pair load read it (engine.checkpoint.Checkpoint)."""
    where = f"DFlash drafter {path}"
    config = read_config(path) if config is None else config
    spec = parse_spec(config, where)
    check_against_target(spec, where, target_config, hidden.depth(target))
    return load_model(path, spec, config, where)


class DFlashDrafter:
    """The Drafter protocol for a DFlash model; ``forwards`` counts drafter forwards."""

    kind = DrafterKind.DFLASH

    def __init__(self, model: DFlashModel, target: Any):
        self.model = model
        self.target = target
        self.embed = hidden.embed(target)
        self.head = hidden.lm_head(target)
        self.cache = model.make_cache()
        self.layers = model.spec.target_layer_ids
        self.staged: list[mx.array] = []  # captured, not yet known to be committed
        self.context: list[mx.array] = []  # committed rows not yet in the draft cache
        self.pending: int | None = None
        self.forwards = 0
        self.received: list[mx.array] = []  # every context row block handed over (for tests)

    def watch(self, model: Any) -> hidden.Capture:
        """Wrap a target forward (prefill or verify) to capture the layers this drafter reads."""
        return hidden.Capture(model, self.layers, self._seen)

    def _seen(self, states: dict[int, mx.array]) -> None:
        self.staged.append(mx.concatenate([states[i] for i in self.layers], axis=-1))

    def prefill(self, prompt: mx.array) -> None:
        self.pending = int(prompt[-1].item())

    def propose(self, n: int) -> mx.array:
        # Whatever is staged now came from prefill: every row of it is committed.
        rows = self.context + self.staged
        self.context, self.staged = [], []
        k = n
        if k < 1:
            # Nothing drafted this round (an auto width of 1): the rows wait for the next draft.
            self.context = rows
            return mx.array([], mx.uint32)
        feats = None
        if rows:
            feats = rows[0] if len(rows) == 1 else mx.concatenate(rows, axis=1)
            self.received.append(feats)
        spec = self.model.spec
        block = mx.array([self.pending] + [spec.mask_token_id] * k, mx.uint32)
        x = self.embed(block[None])
        h = self.model(x, feats, self.cache)
        self.forwards += 1
        logits = self.head(h[:, 1:])
        return mx.argmax(logits[0], axis=-1).astype(mx.uint32)

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        if self.staged:
            verify = self.staged[0] if len(self.staged) == 1 else mx.concatenate(self.staged, axis=1)
            # Rows 0..accepted of the verify are the pending token and the accepted drafts.
            self.context.append(verify[:, : accepted + 1])
            self.staged = []
        self.pending = next_token
