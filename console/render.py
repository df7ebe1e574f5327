"""Text pictures shared by the CLI and the app: bar plots and the arm table."""

from __future__ import annotations

BAR = 40


def bars(rows: list[tuple[str, float, float, float, str]], unit: str) -> list[str]:
    """A horizontal plot: label, min, median, max, note. '=' up to the min, '#' on to the
    median, '-' out to the max. The median's cell is always '#', even when min ≈ median."""
    top = max((r[3] for r in rows), default=1.0) or 1.0
    out = []
    for label, lo, med, hi, note in rows:
        a, m, b = (int(round(v / top * BAR)) for v in (lo, med, hi))
        m = max(m, 1)
        a = min(a, m - 1)  # leave the median's own cell as '#'
        bar = "=" * a + "#" * (m - a) + "-" * max(b - m, 0)
        out.append(f"{label:<9}|{bar:<{BAR}}| {med:8.1f} {unit} {note}")
    return out


def arm_rows(session) -> list[tuple[str, float, float, float, str]]:
    """Plot rows for a session: every arm with runs, its decode tok/s range and verdict."""
    from policy.verdict import Verdict

    out = []
    for a in [session.classic, *session.arms]:
        r = a.decode_range()
        if r is None:
            continue
        note = "" if a.verdict in (Verdict.CONTROL, Verdict.UNDECIDED) else a.verdict.value
        out.append((a.name, r.min, r.median, r.max, note))
    return out


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
        out.append(f"  ... and {len(runs) - limit} more runs (the record keeps every round's width)")
    return out


def auto_lines(session) -> list[str]:
    """What the auto arm did, for sweep and the console: its widths by round per run, and the
    controller it ran with (its widest width, pooled acceptance, best fixed width there)."""
    arm = next((a for a in session.arms if getattr(a, "auto", False)), None)
    c = getattr(session, "auto", None)
    if arm is None or c is None or not arm.runs:
        return []
    runs = [(f"run {i + 1}", r.widths or [], (r.auto or {}).get("probes", [])) for i, r in enumerate(arm.runs)]
    cap = c.params.max_width
    out = ["", *trajectory_lines(runs, cap)]
    out.append(f"auto controller: widths 1..{cap}, pooled acceptance {c.acceptance():.2f}, its best "
               f"fixed width there {c.static_width()}; the record replays every round's width")
    return out
