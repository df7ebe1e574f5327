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
