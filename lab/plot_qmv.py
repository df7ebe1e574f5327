"""The qmv kernel's H200 figures, read from lab.probe_qmv's committed records: docs/qmv.md's tables
and its plot (an SVG of the verify's ms by rows, stock against qmv).

    python -m lab.plot_qmv                  (prints the tables docs/qmv.md holds)
    python -m lab.plot_qmv --svg docs/qmv-curves.svg

- the qmv kernel's acceptance line (docs/qmv.md): on the 8B-shaped 4-bit random target, a verify of 2-8 rows
  at most 1.3x the stock 1-row forward (wall clock, cold, as decoding sees it): per pass, each
  arm's worst cold median at 2-8 rows over that pass's stock 1-row cold median;
- the kernel's bandwidth from the Nsight Compute record: bytes read per call (the 4-bit codes,
  the bfloat16 scales and biases) over the device time per call.

Pure reading and arithmetic (no MLX): the tests regenerate the tables and the SVG and compare.
The SVG is written by hand, a dozen shapes, so it is the same bytes on every machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CURVES = ROOT / "lab" / "evidence" / "h200-2026-12-01" / "qmv" / "curves" / "probe_qmv.json"
NCU = ROOT / "lab" / "evidence" / "h200-2026-12-01" / "qmv" / "ncu.json"
SVG = ROOT / "docs" / "qmv-curves.svg"
ROWS = tuple(range(2, 9))  # what the kernel serves
LIMIT = 1.3  # the acceptance: at most 1.3x the stock 1-row forward
COPY_TBPS = 4.3  # the H200's device-to-device copy, bytes read and written (KINDS.md, 2026-10-28/11-04)
ARMS = ("stock", "qmv-compile", "qmv-direct")


def passes(rec: dict, key: str = "curves") -> list[dict[str, dict[int, dict]]]:
    """Per pass: {arm: {rows: point}} (point: median_ms = cold, warm_ms, first_ms, min/max)."""
    out = []
    for p in rec[key]["passes"]:
        out.append({arm: {pt["rows"]: pt for pt in c["points"]} for arm, c in p["curves"].items()})
    return out


def acceptance(rec: dict, key: str = "curves") -> list[dict]:
    """Per pass and arm: the worst 2-8-row cold median over the pass's stock 1-row cold median
    (and the same for the warm medians), with the row count where it is worst."""
    out = []
    for i, p in enumerate(passes(rec, key)):
        one = p["stock"][1]
        for arm in (a for a in ARMS if a in p):
            cold = {r: p[arm][r]["median_ms"] / one["median_ms"] for r in ROWS}
            warm = {r: p[arm][r]["warm_ms"] / one["warm_ms"] for r in ROWS}
            worst = max(cold, key=cold.get)
            out.append({"pass": i, "arm": arm, "stock_1row_ms": one["median_ms"],
                        "ms": [p[arm][r]["median_ms"] for r in ROWS], "worst_rows": worst,
                        "worst": cold[worst], "best": min(cold.values()), "warm_worst": max(warm.values()),
                        "met": cold[worst] <= LIMIT})
    return out


def acceptance_table(rec: dict, key: str = "curves") -> str:
    head = ("| pass | arm | stock 1 row (ms) | " + " | ".join(f"{r} rows" for r in ROWS)
            + " | worst / stock 1 row | warm worst | <= 1.3x |")
    lines = [head, "|" + "---|" * (len(ROWS) + 6)]
    for a in acceptance(rec, key):
        lines.append(f"| {a['pass']} | {a['arm']} | {a['stock_1row_ms']:.2f} | "
                     + " | ".join(f"{v:.2f}" for v in a["ms"])
                     + f" | **{a['worst']:.2f}x** ({a['worst_rows']} rows) | {a['warm_worst']:.2f}x | "
                     + ("yes" if a["met"] else "no") + " |")
    return "\n".join(lines)


def bytes_read(n: int, k: int) -> int:
    """A 4-bit group-64 projection's bytes: the codes (k / 2 a row) and a bfloat16 scale and
    bias per 64 inputs (what lab.probe_qmv ncu-parse divides by)."""
    return n * k // 2 + 4 * n * (k // 64)


def bandwidth(ncu: dict) -> list[dict]:
    """Per projection and rows: stock's and the kernel's device us per call and GB/s read."""
    dev = ncu["device"]
    out = []
    shapes = sorted({lab.split("/")[0] for lab in dev}, key=lambda s: (-bytes_read(*map(int, s.split("x"))), s))
    for shape in shapes:
        n, k = map(int, shape.split("x"))
        for rows in (1, 2, 4, 8):
            st, qv = dev[f"{shape}/r{rows}/stock"], dev[f"{shape}/r{rows}/qmv"]
            b = bytes_read(n, k)
            out.append({"shape": shape, "rows": rows, "stock_us": st["device_us"], "qmv_us": qv["device_us"],
                        "stock_GBps": b / st["device_us"] / 1e3, "qmv_GBps": b / qv["device_us"] / 1e3,
                        "stock_kernel": st["kernels"][0].split("<")[0].replace("void ", ""),
                        "of_copy": b / qv["device_us"] / 1e3 / (COPY_TBPS * 1e3)})
    return out


def bandwidth_table(ncu: dict) -> str:
    lines = ["| projection (N x K) | rows | stock us (kernel) | qmv us | qmv GB/s | of 4.3 TB/s | stock GB/s |",
             "|---|---|---|---|---|---|---|"]
    for b in bandwidth(ncu):
        lines.append(f"| {b['shape'].replace('x', ' x ')} | {b['rows']} | {b['stock_us']:.1f} ({b['stock_kernel']}) | "
                     f"{b['qmv_us']:.1f} | {b['qmv_GBps']:.0f} | {100 * b['of_copy']:.0f} % | {b['stock_GBps']:.0f} |")
    return "\n".join(lines)


# --- the plot ---------------------------------------------------------------------------------
W, H = 700, 400
L, R, T, B = 58, 190, 40, 48  # margins: the legend sits right of the plot
COLORS = {"stock": "#555555", "qmv-compile": "#1f6fb4", "qmv-direct": "#e07b10"}
LABELS = {"stock": "stock (MLX qmv, then qmm)", "qmv-compile": "qmv, mx.compile (default)",
          "qmv-direct": "qmv, direct call"}


def svg(rec: dict, key: str = "curves") -> str:
    """ms by rows, 1-16: per arm the median of the passes' cold medians (line) and their range
    across passes (band); the dashed line is 1.3x the stock 1-row forward (median of passes)."""
    ps = passes(rec, key)
    rows = sorted(ps[0]["stock"])
    ymax = 5 * (int(max(pt["median_ms"] for p in ps for c in p.values() for pt in c.values()) / 5) + 1)
    x0, x1, y0, y1 = L, W - R, H - B, T

    def X(r):
        return x0 + (r - rows[0]) * (x1 - x0) / (rows[-1] - rows[0])

    def Y(ms):
        return y0 - ms * (y0 - y1) / ymax

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="Helvetica, Arial, sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
           f'<text x="{L}" y="22" font-size="14" font-weight="bold">8B-shaped 4-bit verify on the H200: ms by rows '
           f'(wall clock, cold, {len(ps)} passes)</text>',
           f'<rect x="{X(ROWS[0]):.1f}" y="{y1}" width="{X(ROWS[-1]) - X(ROWS[0]):.1f}" height="{y0 - y1}" '
           'fill="#f1f5fa"/>']
    for ms in range(0, ymax + 1, 5):
        out.append(f'<line x1="{x0}" y1="{Y(ms):.1f}" x2="{x1}" y2="{Y(ms):.1f}" stroke="#dddddd"/>')
        out.append(f'<text x="{x0 - 8}" y="{Y(ms) + 4:.1f}" text-anchor="end">{ms}</text>')
    for r in rows:
        out.append(f'<text x="{X(r):.1f}" y="{y0 + 18}" text-anchor="middle">{r}</text>')
    out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{H - 10}" text-anchor="middle">rows in the verify forward '
               '(the kernel serves 2-8, shaded)</text>')
    out.append(f'<text x="16" y="{(y0 + y1) / 2:.1f}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(y0 + y1) / 2:.1f})">ms per forward</text>')
    one = statistics.median(p["stock"][1]["median_ms"] for p in ps)
    out.append(f'<line x1="{x0}" y1="{Y(LIMIT * one):.1f}" x2="{x1}" y2="{Y(LIMIT * one):.1f}" stroke="#c0392b" '
               'stroke-dasharray="6 4"/>')
    out.append(f'<text x="{x1 - 4}" y="{Y(LIMIT * one) - 5:.1f}" text-anchor="end" fill="#c0392b">'
               f'1.3x stock 1 row ({LIMIT * one:.1f} ms)</text>')
    for arm in (a for a in ARMS if a in ps[0]):
        per = {r: [p[arm][r]["median_ms"] for p in ps] for r in rows}
        band = [(X(r), Y(max(per[r]))) for r in rows] + [(X(r), Y(min(per[r]))) for r in reversed(rows)]
        out.append('<polygon points="' + " ".join(f"{a:.1f},{b:.1f}" for a, b in band)
                   + f'" fill="{COLORS[arm]}" fill-opacity="0.18" stroke="none"/>')
        line = " ".join(f"{X(r):.1f},{Y(statistics.median(per[r])):.1f}" for r in rows)
        out.append(f'<polyline points="{line}" fill="none" stroke="{COLORS[arm]}" stroke-width="2"/>')
    out.append(f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="none" stroke="#888888"/>')
    ly = y1 + 8
    for arm in (a for a in ARMS if a in ps[0]):
        out.append(f'<line x1="{x1 + 12}" y1="{ly + 6}" x2="{x1 + 34}" y2="{ly + 6}" stroke="{COLORS[arm]}" '
                   'stroke-width="2"/>')
        words = LABELS[arm].split(", ")
        for j, w in enumerate(words):
            out.append(f'<text x="{x1 + 40}" y="{ly + 10 + 14 * j}">{w}{"," if j + 1 < len(words) else ""}</text>')
        ly += 14 * len(words) + 12
    out.append(f'<text x="{x1 + 12}" y="{ly + 10}" fill="#666666">line: median of</text>')
    out.append(f'<text x="{x1 + 12}" y="{ly + 24}" fill="#666666">the passes; band:</text>')
    out.append(f'<text x="{x1 + 12}" y="{ly + 38}" fill="#666666">their range</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", type=Path, default=CURVES, help="lab.probe_qmv's record with cost curves")
    ap.add_argument("--ncu", type=Path, default=NCU, help="lab.probe_qmv ncu-parse's output")
    ap.add_argument("--svg", type=Path, help="write the plot here (docs/qmv-curves.svg)")
    args = ap.parse_args(argv)
    try:
        rec = json.loads(args.record.read_text())
        ncu = json.loads(args.ncu.read_text())
        passes(rec)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"plot_qmv: {args.record} / {args.ncu}: not lab.probe_qmv records with curves ({e})", file=sys.stderr)
        return 2
    if args.svg:
        args.svg.write_text(svg(rec))
        print(f"wrote {args.svg}")
        return 0
    print(acceptance_table(rec), end="\n\n")
    if "curves_8bit" in rec:
        print(acceptance_table(rec, "curves_8bit"), end="\n\n")
    print(bandwidth_table(ncu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
