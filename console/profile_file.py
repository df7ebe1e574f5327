"""The profile file: saving and deleting entries, locked, atomic and merged with what is on
disk now, so that two writers lose nothing and a profile that does not parse or validate is
never overwritten. What the file means (parsing, validation, matching, the edit a save makes)
is ``policy.profile``; this is the console's door to the file.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import re
import time
from pathlib import Path
from typing import Iterator

from blockwidth.console import atomic
from blockwidth.policy import files
from blockwidth.policy import profile as profiles
from blockwidth.policy.errors import ExitCode

LOCK_WAIT_S = 10.0  # a save waits this long for another writer, then says who holds the lock


class ProfileBusy(profiles.ProfileError):
    """Another process held the profile's lock for longer than a save waits: a check that
    failed (the lock stayed held), not bad input."""

    exit_code = ExitCode.CHECK_FAILED


def real_path(path: Path | None) -> Path:
    """Where a write lands: a symlinked profile is written through to its target (the link
    stays a link), and the lock sits beside the target, so writers via either name meet."""
    path = Path(path) if path is not None else profiles.default_path()
    return Path(os.path.realpath(path))


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def check_writable(path: Path | None) -> profiles.Profile:
    """Before any work whose result will be saved: the profile validates and can be written.
    Creates nothing: a read (and this check) never changes a file."""
    shown = Path(path) if path is not None else profiles.default_path()
    prof = profiles.load(shown, missing_ok=True)
    real = real_path(shown)
    problem = profiles.stat_problem(lock_path(real))
    if problem and "no such" not in problem:
        raise profiles.ProfileError(shown, [f"lock file {lock_path(real)} {problem}"])
    if os.path.islink(lock_path(real)) and not lock_path(real).exists():
        raise profiles.ProfileError(shown, [f"lock file {lock_path(real)} is a symbolic link to a missing file"])
    existing = next((p for p in [real.parent, *real.parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise profiles.ProfileError(shown, [f"its parent {existing} is a file, not a directory"])
    if not os.access(existing, os.W_OK | os.X_OK):
        raise profiles.ProfileError(shown, [f"{existing} is not writable"])
    if real.exists() and not os.access(real.parent, os.W_OK | os.X_OK):
        raise profiles.ProfileError(shown, [f"{real.parent} is not writable (a save replaces the file)"])
    return prof


def _lock_holder(fd: int) -> str:
    """Who holds the flock on ``fd``'s file, from /proc/locks (Linux); else 'another process'."""
    try:
        inode = os.fstat(fd).st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
                    continue
                if parts[5].rsplit(":", 1)[-1] == str(inode):
                    pid = parts[4]
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as c:
                            cmd = c.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
                    except OSError:
                        cmd = ""
                    return f"pid {pid}" + (f" ({cmd})" if cmd else "")
    except OSError:
        pass
    return "another process"


def _open_lock(lock: Path, shown: Path) -> int:
    try:
        # O_NOFOLLOW: a symlinked lock file must not create the file it points to.
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            try:  # a link to an existing file is locked through; a dangling one is refused
                return os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                raise profiles.ProfileError(shown, [f"lock file {lock} is a symbolic link to a missing "
                                           f"file; remove it"]) from None
        if e.errno == errno.EISDIR:
            raise profiles.ProfileError(shown, [f"lock file {lock} is a directory; remove it"]) from None
        raise profiles.ProfileError(shown, [f"lock file {lock} cannot be opened ({e.strerror})"]) from None


@contextlib.contextmanager
def _locked(path: Path, shown: Path, wait_s: float) -> Iterator[None]:
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise profiles.ProfileError(shown, [f"its parent {path.parent} is not a directory"]) from None
    except OSError as e:
        raise profiles.ProfileError(shown, [f"{path.parent} cannot be created ({e.strerror})"]) from None
    fd = _open_lock(lock_path(path), shown)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ProfileBusy(shown, [f"locked by {_lock_holder(fd)} for over {wait_s:g}s "
                                              f"({lock_path(path)}); nothing was written"]) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _clean_leftovers(path: Path) -> None:
    """Temp files of writers killed mid-save. Every writer makes its temp file under the
    lock we hold, so any one still here belongs to a dead process."""
    for tmp in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _write(path: Path, text: str, shown: Path) -> None:
    try:
        atomic.replace(path, text)
    except OSError as e:
        raise profiles.ProfileError(shown, [f"cannot be written in {path.parent} ({e.strerror})"]) from None


def _current_text(path: Path, shown: Path, must_exist: bool) -> str | None:
    problem = profiles.stat_problem(path)
    if problem:
        raise profiles.ProfileError(shown, [problem])
    if not path.exists():
        if must_exist:
            raise profiles.ProfileError(shown, ["no such file"])
        return None
    try:
        return files.read_text(path, profiles.MAX_BYTES)
    except files.FileProblem as e:
        raise profiles.ProfileError(shown, [str(e)]) from None


def save(path: Path | None, entry: profiles.Entry, *, wait_s: float | None = None) -> profiles.Profile:
    """Add ``entry`` (replacing one in the same slot) to what is on disk now."""
    shown = Path(path) if path is not None else profiles.default_path()
    real = real_path(shown)
    with _locked(real, shown, LOCK_WAIT_S if wait_s is None else wait_s):
        _clean_leftovers(real)
        text = _current_text(real, shown, must_exist=False)
        if text is not None:
            profiles.parse(text, shown)  # raises, writing nothing, if what is on disk is bad
        _write(real, profiles.edited(text, shown, entry.slot(), entry), shown)
    return profiles.load(shown)


def delete(path: Path | None, entry: profiles.Entry, *, wait_s: float | None = None) -> profiles.Profile:
    """Remove the entry in ``entry``'s slot from what is on disk now."""
    shown = Path(path) if path is not None else profiles.default_path()
    real = real_path(shown)
    with _locked(real, shown, LOCK_WAIT_S if wait_s is None else wait_s):
        _clean_leftovers(real)
        text = _current_text(real, shown, must_exist=True) or ""
        profiles.parse(text, shown)
        _write(real, profiles.edited(text, shown, entry.slot(), None), shown)
    return profiles.load(shown)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
