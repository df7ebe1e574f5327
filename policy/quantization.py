"""Classify a checkpoint's quantization from its parsed ``config.json``.

The target's quantization keys the width policy because it picks the verify
kernel. ``classify`` is a pure function of the parsed JSON (and of ModelOpt's
sidecar ``hf_quant_config.json`` when one exists); ``read_quantization`` is the
thin file reader.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, Mapping


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme.value,
            "bits": self.bits,
            "group_size": self.group_size,
            "dtype": self.dtype,
            "detail": self.detail,
        }

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


def _compressed_tensors(qc: Mapping[str, Any], dtype: str | None) -> Quantization:
    fmt = str(qc.get("format") or "")
    groups = qc.get("config_groups")
    weights: Mapping[str, Any] = {}
    if isinstance(groups, Mapping):
        for g in groups.values():
            if isinstance(g, Mapping) and isinstance(g.get("weights"), Mapping):
                weights = g["weights"]
                fmt = str(g.get("format") or fmt)
                break
    bits = _int(weights.get("num_bits"))
    group = _int(weights.get("group_size"))
    wtype = str(weights.get("type") or "int")
    detail = f"compressed-tensors format {fmt or '?'}"
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


def _modelopt(qc: Mapping[str, Any], dtype: str | None, where: str) -> Quantization:
    algo = str(qc.get("quant_algo") or "").upper()
    group = _int(qc.get("group_size"))
    if algo == "MIXED_PRECISION":
        layers = qc.get("quantized_layers")
        if not isinstance(layers, Mapping) or not layers:
            return Quantization(Scheme.UNKNOWN, None, group, dtype,
                                f"ModelOpt {where}: MIXED_PRECISION without quantized_layers")
        algos = Counter(str(v.get("quant_algo", "?")).upper()
                        for v in layers.values() if isinstance(v, Mapping))
        parts = []
        for name, n in sorted(algos.items()):
            parts.append(f"{name} on {n} layers")
        # The scheme that covers most layers decides the kernel for most of the
        # verify; on a tie, the narrower one.
        def narrow(a: str) -> int:
            q = _modelopt({"quant_algo": a}, dtype, where)
            return q.bits or 99
        top = sorted(algos.items(), key=lambda kv: (-kv[1], narrow(kv[0])))[0][0]
        group_of_top = next((_int(v.get("group_size")) for v in layers.values()
                             if isinstance(v, Mapping)
                             and str(v.get("quant_algo", "")).upper() == top), None)
        base = _modelopt({"quant_algo": top, "group_size": group_of_top}, dtype, where)
        return Quantization(base.scheme, base.bits, base.group_size, dtype,
                            f"ModelOpt {where}: mixed precision, " + ", ".join(parts))
    detail = f"ModelOpt {where} quant_algo {algo or '?'}"
    if algo == "NVFP4" or algo.startswith("NVFP4"):
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


def _quantization_config(qc: Any, dtype: str | None, where: str) -> Quantization:
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
            return _modelopt(qc, dtype, where)
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
        return _compressed_tensors(qc, dtype)
    if method == "modelopt":
        return _modelopt(qc, dtype, where)
    if method == "mxfp4":
        return Quantization(Scheme.MXFP4, 4, 32, dtype, detail)
    if method in ("quanto", "optimum-quanto"):
        w = str(qc.get("weights") or "").lower()
        if w.startswith("float8"):
            return Quantization(Scheme.FP8, 8, None, dtype, detail)
        if w.startswith("int"):
            return Quantization(Scheme.INT, _int(w[3:]) if w[3:].isdigit() else None, None, dtype, detail)
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
        return _quantization_config(config["quantization_config"], dtype, "quantization_config")
    text = config.get("text_config")
    if isinstance(text, Mapping):
        inner = classify(text)
        if inner.scheme is not Scheme.NONE:
            return Quantization(inner.scheme, inner.bits, inner.group_size, inner.dtype or dtype,
                                f"text_config: {inner.detail}")
    if isinstance(sidecar, Mapping):
        block = sidecar.get("quantization", sidecar)
        if isinstance(block, Mapping) and "quant_algo" in block:
            return _modelopt(block, dtype, "hf_quant_config.json")
    if dtype is None:
        return Quantization(Scheme.NONE, None, None, None, "no quantization block; dtype not stated")
    bits = _DTYPE_BITS.get(dtype)
    return Quantization(Scheme.NONE, bits, None, dtype, f"no quantization block; {dtype}")


class ConfigError(Exception):
    """A checkpoint folder whose config.json is missing or unreadable, or that asks to run
    its own code."""


# Files of a checkpoint folder that transformers (through mlx-lm) reads, and the keys in
# them that make it import Python shipped with the checkpoint.
_CODE_FILES = ("config.json", "tokenizer_config.json", "processor_config.json",
               "preprocessor_config.json", "generation_config.json")
_CODE_KEYS = ("auto_map", "model_file", "custom_pipelines")


def remote_code(path: Path, config: Mapping[str, Any] | None = None) -> str | None:
    """'<file>: <key> ...' when the folder asks to run its own code, else None.

    blockwidth never runs checkpoint code: transformers would ask on stdin (and run it on
    'y'), mlx-lm would import ``model_file``. Checked here, before anything reaches them.
    """
    from policy import files

    path = Path(path)
    for name in _CODE_FILES:
        f = path / name
        if name == "config.json" and config is not None:
            data: Any = config
        elif not f.exists() and not f.is_symlink():
            continue
        else:
            try:
                data = files.read_json(f)
            except files.FileProblem as e:
                # transformers would still try to read it: unreadable is not proof of no code
                return f"{e}; cannot check it for auto_map"
        if not isinstance(data, Mapping):
            continue
        nested = [("", data)] + [(f"{k}.", v) for k, v in data.items()
                                 if k.endswith("_config") and isinstance(v, Mapping)]
        for prefix, block in nested:
            for key in _CODE_KEYS:
                if block.get(key):
                    return (f"{f}: has {prefix}{key}, which asks to run code shipped with the "
                            f"checkpoint; blockwidth never runs checkpoint code")
    return None


def read_config(path: Path) -> dict[str, Any]:
    """Read ``PATH/config.json``; ConfigError names the path and what is wrong.

    Every reader of a checkpoint folder comes through here (the engine, ``inspect``,
    ``resolve``, the console), so a folder that asks to run its own code is refused here.
    """
    from policy import files

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise ConfigError(f"{path}: is a file, not a checkpoint folder")
    cfg = path / "config.json"
    if not cfg.exists():
        raise ConfigError(f"{path}: has no config.json (not a checkpoint folder)")
    try:
        data = files.read_json(cfg)
    except files.FileProblem as e:
        raise ConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{cfg}: top level is a {type(data).__name__}, not an object")
    refusal = remote_code(path, data)
    if refusal:
        raise ConfigError(refusal)
    return data


def read_sidecar(path: Path) -> dict[str, Any] | None:
    from policy import files

    side = Path(path) / "hf_quant_config.json"
    if not side.is_file():
        return None
    try:
        data = files.read_json(side)
    except files.FileProblem:
        return None
    return data if isinstance(data, dict) else None


def read_quantization(path: Path) -> Quantization:
    """Classify the checkpoint at ``path``; raises ConfigError for a missing/invalid config."""
    return classify(read_config(path), read_sidecar(path))
