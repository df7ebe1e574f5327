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
