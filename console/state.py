"""The console's state as plain values: what it was started with, what it is doing, the
resolution it shows and the session it shows. No Textual here: the app holds these in
reactive attributes and the widgets draw them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blockwidth.console.inputs import PairPaths
    from blockwidth.console.request import SessionRequest
    from blockwidth.engine.ab import Session
    from blockwidth.policy.drafter import DrafterInfo
    from blockwidth.policy.resolve import Resolution

DEFAULT_WIDTHS = (2, 4, 8)
# The console's first session: the built-in workload (the prompt field's @mixed, 16 requests),
# n 2 and 32 tokens a request, sequential within 6 repetitions / 180 s. Every run prefills its
# request whatever the tokens (2164 prompt tokens a pass; on a 2-core CPU about half of a
# pass's ~70 s), so n and tokens are cut, not the workload. The n repetitions always run in
# full (about 150 s there, warm-ups and the closing pass included); the seconds budget counts
# from the start, so 180 s leaves room for a repetition or two of the widths still open, and
# an undecided session says which field to raise, to what, from its own repetitions' times.
FIRST_N = 2
FIRST_TOKENS = 32
BUDGET_REPS = 6
BUDGET_S = 180


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


# eq=False on both: a new value is a change (compared by identity, never field by field
# through every run of a session), which is what the reactive attributes holding them need.

@dataclass(frozen=True, eq=False)
class ResolutionView:
    """The resolution the console shows: the width with its pair and drafter, or why there is
    none (``error``: the resolver refused, e.g. a profile that does not parse). No value at all
    (None in the app) means a resolution is under way."""

    res: Resolution | None
    paths: PairPaths | None = None
    info: DrafterInfo | None = None
    error: str | None = None

    @property
    def width(self) -> int | None:
        return self.res.width if self.res is not None else None


@dataclass(frozen=True, eq=False)
class SessionView:
    """The A/B session the console shows, from the moment it is asked for: ``session`` is None
    while it runs and when it failed (``error`` says why)."""

    request: SessionRequest  # what the shown results were (or are being) run with
    session: Session | None = None
    record_path: Path | None = None
    gate_warnings: tuple[str, ...] = ()
    planned: int = 0  # runs planned when it started (sequential mode may add more)
    added_width: int | None = None  # the width in effect, added to a run that lacked it
    error: str | None = None
    saved: str | None = None  # what a save of this session stored (the profile entry, in words)
