"""The Textual console: the pair and device, the resolved width with its chain,
live A/B sessions with progress, table and plot, the identity diff, the profile
and past session records.

Slow work (resolution with its fingerprints, loading the pair, A/B sessions,
reading records) runs in thread workers that post messages; widgets are only
touched on the app's thread. The app never leaves focus in a field: a run
moves it to the results, Escape leaves a field, Enter in a field runs the A/B.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import (Button, Checkbox, DataTable, Footer, Header, Input, Label, ProgressBar, Static,
                             TabbedContent, TabPane)
from textual.worker import Worker, WorkerState

from console.inputs import CLI_PAIR_NAMES, InputError, chain_lines
from console.outcome import Tone
from console.render import arm_rows, bars
from console.request import CONSOLE_NAMES, FieldError, SessionRequest, check_fits, session_request
from console.screens import ConfirmScreen, HelpScreen, PairScreen, TextScreen
from policy.profile import ProfileError
from policy.resolve import WidthError, keyed_on
from policy.text import error_lines, shown, shown_block

DEFAULT_WIDTHS = (2, 4, 8)
_TONE_STYLE = {Tone.GOOD: "bold green", Tone.PLAIN: "bold", Tone.WARN: "bold yellow", Tone.BAD: "bold red",
               Tone.STOPPED: "bold yellow"}
# The console's default session is sequential with this budget, so a first run on a
# 2-core CPU ends in a decision (or says why not) within about 90 s, probe and curve included.
BUDGET_S = 60
MARK_STYLE = {"pass": "green", "warn": "yellow", "stale": "yellow", "skip": "dim", "fail": "bold red",
              "unchecked": "dim"}


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


@dataclass(frozen=True)
class Options:
    target: str | None = None
    draft: str | None = None
    kind: str | None = None
    flag: str | None = None
    device: str | None = None
    profile: str | None = None
    variant: str | None = None  # the demo target (bf16 when None); only without a target
    record_dir: str | None = None
    verify_attention: str = "auto"  # engine.attention: auto | fused | plain | bucketed | vector | rows


class Phase(str, Enum):
    """What the console is doing; the status line and the bar show exactly this."""

    LOADING = "loading the pair"
    LOAD_FAILED = "pair not loaded"
    READY = "ready"
    WARMUP = "warm-up"
    RUNS = "runs"
    EXACTNESS = "exactness probe"
    COSTCURVE = "cost curve"
    CANCELLING = "cancelling"
    DONE = "done"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def busy(self) -> bool:
        return self in (Phase.WARMUP, Phase.RUNS, Phase.EXACTNESS, Phase.COSTCURVE, Phase.CANCELLING)


# ---- messages from workers

class Resolved(Message):
    def __init__(self, res: Any, paths: Any, info: Any) -> None:
        super().__init__()
        self.res, self.paths, self.info = res, paths, info


class ResolveFailed(Message):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class PairReady(Message):
    def __init__(self, pair: Any) -> None:
        super().__init__()
        self.pair = pair


class AbEvent(Message):
    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event

    def can_replace(self, message: Message) -> bool:
        # Token ticks coalesce; stage changes must all arrive.
        return (isinstance(message, AbEvent) and message.event.kind == "progress"
                and self.event.kind == "progress")


class AbDone(Message):
    def __init__(self, session: Any, record_path: Path, gate_warnings: list[str]) -> None:
        super().__init__()
        self.session, self.record_path, self.gate_warnings = session, record_path, gate_warnings


class Saved(Message):
    def __init__(self, saved: str | None, refusal: str | None) -> None:
        super().__init__()
        self.saved, self.refusal = saved, refusal


class RecordsRead(Message):
    def __init__(self, rows: list[tuple[Path, dict]]) -> None:
        super().__init__()
        self.rows = rows


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else words or word + 's'}"


def _short_path(path: Path | None, demo: bool) -> str:
    if path is None:
        return "(prompt lookup: no checkpoint)"
    if demo:
        return f"demo pair: {path.name}"
    home = str(Path.home())
    s = str(path)
    return shown("~" + s[len(home):] if s.startswith(home + "/") else s)


def quant_label(scheme: str | None, bits: int | None) -> str:
    if scheme is None:
        return "any"
    if scheme == "none":
        return "unquantized"
    return f"{scheme} {bits}-bit" if bits else scheme


class BlockwidthApp(App):
    TITLE = "blockwidth"
    SUB_TITLE = "draft block width for speculative decoding on MLX"
    AUTO_FOCUS = "#results"
    _refusal_shown = False  # the error line holds a key's refusal (_error, _clear_refusal)
    CSS = """
    TabbedContent { height: 1fr; }
    TabbedContent > ContentSwitcher { height: 1fr; }
    TabPane { height: 1fr; padding: 0; }
    #top { height: auto; }
    #pair, #resolution { width: 1fr; height: auto; border: round $primary; padding: 0 1; }
    #error { padding: 0 1; color: $error; height: auto; }
    #error.-empty { display: none; }
    #controls, #prompt-row { height: 1; margin: 1 0 0 0; }
    #prompt-row { margin: 0; }
    #controls Label, #prompt-row Label { padding: 0 0 0 1; }
    #controls Input { margin: 0 0 0 1; }
    #controls Input { width: 6; }
    #controls #widths { width: 14; }
    #prompt { width: 1fr; margin: 0 0 0 1; }
    Input.-bad { background: $error 40%; }
    #controls Checkbox { border: none; height: 1; padding: 0 1; }
    #prompt-row Button { margin: 0 0 0 1; min-width: 0; width: auto; }
    #stage { height: 1; margin: 0 1; }
    #progress { width: 34; }
    #progress.-idle { display: none; }
    #status { width: 1fr; padding: 0 1; }
    #ab-main { height: 1fr; }
    #results { height: 1fr; width: 1fr; }
    #side { display: none; width: 1fr; height: 1fr; border-left: vkey $secondary; padding: 0 1; }
    .wide.tall #side { display: block; }
    #side-chain { margin: 1 0 0 0; }
    #results:focus { background: $boost; }
    #settings, #headline, #details { padding: 0 1; height: auto; }
    #body { height: auto; layout: vertical; }
    #arms { height: auto; max-height: 14; width: auto; }
    #plot { padding: 0 1; height: auto; width: auto; }
    #results.-stale #arms, #results.-stale #plot { opacity: 60%; }
    .diffcol { width: 1fr; border: round $secondary; padding: 0 1; }
    #profile-table, #records-table { height: auto; max-height: 16; }
    #record-preview { padding: 0 1; height: auto; }
    /* narrow terminals (under 100 columns): one column, no borders on the top panels */
    .narrow #top { layout: vertical; }
    .narrow #pair, .narrow #resolution { border: none; padding: 0 1; }
    /* wide terminals (170 columns and more): the table and the plot side by side */
    .wide #body { layout: horizontal; }
    .wide.tall #body { layout: vertical; }
    .narrow #progress { width: 20; }
    .short Header { display: none; }
    .short #controls { margin: 0; }
    .short #error { max-height: 3; }
    """
    BINDINGS = [
        Binding("a", "start_ab", "Run A/B", tooltip="run the A/B session with the fields above"),
        Binding("c", "cancel_ab", "Cancel", tooltip="stop the session after the current round"),
        Binding("s", "save", "Save"),
        Binding("d", "delete", "Delete entry"),
        Binding("y", "copy_command", "Copy cmd"),
        Binding("Y", "copy_env", "Copy env var", key_display="Y", show=False),
        Binding("w", "edit_fields", "Edit fields", show=False),
        Binding("o", "open_pair", "Open pair", show=False),
        Binding("m", "export_markdown", "Markdown", show=False),
        Binding("p", "next_prompt", "Prompt preset", show=False),
        Binding("r", "refresh", "Re-resolve", show=False),
        Binding("left_square_bracket", "pick_width(-1)", "Prev width", key_display="[", show=False),
        Binding("right_square_bracket", "pick_width(1)", "Next width", key_display="]", show=False),
        Binding("1", "tab('tab-ab')", "A/B tab", key_display="1-5", show=False),
        Binding("2", "tab('tab-identity')", "Identity tab", show=False),
        Binding("3", "tab('tab-chain')", "Chain tab", show=False),
        Binding("4", "tab('tab-profile')", "Profile tab", show=False),
        Binding("5", "tab('tab-records')", "Records tab", show=False),
        Binding("escape", "leave_field", "Leave field", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
    ]
    # What each action does, in the help screen and the command palette.
    HELP = {
        "start_ab": "run the A/B session (also: Enter in any field)",
        "cancel_ab": "cancel the running session after the current round",
        "save": "save the session's winner (or decline) to the profile",
        "delete": "delete the highlighted profile entry (Profile tab; asks first)",
        "copy_command": "copy the resolution as an mlx_lm.server command line (and show the env var)",
        "open_pair": "open another pair (target and drafter: folders or cached repo ids)",
        "edit_fields": "go to the A/B fields (Tab moves between them, Escape leaves)",
        "copy_env": "copy the resolution as BLOCKWIDTH_DRAFT_BLOCK_SIZE=N",
        "export_markdown": "export the session (or the highlighted record) as Markdown",
        "next_prompt": "put the next prompt preset in the prompt field",
        "refresh": "re-resolve the width (re-reads the profile and environment)",
        "pick_width(-1)": "Identity tab: the previous width",
        "pick_width(1)": "Identity tab: the next width",
        "tab('tab-ab')": "A/B tab", "tab('tab-identity')": "Identity tab", "tab('tab-chain')": "Chain tab",
        "tab('tab-profile')": "Profile tab", "tab('tab-records')": "Records tab",
        "leave_field": "leave a field (focus goes to the results)",
        "help": "this screen",
        "quit": "quit",
    }

    def __init__(self, options: Options | None = None, *, load: bool = True) -> None:
        super().__init__()
        self.options = options or Options()
        self._load = load  # False: tests and screenshots feed the pair and sessions themselves
        self.pair: Any = None
        self.res: Any = None
        self.paths: Any = None
        self.info: Any = None
        self.session: Any = None
        self.record_path: Path | None = None
        self.request: SessionRequest | None = None  # what the shown results were run with
        self.gate_warnings: list[str] = []
        self.phase = Phase.LOADING
        self._cancel = threading.Event()
        self._selected_width: int | None = None
        self._widths_touched = False
        self._prompt_index = 0
        self._profile_entries: list = []
        self._records: list[tuple[Path, dict]] = []
        self._planned = 0
        self._added_width: int | None = None  # the width in effect, added to a run that lacked it
        self._resolve_failed = False
        self._load_error: str | None = None  # why the pair did not load (the pair panel says it)
        # Pair errors name the flags the console was started with, until the operator opens a
        # pair in the console's own fields.
        self._pair_names: Any = CLI_PAIR_NAMES

    # ---- layout
    def compose(self) -> ComposeResult:
        from engine.demo.prompts import PRESETS

        yield Header()
        with Horizontal(id="top"):
            yield Static("resolving…", id="resolution")
            yield Static("loading the pair…", id="pair")
        yield Static("", id="error", classes="-empty")
        with TabbedContent(initial="tab-ab"):
            with TabPane("1 A/B", id="tab-ab"):
                with Horizontal(id="controls"):
                    yield Label("widths")
                    yield Input(",".join(map(str, DEFAULT_WIDTHS)), id="widths", compact=True)
                    yield Label("n")
                    yield Input("3", id="n", compact=True)
                    yield Label("tokens")
                    yield Input("64", id="tokens", compact=True)
                    yield MarkedCheckbox("sequential", True, id="sequential", compact=True,
                                   tooltip=f"add repetitions until decided (at most 12, {BUDGET_S} s)")
                with Horizontal(id="prompt-row"):
                    yield Label("prompt")
                    yield Input(_escape(PRESETS[0][1]), id="prompt", compact=True,
                                tooltip="\\n is a newline; p puts the next preset here")
                    # On the prompt row, where the field gives way, so both fit at 80 columns.
                    yield Button("Run (a)", id="start", variant="primary", compact=True)
                    yield Button("Cancel (c)", id="cancel", disabled=True, compact=True)
                with Horizontal(id="stage"):
                    yield ProgressBar(id="progress", total=1000, show_eta=False, classes="-idle")
                    yield Static("", id="status")
                with Horizontal(id="ab-main"):
                    with VerticalScroll(id="results", can_focus=True):
                        yield Static("", id="settings")
                        yield Static("", id="headline")
                        with Horizontal(id="body"):
                            yield DataTable(id="arms", cursor_type="row", zebra_stripes=True)
                            yield Static("", id="plot")
                        yield Static("", id="details")
                    # Only on wide terminals: the identity diff and the chain beside the results.
                    with VerticalScroll(id="side"):
                        yield Static("", id="side-identity")
                        yield Static("", id="side-chain")
            with TabPane("2 Identity", id="tab-identity"):
                # markup=False: read as markup, "[ and ]" was a tag and vanished from the line
                yield Static("run an A/B session; [ and ] pick the width to compare", id="identity-head",
                             markup=False)
                with Horizontal():
                    with VerticalScroll(classes="diffcol"):
                        yield Static("", id="classic-text")
                    with VerticalScroll(classes="diffcol"):
                        yield Static("", id="width-text")
            with TabPane("3 Chain", id="tab-chain"):
                yield VerticalScroll(Static("", id="chain"))
            with TabPane("4 Profile", id="tab-profile"):
                yield Static("", id="profile-path")
                yield DataTable(id="profile-table", cursor_type="row")
            with TabPane("5 Records", id="tab-records"):
                yield Static("past sessions for this pair and device", id="records-head")
                with VerticalScroll():
                    yield DataTable(id="records-table", cursor_type="row")
                    yield Static("", id="record-preview")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#arms", DataTable).add_columns(
            "arm", "decode min", "median", "max", "e2e med", "accept", "identity", "verdict")
        self.query_one("#profile-table", DataTable).add_columns(
            "check", "backend", "cc", "target", "kind", "width", "mlx", "measured", "identical", "pair", "why")
        self.query_one("#records-table", DataTable).add_columns(
            "created", "widths", "n", "tokens", "verdict")
        self._layout_for(self.size.width, self.size.height)
        self._show_phase(Phase.LOADING if self._load else Phase.READY)
        self.query_one("#settings", Static).update(Text("no session yet: press a (or Enter in a field)",
                                                        style="dim"))
        if self._load:
            self.resolve_in_background()
            self.load_pair()

    def on_resize(self, event) -> None:
        self._layout_for(event.size.width, event.size.height)

    def _layout_for(self, width: int, height: int) -> None:
        self.set_class(width < 100, "narrow")
        self.set_class(width >= 170, "wide")
        self.set_class(height < 30, "short")
        self.set_class(height >= 40, "tall")
        if self.res is not None:
            self._render_top()

    # ---- the status line and the bar: one place decides both
    def _show_phase(self, phase: Phase, detail: str = "", fraction: float | None = None) -> None:
        self.phase = phase
        bar = self.query_one("#progress", ProgressBar)
        # The bar is shown only while a stage with a known size runs; idle or failed, no animation.
        bar.set_class(not phase.busy or fraction is None, "-idle")
        if fraction is not None:
            bar.update(total=1000, progress=round(fraction * 1000))
        style = {Phase.FAILED: "bold red", Phase.LOAD_FAILED: "bold red", Phase.CANCELLED: "yellow",
                 Phase.CANCELLING: "yellow", Phase.DONE: "green"}.get(phase, "")
        status = Text.assemble((phase.value, style or "bold"), f"  {shown(detail)}" if detail else "")
        status.no_wrap, status.overflow = True, "ellipsis"
        self.query_one("#status", Static).update(status)
        self.query_one("#start", Button).disabled = phase.busy or self.pair is None
        self.query_one("#cancel", Button).disabled = not phase.busy or phase is Phase.CANCELLING
        self.refresh_bindings()

    def _error(self, text: str, refusal: bool = False) -> None:
        """Show ``text`` on the error line (empty: clear it). ``refusal``: a key's "nothing to do"
        answer, which the next action that works takes away (_clear_refusal); other errors stay
        until what caused them is redone. Shown as one line: an error quotes paths and names from
        the operator's files, whose escape sequences must not reach the terminal."""
        text = shown(text)
        err = self.query_one("#error", Static)
        err.update(Text(text))
        err.set_class(not text, "-empty")
        self._refusal_shown = bool(text) and refusal
        if text:
            # markup=False: errors quote "[unquantized bfloat16]" and paths, not markup tags
            self.notify(text, severity="error", timeout=8, markup=False)

    def _clear_refusal(self) -> None:
        if self._refusal_shown:
            self._error("")

    # ---- keys: focus, tabs, help, palette
    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        tab = self.query_one(TabbedContent).active if self.is_mounted else ""
        if action == "cancel_ab":
            return self.phase.busy and self.phase is not Phase.CANCELLING
        if action == "start_ab":
            return True if not self.phase.busy else None
        if action == "delete":
            return tab == "tab-profile"
        if action == "pick_width":
            return tab == "tab-identity"
        return True

    def action_edit_fields(self) -> None:
        self.query_one(TabbedContent).active = "tab-ab"
        self.set_focus(self.query_one("#widths", Input))

    def action_leave_field(self) -> None:
        if isinstance(self.focused, Input):
            self._focus_results()

    def _focus_results(self) -> None:
        tab = self.query_one(TabbedContent).active
        target = {"tab-profile": "#profile-table", "tab-records": "#records-table"}.get(tab, "#results")
        if tab == "tab-ab" or tab in ("tab-profile", "tab-records"):
            self.set_focus(self.query_one(target))
        else:
            self.set_focus(None)

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        self._focus_results()
        self.refresh_bindings()

    @on(TabbedContent.TabActivated)
    def _tab_changed(self, event: TabbedContent.TabActivated) -> None:
        self._clear_refusal()
        if event.pane.id == "tab-records":  # by key or by mouse: read them fresh
            self.read_records()
        self.refresh_bindings()

    def key_rows(self) -> list[tuple[str, str]]:
        rows = []
        for b in self.BINDINGS:
            key = b.key if b.action.startswith("tab(") else b.key_display or b.key
            rows.append((key, self.HELP.get(b.action, b.description)))
        rows += [("Enter", "in a field: run the A/B session"), ("Tab", "next field or table"),
                 ("ctrl+p", "command palette: every action above by name")]
        return rows

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.key_rows()))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        seen = set()
        for b in self.BINDINGS:
            if b.action in ("quit", "help") or b.action in seen:
                continue
            seen.add(b.action)
            yield SystemCommand(f"{b.description} ({b.key_display or b.key})", self.HELP.get(b.action, ""),
                                lambda action=b.action: self.run_action(action))
        yield SystemCommand("Keys (?)", "every key the console answers", self.action_help)

    # ---- resolution (a worker: it probes the device and fingerprints checkpoints)
    @work(thread=True, exclusive=True, exit_on_error=False, group="resolve", name="resolve")
    def resolve_in_background(self) -> None:
        from console.inputs import resolution

        o = self.options
        try:
            res, paths, info = resolution(target=o.target, draft=o.draft, kind=o.kind, flag=o.flag,
                                          device=o.device, profile=o.profile, variant=o.variant,
                                          profile_missing_ok=True, download=False, names=self._pair_names)
        except (InputError, WidthError, ProfileError) as e:
            self.post_message(ResolveFailed(str(e)))
            return
        self.post_message(Resolved(res, paths, info))

    def on_resolve_failed(self, message: ResolveFailed) -> None:
        self.res, self._resolve_failed = None, True
        self.query_one("#resolution", Static).update(Text("no resolution", style="bold red"))
        self._error(message.error)
        self.refresh_profile()

    def on_resolved(self, message: Resolved) -> None:
        self.set_resolution(message.res, message.paths, message.info)

    def set_resolution(self, res: Any, paths: Any, info: Any) -> None:
        self.res, self.paths, self.info = res, paths, info
        if self._resolve_failed:  # that error is answered now; others (a failed load) stay
            self._resolve_failed = False
            self._error("")
        # The width in effect is always among the measured arms; add it while the operator
        # has not typed their own widths (a run adds it anyway).
        if res.width is not None and not self._widths_touched:
            field = self.query_one("#widths", Input)
            ws = sorted({*DEFAULT_WIDTHS, res.width})
            with self.prevent(Input.Changed):
                field.value = ",".join(map(str, ws))
        self._render_top()
        chain = "\n".join(shown(line) for line in chain_lines(res.chain))
        self.query_one("#chain", Static).update(Text(chain))
        self.query_one("#side-chain", Static).update(Text.assemble(("the resolution's chain (tab 3)\n", "bold"),
                                                                   chain))
        self.refresh_profile()
        if self.session is not None:
            self._render_details()

    def _render_top(self) -> None:
        res, paths, info = self.res, self.paths, self.info
        narrow = self.has_class("narrow")
        width = str(res.width) if res.width is not None else "classic"
        head = Text.assemble(("width ", "bold"), (width, "bold green"), f" · source {res.source.value}",
                             (" · STALE" if res.stale else "", "yellow"))
        note = self._in_effect()
        if note:
            head.append(f"  {note[0]}", style=_TONE_STYLE[note[1]])
        keyed = f"keyed on {keyed_on(res.device, res.quantization)}"
        self.query_one("#resolution", Static).update(Text.assemble(
            head, "\n", shown(res.reason), *(() if narrow else ("\n", keyed))))
        self._render_pair()

    def _render_pair(self) -> None:
        """The pair panel: the pair and device once resolved, and why the pair did not load.
        That failure is said here only, where the operator reads which pair this is; every
        redraw of the top keeps it until another pair is opened."""
        res, paths, info = self.res, self.paths, self.info
        lines: list[Text] = []
        if res is not None:
            drafter = _short_path(paths.drafter, paths.demo)
            lines = [Text.assemble(("target  ", "bold"), _short_path(paths.target, paths.demo)),
                     Text.assemble(("drafter ", "bold"), f"{drafter}  ({info.kind.value})"),
                     Text.assemble(("device  ", "bold"), res.device.describe())]
            if self.has_class("narrow"):
                d = paths.drafter.name if paths.drafter else "prompt lookup"
                lines = [Text.assemble(("pair ", "bold"), shown(f"{'demo: ' if paths.demo else ''}{paths.target.name}"
                                       f" + {d} ({info.kind.value}) · {res.device.describe()}"))]
        if self._load_error is not None:
            lines.append(Text(f"pair not loaded: {shown(self._load_error)}", style="red"))
        if not lines:
            return  # neither resolved nor failed yet: "loading the pair…" stays
        t = Text("\n").join(lines)
        # A path is cut at the edge, never broken mid-word; a failure wraps, so all of it shows.
        t.no_wrap, t.overflow = self._load_error is None, "ellipsis"
        self.query_one("#pair", Static).update(t)

    def _in_effect(self) -> tuple[str, Tone] | None:
        from console.outcome import in_effect_note

        if self.session is None or self.res is None:
            return None
        return in_effect_note(self.session, self.res.width)

    # ---- the profile
    def _profile_path(self) -> Path:
        from policy import profile as profiles

        return Path(self.options.profile).expanduser() if self.options.profile else profiles.default_path()

    def refresh_profile(self) -> None:
        from policy import profile as profiles

        table = self.query_one("#profile-table", DataTable)
        table.clear()
        path = self._profile_path()
        try:
            prof = profiles.load(path, missing_ok=True)
        except ProfileError as e:
            self._profile_entries = []
            self.query_one("#profile-path", Static).update(Text("\n".join(error_lines(e)), style="red"))
            return
        self._profile_entries = list(prof.entries)
        where = shown(path) + ("" if prof.exists else " (not created yet)")
        self.query_one("#profile-path", Static).update(Text(
            f"{where}: {plural(len(prof.entries), 'entry', 'entries')}   "
            f"(s saves the session's winner or decline; d deletes the highlighted entry, after asking)"))
        for e, mark in zip(prof.entries, self._entry_marks(prof)):
            table.add_row(Text(mark.mark.value, style=MARK_STYLE[mark.mark.value]),
                          e.backend.value, e.compute_capability or "-", quant_label(e.quant_scheme, e.quant_bits),
                          e.drafter_kind.value, "decline" if e.decline else str(e.width), shown(e.mlx or "-"),
                          shown((e.measured_at or "-")[:19]), "yes" if e.byte_identical else "NO",
                          shown((e.pair or "any")[:12]), shown(mark.why))

    def _entry_marks(self, prof: Any) -> list[Any]:
        """The static --check, read-only, for the resolved device: one mark per entry (none
        until the resolution worker has probed the device)."""
        from console.check import EntryMark, Mark, profile_marks

        if self.res is None:
            return [EntryMark(Mark.UNCHECKED, "no device yet: the resolution has not finished or failed")
                    ] * len(prof.entries)
        return profile_marks(prof, self.res.device)

    # ---- the pair (a worker)
    @work(thread=True, exclusive=True, exit_on_error=False, group="pair", name="load pair")
    def load_pair(self) -> None:
        from console.inputs import pair_paths
        from engine.pair import load_pair

        o = self.options
        # No download from inside the console (its progress would have nowhere to go).
        paths = pair_paths(o.target, o.draft, o.variant, o.kind, weights=True, download=False,
                           names=self._pair_names)
        self.post_message(PairReady(load_pair(paths.target, paths.drafter, o.kind)))

    def on_pair_ready(self, message: PairReady) -> None:
        self.set_pair(message.pair)

    def set_pair(self, pair: Any) -> None:
        self.pair = pair
        # The settings line says how to start ("press a"): the status carries the pair only, so it
        # fits 80 columns instead of ending in a cut-off copy of that hint.
        self._show_phase(Phase.READY, pair.describe())

    def action_open_pair(self) -> None:
        if self.phase.busy:
            self._error("a session is running: cancel it (c) before opening another pair")
            return
        o = self.options
        self.push_screen(PairScreen(o.target or "", o.draft or "", o.kind or ""), self._open_pair)

    def _open_pair(self, values: tuple[str, str, str] | None) -> None:
        if values is None:
            return
        from console.request import KINDS

        target, draft, kind = values
        if kind and kind not in KINDS:
            self._error(f"kind {kind!r}: one of {', '.join(KINDS)}")
            return
        from console.inputs import CONSOLE_PAIR_NAMES, pair_paths

        try:
            # Folder checks only (no model load): a wrong path must not cost the loaded pair.
            pair_paths(target or None, draft or None, None if target else self.options.variant,
                       kind or None, weights=True, download=False, names=CONSOLE_PAIR_NAMES)
        except InputError as e:
            self._error(f"{e} — still on {self.pair.describe() if self.pair else 'the previous pair'}")
            return
        self.options = replace(self.options, target=target or None, draft=draft or None, kind=kind or None,
                               variant=None if target else self.options.variant)
        self._pair_names = CONSOLE_PAIR_NAMES
        self.pair = self.res = self.session = self.request = self.record_path = None
        self._load_error = None
        self.query_one("#arms", DataTable).clear()
        for wid in ("#plot", "#details", "#headline", "#settings"):
            self.query_one(wid, Static).update("")
        self.query_one("#resolution", Static).update("resolving…")
        self.query_one("#pair", Static).update("loading the pair…")
        self._error("")
        self._show_phase(Phase.LOADING, target or "the demo pair")
        self.resolve_in_background()
        self.load_pair()

    # ---- the A/B fields
    def _read_request(self) -> SessionRequest:
        return session_request(
            widths=self.query_one("#widths", Input).value, n=self.query_one("#n", Input).value,
            tokens=self.query_one("#tokens", Input).value,
            prompt=_unescape(self.query_one("#prompt", Input).value),
            sequential=self.query_one("#sequential", Checkbox).value, max_seconds=BUDGET_S)

    @on(Input.Changed)
    def _field_changed(self, event: Input.Changed) -> None:
        event.input.remove_class("-bad")
        if event.input.id == "widths" and event.input.has_focus:  # typed by the operator
            self._widths_touched = True
        self._mark_stale()

    @on(Checkbox.Changed)
    def _box_changed(self) -> None:
        self._mark_stale()

    def _mark_stale(self) -> None:
        """Results belong to the inputs they were run with: say so when the fields moved on."""
        if self.request is None:
            return
        try:
            now = self._read_request()
        except InputError:
            now = None
        stale = now != self.request and not self.phase.busy
        self.query_one("#results").set_class(stale, "-stale")
        self._render_settings(stale)

    def _attention(self) -> str:
        """The verify attention in effect: the session's, else what ``auto`` means here."""
        if self.session is not None and getattr(self.session, "attention", ""):
            return self.session.attention
        from engine.attention import effective

        mode = self.options.verify_attention
        eff = effective(mode).value
        return eff if mode == eff else f"{eff} ({mode})"

    def _render_settings(self, stale: bool = False) -> None:
        req = self.request
        if req is None:
            return
        said = ("running with " if self.phase.busy else "failed with " if self.phase is Phase.FAILED
                else "measured with ")
        t = Text.assemble((said, "dim"), req.settings(), f" · verify attention {self._attention()}")
        added = self._added_width
        if added:
            t.append(f" (+ w{added}: the width in effect)", style="dim")
        if stale:
            t = Text.assemble(("STALE ", "bold yellow reverse"), " fields changed since this run; a runs them. ",
                              t)
        self.query_one("#settings", Static).update(t)

    @on(Input.Submitted, "#controls Input, #prompt-row Input")
    def _submitted(self) -> None:
        self.action_start_ab()

    def action_next_prompt(self) -> None:
        from engine.demo.prompts import PRESETS

        self._prompt_index = (self._prompt_index + 1) % len(PRESETS)
        name, text = PRESETS[self._prompt_index]
        self.query_one("#prompt", Input).value = _escape(text)
        self.notify(f"prompt preset: {name}", timeout=4)

    # ---- A/B
    def action_start_ab(self) -> None:
        if self.phase.busy:
            return
        if self.pair is None:
            self._error("the pair is not loaded yet (or failed to load): nothing to run", refusal=True)
            return
        try:
            req = self._read_request()
            check_fits(req, len(self.pair.encode(req.prompt)), self.pair.context_length)
        except FieldError as e:
            self._error(e.say(CONSOLE_NAMES))
            # Mark the field to fix; focus stays where the operator left it (w goes to the fields).
            field = {"widths": "#widths", "n": "#n", "tokens": "#tokens", "prompt": "#prompt"}.get(e.field.value)
            if field:
                self.query_one(field, Input).add_class("-bad")
            return
        except (InputError, ValueError) as e:  # ValueError: an id the pair's tables have no row for
            self._error(str(e))
            return
        self._error("")
        widths, self._added_width = req.widths, None
        if self.res is not None and self.res.width is not None and self.res.width not in widths:
            widths, self._added_width = (*widths, self.res.width), self.res.width
        from engine.ab import AbConfig

        config = AbConfig(widths=widths, prompt=req.prompt, n=req.n, max_tokens=req.tokens,
                          sequential=req.sequential, max_reps=req.max_reps, max_seconds=req.max_seconds,
                          verify_attention=self.options.verify_attention)
        self.begin(req, config.planned_runs)
        self._cancel = threading.Event()
        self.run_ab(config)

    def begin(self, req: SessionRequest, planned: int) -> None:
        """Clear the last results and show a session starting (the worker's events follow)."""
        self._focus_results()  # before the buttons change: focus must not fall into a field
        self.request, self.session, self.record_path, self._planned = req, None, None, planned
        self.query_one("#results").remove_class("-stale")
        self.query_one("#arms", DataTable).clear()
        for wid in ("#plot", "#details", "#headline"):
            self.query_one(wid, Static).update("")
        self._render_settings()
        self._show_phase(Phase.WARMUP, f"stage 1/3 · run 0/{planned}", 0.0)

    @work(thread=True, exclusive=True, exit_on_error=False, group="ab", name="A/B session")
    def run_ab(self, config: Any) -> None:
        from engine import host, record
        from engine.ab import run_session

        gate = host.gate()
        session = run_session(self.pair, config, on_event=lambda e: self.post_message(AbEvent(e)),
                              cancel=self._cancel)
        rec = record.build(session, self.pair, host.identity(), gate.to_dict())
        path = record.write(rec, Path(self.options.record_dir) if self.options.record_dir else None)
        self.post_message(AbDone(session, path, list(gate.warnings)))

    def on_ab_event(self, message: AbEvent) -> None:
        e = message.event
        if self.phase is Phase.CANCELLING or not self.phase.busy:
            return  # the stage text stays "cancelling" until the worker returns
        if e.kind in ("arm", "progress"):
            where = "closing classic" if e.closing else f"{e.arm} warm-up" if e.rep == 0 else f"{e.arm} rep {e.rep}"
            phase = Phase.WARMUP if e.rep == 0 and not e.closing else Phase.RUNS
            tokens = f" · {e.tokens}/{e.total} tokens" if e.kind == "progress" else ""
            self._show_phase(phase, f"stage 1/3 · run {e.run + 1}/{e.runs} · {where}{tokens}", e.fraction)
        elif e.kind == "phase":
            phase = Phase.EXACTNESS if e.phase == "exactness" else Phase.COSTCURVE
            what = f"{e.arm} " if e.arm else ""
            unit = "widths" if phase is Phase.EXACTNESS else "row counts"
            stage = 2 if phase is Phase.EXACTNESS else 3
            self._show_phase(phase, f"stage {stage}/3 · {what}{e.run}/{e.runs} {unit} done", e.run / max(e.runs, 1))

    def on_ab_done(self, message: AbDone) -> None:
        self.show_session(message.session, message.record_path, message.gate_warnings)

    def show_session(self, session: Any, record_path: Path | None, gate_warnings: list[str],
                     request: SessionRequest | None = None) -> None:
        """The results of a finished (or cancelled) session."""
        from console.outcome import headline

        if request is not None:
            self.request = request
        self.session, self.record_path, self.gate_warnings = session, record_path, gate_warnings
        s = session
        runs = sum(len(a.runs) for a in [s.classic, *s.arms]) + len(s.warmup)
        if s.cancelled:
            self._show_phase(Phase.CANCELLED, f"after {runs} of {self._planned or s.config.planned_runs} runs")
        else:
            reps = f"{s.reps} repetition" + ("" if s.reps == 1 else "s")
            self._show_phase(Phase.DONE, f"{runs} runs, {reps}, {s.elapsed_s:.0f} s")
        table = self.query_one("#arms", DataTable)
        table.clear()
        for arm in [s.classic, *s.arms]:
            d, e = arm.decode_range(), arm.e2e_range()
            if d is None:
                continue
            acc = f"{arm.acceptance:.3f}" if arm.acceptance is not None else "-"
            ident = "-" if arm.identity is None else (
                "identical" if arm.identity.identical_ids else f"differs @ {arm.identity.first_divergence}")
            verdict = "(cancelled)" if s.cancelled and arm.width is not None else arm.verdict.value
            style = {"wins": "bold green", "slower": "red", "faster, output differs": "yellow"}.get(verdict, "")
            name = arm.name + (" *" if self.res is not None and arm.width == self.res.width else "")
            table.add_row(name, f"{d.min:.1f}", f"{d.median:.1f}", f"{d.max:.1f}", f"{e.median:.1f}",
                          acc, ident, Text(verdict, style=style), key=arm.name)
        if not s.cancelled:
            plot = "decode tok/s (= min, # median, - max)\n" + "\n".join(bars(arm_rows(s), "tok/s"))
            self.query_one("#plot", Static).update(Text(plot))
        h = headline(s, self._planned or s.config.planned_runs)
        self.query_one("#headline", Static).update(Text.assemble(
            (h.text, _TONE_STYLE[h.tone]), ("   s saves it" if h.saveable else "", "dim")))
        self._render_settings()
        self._render_details()
        if self.res is not None:
            self._render_top()
        pick = s.recommendation or next((a.width for a in s.arms if a.runs), None)
        if pick is not None:
            self.show_identity(pick)

    def _render_details(self) -> None:
        s = self.session
        lines: list[Text] = []
        note = self._in_effect()
        if note:
            lines.append(Text(note[0] + " (* in the table)", style=_TONE_STYLE[note[1]]))
        if not s.cancelled:
            lines.append(Text.assemble(("why: ", "bold"), s.why))
            if s.prediction:
                # both terms per width (draft by the kind's cost model, verify from the curve)
                first, *rest = s.prediction_lines()
                lines.append(Text(first, style="bold"))
                lines.extend(Text(line) for line in rest)
            elif s.predicted:
                pred = "  ".join(f"w{k} {v:.2f}x" for k, v in sorted(s.predicted.items()))
                lines.append(Text.assemble(("model prediction ", "bold"),
                                           "(cost curve x acceptance; not a measurement): ",
                                           f"best w{s.predicted_best}  [{pred}]"))
            for ex in s.exactness.values():
                lines.append(Text(f"exactness {ex.describe()}", style="" if ex.bitwise_equal else "yellow"))
            for arm in s.arms:
                if arm.identity and not arm.identity.identical_ids:
                    lines.append(Text(shown(f"{arm.name}: {arm.identity.describe()}"), style="yellow"))
            for w in s.warnings():
                lines.append(Text(f"warning: {w}", style="yellow"))
        for w in self.gate_warnings:
            lines.append(Text(f"host: {w} (timings may be noisy)", style="yellow"))
        if self.record_path is not None:
            lines.append(Text(f"record: {self.record_path.name}  (m exports it as Markdown)", style="dim"))
        self.query_one("#details", Static).update(Text("\n").join(lines))

    # ---- identity
    def show_identity(self, width: int) -> None:
        s = self.session
        if s is None or not s.classic.runs or self.pair is None:
            return
        try:
            arm = s.arm(width)
        except KeyError:
            return
        if not arm.runs:
            return
        self._selected_width = width
        tok = self.pair.tokenizer
        classic_ids = s.classic.runs[0].tokens
        width_ids = next((r.tokens for r in arm.runs if r.tokens != classic_ids), arm.runs[0].tokens)
        ident = arm.identity
        n = ident.first_divergence if ident and not ident.identical_ids else None
        prompt = Text(shown_block(s.config.prompt), style="dim")

        def render(ids: list[int], colour: str) -> Text:  # a completion's escapes are escaped too
            if n is None:
                return prompt + Text(shown_block(tok.decode(ids)))
            return prompt + Text.assemble(shown_block(tok.decode(ids[:n])),
                                          (shown_block(tok.decode(ids[n:])), f"bold {colour} reverse"))

        measured = [a.width for a in s.arms if a.runs]
        self.query_one("#identity-head", Static).update(Text(
            # "2 of 3 widths", not "width 2 of 3": the position in the list, not the width 2
            f"classic (left) vs {arm.name} (right), {measured.index(width) + 1} of {len(measured)} widths "
            f"([ and ] pick): {shown(ident.describe()) if ident else 'no identity'}"))
        self.query_one("#classic-text", Static).update(render(classic_ids, "green"))
        self.query_one("#width-text", Static).update(render(width_ids, "red"))
        self.query_one("#side-identity", Static).update(Text.assemble(
            (f"identity (tab 2): classic vs {arm.name}\n", "bold"), shown(ident.describe()) if ident else "", "\n\n",
            ("classic\n", "bold"), render(classic_ids, "green"), "\n\n", (f"{arm.name}\n", "bold"),
            render(width_ids, "red")))

    def action_pick_width(self, step: int) -> None:
        s = self.session
        if s is None:
            return
        measured = [a.width for a in s.arms if a.runs]
        if not measured:
            return
        i = measured.index(self._selected_width) if self._selected_width in measured else 0
        self.show_identity(measured[(i + step) % len(measured)])

    @on(DataTable.RowHighlighted, "#arms")
    def _arm_row(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key and key.startswith("w"):
            self.show_identity(int(key[1:]))

    def action_cancel_ab(self) -> None:
        if not self.phase.busy or self.phase is Phase.CANCELLING:
            return
        self._cancel.set()
        self._show_phase(Phase.CANCELLING, "stops after the current round; nothing from it can be saved")

    @on(Button.Pressed, "#start")
    def _start_pressed(self) -> None:
        self.action_start_ab()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel_ab()

    # ---- profile actions
    def action_save(self) -> None:
        if self.session is None:
            self._error("nothing to save: run an A/B session first", refusal=True)
            return
        if self.query_one("#results").has_class("-stale"):
            self._error("not saved: the fields changed since this run; run it again (a) first", refusal=True)
            return
        self.save_in_background(self.session, self.record_path)

    @work(thread=True, exclusive=True, exit_on_error=False, group="save", name="save")
    def save_in_background(self, session: Any, record_path: Path | None) -> None:
        """The device probe and the locked profile write stay off the UI thread."""
        from console.save import save_session
        from console.outcome import Front

        try:
            saved, refusal = save_session(session, self.pair, record_path, self.options.profile,
                                          front=Front.CONSOLE)
        except ProfileError as e:
            saved, refusal = None, str(e)
        self.post_message(Saved(saved, refusal))

    def on_saved(self, message: "Saved") -> None:
        if message.refusal:
            self._error(f"not saved: {message.refusal}")
            return
        self._error("")
        self.notify(f"saved {shown(message.saved)}", timeout=6, markup=False)
        self.resolve_in_background()

    def action_delete(self) -> None:
        table = self.query_one("#profile-table", DataTable)
        entries = self._profile_entries
        if not entries or table.cursor_row is None or table.cursor_row >= len(entries):
            self._error("no profile entry to delete: the profile is empty", refusal=True)
            return
        entry = entries[table.cursor_row]

        def answer(yes: bool | None) -> None:
            if yes:
                self._delete(entry)
            else:
                self.notify("kept the entry", timeout=3)

        self.push_screen(ConfirmScreen(f"Delete the profile entry\n  {entry.describe_keys()}"
                                       f" -> {'decline' if entry.decline else entry.width}\n"
                                       f"from {self._profile_path()}?"), answer)

    def _delete(self, entry: Any) -> None:
        from policy import profile as profiles

        try:
            profiles.delete(self._profile_path(), entry)
        except ProfileError as e:
            self._error(str(e))
            return
        self.notify(f"deleted {entry.describe_keys()}", timeout=6, markup=False)
        self.resolve_in_background()

    def action_refresh(self) -> None:
        self.notify("re-resolving: reading the profile and environment again", timeout=3)
        self.resolve_in_background()

    # ---- use the answer
    def server_command(self) -> tuple[str, str] | None:
        """The resolution as an mlx_lm.server command line, and as the environment variable."""
        import shlex

        res, paths = self.res, self.paths
        if res is None or res.width is None:
            return None
        env = f"BLOCKWIDTH_DRAFT_BLOCK_SIZE={res.width}"
        if paths.drafter is None:
            return (f"# mlx_lm.server has no prompt-lookup drafter; width {res.width} applies to "
                    f"blockwidth's engine only", env)
        return (f"mlx_lm.server --model {shlex.quote(str(paths.target))} --draft-model "
                f"{shlex.quote(str(paths.drafter))} --num-draft-tokens {res.width - 1}", env)

    def action_copy_command(self) -> None:
        cmd = self.server_command()
        if cmd is None:
            self._error("no width to copy: the resolution is classic (or not ready)", refusal=True)
            return
        self._clear_refusal()
        self.copy_to_clipboard(cmd[0])
        self.push_screen(TextScreen(Text.assemble(
            ("copied to the clipboard (where the terminal allows it):\n\n", "bold"), cmd[0],
            "\n\n", ("the same width for blockwidth and CI, as the environment variable:\n\n", "bold"),
            f"export {cmd[1]}", "  (Y copies it)\n\n",
            ("num_draft_tokens = width - 1.  Escape closes.", "dim"))))

    def action_copy_env(self) -> None:
        cmd = self.server_command()
        if cmd is None:
            self._error("no width to copy: the resolution is classic (or not ready)", refusal=True)
            return
        self._clear_refusal()
        self.copy_to_clipboard(f"export {cmd[1]}")
        self.notify(f"copied: export {cmd[1]}", timeout=5, markup=False)

    # ---- records
    def _record_dir(self) -> Path:
        from engine import record

        return Path(self.options.record_dir).expanduser() if self.options.record_dir else record.default_dir()

    @work(thread=True, exclusive=True, exit_on_error=False, group="records", name="read records")
    def read_records(self) -> None:
        from policy import files

        pair_id = self.pair.pair_id if self.pair is not None else None
        backend = self.res.device.backend.value if self.res is not None else None
        rows = []
        for path in sorted(self._record_dir().glob("session-*.json"), reverse=True)[:200]:
            try:
                rec = files.read_json(path, files.MAX_RECORD_BYTES)
                if pair_id and rec.get("pair", {}).get("pair_id") != pair_id:
                    continue
                if backend and rec.get("host", {}).get("device", {}).get("backend") != backend:
                    continue
                if not isinstance(rec.get("config", {}), dict) or not isinstance(rec.get("decision", {}), dict):
                    continue
            except (OSError, ValueError, AttributeError):  # not a record (a list, a string where a table is)
                continue
            rows.append((path, rec))
        self.post_message(RecordsRead(rows))

    def on_records_read(self, message: RecordsRead) -> None:
        self._records = message.rows
        table = self.query_one("#records-table", DataTable)
        table.clear()
        for path, rec in message.rows:
            cfg, dec = rec.get("config", {}), rec.get("decision", {})
            # The verdict says whether it could be saved, so a drifted "win" never reads as one.
            verdict = (Text(shown(dec.get("decision", "?")), style="green") if dec.get("saveable")
                       else Text(f"not saveable ({'cancelled' if rec.get('cancelled') else 'drift'}): "
                                 f"{shown(dec.get('decision', '?'))}", style="yellow"))
            widths = cfg.get("widths", [])
            table.add_row(shown(rec.get("created", "?")),
                          shown(",".join(map(str, widths if isinstance(widths, list) else [widths]))),
                          shown(cfg.get("n", "?")), shown(cfg.get("max_tokens", "?")), verdict)
        self.query_one("#records-head", Static).update(Text(
            f"{plural(len(message.rows), 'session')} for this pair and device in {self._record_dir()}"
            "   (m exports the highlighted one as Markdown)"))

    @on(DataTable.RowHighlighted, "#records-table")
    def _record_row(self, event: DataTable.RowHighlighted) -> None:
        from engine import record

        i = event.cursor_row
        if 0 <= i < len(self._records):
            try:
                preview = shown_block(record.markdown(self._records[i][1]))
            except (KeyError, TypeError, ValueError, AttributeError) as e:  # a record this version cannot read
                preview = f"{shown(self._records[i][0])}: cannot be shown ({type(e).__name__}: {shown(e)})"
            self.query_one("#record-preview", Static).update(Text(preview))

    def action_export_markdown(self) -> None:
        if self.query_one(TabbedContent).active == "tab-records":
            i = self.query_one("#records-table", DataTable).cursor_row
            if not self._records or i is None or i >= len(self._records):
                self._error("no record highlighted", refusal=True)
                return
            path = self._records[i][0]
        elif self.record_path is not None:
            path = self.record_path
        else:
            self._error("nothing to export: run an A/B session first (or pick one on the Records tab)", refusal=True)
            return
        self._clear_refusal()
        self.export_in_background(path)

    @work(thread=True, exit_on_error=False, group="export", name="export Markdown")
    def export_in_background(self, path: Path) -> None:
        """A record can hold every round of every run: read and render it off the UI thread."""
        from console.outputs import OutputError, write_output
        from engine import record

        out = path.with_suffix(".md")
        try:
            # checked as every output is: a FIFO named like it would hang the export, and a hard
            # link to the record or the profile would be written over
            write_output(out, record.markdown(record.load(path)).encode("utf-8"), "Markdown export",
                         [("the record", path), ("the profile", self._profile_path())])
        except OutputError as e:
            self.call_from_thread(self._error, str(e))
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self.call_from_thread(self._error, f"record {path}: cannot be exported ({e})")
            return
        self.call_from_thread(self.notify, f"wrote {shown(out)}", timeout=6, markup=False)

    # ---- failures and shutdown
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state is not WorkerState.ERROR:
            return
        err = event.worker.error
        group = event.worker.group
        if group == "pair":
            # Said once, in the pair panel (the error line and a toast each repeated it, and the
            # status line cut it off at 80 columns); the status line points there.
            self._load_error = str(err)
            self._render_pair()
            self._show_phase(Phase.LOAD_FAILED, "why: above; o opens another pair")
        elif group == "ab":
            self.session_failed(err)
        else:
            self._error(f"{event.worker.name} failed: {err}")

    def session_failed(self, err: BaseException) -> None:
        from engine.decode import DecodeError

        what = str(err) if isinstance(err, DecodeError) else f"{type(err).__name__}: {err}"
        self._error(f"the A/B session failed: {what}")
        self._show_phase(Phase.FAILED, f"{what}; nothing was measured or saved")
        self._render_settings()

    def on_unmount(self) -> None:
        self._cancel.set()  # a session stops at its next round instead of keeping the process alive
        self.workers.cancel_all()


def _escape(prompt: str) -> str:
    return prompt.replace("\\", "\\\\").replace("\n", "\\n")


def _unescape(text: str) -> str:
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


def run_app(options: Options) -> int:
    BlockwidthApp(options).run()
    return 0
