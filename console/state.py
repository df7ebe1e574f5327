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

DEFAULT_WIDTHS = (2, 4)
# The console's first session: the built-in workload (the prompt field's @mixed, 16 requests),
# widths 2 and 4 (and the width in effect, always added), n 3 and 32 tokens a request,
# sequential within 6 repetitions / 360 s. Sized from what it cost on the 2-core CPU, busy
# (2026-12-04): every run prefills its request whatever the tokens (2164 prompt tokens a pass,
# half of a run's time or more there), a pass of classic, w2, w4 and w8 took ~105 s and n 2 of
# them with warm-ups and the closing pass 253 s. A win needs n 3 (its permutation p below
# policy.stats.ALPHA: 1/35 with classic's closing pass; n 2 cannot go below 1/10), so n is 3 and
# w8 (slowest on every CPU record, and added anyway where it is the width in effect) is left
# out: three passes of three arms cost what two of four did (measured, the same day: 509 s at a
# load of 19 on the 2 cores, 2 min of CPU; the pilot had said 6.1 min). The budget counts from the start:
# 360 s leaves room for one more repetition of the widths still open. The pilot at load prices
# these fields on the host at hand, and a session that cannot reach n 3 is warned before it runs.
FIRST_N = 3
FIRST_TOKENS = 32
BUDGET_REPS = 6
BUDGET_S = 360


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
    estimate: str | None = None  # the pilot's estimate for it when it started (None: no pilot)
