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


@pytest.fixture(autouse=True)
def _no_pilot(request, monkeypatch):
    """The console's pilot (a few tokens timed after each pair load) is the subject of the tests
    marked ``pilot`` only: elsewhere it would add seconds to every load, and warn before every
    short session a test runs on purpose."""
    if request.node.get_closest_marker("pilot") is None:
        from blockwidth.console.app import BlockwidthApp

        monkeypatch.setattr(BlockwidthApp, "_pilot", lambda self, pair: None)


@pytest.fixture(scope="session")
def real_models() -> Path:
    """The real models (tests/real.py), converted once and cached across runs: the folder that
    holds ``smollm2/{native,bf16,q8g64}`` and ``gemma3/bf16``."""
    from tests import real

    return real.build()


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
def blockwidth(capfd, monkeypatch):
    """``blockwidth(*args, env=None, cwd=None, stdin=None)``: the CLI's ``main`` run in this
    process, its exit code and what it printed (read at the file descriptors, so a library's own
    writes count too), in the shape :func:`run_cli` gives. For what the process is not the
    subject of (a refusal, a --json answer, a file written): a subprocess costs an MLX import,
    2-4 s on a loaded 2-core machine. Signals, servers, resource limits and the console keep
    :func:`run_cli`."""
    import io

    from blockwidth.console.cli import main

    def run(*args: str, env: dict | None = None, cwd: Path | None = None, stdin: str | None = None) -> Ran:
        capfd.readouterr()  # what the test printed before is not the command's
        auto = sys.modules.get("blockwidth.engine.auto")
        if auto is not None:
            auto.forget()  # a process starts with no auto controller calibrated
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
        out, err = capfd.readouterr()
        return Ran(int(code), out, err)

    return run


_DEMO_PAIRS: dict = {}


def demo_pair(kind: str | None = None, variant: str = "bf16"):
    """The demo pair, loaded once a process: ``kind``'s demo drafter (the draft model when None,
    none for ``lookup``) and the ``variant`` target. Shared by every test that only reads a pair,
    as the engine does (a run's caches are its own, and a pair is never changed by a run); a test
    whose subject is loading calls ``load_pair`` itself."""
    if (kind, variant) not in _DEMO_PAIRS:
        from blockwidth.console.inputs import pair_paths
        from blockwidth.engine.pair import load_pair

        paths = pair_paths(None, None, variant=variant, kind=kind)
        _DEMO_PAIRS[kind, variant] = load_pair(paths.target, paths.drafter, kind)
    return _DEMO_PAIRS[kind, variant]


@pytest.fixture(scope="session")
def demo_pairs():
    """:func:`demo_pair`, as a fixture: ``demo_pairs(kind, variant)``."""
    return demo_pair


def clocked_decodes(monkeypatch, speeds: dict) -> None:
    """Sessions decode for real and only the runs' clocks are set: run i of an arm (None:
    classic) took the i-th of ``speeds[arm]`` (an iterable) tok/s, so its verdicts are known
    whatever the machine's load."""
    from blockwidth.engine import ab

    its = {width: iter(v) for width, v in speeds.items()}
    real = ab.decode

    def timed(pair, prompt, max_tokens, width, **kw):
        run = real(pair, prompt, max_tokens, width, **kw)
        run.decode_s = len(run.tokens) / next(its[width])
        return run

    monkeypatch.setattr(ab, "decode", timed)
