"""The Textual console: the pair and device, the resolved width with its chain,
live A/B sessions with progress, table and plot, the identity diff, and the profile.

Slow work (loading the pair, A/B sessions) runs in thread workers that post
messages; the widgets are only touched on the app's thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.widgets import (Button, DataTable, Footer, Header, Input, Label, ProgressBar, Static,
                             TabbedContent, TabPane)
from textual.worker import Worker, WorkerState

from console.inputs import InputError, chain_lines, resolution
from console.render import arm_rows, bars
from policy.profile import ProfileError
from policy.resolve import WidthError, keyed_on


@dataclass
class Options:
    target: str | None = None
    draft: str | None = None
    kind: str | None = None
    flag: str | None = None
    device: str | None = None
    profile: str | None = None
    variant: str = "bf16"
    record_dir: str | None = None


class PairReady(Message):
    def __init__(self, pair: Any) -> None:
        super().__init__()
        self.pair = pair


class AbEvent(Message):
    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event

    def can_replace(self, message: Message) -> bool:
        # Progress ticks coalesce; the arm/rep/done events must all arrive.
        return (isinstance(message, AbEvent) and message.event.kind == "progress"
                and self.event.kind == "progress")


class AbDone(Message):
    def __init__(self, session: Any, record_path: Path) -> None:
        super().__init__()
        self.session = session
        self.record_path = record_path


class BlockwidthApp(App):
    TITLE = "blockwidth"
    SUB_TITLE = "draft block width for speculative decoding on MLX"
    CSS = """
    #top { height: auto; }
    #pair, #resolution { width: 1fr; height: auto; border: round $primary; padding: 0 1; }
    #controls { height: auto; }
    #controls Input { width: 16; }
    #controls Label { padding: 1 0 0 1; }
    #progress { margin: 0 1; }
    #status, #decision, #error { padding: 0 1; }
    #error { color: $error; }
    #arms { height: auto; max-height: 12; }
    #plot { padding: 0 1; height: auto; }
    .diffcol { width: 1fr; border: round $secondary; padding: 0 1; }
    #profile-table { height: auto; max-height: 16; }
    """
    BINDINGS = [
        Binding("a", "start_ab", "Run A/B"),
        Binding("c", "cancel_ab", "Cancel"),
        Binding("s", "save", "Save winner"),
        Binding("d", "delete", "Delete entry"),
        Binding("r", "refresh", "Re-resolve"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, options: Options | None = None) -> None:
        super().__init__()
        self.options = options or Options()
        self.pair: Any = None
        self.session: Any = None
        self.record_path: Path | None = None
        self._cancel = threading.Event()
        self._selected_width: int | None = None

    # ---- layout
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="top"):
            yield Static("loading the pair…", id="pair")
            yield Static("resolving…", id="resolution")
        yield Static("", id="error")
        with TabbedContent(initial="tab-ab"):
            with TabPane("A/B", id="tab-ab"):
                with Horizontal(id="controls"):
                    yield Label("widths")
                    yield Input("2,4,8", id="widths")
                    yield Label("n")
                    yield Input("3", id="n")
                    yield Label("tokens")
                    yield Input("64", id="tokens")
                    yield Button("Run A/B (a)", id="start", variant="primary")
                    yield Button("Cancel (c)", id="cancel", disabled=True)
                yield ProgressBar(id="progress", show_eta=False)
                yield Static("", id="status")
                yield DataTable(id="arms", cursor_type="row", zebra_stripes=True)
                yield Static("", id="plot")
                yield Static("", id="decision")
            with TabPane("Identity", id="tab-identity"):
                yield Static("run an A/B session; pick a width row to compare its output", id="identity-head")
                with Horizontal():
                    with VerticalScroll(classes="diffcol"):
                        yield Static("", id="classic-text")
                    with VerticalScroll(classes="diffcol"):
                        yield Static("", id="width-text")
            with TabPane("Chain", id="tab-chain"):
                yield Static("", id="chain")
            with TabPane("Profile", id="tab-profile"):
                yield Static("", id="profile-path")
                yield DataTable(id="profile-table", cursor_type="row")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#arms", DataTable)
        table.add_columns("arm", "decode min", "median", "max", "e2e median", "accept", "identity", "verdict")
        ptable = self.query_one("#profile-table", DataTable)
        ptable.add_columns("backend", "cc", "target", "kind", "width", "mlx", "measured", "identical", "pair")
        self.refresh_resolution()
        self.load_pair()

    # ---- resolution and profile (fast; on the app thread)
    def _error(self, text: str) -> None:
        self.query_one("#error", Static).update(Text(text))
        if text:
            self.notify(text, severity="error", timeout=8)

    def refresh_resolution(self) -> None:
        o = self.options
        try:
            res, paths, info = resolution(target=o.target, draft=o.draft, kind=o.kind, flag=o.flag,
                                          device=o.device, profile=o.profile, variant=o.variant,
                                          profile_missing_ok=True)
        except (InputError, WidthError, ProfileError) as e:
            self.query_one("#resolution", Static).update(Text("no resolution", style="bold red"))
            self._error(str(e))
            return
        self._error("")
        width = str(res.width) if res.width is not None else "classic"
        head = Text.assemble(("width ", "bold"), (width, "bold green"), f" · source {res.source.value}",
                             (" · STALE" if res.stale else "", "yellow"))
        self.query_one("#resolution", Static).update(Text.assemble(
            head, "\n", res.reason, "\n", f"keyed on {keyed_on(res.device, res.quantization)} "
            f"({res.quantization.detail})"))
        pair_text = Text.assemble(
            ("target  ", "bold"), f"{paths.target}\n", ("drafter ", "bold"),
            f"{paths.drafter or '(prompt lookup)'}  [{info.kind.value}]\n", ("device  ", "bold"),
            res.device.describe())
        self.query_one("#pair", Static).update(pair_text)
        self.query_one("#chain", Static).update(Text("\n".join(chain_lines(res.chain))))
        self.refresh_profile()

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
            self.query_one("#profile-path", Static).update(Text(str(e), style="red"))
            return
        self._profile_entries = list(prof.entries)
        where = f"{path}" + ("" if prof.exists else " (not created yet)")
        self.query_one("#profile-path", Static).update(Text(
            f"{where}: {len(prof.entries)} entries   (s: save the session's winner, d: delete the selected)"))
        for e in prof.entries:
            q = e.quant_scheme or "any"
            if e.quant_bits:
                q += f" {e.quant_bits}-bit"
            table.add_row(e.backend.value, e.compute_capability or "-", q, e.drafter_kind.value,
                          "decline" if e.decline else str(e.width), e.mlx or "-",
                          (e.measured_at or "-")[:19], "yes" if e.byte_identical else "NO",
                          (e.pair or "any")[:12])

    # ---- the pair (slow: a worker)
    @work(thread=True, exclusive=True, exit_on_error=False, group="pair", name="load pair")
    def load_pair(self) -> None:
        from console.inputs import pair_paths
        from engine.pair import load_pair

        o = self.options
        paths = pair_paths(o.target, o.draft, o.variant, o.kind)
        self.post_message(PairReady(load_pair(paths.target, paths.drafter, o.kind)))

    def on_pair_ready(self, message: PairReady) -> None:
        self.pair = message.pair
        self.query_one("#status", Static).update(Text(f"pair loaded: {self.pair.describe()}"))

    # ---- A/B
    def _ab_inputs(self) -> tuple[tuple[int, ...], int, int]:
        from console.request import parse_widths

        widths = parse_widths(self.query_one("#widths", Input).value)
        try:
            n = int(self.query_one("#n", Input).value)
            tokens = int(self.query_one("#tokens", Input).value)
        except ValueError:
            raise InputError("n and tokens must be integers") from None
        if n < 1 or tokens < 1:
            raise InputError(f"n = {n}, tokens = {tokens}: each must be at least 1")
        return widths, n, tokens

    def action_start_ab(self) -> None:
        if self.pair is None:
            self._error("the pair is still loading (or failed to load)")
            return
        if any(w.is_running for w in self.workers if w.group == "ab"):
            return
        try:
            widths, n, tokens = self._ab_inputs()
        except InputError as e:
            self._error(str(e))
            return
        self._error("")
        self._cancel = threading.Event()
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=1000, progress=0)
        self.query_one("#arms", DataTable).clear()
        self.query_one("#plot", Static).update("")
        self.query_one("#decision", Static).update("")
        self.query_one("#start", Button).disabled = True
        self.query_one("#cancel", Button).disabled = False
        self.run_ab(widths, n, tokens)

    @work(thread=True, exclusive=True, exit_on_error=False, group="ab", name="A/B session")
    def run_ab(self, widths: tuple[int, ...], n: int, tokens: int) -> None:
        from engine import host, record
        from engine.ab import AbConfig, run_session
        from engine.demo.prompts import DEFAULT_PROMPT

        gate = host.gate()
        cfg = AbConfig(widths=widths, prompt=DEFAULT_PROMPT, n=n, max_tokens=tokens)
        session = run_session(self.pair, cfg, on_event=lambda e: self.post_message(AbEvent(e)),
                              cancel=self._cancel)
        rec = record.build(session, self.pair, host.identity(), gate.to_dict())
        path = record.write(rec, Path(self.options.record_dir) if self.options.record_dir else None)
        self.post_message(AbDone(session, path))

    def on_ab_event(self, message: AbEvent) -> None:
        e = message.event
        bar = self.query_one("#progress", ProgressBar)
        if e.kind == "arm":
            self._current = f"{e.arm} rep {e.rep}" if e.rep else f"{e.arm} warm-up"
        elif e.kind == "progress":
            bar.update(progress=round(e.fraction * 1000))
        if e.kind in ("arm", "rep"):
            label = getattr(self, "_current", "")
            self.query_one("#status", Static).update(Text(f"running {label}  {e.message}".strip()))
        elif e.kind in ("exactness", "costcurve"):
            self.query_one("#status", Static).update(Text(f"{e.kind}: {e.message}"))

    def on_ab_done(self, message: AbDone) -> None:
        self.session, self.record_path = message.session, message.record_path
        s = self.session
        bar = self.query_one("#progress", ProgressBar)
        bar.update(total=bar.total, progress=bar.total)
        table = self.query_one("#arms", DataTable)
        table.clear()
        for arm in [s.classic, *s.arms]:
            d, e = arm.decode_range(), arm.e2e_range()
            if d is None:
                continue
            acc = f"{arm.acceptance:.3f}" if arm.acceptance is not None else "-"
            ident = "-" if arm.identity is None else (
                "identical" if arm.identity.identical_ids else f"differs @ {arm.identity.first_divergence}")
            style = {"wins": "bold green", "slower": "red", "faster, output differs": "yellow"}.get(
                arm.verdict.value, "")
            table.add_row(arm.name, f"{d.min:.1f}", f"{d.median:.1f}", f"{d.max:.1f}", f"{e.median:.1f}",
                          acc, ident, Text(arm.verdict.value, style=style), key=arm.name)
        plot = "decode tok/s by width (= min, # median, - max)\n" + "\n".join(bars(arm_rows(s), "tok/s"))
        self.query_one("#plot", Static).update(Text(plot))
        lines = [Text.assemble(("decision: ", "bold"), (s.decision, "bold green" if s.recommendation else "bold"),
                               f" — {s.why}")]
        if s.predicted_best:
            lines.append(Text(f"predicted best width from the cost curve and acceptance: {s.predicted_best}"))
        for warning in s.warnings():
            lines.append(Text(f"warning: {warning}", style="yellow"))
        lines.append(Text(f"record: {self.record_path}", style="dim"))
        if s.cancelled:
            lines.insert(0, Text("cancelled: nothing from this session can be saved", style="yellow"))
        self.query_one("#decision", Static).update(Text("\n").join(lines))
        self.query_one("#start", Button).disabled = False
        self.query_one("#cancel", Button).disabled = True
        first = next((a.width for a in s.arms if a.runs), None)
        if first is not None:
            self.show_identity(first)

    def show_identity(self, width: int) -> None:
        s = self.session
        if s is None or not s.classic.runs:
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

        prompt = Text(s.config.prompt, style="dim")

        def render(ids: list[int], colour: str) -> Text:
            if n is None:
                return prompt + Text(tok.decode(ids))
            return prompt + Text.assemble(tok.decode(ids[:n]),
                                          (tok.decode(ids[n:]), f"bold {colour} reverse"))

        self.query_one("#identity-head", Static).update(Text(
            f"classic (left) vs {arm.name} (right): {ident.describe() if ident else 'no identity'}"))
        self.query_one("#classic-text", Static).update(render(classic_ids, "green"))
        self.query_one("#width-text", Static).update(render(width_ids, "red"))

    @on(DataTable.RowHighlighted, "#arms")
    def _arm_row(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value if event.row_key else None
        if key and key.startswith("w"):
            self.show_identity(int(key[1:]))

    def action_cancel_ab(self) -> None:
        self._cancel.set()
        self.query_one("#status", Static).update("cancelling after the current round…")

    @on(Button.Pressed, "#start")
    def _start_pressed(self) -> None:
        self.action_start_ab()

    @on(Button.Pressed, "#cancel")
    def _cancel_pressed(self) -> None:
        self.action_cancel_ab()

    # ---- profile actions
    def action_save(self) -> None:
        from console.measure import save_session

        if self.session is None:
            self._error("nothing to save: run an A/B session first")
            return
        try:
            saved, refusal = save_session(self.session, self.pair, self.record_path, self.options.profile)
        except ProfileError as e:
            self._error(str(e))
            return
        if refusal:
            self._error(f"not saved: {refusal}")
            return
        self.notify(f"saved {saved}", timeout=6)
        self.refresh_resolution()

    def action_delete(self) -> None:
        from policy import profile as profiles

        table = self.query_one("#profile-table", DataTable)
        entries = getattr(self, "_profile_entries", [])
        if not entries or table.cursor_row is None or table.cursor_row >= len(entries):
            self._error("no profile entry selected (open the Profile tab and pick one)")
            return
        entry = entries[table.cursor_row]
        try:
            profiles.delete(self._profile_path(), entry)
        except ProfileError as e:
            self._error(str(e))
            return
        self.notify(f"deleted {entry.describe_keys()}", timeout=6)
        self.refresh_resolution()

    def action_refresh(self) -> None:
        self.refresh_resolution()

    # ---- failures and shutdown
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state is WorkerState.ERROR:
            err = event.worker.error
            self._error(f"{event.worker.name} failed: {err}")
            self.query_one("#start", Button).disabled = False
            self.query_one("#cancel", Button).disabled = True
            if event.worker.group == "pair":
                self.query_one("#pair", Static).update(Text(f"pair not loaded: {err}", style="red"))

    def on_unmount(self) -> None:
        self._cancel.set()  # a session stops at its next round instead of keeping the process alive


def run_app(options: Options) -> int:
    BlockwidthApp(options).run()
    return 0
