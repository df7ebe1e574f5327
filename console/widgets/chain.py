"""Tab 3: the resolution's chain, every source the resolver passed over and why."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.reactive import var
from textual.widgets import Static, TabPane

from blockwidth.console.state import ResolutionView
from blockwidth.policy.text import shown


def chain_table(view: ResolutionView) -> Table:
    """The chain as a grid: a long reason wraps under its own column (as plain lines, a wrapped
    reason restarted at column 0 at 80 columns, under the sources)."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=4, no_wrap=True)
    grid.add_column(no_wrap=True)
    grid.add_column(justify="right", no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    for s in view.res.chain:
        grid.add_row("  ->" if s.applied else "", Text(s.source.value), "-" if s.width is None else str(s.width),
                     Text(shown(s.why)))  # a profile's note, escaped
    return grid


class ChainTab(TabPane):
    resolution: var[ResolutionView | None] = var(None)

    def compose(self) -> ComposeResult:
        yield VerticalScroll(Static("", id="chain"))

    def watch_resolution(self, view: ResolutionView | None) -> None:
        if view is not None and view.res is not None:  # while none, the last chain stays
            self.query_one("#chain", Static).update(chain_table(view))
