"""Tiny checkpoints in the published drafter formats, for the tests (and for lab.build_drafters,
which writes its trained drafters with the same code): a DFlash drafter (``DFlashDraftModel``,
z-lab's layout) and separate MTP heads in the DeepSeek-V3, Qwen 3.5 and MiMo layouts, with
random weights or a given model's."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from blockwidth.policy.config import size, text

BLOCK = 16
DFLASH_LAYERS = (1, 3, 5)


def dflash_config(target_config: dict, *, layers: tuple[int, ...] = DFLASH_LAYERS, n_layers: int = 2,
                  block: int = BLOCK, mask: int | None = None) -> dict:
    """A DFlashDraftModel config for ``target_config``, laid out as z-lab's published ones."""
    t = text(target_config)  # a multimodal target's sizes are under text_config
    heads = t["num_attention_heads"]
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block,
        "dflash_config": {"mask_token_id": t["vocab_size"] - 1 if mask is None else mask,
                          "target_layer_ids": list(layers)},
        "hidden_size": t["hidden_size"], "num_hidden_layers": n_layers,
        "num_attention_heads": heads, "num_key_value_heads": t.get("num_key_value_heads", heads),
        "head_dim": t["hidden_size"] // heads, "intermediate_size": t["intermediate_size"],
        "vocab_size": t["vocab_size"], "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "rope_theta": t.get("rope_theta", 10000.0), "rope_scaling": None,
        "max_position_embeddings": t.get("max_position_embeddings", 2048),
        "num_target_layers": t["num_hidden_layers"], "layer_types": ["full_attention"] * n_layers,
        "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def write_dflash(out: Path, config: dict, model=None, seed: int = 0) -> Path:
    """Write a DFlash checkpoint (``model``'s weights, or random ones)."""
    from blockwidth.engine.dflash import DFlashModel, parse_spec

    if model is None:
        mx.random.seed(seed)
        model = DFlashModel(parse_spec(config, str(out)))
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def mtp_config(target_config: dict, heads: int = 1) -> dict:
    """A separate NextN head checkpoint's config: the target's, plus the head count."""
    c = {k: v for k, v in target_config.items() if k not in ("quantization", "quantization_config")}
    arch = (target_config.get("architectures") or ["LlamaForCausalLM"])[0]
    c.update(architectures=[f"{arch}NextN"], num_nextn_predict_layers=heads)
    return c


def mtp_names(layout: str, target_config: dict, head: int = 0) -> dict[str, str]:
    """Published prefix and names of one head's own tensors in ``layout``."""
    n = size(target_config, "num_hidden_layers")
    if layout == "deepseek-v3":
        return {"prefix": f"model.layers.{n + head}.", "enorm": "enorm", "hnorm": "hnorm",
                "proj": "eh_proj", "norm": "shared_head.norm", "block": ""}
    if layout == "qwen3.5":
        return {"prefix": "mtp.", "enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden",
                "proj": "fc", "norm": "norm", "block": "layers.0."}
    return {"prefix": f"model.mtp_layers.{head}.", "enorm": "token_layernorm",
            "hnorm": "hidden_layernorm", "proj": "input_proj", "norm": "final_layernorm", "block": ""}


def mtp_head(target_config: dict):
    from blockwidth.engine.mtp import HYBRID_BLOCKS, Head, Layout, build_block

    layout = Layout.QWEN35 if target_config.get("model_type") in HYBRID_BLOCKS else Layout.DEEPSEEK
    return Head(size(target_config, "hidden_size"), float(size(target_config, "rms_norm_eps", 1e-6)),
                [build_block(target_config, "demo")], layout)


def mtp_tensors(head, layout: str, target_config: dict, index: int = 0) -> dict[str, mx.array]:
    names = mtp_names(layout, target_config, index)
    out = {}
    for k, v in tree_flatten(head.parameters()):
        top, rest = k.split(".", 1)
        if top == "blocks":
            rest = rest.split(".", 1)[1]
            name = names["block"] + rest
        else:
            name = names[top] + "." + rest
        out[names["prefix"] + name] = v.astype(mx.bfloat16)
    return out


def write_mtp(out: Path, target_config: dict, head=None, layout: str = "deepseek-v3", seed: int = 0,
              config: dict | None = None) -> Path:
    """Write a separate MTP head checkpoint in ``layout`` (``head``'s weights, or random ones)."""
    if head is None:
        mx.random.seed(seed)
        head = mtp_head(target_config)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config or mtp_config(target_config)
    if layout == "qwen3.5":
        cfg = dict(cfg)
        cfg.pop("num_nextn_predict_layers", None)
        cfg["mtp_num_hidden_layers"] = 1
    mx.save_safetensors(str(out / "model.safetensors"), mtp_tensors(head, layout, target_config),
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
