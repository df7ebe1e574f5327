"""Words and styles more than one part of the console draws with."""

from __future__ import annotations

from pathlib import Path

from blockwidth.console.outcome import Tone
from blockwidth.policy.text import shown

TONE_STYLE = {Tone.GOOD: "bold green", Tone.PLAIN: "bold", Tone.WARN: "bold yellow", Tone.BAD: "bold red",
              Tone.STOPPED: "bold yellow"}


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else words or word + 's'}"


def short_path(path: Path | None, demo: bool) -> str:
    if path is None:
        return "(prompt lookup: no checkpoint)"
    if demo:
        return f"demo pair: {path.name}"
    home = str(Path.home())
    s = str(path)
    return shown("~" + s[len(home):] if s.startswith(home + "/") else s)
