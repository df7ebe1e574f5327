"""Keep the developer's own profile and environment out of every test; the ways tests run
``blockwidth`` (in this process, or as a user would, in a subprocess) and the demo pair."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "engine/demo/pair"
GiB = 1 << 30

# A test run started in the background by a non-interactive shell (`make test &`) inherits SIGINT
# ignored, and so does every blockwidth the tests start; Python installs no KeyboardInterrupt
# for an ignored SIGINT, so the Ctrl-C tests (costcurve, serve, the served sweep) saw it lost.
# Handled here, it is back to the default in each child at exec (every worker of a session that
# collects tests/, the lab's tests too when they run in the same session, as CI runs them).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _isolated_config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for var in ("BLOCKWIDTH_DRAFT_BLOCK_SIZE", "MLXCEL_DRAFT_BLOCK_SIZE"):
        monkeypatch.delenv(var, raising=False)


def run_cli(*args: str | bytes, env: dict | None = None, cwd: Path | None = None, memory: int | None = None,
            fsize: int | None = None, stdout=subprocess.PIPE, input: str | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``blockwidth ARGS`` as a user would, in a subprocess: for what only a process shows
    (a signal, an exit, a resource limit, stdin, the console refusing before it opens).
    ``memory``: bytes of address space (RLIMIT_AS), so that a regression that grows memory fails
    the test instead of filling the shared machine; ``fsize``: bytes per written file (RLIMIT_FSIZE,
    a larger write fails with EFBIG); ``input``: what waits on stdin."""
    def limits() -> None:
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if fsize:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    full = dict(os.environ)
    full.update(env or {})
    full["PYTHONPATH"] = str(ROOT)
    text = not any(isinstance(a, bytes) for a in args)
    return subprocess.run([sys.executable, "-m", "blockwidth", *args], stdout=stdout, stderr=subprocess.PIPE,
                          input=input, text=text, env=full, cwd=cwd or ROOT, timeout=timeout,
                          preexec_fn=limits if memory or fsize else None)


def one_line(p, code: int = 2) -> str:
    """The refusal's line: exit ``code``, one line on stderr, no traceback, no terminal escape."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "\x1b" not in err, err
    return err


def edit_json(f: Path, change) -> bytes:
    """Apply ``change`` to the JSON in ``f``; the file's bytes after, which a refusal must leave."""
    import json

    data = json.loads(f.read_text())
    change(data)
    f.write_text(json.dumps(data))
    return f.read_bytes()


class Ran:
    """What ``blockwidth ARGS`` did, in the shape of subprocess.CompletedProcess."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr

    def __repr__(self) -> str:
        return f"Ran(returncode={self.returncode!r}, stdout={self.stdout!r}, stderr={self.stderr!r})"


@pytest.fixture
def blockwidth(capsys, monkeypatch):
    """``blockwidth(*args, env=None, cwd=None, stdin=None)``: the CLI's ``main`` in this process,
    its exit code and what it printed, as :func:`run_cli` gives them. The process is what a
    refusal, a --json answer or a file written is not about, and a subprocess costs an MLX
    import (2-4 s on a loaded 2-core machine); signals, servers, resource limits and the console
    keep :func:`run_cli`."""
    import io

    from blockwidth.console.cli import main

    def run(*args: str, env: dict | None = None, cwd: Path | None = None, stdin: str | None = None) -> Ran:
        capsys.readouterr()  # what the test printed before is not the command's
        with monkeypatch.context() as m:
            for k, v in (env or {}).items():
                m.setenv(k, v)
            if cwd is not None:
                m.chdir(cwd)
            m.setattr(sys, "stdin", io.StringIO(stdin or ""))
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's refusals leave through exit(), as in the program
                code = e.code if isinstance(e.code, int) else 1
        out, err = capsys.readouterr()
        return Ran(int(code), out, err)

    return run
