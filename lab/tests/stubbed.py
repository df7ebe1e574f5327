"""A lab shell script run on this CPU with a stub ``python3`` first on PATH (the stub records its
calls in $CALLS): the GPU-host scripts' steps, order and flags without MLX. Shared by the lease
scripts' tests (test_h200round.py, test_h200exact.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_stubbed(script: Path, tmp_path: Path, stub: str, *args: str, timeout: float,
                **env: str) -> subprocess.CompletedProcess:
    """``bash script args`` from the repository root with ``stub`` as python3, $CALLS, $WORK,
    $PAIR and $OUT under ``tmp_path``, and ``env`` over them."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "python3").write_text(stub)
    (bin_ / "python3").chmod(0o755)
    full = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls"),
            "WORK": str(tmp_path / "w"), "PAIR": str(tmp_path / "w" / "pair"), "OUT": str(tmp_path / "out"),
            **env}
    (tmp_path / "out").mkdir(exist_ok=True)
    return subprocess.run(["bash", str(script), *args], cwd=ROOT, env=full, capture_output=True,
                          text=True, timeout=timeout)
