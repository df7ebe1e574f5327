"""Keep the developer's own profile and environment out of every test."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None):
    """Run ``blockwidth`` as a user would, in a subprocess."""
    import subprocess

    full = dict(os.environ)
    full.update(env or {})
    full["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "blockwidth", *args], capture_output=True,
                          text=True, env=full, cwd=cwd or ROOT, timeout=600)
