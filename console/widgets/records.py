"""Tab 5: past session records for this pair and device, and the highlighted one as Markdown.

Records are read, and each one's Markdown rendered, in thread workers: a record can hold
every round of every run, so a cursor move never renders on the UI thread. Each record's
Markdown is kept once rendered (records are written once and never change). The preview
shows the Markdown's text as it is and its tables in columns (``preview``).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static, TabPane

from blockwidth.console.messages import PreviewRendered, RecordsRead
from blockwidth.console.widgets.common import plural, to_minute
from blockwidth.policy.text import shown, shown_block

MAX_RECORDS = 200  # newest first; older ones stay on disk


def preview(markdown: str) -> RenderableType:
    """A record's Markdown for the Records tab: its text as it is, each table in columns that
    share the line's width, a row on a line (a tryout at 80 columns read rows wrapped onto the
    next line at column 0, no cell under its heading). A table whose rows do not all have its
    heading's cells (a "|" inside a cell) stays as written."""
    parts: list[RenderableType] = []
    text: list[str] = []
    lines = markdown.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        j = i
        while j < len(lines) and lines[j].startswith("|"):
            j += 1
        table = _table(lines[i:j]) if j > i else None
        if table is None:
            text.extend(lines[i:max(j, i + 1)])
        else:
            if text:
                parts.append(Text("\n".join(text)))
                text = []
            parts.append(table)
        i = max(j, i + 1)
    if text:
        parts.append(Text("\n".join(text)))
    return Group(*parts)


def _longest_word(text: str) -> int:
    return max((cell_len(word) for word in text.split()), default=0)


def _widths(head: list[str], rows: list[list[str]], cell=cell_len) -> list[int]:
    """Each column's width: its heading's longest word (headings wrap), and ``cell`` of each of
    its cells (whole cells, or their longest words where the cells may wrap)."""
    return [max([_longest_word(name)] + [cell(row[i]) for row in rows]) for i, name in enumerate(head)]


def _cells(line: str) -> list[str]:
    # GFM: a cell's own "|" is written "\\|" (engine.session.record escapes request ids so)
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def _table(lines: list[str]) -> _Columns | None:
    """A Markdown table (heading, ``|---|`` rule, rows) as columns; None if it is not one."""
    if len(lines) < 2 or set(lines[1].replace("|", "").replace(":", "").strip()) != {"-"}:
        return None
    head, rows = _cells(lines[0]), [_cells(line) for line in lines[2:]]
    if any(len(row) != len(head) for row in rows):
        return None
    return _Columns(head, rows, lines)


class _Columns:
    """A table laid out for the width it is drawn at: its headings wrap before its cells (a row
    of figures on one line, "decode tok/s" over "min / med / max"); where the cells' own spaces
    around "/" are what does not fit, they go ("40.0/41.0/42.0"); where even that does not fit,
    the cells wrap at their spaces, under their own heading."""

    GAP = 2

    def __init__(self, head: list[str], rows: list[list[str]], lines: list[str]) -> None:
        self.head, self.rows, self.lines = head, rows, lines

    def _table(self, room: int) -> Table | Text:
        gaps = self.GAP * (len(self.head) - 1)
        tight = ([h.replace(" / ", "/") for h in self.head], [[c.replace(" / ", "/") for c in r] for r in self.rows])
        for head, rows in ((self.head, self.rows), tight):
            widths = _widths(head, rows)
            spare = room - gaps - sum(widths)
            if spare >= 0:
                whole = [max(w, cell_len(name)) for w, name in zip(widths, head)]
                # the headings on one line where they all fit, else each wrapped over its cells
                return self._build(head, rows, whole if sum(whole) - sum(widths) <= spare else widths)
        # the cells wrap at their spaces: the column with the most to spare above its longest
        # word gives a column at a time, so no word is broken while the longest ones fit
        least = _widths(self.head, self.rows, _longest_word)
        widths = _widths(self.head, self.rows)
        while sum(widths) + gaps > room:
            i = max(range(len(widths)), key=lambda k: widths[k] - least[k])
            if widths[i] <= least[i]:  # not even the words fit: the rows as written, figures whole
                return Text("\n".join(self.lines), no_wrap=False)
            widths[i] -= 1
        return self._build(self.head, self.rows, widths)

    def _build(self, head: list[str], rows: list[list[str]], widths: list[int]) -> Table:
        # the box's blank divider and one column of padding: GAP columns between cells
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, self.GAP - 1, 0, 0))
        for i, name in enumerate(head):
            # each heading wrapped to its column's width, so that rich keeps the width given
            # Text, not str: rich reads a str as markup (a request id "q[/]" raised, "list[int]" lost "[int]")
            table.add_column(Text("\n".join(textwrap.wrap(name, widths[i]))), overflow="fold", width=widths[i])
        for row in rows:
            table.add_row(*map(Text, row))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self._table(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self._table(options.max_width))


class RecordsTab(TabPane):
    def __init__(self, title: str, *, record_dir: Path, id: str) -> None:
        super().__init__(title, id=id)
        self.record_dir = record_dir
        self.rows: list[tuple[Path, dict]] = []
        self._previews: dict[Path, RenderableType] = {}
        # the (pair id, backend) the table is for: a read that returns for another is dropped
        # (after `o`, the demo's list came back under the new pair's name)
        self._want: tuple[str | None, str | None] | None = None

    def compose(self) -> ComposeResult:
        yield Static("past sessions for this pair and device", id="records-head")
        with VerticalScroll():
            yield DataTable(id="records-table", cursor_type="row")
            yield Static("", id="record-preview")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("created", "widths", "n", "tokens", "verdict")

    def highlighted(self) -> Path | None:
        """The record under the table's cursor, if any."""
        i = self.query_one(DataTable).cursor_row
        return self.rows[i][0] if self.rows and i is not None and i < len(self.rows) else None

    def show_for(self, pair_id: str | None, backend: str | None) -> None:
        """Read the records of this pair on this backend; no pair (one loading, or none
        opened): an empty table that says so, never every pair's sessions under this one's name."""
        self._want = (pair_id, backend)
        if pair_id is None:
            self.rows = []
            self.query_one(DataTable).clear()
            self.query_one("#record-preview", Static).update("")
            self.query_one("#records-head", Static).update(
                "no pair open yet: its past sessions show here once it has loaded")
            return
        self.read(pair_id, backend)

    @work(thread=True, exclusive=True, exit_on_error=False, group="records", name="read records")
    def read(self, pair_id: str, backend: str | None) -> None:
        """The records of this pair (``pair_id``) on this backend (None, not resolved yet: any);
        show_for says "no pair open" itself."""
        from blockwidth.engine.session import record

        rows = []
        for path in sorted(self.record_dir.glob("session-*.json"), reverse=True)[:MAX_RECORDS]:
            try:
                rec = record.load(path)  # bounded: a FIFO or a 1 GiB file named like a record is skipped
                if rec.get("pair", {}).get("pair_id") != pair_id:
                    continue
                if backend and rec.get("host", {}).get("device", {}).get("backend") != backend:
                    continue
                if not isinstance(rec.get("config", {}), dict) or not isinstance(rec.get("decision", {}), dict):
                    continue
            except (OSError, ValueError, AttributeError):  # not a record (a list, a string for a table)
                continue
            rows.append((path, rec))
        self.post_message(RecordsRead(rows, (pair_id, backend)))

    def on_records_read(self, message: RecordsRead) -> None:
        message.stop()
        if self._want is not None and message.key != self._want:
            return  # read for a pair since closed (or a device since resolved)
        self.rows = message.rows
        listed = {path for path, _ in message.rows}
        self._previews = {p: shown for p, shown in self._previews.items() if p in listed}
        table = self.query_one(DataTable)
        table.clear()
        from blockwidth.engine.session.record import refusal

        for path, rec in message.rows:
            cfg, dec = rec.get("config", {}), rec.get("decision", {})
            # The verdict says whether it could be saved (policy.verdict's rule, as save applies
            # it), so a drifted or undecided "result" never reads as one.
            why = refusal(rec)
            decision = shown(dec.get("decision", "?"))
            # the reason once: a cancelled session's decision is the word "cancelled" (at 80
            # columns "not saveable (cancelled): cancell…" was cut before it said anything)
            said = decision if why is None or decision.startswith(why.value) else f"{why.value}: {decision}"
            verdict = (Text(decision, style="green") if why is None
                       else Text(f"not saveable: {said}", style="yellow"))
            widths = cfg.get("widths", [])
            table.add_row(*map(Text, (to_minute(shown(rec.get("created", "?"))),
                                      shown(",".join(map(str, widths if isinstance(widths, list) else [widths]))),
                                      shown(cfg.get("n", "?")), shown(cfg.get("max_tokens", "?")))), verdict)
        self.query_one("#records-head", Static).update(Text(
            f"{plural(len(message.rows), 'session')} for this pair and device in {shown(self.record_dir)}"
            "   (m exports the highlighted one as Markdown)"))

    @on(DataTable.RowHighlighted, "#records-table")
    def _highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        i = event.cursor_row
        if not 0 <= i < len(self.rows):
            return
        path, rec = self.rows[i]
        if path in self._previews:
            self._show(path)
        else:
            self.render_markdown(path, rec)

    @work(thread=True, exclusive=True, exit_on_error=False, group="preview", name="render record")
    def render_markdown(self, path: Path, rec: dict) -> None:
        from blockwidth.engine.session import record

        try:
            shown_as: RenderableType = preview(shown_block(record.markdown(rec)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a record this version cannot read
            shown_as = Text(f"{shown(path)}: cannot be shown ({type(e).__name__}: {shown(e)})")
        self.post_message(PreviewRendered(path, shown_as))

    def on_preview_rendered(self, message: PreviewRendered) -> None:
        message.stop()
        self._previews[message.path] = message.preview
        if self.highlighted() == message.path:  # the cursor may have moved on meanwhile
            self._show(message.path)

    def _show(self, path: Path) -> None:
        self.query_one("#record-preview", Static).update(self._previews[path])
