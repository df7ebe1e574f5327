"""What the console's workers post back to the UI thread: one typed message per result.

Workers never touch widgets; each posts one of these and its handler (``on_<name>``) draws it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.message import Message

if TYPE_CHECKING:
    from rich.console import RenderableType

    from blockwidth.console.inputs import PairPaths
    from blockwidth.engine.ab import Event, Session
    from blockwidth.engine.pair import Pair
    from blockwidth.policy.drafter import DrafterInfo
    from blockwidth.policy.resolve import Resolution


@dataclass
class Resolved(Message):
    """The resolver answered (its device probe and checkpoint fingerprints ran in a thread)."""

    res: Resolution
    paths: PairPaths
    info: DrafterInfo


@dataclass
class ResolveFailed(Message):
    """The resolver refused: bad input, a bad width override, a profile that does not parse."""

    error: str


@dataclass
class PairReady(Message):
    pair: Pair
    pace: Any = None  # policy.pace.Pace from the pilot that followed the load (None: none ran)


@dataclass
class AbEvent(Message):
    """One progress event of a running A/B session; a repetition's end carries the arms table's
    rows so far (``widgets.ab.running_rows``, drawn in the worker, where the session is still
    changing between events)."""

    event: Event
    rows: Any = None

    def can_replace(self, message: Message) -> bool:
        # Token ticks coalesce, and so do a stage's own ticks (the cost curve's forwards);
        # a change of stage must arrive.
        if not isinstance(message, AbEvent) or message.event.kind != self.event.kind:
            return False
        return self.event.kind == "progress" or (self.event.kind == "phase"
                                                 and self.event.phase == message.event.phase)


@dataclass
class AbDone(Message):
    """A session finished (or was cancelled) and its record was written (``record_path``), or
    could not be (None, and ``error`` says why: the results are shown all the same)."""

    session: Session
    record_path: Path | None
    gate_warnings: list[str]
    error: str | None = None


@dataclass
class Saved(Message):
    """The profile write: what was saved, or the refusal (exactly one is set)."""

    saved: str | None
    refusal: str | None
    session: Session | None = None  # the session it was asked for (the screen may show another by now)


@dataclass
class Deleted(Message):
    """The profile entry delete (under the profile's lock, off the UI thread): ``error`` None when
    the entry is gone."""

    entry: Any
    error: str | None = None


@dataclass
class ProfileRead(Message):
    """The profile parsed and its static check run off the UI thread (the check reads the records
    its entries name): the entries and one mark each, or the profile's error lines.
    ``generation``: which read it answers (a later read's answer replaces an earlier one's)."""

    generation: int
    profile: Any | None
    marks: list[Any]
    error: list[str] | None = None


@dataclass
class RecordsRead(Message):
    """Past session records for this pair and device, newest first; ``key``: the (pair id,
    backend) they were read for (a read for a pair since closed is dropped)."""

    rows: list[tuple[Path, dict]]
    key: tuple[str | None, str | None] = (None, None)


@dataclass
class PreviewRendered(Message):
    """One record's Markdown, rendered off the UI thread, as the Records tab shows it."""

    path: Path
    preview: RenderableType
