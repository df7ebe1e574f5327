"""The console's small screens: help, confirm, a text to read, and opening another pair."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

class HelpScreen(ModalScreen[None]):
    """Every key, from the app's own binding table (so it cannot fall out of date)."""

    # Focus the scroll container: on 80x24 the list is taller than the dialog, and with no
    # focus the arrows and PgUp/PgDn scroll nothing, so the last keys could not be read.
    AUTO_FOCUS = "#help"
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]
    CSS = """
    HelpScreen { align: center middle; }
    #help { width: 90%; max-width: 100; height: 90%; border: round $primary; padding: 0 1;
            background: $surface; }
    """

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        from rich.console import Group
        from rich.table import Table

        # A grid, not one text: a description that wraps at 80 columns stays in its column
        # instead of running back under the keys.
        grid = Table.grid(padding=(0, 2))
        grid.add_column(justify="right", style="bold", no_wrap=True)
        grid.add_column()
        for key, what in self.rows:
            grid.add_row(key, what)
        yield VerticalScroll(Static(Group(Text.assemble(("keys", "bold"), "  (Escape, ? or q closes)"),
                                          grid)), id="help")


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes"), Binding("n,escape", "answer(False)", "No")]
    CSS = """
    ConfirmScreen { align: center middle; }
    #confirm { width: 90%; max-width: 100; height: auto; border: thick $error; padding: 0 1;
               background: $surface; }
    """

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(self.question, "\n\n", ("y", "bold"), " yes   ", ("n", "bold"),
                                   " / Escape no"), id="confirm")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class TextScreen(ModalScreen[None]):
    AUTO_FOCUS = "#text"  # as HelpScreen: a long text must scroll from the keyboard
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close")]
    CSS = """
    TextScreen { align: center middle; }
    #text { width: 95%; height: 70%; border: round $primary; padding: 0 1; background: $surface; }
    """

    def __init__(self, text: Text) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield VerticalScroll(Static(self.text), id="text")


class PairScreen(ModalScreen[tuple[str, str, str] | None]):
    """Open another pair: target and drafter as folders or cached hub ids, and the drafter kind."""

    AUTO_FOCUS = "#open-target"
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    CSS = """
    PairScreen { align: center middle; }
    #open { width: 90%; max-width: 100; height: auto; border: round $primary; padding: 0 1;
            background: $surface; }
    #open Input { margin: 0 0 1 0; }
    """

    def __init__(self, target: str, draft: str, kind: str) -> None:
        super().__init__()
        self.values = (target, draft, kind)

    def compose(self) -> ComposeResult:
        with Vertical(id="open"):
            yield Static(Text.assemble(("open another pair", "bold"), "  (Enter opens, Escape cancels; "
                                       "empty target: the demo pair; empty drafter: prompt lookup)"))
            yield Label("target: folder or Hugging Face repo id in the local cache")
            yield Input(self.values[0], id="open-target", compact=True)
            yield Label("drafter: folder or repo id")
            yield Input(self.values[1], id="open-draft", compact=True)
            yield Label("kind (model, lookup, dflash, mtp; empty: detected)")
            yield Input(self.values[2], id="open-kind", compact=True)

    @on(Input.Submitted)
    def _open(self, event: Input.Submitted) -> None:
        event.stop()  # Enter here opens the pair; it must not also run an A/B session
        self.dismiss(tuple(self.query_one(f"#open-{k}", Input).value.strip()  # type: ignore[arg-type]
                           for k in ("target", "draft", "kind")))
