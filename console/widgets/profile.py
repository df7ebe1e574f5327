"""Tab 4: the profile's entries, each with its static --check mark for the resolved device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.reactive import var
from textual.widgets import DataTable, Static, TabPane

from blockwidth.console.messages import ProfileRead
from blockwidth.console.state import ResolutionView
from blockwidth.console.widgets.common import narrow, plural, to_minute
from blockwidth.policy.text import error_lines, shown
from blockwidth.policy.profile import ProfileError

MARK_STYLE = {"pass": "green", "warn": "yellow", "stale": "yellow", "skip": "dim", "fail": "bold red",
              "unchecked": "dim"}


def quant_label(scheme: str | None, bits: int | None) -> str:
    if scheme is None:
        return "any"
    if scheme == "none":
        return "unquantized"
    return f"{scheme} {bits}-bit" if bits else scheme


class ProfileTab(TabPane):
    """Re-read whenever the resolution changes (a save or a delete re-resolves), in a thread."""

    resolution: var[ResolutionView | None] = var(None)

    def __init__(self, title: str, *, path: Path, id: str) -> None:
        super().__init__(title, id=id)
        self.path = path
        self.entries: list[Any] = []
        self.marks: list[Any] = []  # each entry's --check mark, as the table shows them
        self.unreadable: str | None = None  # why the profile does not read, where it does not
        self._generation = 0  # reads started; only the latest one's answer is drawn
        self._columns_narrow: bool | None = None  # which columns the table has (None: none yet)

    def compose(self) -> ComposeResult:
        yield Static("", id="profile-path")
        yield DataTable(id="profile-table", cursor_type="row")
        # the highlighted entry's check and why, wrapped: the why is the table's last column,
        # past the right edge at 80 columns (a tryout saw "fail" and no reason)
        yield Static("", id="profile-detail")

    # Under 100 columns (the screen's -narrow class) the table has the columns that fit 80: the
    # backend and its compute capability in one, the day an entry was measured without the
    # minute, and neither the pair nor the why, which the line below it says for the highlighted
    # entry (at 80 columns "identical", "pair" and "why" ran past the edge: a tryout).
    COLUMNS = ("check", "backend", "cc", "target", "kind", "width", "mlx", "measured", "identical", "pair", "why")
    NARROW_COLUMNS = ("check", "device", "target", "kind", "width", "mlx", "measured", "identical")

    def on_mount(self) -> None:
        self._fill()

    def on_resize(self) -> None:
        # after the refresh, once the screen's breakpoint class follows the new size
        self.call_after_refresh(self._refit)

    def _refit(self) -> None:
        if self._columns_narrow != narrow(self):
            self._fill()

    def _fill(self) -> None:
        """The table's columns for this width, and a row per entry; the cursor stays on its entry."""
        table = self.query_one(DataTable)
        row = table.cursor_row
        is_narrow = self._columns_narrow = narrow(self)
        table.clear(columns=True)
        table.add_columns(*(self.NARROW_COLUMNS if is_narrow else self.COLUMNS))
        for e, mark in zip(self.entries, self.marks):
            check = Text(mark.mark.value, style=MARK_STYLE[mark.mark.value])
            width = "decline" if e.decline else str(e.width)
            measured = to_minute(shown(e.measured_at or "-"))
            identical = "yes" if e.byte_identical else "NO"
            if is_narrow:
                device = e.backend.value + (f" {e.compute_capability}" if e.compute_capability else "")
                cells = (device, quant_label(e.quant_scheme, e.quant_bits), e.drafter_kind.value,
                         width, shown(e.mlx or "-"), measured[:10], identical)
            else:
                cells = (e.backend.value, e.compute_capability or "-",
                         quant_label(e.quant_scheme, e.quant_bits), e.drafter_kind.value, width,
                         shown(e.mlx or "-"), measured[:16], identical, shown((e.pair or "any")[:12]),
                         shown(mark.why))
            # Text, not str: a DataTable reads a str cell as markup ("[/]" in a file's value
            # raised, "[red]" vanished)
            table.add_row(check, *map(Text, cells))
        if self.entries and row:
            table.move_cursor(row=min(row, len(self.entries) - 1))

    def watch_resolution(self) -> None:
        self.refresh_entries()

    def highlighted(self) -> Any | None:
        """The entry under the table's cursor, if any."""
        row = self.query_one(DataTable).cursor_row
        return self.entries[row] if self.entries and row is not None and row < len(self.entries) else None

    def refresh_entries(self) -> None:
        """Read the profile again, in a thread: its parse and the static check's record reads
        never run on the UI thread."""
        self._generation += 1
        self.read_profile(self._generation, self.resolution)

    @work(thread=True, exit_on_error=False, group="profile", name="read profile")
    def read_profile(self, generation: int, view: ResolutionView | None) -> None:
        from blockwidth.policy import profile as profiles

        try:
            prof = profiles.load(self.path, missing_ok=True)
        except ProfileError as e:
            self.post_message(ProfileRead(generation, None, [], error_lines(e)))
            return
        self.post_message(ProfileRead(generation, prof, self._marks(prof, view)))

    def on_profile_read(self, message: ProfileRead) -> None:
        message.stop()
        if message.generation != self._generation:  # an earlier read, overtaken
            return
        table = self.query_one(DataTable)
        table.clear()
        prof = message.profile
        self.unreadable = (message.error or ["it does not read"])[0] if prof is None else None
        if prof is None:
            self.entries, self.marks = [], []
            self.query_one("#profile-path", Static).update(Text("\n".join(message.error or []), style="red"))
            return
        self.entries = list(prof.entries)
        where = shown(self.path) + ("" if prof.exists else " (not created yet)")
        self.query_one("#profile-path", Static).update(Text(
            f"{where}: {plural(len(prof.entries), 'entry', 'entries')}   "
            f"(s saves the session's winner or decline; d deletes the highlighted entry, after asking)"))
        self.marks = list(message.marks)
        self._fill()

    @on(DataTable.RowHighlighted, "#profile-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        i = event.cursor_row
        detail = self.query_one("#profile-detail", Static)
        if not 0 <= i < min(len(self.marks), len(self.entries)):
            detail.update("")
            return
        mark, e = self.marks[i], self.entries[i]
        detail.update(Text.assemble((f"entry {i + 1}: ", "bold"), f"{e.describe_keys()} -> ",
                                    "decline" if e.decline else str(e.width), "   check ",
                                    (mark.mark.value, MARK_STYLE[mark.mark.value]), f": {shown(mark.why)}"))

    @staticmethod
    def _marks(prof: Any, view: ResolutionView | None) -> list[Any]:
        """The static --check, read-only, for the resolved device: one mark per entry (none
        until the resolution worker has probed the device)."""
        from blockwidth.console.check import EntryMark, Mark, profile_marks

        if view is None or view.res is None:
            return [EntryMark(Mark.UNCHECKED, "no device yet: the resolution has not finished or failed")
                    ] * len(prof.entries)
        return profile_marks(prof, view.res.device)
