"""The console's small screens: help, confirm, a text to read, and opening another pair."""

from __future__ import annotations

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from blockwidth.policy.text import shown


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


_OPEN_LABELS = {  # the open dialog's fields, in order, and what each takes
    "target": "target: folder or Hugging Face repo id in the local cache",
    "draft": "drafter: folder or repo id (none with kind lookup)",
    "kind": "kind (model, lookup, dflash, mtp; empty: detected)",
}
# What an empty field holds, shown in it: compact fields without text read as blank lines (a
# tryout could not see the three fields until it typed in one)
_OPEN_EMPTY = {"target": "empty: the demo pair", "draft": "empty: none (prompt lookup, or the demo's)",
               "kind": "empty: detected"}


class PairScreen(ModalScreen[tuple[str, str, str] | None]):
    """Open another pair: target and drafter as folders or cached hub ids, and the drafter kind."""

    AUTO_FOCUS = ""  # on_mount focuses the field to fix
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]
    CSS = """
    PairScreen { align: center middle; }
    #open { width: 90%; max-width: 100; height: auto; border: round $primary; padding: 0 1;
            background: $surface; }
    #open Input { margin: 0 0 1 0; }
    """

    def __init__(self, target: str, draft: str, kind: str, error: str | None = None,
                 bad: str | None = None) -> None:
        super().__init__()
        self.values = (target, draft, kind)
        self.error = error  # why the last entry was refused: what was typed stays to be fixed
        # the field the refusal is about (target, draft, kind): marked and focused, as the A/B
        # fields mark theirs, the cursor at its end and nothing selected, to fix what was typed;
        # on a fresh open every field selects its text on focus, so typing replaces it
        self.bad = bad if bad in _OPEN_LABELS else None
        self._dropped = ""  # the drafter the kind lookup took out of its field

    def compose(self) -> ComposeResult:
        with Vertical(id="open"):
            # What an empty field means, as console.inputs.pair_paths reads it.
            yield Static(Text.assemble(("open another pair", "bold"), "  (Enter opens, Escape cancels; "
                                       "empty target: the demo pair and its drafter of the kind; "
                                       "a target with an empty drafter: prompt lookup, or with kind "
                                       "mtp the target's own MTP layers)"))
            if self.error:
                yield Static(Text(self.error, style="bold red"), id="open-error")
            for key, value in zip(_OPEN_LABELS, self.values, strict=True):
                yield Label(self._label(key, False), id=f"open-{key}-label")
                yield Input(value, id=f"open-{key}", compact=True, select_on_focus=self.bad is None,
                            placeholder=_OPEN_EMPTY[key])

    @staticmethod
    def _label(key: str, focused: bool) -> str:
        # the field being typed in is marked by a glyph too, not by its colour alone (a tryout in
        # a terminal of few colours could not tell which field had the cursor)
        return ("▸ " if focused else "  ") + _OPEN_LABELS[key]

    def on_descendant_focus(self, event) -> None:
        for key in _OPEN_LABELS:
            self.query_one(f"#open-{key}-label", Label).update(
                self._label(key, getattr(event.widget, "id", None) == f"open-{key}"))

    def on_mount(self) -> None:
        field = self.query_one(f"#open-{self.bad or 'target'}", Input)
        if self.bad:
            field.add_class("-bad")
        field.focus()
        if self.bad:
            field.cursor_position = len(field.value)
        else:
            # a fresh open: the pair in use is selected, so typing replaces it (a tryout typed a
            # path after the one shown and opened ".../smollm2/bf16/tmp/tryout/me/nope")
            field.select_all()

    @on(Input.Changed)
    def _changed(self, event: Input.Changed) -> None:
        refused = {f"open-{k}": v for k, v in zip(_OPEN_LABELS, self.values, strict=True)}
        if event.value != refused.get(event.input.id):  # edited (Textual also posts the first value)
            event.input.remove_class("-bad")
        if event.input.id != "open-kind":
            return
        # Prompt lookup uses no checkpoint: the kind lookup takes the old drafter out of its
        # field (it was kept, and the pair then refused), and another kind puts it back.
        draft = self.query_one("#open-draft", Input)
        if event.value.strip() == "lookup" and draft.value:
            self._dropped, draft.value = draft.value, ""
        elif event.value.strip() != "lookup" and self._dropped and not draft.value:
            draft.value, self._dropped = self._dropped, ""

    @on(Input.Submitted)
    def _open(self, event: Input.Submitted) -> None:
        event.stop()  # Enter here opens the pair; it must not also run an A/B session
        self.dismiss(tuple(self.query_one(f"#open-{k}", Input).value.strip()  # type: ignore[arg-type]
                           for k in _OPEN_LABELS))


class AnswerScreen(ModalScreen[None]):
    """The answer (console.answer): the command it copied, or why there is none, the width's
    source and whether anything measured it. ``y`` copies the command again, ``Y`` the engine's
    environment variable, here as on the main screen (the dialog said so and did not)."""

    AUTO_FOCUS = "#answer"
    BINDINGS = [Binding("escape,q,enter", "dismiss", "Close"), Binding("y", "copy_command", "Copy command"),
                Binding("Y", "copy_env", "Copy env var")]
    CSS = """
    AnswerScreen { align: center middle; }
    #answer { width: 95%; max-width: 140; height: auto; max-height: 90%; border: round $primary;
              padding: 0 1; background: $surface; }
    """

    def __init__(self, answer, copied: bool) -> None:
        super().__init__()
        self.answer = answer
        self.copied = copied

    def compose(self) -> ComposeResult:
        a = self.answer
        parts: list = []
        if a.session_command:  # what this machine just measured comes first
            parts += [("this session measured classic faster than every width it ran (" + (a.session_why or "")
                       + "); its command, no draft model" + (", copied" if self.copied else "") + ":\n", "bold"),
                      "  ", (a.session_command, "green"), "\n\n",
                      ("the resolved width's command (the session measured that width no faster):\n", "bold")]
            if a.command is not None:
                parts += ["  ", a.command, "\n\n"]
            else:
                parts += ["  none: ", shown(a.refusal or ""), "\n\n"]
        elif a.command is not None:
            parts += [("the mlx_lm.server command" + (", copied to the clipboard (where the terminal "
                                                      "allows it)" if self.copied else "") + ":\n", "bold"),
                      "  ", (a.command, "green"), "\n\n"]
        else:
            # why there is none can quote a folder's name or a load error: shown, as on a terminal
            parts += [("no mlx_lm.server command: ", "bold red"), shown(a.refusal or ""), "\n\n"]
        parts += [("the width: ", "bold"), shown(a.head()), "\n"]
        if a.caution:
            parts += [("caution: ", "bold yellow"), shown(a.caution), "\n"]
        if a.session:
            parts += [("this session: ", "bold"), shown(a.session), "\n"]
        if a.env:
            # after a session that measured every width slower, the variable is the resolved
            # width's, not a recommendation: said so where it is offered
            head = ("the resolved width for blockwidth's engine (this session measured it no faster):\n"
                    if a.session_command else "for blockwidth's engine and CI, the environment variable:\n")
            parts += ["\n", (head, "bold"), f"  export {a.env}\n"]
        # "copied to the clipboard" then "y copies the command" read as two different acts (a
        # tryout); and with no command (a failed pair) the mlx-lm option is nothing to explain
        has_command = bool(a.command or a.session_command)
        keys = [("y copies it again" if self.copied else "y copies the command") if has_command else "",
                "Y copies the variable" if a.env else "", "Escape closes"]
        note = "  num_draft_tokens = width - 1." if has_command else ""
        parts += ["\n", (" · ".join(k for k in keys if k) + "." + note, "dim")]
        yield VerticalScroll(Static(Text.assemble(*parts)), id="answer")

    def action_copy_command(self) -> None:
        if self.answer.session_command:
            self.app.copy_to_clipboard(self.answer.session_command)
            self.app.notify("copied the command without a draft model (this session's measurement)", timeout=4)
        elif self.answer.command:
            self.app.copy_to_clipboard(self.answer.command)
            self.app.notify("copied the mlx_lm.server command", timeout=4)
        else:
            self.app.notify(f"nothing to copy: {self.answer.refusal}", severity="warning", timeout=6,
                            markup=False)

    def action_copy_env(self) -> None:
        if self.answer.env:
            self.app.copy_to_clipboard(f"export {self.answer.env}")
            self.app.notify(f"copied: export {self.answer.env}", timeout=4, markup=False)
        else:
            self.app.notify("nothing to copy: no width (a decline decodes classically)",
                            severity="warning", timeout=6)


class SaveScreen(ModalScreen[str | None]):
    """Where a save applies: this pair only, or any pair of the kind on this device and
    quantization. A generic entry answers for other models too, so the operator chooses."""

    BINDINGS = [Binding("p", "answer('pair')", "This pair"), Binding("g", "answer('generic')", "Generic"),
                Binding("escape,n", "answer(None)", "Cancel")]
    CSS = """
    SaveScreen { align: center middle; }
    #save { width: 90%; max-width: 110; height: auto; border: thick $primary; padding: 0 1;
            background: $surface; }
    """

    def __init__(self, what: str, pair: str, generic: str) -> None:
        super().__init__()
        self.what, self.pair, self.generic = what, pair, generic

    def compose(self) -> ComposeResult:
        yield Static(Text.assemble(
            ("save ", "bold"), (self.what, "bold"), (" for which pairs?\n\n", "bold"),
            ("p", "bold"), "  this pair only: ", self.pair, "\n",
            ("g", "bold"), "  generic: ", self.generic, "\n   (a later resolution of another model of this "
            "kind uses it too, and says which pair and prompt it was measured on)\n\n",
            ("Escape", "bold"), " saves nothing"), id="save")

    def action_answer(self, scope: str | None) -> None:
        self.dismiss(scope)


class FirstSessionScreen(ModalScreen[str | None]):
    """Before a session the pilot priced out of its fields' reach: what it can and cannot do here,
    and the choice. ``r`` raises the budget to what the repetitions a win needs take here, ``o``
    runs one prompt instead of the workload, ``a`` runs the fields as set, Escape goes back."""

    BINDINGS = [Binding("r", "answer('raise')", "Raise the budget"), Binding("o", "answer('single')", "One prompt"),
                Binding("a", "answer('as set')", "Run as set"), Binding("escape,n", "answer(None)", "Back")]
    CSS = """
    FirstSessionScreen { align: center middle; }
    #first { width: 90%; max-width: 110; height: auto; border: thick $warning; padding: 0 1;
             background: $surface; }
    """

    def __init__(self, why: str, pilot: str, raise_: tuple[int, int] | None,
                 single: tuple[str, str] | None, can_decide: bool, sequential: bool = True) -> None:
        super().__init__()
        self.why, self.pilot, self.raise_, self.single, self.can_decide = why, pilot, raise_, single, can_decide
        self.sequential = sequential  # the fields' sequential box: r turns it on where it is off

    def compose(self) -> ComposeResult:
        parts: list = [("this session cannot decide a win as set" if not self.can_decide
                        else "this session is long for its budget", "bold"), "\n", self.why, "\n",
                       (f"({self.pilot})", "dim"), "\n\n"]
        if self.raise_ is not None:
            # the fields may already read these figures with sequential off (a tryout saw "raise the
            # budget to secs 360, reps 6" beside reps 6 secs 360): then what r changes is the box
            how = ("raise the budget to" if self.sequential else "turn sequential on, with")
            parts += [("r", "bold"), f"  {how} secs {self.raise_[0]}, reps {self.raise_[1]}, and run\n"]
        if self.single is not None:
            parts += [("o", "bold"), f"  run one prompt instead ({self.single[0]}): about {self.single[1]} to "
                                     "decide here\n"]
        parts += [("a", "bold"), "  run it as set" + ("" if self.can_decide else
                                                      " (it can end in a decline or undecided, not in a win)") + "\n",
                  ("Escape", "bold"), " back to the fields"]
        yield Static(Text.assemble(*parts), id="first")

    def action_answer(self, choice: str | None) -> None:
        if choice == "raise" and self.raise_ is None or choice == "single" and self.single is None:
            return
        self.dismiss(choice)
