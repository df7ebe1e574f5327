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


def main() -> int:
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
