"""Reading an operator's files without hanging, without unbounded memory, without tracebacks.

Every file the tool reads (profile, config.json, tokenizer_config.json, prompt
file) goes through here: it must be a regular file (a FIFO would block forever,
``/dev/zero`` never ends), it has a size bound, and JSON is strict (no NaN, no
nesting deep enough to exhaust the interpreter's stack).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from blockwidth.policy.errors import BlockwidthError

MiB = 1 << 20
MAX_JSON_BYTES = 64 * MiB  # configs and tokenizer configs; tokenizer.json is not read here
MAX_RECORD_BYTES = 128 * MiB  # session records; the largest committed one is 1.3 MiB
MAX_NESTING = 200
# Digits an integer read from an argument, a variable or a file may have: every count and
# width this tool takes fits in far fewer, and int() of more than 4,300 digits raises
# (CPython's guard against quadratic conversion), which was a traceback wherever it was met.
MAX_DIGITS = 18  # deeper JSON than any real config; deeper TOML than any real profile


class FileProblem(BlockwidthError, ValueError):
    """A file that cannot be read as asked; str() is '<path>: <what is wrong>'."""


def kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words: ``a FIFO``, ``a directory``..."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


_kind = kind_of


def read_bytes(path: Path, limit: int) -> bytes:
    """A regular file's bytes, at most ``limit`` of them, or FileProblem."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise block here.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise FileProblem(f"{path}: no such file") from None
        if e.errno == errno.EISDIR:
            raise FileProblem(f"{path}: is a directory, not a file") from None
        raise FileProblem(f"{path}: cannot be read ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileProblem(f"{path}: is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise FileProblem(f"{path}: {st.st_size / MiB:.1f} MiB is over the {limit / MiB:g} MiB limit")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    except OSError as e:
        raise FileProblem(f"{path}: cannot be read ({e.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while we read
        raise FileProblem(f"{path}: over the {limit / MiB:g} MiB limit")
    return data


def read_text(path: Path, limit: int) -> str:
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FileProblem(f"{Path(path)}: not UTF-8 text (at byte offset {e.start}, counting from 0)") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):  # 1e400 parses as inf: a number no output could print as JSON
        raise ValueError(f"{text[:40]} is out of range for a number")
    return v


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 4300:  # int() raises past CPython's limit: say what it is
        raise ValueError(f"a number of {len(text):,} digits")
    return int(text)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (inf, nan) replaced by None, at any depth."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps_json(value: Any, **kw: Any) -> str:
    """JSON as every output writes it: never ``Infinity`` or ``NaN`` (not JSON; a parser in CI
    refuses the whole document), a non-finite number is null."""
    return json.dumps(finite(value), allow_nan=False, **kw)


_JSON_TOKENS = re.compile(r'"(?:[^"\\\n]|\\.)*"|[\[\]{}]')
# TOML's strings and comments, multi-line strings first (a bracket, or a line that reads like a
# table header, inside one is text); then the brackets nesting counts.
TOML_SKIP = (r'"""(?:\\[\s\S]|[^\\])*?"""(?!")|\'\'\'[\s\S]*?\'\'\'(?!\')'
             r'|"(?:[^"\\\n]|\\.)*"|\'[^\'\n]*\'|#[^\n]*')
_TOML_TOKENS = re.compile(TOML_SKIP + r'|[\[\]{}.\n]')


def nesting_depth(text: str, toml: bool = False) -> int:
    """Bracket depth outside strings (and comments, for TOML). It runs before any
    recursive parser could exhaust the stack, and visits only strings and brackets. In TOML a
    dotted key nests without a bracket (``a.b.c = 1`` is three tables deep, and 20,000 parts of
    one took tomllib to 1.5 GiB): every dot of a line outside strings counts as a level there,
    an upper bound (a float's dot counts too) that no real profile comes near."""
    dots = text.count(".") if toml else 0
    if text.count("[") + text.count("{") + dots <= MAX_NESTING:
        return 0  # cannot be deeper than the bound: skip the scan
    depth = deepest = line_dots = 0
    for m in (_TOML_TOKENS if toml else _JSON_TOKENS).finditer(text):
        ch = m.group()
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == ".":
            line_dots += 1
        elif ch == "\n":
            line_dots = 0
        deepest = max(deepest, depth + line_dots)
    return deepest


def loads_json(text: str | bytes, where: str | Path) -> Any:
    """Strict JSON: NaN/Infinity refused, nesting bounded; FileProblem names ``where``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FileProblem(f"{where}: not UTF-8 (byte {e.start})") from None
    if nesting_depth(text) > MAX_NESTING:
        raise FileProblem(f"{where}: nested deeper than {MAX_NESTING} levels")
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float,
                          parse_int=_bounded_int)
    except json.JSONDecodeError as e:
        raise FileProblem(f"{where}: not valid JSON ({e})") from None
    except (ValueError, RecursionError) as e:
        raise FileProblem(f"{where}: not valid JSON ({e})") from None


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    return loads_json(read_bytes(path, limit), path)


# What a file system takes (Linux's and macOS's NAME_MAX and PATH_MAX, in bytes): a longer
# name made every os call on it an OSError ("File name too long") with a traceback.
NAME_MAX = 255
PATH_MAX = 4096


def _shortened(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else f"{text[:limit // 2]}...{text[-(limit // 2 - 3):]}"


def name_problem(text: str) -> str | None:
    """Why ``text`` cannot name a file (a part longer than NAME_MAX bytes, the whole longer than
    PATH_MAX), said with the name shortened; None when it can."""
    raw = os.fsencode(text)
    if len(raw) > PATH_MAX:
        return f"{_shortened(text)}: a path of {len(raw):,} bytes; a path has at most {PATH_MAX:,}"
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            shown = _shortened(os.fsdecode(part))
            return (f"{shown}: a name of {len(part):,} bytes in a path; a file or folder name has at "
                    f"most {NAME_MAX}")
    return None


def user_path(value: str | os.PathLike, what: str) -> Path:
    """An operator-given path: never empty, never longer than a file system takes, ``~``
    expanded; FileProblem names the option."""
    text = os.fspath(value)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if not str(text).strip():
        raise FileProblem(f"{text!r}: an empty path; name a file or leave the option out", what)
    if "\0" in str(text):
        raise FileProblem(f"{_shortened(repr(text))}: a path cannot contain a NUL byte", what)
    too_long = name_problem(text)
    if too_long:
        raise FileProblem(too_long, what)
    try:
        return Path(text).expanduser()
    except RuntimeError:  # ~nouser: no such user, or no home directory
        raise FileProblem(f"{text}: cannot expand '~' (no such user or no home directory)", what) from None
