"""Write a random-weight Llama checkpoint of a real model's shape, for cost curves.

A verify's cost depends on shapes and the quantized kernel, not on what the
weights say, so a random checkpoint shows a device's kernel boundaries without
downloading a model:

    python -m lab.synthetic --shape 8b --quant affine-4 --out /tmp/fake-8b
    blockwidth costcurve --target /tmp/fake-8b

Its tokens are meaningless: use it for ``costcurve``, never for ``sweep``.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

SHAPES = {
    "tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=512,
                 num_attention_heads=4, num_key_value_heads=2),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
               num_attention_heads=32, num_key_value_heads=8),
    "4b": dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728,
               num_attention_heads=32, num_key_value_heads=8),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, intermediate_size=14336,
               num_attention_heads=32, num_key_value_heads=8),
}
QUANTS = {"bf16": None, "affine-4": ("affine", 4, 64), "affine-8": ("affine", 8, 64),
          "mxfp4": ("mxfp4", 4, 32), "nvfp4": ("nvfp4", 4, 16), "mxfp8": ("mxfp8", 8, 32)}


def build(shape: str, quant: str):
    """A random-weight Llama of ``shape`` (SHAPES) quantized as ``quant`` (QUANTS), in memory:
    (model, config). The same seed and scale every time, so a probe and a saved checkpoint of
    one shape hold the same weights."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.models import llama
    from mlx_lm.utils import quantize_model

    mx.random.seed(0)
    config = dict(model_type="llama", rms_norm_eps=1e-5, vocab_size=2048, rope_theta=500000.0,
                  max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16",
                  architectures=["LlamaForCausalLM"], eos_token_id=0, bos_token_id=0,
                  **SHAPES[shape])
    model = llama.Model(llama.ModelArgs.from_dict(config))
    model.update(tree_map(lambda p: (p * 0.02).astype(mx.bfloat16) if p.ndim > 1 else p.astype(mx.bfloat16),
                          model.parameters()))
    q = QUANTS[quant]
    if q:
        mode, bits, group = q
        model, config = quantize_model(model, config, group_size=group, bits=bits, mode=mode)
    return model, config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="tiny")
    ap.add_argument("--quant", choices=QUANTS, default="affine-4")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config

    from blockwidth.engine import demo

    model, config = build(args.shape, args.quant)
    args.out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(args.out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    save_config(config, args.out / "config.json")
    for f in demo.DRAFTER.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, args.out / f.name)
    print(f"wrote {args.out}: {args.shape}-shaped Llama, {args.quant}, random weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
