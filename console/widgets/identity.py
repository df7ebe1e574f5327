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
    """Each measured width's identity diff for one session, built on first use: per request
    where a workload ran (its prompt and each arm's output on it, never the workload's name and
    every request's output run together)."""

    def __init__(self, session: Any, tokenizer: Any) -> None:
        self.session, self.tokenizer = session, tokenizer
        self._views: dict[tuple[int, int], IdentityView] = {}

    def measured(self) -> list[int]:
        return [a.width for a in self.session.arms if a.runs]

    @property
    def requests(self) -> int:
        return len(self.session.per_request)

    def first_request(self, width: int, otherwise: int = 0) -> int:
        """The request to show first for ``width``: the first whose output differs, else
        ``otherwise`` (the request on screen, when the width changes)."""
        for i, r in enumerate(self.session.per_request):
            try:
                ident = r.arm(width).identity
            except StopIteration:
                continue
            if ident is not None and not ident.identical_ids:
                return i
        return otherwise

    def get(self, width: int, request: int = 0) -> IdentityView | None:
        """The view for ``width`` on the ``request``-th request, or None where there is nothing
        to compare (that request did not run on both: a cancelled session)."""
        key = (width, request)
        if key not in self._views:
            view = self._build(width, request)
            if view is None:
                return None
            self._views[key] = view
        return self._views[key]

    def _build(self, width: int, index: int) -> IdentityView | None:
        s, tok = self.session, self.tokenizer
        reqs = s.per_request
        if not 0 <= index < len(reqs):
            return None
        req = reqs[index]
        try:
            arm = req.arm(width)
        except StopIteration:
            return None
        if not req.classic.runs or not arm.runs:
            return None
        classic_ids = req.classic.runs[0].tokens
        width_ids = next((r.tokens for r in arm.runs if r.tokens != classic_ids), arm.runs[0].tokens)
        ident = arm.identity
        n = ident.first_divergence if ident and not ident.identical_ids else None
        prompt = Text(shown_block(_prompt_text(req, s)), style="dim")

        def render(ids: list[int], colour: str) -> Text:  # a completion's escapes are escaped too
            if n is None:
                return prompt + Text(shown_block(tok.decode(ids)))
            return prompt + Text.assemble(shown_block(tok.decode(ids[:n])),
                                          (shown_block(tok.decode(ids[n:])), f"bold {colour} reverse"))

        measured = self.measured()
        classic, other = render(classic_ids, "green"), render(width_ids, "red")
        name = s.arm(width).name
        where = ""
        if len(reqs) > 1:
            differ = len(s.differing_requests(width))
            where = (f" on request {shown(req.id)} ({index + 1} of {len(reqs)}, {{ and }} pick; output differs on "
                     f"{differ})")
        head = Text(
            # "2 of 3 widths", not "width 2 of 3": the position in the list, not the width 2
            f"classic (left) vs {name} (right){where}, {measured.index(width) + 1} of {len(measured)} widths "
            f"([ and ] pick): {shown(ident.describe()) if ident else 'no identity'}")
        side = Text.assemble(
            (f"identity (tab 2): classic vs {name}" + (f", request {shown(req.id)}" if len(reqs) > 1 else "")
             + "\n", "bold"), shown(ident.describe()) if ident else "", "\n\n",
            ("classic\n", "bold"), classic, "\n\n", (f"{name}\n", "bold"), other)
        return IdentityView(width, head, classic, other, side)


def _prompt_text(req: Any, session: Any) -> str:
    """What the request's prompt says: its text, or its chat turns (role: content)."""
    r = req.prepared.request
    if len(session.per_request) == 1 and session.config.workload is None:
        return session.config.prompt
    if r.prompt is not None:
        return r.prompt
    return "\n".join(f"{m.role}: {m.content}" for m in (r.messages or ())) + "\n"


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
