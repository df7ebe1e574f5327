"""How text that came from a file or an argument is shown: on a terminal, or in a one-line error.

A checkpoint's ``config.json`` (``model_type``, architecture names), a folder's name, a profile's
strings and an error that quotes any of them can hold escape sequences (which set a terminal's
title, clear its screen or recolour it), newlines (which forge an output line) and bytes that are
not UTF-8 (which a strict stdout cannot even encode). Every front end shows such text through
``shown``: nothing reaches a terminal as a control character, and one line stays one line.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import Mapping

# Categories never shown raw: controls (C0, DEL, C1: ESC, BEL, newline, carriage return...),
# format characters (bidirectional overrides reorder what a line appears to say; zero-width
# ones hide text), line and paragraph separators, and surrogates (bytes of a non-UTF-8 file
# name or argument, which Python carries as lone surrogates).
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs"}
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    n = ord(ch)
    if 0xDC80 <= n <= 0xDCFF:  # a byte that was not UTF-8, as surrogateescape carries it
        return f"\\x{n - 0xDC00:02x}"
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"


def shown(value: object) -> str:
    """``value`` as one line of plain, printable text: every control, format or separator
    character and every undecodable byte becomes a visible escape (``\\x1b``, ``\\n``, ``\\xff``)."""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to do (a space is printable, a tab is not)
        return text
    return "".join(_escape(ch) if unicodedata.category(ch) in _HIDDEN else ch for ch in text)



def hidden_char(text: str) -> str | None:
    """The first character of ``text`` that ``shown`` escapes, as it escapes it (``\\n``,
    ``\\x1b``), or None: what a value that must reach a command or a file as written may not hold."""
    if text.isprintable():
        return None
    return next((_escape(ch) for ch in text if unicodedata.category(ch) in _HIDDEN), None)


def shown_block(value: object) -> str:
    """Text that is several lines by nature (a model's completion, a record's Markdown): its
    newlines stay, every other control, format or separator character is escaped."""
    return "\n".join(shown(line) for line in str(value).split("\n"))


# The most of one error line a front end prints: an error quoting its input (a request id, a
# path, a server's log line) must not make a line of a megabyte.
MAX_LINE = 2000


def bounded(line: str, limit: int = MAX_LINE) -> str:
    """``line`` cut to ``limit`` characters, its head and tail kept and the count said."""
    if len(line) <= limit:
        return line
    keep = (limit - 40) // 2
    return f"{line[:keep]} ... ({len(line) - 2 * keep:,} characters left out) ... {line[-keep:]}"


def error_line(text: object) -> str:
    """One line of an error, as every front end prints it: shown, and bounded."""
    return bounded(shown(text))


def error_lines(error: BaseException, names: Mapping[str, str] | None = None) -> list[str]:
    """An error as the lines a front end prints: one (a BlockwidthError said with the front end's
    ``names`` for its input), or the located lines of an error that is several by design (a
    profile's problems, ``lines``), each shown as one line of at most MAX_LINE characters."""
    lines = getattr(error, "lines", None)
    if not isinstance(lines, (list, tuple)) or not lines:
        say = getattr(error, "say", None)
        lines = [say(names) if callable(say) else str(error)]
    return [error_line(line) for line in lines]


_HUB_HASH = re.compile(r"[0-9a-f]{40}")


def folder_label(path: Path) -> str:
    """A checkpoint folder as the console, sweep and the profile name it: its name, with its
    parent where the name alone says little (a tryout read "bf16 + prompt lookup" and a saved
    ``target = "bf16"`` for SmolLM2's bf16 folder): a name of six characters or fewer
    ("bf16", "q4g64", "native") reads "smollm2/bf16"; a hub snapshot reads as its repo id."""
    parts = path.parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--") and _HUB_HASH.fullmatch(path.name):
        return parts[-3][len("models--"):].replace("--", "/", 1)
    if len(path.name) <= 6 and path.parent.name:
        return f"{path.parent.name}/{path.name}"
    return path.name
