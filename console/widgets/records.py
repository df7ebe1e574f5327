"""Tab 5: past session records for this pair and device, and the highlighted one as Markdown.

Records are read, and each one's Markdown rendered, in thread workers: a record can hold
every round of every run, so a cursor move never renders on the UI thread. Each record's
Markdown is kept once rendered (records are written once and never change).
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static, TabPane

from blockwidth.console.messages import PreviewRendered, RecordsRead
from blockwidth.console.widgets.common import plural, to_minute
from blockwidth.policy.text import shown, shown_block

MAX_RECORDS = 200  # newest first; older ones stay on disk


class RecordsTab(TabPane):
    def __init__(self, title: str, *, record_dir: Path, id: str) -> None:
        super().__init__(title, id=id)
        self.record_dir = record_dir
        self.rows: list[tuple[Path, dict]] = []
        self._markdown: dict[Path, str] = {}
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
        self._markdown = {p: md for p, md in self._markdown.items() if p in listed}
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
            table.add_row(to_minute(shown(rec.get("created", "?"))),
                          shown(",".join(map(str, widths if isinstance(widths, list) else [widths]))),
                          shown(cfg.get("n", "?")), shown(cfg.get("max_tokens", "?")), verdict)
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
        if path in self._markdown:
            self._show(path)
        else:
            self.render_markdown(path, rec)

    @work(thread=True, exclusive=True, exit_on_error=False, group="preview", name="render record")
    def render_markdown(self, path: Path, rec: dict) -> None:
        from blockwidth.engine.session import record

        try:
            text = shown_block(record.markdown(rec))
        except (KeyError, TypeError, ValueError, AttributeError) as e:  # a record this version cannot read
            text = f"{shown(path)}: cannot be shown ({type(e).__name__}: {shown(e)})"
        self.post_message(PreviewRendered(path, text))

    def on_preview_rendered(self, message: PreviewRendered) -> None:
        message.stop()
        self._markdown[message.path] = message.markdown
        if self.highlighted() == message.path:  # the cursor may have moved on meanwhile
            self._show(message.path)

    def _show(self, path: Path) -> None:
        self.query_one("#record-preview", Static).update(Text(self._markdown[path]))
