"""``blockwidth --check`` as CI runs it: exit codes, statuses, JSON and JUnit, and the
Profile tab's marks. Static checks run in-process through ``cli.main``; the measured
ones run the engine on the demo pair (CPU) in a subprocess, as a runner would."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from blockwidth.console import cli
from blockwidth.console.check import Mark, profile_marks
from blockwidth.console.inputs import ExitCode, mlx_version
from blockwidth.policy import profile
from blockwidth.policy.device import parse_device_spec
from tests.conftest import ROOT

MLX = mlx_version()
STATUSES = {"pass", "warn", "fail", "skip", "inconclusive"}

# The 4-bit demo target with the model drafter: what a CPU runner checks.
CPU_4BIT = ('backend = "cpu"\ndrafter_kind = "model"\n'
            'target_quantization = { scheme = "affine", bits = 4, group_size = 64 }\n')
H200 = ('backend = "cuda"\ncompute_capability = "9.0"\ndevice_name = "NVIDIA H200"\n'
        'drafter_kind = "model"\nwidth = 8\n'
        'target_quantization = { scheme = "affine", bits = 4, group_size = 64 }\n')


def write_profile(tmp_path: Path, *entries: str, name: str = "p.toml") -> Path:
    p = tmp_path / name
    p.write_text("schema = 1\n" + "".join(f"\n[[override]]\n{e}" for e in entries))
    return p


def write_record(tmp_path: Path, name: str = "rec.json") -> Path:
    """A record as a session writes one (the fields --check reads)."""
    (tmp_path / "records").mkdir(exist_ok=True)
    r = tmp_path / "records" / name
    r.write_text(json.dumps({"schema": 1, "kind": "ab-session", "host": {"device": {"backend": "cpu"},
                             "mlx": MLX}, "config": {"widths": [8]}, "pair": {}}))
    return r


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--check", *args])
    out, err = capsys.readouterr()
    return int(code), out, err


def check_json(capsys, *args: str) -> tuple[int, dict]:
    code, out, err = check(capsys, *args, "--json")
    assert "Traceback" not in err
    return code, json.loads(out)


def by_name(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


# ---- exit codes ---------------------------------------------------------------------------

def test_exit_0_when_every_check_passes_even_strict(tmp_path, capsys):
    write_record(tmp_path)
    p = write_profile(tmp_path, CPU_4BIT + f'decline = true\nmlx = "{MLX}"\n'
                      'evidence = { record = "records/rec.json" }\n')
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu", "--demo-target", "4bit", "--strict")
    assert code == ExitCode.OK == doc["exit_code"], doc
    assert {c["status"] for c in doc["checks"]} == {"pass"}
    res = by_name(doc)["resolve: target-4bit + drafter"]
    assert res["figures"]["source"] == "profile" and res["figures"]["decline"] is True
    assert "no width beat classic" in res["detail"] and res["figures"]["entry"] == 1


def test_stale_entry_warns_and_strict_fails(tmp_path, capsys):
    p = write_profile(tmp_path, CPU_4BIT + 'width = 3\nmlx = "0.0.1"\n')
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu", "--demo-target", "4bit")
    stale = by_name(doc)["entry 1: mlx version"]
    assert code == ExitCode.OK and stale["status"] == "warn" and "stale" in stale["detail"]
    assert stale["figures"] == {"entry_mlx": "0.0.1", "running_mlx": MLX} and stale["line"] == 3
    code, out, _ = check(capsys, "--profile", str(p), "--device", "cpu", "--strict")
    assert code == ExitCode.CHECK_FAILED and "measured under MLX 0.0.1" in out
    assert out.strip().splitlines()[-1].endswith("exit 1; warnings fail (--strict)")


def test_duplicate_entries_are_invalid_naming_both(tmp_path, capsys):
    """blockwidth.policy.profile refuses two entries in one slot: bad input, exit 2, the file untouched."""
    p = write_profile(tmp_path, CPU_4BIT + f'width = 3\nmlx = "{MLX}"\n',
                      CPU_4BIT + f'width = 5\nmlx = "{MLX}"\n')
    before = p.read_bytes()
    code, out, err = check(capsys, "--profile", str(p), "--device", "cpu")
    assert code == ExitCode.USAGE and out == "" and len(err.strip().splitlines()) == 1
    assert "entry 2 (line 10)" in err and "entry 1 (line 3)" in err and str(p) in err
    assert p.read_bytes() == before


def test_duplicates_by_device_name_case_fail_on_every_runner(tmp_path, capsys):
    """Device names match case-blind, so these two entries match the same GPUs although their
    slots differ: the file is ambiguous on the runner it names, and every runner says so."""
    p = write_profile(tmp_path, H200, H200.replace('"NVIDIA H200"', '"nvidia h200"').replace("8", "4"))
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu")
    dup = by_name(doc)["duplicate match keys: entries 1, 2"]
    assert code == ExitCode.CHECK_FAILED and dup["status"] == "fail"
    assert "entry 1 (line 3)" in dup["detail"] and "entry 2 (line 11)" in dup["detail"]
    assert dup["figures"]["outcomes"] == ["width 8", "width 4"]


def test_shadowed_entry_warns_unless_a_note_says_why(tmp_path, capsys):
    generic = f'backend = "cpu"\ndrafter_kind = "model"\nwidth = 4\nmlx = "{MLX}"\n'
    specific = CPU_4BIT + f'decline = true\nmlx = "{MLX}"\n'
    p = write_profile(tmp_path, generic, specific)
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu")
    sh = by_name(doc)["entry 1: shadowed by entry 2"]
    assert sh["status"] == "warn" and "does not say why" in sh["detail"] and code == ExitCode.OK
    assert check(capsys, "--profile", str(p), "--device", "cpu", "--strict")[0] == ExitCode.CHECK_FAILED
    p = write_profile(tmp_path, generic, specific + 'note = "4-bit verify costs every row on a CPU"\n')
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu")
    sh = by_name(doc)["entry 1: shadowed by entry 2"]
    assert sh["status"] == "pass" and "4-bit verify costs every row" in sh["detail"]
    # a more specific entry that agrees hides nothing
    p = write_profile(tmp_path, generic, CPU_4BIT + f'width = 4\nmlx = "{MLX}"\n')
    assert "shadowing" in by_name(check_json(capsys, "--profile", str(p), "--device", "cpu")[1])


def test_other_devices_entries_are_skipped_never_failed(tmp_path, capsys):
    """Stale, record-less, duplicate-free entries for an H200 and a Mac: a CPU runner skips them."""
    mac = 'backend = "metal"\ndrafter_kind = "lookup"\nwidth = 6\nmlx = "0.1.0"\n'
    p = write_profile(tmp_path, H200 + 'mlx = "0.1.0"\nevidence = { record = "/nowhere/h200.json" }\n', mac)
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu", "--strict")
    assert code == ExitCode.OK, doc
    entries = [c for c in doc["checks"] if c["category"] == "entry"]
    assert [c["status"] for c in entries] == ["skip", "skip"]
    assert "another machine's entry" in entries[0]["detail"] and "cuda" in entries[0]["detail"]
    # the same profile resolved for cuda:9.0, which names no GPU: the H200 entry applies, as in
    # the resolver, and says it matched only by compute capability; the Mac's is skipped
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cuda:9.0")
    dev = by_name(doc)["entry 1: device"]
    assert dev["status"] == "pass" and "matched only by compute capability" in dev["detail"]
    assert by_name(doc)["entry 2: device"]["status"] == "skip"


def test_records_missing_here_or_written_elsewhere(tmp_path, capsys):
    (tmp_path / "records").mkdir()
    gone = CPU_4BIT + f'width = 3\nmlx = "{MLX}"\nevidence = {{ record = "records/gone.json" }}\n'
    p = write_profile(tmp_path, gone)
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu")
    rec = by_name(doc)["entry 1: record"]
    assert code == ExitCode.CHECK_FAILED and rec["status"] == "fail" and "missing" in rec["detail"]
    elsewhere = gone.replace("records/gone.json", "/Users/someone/Library/blockwidth/records/x.json")
    p = write_profile(tmp_path, elsewhere)
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu")
    rec = by_name(doc)["entry 1: record"]
    assert code == ExitCode.OK and rec["status"] == "warn" and "another machine" in rec["detail"]


@pytest.mark.parametrize("body,lines,needles", [
    (None, 1, ["no such file"]),
    ("schema = 1\n[[override]\n", 1, ["not valid TOML", "line 2"]),
    ("schema = 1\n\n[[override]]\n" + CPU_4BIT + "width = 99\n", 1, ["entry 1 (line 3)", "width = 99"]),
    ("schema = 1\n\n[[override]]\n" + CPU_4BIT + "width = 4\nwidht = 5\n", 1, ["entry 1 (line 3)", "widht"]),
    ("schema = 1\n\n[[override]]\n" + CPU_4BIT + "width = 0\n\n[[override]]\nbackend = 'tpu'\n"
     "drafter_kind = 'model'\nwidth = 4\n", 2, ["entry 1 (line 3)", "entry 2 (line 9)", "tpu"]),
])
def test_bad_profile_exit_2_one_line_per_problem_untouched(tmp_path, body, lines, needles, blockwidth):
    p = tmp_path / "p.toml"
    if body is not None:
        p.write_text(body)
    before = p.read_bytes() if p.exists() else None
    r = blockwidth("--check", "--profile", str(p), "--device", "cpu", "--junit", str(tmp_path / "r.xml"))
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
    got = r.stderr.strip().splitlines()
    assert len(got) == lines and all(str(p) in line for line in got), r.stderr
    for n in needles:
        assert n in r.stderr
    assert (p.read_bytes() if p.exists() else None) == before
    # CI still gets a report saying why nothing ran
    err = ET.parse(tmp_path / "r.xml").getroot().find("testsuite/testcase/error")
    assert err is not None and str(p) in err.text


def test_bad_inputs_are_all_reported_exit_2(tmp_path, capsys):
    p = write_profile(tmp_path, CPU_4BIT + "width = 3\n")
    code, out, err = check(capsys, "--profile", str(p), "--device", "tpu", "--target", "/nope", "-n", "2")
    assert code == ExitCode.USAGE and out == "" and len(err.strip().splitlines()) == 3
    assert "--device 'tpu'" in err and "-n is for --check --measure" in err and "--target /nope" in err
    code, _, err = check(capsys, "--profile", str(p), "--device", "cpu", "--target", str(tmp_path / "nope"))
    assert code == ExitCode.USAGE and "--target" in err and "no such file" in err
    code, _, err = check(capsys, "--profile", str(p), "--device", "cpu", "--junit", str(p))
    assert code == ExitCode.USAGE and "is the profile" in err


def test_default_profile_missing_is_exit_2(blockwidth):
    """A runner with no profile has nothing to check: that is a configuration error, not a pass."""
    r = blockwidth("--check", "--device", "cpu")
    assert r.returncode == 2 and "no such file" in r.stderr and "give --profile FILE" in r.stderr


def test_check_is_a_subcommand_and_dash_dash_check_its_alias(tmp_path, capsys):
    """``blockwidth check`` and ``blockwidth --check`` are one command: the same document, the
    same exit code, options before ``check`` honoured as for every subcommand."""
    p = write_profile(tmp_path, CPU_4BIT + f'width = 3\nmlx = "{MLX}"\n')
    runs = [["check", "--profile", str(p), "--device", "cpu", "--json"],
            ["--check", "--profile", str(p), "--device", "cpu", "--json"],
            ["--profile", str(p), "--device", "cpu", "check", "--json"],
            ["--profile", str(p), "--device", "cpu", "--json", "--check"]]
    docs = []
    for argv in runs:
        code = cli.main(argv)
        docs.append((code, json.loads(capsys.readouterr().out)))
    assert all(d == docs[0] for d in docs) and docs[0][0] == ExitCode.OK, docs
    assert docs[0][1]["profile"] == str(p) and docs[0][1]["device"].startswith("cpu")


def test_the_cli_takes_no_surgery_on_argparse_and_check_does_not_import_the_cli():
    """The options-before-the-subcommand rule reads what the CLI declared (Parser.declared),
    not argparse's private lists; console.check no longer imports console.cli (cli -> app ->
    check -> cli was a cycle kept alive by a function-local import)."""
    import re
    import subprocess
    import sys

    text = (ROOT / "console" / "cli.py").read_text(encoding="utf-8")
    assert not re.search(r"\._actions|argparse\._|\._option_string_actions|\.choices\[", text)
    code = ("import sys, blockwidth.console.check, blockwidth.console.measure, blockwidth.console.inputs, "
            "blockwidth.console.request; "
            "assert 'blockwidth.console.cli' not in sys.modules, 'blockwidth.console.cli imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    for p in (ROOT / "console").rglob("*.py"):
        if p.name != "cli.py":
            assert "blockwidth.console.cli" not in p.read_text(encoding="utf-8"), p


@pytest.mark.parametrize("argv,needle", [
    (["--strict", "resolve", "--device", "cpu"], "--strict is an option of check: put it after the command"),
    (["--junit", "x.xml", "resolve"], "--junit is an option of check"),
    (["--check", "resolve"], "--check is the check command's alias: it takes no other COMMAND (got 'resolve')"),
    (["--measure", "--device", "cpu"], "--measure is an option of check"),  # the console takes none
    (["-n", "3", "--strict"], "-n is an option of check and sweep"),
    (["check", "--strict", "resolve"], "unrecognized arguments: resolve"),
    (["--profile", "p.toml", "resolve", "--check"], "takes no other COMMAND (got 'resolve')"),
])
def test_check_options_are_never_ignored(argv, needle, capsys):
    try:
        code = cli.main(argv)
    except SystemExit as e:  # argparse's own refusal, one line
        code = e.code
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


# ---- output -------------------------------------------------------------------------------

def _mixed_profile(tmp_path: Path) -> Path:
    return write_profile(tmp_path, H200, CPU_4BIT + 'width = 3\nmlx = "0.0.1"\n',
                         f'backend = "cpu"\ndrafter_kind = "model"\nwidth = 4\nmlx = "{MLX}"\n')


def test_json_shape(tmp_path, capsys):
    _, doc = check_json(capsys, "--profile", str(_mixed_profile(tmp_path)), "--device", "cpu")
    assert {"profile", "device", "mlx", "strict", "exit_code", "counts", "checks"} <= set(doc)
    for c in doc["checks"]:
        assert {"name", "status", "detail", "figures"} <= set(c)
        assert c["status"] in STATUSES and isinstance(c["figures"], dict) and c["detail"]
    assert len({c["name"] for c in doc["checks"]}) == len(doc["checks"])  # names are unique
    assert sum(doc["counts"].values()) == len(doc["checks"])
    assert doc["counts"]["skip"] == 1 and doc["counts"]["warn"] >= 2


def test_junit_parses_and_matches_the_checks(tmp_path, capsys):
    p = _mixed_profile(tmp_path)
    out = tmp_path / "report.xml"
    _, doc = check_json(capsys, "--profile", str(p), "--device", "cpu", "--strict", "--junit", str(out))
    root = ET.parse(out).getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert root.tag == "testsuites" and len(cases) == len(doc["checks"]) == int(suite.get("tests"))
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == int(suite.get("failures")) == doc["counts"]["warn"] + doc["counts"]["fail"]
    assert len([c for c in cases if c.find("skipped") is not None]) == int(suite.get("skipped")) == 1
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["strict"] == "True" and props["exit_code"] == "1"
    # without --strict a warning is a note, not a failure
    check(capsys, "--profile", str(p), "--device", "cpu", "--junit", str(out))
    assert int(ET.parse(out).getroot().find("testsuite").get("failures")) == 0


def test_text_summary(tmp_path, capsys):
    code, out, err = check(capsys, "--profile", str(_mixed_profile(tmp_path)), "--device", "cpu")
    lines = out.strip().splitlines()
    assert lines[0].startswith("blockwidth check: profile")  # the command's name, --check being its alias
    assert code == ExitCode.OK and err == ""
    assert any(line.split()[0] == "skip" and "entry 1 (line 3): device" in line for line in lines[1:])
    assert lines[-1].startswith("4 pass") or "exit 0" in lines[-1]


def test_headless_check_never_imports_textual():
    code = ("import sys, blockwidth.console.check, blockwidth.console.check_report, blockwidth.console.cli; "
            "assert 'textual' not in sys.modules, 'textual imported'; "
            "assert 'mlx.core' not in sys.modules, 'MLX imported before anything runs'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ---- the console's marks ------------------------------------------------------------------

def test_profile_marks_for_this_device(tmp_path):
    write_record(tmp_path)
    p = write_profile(
        tmp_path, H200,
        CPU_4BIT + 'width = 3\nmlx = "0.0.1"\nevidence = { record = "records/rec.json" }\n',
        f'backend = "cpu"\ndrafter_kind = "lookup"\nwidth = 4\nmlx = "{MLX}"\n',
        f'backend = "cpu"\ndrafter_kind = "mtp"\ndecline = true\nmlx = "{MLX}"\n'
        'evidence = { record = "records/rec.json" }\n')
    marks = profile_marks(profile.load(p), parse_device_spec("cpu"), MLX)
    assert [m.mark for m in marks] == [Mark.SKIP, Mark.STALE, Mark.WARN, Mark.PASS]
    assert "no record" in marks[2].why
    marks = profile_marks(profile.load(p), parse_device_spec("cuda:9.0"), MLX)
    assert marks[0].mark is Mark.WARN and [m.mark for m in marks[1:]] == [Mark.SKIP] * 3


def test_console_profile_tab_shows_marks(tmp_path):
    import asyncio

    from blockwidth.console.app import BlockwidthApp, Options

    p = write_profile(tmp_path, H200, CPU_4BIT + 'width = 3\nmlx = "0.0.1"\n')

    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(p), record_dir=str(tmp_path / "rec")))
        async with app.run_test(size=(160, 40)) as pilot:
            await app.workers.wait_for_complete()  # the resolution, then the profile's read (a worker)
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            table = app.query_one("#profile-table")
            cells = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
            whys = [str(table.get_row_at(i)[-1]) for i in range(table.row_count)]
            assert cells == ["skip", "stale"], cells
            assert "another machine's entry" in whys[0] and "0.0.1" in whys[1]
            # the highlighted entry's why below the table, wrapped (at 80 columns the why column
            # lies past the right edge)
            await pilot.press("4", "down")
            await pilot.pause()
            detail = str(app.query_one("#profile-detail").render())
            assert detail.startswith("entry 2: ") and "check stale: " in detail and "0.0.1" in detail, detail
            await app.workers.wait_for_complete()
        assert p.read_text().count("[[override]]") == 2  # read-only

    asyncio.run(go())


# ---- measured: the engine on the demo pair (CPU) ------------------------------------------
# On a CPU a 4-bit verify pays for every row, and the demo drafter keeps about half of its
# drafts, so width 32 at 32 new tokens decodes at about a quarter of classic's speed (seen:
# 3.5-4.0 against 10-12 tok/s on a loaded 2-core host, 7-8 against 27-30 on a quiet one).
# A decline of width 32 is therefore what this CPU measures, and a claim that width 32 wins
# is false by a factor of ~4: far beyond the run-to-run noise of a shared 2-core machine.

MEASURE = ("--check", "--measure", "--device", "cpu", "--demo-target", "4bit", "-n", "2",
           "--max-tokens", "8")


def test_measured_decline_of_a_hopeless_width_passes(tmp_path, blockwidth):
    p = write_profile(tmp_path, CPU_4BIT + f'decline = true\nmlx = "{MLX}"\nevidence = {{ widths = [32] }}\n')
    before = p.read_bytes()
    r = blockwidth(*MEASURE, "--profile", str(p), "--record-dir", str(tmp_path / "rec"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    m = by_name(json.loads(r.stdout))["measure: target-4bit + drafter"]
    assert m["status"] == "pass" and "every declined width still loses" in m["detail"], m
    # a loss either way: "slower" where n 2's intervals part, "below min gain" where the host's
    # load widened them (seen once in CI while another session ran)
    assert m["figures"]["widths"] == [32] and m["figures"]["arms"]["w32"]["verdict"] in ("slower", "below min gain")
    assert m["figures"]["arms"]["w32"]["identical"] is True
    assert Path(m["figures"]["record"]).is_file() and p.read_bytes() == before


def test_measured_fabricated_win_fails(tmp_path, blockwidth):
    p = write_profile(tmp_path, CPU_4BIT + f'width = 32\nmlx = "{MLX}"\n'
                      'evidence = { classic_tok_s = [20.0, 21.0, 22.0], width_tok_s = [60.0, 61.0, 62.0] }\n')
    xml = tmp_path / "report.xml"
    r = blockwidth(*MEASURE, "--profile", str(p), "--record-dir", str(tmp_path / "rec"), "--junit", str(xml))
    assert r.returncode == 1, r.stdout + r.stderr
    line = next(x for x in r.stdout.splitlines() if "measure: target-4bit + drafter" in x)
    assert line.split()[0] == "fail" and "width 32 no longer wins" in line, r.stdout
    case = next(c for c in ET.parse(xml).getroot().iter("testcase") if c.get("classname") == "blockwidth.measure")
    assert case.find("failure") is not None and "no longer wins" in case.find("failure").get("message")


# ---- measured verdicts from samples (the engine's decide() on chosen decode times) --------

def _session(classic_tok_s, width_tok_s, width=8, identical=True):
    """A finished session with these decode tok/s (16 tokens a run), judged by engine.ab.decide."""
    from blockwidth.engine.ab import AbConfig, Arm, Session, Verdict, decide
    from blockwidth.engine.decode import DecodeRun, Round
    from blockwidth.engine.identity import Identity

    def run(w, tok_s):
        rounds = [] if w is None else [Round(w - 1, 1, 2, 0.0, 0.0, 0.0)] * 8
        return DecodeRun(w, list(range(16)), 10, 0.01, 16 / tok_s, rounds)

    arm = Arm(width, [run(width, t) for t in width_tok_s])
    arm.identity = (Identity(True, True, None, 16, 16) if identical
                    else Identity(False, False, 5, 16, 16, "a", "b", "c"))
    s = Session(AbConfig(widths=(width,), prompt="x", n=len(width_tok_s)), [1], Arm(None, verdict=Verdict.CONTROL),
                [arm])
    s.classic.runs = [run(None, t) for t in classic_tok_s]
    decide(s)
    return s


def _entry(**kw):
    base = dict(backend=parse_device_spec("cpu").backend, drafter_kind=profile.DrafterKind.MODEL, width=8)
    base.update(kw)
    return profile.Entry(**base)


@pytest.mark.parametrize("entry,classic,width_runs,identical,status,needle", [
    # a win takes 3 runs a side (its p below 0.05: policy.stats.ALPHA), as check --measure runs
    (dict(), [10, 11, 10.5, 10.8], [20, 21, 20.5], True, "pass", "still wins"),
    (dict(), [10, 11, 10.5], [5, 6], True, "fail", "no longer wins"),
    (dict(), [10, 11, 10.5], [10.2, 12], True, "inconclusive", "undecided"),
    (dict(), [10, 11, 10.5], [20, 21], False, "fail", "identity broke"),
    (dict(byte_identical=False), [10, 11, 10.5, 10.8], [20, 21, 20.5], False, "pass", "as the entry records"),
    (dict(width=None, decline=True), [10, 11, 10.5], [5, 6], True, "pass", "still loses"),
    (dict(width=None, decline=True), [10, 11, 10.5, 10.8], [20, 21, 20.5], True, "fail", "now wins clearly"),
    (dict(width=None, decline=True), [10, 11, 10.5], [10.2, 12], True, "inconclusive", "not decided"),
    # classic fell from 20 to 10 tok/s across 8 runs: drift beyond noise (2/C(8,4) < 5%)
    (dict(), [20, 20.5, 21, 20.2, 10, 10.5, 11, 10.2], [30] * 7, True, "inconclusive", "drifted"),
])
def test_measured_status_follows_the_engine_rules(entry, classic, width_runs, identical, status, needle):
    from blockwidth.console.check import Status, measured_status

    got, why = measured_status(_entry(**entry), _session(classic, width_runs, identical=identical))
    assert got is Status(status) and needle in why, why


def test_noise_or_drift_keeps_a_disjoint_verdict_and_says_so():
    """Few runs: the engine cannot tell drift from noise; a verdict clear of every classic run stands."""
    from blockwidth.console.check import Status, measured_status

    got, why = measured_status(_entry(width=None, decline=True), _session([30, 31, 25], [5, 6]))
    assert got is Status.PASS and "noise alone does 67%" in why


def test_the_example_profile_checks_clean_on_a_cpu_runner(tmp_path, capsys):
    """examples/: the CPU entry and its committed record pass; the CUDA entries are skipped."""
    code, doc = check_json(capsys, "--profile", str(ROOT / "examples/profile.toml"), "--device", "cpu",
                           "--demo-target", "4bit", "--junit", str(tmp_path / "report.xml"))
    assert code == ExitCode.OK, doc
    checks = by_name(doc)
    assert checks["entry 1: record"]["status"] == "pass"
    assert [checks[f"entry {i}: device"]["status"] for i in (1, 2, 3)] == ["pass", "skip", "skip"]
    assert checks["resolve: target-4bit + drafter"]["figures"]["decline"] is True
    assert (ROOT / "examples/ci/blockwidth-check.yml").read_text().count("blockwidth --check --strict --junit report.xml") == 1


def test_the_example_profiles_h200_entry_is_real_on_an_h200_runner(capsys):
    """examples/: the H200 entry was saved by `sweep --save` on the GPU host (2026-11-30g) and
    its record is committed beside it, so a cuda 9.0 runner passes it; resolving there, the
    4-bit target (no profile entry) gets policy/table.py's measured cuda 9.0 row."""
    code, doc = check_json(capsys, "--profile", str(ROOT / "examples/profile.toml"), "--device", "cuda:9.0",
                           "--demo-target", "4bit")
    assert code == ExitCode.OK, doc
    checks = by_name(doc)
    assert [checks[f"entry {i}: device"]["status"] for i in (1, 2, 3)] == ["skip", "skip", "pass"]
    assert checks["entry 3: record"]["status"] == "pass"
    assert "written on cuda NVIDIA H200" in checks["entry 3: record"]["detail"]
    got = checks["resolve: target-4bit + drafter"]
    # the row's record: the qmv kernel's sweep of the 10th build (width 8; stock's was 16)
    assert got["status"] == "pass" and "measured default" in got["detail"] and "h200-2026-12-02" in got["detail"]
    assert got["detail"].startswith("8 ")


def test_measure_refuses_a_record_dir_that_is_a_file_before_measuring(tmp_path, capsys):
    p = write_profile(tmp_path, CPU_4BIT + 'width = 3\n')
    f = tmp_path / "file"
    f.write_text("x")
    code, out, err = check(capsys, "--measure", "--profile", str(p), "--device", "cpu", "--record-dir", str(f))
    assert code == ExitCode.USAGE and out == "" and f"--record-dir {f}: is a file" in err


def test_a_pair_named_by_a_record_is_resolved_too(tmp_path, capsys):
    """A record of this device's entry that names a pair present here adds that pair."""
    from blockwidth.engine import demo

    r = write_record(tmp_path)
    doc = json.loads(r.read_text())
    doc["pair"] = {"target": str(demo.target("bf16")), "drafter": None, "drafter_kind": "lookup"}
    r.write_text(json.dumps(doc))
    p = write_profile(tmp_path, f'backend = "cpu"\ndrafter_kind = "lookup"\nwidth = 6\nmlx = "{MLX}"\n'
                      'evidence = { record = "records/rec.json" }\n')
    code, doc = check_json(capsys, "--profile", str(p), "--device", "cpu", "--demo-target", "4bit")
    res = [c for c in doc["checks"] if c["category"] == "resolve"]
    assert code == ExitCode.OK and [c["figures"]["origin"] for c in res] == ["command line", "record of entry 1"]
    assert res[1]["figures"]["width"] == 6 and res[1]["figures"]["source"] == "profile"
    r.write_text(json.dumps({"pair": "not a table"}))  # a malformed record adds nothing and breaks nothing
    assert check_json(capsys, "--profile", str(p), "--device", "cpu")[0] == ExitCode.OK


def test_json_on_bad_input_is_a_document_with_the_problems(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[entry]\nwidth = \n")
    before = bad.read_bytes()
    code, out, err = check(capsys, "--profile", str(bad), "--json")
    doc = json.loads(out)
    assert code == 2 and doc["exit_code"] == 2 and doc["checks"] == []
    assert len(doc["errors"]) == 1 and "not valid TOML" in doc["errors"][0]
    assert len(err.strip().splitlines()) == 1 and str(bad) in err  # the one line stays
    assert bad.read_bytes() == before
