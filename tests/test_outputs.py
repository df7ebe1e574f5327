"""What blockwidth writes and reads back: records never overwritten and never read whole,
outputs that are not regular files or are an input under another name refused before any
work, a held profile lock named after a bounded wait, and a write that fails after the
measurement keeping the results (a measured result is never lost)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO, GiB, ROOT, one_line, run_cli

def test_records_never_overwrite_and_leftovers_are_cleaned(tmp_path):
    from blockwidth.console import records
    from blockwidth.engine.session import record

    rec = {"created": "2026-11-29T10:00:00Z", "prompt": {"sha256": "ab" * 32}, "x": 1}
    first = records.write(rec, tmp_path)
    second = records.write(dict(rec, x=2), tmp_path)  # same second, prompt and pid
    assert first != second and record.load(first)["x"] == 1 and record.load(second)["x"] == 2
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    leftover = tmp_path / f".record.{dead}.abc.tmp"
    leftover.write_text('{"half": ')
    mine = tmp_path / f".record.{os.getpid()}.live.tmp"  # a live writer's: kept
    mine.write_text("{")
    records.write(rec, tmp_path)
    assert not leftover.exists() and mine.exists()
    assert len(list(tmp_path.glob("session-*.json"))) == 3


def test_a_huge_record_is_not_read_whole(tmp_path):
    """A 1 GiB evidence record (sparse: it costs no disk) under a 2 GiB address-space limit,
    which reading it whole and decoding it would pass: the bounded reader refuses it by its
    size, and the check reports it and goes on."""
    rec = tmp_path / "records" / "big.json"
    rec.parent.mkdir()
    with open(rec, "wb") as fh:
        fh.truncate(GiB)
    prof = tmp_path / "p.toml"
    prof.write_text('schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                    'evidence = { record = "records/big.json" }\n')
    p = run_cli("--check", "--json", "--profile", str(prof), "--device", "cpu", memory=2 * GiB, timeout=300)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    record_check = next(c for c in doc["checks"] if c["name"] == "entry 1: record")
    assert record_check["status"] == "fail" and "over the 128 MiB limit" in record_check["detail"]


def test_outputs_that_are_not_regular_files_are_refused_before_any_work(tmp_path, blockwidth):
    fifo = tmp_path / "report.xml"
    os.mkfifo(fifo)
    profile = ROOT / "examples/profile.toml"
    for junit, needle in ((fifo, "is a FIFO"), (Path("/dev/null"), "is a character device"),
                          (tmp_path, "is a directory"), (tmp_path / "no" / "r.xml", "does not exist")):
        p = blockwidth("--check", "--profile", str(profile), "--device", "cpu", "--junit", str(junit))
        assert f"--junit {junit}: " in one_line(p) and needle in p.stderr, p.stderr
        assert p.stdout == ""


def test_every_output_goes_through_the_same_check(tmp_path):
    """The console's Markdown export writes through the same door as --junit."""
    from blockwidth.console.outputs import OutputError, write_output

    fifo = tmp_path / "session.md"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="is a FIFO"):
        write_output(fifo, b"# x\n", "Markdown export")
    out = write_output(tmp_path / "new.md", b"# x\n", "Markdown export")
    assert out.read_bytes() == b"# x\n"


def test_a_record_that_cannot_be_written_keeps_the_results(tmp_path):
    """A file-size limit (EFBIG) on the record: the table is printed, then one line, exit 2."""
    p = run_cli("sweep", "-n", "1", "--max-tokens", "4", "--widths", "2", "--record-dir", str(tmp_path / "rec"),
            fsize=4096)
    assert p.returncode == 2, p.stderr
    assert "decode tok/s by width" in p.stdout and "verdict:" in p.stdout and "record: not written" in p.stdout
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("blockwidth: error: record directory") and "cannot be written" in last, p.stderr
    assert "Traceback" not in p.stderr


def test_a_profile_broken_during_the_session_keeps_the_results_and_names_the_record(tmp_path, monkeypatch,
                                                                                     capsys):
    """The profile validated when the sweep began and was replaced by bad TOML while it ran:
    the results are printed, the record kept and named, exit 2 (not a bare line and nothing)."""
    import dataclasses

    from blockwidth import engine
    import blockwidth.engine.ab  # noqa: F401
    from blockwidth.console import cli as blockwidth

    prof = tmp_path / "p.toml"
    prof.write_text("schema = 1\n")
    real = engine.ab.run_session

    def session_then_break(*a, **kw):
        s = real(*a, **kw)
        prof.write_text("schema = [\n")  # someone else's bad edit, mid-session
        # decided, as a longer session would be, so that the save is attempted (n = 1 cannot be)
        return dataclasses.replace(s, drift=False, recommendation=2)

    monkeypatch.setattr(engine.ab, "run_session", session_then_break)
    code = blockwidth.main(["sweep", "-n", "1", "--max-tokens", "4", "--widths", "2", "--save",
                            "--profile", str(prof), "--record-dir", str(tmp_path / "rec")])
    out, err = capsys.readouterr()
    records = list((tmp_path / "rec").glob("session-*.json"))
    assert code == 2 and len(records) == 1
    assert "decode tok/s by width" in out and f"record: {records[0]}" in out
    last = err.strip().splitlines()[-1]
    assert "not valid TOML" in last and "nothing saved" in last and f"kept: record {records[0]}" in last, err
    assert prof.read_text() == "schema = [\n"


def test_the_console_shows_a_session_whose_record_cannot_be_written(tmp_path):
    """The record directory, checked when the console opened, is a file by the time the session
    ends: the results stay on screen and the error line says the record is not kept; s refuses."""
    import asyncio

    from blockwidth.console.app import BlockwidthApp, Options, Phase

    rec = tmp_path / "rec"

    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"), record_dir=str(rec)))
        async with app.run_test(size=(140, 40)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            rec.rmdir() if rec.is_dir() else None
            rec.write_text("not a folder")
            app.query_one("#prompt").value = "def f(x):"  # one prompt: the record is the subject
            await pilot.press("escape", "w", *"2", "tab", *"1", "tab", *"8", "tab")
            if app.query_one("#sequential").value:
                await pilot.press("space")
            await pilot.press("shift+tab", "enter")
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.phase is Phase.DONE and app.session is not None
            assert app.query_one("#arms").row_count >= 2  # the results are shown: classic and the widths
            error = str(app.query_one("#error").render())
            assert "the record cannot be written" in error and "not kept" in error, error
            await pilot.press("s")
            await pilot.pause()
            assert "record could not be written" in str(app.query_one("#error").render())

    asyncio.run(go())
    assert rec.read_text() == "not a folder"


def test_stdout_on_a_full_device_is_one_line():
    with open("/dev/full", "w") as full:
        for args in (("resolve", "--device", "cpu"), ("resolve", "--device", "cpu", "--json"),
                     ("inspect", str(DEMO / "drafter"))):
            p = run_cli(*args, stdout=full, timeout=120)
            assert p.returncode == 2, p.stderr
            assert p.stderr.strip() == "blockwidth: error: stdout cannot be written (No space left on device)"


def test_check_json_says_the_exit_code_the_process_exits_with(tmp_path):
    """--junit that fails when written (a file-size limit): the JSON says exit 2, as the exit."""
    p = run_cli("--check", "--json", "--profile", str(ROOT / "examples/profile.toml"), "--device", "cpu",
            "--junit", str(tmp_path / "r.xml"), fsize=512, timeout=120)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and doc["exit_code"] == 2 and "cannot be written" in doc["errors"][0]
    assert p.stderr.strip().splitlines()[-1].startswith("blockwidth: error: --junit")


@pytest.mark.parametrize("how", ["hard link", "symlink"])
def test_an_output_that_is_an_input_under_another_name_is_refused(tmp_path, how, blockwidth):
    prof = tmp_path / "p.toml"
    shutil.copy(ROOT / "examples/profile.toml", prof)
    before = prof.read_bytes()
    other = tmp_path / "report.xml"
    os.link(prof, other) if how == "hard link" else os.symlink(prof, other)
    p = blockwidth("--check", "--profile", str(prof), "--device", "cpu", "--junit", str(other))
    assert "the profile" in one_line(p) and "never writes over its inputs" in p.stderr
    assert prof.read_bytes() == before


def test_json_never_says_infinity_and_files_never_hold_it(tmp_path, blockwidth):
    from blockwidth.policy import files

    assert json.loads(files.dumps_json({"a": float("inf"), "b": [float("nan"), 1.5]})) == {"a": None,
                                                                                            "b": [None, 1.5]}
    t = shutil.copytree(DEMO / "target-bf16", tmp_path / "t")
    (t / "config.json").write_text((t / "config.json").read_text().replace('"vocab_size": 2048',
                                                                           '"vocab_size": 1e400'))
    p = blockwidth("inspect", "--json", str(t))
    assert "Infinity" not in p.stdout and "1e400 is out of range" in one_line(p)


def _held(lock: Path) -> subprocess.Popen:
    from tests.test_profile import HOLDER

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_held_profile_lock_is_named_after_a_bounded_wait(tmp_path, demo_pairs):
    """save_session on a real session of the demo pair, its outcome made decided so that it
    reaches the profile (at n = 1 the session cannot tell drift from noise)."""
    import dataclasses

    from blockwidth.console.measure import save_session
    from blockwidth.engine.ab import AbConfig, run_session
    from blockwidth.console import profile_file
    from blockwidth.policy import profile

    pair = demo_pairs()
    session = run_session(pair, AbConfig(widths=(2,), prompt="def f(x):", n=1, max_tokens=4,
                                         exactness=False, predict=False))
    decided = dataclasses.replace(session, drift=False, recommendation=2)
    prof = tmp_path / "p.toml"
    holder = _held(Path(str(prof) + ".lock"))
    try:
        with pytest.raises(profile_file.ProfileBusy) as e:
            old, profile_file.LOCK_WAIT_S = profile_file.LOCK_WAIT_S, 0.5
            try:
                save_session(decided, pair, tmp_path / "record.json", str(prof))
            finally:
                profile_file.LOCK_WAIT_S = old
    finally:
        holder.kill()
        holder.wait()
    assert f"pid {holder.pid}" in str(e.value) and not prof.exists()
    saved, refusal = save_session(decided, pair, tmp_path / "record.json", str(prof))
    assert saved and refusal is None and profile.load(prof).entries[0].width == 2


def test_sweep_save_with_a_held_lock_exits_1_and_keeps_the_record(tmp_path, blockwidth):
    prof = tmp_path / "p.toml"
    holder = _held(Path(str(prof) + ".lock"))
    try:
        p = blockwidth("sweep", "--widths", "2", "-n", "1", "--max-tokens", "4", "--save", "--profile", str(prof),
                       "--record-dir", str(tmp_path / "rec"))
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 1, p.stdout + p.stderr
    assert len(list((tmp_path / "rec").glob("session-*.json"))) == 1 and not prof.exists()
    # n = 1 never reaches the profile (it cannot tell drift from noise); when a session does,
    # the test above shows the lock is named
    assert f"pid {holder.pid}" in p.stderr or "not saved" in p.stderr


