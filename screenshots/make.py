"""Regenerate the screenshots in this folder from the real commands on the demo pair.

    .venv/bin/python screenshots/make.py

Each SVG is the terminal output of one `blockwidth` command, rendered by Rich.
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


async def console_shot() -> None:
    """The console after an A/B session on the demo pair, saved with Textual's own screenshot."""
    sys.path.insert(0, str(ROOT))
    os.environ["XDG_CONFIG_HOME"] = "/tmp/blockwidth-screenshot-config"
    from console.app import BlockwidthApp, Options

    app = BlockwidthApp(Options(device="cpu", record_dir="/tmp/blockwidth-screenshot-records"))
    async with app.run_test(size=(132, 44)) as pilot:
        await pilot.pause()
        await app.workers.wait_for_complete()
        app.query_one("#widths").value = "2,4,8"
        app.query_one("#tokens").value = "64"
        await pilot.press("a")
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        app.save_screenshot("console.svg", str(HERE))
        await pilot.press("right")  # the Identity tab
        app.query_one("TabbedContent").active = "tab-identity"
        await pilot.pause()
        app.save_screenshot("console-identity.svg", str(HERE))
    print(f"wrote {HERE / 'console.svg'}, {HERE / 'console-identity.svg'}")


def main() -> int:
    import asyncio

    asyncio.run(console_shot())
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="120",
               XDG_CONFIG_HOME="/tmp/blockwidth-screenshot-config")
    for name, args in SHOTS.items():
        p = subprocess.run([sys.executable, "-m", "console.cli", *args], capture_output=True,
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
