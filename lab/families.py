"""Tiny random checkpoints of the model families mlx-lm ships, built with mlx-lm's own classes.

``NAMED`` holds hand-made configs of the families the product is measured on (recurrent state,
sliding windows small enough that a short run leaves them, MoE); ``tiny_config`` makes a config
for any other mlx-lm model module from its ``ModelArgs`` (sizes shrunk by name, the rest from
``OVERRIDES``), for the compatibility sweep. ``write`` saves a checkpoint mlx-lm and blockwidth
load: config.json, model.safetensors and the demo tokenizer.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
import shutil
from pathlib import Path
from typing import Any

VOCAB = 2048  # the demo tokenizer's
WINDOW = 16  # sliding windows in the tiny configs: a 48-token run leaves them

_ATTN = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=VOCAB, max_position_embeddings=4096, tie_word_embeddings=False)

# Published layouts (text_config nesting for qwen3_5, as its checkpoints are) at tiny sizes.
NAMED: dict[str, dict] = {
    "llama": dict(_ATTN, model_type="llama", num_hidden_layers=2, intermediate_size=128,
                  rms_norm_eps=1e-5, rope_theta=10000.0),
    "qwen3_5": {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": dict(_ATTN, model_type="qwen3_5_text", num_hidden_layers=4,
                                    intermediate_size=128, rms_norm_eps=1e-6,
                                    linear_num_value_heads=4, linear_num_key_heads=2,
                                    linear_key_head_dim=16, linear_value_head_dim=16,
                                    linear_conv_kernel_dim=4, full_attention_interval=2,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 0.25})},
    "qwen3_next": dict(_ATTN, model_type="qwen3_next", num_hidden_layers=4, intermediate_size=128,
                       linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
                       linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4,
                       num_experts_per_tok=2, decoder_sparse_step=1, shared_expert_intermediate_size=32,
                       mlp_only_layers=[], moe_intermediate_size=32, rms_norm_eps=1e-6,
                       rope_theta=10000.0, partial_rotary_factor=0.25, full_attention_interval=2,
                       norm_topk_prob=True),
    "lfm2": dict(_ATTN, model_type="lfm2", num_hidden_layers=4, norm_eps=1e-5, conv_bias=False,
                 conv_L_cache=3, block_dim=64, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                 block_auto_adjust_ff_dim=False, block_ff_dim=128, full_attn_idxs=[1, 3]),
    "nemotron_h": dict(_ATTN, model_type="nemotron_h", intermediate_size=128, attention_bias=False,
                       mamba_num_heads=4, mamba_head_dim=16, mamba_proj_bias=False,
                       ssm_state_size=16, conv_kernel=4, n_groups=1, mlp_bias=False,
                       layer_norm_epsilon=1e-5, use_bias=False, use_conv_bias=True,
                       hybrid_override_pattern=["M", "*", "M", "-"]),
    "granitemoehybrid": dict(_ATTN, model_type="granitemoehybrid", num_hidden_layers=4,
                             intermediate_size=128, attention_bias=False, embedding_multiplier=1.0,
                             attention_multiplier=0.25, logits_scaling=1.0, residual_multiplier=1.0,
                             layer_types=["mamba", "attention", "mamba", "attention"],
                             rms_norm_eps=1e-5, num_local_experts=4, num_experts_per_tok=2,
                             shared_intermediate_size=64, mamba_n_heads=8, mamba_d_head=16,
                             mamba_expand=2, mamba_proj_bias=False, mamba_d_state=16, mamba_d_conv=4,
                             mamba_n_groups=1, mamba_conv_bias=True),
    "gemma3_text": dict(_ATTN, model_type="gemma3_text", num_hidden_layers=4, intermediate_size=128,
                        rms_norm_eps=1e-6, query_pre_attn_scalar=16, sliding_window=WINDOW,
                        sliding_window_pattern=2, rope_theta=10000.0, rope_local_base_freq=10000.0),
    "gemma4_text": dict(_ATTN, model_type="gemma4_text", num_hidden_layers=4, intermediate_size=128,
                        global_head_dim=32, num_kv_shared_layers=2, hidden_size_per_layer_input=8,
                        vocab_size_per_layer_input=VOCAB, sliding_window=WINDOW,
                        sliding_window_pattern=2, use_double_wide_mlp=False,
                        tie_word_embeddings=True,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                     "full_attention"]),
    "laguna": dict(_ATTN, model_type="laguna", num_hidden_layers=4, intermediate_size=128,
                   sliding_window=WINDOW, num_experts=4, num_experts_per_tok=2,
                   moe_intermediate_size=32, shared_expert_intermediate_size=32,
                   layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                "full_attention"]),
    "gpt_oss": dict(_ATTN, model_type="gpt_oss", num_hidden_layers=4, intermediate_size=64,
                    num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                    rope_theta=10000.0,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                 "full_attention"]),
    "cohere2": dict(_ATTN, model_type="cohere2", num_hidden_layers=4, intermediate_size=128,
                    layer_norm_eps=1e-5, sliding_window=WINDOW, sliding_window_pattern=2,
                    rope_theta=10000.0),
    "muse_glimmer": dict(_ATTN, model_type="muse_glimmer", num_hidden_layers=4,
                         intermediate_size=128, sliding_window=WINDOW,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                      "full_attention"]),
}

# MoE routing on bfloat16 ties on this CPU more often than not: these are written in float32.
FLOAT32 = {"qwen3_next", "granitemoehybrid", "laguna", "gpt_oss", "nemotron_h"}


def module_of(model_type: str):
    return importlib.import_module(f"mlx_lm.models.{model_type}")


def build(config: dict, seed: int = 0, dtype: str | None = None):
    """mlx-lm's model of ``config`` with random weights (``dtype``: float32, bfloat16; default by
    family), as mlx-lm would hold it after loading."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path

    from mlx_lm.utils import _get_classes

    mx.random.seed(seed)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(json.loads(json.dumps(config))))
    dt = getattr(mx, dtype or ("float32" if config["model_type"] in FLOAT32 else "bfloat16"))
    keep = getattr(model, "cast_predicate", None) or (lambda path: True)  # A_log stays float32

    def cast(path, p):
        return p.astype(dt) if mx.issubdtype(p.dtype, mx.floating) and keep(path) else p

    model.update(tree_map_with_path(cast, model.parameters()))
    mx.eval(model.parameters())
    model.eval()
    return model


def write(out: Path, config: dict, seed: int = 0, dtype: str | None = None, model=None,
          tokenizer: Path | None = None, extra: dict | None = None) -> Path:
    """A checkpoint folder: config.json, model.safetensors (plus ``extra`` tensors, e.g. MTP
    layers mlx-lm drops at load) and the demo tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine import demo

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else build(config, seed, dtype)
    weights = dict(tree_flatten(model.parameters()))
    weights.update(extra or {})
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = dict(config)
    dt = dtype or ("float32" if config["model_type"] in FLOAT32 else "bfloat16")
    cfg.setdefault("torch_dtype", dt)
    cfg.setdefault("eos_token_id", 0)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    tok = Path(tokenizer or demo.target("bf16"))
    for f in tok.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    return out


# ---------------------------------------------------------------------------------------------
# Every family: a tiny config from its ModelArgs


NOT_FAMILIES = {"base", "cache", "activations", "rope_utils", "switch_layers", "pipeline",
                "gated_delta", "ssm", "mla", "bitlinear_layers"}

# Sizes shrunk by field name wherever a ModelArgs has the field.
TINY: dict[str, Any] = dict(
    _ATTN, intermediate_size=128, num_hidden_layers=4, rms_norm_eps=1e-5, norm_eps=1e-5,
    layer_norm_eps=1e-5, layer_norm_epsilon=1e-5, rope_theta=10000.0, moe_intermediate_size=32,
    num_experts=4, num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2,
    shared_expert_intermediate_size=32, n_shared_experts=1, sliding_window=WINDOW,
    kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    first_k_dense_replace=1, moe_layer_freq=1, n_group=1, topk_group=1, routed_scaling_factor=1.0,
    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
    linear_value_head_dim=16, linear_conv_kernel_dim=4, decoder_sparse_step=1, mlp_only_layers=[],
    norm_topk_prob=True, attention_bias=False, mlp_bias=False, embedding_multiplier=1.0,
    attention_multiplier=0.25, logits_scaling=1.0, residual_multiplier=1.0, use_bias=False,
    use_conv_bias=True, mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, conv_kernel=4,
    n_groups=1, mamba_proj_bias=False, time_step_rank=4, state_size=16, global_head_dim=32,
    hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=0,
    max_window_layers=4, n_layer=4, n_head=4, n_embd=64, n_positions=4096, d_model=64, n_layers=4,
    n_heads=4, num_layers=4, block_dim=64, block_ff_dim=128, block_multiple_of=16,
    block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False, conv_bias=False, conv_L_cache=3,
    full_attn_idxs=[1, 3], query_pre_attn_scalar=16, sliding_window_pattern=2,
    rope_local_base_freq=10000.0, attention_window_size=WINDOW, loop_window_size=WINDOW,
    sliding_window_size=WINDOW, window_size=WINDOW, attention_chunk_size=WINDOW,
    shared_intermediate_size=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
    mamba_d_conv=4, mamba_n_groups=1, mamba_expand=2, mamba_conv_bias=True,
    moe_shared_expert_intermediate_size=32, num_shared_experts=1, moe_num_experts=4,
    moe_topk=2, moe_k=2, top_k=2, num_experts_per_token=2, expert_intermediate_size=32,
    intermediate_size_mlp=128, partial_rotary_factor=1.0,
)

# Family by family, what TINY and the ModelArgs defaults leave wrong at these sizes.
OVERRIDES: dict[str, dict] = {}


def families() -> list[str]:
    """Every model module mlx-lm ships (model_type names)."""
    import mlx_lm.models as M

    return sorted(m.name for m in pkgutil.iter_modules(M.__path__) if m.name not in NOT_FAMILIES)


def _fill(f) -> Any:
    t = str(f.type)
    if "float" in t:
        return 1.0
    if "bool" in t:
        return False
    if "int" in t:
        return 4
    if "str" in t:
        return ""
    return None


def tiny_config(model_type: str) -> dict:
    """A tiny config for ``model_type`` from its ModelArgs: TINY by field name, OVERRIDES, and a
    guess by type for required fields left over; nested text_config for multimodal wrappers."""
    if model_type in NAMED:
        return json.loads(json.dumps(NAMED[model_type]))
    mod = module_of(model_type)
    fields = {f.name: f for f in dataclasses.fields(mod.ModelArgs)}
    cfg: dict[str, Any] = {"model_type": model_type}
    for k, v in TINY.items():
        if k in fields:
            cfg[k] = v
    for k, f in fields.items():
        if k not in cfg and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            cfg[k] = _fill(f)
    if "text_config" in fields:
        inner = OVERRIDES.get(model_type, {}).get("text_config_type") or f"{model_type}_text"
        base = tiny_config(inner) if (inner in NAMED or _exists(inner)) else {}
        base.pop("model_type", None)
        cfg["text_config"] = dict(TINY, **base)
        cfg["text_config"]["model_type"] = inner
    cfg.update({k: v for k, v in OVERRIDES.get(model_type, {}).items() if k != "text_config_type"})
    return cfg


def _exists(model_type: str) -> bool:
    try:
        module_of(model_type)
        return True
    except Exception:
        return False


class AgreeingDrafter:
    """A drafter that proposes the reference (classic) continuation, each token kept with
    probability ``agree`` and otherwise replaced: rounds that accept and rounds that reject, in a
    pattern a seed fixes. An instrument for testing rewinds, not a drafter anyone would run."""

    def __init__(self, reference: list[int], agree: float = 0.75, seed: int = 0, vocab: int = VOCAB):
        import random

        from policy.drafter import DrafterKind

        self.kind = DrafterKind.MODEL
        self.reference = list(reference)
        self.agree = agree
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.done = 0  # reference tokens committed

    def prefill(self, prompt) -> None:
        self.done = 0

    def propose(self, n: int):
        import mlx.core as mx

        out = []
        for i in range(n):
            j = self.done + 1 + i  # the verify's row 0 is reference[done]; drafts follow it
            t = self.reference[j] if j < len(self.reference) else 0
            if self.rng.random() >= self.agree:
                t = (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            out.append(t)
        return mx.array(out, mx.uint32)

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        self.done += accepted + 1
