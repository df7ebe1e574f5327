"""The console's A/B tab draws the auto arm's width by round from a real auto session."""

import asyncio
from pathlib import Path

from blockwidth.console.render import trajectory, runs_of
from blockwidth.engine import auto
from blockwidth.engine.ab import AbConfig, run_session
from blockwidth.engine.demo.prompts import DEMO_PROMPTS
from tests.states import demo_pair, enter, make_app, request_of


def test_the_trajectory_line_folds_rounds_and_marks_probes():
    w = [3] * 5 + [8] * 12 + [1] * 7 + [4] + [1] * 9
    line = trajectory(w, probes=[24], cap=8)
    assert len(line) == len(w) and line[24] == "p" and line[0] != line[5] and set(line[17:24]) == {"▁"}
    assert len(trajectory(w * 4, cap=8)) <= 40  # folded to the plot's width
    assert runs_of(w) == "3x5 8x12 1x7 4x1 1x9"


def test_the_ab_tab_plots_the_auto_arms_widths(tmp_path):
    auto.forget()
    try:
        session = run_session(demo_pair(), AbConfig(widths=("auto", 2), prompt=DEMO_PROMPTS[0], n=1,
                                                    max_tokens=12, predict=False, exactness=False,
                                                    auto_max=4))
    finally:
        auto.forget()

    async def go():
        app = make_app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await enter(app, pilot, "idle")
            req = request_of(session)
            app.begin(req, session.config.planned_runs)
            app.show_session(session, Path("session-auto.json"), [], request=req)
            await pilot.pause()
            plot = str(app.query_one("#plot").render())
            assert "auto width by round" in plot and "run 1" in plot
            assert "auto controller: widths 1..4" in plot
            assert str(app.query_one("#arms").get_row("auto")[0]) == "auto"  # a row of the table

    asyncio.run(go())
