"""The console's screen in each state, at 80x24 and 140x40, against stored snapshots.

States come from fixed figures (tests/states.py), so a snapshot fails only when what
the console draws changes. After an intended change:
    .venv/bin/python -m pytest tests/test_console_states.py --snapshot-update
and look at the new SVGs in tests/__snapshots__/ before committing them.
"""

import pytest

from tests.states import STATES, enter, make_app


# One worker runs every state (an xdist group): the states share one fixed folder, whose path the
# saved states show, and two workers resetting it under each other's consoles made snapshots flaky.
@pytest.mark.xdist_group("console-snapshots")
@pytest.mark.parametrize("size", [(80, 24), (140, 40)], ids=["80x24", "140x40"])
@pytest.mark.parametrize("state", STATES)
def test_console_state_snapshot(state, size, snap_compare):
    import shutil
    import tempfile
    from pathlib import Path

    # One fixed folder: the profile's path is in the reasons a saved state shows.
    where = Path(tempfile.gettempdir()) / "blockwidth-snapshot-state"
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir()
    app = make_app(where)

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

    from blockwidth.policy import profile

    p = tmp_path / "p.toml"
    p.write_text('schema = 1\n\n# our H200: measured by hand, keep\n[[override]]\nbackend = "cuda"\n'
                 'compute_capability = "9.0"\ndrafter_kind = "model"\nwidth = 8\n')

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "done")  # w4 wins and can be saved
            await pilot.press("s", "g")  # generic
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


async def _records_tab(app, pilot):
    """The Records tab of an idle console, read: its table."""
    await enter(app, pilot, "idle")
    await pilot.press("5")
    await app.workers.wait_for_complete()
    await pilot.pause()
    return app.query_one("#records-table")


def test_the_records_tab_colours_only_what_save_would_take(tmp_path):
    """An undecided session's record showed green in the Records tab (its stored flag said
    saveable) while save refused it: the tab now says why not, by the rule save applies."""
    import asyncio

    from blockwidth.console import records
    from blockwidth.engine.session import record
    from tests.states import demo_pair, fixture_session

    undecided = fixture_session()
    for arm in undecided.arms:
        for run, c in zip(arm.runs, undecided.classic.runs):
            run.decode_s = c.decode_s
    from blockwidth.engine.ab import decide

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
            table = await _records_tab(app, pilot)
            cells = [table.get_row_at(i)[-1] for i in range(table.row_count)]
            assert [(str(c), str(c.style)) for c in cells] == [
                ("width 4 beats classic", "green"), ("not saveable: undecided", "yellow")]
            # the minute, not the second and the zone: at 80 columns the verdict is the cell cut
            assert str(table.get_row_at(0)[0]) == "2030-01-01 00:00"

    asyncio.run(go())


def test_the_records_tab_lists_only_the_open_pair_while_pairs_change(tmp_path):
    """After `o` the Records tab listed the demo's sessions under the new pair, then every pair's
    while it loaded (a tryout could have exported the wrong record): a read for a pair since
    closed is dropped, no pair open lists none, and the tab follows a pair opened while shown."""
    import asyncio

    from blockwidth.console import records
    from blockwidth.console.messages import RecordsRead
    from blockwidth.console.widgets.records import RecordsTab
    from blockwidth.engine.session import record
    from tests.states import demo_pair, fixture_session

    host = {"device": {"backend": "cpu"}}
    mine = record.build(fixture_session(), demo_pair(), host)
    records.write(mine, tmp_path / "rec")
    other = record.build(fixture_session(), demo_pair(), host)
    other["pair"]["pair_id"], other["created"] = "another-pair", "2030-01-01T00:00:00Z"
    records.write(other, tmp_path / "rec")

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            table, tab = await _records_tab(app, pilot), app.query_one(RecordsTab)
            assert table.row_count == 1
            # a read for another pair arriving late (its worker outlived the pair): dropped
            tab.post_message(RecordsRead([(tmp_path / "x.json", other)] * 3, ("another-pair", "cpu")))
            await pilot.pause()
            assert table.row_count == 1
            pair = app.pair
            app.pair = None  # as `o` leaves it while the next pair loads
            app._read_records(only_shown=True)
            await pilot.pause()
            assert table.row_count == 0 and "no pair open yet" in str(app.query_one("#records-head").render())
            app.set_pair(pair)  # loaded while the tab is in view: it lists that pair's
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert table.row_count == 1

    asyncio.run(go())


def _run(coro):
    import asyncio

    return asyncio.run(coro)


def test_a_save_asks_for_its_scope_and_the_screen_follows_it(tmp_path):
    """s asks: this pair only (p) or generic (g). After the save the resolution is the saved
    entry, and the table's * and the headline say so (they kept the old width and "s saves it")."""
    from blockwidth.policy import profile
    from tests.states import _save, demo_pair

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "done")
            assert "s saves it" in str(app.query_one("#headline").render())
            await pilot.press("s")
            await pilot.pause()
            assert type(app.screen).__name__ == "SaveScreen"
            await pilot.press("escape")  # saves nothing
            await pilot.pause()
            assert not (tmp_path / "p.toml").exists()
            app._linked = False
            await _save(app, pilot, "p")
            entry = profile.load(tmp_path / "p.toml").entries[0]
            assert entry.pair == demo_pair().pair_id and entry.width == 4
            assert entry.evidence["measured_on"]["target"] == "target-bf16"
            assert app.res.source.value == "profile" and "this pair: a pair-specific entry" in app.res.reason
            assert "saved to the profile" in str(app.query_one("#headline").render())
            table = app.query_one("#arms")
            names = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
            assert names == ["classic", "w2", "w4 *", "w8"]
            await _save(app, pilot, "g")  # the generic one is a second entry
            assert [e.pair for e in profile.load(tmp_path / "p.toml").entries] == [demo_pair().pair_id, None]

    _run(go())


def test_a_stale_session_is_not_offered_for_saving():
    import shutil
    import tempfile
    from pathlib import Path

    where = Path(tempfile.mkdtemp())

    async def go():
        app = make_app(where)
        async with app.run_test(size=(100, 30)) as pilot:
            await enter(app, pilot, "stale")
            head = str(app.query_one("#headline").render())
            assert "stale: a runs the fields on screen" in head and "s saves it" not in head
            await pilot.press("s")
            await pilot.pause()
            assert "fields changed since this run" in str(app.query_one("#error").render())

    _run(go())
    shutil.rmtree(where)


def test_the_sequential_bar_is_the_budget_and_the_cost_curve_bar_starts_empty(tmp_path):
    """In sequential mode the bar sat at "run 22/22" (a total that grows), then at 100 % from the
    first repetition (the seconds budget, spent before the n repetitions ended) while the status
    read "368 of 60 s". The bar is the budget, repetitions or seconds, whichever is nearer its
    end: the n repetitions' planned runs fill their share of it (it once counted them alone, then
    fell back when a repetition was added), all of it once the seconds are spent; never full while
    a run remains; a budget spent early is said in words; a new stage starts its bar at 0."""
    from blockwidth.engine.ab import Event
    from tests.states import BUDGET_S, TOKENS, _event

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            def status() -> str:
                return str(app.query_one("#status").render())

            bar = app.query_one("#progress")
            await enter(app, pilot, "sequential-n")
            # run 10 of the 17 planned (4 arms x (3 repetitions + a warm-up) + the closing run)
            assert "20/180 s budget · run 10/17" in status()
            # the words name the bar's scale (a tryout read 44 % at run 144/163 as the bar lagging)
            share = app.request.n / max(app.request.n, app.request.max_reps)
            assert bar.progress == round(max((9 + 8 / TOKENS) / 17 * share, 20 / BUDGET_S) * 1000)
            # past the budget before the n repetitions end: words, not "188 of 180 s", and the
            # bar stays on the runs (not 100 %)
            app.on_ab_event(_event(Event("progress", "w8", 3, 4, TOKENS, run=14, runs=17, elapsed=BUDGET_S + 8)))
            await pilot.pause()
            assert "180 s spent: n 3 finish, none added" in status()
            assert f"{BUDGET_S + 8:.0f} of" not in status()
            assert bar.progress == round((14 + 4 / TOKENS) / 17 * 1000)
            # the last token of the last planned run: not full, a repetition may follow
            app.on_ab_event(_event(Event("progress", "classic", 4, TOKENS, TOKENS, run=16, runs=17,
                                         closing=True, elapsed=40.0)))
            await pilot.pause()
            assert bar.progress < 1000

            app2 = make_app(tmp_path)
        async with app2.run_test(size=(140, 40)) as pilot:
            app = app2
            bar = app.query_one("#progress")
            await enter(app, pilot, "sequential")
            # rep 6 of at most 12, 31 of 180 s: repetitions are nearer their end (5 done of 12)
            assert "budget: rep 6 of ≤12, 31 of 180 s" in str(app.query_one("#status").render())
            assert bar.progress == round(5 / 12 * 1000)
            app.on_ab_event(_event(Event("progress", "w4", 7, 2, TOKENS, run=30, runs=34, elapsed=150.0)))
            await pilot.pause()
            assert bar.progress == round(150 / 180 * 1000)  # seconds nearer their end now
            # the budget spent during an added repetition: it is the last, and the bar is not full
            app.on_ab_event(_event(Event("progress", "w4", 8, 2, TOKENS, run=36, runs=40, elapsed=200.0)))
            await pilot.pause()
            said = str(app.query_one("#status").render())
            assert "180 s spent: the last repetition" in said and "200 of" not in said
            assert bar.progress < 1000
            app.on_ab_event(_event(Event("arm", "classic", 9, 0, TOKENS, run=38, runs=40, closing=True,
                                         elapsed=205.0)))
            await pilot.pause()
            assert "8 of ≤12 repetitions done, 180 s spent: closing" in str(app.query_one("#status").render())
            app.on_ab_event(_event(Event("phase", "w8", run=2, runs=3, phase="exactness")))
            app.on_ab_event(_event(Event("phase", run=0, runs=40, phase="costcurve")))
            await pilot.pause()
            assert bar.progress == 0 and "0/40 forwards done" in str(app.query_one("#status").render())
            # "running with" while it runs
            assert str(app.query_one("#settings").render()).startswith("running with")

    _run(go())


def test_an_undecided_end_says_which_field_to_raise_and_by_how_much(tmp_path):
    """The seconds budget ran out undecided: the headline names the console's field and an
    amount computed from the session's own repetitions (where the last ended, what one more of
    the arms still open costs), never a flag; the status says how many runs and repetitions."""
    import statistics

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "undecided")
            head = str(app.query_one("#headline").render())
            s = app.session
            # classic and the three open widths, a run each: what one more repetition costs
            rep = sum(statistics.median(r.prefill_s + r.decode_s for r in a.runs) for a in (s.classic, *s.arms))
            secs = -(-(182.0 + 1.5 * rep) // 10) * 10
            assert f"it ran out of time after 3 repetitions ({rep:.0f} s a repetition here): " \
                   f"raise the secs field to {secs:.0f} for 2 more" in head
            assert "--" not in head and "s saves it" not in head
            assert "13 runs, 3 repetitions" in str(app.query_one("#status").render())

    _run(go())


@pytest.mark.parametrize("state,says", [
    ("y-model", ["mlx_lm.server --model /", "--num-draft-tokens 3", "not measured"]),
    ("y-lookup", ["no mlx_lm.server command", "no prompt-lookup drafter"]),
    ("y-dflash", ["no mlx_lm.server command", "cannot run a dflash drafter", "Received N parameters"]),
    ("y-mtp", ["no mlx_lm.server command", "cannot run an mtp drafter"]),
    ("y-undecided", ["this session: width 4 in effect: undecided against classic"]),
    ("y-unloaded", ["no mlx_lm.server command: the pair did not load"]),
    ("y-decline", ["--model /", "classic (no draft model)", "no measured width beat classic"]),
])
def test_the_y_dialog_for_each_case(state, says):
    import shutil
    import tempfile
    from pathlib import Path

    where = Path(tempfile.mkdtemp())

    async def go():
        app = make_app(where)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, state)
            assert type(app.screen).__name__ == "AnswerScreen"
            shown = " ".join(str(app.screen.query_one("#answer Static").render()).split())
            for s in says:
                assert s in shown, (s, shown)
            if state == "y-decline":
                assert "--draft-model" not in shown
            before = app.clipboard
            await pilot.press("Y")
            if app.screen.answer.env:
                assert app.clipboard == f"export {app.screen.answer.env}"
            else:
                assert app.clipboard == before  # nothing to copy, and it says so

    _run(go())
    shutil.rmtree(where)


def test_y_after_a_session_that_found_every_width_slower_hands_the_command_without_a_draft_model(tmp_path):
    """A new user's tryout: the session had just measured width 4 slower than classic, and `y`
    still copied `--num-draft-tokens 3` (the unmeasured per-kind width). What this machine just
    measured comes first now: the command without a draft model, copied, with whether it is saved."""
    import asyncio
    import os
    from pathlib import Path

    from tests import states

    async def go():
        app = states.make_app(tmp_path)
        async with app.run_test(size=(120, 36)) as pilot:
            await states._resolve(app, pilot, None, linked=True)
            app.set_pair(states.demo_pair(None))
            await pilot.pause()
            session = states.fixture_session(outcome="decline")
            states._fields(app, session)
            await pilot.pause()
            req = states.request_of(session)
            app.begin(req, session.config.planned_runs)
            app.show_session(session, Path("session-fixture.json"), [], request=req)
            await pilot.pause()
            said = app.answer()
            target = os.path.abspath(app.paths.target)
            assert said.session_command == f"mlx_lm.server --model {target}"
            assert said.session_why == "a decline: s saves it"
            assert said.command.endswith("--num-draft-tokens 3")  # the resolved width's, still shown
            await pilot.press("y")
            await pilot.pause()
            shown = str(app.screen.query_one("#answer Static").render())
            assert "this session measured classic faster than every width it ran (a decline: s saves it)" in shown
            assert shown.index(said.session_command) < shown.index("--num-draft-tokens 3")
            app.query_one("#n").value = "5"  # a field changed: the session no longer speaks for them
            await pilot.press("escape")
            await pilot.pause()
            assert app.answer().session_command is None

    asyncio.run(go())


def test_the_next_step_of_an_undecided_session_is_one_key(tmp_path):
    """An undecided end names one step, and n sets its fields and runs it."""
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "undecided")
            head = str(app.query_one("#headline").render())
            assert "next: n runs it again with secs" in head
            want = head.split("next: n runs it again with secs ")[1].split()[0]
            await pilot.press("n")
            await pilot.pause()
            assert app.query_one("#secs").value == want and app.phase.busy
            await pilot.press("c")
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.session is not None and app.session.cancelled

    _run(go())


def test_n_raises_the_budget_a_win_needs_itself_rather_than_warning_again(tmp_path):
    """A tryout: n's step (secs raised from the session's own times) still fell short at the
    pilot's slower pace, and the pilot's warning came up one key after its choice. n now sets
    the budget a win needs (and the seconds its n repetitions take) itself, says so, and runs."""
    async def go():
        from blockwidth.console.screens import FirstSessionScreen
        from blockwidth.policy.pace import Pace

        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "undecided")
            # a pilot a hundred times slower than the session's own repetitions: its n 3 alone
            # would take past twice the budget n's step sets (the warning's second case)
            app.pace = Pace(prefill_s=0.05, spec_prefill_s=0.06, decode_s=2.5, spec_decode_s=3.0, width=2)
            await pilot.press("n")
            await pilot.pause()
            assert not isinstance(app.screen, FirstSessionScreen)
            req = app.request
            plan = app.plan_for(req)
            assert app.phase.busy and plan.can_decide and plan.first_s <= 2 * req.max_seconds
            await pilot.press("c")
            await app.workers.wait_for_complete()
            await pilot.pause()

    _run(go())


def test_a_dialog_opens_over_no_toast(tmp_path):
    """A tryout at 80x24: s on an undecided session toasted "not saved: ...", and the toast
    covered the right half of the y dialog that followed (its export line). The error line keeps
    the error; the dialog opens clear."""
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "undecided")
            await pilot.press("s")
            await pilot.pause()
            assert "not saved" in str(app.query_one("#error").render())
            await pilot.press("y")
            await pilot.pause()
            assert type(app.screen).__name__ == "AnswerScreen"
            assert all("not saved" not in str(n.message) for n in app._notifications)

    _run(go())


def test_an_error_the_line_shows_whole_is_not_toasted_again(tmp_path):
    """At 80x24 a refused key read twice, on the error line and in a toast over the tabs. A toast
    repeats an error only where the line cuts it."""
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "undecided")
            app.clear_notifications()
            app._error("nothing to save: run an A/B session first", refusal=True)
            await pilot.pause()
            assert "nothing to save" in str(app.query_one("#error").render())
            assert not [n.message for n in app._notifications]
            long = "not saved: " + "the session is undecided; " * 12  # past 3 rows of 78
            app._error(long)
            await pilot.pause()
            assert [n.message for n in app._notifications] == [long]
            app.clear_notifications()
            wrapped = " ".join(["x" * 70, "y" * 70, "z" * 70, "w" * 9])  # 221 characters, 4 rows wrapped
            app._error(wrapped)
            await pilot.pause()
            assert [n.message for n in app._notifications] == [wrapped]
            app.clear_notifications()
            await pilot.press("y")  # a dialog over the line: the toast is what is seen
            await pilot.pause()
            app._error("no width to copy: nothing measured", refusal=True)
            await pilot.pause()
            assert [n.message for n in app._notifications] == ["no width to copy: nothing measured"]

    _run(go())


def test_the_pilots_warning_offers_a_budget_that_reaches_a_win(tmp_path):
    """n 2 within 60 s on the pilot's rates cannot reach the 3 repetitions a win needs:
    a warns before anything runs; r raises the budget to what they take here and runs."""
    async def go():
        from blockwidth.console.screens import FirstSessionScreen

        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "warned")
            assert isinstance(app.screen, FirstSessionScreen) and not app.phase.busy
            said = str(app.screen.query_one("#first").render())
            assert "a win needs 3" in said and "pilot: decode classic 40 tok/s" in said
            assert "r  raise the budget to secs" in said  # sequential is on: r raises its budget
            await pilot.press("r")
            await pilot.pause()
            assert app.phase.busy and int(app.query_one("#secs").value) > 60
            assert app.plan_for(app.request).can_decide  # what it now runs can reach a win
            await pilot.press("c")
            await app.workers.wait_for_complete()
            await pilot.pause()

    _run(go())


def test_the_warnings_one_prompt_choice_runs_what_can_decide(tmp_path):
    """o in the warning ran nothing: it set one prompt and warned again (n 2 still could not win);
    now it sets the prompt and the budget its win needs, and runs."""
    async def go():
        from blockwidth.console.screens import FirstSessionScreen

        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "warned")
            assert isinstance(app.screen, FirstSessionScreen)
            await pilot.press("o")
            await pilot.pause()
            assert not isinstance(app.screen, FirstSessionScreen) and app.phase.busy
            assert not app.query_one("#prompt").value.startswith("@")
            assert app.plan_for(app.request).can_decide
            await pilot.press("c")
            await app.workers.wait_for_complete()
            await pilot.pause()

    _run(go())


def test_q_during_a_session_stops_it_on_screen_then_quits(tmp_path):
    """q mid-session left a blank terminal while the run in flight ended; now the
    console says it is quitting, the record is written, then it exits."""
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await enter(app, pilot, "idle")
            app.query_one("#prompt").value = "def f(x):"
            app.query_one("#n").value, app.query_one("#tokens").value = "3", "64"
            await pilot.press("a")
            await pilot.pause()
            assert app.phase.busy
            await pilot.press("q")
            await pilot.pause()
            assert "quitting after the run in flight" in str(app.query_one("#status").render())
            await app.workers.wait_for_complete()
            await pilot.pause()
        assert list((tmp_path / "rec").glob("session-*.json"))  # its record was kept

    _run(go())


def test_a_running_session_says_the_time_left_from_its_own_runs(tmp_path):
    """A tryout read "about 82 s for its n 3" and waited 105: the pre-run estimate is one
    request's pilot. Once a run has finished the stage line says the time left, the pilot's price
    scaled by what the runs took (policy.pace.Clock); in sequential mode, until its n are done."""
    import re

    from blockwidth.engine.ab import Event
    from blockwidth.policy import pace
    from tests.states import TOKENS, _event

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            def status() -> str:
                return str(app.query_one("#status").render())

            await enter(app, pilot, "running")
            from dataclasses import replace

            runs = 20
            app.begin(replace(app.request, sequential=False), runs)
            # a clock with no pilot prices every run alike (1.0), and what follows the runs at
            # AFTER_SHARE of them: the figure below is worked out by hand, not asked of it
            app._clock = pace.Clock(None, pace.Shape(((30, TOKENS),), widths=1, n=3))
            await pilot.pause()
            assert "left" not in status()  # no run has finished: nothing to say it from
            for run, at in ((0, 0.0), (1, 3.0), (2, 6.0)):
                app.on_ab_event(_event(Event("arm", "w4", 1, 0, TOKENS, run=run, runs=runs, elapsed=at)))
            app.on_ab_event(_event(Event("progress", "w4", 1, 8, TOKENS, run=2, runs=runs, elapsed=6.5)))
            await pilot.pause()
            # two runs took 6 s for a price of 2: each costs 3 s. Run 3 has 2.5 s to go, 17 runs
            # follow (51 s), the overhead is the 18 runs' 2 % (1.08 s), the probe and curve
            # 5 % of 20 runs at 3 s (3 s): 57.58 s
            left = 2.5 + 17 * 3 + (pace.OVERHEAD - 1) * 18 * 3 + pace.AFTER_SHARE * 20 * 3
            assert left == pytest.approx(57.58)
            assert f"run 3/{runs} · about {pace.minutes(left)} left · " in status()
            # the engine's first run says how many runs it plans: on CUDA's exact path, one arm
            # more than the console's config knew (stock classic beside exact classic)
            app.begin(replace(app.request, sequential=False), runs)
            app.on_ab_event(_event(Event("arm", "classic", 0, 0, TOKENS, run=0, runs=runs + 4, elapsed=0.0)))
            await pilot.pause()
            assert app.session_state.planned == runs + 4
            assert f"run 1/{runs + 4} · " in status()

        app2 = make_app(tmp_path)
        async with app2.run_test(size=(140, 40)) as pilot:
            app = app2
            await enter(app, pilot, "sequential-n")
            for run, at in ((8, 16.0), (9, 18.0)):
                app.on_ab_event(_event(Event("arm", "w4", 2, 0, TOKENS, run=run, runs=17, elapsed=at)))
            await pilot.pause()
            said = str(app.query_one("#status").render())
            assert re.search(r"18/180 s budget · n 3 in about [\d.]+ (s|min) · run 10/17", said), said
            # "n 3 in about" is the runs' time alone: the probe and curve after them are not n 3
            n3 = float(re.search(r"n 3 in about ([\d.]+) s", said).group(1))
            whole = app._clock.left_s(17, 18.0)
            assert n3 == pytest.approx(app._clock.left_s(17, 18.0, after=False), abs=0.5)
            assert whole - n3 > 0.5

    _run(go())


def test_a_running_session_fills_its_table_as_repetitions_end(tmp_path):
    """A tryout watched an empty table for the whole of a session. After each repetition the
    table holds the figures so far, every verdict "so far"; the next session starts empty."""
    from blockwidth.console.app import AbEvent
    from blockwidth.console.widgets.ab import running_rows
    from blockwidth.engine.ab import Event
    from tests.states import fixture_session

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "running")  # its first repetition has ended
            table = app.query_one("#arms")
            assert "after repetition 1" in str(app.query_one("#headline").render())
            partial = fixture_session()  # and now three
            app.on_ab_event(AbEvent(Event("rep", rep=3, session=partial), running_rows(partial, None)))
            await pilot.pause()
            assert table.row_count == 1 + len(partial.arms)
            cells = [table.get_row_at(i) for i in range(table.row_count)]
            assert [c[0] for c in cells] == ["classic", *(a.name for a in partial.arms)]
            assert all(str(c[-1]) == "so far" for c in cells)
            assert cells[2][2] == f"{sorted(r.decode_tok_s for r in partial.arms[1].runs)[1]:.1f}"  # w4's median
            assert "after repetition 3" in str(app.query_one("#headline").render())
            # the session ends: its own rows, with verdicts
            app.show_session(partial, None, [])
            await pilot.pause()
            assert all(str(table.get_row_at(i)[-1]) != "so far" for i in range(table.row_count))
            # a new session starts with an empty table
            app.begin(app.request, 17)
            await pilot.pause()
            assert table.row_count == 0

    _run(go())


def test_the_chain_tab_wraps_a_long_reason_under_its_own_column(tmp_path):
    """A tryout at 80 columns: the Chain tab's wrapped reasons restarted at column 0, under the
    sources ("MLXCEL_DRAFT_BLOCK_SIZE is set" read as a row of its own)."""
    import io

    from rich.console import Console

    from blockwidth.console.widgets.chain import chain_table

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "idle")
            out = io.StringIO()
            Console(file=out, width=76, color_system=None).print(chain_table(app.resolution))
            lines = [line for line in out.getvalue().splitlines() if line.strip()]
            sources = [s.source.value for s in app.res.chain]
            assert any(len(s.why) > 40 for s in app.res.chain)  # something wraps at 76
            assert len(lines) > len(sources)
            indent = min(line.index(s) for line in lines for s in sources if s in line)
            for line in lines:
                assert line[:indent].strip() in ("", "->"), line  # a row's start, or its reason going on

    _run(go())


def test_the_plot_fits_the_columns_the_console_has(tmp_path):
    """At 80x24 a finished session's tok/s plot was cut: "141.2 tok/s below min gai". The bars
    narrow to the columns the plot has, so the longest note shows whole; wide, they keep 36."""
    from blockwidth.console.render import BAR, bars

    rows = [("classic", 120.0, 141.2, 150.0, ""), ("w12", 100.0, 110.0, 130.0, "below min gain")]
    assert all(len(line) <= 74 for line in bars(rows, "tok/s", columns=74))
    assert bars(rows, "tok/s", columns=74)[1].endswith("110.0 tok/s below min gain")
    wide = bars(rows, "tok/s", columns=200)
    assert wide == bars(rows, "tok/s") and len(wide[0].split("|")[1]) == BAR

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "done")
            await pilot.pause()
            from blockwidth.console.widgets.ab import AbTab

            cols = app.query_one(AbTab)._plot_columns()
            body = app.query_one("#body")
            assert cols == body.content_size.width - 2  # less the plot's padding
            assert all(len(line) <= cols for line in bars(rows, "tok/s", columns=cols))
            plot = str(app.query_one("#plot").render())
            assert plot and all(len(line) <= cols for line in plot.splitlines())

    _run(go())


def test_a_cut_status_line_ends_at_a_whole_part():
    """A tryout at 80 columns read "run 19/163 ·" and at 120 "run 132/163 ·": the line was cut by
    characters just after a separator. The cut now drops the separator and says it cut."""
    from blockwidth.console.widgets.ab import _cut

    line = "20/180 s budget · run 10/17 · w4 rep 2 · 8/16 tokens"
    assert _cut(line, 200) == line and _cut(line, 0) == line
    assert _cut(line, 31) == "20/180 s budget · run 10/17…"  # not "run 10/17 …" nor "· …"
    assert _cut(line, 30) == _cut(line, 31) == "20/180 s budget · run 10/17…"
    assert _cut(line, 35) == "20/180 s budget · run 10/17 · w4 r…"
    # on screen at 80x24, and again after each resize:
    # test_the_status_line_is_cut_again_for_the_new_width_after_a_resize


def test_the_warning_says_r_turns_sequential_on_where_it_is_off(tmp_path):
    """A tryout, sequential off: the warning offered "raise the budget to secs 360, reps 6" while
    the fields already read reps 6 and secs 360; what r changes there is the sequential box."""
    async def go():
        from blockwidth.console.screens import FirstSessionScreen
        from blockwidth.policy.pace import Pace
        from tests.states import PACE

        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "idle")
            app.pace = Pace(**PACE)
            app.query_one("#n").value = "1"
            app.query_one("#sequential").value = False
            await pilot.pause()
            await pilot.press("a")
            await pilot.pause()
            assert isinstance(app.screen, FirstSessionScreen) and not app.phase.busy
            said = str(app.screen.query_one("#first").render())
            assert "r  turn sequential on, with secs" in said, said
            await pilot.press("r")
            await pilot.pause()
            assert app.query_one("#sequential").value and app.phase.busy
            await pilot.press("c")
            await app.workers.wait_for_complete()
            await pilot.pause()

    _run(go())


@pytest.mark.parametrize("state, said, not_said", [
    ("y-model", "y copies it again", "y copies the command"),
    ("y-unloaded", "Escape closes.", "num_draft_tokens"),
])
def test_the_answer_dialog_says_what_its_keys_do_now(tmp_path, state, said, not_said):
    """A tryout: "copied to the clipboard" then "y copies the command" read as two acts, and a
    failed pair's dialog explained num_draft_tokens with no command to apply it to."""
    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, state)
            text = str(app.screen.query_one("#answer Static").render())
            assert said in text and not_said not in text, text

    _run(go())


def test_the_status_line_is_cut_again_for_the_new_width_after_a_resize(tmp_path):
    """The status line's cut was computed once, for the width it was drawn at: widened, it stayed
    cut at the old room; narrowed, Textual cut it by characters wherever the edge fell. It is cut
    again, at a whole part, for the width after a resize."""
    def check(status, whole: bool) -> None:
        text = str(status.render())
        assert len(text) <= status.content_size.width, text
        if whole:
            assert not text.endswith("…"), text
        else:
            assert text.endswith("…") and not text[:-1].rstrip().endswith("·"), text

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "running")
            await pilot.pause()
            status = app.query_one("#status")
            check(status, whole=False)
            for size, whole in (((200, 24), True), ((64, 24), False), ((90, 24), False)):
                await pilot.resize_terminal(*size)
                for _ in range(3):
                    await pilot.pause()
                check(status, whole)

    _run(go())


def test_the_profile_table_fits_80_columns_and_gains_its_columns_when_wide(tmp_path):
    """A tryout at 80x24: the Profile tab's table ran past the right edge ("identical", "pair" and
    "why" cut or gone). Narrow, it keeps the columns that fit (the line under it says the pair
    and the why of the highlighted entry); widened, it has them all again."""
    from textual.widgets import DataTable

    def headings(table) -> list[str]:
        return [str(c.label) for c in table.ordered_columns]

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "saved")
            await pilot.press("4")
            await app.workers.wait_for_complete()
            await pilot.pause()
            table = app.query_one("#profile-table", DataTable)
            assert table.row_count == 1
            assert table.virtual_size.width <= table.scrollable_content_region.width, headings(table)
            assert {"check", "target", "kind", "width", "measured", "identical"} <= set(headings(table))
            await pilot.resize_terminal(200, 40)
            for _ in range(3):
                await pilot.pause()
            assert {"pair", "why"} <= set(headings(table)) and table.row_count == 1

    _run(go())


def test_the_records_preview_lays_its_tables_out_in_columns_at_80(tmp_path):
    """A tryout at 80x24: the Records tab showed the record's Markdown as it is, and a table row
    longer than the line wrapped onto the next ("| arm | decode tok/s ... |" then "acceptance |
    identity | verdict |" at column 0), no column under its heading. The tables are laid out in
    columns that fit, a row on a line; the text around them is the Markdown's own."""
    import io
    import re

    from rich.console import Console

    from blockwidth.console import records
    from blockwidth.engine.session import record
    from tests.states import demo_pair, fixture_session

    records.write(record.build(fixture_session(), demo_pair(), {"device": {"backend": "cpu"}}), tmp_path / "rec")

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _records_tab(app, pilot)
            await app.workers.wait_for_complete()
            await pilot.pause()
            preview = app.query_one("#record-preview")
            width = preview.content_size.width
            out = io.StringIO()
            Console(file=out, width=width, color_system=None).print(preview.content)
            lines = out.getvalue().splitlines()
            assert lines[0].startswith("# A/B session") and all(len(line) <= width for line in lines)
            heads = [line for line in lines if line.split()[:1] == ["arm"]]
            assert heads and "verdict" in heads[0], lines  # the heading row on one line
            head = heads[0]
            w4 = [line for line in lines if line.split()[:1] == ["w4"] and "/" in line][0]
            # the figures on the row's one line ("60.0/62.0/63.0" where the spaces do not fit)
            assert re.search(r"60\.0 ?/ ?62\.0 ?/ ?63\.0", w4) and w4.rstrip().endswith("wins"), lines
            assert w4.index("wins") == head.index("verdict")  # under its heading
            assert not any(line.lstrip().startswith("|") for line in lines)

    _run(go())


def test_the_top_panels_reason_after_a_save_keeps_its_width_source_and_file_at_80(tmp_path):
    """A tryout at 80x24, after a save: the reason's two lines were cut by characters ("measured
    on target-…", its parenthesis left open), and a profile in a deep folder pushed the file's
    line off them. Narrow, the reason names the profile by its file name (the Profile tab says
    the whole path) and is cut at a whole word, its parentheses closed."""
    deep = tmp_path / "a-folder-for-this-hosts-measured-profiles" / "and-one-more-level-of-it"
    deep.mkdir(parents=True)

    async def go():
        app = make_app(deep)
        async with app.run_test(size=(80, 24)) as pilot:
            await enter(app, pilot, "saved")
            panel = app.query_one("#resolution")
            lines = [str(line).rstrip() for line in panel.render().wrap(panel.content_size.width)]
            head, *reason = lines
            assert head.startswith("width 4 · source profile"), lines
            assert len(reason) == 2 and all(len(line) <= panel.content_size.width for line in lines), lines
            said = " ".join(reason)
            assert said.startswith("4 (profile: measured winner") and "in p.toml line " in said, lines
            assert str(deep) not in said.replace("\n", ""), lines
            assert said.rstrip(")").endswith("…") and said.count("(") == said.count(")"), lines
            assert said.rstrip(")")[:-1].split()[-1] in app.res.reason.split(), lines  # a whole word before the cut

    _run(go())
