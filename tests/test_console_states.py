"""The console's screen in each state, at 80x24 and 140x40, against stored snapshots.

States come from fixed figures (tests/states.py), so a snapshot fails only when what
the console draws changes. After an intended change:
    .venv/bin/python -m pytest tests/test_console_states.py --snapshot-update
and look at the new SVGs in tests/__snapshots__/ before committing them.
"""

import pytest

from tests.states import STATES, enter, make_app


@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
@pytest.mark.parametrize("state", STATES)
def test_console_state_snapshot(state, size, snap_compare, tmp_path):
    app = make_app(tmp_path)

    async def run_before(pilot):
        await enter(app, pilot, state)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_results_below_the_fold_are_reachable_by_keyboard_at_80x24(tmp_path):
    import asyncio

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "done")
            results = app.query_one("#results")
            assert app.focused is results and results.max_scroll_y > 0  # more than fits
            await pilot.press("end")
            await pilot.pause()
            assert results.scroll_y == results.max_scroll_y
            details = app.query_one("#details")
            assert details.region.bottom <= results.region.bottom  # the record line is on screen

    asyncio.run(go())


def test_console_save_and_delete_keep_the_operators_comment(tmp_path):
    """s then d (with its confirmation) from the keyboard; the hand-written comment survives both."""
    import asyncio

    from policy import profile

    p = tmp_path / "p.toml"
    p.write_text('schema = 1\n\n# our H200: measured by hand, keep\n[[override]]\nbackend = "cuda"\n'
                 'compute_capability = "9.0"\ndrafter_kind = "model"\nwidth = 8\n')

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "done")  # w4 wins and can be saved
            await pilot.press("s")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert [e.width for e in profile.load(p).entries] == [8, 4]
            assert "# our H200: measured by hand, keep" in p.read_text()
            await pilot.press("4")
            await pilot.pause()
            await pilot.press("down", "d")
            await pilot.pause()
            await pilot.press("y")
            await app.workers.wait_for_complete()
            await pilot.pause()

    asyncio.run(go())
    assert [e.width for e in profile.load(p).entries] == [8]
    assert "# our H200: measured by hand, keep" in p.read_text()


def test_the_records_tab_colours_only_what_save_would_take(tmp_path):
    """An undecided session's record showed green in the Records tab (its stored flag said
    saveable) while save refused it: the tab now says why not, by the rule save applies."""
    import asyncio

    from console import records
    from engine import record
    from tests.states import demo_pair, fixture_session

    undecided = fixture_session()
    for arm in undecided.arms:
        for run, c in zip(arm.runs, undecided.classic.runs):
            run.decode_s = c.decode_s
    from engine.ab import decide

    decide(undecided)
    host = {"device": {"backend": "cpu"}}
    old = record.build(undecided, demo_pair(), host)
    old["decision"]["saveable"] = True  # as records were written before the one rule
    records.write(old, tmp_path / "rec")
    win = record.build(fixture_session(), demo_pair(), host)
    win["created"] = "2030-01-01T00:00:00Z"  # listed first
    records.write(win, tmp_path / "rec")

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "idle")
            await pilot.press("5")
            await app.workers.wait_for_complete()
            await pilot.pause()
            table = app.query_one("#records-table")
            cells = [table.get_row_at(i)[-1] for i in range(table.row_count)]
            assert [(str(c), str(c.style)) for c in cells] == [
                ("width 4 beats classic", "green"), ("not saveable (undecided): undecided", "yellow")]

    asyncio.run(go())
