"""Tab 1: the A/B session. Its fields, the stage line (bar and status), and the results:
settings, headline, the arms table beside (or above) the plot, details; on wide and tall
terminals the identity diff and the chain beside them.

The tab draws the app's reactive state (``resolution``, ``session_state``, ``phase``, bound
with ``data_bind``) and its own ``stale``: results belong to the fields they were run with.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.reactive import var
from textual.widgets import Button, Checkbox, DataTable, Input, Label, Static, TabPane

from blockwidth.console.inputs import InputError, chain_lines
from blockwidth.console.outcome import Front, headline, next_step
from blockwidth.console.render import (arm_rows, arm_table, auto_lines, bars, class_lines, ratio_rows, request_table,
                                       speedup_lines)
from blockwidth.console.request import SessionRequest, session_request
from blockwidth.console.state import BUDGET_REPS, BUDGET_S, DEFAULT_WIDTHS, FIRST_N, FIRST_TOKENS, Phase, ResolutionView, SessionView
from blockwidth.console.widgets.common import TONE_STYLE, narrow
from blockwidth.console.widgets.top import ErrorLine, in_effect
from blockwidth.policy.text import shown

if TYPE_CHECKING:
    from blockwidth.engine.ab import Event, Session

_PHASE_STYLE = {Phase.FAILED: "bold red", Phase.LOAD_FAILED: "bold red", Phase.CANCELLED: "yellow",
                Phase.CANCELLING: "yellow", Phase.DONE: "green"}
_VERDICT_STYLE = {"wins": "bold green", "slower": "red", "faster, output differs": "yellow"}


def escape_prompt(prompt: str) -> str:
    return prompt.replace("\\", "\\\\").replace("\n", "\\n")


def unescape_prompt(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text) and text[i + 1] in "n\\":
            out.append("\n" if text[i + 1] == "n" else "\\")
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


class MarkedCheckbox(Checkbox):
    """A checkbox whose mark is blank when off. Textual's draws its X either way and tells the
    states apart by colour alone, which in the compact controls row a user toggled without
    noticing (new-user tryout)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._set_mark()  # a box created on shows its X before it is first toggled

    def watch_value(self) -> None:
        self._set_mark()
        super().watch_value()

    def _set_mark(self) -> None:
        self.BUTTON_INNER = "X" if self.value else " "


_STAGE_COUNT = re.compile(r"^stage 1/\d · ")  # the runs; the probe and the curve keep theirs


class StageBar(Static):
    """How far the stage is, in per mille: a thick line for what is done, a thin dotted one for
    what is left. Textual's ProgressBar drew the part left with the same thick glyph in a dim
    colour, which in a terminal of few colours read as a full bar at 0/4."""

    progress: var[int] = var(0)

    def watch_progress(self) -> None:
        self.refresh()

    def render(self) -> Text:
        width = max(self.size.width - 5, 1)
        done = round(self.progress / 1000 * width)
        return Text.assemble(("━" * done, "bold"), ("╌" * (width - done), "dim"),
                             f" {self.progress // 10:3d}%")


def _cut(detail: str, room: int) -> str:
    """``detail`` cut to ``room`` columns with an ellipsis, never just after a " · " (a tryout at
    80 columns read "run 19/163 ·", the line cut by characters after a separator); as it is when
    it fits or when the room is not known yet."""
    if room <= 1 or len(detail) <= room:
        return detail
    return detail[:room - 1].rstrip(" ·") + "…"


class Stage(Horizontal):
    """The status line and the bar: one place decides both."""

    _shown: tuple[Phase, str, float | None] | None = None  # what show was last given, uncut

    def compose(self) -> ComposeResult:
        yield StageBar(id="progress", classes="-idle")
        yield Static("", id="status")

    def on_resize(self) -> None:
        # the line is cut for the room it had when drawn: cut again for the new room (a wider
        # terminal kept the old cut, a narrower one had Textual cut it wherever the edge fell).
        # After the refresh, as the top panels do: the screen's breakpoint class is set by then.
        if self._shown is not None:
            self.call_after_refresh(self._redraw)

    def _redraw(self) -> None:
        if self._shown is not None:
            self.show(*self._shown)

    def show(self, phase: Phase, detail: str = "", fraction: float | None = None) -> None:
        self._shown = (phase, detail, fraction)
        bar = self.query_one(StageBar)
        # The bar is shown only while a stage with a known size runs; idle or failed, no animation.
        bar.set_class(not phase.busy or fraction is None, "-idle")
        if fraction is not None:
            bar.progress = round(min(max(fraction, 0.0), 1.0) * 1000)
        if detail and narrow(self):
            # under 100 columns the line is cut at its end, where the time figures and the arm
            # are: "stage 1/3 · " goes first (the phase word names it); the later stages keep
            # theirs, which says why the bar starts again (a tryout read "83% runs" then "76% cost
            # curve" as the bar going backwards)
            detail = _STAGE_COUNT.sub("", detail, count=1)
        if detail:
            # the room the status has once the bar is shown or hidden as just set (its own size
            # is still the last layout's): the stage's, less the bar's, the padding, the phase word
            bar_w = 0 if bar.has_class("-idle") or bar.styles.width is None else int(bar.styles.width.value)
            room = self.content_size.width - bar_w - 2 - len(phase.value) - 2 if self.content_size.width else 0
            detail = _cut(shown(detail), room)
        status = Text.assemble((phase.value, _PHASE_STYLE.get(phase, "bold")), f"  {detail}" if detail else "")
        status.no_wrap, status.overflow = True, "ellipsis"
        self.query_one("#status", Static).update(status)


def sequential_stage(e: Event, req: SessionRequest, planned: int) -> tuple[str, float]:
    """The status words and the bar of a sequential session's run event. The warm-ups, the n
    repetitions and their closing classic pass are ``planned`` runs, which always run in full;
    after them the session adds repetitions while undecided. The bar is one scale, the budget,
    repetitions or seconds, whichever is nearer its end: the planned runs fill the n repetitions'
    share of it (it read 90 % at their end, then fell back to 50 % as repetitions were added),
    or all of it once the seconds are spent (nothing will be added), and it reads full only once
    every run is done. A seconds budget spent early is said in words, not as "368 of 60 s"."""
    part = e.tokens / e.total if e.kind == "progress" and e.total else 0.0
    secs, reps = req.max_seconds, max(req.n, req.max_reps)
    spent = e.elapsed >= secs
    if e.run < planned:
        if spent:
            said = f"{secs:g} s spent: n {req.n} finish, none added"  # short: 80 columns cut it
        else:  # the bar's scale, named: its percent is of the budget, not of these runs
            said = f"{e.elapsed:.0f}/{secs:g} s budget"
        # the bar's scale first: at 80 columns the line's end is cut, and a tryout read "44 %"
        # beside "run 145/163" with the words that say what the 44 % is of cut off
        label = f"{said} · run {e.run + 1}/{planned}"
        if spent:  # no repetition will be added: the planned runs are the whole session
            return label, min((e.run + part) / planned, 0.99)
        share = min(req.n, reps) / reps  # the n repetitions' part of the budget
        return label, min(max((e.run + part) / planned * share, e.elapsed / secs), 0.99)
    # added repetitions (a closing pass after them counts those done)
    done = e.rep - 1 if e.closing else e.rep
    rep = f"{done} of ≤{reps} repetitions done" if e.closing else f"rep {e.rep} of ≤{reps}"
    if spent:
        said = f"{secs:g} s spent: " + ("closing" if e.closing else "the last repetition")
        fraction = 0.99
    else:
        said = f"{e.elapsed:.0f} of {secs:g} s"
        fraction = min(max((done - (0 if e.closing else 1)) / reps, e.elapsed / secs), 0.99)
    return f"budget: {rep}, {said}", fraction


def arm_table_rows(session: Session, width_in_effect: int | None) -> list[tuple[str, tuple]]:
    """The arms table: (row key, cells) for every arm with runs; ``*`` marks the width in effect."""
    rows = []
    for row in arm_table(session):  # the same rows as sweep prints
        d = row.decode
        verdict = "(cancelled)" if session.cancelled and row.width is not None else row.verdict.value
        name = row.name + (" *" if width_in_effect is not None and row.width == width_in_effect else "")
        rows.append((row.name, (name, f"{d.min:.1f}", f"{d.median:.1f}", f"{d.max:.1f}", f"{row.e2e.median:.1f}",
                                row.acceptance, row.identity, Text(verdict, style=_VERDICT_STYLE.get(verdict, "")))))
    return rows


def running_rows(session: Session, width_in_effect: int | None) -> list[tuple[str, tuple]]:
    """The arms table while the session runs: its finished repetitions' figures, each verdict
    "so far" (none is drawn before the runs end: a tryout watched an empty table for minutes)."""
    so_far = Text("so far", style="dim")
    return [(key, (*cells[:-1], so_far)) for key, cells in arm_table_rows(session, width_in_effect)]


def details_text(state: SessionView, view: ResolutionView | None, fold: int | None = 2) -> Text:
    """Below the table: the width in effect, why, each width's speed-up and interval, a
    workload's requests (``fold``: only that many worst and best), predictions, exactness,
    warnings, the record."""
    s = state.session
    lines: list[Text] = []
    note = in_effect(state, view)
    if note:
        lines.append(Text(note[0] + " (* in the table)", style=TONE_STYLE[note[1]]))
    if not s.cancelled:
        lines.append(Text.assemble(("why: ", "bold"), s.why))
        lines.extend(Text(line) for line in speedup_lines(s) if line)  # no blank line here
        if not s.single:
            lines.extend(Text(line) for line in request_table(s, fold=fold) if line)
        if s.prediction:
            # both terms per width (draft by the kind's cost model, verify from the curve)
            first, *rest = s.prediction_lines()
            lines.append(Text(first, style="bold"))
            lines.extend(Text(line) for line in rest)
        elif s.predicted:
            from blockwidth.engine.costcurve import PREDICTION_LABEL

            line = Text(s.prediction_line(per_width=True))
            line.stylize("bold", 0, len(PREDICTION_LABEL) + 1)  # "model prediction ", the label
            lines.append(line)
        if s.curve_skipped:
            lines.append(Text(s.curve_skipped, style="yellow"))
        if s.rollback_line():  # how the target's cache went back to the kept rows, and its cost
            lines.append(Text(s.rollback_line(), style="dim"))
        for ex in s.exactness.values():
            lines.append(Text(f"exactness {ex.describe()}", style="" if ex.bitwise_equal else "yellow"))
        for r in s.per_request:
            for arm in r.arms:
                if arm.identity and not arm.identity.identical_ids:
                    on = "" if s.single else f" on request {r.id}"
                    lines.append(Text(shown(f"{arm.name}{on}: {arm.identity.describe()}"), style="yellow"))
        for w in s.warnings():
            lines.append(Text(f"warning: {w}", style="yellow"))
    for w in state.gate_warnings:
        lines.append(Text(f"host: {w} (timings may be noisy)", style="yellow"))
    if state.record_path is not None:
        lines.append(Text(f"record: {state.record_path.name}  (m exports it as Markdown)", style="dim"))
    return Text("\n").join(lines)


def _prompt_label(prompt: str) -> str:
    """The prompt field's label: with the preset's name while it holds one (p cycles them)."""
    from blockwidth.engine.demo.prompts import preset_tag

    tag = preset_tag(prompt)  # a workload (@mixed) names itself in the field
    return f"prompt ({tag})" if tag and not prompt.startswith("@") else "prompt"


class AbTab(TabPane):
    resolution: var[ResolutionView | None] = var(None)
    session_state: var[SessionView | None] = var(None)
    phase: var[Phase] = var(Phase.LOADING)  # bound, read when drawing; the app's stage shows it
    stale: var[bool] = var(False)  # the fields changed since the shown session was asked for

    def __init__(self, title: str, *, prompt: str, verify_attention: str, id: str) -> None:
        super().__init__(title, id=id)
        self._prompt = prompt
        self._verify_attention = verify_attention
        self._widths_touched = False  # typed by the operator: the resolution no longer fills them
        self._running: list[tuple[str, tuple]] = []  # a running session's rows so far

    def compose(self) -> ComposeResult:
        with Horizontal(id="controls"):
            yield Label("widths")
            yield Input(",".join(map(str, DEFAULT_WIDTHS)), id="widths", compact=True)
            yield Label("n")
            yield Input(str(FIRST_N), id="n", compact=True)
            yield Label("tokens")
            yield Input(str(FIRST_TOKENS), id="tokens", compact=True)
            yield MarkedCheckbox("sequential", True, id="sequential", compact=True,
                                 tooltip="add repetitions until decided, within the budget on its right")
            # The sequential budget: repetitions, then seconds (n repetitions always run in full).
            yield Label("reps")
            yield Input(str(BUDGET_REPS), id="reps", compact=True, tooltip="sequential budget: repetitions")
            yield Label("secs")
            yield Input(f"{BUDGET_S:g}", id="secs", compact=True, tooltip="sequential budget: seconds")
        with Horizontal(id="prompt-row"):
            yield Label(_prompt_label(self._prompt), id="prompt-label")
            yield Input(escape_prompt(self._prompt), id="prompt", compact=True,
                        tooltip="\\n is a newline; p puts the next preset here")
            # On the prompt row, where the field gives way, so both fit at 80 columns.
            yield Button("Run (a)", id="start", variant="primary", compact=True)
            yield Button("Cancel (c)", id="cancel", disabled=True, compact=True)
        yield Stage(id="stage")
        with Horizontal(id="ab-main"):
            with VerticalScroll(id="results", can_focus=True):
                yield Static(_NO_SESSION, id="settings")
                yield Static("", id="headline")
                with Horizontal(id="body"):
                    yield DataTable(id="arms", cursor_type="row", zebra_stripes=True)
                    yield Static("", id="plot")
                yield Static("", id="details")
            # Only on wide terminals: the identity diff and the chain beside the results.
            with VerticalScroll(id="side"):
                yield Static("", id="side-identity")
                yield Static("", id="side-chain")

    def on_mount(self) -> None:
        self.query_one("#arms", DataTable).add_columns(
            # "e2e", not "e2e med": at 80 columns "below min gain" fits
            "arm", "decode min", "median", "max", "e2e", "accept", "identity", "verdict")

    # ---- the fields
    def read_request(self) -> SessionRequest:
        """The session the fields ask for (FieldError names the field that is wrong)."""
        return session_request(
            widths=self.query_one("#widths", Input).value, n=self.query_one("#n", Input).value,
            tokens=self.query_one("#tokens", Input).value,
            prompt=unescape_prompt(self.query_one("#prompt", Input).value),
            sequential=self.query_one("#sequential", Checkbox).value,
            max_reps=self.query_one("#reps", Input).value, max_seconds=self.query_one("#secs", Input).value)

    def set_prompt(self, prompt: str) -> None:
        self.query_one("#prompt", Input).value = escape_prompt(prompt)

    def set_field(self, name: str, value: object) -> None:
        """Set one field as the operator would type it (a next step, a warning's choice)."""
        if name == "sequential":
            self.query_one("#sequential", Checkbox).value = bool(value)
            return
        if name == "prompt":
            self.set_prompt(str(value))
            return
        if name == "widths":
            self._widths_touched = True  # chosen: the resolution no longer fills them
        self.query_one(f"#{name}", Input).value = str(value)

    def mark_bad(self, field: str) -> str | None:
        """Mark the field to fix (a ``console.request.Field`` value); its input's id, or None."""
        ids = {"widths": "widths", "n": "n", "tokens": "tokens", "prompt": "prompt", "max reps": "reps",
               "max seconds": "secs"}
        if field in ids:
            self.query_one(f"#{ids[field]}", Input).add_class("-bad")
            return ids[field]
        return None

    def set_buttons(self, busy: bool, can_start: bool, can_cancel: bool) -> None:
        self.query_one("#start", Button).disabled = busy or not can_start
        self.query_one("#cancel", Button).disabled = not can_cancel

    @on(Input.Changed)
    def _field_changed(self, event: Input.Changed) -> None:
        event.input.remove_class("-bad")
        self.app.query_one(ErrorLine).clear_field(event.input.id)
        if event.input.id == "prompt":
            self.query_one("#prompt-label", Label).update(_prompt_label(unescape_prompt(event.value)))
        if event.input.id == "widths" and event.input.has_focus:  # typed by the operator
            self._widths_touched = True
        self._mark_stale()
        if self._shown() is None and not self.phase.busy:
            self._draw_settings()  # the estimate follows the fields

    @on(Checkbox.Changed)
    def _box_changed(self) -> None:
        self._mark_stale()
        if self._shown() is None and not self.phase.busy:
            self._draw_settings()

    def _mark_stale(self) -> None:
        state = self.session_state
        if state is None or state.request is None:
            return
        try:
            now = self.read_request()
        except InputError:
            now = None
        self.stale = now != state.request and not self.phase.busy

    def watch_stale(self, stale: bool) -> None:
        self.query_one("#results").set_class(stale, "-stale")
        self._draw_settings()
        self._draw_headline()  # a stale session's result is no longer the fields' to save

    def watch_phase(self) -> None:
        self._draw_settings()  # "running with" while it runs, "measured with" once done

    # ---- the state
    def watch_resolution(self, view: ResolutionView | None) -> None:
        if view is None or view.res is None:
            return  # resolving again, or it failed: what is shown stays
        res = view.res
        # The width in effect is always among the measured arms; add it while the operator
        # has not typed their own widths (a run adds it anyway).
        w = res.engine_width
        if w is not None and not self._widths_touched:
            field = self.query_one("#widths", Input)
            with self.prevent(Input.Changed):
                fixed = sorted({*DEFAULT_WIDTHS, w} - {"auto"})
                field.value = ",".join(map(str, fixed + (["auto"] if w == "auto" else [])))
        self.query_one("#side-chain", Static).update(Text.assemble(
            ("the resolution's chain (tab 3)\n", "bold"), "\n".join(chain_lines(res.chain))))
        # The arms table's *, the headline and the details' note on the width in effect follow
        # the resolution (a save re-resolves: the saved width is then the one in effect).
        if self._shown() is not None:
            self._draw_arms()
            self._draw_headline()
            self._draw_details()

    def watch_session_state(self) -> None:
        self.stale = False  # a new session (or none) is what the fields asked for
        self._draw_arms()
        self._draw_plot()
        self._draw_headline()
        self._draw_settings()
        self._draw_details()

    def _shown(self) -> Session | None:
        """The finished (or cancelled) session shown, if any."""
        state = self.session_state
        return state.session if state is not None else None

    # Each part of the results draws from the state alone, so a change redraws what it touches.
    def _draw_arms(self) -> None:
        table = self.query_one("#arms", DataTable)
        table.clear()
        s = self._shown()
        if s is not None:
            self._running = []
            res = self.resolution.res if self.resolution else None
            for key, cells in arm_table_rows(s, res.engine_width if res is not None else None):
                table.add_row(*cells, key=key)
        elif self.phase.busy:  # a session runs: its figures so far, if a repetition has ended
            for key, cells in self._running:
                table.add_row(*cells, key=key)

    def show_running(self, rows: list[tuple[str, tuple]], rep: int) -> None:
        """A running session's table after its repetition ``rep`` (``running_rows``); [] clears."""
        self._running = list(rows)
        self._draw_arms()
        if rows:
            self.query_one("#headline", Static).update(Text(
                f"figures so far, after repetition {rep}: the verdicts come when the runs end", style="dim"))

    def _draw_plot(self) -> None:
        s = self._shown()
        if s is None or s.cancelled:
            plot = ""
        else:
            cols = self._plot_columns()
            plot = ("decode tok/s" + ("" if s.single else " per pass") + " (= min, # median, - max)\n"
                    + "\n".join(bars(arm_rows(s), "tok/s", columns=cols)))
            if not s.single:  # a workload: each width's speed-up over its requests, too
                plot += ("\nspeed-up per request (= min, # median, - max over the requests)\n"
                         "the figure: the median request's; the verdict's ratio is over all tokens\n"
                         + "\n".join(bars(ratio_rows(s), "x", digits=2, columns=cols)))
                plot += "\n".join(class_lines(s, narrow=True))
            plot += "\n".join(auto_lines(s))
        self.query_one("#plot", Static).update(Text(plot))

    def _draw_headline(self) -> None:
        s, text = self._shown(), Text()
        state = self.session_state
        if s is not None:
            h = headline(s, state.planned or s.config.planned_runs, front=Front.CONSOLE)
            room = self.query_one("#headline", Static).content_size.width

            def beside(hint: str) -> str:
                # after the headline where it fits, else on the next line whole (80 columns
                # wrapped "(saves as a decline)   s" / "saves it")
                return "" if not hint else f"   {hint}" if not room or len(h.text) + 3 + len(hint) <= room else f"\n{hint}"

            if self.stale:  # what it says is about other fields than those on screen now
                text = Text.assemble((h.text, "dim"), (beside("stale: a runs the fields on screen"), "yellow"))
            elif state.saved:
                text = Text.assemble((h.text, TONE_STYLE[h.tone]), (beside("saved to the profile"), "green"))
            else:
                text = Text.assemble((h.text, TONE_STYLE[h.tone]), (beside("s saves it" if h.saveable else ""), "dim"))
                step = next_step(s)
                if step is not None:  # the one thing to do next, one key away
                    text.append_text(Text.assemble("\n", ("next: n ", "bold"), step.says))
        self.query_one("#headline", Static).update(text)

    def _draw_details(self) -> None:
        s = self._shown()
        # A workload's requests fold to the two worst and best on a small terminal (80x24); the
        # record (and m's Markdown) has them all.
        small = self.screen.has_class("-short") or self.screen.has_class("-narrow")
        self.query_one("#details", Static).update(
            Text() if s is None else details_text(self.session_state, self.resolution, 2 if small else None))

    def _plot_columns(self) -> int | None:
        """The columns the plot has (its container's, less the plot's padding), so a bar's note
        is not cut: at 80x24 "below min gain" lost its last letters. None before a layout."""
        body = self.query_one("#body")
        width = body.content_size.width
        if body.styles.layout is not None and body.styles.layout.name == "horizontal":
            width -= self.query_one("#arms").outer_size.width  # the plot beside the table
        return max(width - 2, 1) if width > 0 else None

    def on_resize(self) -> None:
        if self._shown() is not None:
            self._draw_plot()  # the bars follow the terminal's width
            if not self._shown().single:
                self._draw_details()  # the fold follows the terminal's size

    def _attention(self) -> str:
        """The verify attention in effect: the session's, else what ``auto`` means here."""
        state = self.session_state
        if state is not None and state.session is not None and getattr(state.session, "attention", ""):
            return state.session.attention
        from blockwidth.engine.attention import effective

        mode = self._verify_attention
        eff = effective(mode).value
        return eff if mode == eff else f"{eff} ({mode})"

    def _draw_settings(self) -> None:
        state = self.session_state
        settings = self.query_one("#settings", Static)
        if state is None or state.request is None:
            settings.update(_NO_SESSION + self._estimate())
            return
        said = ("running with " if self.phase.busy else "failed with " if self.phase is Phase.FAILED
                else "measured with ")
        t = Text.assemble((said, "dim"), state.request.settings(), f" · verify attention {self._attention()}")
        if state.added_width:
            added = state.added_width
            t.append(f" (+ {added if added == 'auto' else f'w{added}'}: the width in effect)", style="dim")
        if self.stale:
            t = Text.assemble(("STALE ", "bold yellow reverse"), " fields changed since this run; a runs them. ",
                              t)
        elif self.phase.busy and state.estimate:
            t.append(f" · {state.estimate}", style="dim")
        settings.update(t)

    def _estimate(self) -> Text:
        """What the fields' session costs here, from the pilot (nothing without one)."""
        estimate = getattr(self.app, "estimate_words", None)
        try:
            said = estimate(self.read_request()) if estimate is not None else None
        except InputError:
            said = None
        return Text(f" · these fields: {said}", style="dim") if said else Text()

    def show_identity(self, side: Text) -> None:
        self.query_one("#side-identity", Static).update(side)


_NO_SESSION = Text("no session yet: press a (or Enter in a field)", style="dim")
