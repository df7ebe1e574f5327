"""Regenerate the screenshots in this folder from the real commands on the demo pair.

    .venv/bin/python screenshots/make.py [--console-only] [--only NAME.svg]

Each SVG is the terminal output of one `blockwidth` command, rendered by Rich. Commands print
absolute paths (the answer's command works from any folder), so run it from a checkout at a
neutral path (e.g. ~/blockwidth), never a helper's worktree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHOTS = {
    "resolve.svg": ["resolve", "--device", "cpu"],
    "costcurve-4bit.svg": ["costcurve", "--demo-target", "4bit", "--rows", "1-8,16", "--repeats", "5",
                           "--context", "64"],
    "sweep.svg": ["sweep", "--widths", "2,4,8", "-n", "3", "--max-tokens", "64", "--record-dir",
                  "/tmp/blockwidth-screenshot-records"],
}


CONSOLE_SHOTS = {  # name: (state, size, tab)
    "console.svg": ("done", (140, 40), "tab-ab"),
    "console-80x24.svg": ("done", (80, 24), "tab-ab"),
    "console-200x50.svg": ("done", (200, 50), "tab-ab"),
    "console-running.svg": ("running", (100, 30), "tab-ab"),
    "console-refused.svg": ("refused", (100, 30), "tab-ab"),
    "console-identity.svg": ("done", (120, 30), "tab-identity"),
    "console-answer.svg": ("y-model", (100, 30), ""),  # the y dialog
    "console-saved.svg": ("saved", (100, 30), "tab-ab"),
}


async def console_shot(name: str, state: str, size: tuple[int, int], tab: str) -> None:
    """The console in one of the snapshot tests' states (tests/states.py: fixed figures, so
    the pictures change only when the console does), saved with Textual's own screenshot."""
    import shutil
    import tempfile

    from tests.states import enter, make_app

    where = Path(tempfile.gettempdir()) / "blockwidth-screenshot-state"  # one fixed path: the chain shows it
    shutil.rmtree(where, ignore_errors=True)  # a saved state's profile must not leak into the next
    where.mkdir()
    app = make_app(where)
    async with app.run_test(size=size) as pilot:
        await enter(app, pilot, state)
        if tab:  # "": a dialog is open over the tabs
            app.query_one("TabbedContent").active = tab
        await pilot.pause()
        app.save_screenshot(name, str(HERE))
    print(f"wrote {HERE / name}")


def main() -> int:
    import asyncio

    sys.path.insert(0, str(ROOT))
    os.environ["XDG_CONFIG_HOME"] = "/tmp/blockwidth-screenshot-config"
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else None
    for name, (state, size, tab) in CONSOLE_SHOTS.items():
        if only in (None, name):
            asyncio.run(console_shot(name, state, size, tab))
    if "--console-only" in sys.argv:
        return 0
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120",
               XDG_CONFIG_HOME="/tmp/blockwidth-screenshot-config")
    for name, args in SHOTS.items():
        if only not in (None, name):
            continue
        p = subprocess.run([sys.executable, "-m", "blockwidth", *args], capture_output=True,
                           text=True, env=env, cwd=ROOT)
        console = Console(record=True, width=118, file=open(os.devnull, "w"))
        console.print(Text(f"$ blockwidth {' '.join(args)}", style="bold green"))
        console.print(Text(p.stdout.rstrip()))
        if p.returncode:
            console.print(Text(p.stderr.rstrip(), style="red"))
        console.save_svg(str(HERE / name), title=f"blockwidth {args[0]}")
        print(f"wrote {HERE / name} (exit {p.returncode})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
