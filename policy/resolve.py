"""The pure width resolver: five sources in order, first match wins.

1. operator override: the flag, then BLOCKWIDTH_DRAFT_BLOCK_SIZE (then the
   compatible MLXCEL_DRAFT_BLOCK_SIZE);
2. a measured profile override for this device, target quantization and
   drafter kind (pair-specific beats generic);
3. a width the drafter checkpoint declares;
4. the built-in measured default (policy.table);
5. the per-kind fallback constant.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping

from blockwidth.policy import table
from blockwidth.policy.integers import IntegerError, parse_int, shorten
from blockwidth.policy.device import Backend, Device
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.auto import AUTO, Plan
from blockwidth.policy.errors import BlockwidthError
from blockwidth.policy.profile import MAX_WIDTH, MIN_WIDTH, PATH_ENGINE, PATH_SERVER, Entry, Profile
from blockwidth.policy.quantization import Quantization

ENV_VARS = ("BLOCKWIDTH_DRAFT_BLOCK_SIZE", "MLXCEL_DRAFT_BLOCK_SIZE")


class Source(str, Enum):
    FLAG = "flag"
    ENV = "env"
    PROFILE = "profile"
    DRAFTER = "drafter-checkpoint"
    TABLE = "measured-default"
    FALLBACK = "kind-default"


_LABEL = {
    Source.FLAG: "flag", Source.ENV: "environment", Source.PROFILE: "profile",
    Source.DRAFTER: "drafter checkpoint", Source.TABLE: "measured default",
    Source.FALLBACK: "per-kind default",
}


def label(source: Source) -> str:
    """A source in words: ``measured default``, ``per-kind default``, ``profile``..."""
    return _LABEL[source]


class WidthError(BlockwidthError, ValueError):
    """An operator override that is not a valid width. Never a silent fallback."""


@dataclass(frozen=True)
class Step:
    source: Source
    applied: bool
    width: int | None
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source.value, "applied": self.applied, "width": self.width,
                "why": self.why}


@dataclass(frozen=True)
class Resolution:
    width: int | None  # None only for a measured decline: decode classically
    source: Source
    reason: str
    chain: tuple[Step, ...]
    drafter_kind: DrafterKind
    device: Device
    quantization: Quantization
    stale: bool = False
    entry: Entry | None = field(default=None, compare=False)
    row: table.MeasuredDefault | None = field(default=None, compare=False)  # the table row applied
    # What the width was measured on (engine | mlx-lm-server; None: nothing measured it, e.g. a
    # flag) and the path and load it was resolved for.
    measured_path: str | None = None
    path: str = PATH_ENGINE
    concurrency: int = 1

    @property
    def decline(self) -> bool:
        return self.width is None

    @property
    def auto(self) -> Plan | None:
        """An ``auto`` entry's plan: the engine adapts per round on it; ``width`` is the fixed
        width a consumer that cannot adapt (mlx_lm.server, an exported command) takes."""
        return self.entry.auto if self.entry is not None else None

    @property
    def engine_width(self) -> int | str | None:
        """What blockwidth's engine runs: ``auto`` for an auto entry (it adapts per round), else
        ``width``."""
        return AUTO if self.auto is not None else self.width

    def to_dict(self) -> dict[str, Any]:
        return {
            "width": self.width,
            "source": self.source.value,
            "reason": self.reason,
            "drafter_kind": self.drafter_kind.value,
            "device": self.device.to_dict(),
            "target_quantization": self.quantization.to_dict(),
            "decline": self.decline,
            "stale": self.stale,
            "chain": [s.to_dict() for s in self.chain],
            "measured_path": self.measured_path,
            "resolved_for": {"path": self.path, "concurrency": self.concurrency},
            "concurrency": self.entry.load if self.entry is not None else None,
            "auto": ({**self.auto.to_dict(), "static_width": self.width}
                     if self.auto is not None else None),
        }


def parse_width(value: Any, origin: str) -> int:
    """A width from an operator: an integer MIN_WIDTH..MAX_WIDTH, else WidthError."""
    rng = f"an integer from {MIN_WIDTH} to {MAX_WIDTH} (rows per verify: drafted tokens + 1)"
    try:
        # '1_0' and non-ASCII digits ('٤') are an operator's typo, not a width (policy.integers).
        return parse_int(value, MIN_WIDTH, MAX_WIDTH)
    except IntegerError as e:
        if not e.out_of_range:
            raise WidthError(f"{origin} = {shorten(repr(value))} is not an integer; expected {rng}") from None
        why = " (width 1 is classic decoding)" if e.value in (0, 1) else ""
        raise WidthError(f"{origin} = {e.shown} is out of range{why}; expected {rng}") from None


def keyed_on(device: Device, quant: Quantization) -> str:
    """The inputs a resolution was keyed on, in words: ``cuda sm_90 with an affine 4-bit g64 target``."""
    dev = device.backend.value
    if device.backend is Backend.CUDA:
        dev += f" {device.architecture or 'unknown architecture'}"
    if device.group is not None:
        g = device.group
        dev += f" x{g.size} over {g.backend} ({g.sharding.value}-sharded)"
    q = quant.describe()
    article = "an" if q[:1] in "aeiou" else "a"
    return f"{dev} with {article} {q} target"


def resolve(
    *,
    drafter_kind: DrafterKind,
    device: Device,
    quantization: Quantization,
    flag: Any = None,
    env: Mapping[str, str] | None = None,
    profile: Profile | None = None,
    declared_width: int | None = None,
    declared_detail: str = "",
    pair: str | None = None,
    mlx_version: str | None = None,
    route: str = PATH_ENGINE,
    concurrency: int = 1,
) -> Resolution:
    """Pick the width for ``route`` (what will run it: the engine, or mlx_lm.server) under
    ``concurrency`` requests at once. Raises WidthError for an invalid flag or environment value."""
    env = env or {}
    chain: list[Step] = []
    keys = keyed_on(device, quantization)

    def done(width: int | None, source: Source, reason: str, **kw: Any) -> Resolution:
        chain.append(Step(source, True, width, reason))
        # Sources below the winner are listed as not consulted, so the chain is whole.
        order = list(Source)
        for s in order[order.index(source) + 1:]:
            if all(st.source is not s for st in chain):
                chain.append(Step(s, False, None, f"not consulted: {source.value} applied first"))
        entry = kw.get("entry")
        shown = "classic" if width is None else str(width)
        if entry is not None and entry.auto is not None:
            shown = f"auto, fixed {width} where the width cannot adapt"
        text = f"{shown} ({_LABEL[source]}: {reason})"
        return Resolution(width, source, text, tuple(chain), drafter_kind, device, quantization,
                          path=route, concurrency=concurrency, **kw)

    # 1. operator override
    if flag is not None:
        w = parse_width(flag, "--draft-block-size")
        return done(w, Source.FLAG, "--draft-block-size given")
    chain.append(Step(Source.FLAG, False, None, "--draft-block-size not given"))
    set_vars = [v for v in ENV_VARS if env.get(v, "").strip() != ""]
    if set_vars:
        name = set_vars[0]
        w = parse_width(env[name], name)
        extra = f"; {set_vars[1]} also set and ignored" if len(set_vars) > 1 else ""
        return done(w, Source.ENV, f"{name} set{extra}")
    chain.append(Step(Source.ENV, False, None, f"neither {' nor '.join(ENV_VARS)} is set"))

    # 2. measured profile override
    if profile is not None:
        entry = profile.match(device, quantization, drafter_kind, pair, route=route,
                              concurrency=concurrency)
        if entry is not None:
            stale = bool(entry.mlx and mlx_version and entry.mlx != mlx_version)
            what = "no width beat classic" if entry.decline else "measured winner"
            if entry.auto is not None:
                what = "the auto width measured the winner"
            reason = f"{what} for {entry.describe_keys()} in {profile.path}"
            if entry.line:
                reason += f" line {entry.line}"
            if entry.auto is not None:
                reason += (f"; it adapts per round on its curve ({entry.auto.describe()}); "
                           f"{entry.width} is its best fixed width there")
            if not entry.byte_identical:
                reason += "; output NOT byte-identical to classic (saved explicitly)"
            if stale:
                reason += f"; stale: measured under MLX {entry.mlx}, running {mlx_version}"
            note = entry.match_note(device)
            if note:
                reason += f"; {note}"
            reason += f"; measured on {entry.measured_on(pair)}"
            reason += path_note(entry.path, route)
            if entry.load != concurrency:
                reason += f"; measured at concurrency {entry.load}, not at the {concurrency} asked for"
            return done(entry.width, Source.PROFILE, reason, stale=stale, entry=entry,
                        measured_path=entry.path)
        n = len(profile.entries)
        wanted = f"{drafter_kind.value} drafter on {keys}"
        # "no entry of 0 in P (not present)" read as a riddle on a first run with no profile yet
        if not profile.exists:
            why = f"{profile.path} is not present: nothing measured for {wanted}"
        elif n == 0:
            why = f"{profile.path} has no entries: nothing measured for {wanted}"
        else:
            why = f"no entry of {n} in {profile.path} matches {wanted}"
        chain.append(Step(Source.PROFILE, False, None, why))
    else:
        chain.append(Step(Source.PROFILE, False, None, "no profile"))

    # 3. what the drafter checkpoint declares, unless a committed measurement on this device
    # class measured that width slower than classic (a declaration is a training choice)
    row = table.lookup(drafter_kind, device, quantization)
    if declared_width is not None:
        if not MIN_WIDTH <= declared_width <= MAX_WIDTH:
            chain.append(Step(Source.DRAFTER, False, None,
                              f"declared width {declared_width} is outside {MIN_WIDTH}..{MAX_WIDTH}; ignored"))
        elif row is not None and declared_width in row.slower:
            chain.append(Step(Source.DRAFTER, False, declared_width,
                              f"declares {declared_width}, passed over: record {row.record} measured "
                              f"width {declared_width} slower than classic for {drafter_kind.value} "
                              f"drafter on {keys}"))
        else:
            # done() prefixes "drafter checkpoint: "; the detail (from detect_drafter) says what
            # declared it, so repeating "drafter checkpoint declares" before it read as a stutter
            return done(declared_width, Source.DRAFTER, declared_detail or f"declares {declared_width}")
    else:
        chain.append(Step(Source.DRAFTER, False, None,
                          "none: prompt lookup has no checkpoint" if drafter_kind is DrafterKind.LOOKUP
                          else "drafter checkpoint declares no width"))

    # 4. built-in measured default
    if row is not None:
        if row.width is None:
            what = "every width measured was slower than classic, so decode classically"
        elif row.won:
            what = f"measured for {drafter_kind.value} drafter on {keys}"
        else:
            what = (f"the fastest width not measured slower for {drafter_kind.value} drafter on {keys} "
                    f"(not a win there)")
        return done(row.width, Source.TABLE,
                    f"{what}; record {row.record}, MLX {row.mlx}" + ("" if row.won else f": {row.evidence}")
                    + _identity_note(row.byte_identical if row.width is not None else None)
                    + path_note(PATH_ENGINE, route), row=row, measured_path=PATH_ENGINE)
    chain.append(Step(Source.TABLE, False, None,
                      f"no built-in measurement for {drafter_kind.value} drafter on {keys}"))

    # 5. per-kind fallback
    w = table.KIND_FALLBACK[drafter_kind]
    return done(w, Source.FALLBACK,
                f"no measurement for {drafter_kind.value} drafter on {keys}; "
                f"{w} is the unmeasured {drafter_kind.value} constant")


def path_note(measured: str, wanted: str) -> str:
    """What a width measured on one path says when resolved for the other."""
    if measured == wanted:
        return ""
    if wanted == PATH_SERVER:
        return ("; measured on blockwidth's engine path: the served path (mlx_lm.server) was not "
                "measured (blockwidth sweep --path mlx-lm-server measures it)")
    return "; measured through mlx_lm.server (the served path), not on the engine path"


def _identity_note(byte_identical: bool | None) -> str:
    if byte_identical is None:
        return ""
    return ("; greedy output byte-identical to classic" if byte_identical
            else "; greedy output not byte-identical to classic (a near-tie flip)")
