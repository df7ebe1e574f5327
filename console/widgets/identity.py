"""The identity diff: classic's completion beside one width's, from the first divergence on.

Each width's texts are decoded once per session (``IdentityViews``), so moving the cursor
through the arms table, or ``[`` and ``]``, only looks them up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Static, TabPane

from blockwidth.policy.text import shown, shown_block


@dataclass(frozen=True)
class IdentityView:
    width: int
    head: Text  # the Identity tab's first line
    classic: Text
    other: Text  # the width's completion
    side: Text  # the same, for the A/B tab's side panel on wide terminals


class IdentityViews:
    """Each measured width's identity diff for one session, built on first use."""

    def __init__(self, session: Any, tokenizer: Any) -> None:
        self.session, self.tokenizer = session, tokenizer
        self._views: dict[int, IdentityView] = {}

    def measured(self) -> list[int]:
        return [a.width for a in self.session.arms if a.runs]

    def get(self, width: int) -> IdentityView | None:
        """The view for ``width``, or None where there is nothing to compare."""
        if width not in self._views:
            view = self._build(width)
            if view is None:
                return None
            self._views[width] = view
        return self._views[width]

    def _build(self, width: int) -> IdentityView | None:
        s, tok = self.session, self.tokenizer
        if not s.classic.runs:
            return None
        try:
            arm = s.arm(width)
        except KeyError:
            return None
        if not arm.runs:
            return None
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

        measured = self.measured()
        classic, other = render(classic_ids, "green"), render(width_ids, "red")
        head = Text(
            # "2 of 3 widths", not "width 2 of 3": the position in the list, not the width 2
            f"classic (left) vs {arm.name} (right), {measured.index(width) + 1} of {len(measured)} widths "
            f"([ and ] pick): {shown(ident.describe()) if ident else 'no identity'}")
        side = Text.assemble(
            (f"identity (tab 2): classic vs {arm.name}\n", "bold"), shown(ident.describe()) if ident else "", "\n\n",
            ("classic\n", "bold"), classic, "\n\n", (f"{arm.name}\n", "bold"), other)
        return IdentityView(width, head, classic, other, side)


class IdentityTab(TabPane):
    """Tab 2: the identity diff of the width picked in the arms table (or with ``[`` and ``]``)."""

    def compose(self) -> ComposeResult:
        # markup=False: read as markup, "[ and ]" was a tag and vanished from the line
        yield Static("run an A/B session; [ and ] pick the width to compare", id="identity-head",
                     markup=False)
        with Horizontal():
            with VerticalScroll(classes="diffcol"):
                yield Static("", id="classic-text")
            with VerticalScroll(classes="diffcol"):
                yield Static("", id="width-text")

    def show(self, view: IdentityView) -> None:
        self.query_one("#identity-head", Static).update(view.head)
        self.query_one("#classic-text", Static).update(view.classic)
        self.query_one("#width-text", Static).update(view.other)
