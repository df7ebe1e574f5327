"""The README as the product's manual: short, its links live, its results table the records'."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from blockwidth.policy.stats import Interval
from tests.conftest import ROOT

README = ROOT / "README.md"
LIMIT = 20_000  # characters: the manual; long accounts go in docs/


def test_the_readme_stays_a_manual_under_its_size_limit():
    """At most ~20k characters: a user looking for how to decide a width, install or
    read the profile format must not dig through a lab notebook; measurement accounts go in
    docs/. A section that pushes it over belongs in a docs/ page with a link here."""
    size = len(README.read_text(encoding="utf-8"))
    assert size <= LIMIT, f"README.md is {size} characters, over {LIMIT}: move detail to docs/"


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in m and not m.startswith("#")]


def test_every_relative_link_in_the_readme_and_docs_points_at_a_file_here():
    """The README links into docs/ and the records; docs/ into each other: a moved page or a
    renamed record must not leave a dead link behind."""
    pages = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "lab" / "evidence" / "README.md"]
    dead = [f"{p.relative_to(ROOT)} -> {link}" for p in pages for link in _links(p)
            if not (p.parent / link.split("#")[0]).exists()]
    assert not dead, dead
    assert {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")} <= set(_links(README))  # each page linked


_WORD = {"wins": "win", "slower": "slower", "undecided": "undecided", "not measured": "not measured"}


def _verdicts(widths: list[dict]) -> str:
    """'all win', or runs of the session's widths by verdict: 'w2-7 slower; w8-16 win'."""
    if len({a["verdict"] for a in widths}) == 1:
        return f"all {_WORD[widths[0]['verdict']]}"
    runs: list[tuple[str, list[int]]] = []
    for a in widths:
        if runs and runs[-1][0] == a["verdict"]:
            runs[-1][1].append(a["width"])
        else:
            runs.append((a["verdict"], [a["width"]]))
    return "; ".join((f"w{ws[0]}" if len(ws) == 1 else f"w{ws[0]}-{ws[-1]}") + f" {_WORD[v]}" for v, ws in runs)


def _widths(ws: list[int]) -> str:
    out: list[list[int]] = []
    for w in ws:
        if out and w == out[-1][-1] + 1:
            out[-1].append(w)
        else:
            out.append([w])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def test_the_readme_results_table_is_what_its_records_hold():
    """Each row of the README's results table against the committed record it links (a folder
    holds one session): the widths swept, classic's median decode tok/s, the fastest width by
    median and its ratio to classic, every width's verdict, and byte-identical output, as the
    table's note says. Speed claims in the manual come from records, not from prose."""
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Results"):]
    rows = re.findall(r"^\| (CPU|H200) \| ([^|]+) \| ([^|]+) \| ([\d.]+) \| w(\d+) ([\d.]+) \| ([\d.]+)x \| "
                      r"([^|]+) \| \[\w+\]\(([^)]+)\) \|$", table, re.M)
    assert len(rows) == 4, rows  # the rows built here (the real models' table is checked below)
    backends = set()
    for where, _pair, widths, classic_med, best_w, best_med, ratio, verdicts, link in rows:
        path = ROOT / link
        if path.is_dir():
            found = sorted(path.glob("*.json"))
            assert len(found) == 1, link
            path = found[0]
        rec = json.loads(path.read_text())
        backends.add(rec["host"]["device"]["backend"])
        assert rec["host"]["device"]["backend"] == {"CPU": "cpu", "H200": "cuda"}[where], link
        if where == "H200":
            assert rec["host"]["device"]["name"] == "NVIDIA H200", link
        arms = [a for a in rec["arms"] if a["width"]]
        classic = next(a for a in rec["arms"] if a["width"] is None)["decode_tok_s"][1]
        best = max(arms, key=lambda a: a["decode_tok_s"][1])
        assert widths == _widths([a["width"] for a in arms]), link
        assert float(classic_med) == round(classic, 1), link
        assert int(best_w) == best["width"] and float(best_med) == round(best["decode_tok_s"][1], 1), link
        assert float(ratio) == round(best["decode_tok_s"][1] / classic, 2), link
        assert verdicts == _verdicts(arms), link
        assert all(a["identity"]["identical_bytes"] for a in arms), link
        assert rec["host"]["mlx"] == "0.32.4", link
    assert backends == {"cpu", "cuda"}


def test_the_real_models_results_are_what_their_records_hold():
    """The real models' rows against their records: every request's text identical to classic's,
    the width's acceptance, its speed-up and 95 % interval, its verdict; a session cut short says
    so and claims no speed."""
    text = README.read_text(encoding="utf-8")
    table = text[text.index("## Results"):text.index("**Built here**")]
    rows = re.findall(r"^\| (CPU|H200|H100) \| ([^|]+) \| ([^|]+) \| all \| (?:w(\d+) ([\d.]+)|-) \| ([^|]+) \| "
                      r"([^|]+) \| \[record\]\(([^)]+)\) \|$", table, re.M)
    assert len(rows) == 9, rows
    for where, _pair, requests, width, acceptance, speedup, verdict, link in rows:
        path = ROOT / link
        rec = json.loads(gzip.decompress(path.read_bytes()) if link.endswith(".gz") else path.read_text())
        if "levels" in rec:  # the served A/B: one level per concurrency; the server reports no acceptance
            clients = int(re.search(r"(\d+) clients?", requests)[1])
            rec = next(level for level in rec["levels"] if level["concurrency"] == clients)
            width = re.match(r"w(\d+)", speedup.strip())[1]
            assert not acceptance and rec["arms"][1]["acceptance"] is None, link
            acceptance = None
        assert rec["host"]["device"]["backend"] == {"CPU": "cpu", "H200": "cuda", "H100": "cuda"}[where], link
        assert where == "CPU" or where in rec["host"]["device"]["name"], link
        arm = next(a for a in rec["arms"] if a["width"] == int(width))
        per_request = [a for r in (rec.get("requests") or [{"arms": rec["arms"]}]) for a in r["arms"]
                       if a["width"] and a["samples"]]
        assert per_request and all(a["identity"]["identical_ids"] for a in per_request), link
        if rec["cancelled"]:  # cut short: identity and acceptance of what ran, no speed
            assert speedup.strip() == verdict.strip() == "-", link
            accepted = [s["acceptance"] for r in rec["requests"] for a in r["arms"] if a["width"] == int(width)
                        for s in a["samples"]]
            assert float(acceptance) == round(max(accepted), 2), link
            continue
        assert acceptance is None or float(acceptance) == round(arm["acceptance"], 2), link
        m = re.fullmatch(r"w\d+ ([\d.]+)x \[([\d.]+), ([\d.]+)\]", speedup.strip())
        assert m and float(m[1]) == round(arm["ratio"], 2), link
        # printed as the console prints it: rounded outwards (stats.Interval.shown)
        assert (m[2], m[3]) == Interval(*arm["ratio_ci"]).shown(), link
        assert verdict.strip() == arm["verdict"], link
