"""The target's hidden states, captured from the forward that verifies.

A DFlash drafter reads the outputs of some of the target's decoder layers, an
MTP head the target's final-normed hidden state. Both come from the forwards
the engine runs anyway (prefill and verify), never from a second one: while a
``Capture`` is open, each chosen module instance is given a subclass whose
``__call__`` records its output, and on exit it gets its own class back. The
module tree is untouched, so parameters, quantization, the cost curve and the
exactness probe see the same model, and a classic arm pays nothing.
"""

from __future__ import annotations

from typing import Any, Callable

import mlx.core as mx

from blockwidth.policy.errors import BlockwidthError

FINAL = -1  # capture key of the final-normed hidden state (what the LM head reads)

_SUBCLASSES: dict[type, type] = {}
_SINKS: dict[int, list[mx.array]] = {}


class TargetShapeError(BlockwidthError, ValueError):
    """The target's module tree is not one this engine knows how to tap."""


def inner(model: Any) -> Any:
    """The module holding ``embed_tokens``, ``layers`` and ``norm`` (mlx-lm's layout)."""
    for path in (("model",), ("language_model", "model"), ("language_model",), ()):
        obj = model
        for name in path:
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if obj is not None and hasattr(obj, "layers") and hasattr(obj, "embed_tokens"):
            return obj
    raise TargetShapeError(f"{type(model).__name__}: no embed_tokens / layers / norm to read hidden states from")


def depth(model: Any) -> int:
    return len(inner(model).layers)


def embed(model: Any) -> Callable[[mx.array], mx.array]:
    return inner(model).embed_tokens


def lm_head(model: Any) -> Callable[[mx.array], mx.array]:
    """Logits from a final-normed hidden state, as the target computes them."""
    head = getattr(model, "lm_head", None)
    if head is None:
        lm = getattr(model, "language_model", None)
        head = getattr(lm, "lm_head", None) if lm is not None else None
    return head if head is not None else inner(model).embed_tokens.as_linear


def _tapped(cls: type) -> type:
    sub = _SUBCLASSES.get(cls)
    if sub is None:
        def __call__(self, *args, **kwargs):
            out = cls.__call__(self, *args, **kwargs)
            sink = _SINKS.get(id(self))
            if sink is not None:
                sink.append(out[0] if isinstance(out, tuple) else out)
            return out

        sub = type(f"Tapped{cls.__name__}", (cls,), {"__call__": __call__})
        _SUBCLASSES[cls] = sub
    return sub


class Capture:
    """Record the outputs of target layers ``layers`` (0-based decoder indices; ``FINAL`` for the
    final norm) during the forwards run inside ``with``; ``on_exit`` gets them, each concatenated
    along the sequence axis (several prefill chunks make one array)."""

    def __init__(self, model: Any, layers: tuple[int, ...],
                 on_exit: Callable[[dict[int, mx.array]], None]):
        body = inner(model)
        self.modules = {i: (body.norm if i == FINAL else body.layers[i]) for i in layers}
        self.on_exit = on_exit
        self.sinks: dict[int, list[mx.array]] = {}
        self.saved: dict[int, type] = {}

    def __enter__(self) -> "Capture":
        for i, m in self.modules.items():
            self.sinks[i] = []
            _SINKS[id(m)] = self.sinks[i]
            self.saved[i] = type(m)
            m.__class__ = _tapped(type(m))
        return self

    def __exit__(self, *exc) -> None:
        for i, m in self.modules.items():
            m.__class__ = self.saved[i]
            _SINKS.pop(id(m), None)
        if exc[0] is None and all(self.sinks.values()):
            self.on_exit({i: (s[0] if len(s) == 1 else mx.concatenate(s, axis=1))
                          for i, s in self.sinks.items()})
