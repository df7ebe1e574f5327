"""Sizes from a checkpoint's parsed ``config.json``, wherever the published layout puts them.

A multimodal checkpoint (Qwen 3.5, Gemma 3/4, Llama 4, Mistral 3 ...) keeps its language model's
sizes under ``text_config``; a text-only one at the top level. Every size this project reads goes
through ``size`` so the two layouts read the same.
"""

from __future__ import annotations

from typing import Any, Mapping


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
