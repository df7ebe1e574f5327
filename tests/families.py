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

    from blockwidth.engine import demo

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


# Families whose tiny checkpoint mlx-lm itself cannot decode on this CPU, and why (the sweep
# lists them; everything else runs byte-identically or is refused at load).
CANNOT = {
    "bitnet": "its BitLinear layers run a Metal kernel only ([metal_kernel] No Metal back-end)",
    "olmo": "mlx-lm's olmo needs the ai2-olmo package",
    "prism_hadamard_qwen35": "needs a Hadamard rotation pack shipped with the checkpoint",
    "phi3small": "its block-sparse attention aborts the process inside MLX (heap corruption) on CPU",
    "muse_spark": "its layers run a Metal kernel only ([metal_kernel] No Metal back-end)",
}

# Families whose recurrent state cannot be replayed module by module, so a second forward of the
# kept rows advances it (engine.kvcache.Rollback's fallback), and why.
FALLBACK = {"baichuan_m1": "its conv state lives in a CacheList the attention reads directly"}

# Families refused at load, with the words the refusal names them by.
REFUSED = {
    "deepseek_v41": "layer 0 cache is LayerCache",  # a compressed window mlx-lm cannot trim
    # transformers (reading config.json for the tokenizer, as mlx_lm.load does) rejects its
    # conv_mixer layer type: mlx_lm.load refuses the same checkpoint
    "gear": "tokenizer cannot be loaded",
}

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

_SW = ["sliding_attention", "full_attention"] * 2
_YARN = {"type": "yarn", "rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 4096,
         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0}
_LLAMA4_ROPE = {"rope_theta": 10000.0, "rope_type": "default", "llama_4_scaling_beta": 0.1,
                "original_max_position_embeddings": 4096}
_DEEPSEEK = dict(n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
                 topk_group=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
                 qk_nope_head_dim=8, v_head_dim=16, moe_intermediate_size=32,
                 first_k_dense_replace=1, moe_layer_freq=1, routed_scaling_factor=1.0,
                 topk_method="noaux_tc", scoring_func="sigmoid", norm_topk_prob=True)

# Family by family, what TINY and the ModelArgs defaults leave wrong at these sizes.
OVERRIDES: dict[str, dict] = {
    "kimi_k3": dict(text_config=dict(
        model_type="kimi_linear", num_experts=4, num_experts_per_token=2, moe_intermediate_size=32,
        q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16,
        first_k_dense_replace=1,
        linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2, 4], "num_heads": 4,
                            "head_dim": 16, "short_conv_kernel_size": 4})),
    "llama4": dict(text_config=dict(attention_chunk_size=WINDOW, interleave_moe_layer_step=2,
                                    num_experts_per_tok=1,
                                    intermediate_size_mlp=128, rope_scaling=None, use_qk_norm=True,
                                    attention_bias=False)),
    "muse_spark": dict(text_config=dict(post_norm_eps=1e-8,
                                        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
                                        layer_rope_theta=[10000.0, 10000.0, 10000.0, 0],
                                        layer_types=_SW, final_logit_softcapping=20.0,
                                        output_multiplier=0.2, moe_hidden_size=32,
                                        moe_intermediate_size=32, num_local_experts=4,
                                        mlp_layer_types=["sparse"] * 4, num_shared_experts=0)),
    "minimax_m3_vl": dict(text_config=dict(moe_layer_freq=None, dense_intermediate_size=128,
                                           shared_intermediate_size=32, rotary_dim=8)),
    "gemma3n": dict(text_config=dict(
        num_kv_shared_layers=0, layer_types=_SW, activation_sparsity_pattern=[0.0] * 4,
        altup_num_inputs=2, altup_coef_clip=120.0, altup_correct_scale=True, altup_active_idx=0,
        laurel_rank=8, final_logit_softcapping=30.0)),
    "longcat_flash_ngram": dict(ffn_hidden_size=128, moe_topk=2, expert_ffn_hidden_size=32,
                                zero_expert_num=1, mla_scale_q_lora=True, mla_scale_kv_lora=True,
                                num_layers=2, ngram_vocab_size_ratio=2, emb_neighbor_num=2,
                                emb_split_num=2),
    "afm7": dict(hidden_dim=64, num_layers=4, num_kv_reuse_layers=1, num_heads=4, num_kv_heads=2),
    "afmoe": dict(layer_types=_SW, num_dense_layers=1, num_shared_experts=1, mup_enabled=False),
    "baichuan_m1": dict(sliding_window_layers=[0, 2], conv_window=2, num_swa_attention_heads=4,
                        num_swa_key_value_heads=2),
    "dbrx": dict(d_model=64, n_heads=4, n_layers=4,
                 ffn_config={"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2},
                 attn_config={"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 10000.0}),
    "deepseek_v2": dict(_DEEPSEEK, topk_method="greedy", rope_scaling=_YARN),
    "exaone4": dict(sliding_window_pattern="LG", layer_types=_SW, rope_scaling=None,
                    tie_word_embeddings=False),
    "exaone_moe": dict(layer_types=_SW, is_moe_layer=[False, True, True, True],
                       num_shared_experts=1),
    "falcon_h1": dict(mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16,
                      mamba_chunk_size=16, mamba_expand=1),
    "gear": dict(layer_types=["full_attention", "conv_mixer", "sliding_attention", "conv_mixer"],
                 sliding_window=WINDOW),
    "glm_moe_dsa": dict(_DEEPSEEK, index_head_dim=16, index_n_heads=2, index_topk=8,
                        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}),
    "gptj": dict(rotary_dim=8),
    "hunyuan": dict(moe_topk=2, num_experts=4, num_shared_expert=1, use_mixed_mlp_moe=True,
                    use_qk_norm=True, use_cla=False, cla_share_factor=1, moe_intermediate_size=32,
                    rope_scaling={"alpha": 1.0, "factor": 1.0, "type": "dynamic"}),
    "jamba": dict(attn_layer_offset=1, attn_layer_period=2, expert_layer_offset=1,
                  expert_layer_period=2, mamba_d_conv=4, mamba_d_state=16, mamba_expand=2),
    "kimi_linear": dict(linear_attn_config={"kda_layers": [1, 3], "full_attn_layers": [2, 4],
                                            "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4},
                        model_max_length=4096, qk_nope_head_dim=8, qk_rope_head_dim=8,
                        v_head_dim=16, num_experts_per_token=2, first_k_dense_replace=1),
    "llama4_text": dict(intermediate_size_mlp=128, no_rope_layers=[1, 1, 1, 0], use_qk_norm=True),
    "longcat_flash": dict(attention_method="MLA", zero_expert_type="identity", ffn_hidden_size=128,
                          moe_topk=2, expert_ffn_hidden_size=32, zero_expert_num=1,
                          mla_scale_q_lora=True, mla_scale_kv_lora=True, num_layers=2),
    "mamba2": dict(num_heads=8, head_dim=16, time_step_limit=[0.0, 1e9], time_step_rank="auto",
                   state_size=16, intermediate_size=128),
    "mellum": dict(layer_types=_SW, rope_parameters={t: {"rope_theta": 10000.0, "rope_type": "default"}
                                                    for t in ("sliding_attention", "full_attention")}),
    "mimo_v2_flash": dict(hybrid_layer_pattern=[1, 0, 1, 0], moe_layer_freq=[0, 1, 1, 1],
                          add_swa_attention_sink_bias=False, add_full_attention_sink_bias=False,
                          sliding_window_size=WINDOW, topk_method="noaux_tc", scoring_func="sigmoid",
                          layernorm_epsilon=1e-5, swa_rope_theta=10000.0, swa_num_attention_heads=4,
                          swa_num_key_value_heads=2, v_head_dim=16, swa_head_dim=16,
                          swa_v_head_dim=16, partial_rotary_factor=1),
    "minicpm3": dict(dim_model_base=64, scale_depth=1.0, scale_emb=1.0, rope_scaling={}),
    "mistral4": dict(_DEEPSEEK, rope_parameters=dict(_LLAMA4_ROPE, **_YARN)),
    "ministral3": dict(rope_parameters=_LLAMA4_ROPE, layer_types=_SW, sliding_window=WINDOW),
    "nemotron-nas": dict(block_configs=[{"attention": {"n_heads_in_group": 2},
                                         "ffn": {"ffn_mult": 2.0}}] * 4),
    "openelm": dict(num_transformer_layers=4, model_dim=64, ffn_dim_divisor=16,
                    num_query_heads=[4] * 4, num_kv_heads=[2] * 4, ffn_multipliers=[2.0] * 4),
    "phi3small": dict(dense_attention_every_n_layers=2, ff_intermediate_size=128, gegelu_limit=20.0,
                      blocksparse_block_size=32, blocksparse_num_local_blocks=1,
                      blocksparse_vert_stride=1, mup_width_multiplier=1.0),
    "phixtral": dict(num_vocab=VOCAB, model_dim=64, num_heads=4, rotary_dim=8),
    "plamo": dict(n_shared_head=2),
    "qwen": dict(kv_channels=16),
    "recurrent_gemma": dict(conv1d_width=4, logits_soft_cap=30.0, attention_window_size=WINDOW,
                            block_types=["recurrent", "recurrent", "attention"], num_hidden_layers=3,
                            num_key_value_heads=1),
    "spark2_5": dict(layer_types=_SW, rope_parameters={t: {"rope_theta": 10000.0, "rope_type": "default"}
                                                      for t in ("sliding_attention", "full_attention")}),
    "step3p5": dict(num_attention_groups=2, moe_num_experts=4, moe_top_k=2, moe_intermediate_size=32,
                    share_expert_dim=32, layer_types=_SW),
}


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


def _args(cls, model_type: str) -> dict:
    """TINY for the fields of dataclass ``cls``, a guess by type for its other required ones."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    cfg: dict[str, Any] = {"model_type": model_type} if "model_type" in fields else {}
    for k, v in TINY.items():
        if k in fields:
            cfg[k] = json.loads(json.dumps(v))
    for k, f in fields.items():
        if k not in cfg and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            cfg[k] = _fill(f)
    return cfg


_TEXT_ARGS = ("TextArgs", "TextConfig", "TextModelArgs")


def tiny_config(model_type: str) -> dict:
    """A tiny config for ``model_type`` from its ModelArgs: TINY by field name, OVERRIDES, and a
    guess by type for required fields left over. A multimodal wrapper's language model (its
    text_config) gets the same from the module's text arguments class, or from the family it
    names (``{model_type}_text``), and OVERRIDES[model_type]["text_config"] on top."""
    if model_type in NAMED:
        return json.loads(json.dumps(NAMED[model_type]))
    mod = module_of(model_type)
    cfg = _args(mod.ModelArgs, model_type)
    over = json.loads(json.dumps(OVERRIDES.get(model_type, {})))
    text_over = over.pop("text_config", {})
    if "text_config" in {f.name for f in dataclasses.fields(mod.ModelArgs)}:
        own = next((getattr(mod, n) for n in _TEXT_ARGS if hasattr(mod, n)), None)
        inner = f"{model_type}_text"
        if own is not None:
            text = _args(own, model_type)
        elif inner in NAMED or _exists(inner):
            text = tiny_config(inner)
            text["model_type"] = inner
        else:
            text = dict(TINY, model_type=model_type)
        for k, v in TINY.items():
            text.setdefault(k, json.loads(json.dumps(v)))
        text.update(text_over)
        cfg["text_config"] = text
    cfg.update(over)
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
    pattern a seed fixes. An instrument for testing rewinds, not a drafter anyone would run.

    With ``inner`` (a DFlash or MTP drafter), the inner drafter still runs every round (its
    forward, its reading of the target's hidden states, its commit) and its own token stands
    wherever this one does not agree: its state follows rounds that accept as well as reject."""

    def __init__(self, reference: list[int], agree: float = 0.75, seed: int = 0, vocab: int = VOCAB,
                 inner=None):
        import random

        from blockwidth.policy.drafter import DrafterKind

        self.inner = inner
        self.kind = inner.kind if inner is not None else DrafterKind.MODEL
        if inner is not None and hasattr(inner, "watch"):
            self.watch = inner.watch
        self.reference = list(reference)
        self.agree = agree
        self.rng = random.Random(seed)
        self.vocab = vocab
        self.done = 0  # reference tokens committed

    def prefill(self, prompt) -> None:
        self.done = 0
        if self.inner is not None:
            self.inner.prefill(prompt)

    def propose(self, n: int):
        import mlx.core as mx

        own = self.inner.propose(n).tolist() if self.inner is not None else []
        out = []
        for i in range(n):
            j = self.done + 1 + i  # the verify's row 0 is reference[done]; drafts follow it
            t = self.reference[j] if j < len(self.reference) else 0
            if self.rng.random() >= self.agree:
                wrong = own[i] if i < len(own) and own[i] != t else None
                t = wrong if wrong is not None else (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            out.append(t)
        return mx.array(out, mx.uint32)

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        self.done += accepted + 1
        if self.inner is not None:
            self.inner.commit(drafted, accepted, next_token)
