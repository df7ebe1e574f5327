"""A Llama checkpoint written as mlx-lm's qwen2, so that it can be pipeline-split.

mlx-lm 0.32's llama model has ``shard(group)`` (tensor parallel) but no ``pipeline(group)``;
its qwen2 model has both, and is llama's function plus biases on the q/k/v projections. With
those biases zero the qwen2 form computes what the llama checkpoint computes (the demo target's
greedy tokens are the same, tests/test_distributed.py), so a pipeline split of it measures a
pipeline split of that target. The weights are linked or copied as they are, plus the zero
biases; the tokenizer files are copied (transformers then reads the folder with its Qwen2
tokenizer class: the same vocabulary, but a prompt may split into other tokens).

    python -m tests.qwen2_form SRC DST
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def write(src: Path, dst: Path) -> Path:
    import mlx.core as mx

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "llama":
        raise SystemExit(f"{src}: model_type {config.get('model_type')!r}, expected llama")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise SystemExit(f"{src}: has biases of its own; qwen2's are on q/k/v only")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy(f, dst / f.name)
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    head = config.get("head_dim") or config["hidden_size"] // heads
    files = sorted(src.glob("*.safetensors"))
    index: dict[str, str] = {}
    for i, f in enumerate(files):
        weights = mx.load(str(f))
        dtype = next((v.dtype for k, v in weights.items() if k.endswith("norm.weight")), mx.bfloat16)
        layers = {int(k.split(".")[2]) for k in weights if k.startswith("model.layers.") and ".self_attn.q_proj." in k}
        for layer in sorted(layers):
            for proj, n in (("q", heads), ("k", kv), ("v", kv)):
                weights[f"model.layers.{layer}.self_attn.{proj}_proj.bias"] = mx.zeros((n * head,), dtype)
        mx.save_safetensors(str(dst / f.name), weights, metadata={"format": "mlx"})
        index.update({k: f.name for k in weights})
        del weights
    if len(files) > 1:
        (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    a = ap.parse_args()
    print(write(a.src, a.dst))


if __name__ == "__main__":
    main()
