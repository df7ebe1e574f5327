"""Classify a checkpoint's quantization from its parsed ``config.json``.

The target's quantization keys the width policy because it picks the verify
kernel. ``classify`` is a pure function of the parsed JSON (and of ModelOpt's
sidecar ``hf_quant_config.json`` when one exists); ``read_quantization`` is the
thin file reader.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from blockwidth.policy.config import ConfigError, read_config, read_sidecar, remote_code  # noqa: F401 (their home)
from blockwidth.policy.config import text as text_config
from blockwidth.policy.integers import IntegerError, parse_int


class Scheme(str, Enum):
    NONE = "none"
    AFFINE = "affine"
    MXFP4 = "mxfp4"
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"
    FP8 = "fp8"
    GPTQ = "gptq"
    AWQ = "awq"
    BITSANDBYTES = "bitsandbytes"
    HQQ = "hqq"
    INT = "int"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Quantization:
    """What a checkpoint's weights are stored as, and how that was read."""

    scheme: Scheme
    bits: int | None = None
    group_size: int | None = None
    dtype: str | None = None  # activation / unquantized dtype where the config says
    detail: str = ""  # how it was read; for unknown, why

    def describe(self) -> str:
        """Short operator-facing words: ``affine 4-bit g64``, ``none (bfloat16)``."""
        if self.scheme is Scheme.NONE:
            return f"unquantized {self.dtype}" if self.dtype else "unquantized"
        if self.scheme is Scheme.UNKNOWN:
            return "unknown quantization"
        parts = [self.scheme.value]
        if self.bits is not None:
            parts.append(f"{self.bits}-bit")
        if self.group_size is not None:
            parts.append(f"g{self.group_size}")
        return " ".join(parts)

    def with_tensors(self, dtype: str | None) -> "Quantization":
        """An unquantized checkpoint's words from its tensors' dtype (engine.checkpoint's
        tensor_dtypes) where config.json says another: a float32 copy whose config kept
        ``torch_dtype: bfloat16`` is not bfloat16, and on a CPU the two cost differently."""
        if self.scheme is not Scheme.NONE or not dtype or dtype == self.dtype:
            return self
        said = f"config.json says {self.dtype}" if self.dtype else "config.json says no dtype"
        return replace(self, dtype=dtype, detail=f"{self.detail}; tensors {dtype}, {said}".lstrip("; "))

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme.value,
            "bits": self.bits,
            "group_size": self.group_size,
            "dtype": self.dtype,
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Quantization:
        """The value ``to_dict`` wrote (a record's ``target_quantization``); a KeyError or
        ValueError when ``d`` is not one (a scheme this version does not know)."""
        return cls(Scheme(d["scheme"]), d.get("bits"), d.get("group_size"), d.get("dtype"),
                   d.get("detail") or "")

    def key(self) -> tuple[str, int | None, int | None]:
        """What a profile entry or table row matches on."""
        return (self.scheme.value, self.bits, self.group_size)


_DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16, "float64": 64}
_MLX_MODES = {
    "affine": (Scheme.AFFINE, None, 64),
    "mxfp4": (Scheme.MXFP4, 4, 32),
    "nvfp4": (Scheme.NVFP4, 4, 16),
    "mxfp8": (Scheme.MXFP8, 8, 32),
}
# Scheme names a config may give as a bare string (e.g. ``"quantization": "nvfp4"``).
_NAMED = {
    "fp8": (Scheme.FP8, 8, None), "nvfp4": (Scheme.NVFP4, 4, 16),
    "mxfp4": (Scheme.MXFP4, 4, 32), "mxfp8": (Scheme.MXFP8, 8, 32),
    "int4": (Scheme.INT, 4, None), "int8": (Scheme.INT, 8, None),
    "w4a16_awq": (Scheme.AWQ, 4, None), "w4a8_awq": (Scheme.AWQ, 4, None),
    "affine": (Scheme.AFFINE, None, 64), "gptq": (Scheme.GPTQ, None, None),
    "awq": (Scheme.AWQ, None, None), "hqq": (Scheme.HQQ, None, None),
    "bitsandbytes": (Scheme.BITSANDBYTES, None, None),
}


def _bits(text: str) -> int | None:
    """The bits in a name like quanto's ``int4`` (None where they are not a number)."""
    try:
        return parse_int(text, 1, 64, signed=False)
    except IntegerError:
        return None


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return None


def _dtype(config: Mapping[str, Any]) -> str | None:
    for key in ("torch_dtype", "dtype"):
        v = config.get(key)
        if isinstance(v, str):
            return v.replace("torch.", "")
    text = config.get("text_config")
    if isinstance(text, Mapping):
        return _dtype(text)
    return None


def _mlx_block(q: Any, dtype: str | None, where: str) -> Quantization:
    if isinstance(q, str):
        named = _NAMED.get(q.lower())
        if named:
            s, b, g = named
            return Quantization(s, b, g, dtype, f"{where} names {q!r}")
        return Quantization(Scheme.UNKNOWN, None, None, dtype, f"{where} is the string {q!r}")
    if not isinstance(q, Mapping):
        return Quantization(Scheme.UNKNOWN, None, None, dtype,
                            f"{where} is a {type(q).__name__}, not a table")
    mode = q.get("mode", "affine")
    if not isinstance(mode, str) or mode.lower() not in _MLX_MODES:
        return Quantization(Scheme.UNKNOWN, _int(q.get("bits")), _int(q.get("group_size")),
                            dtype, f"{where} has mode {mode!r}, which MLX does not define")
    scheme, default_bits, default_group = _MLX_MODES[mode.lower()]
    bits = _int(q.get("bits")) or default_bits
    group = _int(q.get("group_size")) or default_group
    # Per-module entries are tables (or false) keyed by a module path.
    overrides = {k: v for k, v in q.items() if isinstance(v, (Mapping, bool))}
    detail = f"MLX {where} (mode {mode})"
    if overrides:
        skipped = sum(1 for v in overrides.values() if v is False)
        other = Counter()
        for v in overrides.values():
            if isinstance(v, Mapping):
                ob = _int(v.get("bits")) or bits
                om = v.get("mode", mode)
                if (ob, om) != (bits, mode):
                    other[f"{om} {ob}-bit"] += 1
        notes = []
        if other:
            notes.append("mixed: " + ", ".join(f"{n} modules {k}" for k, n in sorted(other.items())))
        if skipped:
            notes.append(f"{skipped} modules unquantized")
        if notes:
            detail += "; " + "; ".join(notes)
    if bits is None and scheme is Scheme.AFFINE:
        return Quantization(Scheme.UNKNOWN, None, group, dtype, f"{where} has no bits")
    return Quantization(scheme, bits, group, dtype, detail)


def _dims(config: Mapping[str, Any] | None) -> dict[str, int]:
    """The sizes that set how many weights each module holds (text_config for multimodal)."""
    if not isinstance(config, Mapping):
        return {}
    src = text_config(config)
    keys = {"hidden": "hidden_size", "inter": "intermediate_size", "moe_inter": "moe_intermediate_size",
            "heads": "num_attention_heads", "kv": "num_key_value_heads", "head_dim": "head_dim",
            "vocab": "vocab_size", "layers": "num_hidden_layers", "experts": "num_experts",
            "local_experts": "num_local_experts", "routed_experts": "n_routed_experts"}
    d = {k: v for k, name in keys.items() if isinstance(v := src.get(name), int) and v > 0}
    if "hidden" in d and "heads" in d:
        d.setdefault("head_dim", d["hidden"] // d["heads"])
        d.setdefault("kv", d["heads"])
    return d


def _module_weights(name: str, d: Mapping[str, int]) -> int:
    """Weights in a module, from its name and the config's sizes: q/k/v/o projections, MLP
    projections (expert ones at moe_intermediate_size), lm_head. 1 where the sizes are unknown,
    which makes the share a count of modules."""
    h = d.get("hidden")
    if not h:
        return 1
    leaf = name.rsplit(".", 1)[-1]
    q = d.get("heads", 1) * d.get("head_dim", h)
    kv = d.get("kv", 1) * d.get("head_dim", h)
    inter = d.get("moe_inter" if "expert" in name else "inter", 4 * h)
    sizes = {"q_proj": h * q, "k_proj": h * kv, "v_proj": h * kv, "o_proj": q * h,
             "qkv_proj": h * (q + 2 * kv), "gate_proj": h * inter, "up_proj": h * inter,
             "down_proj": inter * h, "gate_up_proj": 2 * h * inter, "w1": h * inter, "w2": inter * h,
             "w3": h * inter, "fc1": h * inter, "fc2": inter * h,
             "lm_head": h * d.get("vocab", h), "embed_tokens": h * d.get("vocab", h),
             # a module holding every expert of a layer ("...mlp.experts"): each a gate, up and down
             "experts": 3 * h * d.get("moe_inter", inter) * (d.get("experts") or d.get("local_experts")
                                                            or d.get("routed_experts") or 1)}
    return sizes.get(leaf, h * h)


_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _model_modules(d: Mapping[str, int]) -> list[str]:
    """The linear modules of a decoder of these sizes, named as HF names them."""
    n = d.get("layers", 1)
    attn = [f"model.layers.{i}.self_attn.{m}" for i in range(n) for m in _LINEAR[:4]]
    mlp = [f"model.layers.{i}.mlp.{m}" for i in range(n) for m in _LINEAR[4:]]
    return attn + mlp + ["lm_head"]


def _claims(target: str, module: str) -> bool:
    import fnmatch
    import re

    if any(c in target for c in "*?[") and not target.startswith("re:"):  # ModelOpt's globs: "mtp*"
        return fnmatch.fnmatchcase(module, target)
    if target.startswith("re:"):
        try:
            return re.fullmatch(target[3:], module) is not None or re.search(target[3:], module) is not None
        except re.error:
            return False
    return module == target or module.endswith("." + target) or module.startswith(target + ".")


def _dominant(groups: list[tuple[Quantization, list[str]]], config: Mapping[str, Any] | None,
              ignore: list[str], how: str) -> tuple[Quantization, str]:
    """The group that stores most of the weights, and the mix in words.

    The verify kernel that moves most of the weights sets the width, so a few FP8 attention
    projections beside NVFP4 MLPs and lm_head is an NVFP4 checkpoint. Each group's targets
    are module names, ``re:`` patterns, or a class name such as ``Linear`` (every linear
    module no other group names); modules are sized from the config (``_module_weights``).
    """
    d = _dims(config)
    named = [t for _, targets in groups for t in targets if "." in t or t.startswith("re:")]
    literal = [t for t in named if not t.startswith("re:") and not any(c in t for c in "*?[")]
    modules = list(dict.fromkeys(_model_modules(d) + literal))
    modules = [m for m in modules if not any(_claims(i, m) for i in ignore)]
    owner: dict[str, int] = {}
    for gi, (_, targets) in enumerate(groups):  # specific targets first
        for m in modules:
            if m not in owner and any(("." in t or t.startswith("re:")) and _claims(t, m) for t in targets):
                owner[m] = gi
    for gi, (_, targets) in enumerate(groups):  # then class names take what is left
        if any("." not in t and not t.startswith("re:") for t in targets):
            for m in modules:
                if m not in owner and (m != "lm_head" or "lm_head" in targets):
                    owner[m] = gi
    weight = [0] * len(groups)
    for m, gi in owner.items():
        weight[gi] += _module_weights(m, d)
    total = sum(weight)
    if total == 0:  # nothing sized: the groups as given, first one
        weight = [1] * len(groups)
        total = len(groups)
    top = max(range(len(groups)), key=lambda i: (weight[i], -(groups[i][0].bits or 99)))
    basis = "weights sized from config.json" if d.get("hidden") else "modules counted (no sizes in config.json)"
    mix = ", ".join(f"{q.describe()} {100 * w / total:.0f}%" for (q, _), w in
                    sorted(zip(groups, weight), key=lambda gw: -gw[1]))
    return groups[top][0], f"{how}, mixed: {mix} of quantized weights ({basis})"


def _weights_scheme(weights: Mapping[str, Any], fmt: str, dtype: str | None, detail: str) -> Quantization:
    bits = _int(weights.get("num_bits"))
    group = _int(weights.get("group_size"))
    wtype = str(weights.get("type") or "int")
    if "nvfp4" in fmt:
        return Quantization(Scheme.NVFP4, 4, group or 16, dtype, detail)
    if "mxfp4" in fmt:
        return Quantization(Scheme.MXFP4, 4, group or 32, dtype, detail)
    if wtype == "float" and bits == 8:
        return Quantization(Scheme.FP8, 8, group, dtype, detail)
    if wtype == "float" and bits == 4:
        return Quantization(Scheme.NVFP4 if (group or 16) == 16 else Scheme.MXFP4, 4, group, dtype, detail)
    if bits is not None:
        return Quantization(Scheme.INT, bits, group, dtype, detail)
    return Quantization(Scheme.UNKNOWN, None, None, dtype, detail + " without weight bits")


def _group_list(qc: Mapping[str, Any], dtype: str | None, detail: str) -> list[tuple[Quantization, list[str]]]:
    """``config_groups`` as (scheme, targets) pairs, in the order the config gives them."""
    groups = qc.get("config_groups")
    if not isinstance(groups, Mapping):
        return []
    fmt = str(qc.get("format") or "")
    found: list[tuple[Quantization, list[str]]] = []
    for g in groups.values():
        if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping):
            targets = g.get("targets")
            targets = [str(t) for t in targets] if isinstance(targets, list) else ["Linear"]
            gfmt = str(g.get("format") or fmt)
            found.append((_weights_scheme(g["weights"], gfmt, dtype, detail), targets))
    return found


def _ignored(qc: Mapping[str, Any]) -> list[str]:
    """Modules left unquantized: compressed-tensors' ``ignore``, ModelOpt's ``exclude_modules``."""
    out: list[str] = []
    for key in ("ignore", "exclude_modules"):
        v = qc.get(key)
        out += [str(i) for i in v] if isinstance(v, list) else []
    return out


def _config_groups(qc: Mapping[str, Any], dtype: str | None, detail: str,
                   config: Mapping[str, Any] | None) -> Quantization | None:
    """compressed-tensors style ``config_groups`` (also what ModelOpt writes into config.json):
    one scheme per group; with several, the one that stores most weights."""
    found = _group_list(qc, dtype, detail)
    if not found:
        return None
    if len({q.key() for q, _ in found}) == 1:
        return found[0][0]
    q, mix = _dominant(found, config, _ignored(qc), detail)
    return Quantization(q.scheme, q.bits, q.group_size, dtype, mix)


def _compressed_tensors(qc: Mapping[str, Any], dtype: str | None,
                        config: Mapping[str, Any] | None = None) -> Quantization:
    fmt = str(qc.get("format") or "")
    detail = f"compressed-tensors format {fmt or '?'}"
    q = _config_groups(qc, dtype, detail, config)
    if q is not None:
        return q
    return _weights_scheme({}, fmt, dtype, detail)


def _modelopt(qc: Mapping[str, Any], dtype: str | None, where: str,
              config: Mapping[str, Any] | None = None) -> Quantization:
    algo = str(qc.get("quant_algo") or "").upper()
    group = _int(qc.get("group_size"))
    if algo == "MIXED_PRECISION":
        # Both halves of what ModelOpt writes: quantized_layers (module -> algo) and config_groups
        # (scheme -> targets). A published Qwen NVFP4 release lists only its FP8 attention
        # projections in quantized_layers and puts NVFP4 on the MLPs and lm_head in config_groups:
        # read alone, the first made an NVFP4 checkpoint fp8. The scheme that stores most weights wins.
        how = f"ModelOpt {where} mixed precision"
        layers = qc.get("quantized_layers")
        by_algo: dict[str, list[str]] = {}
        for name, v in (layers.items() if isinstance(layers, Mapping) else ()):
            if isinstance(v, Mapping):
                by_algo.setdefault(str(v.get("quant_algo", "?")).upper(), []).append(str(name))
        groups = []
        for a, names in sorted(by_algo.items()):
            g = next((_int(layers[n].get("group_size")) for n in names), None)
            groups.append((_modelopt({"quant_algo": a, "group_size": g}, dtype, where), names))
        in_groups = _group_list(qc, dtype, how)
        groups += in_groups
        if not groups:
            return Quantization(Scheme.UNKNOWN, None, group, dtype,
                                f"ModelOpt {where}: MIXED_PRECISION without readable quantized_layers "
                                f"or config_groups")
        said = [f"{a} on {len(n)} layers" for a, n in sorted(by_algo.items())]
        if in_groups:
            said.append(f"{len(in_groups)} config group{'s' if len(in_groups) > 1 else ''}")
        if len({q.key() for q, _ in groups}) == 1:
            return Quantization(groups[0][0].scheme, groups[0][0].bits, groups[0][0].group_size, dtype,
                                f"{how}, " + ", ".join(said))
        q, mix = _dominant(groups, config, _ignored(qc), f"{how}, " + ", ".join(said))
        return Quantization(q.scheme, q.bits, q.group_size, dtype, mix)
    detail = f"ModelOpt {where} quant_algo {algo or '?'}"
    if "NVFP4" in algo:  # NVFP4, NVFP4_AWQ, W4A16_NVFP4, W4A8_NVFP4_FP8: the weights are NVFP4
        return Quantization(Scheme.NVFP4, 4, group or 16, dtype, detail)
    if algo in ("FP8", "FP8_BLOCK", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"):
        return Quantization(Scheme.FP8, 8, group, dtype, detail)
    if algo.startswith("MXFP4") or algo == "W4A8_MXFP4_FP8":
        return Quantization(Scheme.MXFP4, 4, group or 32, dtype, detail)
    if algo.startswith("MXFP8"):
        return Quantization(Scheme.MXFP8, 8, group or 32, dtype, detail)
    if "AWQ" in algo:
        return Quantization(Scheme.AWQ, 4, group or 128, dtype, detail)
    if algo in ("INT8_SQ", "INT8", "W8A8_SQ_PER_CHANNEL", "INT8_WO"):
        return Quantization(Scheme.INT, 8, group, dtype, detail)
    if algo in ("INT4", "INT4_WO", "W4A16"):
        return Quantization(Scheme.INT, 4, group, dtype, detail)
    return Quantization(Scheme.UNKNOWN, None, group, dtype, f"{detail} is not one this tool knows")


def _quantization_config(qc: Any, dtype: str | None, where: str,
                         config: Mapping[str, Any] | None = None) -> Quantization:
    if not isinstance(qc, Mapping):
        if isinstance(qc, str):
            return _mlx_block(qc, dtype, where)
        return Quantization(Scheme.UNKNOWN, None, None, dtype,
                            f"{where} is a {type(qc).__name__}, not a table")
    method = str(qc.get("quant_method") or "").lower()
    bits = _int(qc.get("bits"))
    group = _int(qc.get("group_size"))
    if not method:
        if "quant_algo" in qc:
            return _modelopt(qc, dtype, where, config)
        if bits is not None or "mode" in qc:
            return _mlx_block(qc, dtype, where)  # mlx-lm mirrors its block here
        return Quantization(Scheme.UNKNOWN, None, None, dtype, f"{where} has no quant_method")
    detail = f"{where} quant_method {method}"
    if method == "gptq":
        return Quantization(Scheme.GPTQ, bits, group, dtype, detail)
    if method == "awq":
        return Quantization(Scheme.AWQ, bits or _int(qc.get("w_bit")),
                            group or _int(qc.get("q_group_size")), dtype, detail)
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            kind = qc.get("bnb_4bit_quant_type", "fp4")
            return Quantization(Scheme.BITSANDBYTES, 4, 64, dtype, f"{detail} 4-bit {kind}")
        if qc.get("load_in_8bit"):
            return Quantization(Scheme.BITSANDBYTES, 8, None, dtype, f"{detail} 8-bit")
        return Quantization(Scheme.BITSANDBYTES, bits, None, dtype, detail)
    if method == "hqq":
        wq = qc.get("quant_config", {})
        if isinstance(wq, Mapping):
            wq = wq.get("weight_quant_params", wq)
        wq = wq if isinstance(wq, Mapping) else {}
        return Quantization(Scheme.HQQ, _int(wq.get("nbits")) or bits or _int(qc.get("nbits")),
                            _int(wq.get("group_size")) or group, dtype, detail)
    if method in ("fp8", "fbgemm_fp8"):
        block = qc.get("weight_block_size")
        g = None
        if isinstance(block, (list, tuple)) and block and _int(block[-1]):
            g = _int(block[-1])
        return Quantization(Scheme.FP8, 8, g, dtype, detail)
    if method == "compressed-tensors":
        return _compressed_tensors(qc, dtype, config)
    if method == "modelopt":
        return _modelopt(qc, dtype, where, config)
    if method == "mxfp4":
        return Quantization(Scheme.MXFP4, 4, 32, dtype, detail)
    if method in ("quanto", "optimum-quanto"):
        w = str(qc.get("weights") or "").lower()
        if w.startswith("float8"):
            return Quantization(Scheme.FP8, 8, None, dtype, detail)
        if w.startswith("int"):
            return Quantization(Scheme.INT, _bits(w[3:]), None, dtype, detail)
    if method == "eetq":
        return Quantization(Scheme.INT, 8, None, dtype, detail)
    return Quantization(Scheme.UNKNOWN, bits, group, dtype, f"{detail} is not one this tool knows")


def classify(config: Any, sidecar: Any = None) -> Quantization:
    """Classify parsed ``config.json`` (and an optional parsed ``hf_quant_config.json``)."""
    if not isinstance(config, Mapping):
        return Quantization(Scheme.UNKNOWN, None, None, None,
                            f"config.json is a {type(config).__name__}, not an object")
    dtype = _dtype(config)
    if "quantization" in config and config["quantization"] is not None:
        return _mlx_block(config["quantization"], dtype, "quantization")
    if config.get("quantization_config") is not None:
        return _quantization_config(config["quantization_config"], dtype, "quantization_config", config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        inner = classify(text)
        if inner.scheme is not Scheme.NONE:
            return Quantization(inner.scheme, inner.bits, inner.group_size, inner.dtype or dtype,
                                f"text_config: {inner.detail}")
    if isinstance(sidecar, Mapping):
        block = sidecar.get("quantization", sidecar)
        if isinstance(block, Mapping) and "quant_algo" in block:
            return _modelopt(block, dtype, "hf_quant_config.json", config)
    if dtype is None:
        return Quantization(Scheme.NONE, None, None, None, "no quantization block; dtype not stated")
    bits = _DTYPE_BITS.get(dtype)
    return Quantization(Scheme.NONE, bits, None, dtype, f"no quantization block; {dtype}")


def read_quantization(path: Path) -> Quantization:
    """Classify the checkpoint at ``path``; raises ConfigError for a missing/invalid config."""
    return classify(read_config(path), read_sidecar(path))
