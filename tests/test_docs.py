"""The docs say what the code does: every module is listed in docs/layout.md, and each default
the README and docs/ quote is read here from the code that sets it, so a default that moves fails
this test until the pages move with it (docs/console.md said 12 reps / 60 s for years of 6 / 180)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("console", "engine", "policy")


def _page(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _flat(name: str) -> str:
    """A page with its line breaks and runs of spaces as one space: prose wraps anywhere."""
    return " ".join(_page(name).split())


def _quoted(name: str, pattern: str) -> list[tuple[str, ...]]:
    found = [m if isinstance(m, tuple) else (m,) for m in re.findall(pattern, _flat(name))]
    assert found, f"{name} no longer quotes this in the form {pattern!r}: change the pattern with the page"
    return found


# ---- the module list ------------------------------------------------------------------------------

def _modules() -> set[str]:
    """Every module of the installed package, as the repository lays it out: a package as its
    folder (``console/widgets/``), every other module as its file."""
    out = set()
    for top in PACKAGES:
        for f in (ROOT / top).rglob("*.py"):
            rel = f.relative_to(ROOT).as_posix()
            out.add(rel[: -len("__init__.py")] if f.name == "__init__.py" else rel)
    return out


def test_the_layout_page_lists_every_module_and_only_those():
    listed = re.findall(r"(?m)^- `([\w/.]+)` ", _page("docs/layout.md"))
    assert len(listed) == len(set(listed)), sorted(x for x in listed if listed.count(x) > 1)
    modules = _modules()
    assert len(modules) > 60  # the walk found the tree, not an empty folder
    assert not modules - set(listed), f"not in docs/layout.md: {sorted(modules - set(listed))}"
    assert not set(listed) - modules, f"in docs/layout.md but not in the tree: {sorted(set(listed) - modules)}"
    assert "Every module: [docs/layout.md](docs/layout.md)" in _flat("README.md")  # what the README promises


# ---- the defaults the pages quote -------------------------------------------------------------------

def test_the_console_s_first_session_and_its_budget_are_the_console_s():
    from blockwidth.console.state import BUDGET_REPS, BUDGET_S, FIRST_N, FIRST_TOKENS

    first = (str(FIRST_N), str(FIRST_TOKENS), str(BUDGET_REPS), f"{BUDGET_S:g}")
    for found in _quoted("README.md", r"`n` (\d+) \(the fewest that can win\), `tokens` (\d+), `sequential`\s+"
                                      r"and its budget `reps` / `secs` \((\d+), (\d+) s"):
        assert found == first
    for found in _quoted("docs/console.md", r"until every arm is decided, at most (\d+) or (\d+) s"):
        assert found == first[2:]


def _default(command: str, dest: str):
    from blockwidth.console.cli import build_parser

    return build_parser().commands[command].declared[dest].default


def test_the_cli_synopsis_defaults_are_the_parser_s():
    from blockwidth.console.check import MeasureOptions

    n, tokens = str(_default("sweep", "n")), str(_default("sweep", "max_tokens"))
    widths = _default("sweep", "widths")
    for page in ("README.md", "docs/cli.md"):
        # within the synopsis's code block (no backquote): --widths may show auto added, or after a |
        for found in _quoted(page, r"blockwidth sweep [^`]*?\[--widths (?:auto,)?([\d,]+)[^\]]*\][^`]*? "
                                   r"\[-n (\d+)\] \[--max-tokens (\d+)\]"):
            assert found == (widths, n, tokens), page
        assert _quoted(page, r"\[--rows ([\d,-]+)\] \[--context (\d+)\]") == [
            (_default("costcurve", "rows"), str(_default("costcurve", "context")))], page
    assert _quoted("docs/cli.md", r"\[--context \d+\] \[--repeats (\d+)\]") == [(str(_default("costcurve", "repeats")),)]
    assert _quoted("docs/cli.md", r"\[--sequential --max-reps (\d+) --max-seconds (\d+)\]") == [
        (str(_default("sweep", "max_reps")), f"{_default('sweep', 'max_seconds'):g}")]
    assert _quoted("docs/cli.md", r"\[--min-gain (\d+)%\]") == [(f"{_default('sweep', 'min_gain') * 100:g}",)]
    measure = MeasureOptions()
    assert _quoted("docs/cli.md", r"--measure \[-n (\d+)\] \[--max-tokens (\d+)\]") == [
        (str(measure.n), str(measure.max_tokens))]
    assert _quoted("README.md", r"n repetitions per arm \(default (\d+)\)") == [(n,)]
    assert _quoted("README.md", r"`--measure`\*\*: a short A/B \(n = (\d+), (\d+) tokens\)") == [
        (str(measure.n), str(measure.max_tokens))]
    assert _quoted("README.md", r"1 \+ `--min-gain` \((\d+) %\)") == [(f"{_default('sweep', 'min_gain') * 100:g}",)]


def test_the_width_range_is_the_resolver_s():
    from blockwidth.policy.profile import MAX_WIDTH, MIN_WIDTH

    for page, pattern in (("README.md", r"not an integer, below (\d+) or above (\d+) is an error"),
                          ("docs/cli.md", r"not an integer, below (\d+), above (\d+)\) is an error")):
        assert _quoted(page, pattern) == [(str(MIN_WIDTH), str(MAX_WIDTH))], page


def _item(page: str, start: str, end: str) -> str:
    text = _flat(page)
    i = text.index(start)
    return text[i:text.index(end, i + len(start))]


@pytest.mark.parametrize("page", ["README.md", "docs/cli.md"])
def test_the_measured_defaults_and_the_per_kind_constants_are_the_table_s(page):
    """The precedence list's rows 4 and 5: each measured row's width (or classic) in the table's
    order, and each kind's constant."""
    from blockwidth.policy.table import KIND_FALLBACK, TABLE

    rows = _item(page, "4. the built-in measured default", "5. the per-kind")
    assert re.findall(r"→ (\d+|classic)", rows) == [str(r.width) if r.width else "classic" for r in TABLE], rows
    fallback = _item(page, "5. the per-kind", ".")
    said, pending = {}, []
    for kind, number in re.findall(r"`(\w+)`|(?<![\w.])(\d+)(?![\w.])", fallback):
        if kind:
            pending.append(kind)
        elif pending:  # a number after kind names is theirs; one in a remark ("3 drafted tokens") is not
            said.update(dict.fromkeys(pending, int(number)))
            pending = []
    assert said == {k.value: v for k, v in KIND_FALLBACK.items()}, fallback


# ---- what the pages point at --------------------------------------------------------------------------

def _texts() -> list[Path]:
    """The prose and code a reader of this repository reads (the evidence folders are records,
    kept as they came back)."""
    out = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for top in (*PACKAGES, "tests", "lab", "examples", "blockwidth"):
        for f in (ROOT / top).rglob("*"):
            if f.suffix in (".py", ".sh", ".md", ".toml") and "evidence" not in f.parts and f.is_file():
                out.append(f)
    return out


def test_no_page_or_module_points_at_a_tracker_or_a_file_the_reader_does_not_have():
    """'issue 27' meant something to whoever filed it; a reader of the repository has no tracker.
    Name what is meant instead (docs/served.md, the served path)."""
    issue = re.compile(r"\b[Ii]ssues? #?\d+\b")
    this = Path(__file__).resolve()
    said = [f"{f.relative_to(ROOT)}: {m.group(0)}" for f in _texts() if f.resolve() != this
            for m in issue.finditer(f.read_text(encoding="utf-8", errors="replace"))]
    assert not said, said
    cited = [str(f.relative_to(ROOT)) for f in _texts() if f.resolve() != this
             and "DESIGN.md" in f.read_text(encoding="utf-8", errors="replace")]
    assert (ROOT / "DESIGN.md").exists() or not cited, cited
