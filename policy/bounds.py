"""What a run may ask of a target and a machine, pure: the target's context, and the memory
its KV cache and one prefill's attention scores take (a 1024-context model asked for 200,000
tokens turned into a segfault). The console probes the memory and says which flags added up."""

from __future__ import annotations

from typing import Any, Mapping

from blockwidth.policy.config import text

UNKNOWN_CONTEXT = 32768  # the bound when a target's config states no max_position_embeddings


def context_problem(context_length: int | None, tokens: int) -> str | None:
    """Why ``tokens`` positions do not fit the target's context, or None."""
    if tokens <= (context_length or UNKNOWN_CONTEXT):
        return None
    whose = (f"the target's context of {context_length} tokens (max_position_embeddings)" if context_length
             else f"{UNKNOWN_CONTEXT} tokens (the target's config states no context length)")
    return f"exceeds {whose}"


def memory_need(config: Mapping[str, Any], tokens: int) -> int | None:
    """Bytes for the KV cache (bf16) and one prefill's attention scores (fp32) at ``tokens``
    positions, from the target's config (its text model's: policy.config.text); None when the
    config does not say enough."""
    config = text(config)
    ints = {k: config.get(k) for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                        "hidden_size", "head_dim")}
    layers, heads, hidden = ints["num_hidden_layers"], ints["num_attention_heads"], ints["hidden_size"]
    if not all(isinstance(v, int) and v > 0 for v in (layers, heads, hidden)):
        return None
    kv = ints["num_key_value_heads"] if isinstance(ints["num_key_value_heads"], int) else heads
    head_dim = ints["head_dim"] if isinstance(ints["head_dim"], int) else hidden // heads
    return 2 * layers * kv * head_dim * tokens * 2 + heads * tokens * tokens * 4


def memory_problem(need: int, memory_bytes: int | None) -> str | None:
    """Why ``need`` bytes are too much for a device of ``memory_bytes`` (over half), or None."""
    if memory_bytes and need > memory_bytes // 2:
        return (f"needs about {need / 2**30:.1f} GiB (KV cache and attention scores), over half of "
                f"this device's {memory_bytes / 2**30:.1f} GiB")
    return None
