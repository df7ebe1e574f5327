"""Every command line and code block the product prints, rendered in one place, each value quoted
for where it goes: a POSIX shell (``shlex.quote``), Python (``repr``), JSON (``json.dumps``).

A profile is shared through a team's repository and a record names folders: their strings are
input, never text to splice into a line a person pastes into a shell. Values that no rendering can
keep as written on one line (a newline, ESC, any control, format or separator character, which
``policy.text.shown`` would escape) are refused here, ``Unprintable`` naming whose value it was;
the profile refuses them earlier, where it is read (``policy.profile.string_problems``).
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any, Mapping, Sequence

from blockwidth.policy.errors import BlockwidthError
from blockwidth.policy.text import hidden_char, shown

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Unprintable(BlockwidthError):
    """A value that cannot be printed into a command as written: one line naming it."""


def printable(value: object, what: str) -> str:
    """``value`` as text, or Unprintable naming ``what`` when it holds a character a command
    line, a comment or a terminal would not keep as written."""
    text = str(value)
    bad = hidden_char(text)
    if bad is not None:
        raise Unprintable(f"{what} {shown(text)} holds {bad}, which no printed command keeps as "
                          f"written; rename it (or name another)")
    return text


def assignments(env: Mapping[str, str]) -> list[str]:
    """``NAME=value`` words a shell line starts with to set ``env`` for its command."""
    out = []
    for k, v in env.items():
        if not _ENV_NAME.fullmatch(str(k)):
            raise Unprintable(f"environment variable name {shown(k)!r} is not one a shell sets")
        out.append(f"{k}={shlex.quote(printable(v, f'environment variable {k}'))}")
    return out


def shell(argv: Sequence[object], env: Mapping[str, str] | None = None, what: str = "an argument") -> str:
    """One POSIX shell line: ``env``'s assignments, then every word of ``argv`` quoted, so that
    ``shlex.split`` of the line gives back exactly those words (after the assignments)."""
    words = [printable(a, what) for a in argv]
    return " ".join([*assignments(env or {}), *(shlex.quote(w) for w in words)])


def env_words(env: Mapping[str, str]) -> str:
    """``MLX_CUDA_USE_CUDNN_SDPA=0 ...``: the assignments alone, as a shell line starts with them."""
    return " ".join(assignments(env))


def server_how(exact: bool, verify_attention: str | None) -> str:
    """How a served sweep's mlx_lm.server ran, in the words its start line, its table's header
    and its record's Markdown all use: the stock server, or blockwidth's in-process one on the
    exact path or with a verify attention."""
    if exact:
        return "in-process, exact path"
    return "stock" if verify_attention is None else f"in-process, verify attention {verify_attention}"


def json_text(value: Any) -> str:
    """JSON, as a config block or a shell-quoted argument holds it (json.dumps escapes every
    control character itself)."""
    return json.dumps(value)


class Name:
    """A Python name in a rendered call (``speculative_config=speculative_config``): not a literal."""

    def __init__(self, name: str) -> None:
        if not name.isidentifier():
            raise Unprintable(f"{shown(name)!r} is not a Python name")
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _literal(value: Any, what: str) -> str:
    if isinstance(value, str):
        printable(value, what)
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _literal(k, what)
            _literal(v, what)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _literal(v, what)
    elif not isinstance(value, (int, float, bool, Name)) and value is not None:
        raise Unprintable(f"{what}: a {type(value).__name__} is not a Python literal")
    return repr(value)


def python_call(function: str, *args: Any, what: str = "an argument", **kwargs: Any) -> str:
    """``function(arg, key=value)`` with every value a Python literal (``repr``) or a Name."""
    if not all(part.isidentifier() for part in function.split(".")):
        raise Unprintable(f"{shown(function)!r} is not a Python name")
    parts = [_literal(a, what) for a in args] + [f"{k}={_literal(v, what)}" for k, v in kwargs.items()]
    return f"{function}({', '.join(parts)})"


def comment(text: str, prefix: str = "# ") -> str:
    """A comment line: one line whatever ``text`` holds (shown: a newline would end the comment
    and start a command)."""
    return prefix + shown(text)
