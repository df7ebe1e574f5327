"""The checks of ``--check``, pure: their statuses, the exit code they add up to, the
Profile tab's marks, and the rules that judge a profile's entries for a device and a
measured session against the entry it re-measures. The console's ``check`` reads the
files and runs the engine; everything decided from what it found is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping, Sequence

from blockwidth.policy.device import Device, mismatch
from blockwidth.policy.errors import ExitCode
from blockwidth.policy.profile import Entry, Profile
from blockwidth.policy.verdict import Verdict


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"  # allowed, unless --strict
    FAIL = "fail"
    SKIP = "skip"  # not this runner's business: another machine's entry, a kind the engine cannot run
    INCONCLUSIVE = "inconclusive"  # a measurement that decided nothing; never a pass


class Mark(str, Enum):
    """What the console's Profile tab shows beside each entry, for this device."""

    PASS = "pass"
    WARN = "warn"
    STALE = "stale"
    SKIP = "skip"
    FAIL = "fail"
    UNCHECKED = "unchecked"  # no device to check against yet (the console is still resolving)


class Category(str, Enum):
    PROFILE = "profile"  # the file as a whole
    ENTRY = "entry"  # one entry, on this device
    RESOLVE = "resolve"  # a configured pair's resolution
    MEASURE = "measure"  # a short A/B on this machine


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    category: Category = Category.PROFILE
    figures: Mapping[str, Any] = field(default_factory=dict)
    entry: int | None = None  # 1-based index of the profile entry it is about
    line: int | None = None
    stale: bool = False  # a warning because the entry was measured under another MLX

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status.value, "detail": self.detail,
                "category": self.category.value, "entry": self.entry, "line": self.line,
                "figures": dict(self.figures)}


def exit_code(checks: Sequence[Check], *, strict: bool = False,
              allow_inconclusive: bool = False) -> ExitCode:
    """0 when all pass (warnings too, unless strict); 1 when any check failed."""
    statuses = {c.status for c in checks}
    if Status.FAIL in statuses:
        return ExitCode.CHECK_FAILED
    if Status.INCONCLUSIVE in statuses and not allow_inconclusive:
        return ExitCode.CHECK_FAILED
    if Status.WARN in statuses and strict:
        return ExitCode.CHECK_FAILED
    return ExitCode.OK



def entry_label(i: int, e: Entry) -> str:
    """``entry 3 (line 12)``: how every check names an entry, so one grep finds it in the file."""
    return f"entry {i}" + (f" (line {e.line})" if e.line else "")


def for_device(e: Entry, device: Device) -> tuple[bool, str]:
    """Whether an entry describes this device at all (quantization, kind and pair aside)."""
    why = e.device_mismatch(device)
    if why:
        return False, why
    note = e.match_note(device)
    return True, f"applies to {device.describe()}" + (f" ({note})" if note else "")


def constraints(e: Entry) -> dict[str, Any]:
    """The keys an entry matches on, normalised as the matcher compares them."""
    return dict(e.slot(case_blind=True))


def compatible(a: Entry, b: Entry) -> bool:
    """Some situation matches both: every key both set has the same value."""
    ca, cb = constraints(a), constraints(b)
    return all(ca[k] == cb[k] for k in ca.keys() & cb.keys())


def outcome(e: Entry) -> str:
    if e.auto is not None:
        return f"auto (fixed {e.width} where the width cannot adapt)"
    return "decline" if e.decline else f"width {e.width}"


def duplicate_checks(profile: Profile) -> list[Check]:
    """Entries with the same match keys: the resolver would pick one by date, silently.
    policy.profile refuses two entries in one slot; this also catches device names that
    differ only in case (matched case-blind). A property of the file, so it fails on
    every runner, whichever device it names."""
    groups: dict[tuple, list[int]] = {}
    for i, e in enumerate(profile.entries, 1):
        groups.setdefault(e.slot(case_blind=True), []).append(i)
    out = []
    for idx in (g for g in groups.values() if len(g) > 1):
        es = [profile.entries[i - 1] for i in idx]
        names = ", ".join(entry_label(i, e) for i, e in zip(idx, es))
        out.append(Check(
            f"duplicate match keys: entries {', '.join(map(str, idx))}", Status.FAIL,
            f"{names} have the same match keys ({es[0].describe_keys()}): the resolver would pick "
            f"one silently (the latest measured_at, else the first); keep one", figures={"entries": idx,
                                                          "outcomes": [outcome(e) for e in es]},
            entry=idx[0], line=es[0].line))
    if not out:
        out.append(Check("duplicate match keys", Status.PASS,
                         f"no two of {len(profile.entries)} entries share their match keys"))
    return out


# Shadowing pairs a check reports at most: a file can pair thousands of entries with thousands;
# what is said beyond this is a count.
MAX_SHADOWS = 100


def shadow_pairs(entries: Sequence[tuple[int, Entry]], keep=lambda i, j: True,
                 limit: int | None = None) -> tuple[list[tuple[int, int]], bool]:
    """The (broad, narrow) pairs of ``entries`` (by their 1-based numbers) where some situation
    matches both and the narrow one, more specific, wins there, and ``keep(broad, narrow)``;
    at most ``limit`` of them, and whether there were more. Entries are indexed by the keys
    they set: a broad entry is looked up by the narrow one's values of the keys both set, so
    4,000 entries cost a few lookups each, not 16 million comparisons (which took minutes)."""
    cons = {i: constraints(e) for i, e in entries}
    spec = {i: e.specificity() for i, e in entries}
    by_keys: dict[frozenset, list[int]] = {}
    for i, _ in entries:
        by_keys.setdefault(frozenset(cons[i]), []).append(i)
    out: list[tuple[int, int]] = []
    for broad_keys, broads in by_keys.items():
        for narrow_keys, narrows in by_keys.items():
            shared = sorted(broad_keys & narrow_keys)
            index: dict[tuple, list[int]] = {}
            for i in broads:
                index.setdefault(tuple(cons[i][k] for k in shared), []).append(i)
            for j in narrows:
                for i in index.get(tuple(cons[j][k] for k in shared), ()):
                    if i != j and spec[j] > spec[i] and cons[j] != cons[i] and keep(i, j):
                        if limit is not None and len(out) >= limit:
                            return sorted(out), True
                        out.append((i, j))
    return sorted(out), False


def shadow_checks(profile: Profile, device: Device) -> list[Check]:
    """A more specific entry that overrides a broader one where both match, with another
    width, must say why (a ``note``). Checked among the entries for this device: another
    machine's are its runner's business."""
    mine = [(i, e) for i, e in enumerate(profile.entries, 1) if for_device(e, device)[0]]
    said_of = {i: outcome(e) for i, e in mine}
    out = []
    # agreeing where it wins: nothing hidden
    hidden, more = shadow_pairs(mine, lambda i, j: said_of[i] != said_of[j], MAX_SHADOWS)
    for i, j in hidden:
        broad, narrow = profile.entries[i - 1], profile.entries[j - 1]
        said = narrow.note
        head = (f"{entry_label(j, narrow)}, {outcome(narrow)} for {narrow.describe_keys()}, wins over "
                f"{entry_label(i, broad)}, {outcome(broad)} for {broad.describe_keys()}, wherever both match")
        if said:
            status, detail = Status.PASS, f"{head}; it says why: {said!r}"
        else:
            status, detail = Status.WARN, (f"{head}, and does not say why: add note = \"...\" to "
                                           f"{entry_label(j, narrow)}")
        out.append(Check(f"entry {i}: shadowed by entry {j}", status, detail, Category.ENTRY,
                         figures={"shadowed": i, "by": j, "note": said}, entry=i, line=broad.line))
    if more:
        out.append(Check("shadowing: more", Status.WARN,
                         f"more than {MAX_SHADOWS} pairs of entries where a more specific one wins with "
                         f"another width; the first {MAX_SHADOWS} found are listed: give the narrow "
                         f"ones a note, or fewer overlapping entries", Category.ENTRY))
    if not out:
        out.append(Check("shadowing", Status.PASS,
                         "no entry for this device is overridden by a more specific one with another width"))
    return out



def stale_check(i: int, e: Entry, mlx: str | None) -> Check:
    name = f"entry {i}: mlx version"
    figures = {"entry_mlx": e.mlx, "running_mlx": mlx}
    if not e.mlx:
        return Check(name, Status.WARN, "records no MLX version: cannot tell "
                     "whether it is stale", Category.ENTRY, figures, entry=i, line=e.line)
    if mlx and e.mlx != mlx:
        return Check(name, Status.WARN, f"stale: measured under MLX {e.mlx}, "
                     f"running {mlx} (a failure with --strict; re-measure with sweep --save)",
                     Category.ENTRY, figures, entry=i, line=e.line, stale=True)
    return Check(name, Status.PASS, f"measured under MLX {e.mlx}, as running", Category.ENTRY,
                 figures, entry=i, line=e.line)



@dataclass(frozen=True)
class EntryMark:
    mark: Mark
    why: str


def marks(checks: Sequence[Check], count: int) -> list[EntryMark]:
    """One mark per entry from the checks about it: fail, then skip (another machine's),
    then stale, then warn, else pass."""
    about: dict[int, list[Check]] = {}  # each entry's checks, gathered once (not count x checks)
    for c in checks:
        for i in dict.fromkeys([c.entry, *c.figures.get("entries", ())]):
            if isinstance(i, int):
                about.setdefault(i, []).append(c)
    out = []
    for i in range(1, count + 1):
        mine = about.get(i, [])
        for wanted, test in ((Mark.FAIL, lambda c: c.status is Status.FAIL),
                             (Mark.SKIP, lambda c: c.status is Status.SKIP),
                             (Mark.STALE, lambda c: c.stale),
                             (Mark.WARN, lambda c: c.status is Status.WARN)):
            hit = next((c for c in mine if test(c)), None)
            if hit is not None:
                out.append(EntryMark(wanted, hit.detail))
                break
        else:
            out.append(EntryMark(Mark.PASS, "applies here; record present; measured under this MLX"))
    return out



def measured_status(e: Entry, session: Any) -> tuple[Status, str]:
    """The check's verdict on one entry from a finished A/B session (engine rules:
    a width wins only with disjoint ranges and identical output).

    A session whose classic drifted beyond what noise explains is inconclusive. When the
    engine cannot tell drift from noise (few runs), a disjoint verdict stands: classic
    opens and closes the session, so a steady drift widens classic's range over the
    width's and shows up as overlap (undecided), not as a win or a loss."""
    if session.cancelled:
        return Status.INCONCLUSIVE, "the session was cancelled"
    arms = session.arms
    c = session.classic.decode_range()
    broken = [a for a in arms if a.identity is not None and not a.identity.identical_ids]
    drifted = session.drift and not session.drift_could_be_noise
    noise_note = ""
    if session.drift and not drifted:
        noise_note = (f"; classic's opening and closing runs do not overlap, which noise alone does "
                      f"{session.drift_chance:.0%} of the time at this n: the verdict stands because "
                      f"classic brackets the session")

    def arms_text() -> str:
        return "; ".join(f"{a.name} {a.verdict.value} ({a.why})" for a in arms)

    if e.decline:
        if broken:
            return Status.FAIL, ("identity broke: " + "; ".join(f"{a.name} {a.identity.describe()}" for a in broken))
        if drifted:
            return Status.INCONCLUSIVE, session.drift_why
        winners = [a for a in arms if a.verdict is Verdict.WINS]
        if winners:
            best = max(winners, key=lambda a: a.decode_range().median)
            return Status.FAIL, (f"a declined width now wins clearly: {best.name} {best.why}; the profile "
                                 f"leaves speed on the table (re-measure with sweep --save)")
        open_ = [a for a in arms if a.verdict in (Verdict.UNDECIDED, Verdict.NOT_MEASURED)]
        if open_:
            return Status.INCONCLUSIVE, (f"{', '.join(a.name for a in open_)} not decided: {arms_text()}; "
                                         f"more repetitions (-n) may decide")
        return Status.PASS, f"every declined width still loses to classic ({c.min:.1f}-{c.max:.1f} tok/s): {arms_text()}{noise_note}"

    arm = arms[0]
    expects_identical = e.byte_identical
    if broken and expects_identical:
        return Status.FAIL, f"identity broke: {arm.name} {arm.identity.describe()}; the entry says byte-identical"
    if drifted:
        return Status.INCONCLUSIVE, session.drift_why
    if arm.verdict is Verdict.WINS or (arm.verdict is Verdict.FASTER_DIFFERS and not expects_identical):
        note = "" if expects_identical else "; output differs from classic, as the entry records"
        return Status.PASS, f"{arm.name} still wins: {arm.why}{note}{noise_note}"
    if arm.verdict in (Verdict.SLOWER, Verdict.NO_GAIN):
        return Status.FAIL, f"{arm.name if getattr(arm, 'auto', False) else f'width {arm.width}'} no longer wins: {arm.why}{noise_note}"
    return Status.INCONCLUSIVE, f"{arm.name} {arm.verdict.value}: {arm.why}; more repetitions (-n) may decide"



def device_agrees(named: Device, probed: Device) -> bool:
    """A --device that describes this machine (so measuring here is measuring it): a named
    device has no name, and only a CUDA one a compute capability."""
    return mismatch(probed, named.backend, named.compute_capability, group=named.group) is None
