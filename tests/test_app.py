"""The Textual console driven as a user would, on the demo pair (CPU)."""

import asyncio


from console.app import BlockwidthApp, Options
from policy import profile


def run(coro):
    return asyncio.run(coro)


async def _settle(app, pilot):
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


def _ab_inputs(app, widths: str, n: int | None = None, tokens: int | None = None) -> None:
    """Fill the A/B tab's fields as an operator would before pressing a."""
    app.query_one("#widths").value = widths
    if n is not None:
        app.query_one("#n").value = str(n)
    if tokens is not None:
        app.query_one("#tokens").value = str(tokens)


def _app(tmp_path):
    return BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"),
                                 record_dir=str(tmp_path / "rec")))


def test_console_resolves_runs_ab_and_shows_identity(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(140, 48)) as pilot:
            await _settle(app, pilot)
            res = str(app.query_one("#resolution").render())
            assert "width 4" in res and "kind-default" in res and "bfloat16" in res
            assert app.pair is not None
            _ab_inputs(app, "2,4", n=1, tokens=16)
            await pilot.press("a")
            await _settle(app, pilot)
            s = app.session
            assert s is not None and [a.name for a in s.arms] == ["w2", "w4"]
            assert app.query_one("#arms").row_count == 3
            assert "decision:" in str(app.query_one("#decision").render())
            assert "tok/s" in str(app.query_one("#plot").render())
            assert "identical" in str(app.query_one("#identity-head").render())
            assert list((tmp_path / "rec").glob("session-*.json"))
            # save: either stored (and shown in the profile tab) or refused with a visible reason
            await pilot.press("s")
            await pilot.pause()
            p = tmp_path / "p.toml"
            if p.exists():
                assert len(profile.load(p).entries) == 1
                assert app.query_one("#profile-table").row_count == 1
                await pilot.press("d")
                await pilot.pause()
                assert profile.load(p).entries == ()
            else:
                assert "not saved" in str(app.query_one("#error").render())

    run(go())


def test_console_bad_width_input_is_visible(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            _ab_inputs(app, "1,4")
            await pilot.press("a")
            await pilot.pause()
            assert "width 1 is out of range" in str(app.query_one("#error").render())
            assert app.session is None

    run(go())


def test_console_corrupt_profile_is_shown_and_untouched(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("schema = 1\n[[override]]\nwidth = 0\n")
    before = p.read_bytes()

    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(p)))
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            assert "line 2" in str(app.query_one("#error").render())
            assert "no resolution" in str(app.query_one("#resolution").render())

    run(go())
    assert p.read_bytes() == before


def test_bare_command_with_bad_input_fails_before_the_console():
    from tests.conftest import run_cli

    p = run_cli("--target", "/nope")
    assert p.returncode == 2 and "--target /nope" in p.stderr


def test_bracketed_text_is_not_eaten_as_markup(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            assert "[unquantized bfloat16]" in str(app.query_one("#status").render())

    run(go())


def test_console_cancel_stops_the_session(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            _ab_inputs(app, "2,4,8", n=20, tokens=64)
            await pilot.press("a")
            await pilot.pause(0.5)
            await pilot.press("c")
            await _settle(app, pilot)
            assert app.session is not None and app.session.cancelled and not app.session.saveable
            assert "cancelled" in str(app.query_one("#decision").render())
            await pilot.press("s")
            await pilot.pause()
            assert "cancelled" in str(app.query_one("#error").render())

    run(go())
