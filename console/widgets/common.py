"""Words and styles more than one part of the console draws with."""

from __future__ import annotations

import re

from pathlib import Path

from blockwidth.console.outcome import Tone
from blockwidth.policy.text import shown

TONE_STYLE = {Tone.GOOD: "bold green", Tone.PLAIN: "bold", Tone.WARN: "bold yellow", Tone.BAD: "bold red",
              Tone.STOPPED: "bold yellow"}


def narrow(widget) -> bool:
    """Whether ``widget`` is on a screen under 100 columns (the app's ``-narrow`` breakpoint),
    where the panels, the Profile table and the status line say less."""
    return widget.is_attached and widget.screen.has_class("-narrow")


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else words or word + 's'}"


_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")


def to_minute(stamp: str) -> str:
    """An ISO time ("2026-12-05T14:11:30Z") to the minute, as the tables show it ("2026-12-05
    14:11"): at 80 columns the seconds and the zone took the room of the verdict; anything
    else as it is."""
    return stamp[:16].replace("T", " ") if _STAMP.match(stamp) else stamp


def short_path(path: Path | None, demo: bool) -> str:
    if path is None:
        return "(prompt lookup: no checkpoint)"
    if demo:
        return f"demo pair: {path.name}"
    home = str(Path.home())
    s = str(path)
    return shown("~" + s[len(home):] if s.startswith(home + "/") else s)
