"""Tab 3: the resolution's chain, every source the resolver passed over and why."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import var
from textual.widgets import Static, TabPane

from blockwidth.console.inputs import chain_lines
from blockwidth.console.state import ResolutionView
from blockwidth.policy.text import shown


def chain_text(view: ResolutionView) -> str:
    return "\n".join(shown(line) for line in chain_lines(view.res.chain))  # a profile's note, escaped


class ChainTab(TabPane):
    resolution: var[ResolutionView | None] = var(None)

    def compose(self) -> ComposeResult:
        yield VerticalScroll(Static("", id="chain"))

    def watch_resolution(self, view: ResolutionView | None) -> None:
        if view is not None and view.res is not None:  # while none, the last chain stays
            self.query_one("#chain", Static).update(Text(chain_text(view)))
