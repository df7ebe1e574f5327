"""Text pictures shared by the CLI and the app: bar plots and the arm table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BAR = 36  # with a label, the figure and "below min gain", a line fits 80 columns


def bars(rows: list[tuple[str, float, float, float, str]], unit: str, digits: int = 1,
         columns: int | None = None) -> list[str]:
    """A horizontal plot: label, min, median, max, note. '=' up to the min, '#' on to the
    median, '-' out to the max. The median's cell is always '#', even when min ≈ median.
    With ``columns``, the bar narrows (to 12 cells at least) so the longest line, note and all,
    fits that many columns: the console's plot at 80 columns has less than 80 (its padding)."""
    top = max((r[3] for r in rows), default=1.0) or 1.0
    cells = BAR
    if columns is not None and rows:
        # label 9, two '|', ' ', the figure 7, ' ', the unit, ' ', the note
        fixed = 9 + 2 + 1 + 7 + 1 + len(unit) + 1 + max(len(r[4]) for r in rows)
        cells = max(12, min(BAR, columns - fixed))
    out = []
    for label, lo, med, hi, note in rows:
        a, m, b = (int(round(v / top * cells)) for v in (lo, med, hi))
        m = max(m, 1)
        a = min(a, m - 1)  # leave the median's own cell as '#'
        bar = "=" * a + "#" * (m - a) + "-" * max(b - m, 0)
        out.append(f"{label:<9}|{bar:<{cells}}| {med:7.{digits}f} {unit} {note}".rstrip())
    return out


def arm_rows(session) -> list[tuple[str, float, float, float, str]]:
    """Plot rows for a session: every arm with runs, its decode tok/s range and verdict."""
    from blockwidth.policy.verdict import Verdict

    out = []
    for a in [session.classic, *session.arms]:
        r = a.decode_range()
        if r is None:
            continue
        note = "" if a.verdict in (Verdict.CONTROL, Verdict.UNDECIDED) else a.verdict.value
        out.append((a.name, r.min, r.median, r.max, note))
    return out


@dataclass(frozen=True)
class ArmRow:
    """One row of the arms table: what the console's table and sweep's print both show."""

    name: str
    width: int | None
    decode: Any  # policy.verdict.Range of decode tok/s
    e2e: Any  # the same, end to end
    acceptance: str  # "0.812", or "-" where nothing was drafted
    identity: str  # "identical", "differs @ 5", or "-" (classic)
    verdict: Any  # policy.verdict.Verdict


def arm_table(session) -> list[ArmRow]:
    """Every arm that ran, classic first, in the words both front ends use."""
    out = []
    stock = getattr(session, "stock", None)  # classic on stock kernels, beside the exact path
    for arm in [session.classic, *([stock] if stock is not None else []), *session.arms]:
        d, e = arm.decode_range(), arm.e2e_range()
        if d is None:
            continue
        acc = f"{arm.acceptance:.3f}" if arm.acceptance is not None else "-"
        ident = "-" if arm.identity is None else (
            "identical" if arm.identity.identical_ids else f"differs @ {arm.identity.first_divergence}")
        out.append(ArmRow(arm.name, arm.width, d, e, acc, ident, arm.verdict))
    return out


def speedup_lines(session) -> list[str]:
    """Each width's speed-up with its interval and p-value, and the rule it was judged by."""
    if not session.estimates:
        return []
    c = session.config
    drawn, unit = ("runs", "runs") if session.single else ("requests, then runs", "passes")
    from blockwidth.policy.stats import ALPHA

    control = "classic" if getattr(session, "baseline", "classic") == "classic" else \
        "classic on stock kernels (faster than classic on the exact path)"
    out = ["", f"speed-up over {control} (total new tokens / total decode time); 95 % bootstrap interval "
           f"resampling {drawn}, seed {session.seed}; one-sided permutation p of the {unit}; a win's "
           f"interval clears {1 + c.min_gain:.2f}, its p is below {ALPHA:g}"
           + (" and its ranges are disjoint" if session.single else "") + ":"]
    for a in session.arms:
        e = session.estimates.get(a.width)
        if e is None:
            continue
        mark = "  <- chosen" if session.recommendation == a.width else (
            "  (fastest)" if session.choice and session.choice.best == a.width else "")
        out.append(f"  {a.name:<5} {e.ratio:6.2f}x  [{', '.join(e.ci.shown())}]  p {e.p:<8.2g} "
                   f"{a.verdict.value}{mark}")
    return out


def request_table(session, fold: int | None = None) -> list[str]:
    """Per request: its prompt tokens, classic's decode tok/s, each width's speed-up on it, the
    best width there (fastest with classic's output) and that width's acceptance. ``fold``: keep
    that many worst and best requests (by the chosen, else the first, width's speed-up)."""
    reqs = list(session.requests)
    widths = [a.width for a in session.arms]
    key_w = session.recommendation or (widths[0] if widths else None)
    note = ""
    if fold is not None and len(reqs) > 2 * fold and key_w is not None:
        ranked = sorted(reqs, key=lambda r: (r.ratio(key_w) or 0.0))
        keep = {id(r) for r in ranked[:fold] + ranked[-fold:]}
        more = len(reqs) - 2 * fold
        note = (f"  ({more} more request{'' if more == 1 else 's'} between the {fold} worst and {fold} "
                f"best by w{key_w}; all in the record)")
        reqs = [r for r in reqs if id(r) in keep]
    head = f"{'request':<14} {'prompt':>6} {'classic':>7} " + " ".join(f"{a.name:>6}" for a in session.arms)
    out = ["", "per request (prompt tokens; classic decode tok/s; each width's speed-up there):",
           head + f" {'best':>7} {'accept':>6}"]
    for r in reqs:
        c = r.classic.decode_range()
        cells = []
        for w in widths:
            x = r.ratio(w)
            ident = r.arm(w).identity
            cells.append(f"{'-' if x is None else f'{x:.2f}' + ('!' if ident and not ident.identical_ids else 'x'):>6}")
        best = r.best()
        acc = r.arm(best).acceptance if best is not None else None
        # a request the session stopped before measuring on every arm has no best (not "classic")
        named = f"w{best}" if best else "classic" if r.measured else "-"
        out.append(f"{r.id[:14]:<14} {len(r.prepared.ids):>6} {f'{c.median:7.1f}' if c else '      -'} "
                   + " ".join(cells) + f" {named:>7} {f'{acc:.2f}' if acc is not None else '-':>6}")
    if any(r.arm(w).identity and not r.arm(w).identity.identical_ids for r in session.requests for w in widths):
        out.append("  ! output differs from classic's on that request")
    if note:
        out.append(note)
    measured = [r for r in session.requests if r.measured]
    spread = [r.best() for r in measured]
    counts = {w: spread.count(w) for w in [*widths, None] if spread.count(w)}
    unrun = len(session.requests) - len(measured)
    said = ", ".join(f"{'classic' if w is None else f'w{w}'} on {k}" for w, k in counts.items())
    if unrun:
        said = (said + "; " if said else "") + (f"{unrun} request{'' if unrun == 1 else 's'} not measured on "
                                                f"every arm (cancelled): no best there")
    out.append("best width per request: " + said)
    return out


def class_lines(session, narrow: bool = False) -> list[str]:
    """Each class of request's speed-up by width with its own 95 % interval (a workload whose
    requests carry classes): which kind of traffic a width serves, for a workload of its own.
    ``narrow`` (the console): a width a line, so that 80 columns hold them."""
    by_class = session.by_class
    if not by_class:
        return []
    out = ["", "by class of request (each its own interval, not a verdict):"]
    for group, (ids, est) in by_class.items():
        n = len(ids)
        each = [f"{f'w{w}' if isinstance(w, int) else w} {e.ratio:.2f}x [{', '.join(e.ci.shown())}]"
                for w, e in est.items()]
        head = f"  {group} ({n} request{'' if n == 1 else 's'}): "
        if narrow:
            out += [(head if i == 0 else " " * 4) + w for i, w in enumerate(each)]
        else:
            out.append(head + ", ".join(each))
    return out


def ratio_rows(session) -> list[tuple[str, float, float, float, str]]:
    """Plot rows: each width's per-request speed-ups (min, median, max over the requests)."""
    import statistics

    rows = []
    for a in session.arms:
        got = [x for r in session.requests if (x := r.ratio(a.width)) is not None]
        if got:
            measured = [r for r in session.requests if r.measured]
            wins = sum(1 for r in measured if r.best() == a.width)
            # the value shown is the median request's speed-up, not the verdict's ratio (all
            # tokens over all decode time): a tryout read 0.91x here beside w2 0.80x above
            # (the legend says so; here, at 80 columns, the line's end was cut)
            # "best on 0" read as a value (a tryout): a count of requests, out of how many
            # auto is not among a request's best (it is measured against them): no count for it
            note = "" if getattr(a, "auto", False) else f"best on {wins}/{len(measured)} requests"
            rows.append((a.name, min(got), statistics.median(got), max(got), note))
    return rows
_LEVELS = "▁▂▃▄▅▆▇█"


def trajectory(widths: list[int], probes: list[int] = (), cap: int | None = None,
               cells: int = BAR) -> str:
    """An auto run's width by round as one line of ``cells`` characters: block height is the
    width (1 lowest, ``cap`` full), a round probed at a width is ``p``. More rounds than cells
    are folded: each cell shows its rounds' widest (a probe shows where it fell)."""
    if not widths:
        return ""
    top = max(cap or 0, *widths, 2)
    per = max(1, -(-len(widths) // cells))  # rounds per cell, rounded up
    out = []
    marked = set(probes)
    for i in range(0, len(widths), per):
        chunk = widths[i:i + per]
        if any(j in marked for j in range(i, i + len(chunk))):
            out.append("p")
            continue
        w = max(chunk)
        out.append(_LEVELS[min(len(_LEVELS) - 1, (w - 1) * (len(_LEVELS) - 1) // (top - 1))])
    return "".join(out)


def runs_of(widths: list[int]) -> str:
    """The widths as runs, ``3x5 8x12 1x7``: what the line above draws, in numbers."""
    out, i = [], 0
    while i < len(widths):
        j = i
        while j < len(widths) and widths[j] == widths[i]:
            j += 1
        out.append(f"{widths[i]}x{j - i}")
        i = j
    return " ".join(out)


def trajectory_lines(runs: list[tuple[str, list[int], list[int]]], cap: int | None = None,
                     limit: int = 6) -> list[str]:
    """The auto arm's widths by round, one line per run (label, widths, probe rounds), at most
    ``limit`` of them, each with its runs in numbers cut to the line."""
    if not runs:
        return []
    out = [f"auto width by round (block height: 1 up to {cap or max(max(w) for _, w, _ in runs if w)}; p: probe)"]
    for label, widths, probes in runs[:limit]:
        text = runs_of(widths)
        if len(text) > 30:
            text = text[:27] + "..."
        out.append(f"{label:<9}|{trajectory(widths, probes, cap):<{BAR}}| {text}")
    if len(runs) > limit:
        out.append(f"  ... and {len(runs) - limit} more (the record keeps every run's width by round)")
    return out


def auto_lines(session) -> list[str]:
    """What the auto arm did, for sweep and the console: its widths by round (each run of a
    single prompt; a workload's requests, their first run each), and the controller it ran
    with (its widest width, pooled acceptance, best fixed width there)."""
    c = getattr(session, "auto", None)
    reqs = getattr(session, "per_request", None) or []
    if c is None or not reqs:
        return []
    runs = []
    for req in reqs:
        arm = next((a for a in req.arms if getattr(a, "auto", False)), None)
        got = arm.runs if arm is not None else []
        if len(reqs) > 1:
            got = got[:1]
        for i, r in enumerate(got):
            label = f"run {i + 1}" if len(reqs) == 1 else req.id[:8]
            runs.append((label, r.widths or [], (r.auto or {}).get("probes", [])))
    if not runs:
        return []
    cap = c.params.max_width
    out = ["", *trajectory_lines(runs, cap, limit=6 if len(reqs) == 1 else 8)]
    out.append(f"auto controller: widths 1..{cap}, pooled acceptance {c.acceptance():.2f}, its best "
               f"fixed width there {c.static_width()}; the record replays every round's width")
    return out + oracle_lines(session)


def oracle_lines(session) -> list[str]:
    """auto against hindsight: its share of the per-request oracle and of the best fixed arm."""
    s = getattr(session, "oracle", None)
    if s is None:
        return []
    name = (lambda k: "classic" if k is None else f"w{k}")
    picks = {}
    for k in s.picks:
        picks[name(k)] = picks.get(name(k), 0) + 1
    return [f"auto against hindsight ({s.requests} request{'' if s.requests == 1 else 's'}, seed {s.seed}):",
            f"  {s.of_oracle:.1%} of the per-request oracle ({s.oracle_tok_s:.1f} tok/s; 95 % CI "
            f"{s.of_oracle_ci.lo:.1%}-{s.of_oracle_ci.hi:.1%}); the oracle took "
            + ", ".join(f"{k} on {v}" for k, v in picks.items()),
            f"  {s.of_best:.1%} of the best single fixed arm, {name(s.best_fixed)} ({s.best_fixed_tok_s:.1f} "
            f"tok/s; 95 % CI {s.of_best_ci.lo:.1%}-{s.of_best_ci.hi:.1%}); auto {s.auto_tok_s:.1f} tok/s"]
