"""The one atomic writer: a file is written beside its final name, flushed to disk, then put in
place whole, so that a reader never sees half of it and a crash leaves the old file (or none).

``replace`` puts it over what is there (the profile); ``create`` claims the first free name of
several and never replaces a file (records). A temp file is ``.<prefix>.<random>.tmp`` beside the
target, so each writer can find and clean the ones a killed process left.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterable


def _temp(directory: Path, prefix: str, text: str, mode: int) -> str:
    """A synced temp file in ``directory`` holding ``text``; its path. OSError as raised."""
    fd, tmp = tempfile.mkstemp(prefix=f".{prefix}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def replace(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole, keeping the file's permissions (0o644 for a new one)."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    tmp = _temp(path.parent, path.name, text, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create(directory: Path, names: Iterable[str], text: str, *, prefix: str, mode: int = 0o644) -> Path:
    """Write ``text`` under the first of ``names`` in ``directory`` that does not exist yet; never
    replaces a file (the name is claimed with link(), which fails when it exists). Raises
    FileExistsError when every name is taken."""
    directory = Path(directory)
    tmp = _temp(directory, prefix, text, mode)
    try:
        for name in names:
            path = directory / name
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                continue
            except OSError:  # a file system without hard links: claim the name, then replace
                try:
                    os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                except FileExistsError:
                    continue
                os.replace(tmp, path)
                return path
        raise FileExistsError(f"{directory}: every name is taken")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
