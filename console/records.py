"""Where session records go and how one is written: atomically (``console.atomic``), under a
name that never replaces another record, cleaning what writers killed mid-write left behind.
What a record holds, and reading one, is ``engine.session.record``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from blockwidth.console import atomic
from blockwidth.policy import files
from blockwidth.policy.integers import IntegerError, parse_int


def default_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("blockwidth")) / "records"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_leftovers(directory: Path) -> list[Path]:
    """Remove temp files of record writers that died mid-write (their pid is in the name);
    a live writer's temp file is left alone. Returns what was removed."""
    removed = []
    for tmp in Path(directory).glob(".record.*.tmp"):
        parts = tmp.name.split(".")
        try:
            pid = parse_int(parts[2], 1, signed=False) if len(parts) > 3 else None
        except IntegerError:
            pid = None
        if pid is not None and _alive(pid):
            continue
        if pid is None and time.time() - tmp.stat().st_mtime < 3600:
            continue  # an older writer's name carries no pid: only remove it once it is old
        try:
            tmp.unlink()
            removed.append(tmp)
        except OSError:
            pass
    return removed


def write(record: dict, directory: Path | None = None) -> Path:
    """Write atomically to ``directory`` (default: the user data dir); return the path.

    The name never collides with an existing record: a second record in the same second, of
    the same prompt, from the same process (a quick cancel-and-rerun in the console) gets a
    suffix instead of replacing the first."""
    directory = Path(directory) if directory else default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    clean_leftovers(directory)
    stamp = record["created"].replace(":", "").replace("-", "")
    base = f"session-{stamp}-{record['prompt']['sha256'][:8]}-{os.getpid()}"
    names = (f"{base}.json" if i == 1 else f"{base}-{i}.json" for i in range(1, 10_000))
    try:
        # 0600, as records have always been written (mkstemp's mode): they name the host's paths
        return atomic.create(directory, names, files.dumps_json(record, indent=1),  # never Infinity
                             prefix=f"record.{os.getpid()}", mode=0o600)
    except FileExistsError:
        raise FileExistsError(f"{directory}: 9,999 records named {base}") from None
