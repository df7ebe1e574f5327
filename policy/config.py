"""A checkpoint's ``config.json``: the one reader (bounded, strict, refusing checkpoint code), and
the sizes in it, wherever the published layout puts them.

A multimodal checkpoint (Qwen 3.5, Gemma 3/4, Llama 4, Mistral 3 ...) keeps its language model's
sizes under ``text_config``; a text-only one at the top level. Every size this project reads goes
through ``size`` so the two layouts read the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from blockwidth.policy import files
from blockwidth.policy.errors import BlockwidthError


def size(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]``, else ``config["text_config"][key]``, else ``default``."""
    if not isinstance(config, Mapping):
        return default
    v = config.get(key)
    if v is None:
        text = config.get("text_config")
        if isinstance(text, Mapping):
            v = text.get(key)
    return default if v is None else v


def text(config: Any) -> Mapping:
    """The mapping that holds the language model's settings: ``text_config`` where the top level
    states no ``hidden_size`` and has one, else the config itself."""
    if not isinstance(config, Mapping):
        return {}
    inner = config.get("text_config")
    if config.get("hidden_size") is None and isinstance(inner, Mapping):
        return inner
    return config


# ---- sizes a model may state -----------------------------------------------------------------

# What a config may state before anything is built from it (mlx-lm builds a model from the
# config alone to plan its caches: a num_hidden_layers of 1,000,000 grew to 3 GiB in 13 s with
# no weights read). Each bound is far above any published model's (126 layers, hidden 25,600,
# vocab 262,144, 384 experts, a context of 10 M) and far below what a machine cannot build.
SIZE_BOUNDS: Mapping[str, int] = {
    "num_hidden_layers": 1024, "num_layers": 1024, "n_layer": 1024, "n_layers": 1024,
    "hidden_size": 1 << 16, "d_model": 1 << 16, "n_embd": 1 << 16,
    "intermediate_size": 1 << 20, "moe_intermediate_size": 1 << 20, "ffn_dim": 1 << 20,
    "vocab_size": 1 << 22,
    "num_attention_heads": 1024, "num_key_value_heads": 1024, "n_head": 1024, "head_dim": 1 << 13,
    "num_experts": 1 << 12, "num_local_experts": 1 << 12, "n_routed_experts": 1 << 12,
    "num_experts_per_tok": 1 << 12, "n_shared_experts": 1 << 12,
    "num_nextn_predict_layers": 1024, "mtp_num_hidden_layers": 1024,
    "max_position_embeddings": 1 << 27, "sliding_window": 1 << 27,
}


def size_problem(config: Mapping[str, Any]) -> str | None:
    """The first size in ``config`` (its top level, or a ``*_config`` block in it) past
    SIZE_BOUNDS, said as ``text_config.num_hidden_layers = 1,000,000: ...``; None when all fit.
    Only integers are judged here: a size that is not one is the reader's to refuse."""
    blocks = [("", config)] + [(f"{k}.", v) for k, v in config.items()
                               if isinstance(k, str) and k.endswith("_config") and isinstance(v, Mapping)]
    for prefix, block in blocks:
        for key, bound in SIZE_BOUNDS.items():
            v = block.get(key)
            if isinstance(v, int) and not isinstance(v, bool) and v > bound:
                return (f"{prefix}{key} = {v:,}: more than any model states (at most {bound:,}); "
                        f"not built")
    return None


# ---- reading the file ------------------------------------------------------------------------

class ConfigError(BlockwidthError):
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


def context_length(config: Any) -> int | None:
    """The target's context in tokens (``max_position_embeddings``, ``text_config``'s where
    nested), or None where the config states none: one rule for the engine and the served path."""
    v = size(config, "max_position_embeddings")
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def read_config(path: Path) -> dict[str, Any]:
    """Read ``PATH/config.json``; ConfigError names the path and what is wrong.

    Every reader of a checkpoint folder comes through here (the engine, ``inspect``,
    ``resolve``, the console), so a folder that asks to run its own code is refused here.
    """
    return read_config_bytes(path)[0]


def read_config_bytes(path: Path) -> tuple[dict[str, Any], bytes]:
    """``read_config``, and the file's bytes as read (a checkpoint's fingerprint hashes them,
    so the file is read once: engine.checkpoint.Checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such file or directory")
    if not path.is_dir():
        raise ConfigError(f"{path}: is a file, not a checkpoint folder")
    cfg = path / "config.json"
    if not cfg.exists():
        raise ConfigError(f"{path}: has no config.json (not a checkpoint folder)")
    try:
        raw = files.read_bytes(cfg, files.MAX_JSON_BYTES)
        data = files.loads_json(raw, cfg)
    except files.FileProblem as e:
        raise ConfigError(str(e)) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{cfg}: top level is a {type(data).__name__}, not an object")
    refusal = remote_code(path, data)
    if refusal:
        raise ConfigError(refusal)
    too_big = size_problem(data)  # before any reader computes a shape or builds a model from it
    if too_big:
        raise ConfigError(f"{cfg}: {too_big}")
    return data, raw


# What a model's config.json says about the model: one of these at least.
_DESCRIBES = ("model_type", "architectures", "text_config", "vocab_size", "hidden_size",
              "quantization", "quantization_config")


def names_no_model(path: Path, config: dict[str, Any]) -> ConfigError | None:
    """A config.json that describes no model (``{}``: no model_type, architectures, sizes or
    quantization), or None. ``inspect`` answered such a folder with exit 0 and a page of nulls."""
    if any(k in config for k in _DESCRIBES):
        return None
    what = "an empty object" if not config else "an object without " + ", ".join(_DESCRIBES[:3])
    return ConfigError(f"{Path(path) / 'config.json'}: {what}: it describes no model (not a "
                       f"checkpoint's config)")


def read_sidecar(path: Path) -> dict[str, Any] | None:
    """ModelOpt's ``hf_quant_config.json``, or None where the folder has none. One that is there
    but broken (truncated, not JSON, not an object, a FIFO) is a ConfigError: read as absent, it
    made an NVFP4 target an unquantized one, and the width was resolved for the wrong kernel."""
    side = Path(path) / "hf_quant_config.json"
    if not side.exists() and not side.is_symlink():
        return None
    try:
        data = files.read_json(side)
    except files.FileProblem as e:
        raise ConfigError(f"{e} (the quantization sidecar; remove it or restore it)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{side}: top level is a {type(data).__name__}, not an object "
                          f"(the quantization sidecar)")
    return data
