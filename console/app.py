"""The Textual console: the pair and device, the resolved width with its chain,
live A/B sessions with progress, table and plot, the identity diff, the profile
and past session records.

The app holds the state (``resolution``, ``session_state``, ``phase``, ``load_error``:
reactive attributes the widgets in ``console.widgets`` are bound to and draw), the keys,
and the slow work: resolution with its fingerprints, loading the pair, A/B sessions and
saves run in thread workers that post typed messages (``console.messages``); widgets are
only touched on the app's thread. Styles are in ``app.tcss``. The app never leaves focus in
a field: a run moves it to the results, Escape leaves a field, Enter in a field runs the A/B.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterable

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal
from textual.reactive import var
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Header, Input, TabbedContent
from textual.worker import Worker, WorkerState

from blockwidth.console.inputs import CLI_NAMES, CONSOLE_NAMES
from blockwidth.console.messages import AbDone, AbEvent, Deleted, PairReady, Resolved, ResolveFailed, Saved
from blockwidth.console.request import FieldError, SessionRequest, check_fits, literal_prompt, read_workload
from blockwidth.console.screens import AnswerScreen, ConfirmScreen, HelpScreen, PairScreen, SaveScreen
from blockwidth.console.state import BUDGET_S, DEFAULT_WIDTHS, Options, Phase, ResolutionView, SessionView
from blockwidth.console.widgets.ab import AbTab, Stage, running_rows, sequential_stage
from blockwidth.console.widgets.chain import ChainTab
from blockwidth.console.widgets.identity import IdentityTab, IdentityViews
from blockwidth.console.widgets.profile import ProfileTab
from blockwidth.console.widgets.records import RecordsTab
from blockwidth.console.widgets.top import ErrorLine, PairPanel, ResolutionPanel
from blockwidth.policy.errors import BlockwidthError, ExitCode
from blockwidth.policy.pace import minutes

# The load-time pilot's long prompt: at most this share of its short runs' time (a sweep's own
# pilot allows half, before minutes of runs; here the operator waits for it).
PILOT_LONG_SHARE = 0.15
# A running session's token ticks reach the screen at most this often (seconds): each redraw
# takes CPU from the decode it reports on. On the 2-core CPU (demo pair, @mixed, n 3, 32 tokens)
# classic decoded at a median 119-134 tok/s under ticks every 0.1 s, 173 at 0.5 s, 171 at 1 s,
# against 187 headless (a tryout read 118 in the console and 187 from sweep).
TICK_S = 0.5
# The error line's rows on a short screen (app.tcss: Screen.-short #error { max-height: 3 }).
ERROR_ROWS_SHORT = 3
from blockwidth.policy.profile import ProfileError
from blockwidth.policy.text import shown

# Kept importable from here: the CLI, the tests and the screenshot script name them so.
__all__ = ["AbEvent", "BUDGET_S", "DEFAULT_WIDTHS", "BlockwidthApp", "Options", "Phase",
           "run_app"]


class BlockwidthApp(App):
    TITLE = "blockwidth"
    SUB_TITLE = "draft block width for speculative decoding on MLX"
    AUTO_FOCUS = "#results"
    CSS_PATH = "app.tcss"
    # Textual sets one class of each list on the screen: under 100 columns one column and no
    # panel borders, from 170 the table and the plot side by side; under 30 lines no header,
    # from 40 (and 170 columns) the identity diff and the chain beside the results.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-normal-width"), (170, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-normal-height"), (40, "-tall")]
    BINDINGS = [
        Binding("a", "start_ab", "Run A/B", tooltip="run the A/B session with the fields above"),
        Binding("c", "cancel_ab", "Cancel", tooltip="stop the session after the current round"),
        Binding("s", "save", "Save"),
        Binding("d", "delete", "Delete"),  # "Delete entry" pushed "q Quit" off the Profile tab at 80 columns
        Binding("y", "copy_command", "Copy cmd"),
        Binding("Y", "copy_env", "Copy env var", key_display="Y", show=False),
        Binding("w", "edit_fields", "Edit fields", show=False),
        Binding("o", "open_pair", "Open pair", show=False),
        Binding("m", "export_markdown", "Markdown", show=False),
        Binding("p", "next_prompt", "Prompt preset", show=False),
        # not in the footer (at 80 columns it pushed "q Quit" off during a session): the headline
        # names it where it applies ("next: n ..."), and ? lists it
        Binding("n", "next_step", "Next step", show=False),
        Binding("r", "refresh", "Re-resolve", show=False),
        Binding("left_square_bracket", "pick_width(-1)", "Prev width", key_display="[", show=False),
        Binding("right_square_bracket", "pick_width(1)", "Next width", key_display="]", show=False),
        Binding("left_curly_bracket", "pick_request(-1)", "Prev request", key_display="{", show=False),
        Binding("right_curly_bracket", "pick_request(1)", "Next request", key_display="}", show=False),
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
        "save": "save the session's winner (or decline) to the profile: this pair only, or generic",
        "delete": "delete the highlighted profile entry (Profile tab; asks first)",
        "copy_command": "the answer: copy the mlx_lm.server command (or say why there is none), with "
                        "the width's source and whether it was measured",
        "open_pair": "open another pair (target and drafter: folders or cached repo ids)",
        "edit_fields": "go to the A/B fields (Tab moves between them, Escape leaves)",
        "copy_env": "copy the resolution as BLOCKWIDTH_DRAFT_BLOCK_SIZE=N (here and in the y dialog)",
        "export_markdown": "export the session (or the highlighted record) as Markdown",
        "next_prompt": "put the next prompt preset in the prompt field",
        "next_step": "after an undecided session: set the fields its next step names (on the results) "
                     "and run it",
        "refresh": "re-resolve the width (re-reads the profile and environment)",
        "pick_width(-1)": "Identity tab: the previous width",
        "pick_width(1)": "Identity tab: the next width",
        "pick_request(-1)": "Identity tab, after a workload: the previous request",
        "pick_request(1)": "Identity tab, after a workload: the next request",
        "tab('tab-ab')": "A/B tab", "tab('tab-identity')": "Identity tab", "tab('tab-chain')": "Chain tab",
        "tab('tab-profile')": "Profile tab", "tab('tab-records')": "Records tab",
        "leave_field": "leave a field (focus goes to the results)",
        "help": "this screen",
        "quit": "quit",
    }

    # The state the widgets draw (see ``console.state``); None: not there yet.
    resolution: var[ResolutionView | None] = var(None)
    session_state: var[SessionView | None] = var(None)
    phase: var[Phase] = var(Phase.LOADING)
    load_error: var[str | None] = var(None)  # why the pair did not load (the pair panel says it)

    def __init__(self, options: Options | None = None, *, load: bool = True) -> None:
        super().__init__()
        self.options = options or Options()
        self._load = load  # False: tests and screenshots feed the pair and sessions themselves
        self.pair: Any = None
        self._pilot_timer: Any = None  # the pilot's clock (a Textual Timer) while it runs
        self._refreshing = False  # r asked for a resolution: say what it came to
        self._cancel = threading.Event()
        self._selected_width: int | None = None
        self._selected_request: int | None = None  # a workload's request shown on the Identity tab
        self._identity: IdentityViews | None = None
        self._prompt_index = 0
        # Pair errors name the flags the console was started with, until the operator opens a
        # pair in the console's own fields.
        # How errors word the pair's inputs: as the flags it came from, or as the open-pair fields.
        self._names: Any = CLI_NAMES
        self.pace: Any = None  # policy.pace.Pace: the pilot's rates on this host (None: no pilot)
        self._clock: Any = None  # policy.pace.Clock: a running session's time left
        self._run_as_set: Any = None  # fields the operator chose to run despite the warning
        self._quitting = False  # q during a session: exit once its record is written

    # ---- the state, read as the parts it is made of
    @property
    def res(self) -> Any:
        return self.resolution.res if self.resolution is not None else None

    @property
    def paths(self) -> Any:
        return self.resolution.paths if self.resolution is not None else None

    @property
    def session(self) -> Any:
        return self.session_state.session if self.session_state is not None else None

    @property
    def request(self) -> SessionRequest | None:
        return self.session_state.request if self.session_state is not None else None

    @property
    def record_path(self) -> Path | None:
        return self.session_state.record_path if self.session_state is not None else None

    # ---- layout
    def compose(self) -> ComposeResult:
        from blockwidth.engine.demo.prompts import PRESETS

        app = BlockwidthApp
        yield Header()
        with Horizontal(id="top"):
            yield ResolutionPanel("resolving…", id="resolution", profile=self._profile_path()).data_bind(
                app.resolution, app.session_state)
            yield PairPanel("loading the pair…", id="pair").data_bind(app.resolution, app.load_error)
        yield ErrorLine("", id="error", classes="-empty")
        with TabbedContent(initial="tab-ab"):
            yield AbTab("1 A/B", id="tab-ab", prompt=PRESETS[0][1],
                        verify_attention=self.options.verify_attention).data_bind(
                app.resolution, app.session_state, app.phase)
            yield IdentityTab("2 Identity", id="tab-identity")
            yield ChainTab("3 Chain", id="tab-chain").data_bind(app.resolution)
            yield ProfileTab("4 Profile", id="tab-profile", path=self._profile_path()).data_bind(app.resolution)
            yield RecordsTab("5 Records", id="tab-records", record_dir=self._record_dir())
        yield Footer()

    def on_mount(self) -> None:
        self._show_phase(Phase.LOADING if self._load else Phase.READY)
        if self._load:
            self.resolve_in_background()
            self.load_pair()

    # ---- the status line and the bar
    def _show_phase(self, phase: Phase, detail: str = "", fraction: float | None = None) -> None:
        self.phase = phase
        self.query_one(Stage).show(phase, detail, fraction)
        self.query_one(AbTab).set_buttons(phase.busy, can_start=self.pair is not None,
                                          can_cancel=phase.busy and phase is not Phase.CANCELLING)
        self.refresh_bindings()

    def _words(self, err: BaseException) -> str:
        """An error as the console says it: a field by its label, the pair's inputs as the flags
        or the open-pair fields they came from, others as they are."""
        if isinstance(err, FieldError):
            return err.say(CONSOLE_NAMES)
        return err.say(self._names) if isinstance(err, BlockwidthError) else str(err)

    def _error(self, text: str, refusal: bool = False, field: str | None = None) -> None:
        """Show ``text`` on the error line (empty: clear it). ``refusal``: a key's "nothing to do"
        answer, which the next action that works takes away (_clear_refusal); other errors stay
        until what caused them is redone. Shown as one line: an error quotes paths and names from
        the operator's files, whose escape sequences must not reach the terminal. A toast repeats
        it only where the line cannot be read whole: under a dialog, or past the rows a short
        screen gives it (at 80x24 a refused ``s`` read twice, line and toast)."""
        text = shown(text)
        line = self.query_one(ErrorLine)
        line.show(text, refusal, field)
        if not text:
            return
        base = self.screen_stack[0] if self.screen_stack else None
        # as the line wraps it, at word boundaries (a count by characters alone said 3 rows where
        # the line took 4, and a tryout read a refusal cut mid-sentence with no toast)
        rows = len(Text(text).wrap(self.console, max(self.size.width - 2, 1)))  # padding: 1 a side
        cut = base is not None and base.has_class("-short") and rows > ERROR_ROWS_SHORT
        if self.screen is not base or cut:
            # markup=False: errors quote "[unquantized bfloat16]" and paths, not markup tags
            self.notify(text, severity="error", timeout=8, markup=False)

    def _clear_refusal(self) -> None:
        self.query_one(ErrorLine).clear_refusal()

    # ---- keys: focus, tabs, help, palette
    def push_screen(self, *args: Any, **kwargs: Any) -> Any:
        # A dialog opens over no toast: at 80x24 an error's toast covered the right half of the
        # y dialog (its export line) and of the open dialog; the error line keeps the error.
        self.clear_notifications()
        return super().push_screen(*args, **kwargs)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # the footer asks while the screen is torn down too (CI: NoMatches after the tabs went)
        tabs = self.query(TabbedContent) if self.is_mounted else ()
        tab = tabs.first().active if tabs else ""
        if action == "cancel_ab":
            return self.phase.busy and self.phase is not Phase.CANCELLING
        if action == "start_ab":
            return True if not self.phase.busy else None
        if action == "delete":
            return tab == "tab-profile"
        if action in ("pick_width", "pick_request"):
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
            self._read_records()
        self.refresh_bindings()

    def _read_records(self, only_shown: bool = False) -> None:
        """The Records tab for the pair open now; ``only_shown``: only if the tab is in view (a
        pair opened or closed while it is: it listed the old pair's sessions until left)."""
        if only_shown and self.query_one(TabbedContent).active != "tab-records":
            return
        self.query_one(RecordsTab).show_for(self.pair.pair_id if self.pair is not None else None,
                                            self.res.device.backend.value if self.res is not None else None)

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
        # Textual's own "Keys" (its key panel) is left out: the palette had two "Keys" entries,
        # and this console's key list is the help screen, listed below as "Help (?)".
        yield from (c for c in super().get_system_commands(screen) if c.title != "Keys")
        seen = set()
        for b in self.BINDINGS:
            if b.action in ("quit", "help") or b.action in seen:
                continue
            seen.add(b.action)
            # A tab's entry names its own key ("A/B tab (1)"), not the help screen's "1-5".
            key = b.key if b.action.startswith("tab(") else b.key_display or b.key
            yield SystemCommand(f"{b.description} ({key})", self.HELP.get(b.action, ""),
                                lambda action=b.action: self.run_action(action))
        yield SystemCommand("Help (?)", "every key the console answers", self.action_help)

    # ---- resolution (a worker: it probes the device and fingerprints checkpoints)
    @work(thread=True, exclusive=True, exit_on_error=False, group="resolve", name="resolve")
    def resolve_in_background(self) -> None:
        from blockwidth.console.inputs import resolution

        o = self.options
        try:
            res, paths, info = resolution(target=o.target, draft=o.draft, kind=o.kind, flag=o.flag,
                                          device=o.device, profile=o.profile, variant=o.variant,
                                          profile_missing_ok=True, download=False, names=self._names)
        except BlockwidthError as e:
            self.post_message(ResolveFailed(self._words(e)))
            return
        self.post_message(Resolved(res, paths, info))

    def on_resolve_failed(self, message: ResolveFailed) -> None:
        self._refreshing = False  # the error line says what it came to
        self.resolution = ResolutionView(None, error=message.error)
        self._error(message.error)

    def on_resolved(self, message: Resolved) -> None:
        self.set_resolution(message.res, message.paths, message.info)

    def set_resolution(self, res: Any, paths: Any, info: Any) -> None:
        failed = self.resolution is not None and self.resolution.error is not None
        before = self.resolution.res if self.resolution is not None else None
        self.resolution = ResolutionView(res, paths, info)
        if self._refreshing:
            self._refreshing = False
            width = "classic (a decline)" if res.decline else f"width {res.width}"
            same = "unchanged: " if before is not None and (before.width, before.source) == (res.width, res.source) else ""
            self.notify(f"re-resolved, {same}{width} from {res.source.value}", timeout=5, markup=False)
        if failed:  # that error is answered now; others (a failed load) stay
            self._error("")
        self._read_records(only_shown=True)  # the device is part of what the tab lists

    def _profile_path(self) -> Path:
        from blockwidth.policy import profile as profiles

        return Path(self.options.profile).expanduser() if self.options.profile else profiles.default_path()

    # ---- the pair (a worker)
    @work(thread=True, exclusive=True, exit_on_error=False, group="pair", name="load pair")
    def load_pair(self) -> None:
        from blockwidth.console.inputs import pair_paths
        from blockwidth.engine.pair import load_pair

        o = self.options
        # No download from inside the console (its progress would have nowhere to go).
        paths = pair_paths(o.target, o.draft, o.variant, o.kind, weights=True, download=False)
        pair = load_pair(paths.target, paths.drafter, o.kind)
        self.call_from_thread(self._pilot_clock)
        self.post_message(PairReady(pair, self._pilot(pair)))

    PILOT_SAYS = "pilot: timing a few tokens on this host"

    def _pilot_clock(self) -> None:
        """The pilot's words, with the seconds it has taken so far, each second while it runs (on
        SmolLM2 bf16 the 2-core CPU sat 40 s on the words alone, and a tryout took it for stuck)."""
        t0 = time.monotonic()
        self._show_phase(Phase.LOADING, self.PILOT_SAYS)
        if self._pilot_timer is not None:  # a pair opened while the last one's pilot ran: one clock
            self._pilot_timer.stop()

        def tick() -> None:
            if self.phase is not Phase.LOADING or self.pair is not None or self._pilot_timer is not timer:
                timer.stop()
                return
            self._show_phase(Phase.LOADING, f"{self.PILOT_SAYS} · {time.monotonic() - t0:.0f} s")

        self._pilot_timer = timer = self.set_interval(1.0, tick)

    def _pilot(self, pair: Any) -> Any:
        """A few tokens decoded, classic and at width 2 and the fields' widest, on the default
        workload's request of about its mean length, and classic on its longest: the rates every
        session's estimate is priced by (policy.pace).
        None where it cannot run (a context too short for that request): then no estimate."""
        from blockwidth.engine.pace import pilot
        from blockwidth.engine.workload import prepare
        from blockwidth.policy.workload import builtin

        try:
            prepared = prepare(builtin("mixed"), pair.tokenizer, 8)
            mean = sum(len(p.ids) for p in prepared) / len(prepared)
            ids = list(min(prepared, key=lambda p: abs(len(p.ids) - mean)).ids)
            ctx = pair.context_length
            if ctx is not None and len(ids) + 16 > ctx:
                ids = ids[-max(ctx - 16, 1):]
            # and classic on the longest request (its last 512 tokens): what context costs here
            longest = list(max(prepared, key=lambda p: len(p.ids)).ids)
            # and the widest width the fields ask for (a token costs more at a wider width)
            try:
                wide = self.call_from_thread(self._pilot_wide)  # the fields live on the app's thread
            except RuntimeError:  # not from a worker, or the app is closing: the pilot without it
                wide = None
            # (the operator waits for it: a long prompt only where it is cheap, as on the demo
            # pair; SmolLM2 bf16 on the 2-core CPU took the pilot from 31 s to 52 s)
            return pilot(pair, ids, 2, cancel=self._cancel.is_set, longest=longest, wide=wide,
                         long_share=PILOT_LONG_SHARE)
        except (BlockwidthError, ValueError, RuntimeError):  # MLX raises these: no estimate, the pair stays
            return None

    def _pilot_wide(self) -> int | None:
        """The widest fixed width the fields hold as the pair loads, with the width in effect
        (the defaults where they do not read)."""
        try:
            widths = self.query_one(AbTab).read_request().widths
        except Exception:  # noqa: BLE001 (a field that does not read: the defaults)
            widths = DEFAULT_WIDTHS
        fixed = [w for w in self._with_width_in_effect(tuple(widths))[0] if isinstance(w, int)]
        return max(fixed) if fixed else None

    def on_pair_ready(self, message: PairReady) -> None:
        self.pace = message.pace
        from textual.css.query import NoMatches

        try:
            self.set_pair(message.pair)
        except NoMatches:  # the pair came in as the app closed (its widgets gone): nothing to show
            self.pair = message.pair

    def set_pair(self, pair: Any) -> None:
        self.pair = pair
        self._read_records(only_shown=True)
        # The settings line says how to start ("press a"): the status carries the pair only, so it
        # fits 80 columns instead of ending in a cut-off copy of that hint.
        self._show_phase(Phase.READY, pair.describe())

    def action_open_pair(self) -> None:
        if self.phase.busy:
            self._error("a session is running: cancel it (c) before opening another pair")
            return
        o = self.options
        self.push_screen(PairScreen(o.target or "", o.draft or "", o.kind or ""), self._open_pair)

    def _reopen_pair(self, values: tuple[str, str, str], error: str, field: str | None = None) -> None:
        """A bad entry: the dialog again, with what was typed and why it was refused (the error
        line keeps it too, for after Escape), the field to fix marked and focused as the A/B
        fields are: marked, the cursor at its end, nothing selected."""
        self._error(error)
        self.push_screen(PairScreen(*values, error=error, bad=field), self._open_pair)

    def _open_pair(self, values: tuple[str, str, str] | None) -> None:
        if values is None:
            return
        from blockwidth.console.request import KINDS

        target, draft, kind = values
        if kind and kind not in KINDS:
            self._reopen_pair(values, f"kind {kind!r}: one of {', '.join(KINDS)}", "kind")
            return
        from blockwidth.console.inputs import pair_paths

        from blockwidth.engine.pair import check_folder

        try:
            # Folder checks only (no model load): a wrong path must not cost the loaded pair.
            # The folders get the checks the load makes before any loader sees them (config.json,
            # sizes, weights headers): a folder that is not a checkpoint (a tryout typed docs/)
            # unloaded the working pair and said so twice.
            paths = pair_paths(target or None, draft or None, None if target else self.options.variant,
                               kind or None, weights=True, download=False)
            if not paths.demo:
                for path, what in ((paths.target, "target"), (paths.drafter, "draft")):
                    if path is not None:
                        check_folder(path, what)
        except BlockwidthError as e:
            self._reopen_pair(values, f"{e.say(CONSOLE_NAMES)} — still on "
                                      f"{self.pair.describe() if self.pair else 'the previous pair'}",
                              e.input_name)
            return
        # a demo target is the demo pair's: a pair opened from folders has none
        self.options = replace(self.options, target=target or None, draft=draft or None, kind=kind or None,
                               variant=None if target else self.options.variant)
        self._names = CONSOLE_NAMES
        self.pair = self.resolution = self.session_state = self.load_error = None
        self._read_records(only_shown=True)
        self._error("")
        self._show_phase(Phase.LOADING, target or "the demo pair")
        self.resolve_in_background()
        self.load_pair()

    # ---- the A/B fields
    @on(Input.Submitted, "#controls Input, #prompt-row Input")
    def _submitted(self) -> None:
        self.action_start_ab()

    def action_next_step(self) -> None:
        """Run the one step the shown undecided session names (console.outcome.next_step): its
        fields set as the operator would type them, then a (which may warn first)."""
        from blockwidth.console.outcome import next_step

        s = self.session
        if self.phase.busy:
            self._error("a session is running: c cancels it", refusal=True)
            return
        step = next_step(s) if s is not None and not self.query_one(AbTab).stale else None
        if step is None:
            self._error("no next step: n runs the step an undecided or drifted session names, and the one shown "
                        "has none" if s is not None else "no next step: run an A/B session first (a)",
                        refusal=True)
            return
        self._clear_refusal()
        tab = self.query_one(AbTab)
        for name, value in step.fields:
            if name == "prompt" and step.requests:
                try:
                    value = "@" + str(self._write_requests(step.requests))
                except OSError as e:
                    self._error(f"not run: the next step's workload cannot be written in "
                                f"{self._record_dir()} ({e.strerror or e})")
                    return
            tab.set_field(name, value)
        says = step.says
        # the step's fields can still fall short of the repetitions a win needs at the pilot's
        # pace (longer runs, fewer requests): n raises the budget to them itself, as the warning's
        # first choice would (a tryout's n met that warning again, one key after choosing from it)
        raised = self._budget_for_a_win(tab)
        if raised is not None:
            says += f", secs {raised[0]} and reps {raised[1]} (what a win needs at the pilot's pace)"
        self.notify(f"next step: {says}", timeout=6, markup=False)
        self.action_start_ab()

    def _budget_for_a_win(self, tab: AbTab) -> tuple[int, int] | None:
        """Raise the fields' sequential budget to what the pilot says a win needs, and the
        seconds to what their n repetitions take, where they fall short (the two cases _warn
        asks about): (secs, reps) set, or None (they reach it, or no pilot, or fields that do
        not read: action_start_ab says why)."""
        try:
            req = tab.read_request()
        except FieldError:
            return None
        plan = self.plan_for(req)
        if plan is None:
            return None
        secs, reps = (int(req.max_seconds), req.max_reps) if plan.can_decide else self._win_budget(req, plan)
        if req.sequential and plan.first_s > 2 * secs:  # the warning's other case: n alone runs past it
            secs = math.ceil(plan.first_s)
        if (secs, reps) == (int(req.max_seconds), req.max_reps):
            return None
        self._set_budget(tab, secs, reps)
        return secs, reps

    @staticmethod
    def _win_budget(req: SessionRequest, plan: Any) -> tuple[int, int]:
        """(secs, reps): the fields' sequential budget raised to what ``plan`` says a win needs."""
        return max(plan.seconds_for_need(), int(req.max_seconds)), max(req.max_reps, plan.need)

    @staticmethod
    def _set_budget(tab: AbTab, secs: int, reps: int) -> None:
        tab.set_field("secs", str(secs))
        tab.set_field("reps", str(reps))
        tab.set_field("sequential", True)

    def _write_requests(self, requests: Any) -> Path:
        """A part of a workload as a JSONL file beside the records (the prompt field names it,
        and the session's record names it as its source)."""
        import json

        from blockwidth.console.atomic import create

        from blockwidth.engine.workload import file_item

        tokenizer = self.pair.tokenizer if self.pair is not None else None
        lines = [json.dumps(file_item(r, tokenizer), ensure_ascii=False) for r in requests]
        where = self._record_dir()
        where.mkdir(parents=True, exist_ok=True)
        stem = f"next-{time.strftime('%Y%m%dT%H%M%S')}-{len(lines)}"
        return create(where, [f"{stem}.jsonl", *(f"{stem}-{i}.jsonl" for i in range(2, 100))],
                      "\n".join(lines) + "\n", prefix="next")

    def action_next_prompt(self) -> None:
        from blockwidth.engine.demo.prompts import PRESETS

        self._prompt_index = (self._prompt_index + 1) % len(PRESETS)
        name, text = PRESETS[self._prompt_index]
        self.query_one(AbTab).set_prompt(text)
        # the last preset's toast goes (p pressed four times stacked four over the screen at 80
        # columns); the error line keeps any error
        self.clear_notifications()
        self.notify(f"prompt preset: {name}", timeout=4)

    # ---- the pilot's estimate
    def _shape_for(self, req: SessionRequest, workload: Any = None, widths: Any = None) -> Any:
        """A session of ``req`` as the pilot prices it (policy.pace.Shape) and its requests' ids,
        or None (no pair, or fields that do not read)."""
        from blockwidth.policy import pace

        if self.pair is None:
            return None
        try:
            if req.workload is not None:
                from blockwidth.engine.workload import prepare

                w = workload if workload is not None else read_workload(req, self.pair)
                prepared = prepare(w, self.pair.tokenizer, req.tokens)
                shape_reqs = tuple((len(p.ids), p.max_tokens) for p in prepared)
                ids = tuple(p.id for p in prepared)
            else:
                shape_reqs = ((len(self.pair.encode(literal_prompt(req.prompt))), req.tokens),)
                ids = ()
        except BlockwidthError:
            return None
        arms = tuple(dict.fromkeys(widths if widths is not None else self._with_width_in_effect(req.widths)[0]))
        return pace.Shape(shape_reqs, len(arms), req.n, req.sequential, req.max_reps, req.max_seconds, arms), ids

    def plan_for(self, req: SessionRequest, workload: Any = None, widths: Any = None) -> Any:
        """What a session of ``req`` can do here, priced by the pilot (policy.pace.Plan), or None
        (no pilot, no pair, or fields that do not read)."""
        from blockwidth.policy import pace

        got = self._shape_for(req, workload, widths) if self.pace is not None else None
        return pace.plan(self.pace, got[0]) if got is not None else None

    def estimate_words(self, req: SessionRequest) -> str | None:
        """The settings line's estimate for these fields (None: no pilot)."""
        from blockwidth.policy.pace import minutes

        plan = self.plan_for(req)
        if plan is None:
            return None
        said = f"about {minutes(plan.first_s)} for its n {req.n} at the pilot's pace (the host's load moves it)"
        if req.sequential and req.max_seconds > plan.first_s:
            said += f", up to {minutes(req.max_seconds)} as sequential adds repetitions"
        if not plan.can_decide:
            said += f"; a win needs {plan.need} repetitions, which these fields do not reach"
        return said

    def _with_width_in_effect(self, widths: tuple) -> tuple[tuple, Any]:
        w = self.res.engine_width if self.res is not None else None
        if w is not None and w not in widths:
            return (*widths, w), w
        return widths, None

    # ---- A/B
    def action_start_ab(self) -> None:
        if self.phase.busy:
            return
        if self.pair is None:
            self._error("the pair is not loaded yet (or failed to load): nothing to run", refusal=True)
            return
        tab = self.query_one(AbTab)
        workload = None
        try:
            req = tab.read_request()
            if req.workload is not None:
                workload = read_workload(req, self.pair)
            else:
                # Pair.encode: each id checked against the pair's embedding tables (a ShapeError)
                check_fits(req, len(self.pair.encode(literal_prompt(req.prompt))),
                           self.pair.context_length)
        except FieldError as e:
            # Mark the field to fix; focus stays where the operator left it (w goes to the fields).
            # Editing it takes the error line away (ErrorLine.clear_field).
            self._error(self._words(e), field=tab.mark_bad(e.field.value))
            return
        except BlockwidthError as e:  # a ShapeError too: an id the pair's tables have no row for
            self._error(self._words(e))
            return
        self._error("")
        widths, added = self._with_width_in_effect(req.widths)
        plan = self.plan_for(req, workload, widths)
        if plan is not None and self._run_as_set != req and self._warn(req, plan):
            return  # the warning asks first; its choice runs (or not)
        from blockwidth.console import session as recorded_session

        config = recorded_session.config(req, widths=widths, prompt=literal_prompt(req.prompt),
                                         verify_attention=self.options.verify_attention, workload=workload)
        self.begin(req, config.planned_runs, added, workload, widths)
        self._cancel = threading.Event()
        self.run_ab(config)

    def _warn(self, req: SessionRequest, plan: Any) -> bool:
        """Before a session that cannot reach the repetitions a win needs within its fields, or
        whose n repetitions alone take more than twice its seconds budget: the pilot's figures
        and a choice (FirstSessionScreen). True: the screen asks, nothing runs yet."""
        from blockwidth.console.screens import FirstSessionScreen
        from blockwidth.engine.demo.prompts import PRESETS
        from blockwidth.policy.pace import minutes

        over = req.sequential and plan.first_s > 2 * req.max_seconds
        if plan.can_decide and not over:
            return False
        if not plan.can_decide:
            why = (f"these fields run {plan.reached} repetition{'' if plan.reached == 1 else 's'} "
                   f"(about {minutes(plan.first_s)} here); a win needs {plan.need} (its p below "
                   f"{self._alpha()}), about {minutes(plan.need_s)}")
        else:
            why = (f"its n {req.n} repetitions take about {minutes(plan.first_s)} here, past twice its "
                   f"{req.max_seconds:g} s budget")
        raise_ = None if plan.can_decide else self._win_budget(req, plan)
        one = next((name for name, text in PRESETS if not text.startswith("@")), None)
        single = alt = None
        if req.workload is not None and one is not None:
            text = next(t for name, t in PRESETS if name == one)
            alt = self.plan_for(replace(req, prompt=text))
            single = (one, minutes(alt.need_s) if alt is not None else "?")

        def chose(choice: str | None) -> None:
            tab = self.query_one(AbTab)
            if choice == "raise" and raise_ is not None:
                self._set_budget(tab, *raise_)
            elif choice == "single" and single is not None:
                self._prompt_index = next(i for i, (name, _) in enumerate(PRESETS) if name == one)
                tab.set_prompt(PRESETS[self._prompt_index][1])
                if alt is not None and not alt.can_decide:  # the prompt alone, with what a win needs
                    self._set_budget(tab, *self._win_budget(req, alt))
            elif choice == "as set":
                self._run_as_set = req
            else:
                self.notify("not run: the fields are as they were", timeout=4)
                return
            self.action_start_ab()

        self.push_screen(FirstSessionScreen(why, self.pace.describe(), raise_, single, plan.can_decide,
                                            sequential=req.sequential), chose)
        return True

    @staticmethod
    def _alpha() -> str:
        from blockwidth.policy.stats import ALPHA

        return f"{ALPHA:g}"

    def begin(self, req: SessionRequest, planned: int, added_width: int | None = None,
              workload: Any = None, widths: Any = None) -> None:
        """Clear the last results and show a session starting (the worker's events follow)."""
        from blockwidth.policy import pace

        got = self._shape_for(req, workload, widths)
        # the time left, from the session's own runs as they finish (the pilot prices each)
        self._clock = pace.Clock(self.pace, *got) if got is not None else None
        self._focus_results()  # before the buttons change: focus must not fall into a field
        self.query_one(AbTab).show_running([], 0)  # the last session's figures so far go
        self.session_state = SessionView(req, planned=planned, added_width=added_width,
                                         estimate=self.estimate_words(req))
        self._show_phase(Phase.WARMUP, f"stage 1/3 · run 0/{planned}", 0.0)

    @work(thread=True, exclusive=True, exit_on_error=False, group="ab", name="A/B session")
    def run_ab(self, config: Any) -> None:
        from blockwidth.console import records, session as recorded_session
        from blockwidth.engine.session import host

        gate = host.gate()
        last = [0.0]
        res = self.res
        width_in_effect = res.engine_width if res is not None else None

        def post(e: Any) -> None:
            # Token ticks at most every TICK_S: at one a token they queued faster than a busy
            # 2-core host drew them, and a c waited behind them (a pilot's wait timed out).
            if e.kind == "progress" and e.tokens < e.total:
                now = time.monotonic()
                if now - last[0] < TICK_S:
                    return
                last[0] = now
            rows = None
            if e.kind == "rep" and e.session is not None:  # the table so far, drawn here
                try:
                    rows = running_rows(e.session, width_in_effect)
                except Exception:  # noqa: BLE001 (a picture of the way there must never cost the session)
                    rows = None
            self.post_message(AbEvent(e, rows))

        where = Path(self.options.record_dir) if self.options.record_dir else None
        done = recorded_session.run(self.pair, config, record_dir=where, gate=gate, on_event=post,
                                    cancel=self._cancel)
        error, e = None, done.write_error
        if e is not None:  # a full disk must not cost the session: it is shown, said unkept
            error = (f"record directory {where or records.default_dir()}: the record cannot be "
                     f"written ({e.strerror or e}); the results are shown but not kept, and "
                     f"cannot be saved")
        self.post_message(AbDone(done.session, done.record_path, list(gate.warnings), error))

    def on_ab_event(self, message: AbEvent) -> None:
        e = message.event
        if self.phase is Phase.CANCELLING or not self.phase.busy:
            return  # the stage text stays "cancelling" until the worker returns
        if message.rows is not None:
            self.query_one(AbTab).show_running(message.rows, e.rep)
        if e.kind in ("arm", "progress"):
            where = "closing classic" if e.closing else f"{e.arm} warm-up" if e.rep == 0 else f"{e.arm} rep {e.rep}"
            if e.request:  # a workload's request
                where = f"{e.request} {where}"
            phase = Phase.WARMUP if e.rep == 0 and not e.closing else Phase.RUNS
            tokens = f" · {e.tokens}/{e.total} tokens" if e.kind == "progress" else ""
            req = self.request
            state = self.session_state
            if e.kind == "arm" and e.run == 0 and state is not None and e.runs > state.planned:
                # the engine's count: on CUDA's exact path stock classic runs beside exact
                # classic, an arm the console's config could not know of before the plan
                self.session_state = state = replace(state, planned=e.runs)
            self._follow(e)
            if req is not None and req.sequential:
                planned = (state.planned if state is not None else 0) or e.runs
                detail, fraction = sequential_stage(e, req, planned)
                # the n repetitions' runs alone: the probe and curve after them are not "n"
                left = self._left(e, after=False)
                if left is not None and e.run < planned:  # the n repetitions always run in full
                    # next to the run count: at 80 columns the line's end is cut (a tryout never
                    # saw the time left when it followed the budget)
                    detail = detail.replace(" · ", f" · n {req.n} in about {minutes(left)} · ", 1)
                self._show_phase(phase, f"stage 1/3 · {detail} · {where}{tokens}", fraction)
            else:
                left = self._left(e)
                left_words = f" · about {minutes(left)} left" if left is not None else ""
                self._show_phase(phase, f"stage 1/3 · run {e.run + 1}/{e.runs}{left_words} · {where}{tokens}",
                                 e.fraction)
        elif e.kind == "phase" and e.phase == "divergence":
            # where a width's output first differs: a probe and two decodes, one per width and request
            self._show_phase(Phase.EXACTNESS, f"stage 2/3 · divergence margin of {e.arm}")
        elif e.kind == "phase":
            phase = Phase.EXACTNESS if e.phase == "exactness" else Phase.COSTCURVE
            what = f"{e.arm} " if e.arm else ""
            unit = "widths" if phase is Phase.EXACTNESS else "forwards"
            stage = 2 if phase is Phase.EXACTNESS else 3
            self._show_phase(phase, f"stage {stage}/3 · {what}{e.run}/{e.runs} {unit} done", e.run / max(e.runs, 1))

    def _follow(self, e: Any) -> None:
        """The clock follows each run's start (a help, not the session: no time left said if it fails)."""
        if self._clock is not None and e.kind == "arm":
            try:
                self._clock.started(e.run, e.elapsed, e.request, e.arm)
            except Exception:  # noqa: BLE001
                pass

    def _left(self, e: Any, after: bool = True) -> float | None:
        """Seconds left to the end of the runs planned (and, ``after``, what follows them), from
        the runs measured so far; None before one has finished or without a clock."""
        clock = self._clock
        if clock is None:
            return None
        state = self.session_state
        runs = state.planned if state is not None and state.planned and self.request is not None \
            and self.request.sequential else e.runs
        try:
            return clock.left_s(runs, e.elapsed, after)
        except Exception:  # noqa: BLE001 (a help, not the session: no time left said)
            return None

    def on_ab_done(self, message: AbDone) -> None:
        if self._quitting:  # q during the session: its record is written, nothing more to show
            self.exit()
            return
        self.show_session(message.session, message.record_path, message.gate_warnings)
        if message.error:  # after the results, which stay on screen
            self._error(message.error)

    def show_session(self, session: Any, record_path: Path | None, gate_warnings: list[str],
                     request: SessionRequest | None = None) -> None:
        """The results of a finished (or cancelled) session."""
        shown = self.session_state
        planned = shown.planned if shown is not None else 0
        s = session
        # every request's runs (a workload's own arms hold only its finished passes)
        runs = sum(len(a.runs) for r in s.per_request for a in [r.classic, *r.arms]) + len(s.warmup)
        if s.cancelled:
            planned = planned or s.config.planned_runs
            of = f" of {planned}" if runs <= planned else ""  # sequential may have added runs past it
            self._show_phase(Phase.CANCELLED, f"after {runs}{of} runs, warm-ups included")
        else:
            reps = f"{s.reps} repetition" + ("" if s.reps == 1 else "s")
            self._show_phase(Phase.DONE, f"{runs} runs, {reps}, {s.elapsed_s:.0f} s")
        self.session_state = SessionView(
            request if request is not None else shown.request if shown is not None else None, session,
            record_path, tuple(gate_warnings), planned, shown.added_width if shown is not None else None)
        pick = s.recommendation or next((a.width for a in s.arms if a.runs), None)
        if pick is not None:
            self.show_identity(pick)

    def session_failed(self, err: BaseException) -> None:
        what = str(err) if isinstance(err, BlockwidthError) else f"{type(err).__name__}: {err}"
        self._error(f"the A/B session failed: {what}")
        self._show_phase(Phase.FAILED, f"{what}; nothing was measured or saved")
        if self.session_state is not None:
            self.session_state = replace(self.session_state, error=what)

    # ---- identity
    def show_identity(self, width: int, request: int | None = None) -> None:
        """``width``'s diff against classic on a request: ``request`` (an index), else the one
        shown if the width stays, else its first request whose output differs."""
        s = self.session
        if s is None or self.pair is None:
            return
        if self._identity is None or self._identity.session is not s:
            self._identity = IdentityViews(s, self.pair.tokenizer)
            self._selected_request = None
        if request is None:
            here = self._selected_request if self._selected_request is not None else 0
            # the same width keeps its request; another goes to its first differing request, or
            # stays on this one (] reset the request to 1 of 16 when nothing differed)
            request = here if width == self._selected_width else self._identity.first_request(width, here)
        view = self._identity.get(width, request)
        if view is None and request:
            request = self._identity.first_request(width)
            view = self._identity.get(width, request)
        if view is None:
            return
        self._selected_width, self._selected_request = width, request
        self.query_one(IdentityTab).show(view)
        self.query_one(AbTab).show_identity(view.side)

    def action_pick_request(self, step: int) -> None:
        if self.session is None or self._identity is None or self._selected_width is None:
            return
        n = self._identity.requests
        start = self._selected_request or 0
        for k in range(1, n + 1):  # the next request that ran on this width (a cancel may leave gaps)
            i = (start + step * k) % n
            if self._identity.get(self._selected_width, i) is not None:
                self.show_identity(self._selected_width, i)
                return

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
        if self.query_one(AbTab).stale:
            self._error("not saved: the fields changed since this run; run it again (a) first", refusal=True)
            return
        if self.record_path is None:
            self._error("not saved: this session's record could not be written, and a profile entry "
                        "names its record; run it again once the record directory can be written",
                        refusal=True)
            return
        from blockwidth.console.outcome import headline

        s = self.session
        h = headline(s)
        if not h.saveable:  # the refusal, worded for the console, comes from the save itself
            self.save_in_background(s, self.record_path, False)
            return
        what = f"width {s.recommendation}" if s.recommendation is not None else "the decline (classic)"
        pair = self.pair.describe() if self.pair is not None else "the loaded pair"
        res = self.res
        generic = (f"any {self.pair.kind.value} pair on {res.device.backend.value} with "
                   f"{self.pair.quantization.describe()} targets" if self.pair is not None and res is not None
                   else "any pair of this kind, device and quantization")

        def scoped(scope: str | None) -> None:
            if scope is None:
                self.notify("not saved", timeout=3)
                return
            self.save_in_background(s, self.record_path, scope == "pair")

        self.push_screen(SaveScreen(what, pair, generic), scoped)

    @work(thread=True, exclusive=True, exit_on_error=False, group="save", name="save")
    def save_in_background(self, session: Any, record_path: Path | None, pair_specific: bool = False) -> None:
        """The device probe and the locked profile write stay off the UI thread."""
        from blockwidth.console.outcome import Front
        from blockwidth.console.save import save_session

        try:
            saved, refusal = save_session(session, self.pair, record_path, self.options.profile,
                                          front=Front.CONSOLE, pair_specific=pair_specific)
        except ProfileError as e:
            saved, refusal = None, str(e)
        self.post_message(Saved(saved, refusal, session))

    def on_saved(self, message: Saved) -> None:
        if message.refusal:
            self._error(f"not saved: {message.refusal}")
            return
        self._error("")
        self.notify(f"saved {shown(message.saved)}", timeout=6, markup=False)
        if self.session_state is not None and self.session_state.session is message.session:
            self.session_state = replace(self.session_state, saved=message.saved)
        self.resolve_in_background()  # the saved width is the one in effect now: the screen follows

    def action_delete(self) -> None:
        tab = self.query_one(ProfileTab)
        entry = tab.highlighted()
        if entry is None:
            # an unreadable profile lists no entry too, and is not empty (a tryout was told so)
            self._error(f"no profile entry to delete: the profile does not read ({tab.unreadable}); "
                        "fix it by hand, then r reads it again" if tab.unreadable
                        else "no profile entry to delete: the profile is empty", refusal=True)
            return

        def answer(yes: bool | None) -> None:
            if yes:
                self._delete(entry)
            else:
                self.notify("kept the entry", timeout=3)

        self.push_screen(ConfirmScreen(f"Delete the profile entry\n  {entry.describe_keys()}"
                                       f" -> {'decline' if entry.decline else entry.width}\n"
                                       f"from {self._profile_path()}?"), answer)

    def _delete(self, entry: Any) -> None:
        self.delete_in_background(entry)

    @work(thread=True, exit_on_error=False, group="delete", name="delete")
    def delete_in_background(self, entry: Any) -> None:
        """The profile's lock (up to its wait) and the write stay off the UI thread."""
        from blockwidth.console import profile_file

        try:
            profile_file.delete(self._profile_path(), entry)
        except ProfileError as e:
            self.post_message(Deleted(entry, str(e)))
            return
        self.post_message(Deleted(entry))

    def on_deleted(self, message: Deleted) -> None:
        if message.error:
            self._error(message.error)
            return
        self.notify(f"deleted {message.entry.describe_keys()}", timeout=6, markup=False)
        self.resolve_in_background()

    def action_refresh(self) -> None:
        self.notify("re-resolving: reading the profile and environment again", timeout=3)
        self._refreshing = True  # the answer is said when it comes (a tryout saw no sign of r)
        self.resolve_in_background()

    # ---- use the answer
    def answer(self) -> Any:
        """The answer (console.answer) for what is on screen: the resolution, the pair's load,
        and the shown session's word on the width in effect."""
        from blockwidth.console.answer import answer
        from blockwidth.console.widgets.top import in_effect

        view = self.resolution
        note = in_effect(self.session_state, view)
        return answer(self.res, self.paths, load_error=self.load_error,
                      resolve_error=view.error if view is not None else None,
                      session=note[0] if note else None, session_decline=self._session_decline())

    def _session_decline(self) -> str | None:
        """Whether the session on screen (current, finished) measured every width it ran slower
        than classic or short of the minimum gain, and what became of that: s saves it as a
        decline, or it is not saveable (why). None otherwise (once saved, the resolution is the
        decline and the answer says so itself)."""
        from blockwidth.console.outcome import DRIFT_OR_NOISE
        from blockwidth.engine.ab import Verdict
        from blockwidth.policy.verdict import RefusalKind, refusal

        s = self.session
        if s is None or s.cancelled or self.query_one(AbTab).stale or s.recommendation is not None:
            return None
        ran = [a for a in s.arms if a.runs]
        if not ran or not all(a.verdict in (Verdict.SLOWER, Verdict.NO_GAIN) for a in ran):
            return None
        if s.saveable:
            return "a decline: s saves it"
        why = refusal(cancelled=s.cancelled, drifted=s.drift, recommendation=s.recommendation,
                      verdicts=[a.verdict for a in s.arms])  # not None: the session is not saveable
        if why is RefusalKind.DRIFT:  # as the headline words it
            return DRIFT_OR_NOISE if s.drift_could_be_noise else "not saveable: classic drifted"
        return f"not saveable: {why.value}"

    def action_copy_command(self) -> None:
        said = self.answer()
        self._clear_refusal()
        copy = said.session_command or said.command  # what this machine just measured first
        if copy is not None:
            self.copy_to_clipboard(copy)
        self.push_screen(AnswerScreen(said, copied=copy is not None))

    def action_copy_env(self) -> None:
        said = self.answer()
        if said.env is None:
            why = said.refusal if said.width is None and not said.decline else "a decline decodes classically"
            self._error(f"no width to copy: {why}", refusal=True)
            return
        self._clear_refusal()
        self.copy_to_clipboard(f"export {said.env}")
        self.notify(f"copied: export {said.env}", timeout=5, markup=False)

    # ---- records
    def _record_dir(self) -> Path:
        from blockwidth.console import records

        return Path(self.options.record_dir).expanduser() if self.options.record_dir else records.default_dir()

    def action_export_markdown(self) -> None:
        if self.query_one(TabbedContent).active == "tab-records":
            path = self.query_one(RecordsTab).highlighted()
            if path is None:
                self._error("no record highlighted", refusal=True)
                return
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
        from blockwidth.console.outputs import OutputError, write_output
        from blockwidth.engine.session import record

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
        """The one place a worker's failure is said (every worker, the tabs' too, bubbles here)."""
        if event.state is not WorkerState.ERROR:
            return
        err = event.worker.error
        group = event.worker.group
        if group == "pair":
            # Said once, in the pair panel (the error line and a toast each repeated it, and the
            # status line cut it off at 80 columns); the status line points there.
            self.load_error = self._words(err)
            self._show_phase(Phase.LOAD_FAILED, "why: above; o opens another pair")
        elif group == "ab":
            self.session_failed(err)
            if self._quitting:
                self.exit()
        else:
            self._error(f"{event.worker.name} failed: {self._words(err)}")

    async def action_quit(self) -> None:
        """Quit; during a session, first stop it after the run in flight and write its record (a
        measured result is never lost), saying so on screen; q again quits at once."""
        if not self.phase.busy or self._quitting:
            self.exit()
            return
        self._quitting = True
        self._cancel.set()
        self._show_phase(Phase.CANCELLING, "quitting after the run in flight, once its record is written; "
                                           "q again quits now")

    def on_unmount(self) -> None:
        self._cancel.set()  # a session stops at its next round instead of keeping the process alive
        self.workers.cancel_all()


def run_app(options: Options) -> int:
    import asyncio

    from blockwidth.console.inputs import note_mlx_thread

    note_mlx_thread()  # sessions run in workers: the exit must skip MLX's teardown (cli.entry)
    # A loop of its own, not asyncio.run's: that one's exit joins the worker threads, so a q
    # during a session left a blank terminal (the app gone) until the run in flight ended, 6-9 s.
    # The app waits for the session itself, on screen (action_quit); entry() leaves by os._exit.
    BlockwidthApp(options).run(loop=asyncio.new_event_loop())
    return ExitCode.OK
