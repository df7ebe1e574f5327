"""The Textual console driven from the keyboard only, as an operator would, on the demo pair (CPU)."""

import asyncio
import io
import time

import pytest

from textual.widgets import Input

from blockwidth.console.app import BlockwidthApp, Options, Phase
from blockwidth.console.screens import AnswerScreen, ConfirmScreen, HelpScreen
from blockwidth.policy import profile


def run(coro):
    return asyncio.run(coro)


async def _settle(app, pilot):
    await pilot.pause()
    await app.workers.wait_for_complete()
    await pilot.pause()


async def _open_pair(app, pilot, *keys):
    """The open-pair dialog (o), ``keys`` typed into it, and the load it starts settled."""
    await pilot.press("o")
    await pilot.pause()
    await pilot.press(*keys)
    await _settle(app, pilot)


def _app(tmp_path):
    return BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"),
                                 record_dir=str(tmp_path / "rec")))


def _text(app, selector) -> str:
    return str(app.query_one(selector).render())


# A single prompt for the tests whose subject is not the workload: the default prompt field,
# @mixed, prefills 16 requests an arm (about 10 s an arm on this CPU) for every session.
ONE_PROMPT = "def f(x):"


async def _type_fields(pilot, widths: str, n: str, tokens: str, sequential: bool = False,
                       prompt: str | None = None) -> None:
    """w goes to the widths field; each field's text is selected on entry, so typing replaces it.
    Tab on to the sequential box (on by default) and space toggles it. ``prompt``: set first."""
    if prompt is not None:
        pilot.app.query_one("#prompt", Input).value = prompt
    await pilot.press("escape", "w", *widths, "tab", *n, "tab", *tokens, "tab")
    if pilot.app.query_one("#sequential").value != sequential:
        await pilot.press("space")
    await pilot.press("shift+tab")  # back in the tokens field, where Enter runs


def _help_text(app, width: int) -> str:
    """The open help dialog's text as Rich lays it out ``width`` columns wide."""
    from rich.console import Console

    con = Console(width=width, record=True, file=io.StringIO())
    con.print(app.screen.query_one("#help Static").content)
    return con.export_text()


def test_keys_run_a_session_and_every_binding_works_after_it(tmp_path, monkeypatch):
    import dataclasses

    from blockwidth.engine import ab

    real = ab.run_session

    def decided(*a, **kw):
        return dataclasses.replace(real(*a, **kw), drift=False, recommendation=2)

    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await _settle(app, pilot)
            assert app.phase is Phase.READY and not isinstance(app.focused, Input)
            assert "width 4" in _text(app, "#resolution") and "kind-default" in _text(app, "#resolution")
            await _type_fields(pilot, "2,4", "1", "16", prompt=ONE_PROMPT)
            assert isinstance(app.focused, Input)
            await pilot.press("enter")  # Enter in a field runs the A/B ...
            assert not isinstance(app.focused, Input)  # ... and focus leaves the field
            await _settle(app, pilot)
            s = app.session
            assert app.phase is Phase.DONE and s is not None and [a.name for a in s.arms] == ["w2", "w4"]
            assert app.query_one("#arms").row_count == 3
            assert not isinstance(app.focused, Input)
            assert "measured with widths 2,4 · n 1 · 16 tokens" in _text(app, "#settings")
            assert s.reps == 1 and " 1 repetition, " in _text(app, "#status")
            assert "tok/s" in _text(app, "#plot")
            assert "model prediction" in _text(app, "#details") or not s.predicted
            assert "exactness width 2" in _text(app, "#details")
            assert list((tmp_path / "rec").glob("session-*.json"))

            # every key, from the results
            await pilot.press("c")  # nothing runs: c does nothing, and says nothing wrong
            assert app.phase is Phase.DONE and app.query_one("#error").has_class("-empty")
            await pilot.press("o")
            await pilot.pause()
            assert type(app.screen).__name__ == "PairScreen"
            await pilot.press("escape")
            assert app.phase is Phase.DONE and app.session is s  # Escape opened nothing
            await pilot.press("w")
            assert app.focused is app.query_one("#widths")
            await pilot.press("escape")
            await pilot.press("?")
            assert isinstance(app.screen, HelpScreen)
            help_text = _help_text(app, 200)
            for b in app.BINDINGS:
                assert app.HELP[b.action] in help_text
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)

            await pilot.press("y")
            assert isinstance(app.screen, AnswerScreen)
            shown = str(app.screen.query_one("#answer Static").render())
            assert "mlx_lm.server --model /" in shown and "--num-draft-tokens 3" in shown
            assert "BLOCKWIDTH_DRAFT_BLOCK_SIZE=4" in shown and "not measured" in shown
            assert app.clipboard.startswith("mlx_lm.server --model /")
            await pilot.press("Y")  # inside the dialog too, as it says
            assert app.clipboard == "export BLOCKWIDTH_DRAFT_BLOCK_SIZE=4"
            await pilot.press("y")
            assert app.clipboard.startswith("mlx_lm.server --model /")
            await pilot.press("escape")
            assert not isinstance(app.screen, AnswerScreen)
            await pilot.press("Y")
            assert app.clipboard == "export BLOCKWIDTH_DRAFT_BLOCK_SIZE=4"

            await pilot.press("m")
            await _settle(app, pilot)
            assert list((tmp_path / "rec").glob("session-*.md"))

            before = app.query_one("#prompt", Input).value
            await pilot.press("p")
            assert app.query_one("#prompt", Input).value != before
            # the label names the preset (main() and its repeat begin with the same line), and
            # forgets it once the field is edited
            from textual.widgets import Label

            from blockwidth.engine.demo.prompts import PRESETS

            label = app.query_one("#prompt-label", Label)
            seen = set()
            for _ in PRESETS:
                seen.add(str(label.render()))
                await pilot.press("p")
            # every preset named but the workload, whose field names it (@mixed)
            assert len(seen) == len(PRESETS) and "prompt (repeat)" in seen and "prompt (main())" in seen
            assert "prompt" in seen and "prompt (@mixed)" not in seen
            assert len(app._notifications) == 1  # one preset's toast, not one per p
            field = app.query_one("#prompt", Input)
            field.value += " x"
            await pilot.pause()
            assert str(label.render()) == "prompt"
            assert "STALE" in _text(app, "#settings")  # the results no longer match the fields
            await pilot.press("r")
            await _settle(app, pilot)

            await pilot.press("2")
            assert app.query_one("TabbedContent").active == "tab-identity"
            assert "identical" in _text(app, "#identity-head")
            assert " of 2 widths ([ and ] pick)" in _text(app, "#identity-head")  # not "width 2 of 2"
            first = app._selected_width
            await pilot.press("right_square_bracket")
            assert app._selected_width != first
            await pilot.press("left_square_bracket")
            assert app._selected_width == first
            await pilot.press("3")
            assert app.query_one("TabbedContent").active == "tab-chain"
            await pilot.press("5")
            await _settle(app, pilot)
            assert app.query_one("#records-table").row_count == 1
            await pilot.press("1")
            assert app.query_one("TabbedContent").active == "tab-ab"

            # a stale session is not saved; run it again by key: at n = 1 classic's two runs
            # cannot tell drift from noise, so that one is refused too, in the console's words
            await pilot.press("s")
            assert "fields changed" in _text(app, "#error")
            await pilot.press("a")
            await _settle(app, pilot)
            await pilot.press("s")
            await _settle(app, pilot)
            p = tmp_path / "p.toml"
            assert not p.exists() and "not saved" in _text(app, "#error"), _text(app, "#error")
            assert "--" not in _text(app, "#error")  # console words, not CLI flags
            # a session that decides (its run real, its verdict set as a longer one would reach
            # it) is saved from the keyboard: s, then p for this pair
            monkeypatch.setattr(ab, "run_session", decided)
            await pilot.press("a")
            await _settle(app, pilot)
            await pilot.press("s")
            await pilot.pause()
            assert type(app.screen).__name__ == "SaveScreen"
            await pilot.press("p")
            await _settle(app, pilot)
            assert [e.width for e in profile.load(p).entries] == [2], _text(app, "#error")

            # d does nothing outside the Profile tab; there it asks, and n keeps the entry
            await pilot.press("d")
            assert not isinstance(app.screen, ConfirmScreen)
            await pilot.press("4")
            assert app.query_one("#profile-table").row_count == 1
            await pilot.press("d")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")
            assert len(profile.load(p).entries) == 1
            await pilot.press("d", "y")
            await _settle(app, pilot)
            assert profile.load(p).entries == ()
            await pilot.press("q")
        assert app.return_code == 0

    run(go())


def test_escape_leaves_a_field_and_keys_act_again(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            await pilot.press("w")
            assert app.focused is app.query_one("#widths")
            await pilot.press("escape")
            assert not isinstance(app.focused, Input)
            await pilot.press("3")
            assert app.query_one("TabbedContent").active == "tab-chain"

    run(go())


def test_the_sequential_box_shows_its_state_by_its_mark_not_by_colour_alone(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            box = app.query_one("#sequential")
            assert box.value and "X" in box.render().plain
            box.value = False
            await pilot.pause()
            assert "X" not in box.render().plain
            box.value = True
            await pilot.pause()
            assert "X" in box.render().plain

    run(go())


def test_a_keys_refusal_leaves_the_error_line_when_the_next_action_works(tmp_path):
    """m with no session answers 'nothing to export' on the error line; moving to another tab
    takes it away (a refusal is an answer to one key, not a state), while the pair stays."""
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            err = app.query_one("#error")
            await pilot.press("m")
            await pilot.pause()
            assert "nothing to export" in str(err.render()) and not err.has_class("-empty")
            await pilot.press("2")
            await pilot.pause()
            assert err.has_class("-empty") and "nothing to export" not in str(err.render())

    run(go())


def test_field_errors_name_the_console_field(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            await _type_fields(pilot, "1,4", "3", "64")
            await pilot.press("enter")
            err = _text(app, "#error")
            assert "widths field '1,4': width 1 is out of range" in err and "--" not in err
            assert app.query_one("#widths").has_class("-bad")  # the field to fix is marked
            # editing the field it names takes the error away (it stayed until the next run);
            # another field's edit does not
            app.query_one("#tokens").value = "65"
            await pilot.pause()
            assert "widths field '1,4'" in _text(app, "#error")
            app.query_one("#widths").value = "2,4"
            await pilot.pause()
            assert app.query_one("#error").has_class("-empty") and not app.query_one("#widths").has_class("-bad")
            await _type_fields(pilot, "2", "x", "64")
            await pilot.press("enter")
            assert "n field x: must be a whole number 1..100" in _text(app, "#error")
            await _type_fields(pilot, "2", "1", "5000")
            await pilot.press("enter")
            err = _text(app, "#error")
            assert "tokens field 5000" in err and "context of 1024" in err
            assert app.session is None and app.phase is Phase.READY

    run(go())


def test_console_corrupt_profile_is_shown_and_untouched(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("schema = 1\n[[override]]\nwidth = 0\n")
    before = p.read_bytes()

    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(p)))
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            assert "line 2" in _text(app, "#error")
            assert "no resolution" in _text(app, "#resolution")
            # d on the Profile tab: no entry listed, and the profile is not "empty" (a tryout was
            # told it was)
            await pilot.press("4", "d")
            await pilot.pause()
            said = _text(app, "#error")
            assert "does not read" in said and "line" in said and "is empty" not in said, said

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
            assert "[unquantized bfloat16]" in _text(app, "#status")

    run(go())


def test_console_cancel_stops_the_session_and_says_so(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            await _type_fields(pilot, "2,4,8", "20", "64")
            await pilot.press("enter")
            await pilot.pause(0.5)
            await pilot.press("c")  # focus is not in a field, so c cancels
            assert app.phase in (Phase.CANCELLING, Phase.CANCELLED)
            await _settle(app, pilot)
            assert app.session is not None and app.session.cancelled and not app.session.saveable
            assert app.phase is Phase.CANCELLED
            assert app.query_one("#progress").has_class("-idle")  # no bar at 100 %
            assert "cancelled after" in _text(app, "#headline")
            assert "no width beats classic" not in _text(app, "#details")
            await pilot.press("s")
            await _settle(app, pilot)
            assert "cancelled" in _text(app, "#error")

    run(go())


async def _settled_then(app, pilot, key: str) -> None:
    """The pair loaded, then ``key`` pressed and its screen drawn."""
    await _settle(app, pilot)
    await pilot.press(key)
    await pilot.pause()


def _screen_text(app) -> str:
    """Every Static on the screen, toasts included: all the operator can read."""
    from textual.widgets import Static

    return "\n".join(str(w.render()) for w in app.screen.query(Static))


def test_failed_pair_load_is_said_once_and_shows_no_working_bar(tmp_path):
    """At 80x24 the tryout read the same load error in the pair panel, the error line, the status
    line and a toast. It is said once, in the pair panel under the width, with all its words, and
    a redraw of the top (a resize, a key's refusal) keeps it there."""
    bad = tmp_path / "t"  # passes the console's start-up checks; fails only as the pair loads
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "llama"}')

    async def go():
        app = BlockwidthApp(Options(target=str(bad), device="cpu", profile=str(tmp_path / "p.toml")))
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            assert app.phase is Phase.LOAD_FAILED
            assert app.query_one("#progress").has_class("-idle")
            reason = f"target {bad}: no *.safetensors"
            assert _screen_text(app).count(reason) == 1, _screen_text(app)
            pair = _text(app, "#pair")
            assert "pair not loaded" in pair and reason in pair
            assert f"pair {tmp_path.name}/t + " in pair  # which pair it was, too (a short name with its parent)
            assert "above" in _text(app, "#status")
            await pilot.press("a")  # refused: the error line answers the key
            assert "not loaded" in _text(app, "#error")
            await pilot.resize_terminal(120, 40)
            await pilot.pause()
            assert _screen_text(app).count(reason) == 1 and reason in _text(app, "#pair")

    run(go())


def test_palette_has_every_action(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(120, 40)) as pilot:
            await _settle(app, pilot)
            titles = " ".join(c.title for c in app.get_system_commands(app.screen))
            for b in app.BINDINGS:
                if b.action not in ("quit", "help"):
                    assert b.description in titles, b.description

    run(go())


def test_open_another_pair_from_the_console(tmp_path):
    from blockwidth.engine import demo

    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await _settle(app, pilot)
            await _open_pair(app, pilot, "ctrl+a", *str(demo.target("4bit")), "tab", "tab", "ctrl+a", *"lookup", "enter")
            assert app.phase is Phase.READY, _text(app, "#status")
            assert app.pair.kind.value == "lookup" and app.pair.quantization.scheme.value == "affine"
            assert "affine" in _text(app, "#resolution")
            await _open_pair(app, pilot, "ctrl+a", *"/nope/target", "enter")
            # A wrong path is refused before anything is dropped: the loaded pair stays, and the
            # dialog comes back with what was typed (it lost it) and why
            assert app.phase is Phase.READY and app.pair.kind.value == "lookup"
            assert type(app.screen).__name__ == "PairScreen"
            assert app.screen.query_one("#open-target").value.startswith("/nope/target")
            assert app.screen.query_one("#open-kind").value == "lookup"
            assert "target field /nope/target" in str(app.screen.query_one("#open-error").render())
            await pilot.press("escape")
            assert "target field /nope/target" in _text(app, "#error")  # the dialog's words
            assert "still on" in _text(app, "#error")
            assert app.query_one("#progress").has_class("-idle")
            # A folder that is there but holds no checkpoint is refused the same way: a tryout's
            # docs/ unloaded the working pair and said so twice
            await _open_pair(app, pilot, "ctrl+a", "ctrl+k", *str(tmp_path), "enter")
            assert app.phase is Phase.READY and app.pair.kind.value == "lookup"
            assert type(app.screen).__name__ == "PairScreen"
            said = str(app.screen.query_one("#open-error").render())
            assert "has no config.json" in said and "still on" in said, said
            await pilot.press("escape")
            assert _text(app, "#error").count("has no config.json") == 1
            # a config.json with no weights beside it is refused there too (a review)
            (tmp_path / "config.json").write_text('{"model_type": "llama"}')
            await _open_pair(app, pilot, "ctrl+a", "ctrl+k", *str(tmp_path), "enter")
            assert app.phase is Phase.READY and app.pair.kind.value == "lookup"
            said = str(app.screen.query_one("#open-error").render())
            assert "no *.safetensors weights" in said and "still on" in said, said
            await pilot.press("escape")

    run(go())


def test_an_error_toast_keeps_its_brackets(tmp_path):
    # Errors quote the pair as "target-bf16 [unquantized bfloat16]"; read as markup, the toast
    # dropped the bracketed words while the error line kept them.
    from textual.widgets._toast import Toast

    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await _settle(app, pilot)
            await _open_pair(app, pilot, *"/nope/target", "enter")
            assert "still on target-bf16 [unquantized bfloat16]" in str(app.screen.query_one("#open-error").render())
            await pilot.press("escape")
            assert "still on target-bf16 [unquantized bfloat16]" in _text(app, "#error")
            # a toast repeats an error only over a dialog (the line is under it): its brackets too
            await pilot.press("o")
            await pilot.pause()
            app._error("no width to copy: target-bf16 [unquantized bfloat16] measured nothing", refusal=True)
            await pilot.pause()
            toasts = [str(Toast(n).render()) for n in app._notifications]
            assert any("target-bf16 [unquantized bfloat16] measured" in t for t in toasts), toasts
            await pilot.press("escape")
            # The dialog's kind is named as its field, as the target and drafter are.
            await _open_pair(app, pilot, "tab", "tab", *"eagle", "enter")
            await pilot.press("escape")
            assert "kind field eagle: the demo pair has no eagle drafter" in _text(app, "#error")
            assert app.pair.kind.value == "model"

    run(go())


def test_the_width_in_effect_is_always_measured(tmp_path):
    async def go():
        app = BlockwidthApp(Options(device="cpu", flag="6", profile=str(tmp_path / "p.toml"),
                                    record_dir=str(tmp_path / "rec")))
        async with app.run_test(size=(140, 40)) as pilot:
            await _settle(app, pilot)
            assert app.query_one("#widths", Input).value == "2,4,6"  # the default widths gain it
            await _type_fields(pilot, "2", "1", "8", prompt=ONE_PROMPT)
            await pilot.press("enter")
            await _settle(app, pilot)
            assert [a.width for a in app.session.arms] == [2, 6]  # and a run adds it
            assert "(+ w6: the width in effect)" in _text(app, "#settings")
            assert "width 6 in effect" in _text(app, "#details")
            assert "w6 *" in str(app.query_one("#arms").get_row("w6")[0])

    run(go())


def test_the_console_runs_and_shows_the_verify_attention_it_was_given(tmp_path):
    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"),
                                    record_dir=str(tmp_path / "rec"), verify_attention="plain"))
        async with app.run_test(size=(140, 40)) as pilot:
            await _settle(app, pilot)
            await _type_fields(pilot, "2", "1", "8", prompt=ONE_PROMPT)
            await pilot.press("enter")
            await _settle(app, pilot)
            assert app.session.attention == "plain"
            assert all(r.attention["mode"] == "plain" for a in app.session.arms for r in a.runs)
            assert "verify attention plain" in _text(app, "#settings")

    asyncio.run(go())


def test_verify_attention_is_a_console_option_and_a_bad_one_is_refused(blockwidth):
    from blockwidth.console.cli import build_parser

    ap = build_parser()
    args = ap.parse_args(["--verify-attention", "bucketed"])
    ap.apply_before(args)
    assert args.command is None and args.verify_attention == "bucketed"  # the console takes it
    out = blockwidth("--verify-attention", "cudnn", "resolve")
    assert out.returncode == 2 and "cudnn" in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_help_scrolls_from_the_keyboard_at_80x24(tmp_path):
    """On 80x24 the key list is taller than its dialog: PgDn must reach the last key."""
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settled_then(app, pilot, "question_mark")
            box = app.screen.query_one("#help")
            assert box.max_scroll_y > 0  # the list does not fit: the case this test is about
            await pilot.press("end")
            await pilot.pause()
            assert box.scroll_y == box.max_scroll_y
            # a wrapped description stays in its column: no help line starts at the key column
            # with a lowercase word, as a description's second line did before
            lines = _help_text(app, 70).splitlines()[1:]
            key_width = max(len(k) for k, _ in app.key_rows())
            assert len(lines) > len(app.key_rows())  # some descriptions wrapped at this width
            # every line is a key's (text in the key column) or a continuation (blank there)
            keys = [ln for ln in lines if ln[:key_width].strip()]
            assert len(keys) == len(app.key_rows()), lines
            await pilot.press("q")
            assert not isinstance(app.screen, HelpScreen)
    run(go())


def test_a_broken_drafter_opened_in_the_console_is_named_as_its_field(tmp_path):
    # The resolver's read of the drafter's config.json said "--draft ...", a flag nobody gave.
    import shutil

    from textual.widgets._toast import Toast

    from blockwidth.engine import demo

    bad = tmp_path / "drafter"
    shutil.copytree(demo.target("bf16").parent / "drafter", bad)
    (bad / "config.json").write_text('{"model_type": "llama", ')

    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(100, 30)) as pilot:
            await _settle(app, pilot)
            await _open_pair(app, pilot, "ctrl+a", *str(demo.target("bf16")), "tab", *str(bad), "enter")
            for _ in range(100):
                line = str(app.screen_stack[0].query_one("#error").render())
                said = " ".join([line, *(str(Toast(n).render()) for n in app._notifications)])
                if "not valid JSON" in said:
                    break
                await pilot.pause(0.05)
            assert f"drafter field {bad}/config.json: not valid JSON" in said, said
            assert "--draft" not in said, said

    run(go())


def test_the_identity_tab_names_its_keys_before_a_session(tmp_path):
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            await pilot.press("2")
            assert "[ and ] pick the width" in _text(app, "#identity-head")

    run(go())


def test_c_in_a_workload_sessions_measured_phase_starts_no_run_after_it(tmp_path, monkeypatch):
    """A c during a workload session's measured phase did not stop it within 20 s. From the
    keyboard, on the demo pair and a three-request workload: no run starts once c is pressed
    (counted at each decode's start: the real decode runs), the status counts every request's
    runs (it said "after 4 of 148 runs": the warm-ups, as a workload's own arms hold only
    finished passes), and the headline the same."""
    import json

    from blockwidth.engine import ab

    wl = tmp_path / "three.jsonl"
    wl.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f(x):", "class A:", "import os"]))
    started: list[bool] = []  # for each run: was the cancel already set as it started
    real = ab.decode

    def counted(*args, **kw):
        started.append(app._cancel.is_set())
        return real(*args, **kw)

    monkeypatch.setattr(ab, "decode", counted)

    async def go():
        async with app.run_test(size=(140, 40)) as pilot:
            await _settle(app, pilot)
            app.query_one("#prompt").value = f"@{wl}"
            await _type_fields(pilot, "2,4", "2", "8", sequential=True)
            await pilot.press("enter")
            deadline = time.monotonic() + 120  # bounded: a session that never gets there fails here
            while not (app.phase is Phase.RUNS and len(started) >= 8):  # 4 warm-ups, then rep 1
                assert time.monotonic() < deadline, (app.phase, len(started))
                await pilot.pause(0.05)
            await pilot.press("c")
            assert app.phase in (Phase.CANCELLING, Phase.CANCELLED)  # (the run in flight may be done)
            await _settle(app, pilot)
            assert app.phase is Phase.CANCELLED and app.session.cancelled
            s = app.session
            measured = sum(len(a.runs) for r in s.per_request for a in [r.classic, *r.arms])
            assert f"after {measured + len(s.warmup)} of {s.config.planned_runs} runs" in _text(app, "#status")
            assert f"cancelled after {measured} of " in _text(app, "#headline")

    app = _app(tmp_path)
    run(go())
    assert len(started) >= 8 and not any(started)  # not one run began after the c


@pytest.mark.pilot
def test_the_console_s_own_pilot_prices_the_fields_once_the_pair_loads(tmp_path):
    """The console's pilot (off in every other test: it adds seconds to each load) runs for real
    here on the demo pair: the pace it leaves has positive rates at both widths, and the settings
    panel says the pre-run estimate from it before anything runs."""
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(140, 40)) as pilot:
            await _settle(app, pilot)
            p = app.pace
            assert p is not None, "no pace: the pilot did not run or returned nothing"
            assert p.prefill_s > 0 and p.decode_s > 0 and p.spec_decode_s > 0 and p.width == 2
            await pilot.pause()
            said = _text(app, "#settings")
            assert "at the pilot's pace" in said and "for its n 3" in said, said

    run(go())


def test_the_narrow_pair_line_names_a_short_folder_with_its_parent(tmp_path):
    """At 80 columns the top panel said "pair bf16 + prompt lookup" while the status line said
    "smollm2/bf16": a folder whose name says little is named with its parent in both."""
    import shutil

    from blockwidth.engine import demo

    target = tmp_path / "mymodel" / "bf16"
    shutil.copytree(demo.target("bf16"), target)

    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"), record_dir=str(tmp_path / "rec"),
                                    target=str(target), kind="lookup"))
        async with app.run_test(size=(80, 24)) as pilot:
            for _ in range(200):
                if "mymodel/bf16 + prompt lookup" in _text(app, "#pair"):
                    break
                await pilot.pause(0.05)
            assert "pair mymodel/bf16 + prompt lookup (lookup)" in _text(app, "#pair"), _text(app, "#pair")

    run(go())


def test_the_open_dialog_shows_what_an_empty_field_holds(tmp_path):
    """Its compact fields read as blank lines until typed in (a tryout at 80x24): an empty field
    shows what it stands for."""
    from textual.widgets import Input

    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settled_then(app, pilot, "o")
            fields = {i.id: i for i in app.screen.query(Input)}
            assert set(fields) == {"open-target", "open-draft", "open-kind"}
            assert all(i.placeholder.startswith("empty: ") for i in fields.values())
            fields["open-draft"].value = ""
            await pilot.pause()
            import html
            import re as regex

            # what the terminal shows: the screenshot's text, its tags and escapes taken out
            shot = html.unescape(regex.sub(r"<[^>]+>", "", app.export_screenshot())).replace("\xa0", " ")
            assert "empty: none" in shot and "empty: detected" in shot

    run(go())


def test_the_pilot_says_how_long_it_has_run(tmp_path):
    """SmolLM2 bf16's pilot sat 40 s on its words alone on the 2-core CPU, and a tryout took it for
    stuck: the seconds so far are said each second, until the pair is ready."""
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            pair, app.pair = app.pair, None
            app._pilot_clock()
            first = app._pilot_timer
            app._pilot_clock()  # another pair opened while the first pilot ran: one clock, the new one's
            assert first._task is None and app._pilot_timer is not first  # stopped, not left to tick
            for _ in range(40):  # the seconds said within about a second (a loaded host: a little later)
                await pilot.pause(0.1)
                if f"{app.PILOT_SAYS} · 1 s" in _text(app, "#status"):
                    break
            assert f"{app.PILOT_SAYS} · 1 s" in _text(app, "#status"), _text(app, "#status")
            app.pair = pair
            app.set_pair(pair)
            await pilot.pause(1.2)
            assert app.PILOT_SAYS not in _text(app, "#status")

    run(go())


def test_r_says_what_the_resolution_came_to(tmp_path):
    """A tryout pressed r and saw no sign of it: the answer is said when it comes."""
    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            app.clear_notifications()
            await pilot.press("r")
            said = []
            for _ in range(60):
                await pilot.pause(0.05)
                said = [str(n.message) for n in app._notifications]
                if any(m.startswith("re-resolved") for m in said):
                    break
            assert "re-resolved, unchanged: width 4 from kind-default" in said, said

    run(go())


def test_a_pair_that_comes_in_as_the_console_closes_is_kept_quietly(tmp_path):
    """CI once saw the pair's load end while run_test's app was closing: on_pair_ready reached
    for the tabs, gone by then, and the app died with NoMatches. The pair is kept, nothing drawn."""
    from textual.widgets import TabbedContent

    from blockwidth.console.messages import PairReady

    async def go():
        app = _app(tmp_path)
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            pair = app.pair
            await app.query_one(TabbedContent).remove()
            app.pair = None
            app.on_pair_ready(PairReady(pair))  # no NoMatches
            assert app.pair is pair

    run(go())
