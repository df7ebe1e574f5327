"""Where the tool writes, checked as its inputs are read, and what to say when a write fails late.

Every output path (``--junit``, a record's Markdown, ...) is checked before any work: a regular
file or a new one in an existing, writable folder; never a FIFO (nobody may ever read it: the
write would hang), a device or a folder; never one of the run's inputs under another name (a
hard link or a symlink to the profile would be overwritten). It is then written atomically
(a temporary file renamed over it), so a file linked elsewhere is replaced, never rewritten in
place, and a reader never sees half of it.

A write that fails after the measurement must not lose the measurement: the front end prints
its results first and then one line naming what failed and what was kept (``kept_note``).
Nothing here imports Textual or MLX.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys
from pathlib import Path
from typing import Iterable, TextIO

from blockwidth.console.inputs import InputError
from blockwidth.policy import files
from blockwidth.policy.errors import BlockwidthError, ExitCode
from blockwidth.policy.text import shown


class OutputError(InputError):
    """An output that cannot be written (or must not be); one line naming it."""


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def check_output(value: str | os.PathLike, what: str,
                 inputs: Iterable[tuple[str, Path | None]] = ()) -> Path:
    """The real path an output will be written to, or OutputError. ``inputs``: (how the error
    names it, path) for every file the run reads; the output may be none of them."""
    text = os.fspath(value)
    if not str(text).strip():
        raise OutputError(f"{what} {text!r}: an empty path; name a file")
    try:
        path = files.user_path(text, what)
    except files.FileProblem as e:
        raise OutputError(str(e)) from None
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot be checked ({e.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise OutputError(f"{what} {path}: is {files.kind_of(st.st_mode)}, not a regular file")
    if not real.parent.is_dir():
        raise OutputError(f"{what} {path}: folder {real.parent} does not exist")
    if not os.access(real.parent, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: folder {real.parent} is not writable")
    if st is not None and not os.access(real, os.W_OK):
        raise OutputError(f"{what} {path}: not writable")
    not_an_input(path, what, inputs)
    return real


def not_an_input(path: Path, what: str, inputs: Iterable[tuple[str, Path | None]]) -> None:
    """OutputError when ``path`` is one of ``inputs`` by inode (a hard link, a symlink, another
    spelling of the same file); a path that does not exist yet is none of them."""
    mine = _identity(Path(path))
    if mine is None:
        return
    for name, other in inputs:
        if other is not None and _identity(Path(other)) == mine:
            same = "is" if os.path.realpath(other) == os.path.realpath(path) else "is the same file as"
            raise OutputError(f"{what} {path}: {same} {name} {other} (another name for it); "
                              f"blockwidth never writes over its inputs")


def write_output(path: Path, data: bytes, what: str,
                 inputs: Iterable[tuple[str, Path | None]] = ()) -> Path:
    """Check ``path`` again (it may have changed since) and write ``data`` (UTF-8 text) with the
    one atomic writer; OutputError, one line, when it cannot be written."""
    from blockwidth.console import atomic

    real = check_output(path, what, inputs)
    try:
        atomic.replace(real, data.decode("utf-8"))
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot be written ({e.strerror or e})") from None
    return real


# ---- what was kept, for the one line a late failure prints ---------------------------------

_KEPT: list[tuple[str, str]] = []


def keep(what: str, path: Path | str) -> None:
    """Something this run wrote and will keep (a record, a profile entry): a later failure names it."""
    _KEPT.append((what, str(path)))


def kept_note() -> str:
    """``; kept: record /x.json`` ("" when this run wrote nothing)."""
    if not _KEPT:
        return ""
    return "; kept: " + ", ".join(f"{w} {p}" for w, p in _KEPT)


def forget_kept() -> None:
    _KEPT.clear()


# ---- stdout that cannot be written --------------------------------------------------------

class StreamError(BlockwidthError, OSError):
    """stdout could not be written (a full disk, ``> /dev/full``, a closed pipe): an OSError
    (``errno``, ``strerror``) that the command line says in one line (``stdout_failed``)."""

    def __init__(self, errno_: int | None, strerror: str | None) -> None:
        super().__init__(f"stdout cannot be written ({strerror})")
        self.errno, self.strerror = errno_, strerror


class _Guarded:
    """A text stream whose write failures say which stream failed (every other OSError is
    the program's own, and stays a bug)."""

    def __init__(self, raw: TextIO, name: str) -> None:
        self._raw, self._name = raw, name

    def write(self, s: str) -> int:
        try:
            return self._raw.write(s)
        except OSError as e:
            raise StreamError(e.errno, e.strerror) from None

    def flush(self) -> None:
        try:
            self._raw.flush()
        except OSError as e:
            raise StreamError(e.errno, e.strerror) from None

    def __getattr__(self, name: str):
        return getattr(self._raw, name)


def guard_stdout() -> None:
    if not isinstance(sys.stdout, _Guarded) and sys.stdout is not None:
        sys.stdout = _Guarded(sys.stdout, "stdout")  # type: ignore[assignment]


def unguard_stdout() -> None:
    if isinstance(sys.stdout, _Guarded):
        sys.stdout = sys.stdout._raw  # type: ignore[assignment]


def stdout_failed(e: StreamError) -> int:
    """Say in one line that stdout failed and what was kept; stop later flushes from failing
    again at exit. A reader that left (``| head``) is told nothing: 128 + SIGPIPE, as before."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
    if e.errno == errno.EPIPE:
        return ExitCode.BROKEN_PIPE
    with contextlib.suppress(OSError):
        print(f"blockwidth: error: stdout cannot be written ({shown(e.strerror)}){kept_note()}",
              file=sys.stderr)
    return ExitCode.USAGE
