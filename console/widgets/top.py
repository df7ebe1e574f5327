"""The top of the console: the resolution panel, the pair panel and the error line.

The two panels draw the app's reactive state (bound with ``data_bind``); on narrow terminals
(the screen's ``-narrow`` breakpoint class) they say less, so they redraw when resized.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.reactive import var
from textual.widgets import Static

from blockwidth.console.outcome import Tone, in_effect_note
from blockwidth.console.state import ResolutionView, SessionView
from blockwidth.console.widgets.common import TONE_STYLE, narrow, short_path
from blockwidth.policy.resolve import keyed_on
from blockwidth.policy.text import folder_label, shown


def in_effect(session_view: SessionView | None, view: ResolutionView | None) -> tuple[str, Tone] | None:
    """What the shown session says about the width in effect (None: nothing to say)."""
    if session_view is None or session_view.session is None or view is None or view.res is None:
        return None
    return in_effect_note(session_view.session, view.res.engine_width)


class _Panel(Static):
    """A top panel: says less on a narrow screen, so it redraws when its size changes."""

    def draw(self) -> None:
        raise NotImplementedError

    def on_resize(self) -> None:
        # After the refresh, not in the handler: a size change met while Textual lays out the
        # resized screen would not lay the panel out again, and its new lines would be cut.
        self.call_after_refresh(self.draw)


class ResolutionPanel(_Panel):
    """The width in effect, its source, the reason and what it was keyed on. ``profile``: the
    profile's path, which a narrow panel's reason names by its file name alone."""

    resolution: var[ResolutionView | None] = var(None)
    session_state: var[SessionView | None] = var(None)

    def __init__(self, *args: Any, profile: Path | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.profile = profile

    def watch_resolution(self) -> None:
        self.draw()

    def watch_session_state(self) -> None:
        self.draw()

    def draw(self) -> None:
        view = self.resolution
        if view is None:
            self.update("resolving…")
            return
        res = view.res
        if res is None:
            self.update(Text("no resolution", style="bold red"))
            return
        width = str(res.width) if res.width is not None else "classic"
        head = Text.assemble(("width ", "bold"), (width, "bold green"), f" · source {res.source.value}",
                             (" · STALE" if res.stale else "", "yellow"))
        note = in_effect(self.session_state, view)
        if note:
            head.append(f"  {note[0]}", style=TONE_STYLE[note[1]])
        keyed = f"keyed on {keyed_on(res.device, res.quantization)}"
        reason = shown(res.reason)
        if narrow(self):
            # two lines at most: after a save at 80x24 the profile's reason (file, line, pair,
            # prompt) took four and pushed the table below the fold; y and the Profile tab say the
            # rest. The profile by its file name (the Profile tab's first line has the path): a
            # deep folder pushed the file and its line off the two lines (a tryout).
            if self.profile is not None and res.entry is not None:
                for after in (" line ", ";"):
                    reason = reason.replace(f" in {shown(self.profile)}{after}", f" in {shown(self.profile.name)}{after}")
            reason = _lines(reason, self.content_size.width, 2)
        self.update(Text.assemble(head, "\n", reason, *(() if narrow(self) else ("\n", keyed))))


def _lines(text: str, width: int, most: int) -> str:
    """``text`` wrapped to ``width`` columns, cut to ``most`` lines at a whole word with an
    ellipsis, its open parentheses closed after it (a tryout read "measured on target-…": cut
    inside a word, the reason's parenthesis left open)."""
    import textwrap

    if width < 8:  # not laid out yet: drawn again on resize
        return text
    wrap = textwrap.TextWrapper(width, break_long_words=True, break_on_hyphens=False)
    lines = wrap.wrap(text)
    if len(lines) <= most:
        return text
    kept, last = lines[: most - 1], lines[most - 1]
    while True:
        opened = " ".join([*kept, last])
        close = "…" + ")" * max(opened.count("(") - opened.count(")"), 0)
        if len(last) + len(close) <= width or " " not in last.strip():
            break
        last = last.rstrip().rsplit(" ", 1)[0].rstrip(" ;,:")  # a word at a time, no separator left
    return "\n".join([*kept, last[: width - len(close)] + close])


class PairPanel(_Panel):
    """The pair and device once resolved, and why the pair did not load. That failure is said
    here only, where the operator reads which pair this is; every redraw keeps it until another
    pair is opened."""

    resolution: var[ResolutionView | None] = var(None)
    load_error: var[str | None] = var(None)

    def watch_resolution(self) -> None:
        self.draw()

    def watch_load_error(self) -> None:
        self.draw()

    def draw(self) -> None:
        view, error = self.resolution, self.load_error
        if view is None and error is None:
            self.update("loading the pair…")  # a pair is being opened
            return
        lines: list[Text] = []
        if view is not None and view.res is not None:
            res, paths, info = view.res, view.paths, view.info
            drafter = short_path(paths.drafter, paths.demo)
            lines = [Text.assemble(("target  ", "bold"), short_path(paths.target, paths.demo)),
                     Text.assemble(("drafter ", "bold"), f"{drafter}  ({info.kind.value})"),
                     Text.assemble(("device  ", "bold"), res.device.describe())]
            if narrow(self):
                # named as the pair line names them (a tryout read "bf16" here, "smollm2/bf16" there)
                d = folder_label(paths.drafter) if paths.drafter else "prompt lookup"
                lines = [Text.assemble(("pair ", "bold"), shown(f"{'demo: ' if paths.demo else ''}{folder_label(paths.target)}"
                                       f" + {d} ({info.kind.value}) · {res.device.describe()}"))]
        if error is not None:
            lines.append(Text(f"pair not loaded: {shown(error)}", style="red"))
        if not lines:
            return  # the resolution failed before the pair answered: what is shown stays
        t = Text("\n").join(lines)
        # A path is cut at the edge, never broken mid-word; a failure wraps, so all of it shows.
        t.no_wrap, t.overflow = error is None, "ellipsis"
        self.update(t)


class ErrorLine(Static):
    """One line for what went wrong. A key's refusal ("nothing to do") is taken away by the
    next action that works (``clear_refusal``); other errors stay until their cause is redone."""

    refusal_shown = False
    field: str | None = None  # the A/B field the error is about: editing it takes the error away

    def show(self, text: str, refusal: bool = False, field: str | None = None) -> None:
        self.update(Text(shown(text)))  # one line, whatever the error quotes
        self.set_class(not text, "-empty")
        self.refusal_shown = bool(text) and refusal
        self.field = field if text else None

    def clear_field(self, field: str | None) -> None:
        """The field an error was about was edited (a tryout's "n must be at least 1" stayed
        up after n was fixed, until the next run)."""
        if field is not None and field == self.field:
            self.show("")

    def clear_refusal(self) -> None:
        if self.refusal_shown:
            self.show("")
