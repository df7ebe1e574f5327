"""The console's parts: Textual's breakpoints, panels that redraw whole after a resize, and the
Records tab's Markdown rendered off the UI thread, once per record."""

import asyncio
import threading
import tomllib
from pathlib import Path

from tests.conftest import ROOT
from tests.states import demo_pair, enter, fixture_session, make_app


def _lines(app, selector: str) -> list[str]:
    return str(app.query_one(selector).render()).splitlines()


def test_breakpoints_are_textuals_on_the_screen(tmp_path):
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "done")
            assert {"-narrow", "-short"} <= app.screen.classes
            assert not app.query_one("#side").display
            assert app.query_one("#top").styles.layout.name == "vertical"
            await pilot.resize_terminal(200, 50)
            await pilot.pause()
            assert {"-wide", "-tall"} <= app.screen.classes and "-narrow" not in app.screen.classes
            assert app.query_one("#side").display  # the identity diff and the chain beside the results
            await pilot.resize_terminal(200, 36)
            await pilot.pause()
            assert not app.query_one("#side").display
            assert app.query_one("#body").styles.layout.name == "horizontal"  # table beside plot

    asyncio.run(go())


def test_the_top_panels_redraw_whole_after_a_resize(tmp_path):
    """From 80 to 200 columns the panels gain lines (what the width was keyed on; target,
    drafter and device apart). Drawn inside the resize, those lines were cut at the narrow
    height; each panel must be as tall as what it says."""
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "done")
            assert not any(ln.startswith("keyed on") for ln in _lines(app, "#resolution"))
            assert len(_lines(app, "#pair")) == 1
            await pilot.resize_terminal(200, 50)
            for _ in range(3):
                await pilot.pause()
            said = _lines(app, "#resolution")
            assert said[-1].startswith("keyed on")
            assert [ln.split()[0] for ln in _lines(app, "#pair")] == ["target", "drafter", "device"]
            for panel in ("#resolution", "#pair"):
                w = app.query_one(panel)
                assert w.content_region.height >= len(w.render().wrap(w.content_region.width))

    asyncio.run(go())


def _shown(static) -> str:
    """What a Static shows, as plain text at its width (the Records preview is a rich Group)."""
    import io

    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=static.content_size.width, color_system=None).print(static.content)
    return out.getvalue()


def test_records_markdown_is_rendered_off_the_ui_thread_once_per_record(tmp_path, monkeypatch):
    from blockwidth.console import records
    from blockwidth.engine.session import host, record

    rec_dir = tmp_path / "rec"
    for cancelled in (False, True):
        records.write(record.build(fixture_session(cancelled=cancelled), demo_pair(), host.identity()), rec_dir)
    rendered: list[tuple[bool, bool]] = []
    real = record.markdown

    def markdown(rec: dict) -> str:
        rendered.append((rec["cancelled"], threading.current_thread() is threading.main_thread()))
        return real(rec)

    monkeypatch.setattr(record, "markdown", markdown)

    async def settle(app, pilot):
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await enter(app, pilot, "idle")
            await pilot.press("5")
            await settle(app, pilot)
            assert app.query_one("#records-table").row_count == 2
            first = _shown(app.query_one("#record-preview"))
            assert first.startswith("# A/B session")  # the highlighted record's Markdown
            for key in ("down", "up", "down", "up"):
                await pilot.press(key)
                await settle(app, pilot)
            assert _shown(app.query_one("#record-preview")) == first
        return rendered

    seen = asyncio.run(go())
    assert sorted(which for which, _ in seen) == [False, True], seen  # once per record
    assert not any(on_ui for _, on_ui in seen), seen  # never on the UI thread


def test_the_stylesheet_ships_in_the_wheel():
    """CSS_PATH names a file beside app.py; it is package data, or an installed console has no styles."""
    from fnmatch import fnmatch

    from blockwidth.console.app import BlockwidthApp

    sheet = Path(BlockwidthApp.CSS_PATH)
    assert (ROOT / "console" / sheet).is_file()
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert any(fnmatch(sheet.name, pattern) for pattern in data.get("blockwidth.console", [])), data


def test_the_top_panel_drops_a_sessions_note_with_its_results(tmp_path):
    """The note on the width in effect ("best measured here") comes from the shown session: a
    new run clears the results, and the note goes with them (it stayed, about results no longer
    on screen, while the next session ran and after it failed)."""
    from tests.states import request_of

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "done")
            assert "best measured here" in str(app.query_one("#resolution").render())
            s = fixture_session()
            app.begin(request_of(s), s.config.planned_runs)
            await pilot.pause()
            assert "in effect" not in str(app.query_one("#resolution").render())
            assert str(app.query_one("#headline").render()) == ""

    asyncio.run(go())


def test_the_records_preview_shows_bracketed_ids_as_written_and_keeps_figures_whole_when_narrow():
    """A review: the preview's table cells went to rich as str, read as markup, so a request id
    "q[/]" raised MarkupError (the console exited) and "list[int]" showed as "list"; and below
    ~56 columns rich folded figures mid-number ("1.807" over "9"). Cells are Text now, and where
    not even the longest words fit, the table's rows are shown as written."""
    import io

    from rich.console import Console

    from blockwidth.console.widgets.records import preview

    md = ("# A/B session\n\n| request | best | decode tok/s | verdict |\n|---|---|---|---|\n"
          "| q[/] | w4 | 1.8079 / 358.3 | wins |\n| list[int] | classic | 2.5 / 3.5 | slower |\n")

    def shown(width: int) -> str:
        out = io.StringIO()
        Console(file=out, width=width, color_system=None).print(preview(md))
        return out.getvalue()

    wide = shown(80)
    assert "q[/]" in wide and "list[int]" in wide and "1.8079" in wide
    narrow = shown(24)
    assert "1.8079" in narrow and "358.3" in narrow and "list[int]" in narrow, narrow


def test_the_records_preview_measures_wide_characters_by_their_columns():
    """A review: cells were measured by len, so a request id of 8 CJK characters (16 columns)
    got an 8-column cell and wrapped at 80 with room to spare."""
    import io

    from rich.console import Console

    from blockwidth.console.widgets.records import preview

    md = "| request | verdict |\n|---|---|\n| 日本語の質問です | wins |\n"
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(preview(md))
    rows = [line for line in out.getvalue().splitlines() if "wins" in line]
    assert len(rows) == 1 and "日本語の質問です" in rows[0], out.getvalue()


def test_a_request_id_with_a_pipe_keeps_the_records_table_whole():
    """A review: a "|" in a request id split its row into one column more, in the exported
    Markdown and in the preview (which then showed the table as raw text). The record escapes
    it ("\\|", as GFM reads it) and the preview reads it back as the id."""
    import io
    import re

    from rich.console import Console

    from blockwidth.console.widgets.records import preview
    import gzip
    import json

    from blockwidth.engine.session import record
    from tests.conftest import ROOT

    (path,) = (ROOT / "lab/evidence/real-cpu-2026-12-05/file-edits").glob("session-*.json.gz")
    rec = json.loads(gzip.open(path).read())
    rec["requests"][0]["id"] = "a|b"
    md = record.markdown(rec)
    row = next(line for line in md.splitlines() if line.startswith("| a\\|"))
    assert row.startswith("| a\\|b |")
    head = next(line for line in md.splitlines() if line.startswith("| request "))
    assert len(re.split(r"(?<!\\)\|", row)) == len(head.split("|"))
    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(preview(md))
    shown = out.getvalue()
    assert any(line.split()[:1] == ["a|b"] for line in shown.splitlines()), shown
