"""One filter (policy.text.shown) for text that reaches a terminal or a report: escape
sequences and other control characters in folder names, file names and a server's log reach
stdout, stderr, JUnit and Markdown escaped, and a JUnit report parses whatever the profile's
path holds. In-process."""

from __future__ import annotations

import io
import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from blockwidth.console import cli
from tests.conftest import ROOT

DEMO = ROOT / "engine/demo/pair"
ESC = "\x1b]0;owned\x07\x1b[2J"  # set the terminal's title, ring its bell, clear its screen
RAW = ("\x1b", "\x07")


def _clean(*texts: str) -> None:
    for t in texts:
        assert not any(c in t for c in RAW), repr(t[:300])


def _entry_profile(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / "profile.toml"
    p.write_text('schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                 'evidence = { record = "r.json" }\n')
    return p


def test_export_and_check_show_a_profiles_path_escaped(capsys, tmp_path):
    p = _entry_profile(tmp_path / f"team{ESC}")
    assert cli.main(["export", "--format", "mlx-lm", "--profile", str(p), "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    _clean(out, err)
    assert "team\\x1b]0;owned\\x07" in out
    junit = tmp_path / "report.xml"
    cli.main(["check", "--profile", str(p), "--device", "cpu", "--junit", str(junit)])
    out, err = capsys.readouterr()
    _clean(out, err)
    props = {e.get("name"): e.get("value") for e in ET.parse(junit).iter("property")}
    assert "team\\x1b]0;owned\\x07" in props["profile"]


def test_junit_parses_when_the_profile_strings_hold_control_characters(capsys, tmp_path):
    """check --junit wrote XML that did not parse (XML 1.0 holds no control character, even as
    a reference): the profile is refused now, and the input error's report parses."""
    p = tmp_path / "p.toml"
    p.write_text('schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                 'device_name = "x\\u001b]0;owned\\u0007"\nnote = "a\\u0001b"\n')
    junit = tmp_path / "report.xml"
    code = cli.main(["check", "--profile", str(p), "--device", "cpu", "--junit", str(junit)])
    out, err = capsys.readouterr()
    _clean(out, err)
    assert code == 2
    (error,) = ET.parse(junit).iter("error")
    assert "device_name" in error.get("message") and "\\x1b" in error.text and "\\x01" in error.text


def test_junit_of_checks_quoting_control_characters_parses():
    from blockwidth.console.check_report import junit
    from blockwidth.policy.checks import Check, Status

    checks = [Check(f"entry 1: record{ESC}", Status.FAIL, f"record /r/{ESC}\x01.json is missing"),
              Check("warned", Status.WARN, f"note {ESC}")]
    root = ET.fromstring(junit(checks, {"strict": True, "allow_inconclusive": False, "profile": f"/p/{ESC}"}))
    text = ET.tostring(root, encoding="unicode")
    _clean(text)
    assert "\\x1b" in text and "\\x01" in text


def test_a_records_markdown_shows_its_folder_names_escaped(tmp_path):
    from blockwidth.engine.session import record

    rec = json.loads(next((ROOT / "examples/records").glob("*.json")).read_text())
    rec["pair"]["target"] = f"/models/t{ESC}"
    text = record.markdown(rec)
    _clean(text)
    assert "/models/t\\x1b]0;owned\\x07" in text


def test_the_server_log_serve_shows_is_escaped(tmp_path):
    """serve copies mlx_lm.server's log to stderr; the log echoes folder names and requests."""
    from blockwidth.engine.session.served import Server, ServerSpec

    tee = io.StringIO()
    server = Server(ServerSpec("serve", Path("/m")), tmp_path, tee=tee)
    pipe = io.BytesIO(f"loading /models/t{ESC}\nready\n".encode())
    with open(tmp_path / "log", "wb") as log:
        server._copy(pipe, log)
    _clean(tee.getvalue())
    assert tee.getvalue().splitlines() == ["loading /models/t\\x1b]0;owned\\x07\\x1b[2J", "ready"]
    assert (tmp_path / "log").read_bytes().count(b"\x1b") == 2  # the log file keeps what was said


@pytest.fixture
def escaped_pair(tmp_path) -> tuple[Path, Path]:
    """The demo pair under folder names holding escape sequences (links: nothing copied)."""
    t, d = tmp_path / f"target{ESC}", tmp_path / f"draft{ESC}"
    os.symlink(DEMO / "target-bf16", t)
    os.symlink(DEMO / "drafter", d)
    return t, d


def test_resolve_and_inspect_show_escaped_names_and_print_no_command_for_them(capsys, escaped_pair):
    t, d = escaped_pair
    assert cli.main(["resolve", "--target", str(t), "--draft", str(d)]) == 0
    out, err = capsys.readouterr()
    _clean(out, err)
    assert "target\\x1b]0;owned\\x07" in out
    serve_line = next(line for line in out.splitlines() if line.lstrip().startswith("serve "))
    assert "no command" in serve_line and "mlx_lm.server --model" not in serve_line
    assert cli.main(["inspect", str(t)]) == 0
    out, err = capsys.readouterr()
    _clean(out, err)


def test_serve_refuses_a_folder_no_printed_command_can_name(capsys, escaped_pair):
    t, d = escaped_pair
    code = cli.main(["serve", "--target", str(t), "--draft", str(d)])
    out, err = capsys.readouterr()
    _clean(out, err)
    assert code == 2 and "mlx_lm.server --model" not in err
    errors = [line for line in err.splitlines() if line.startswith("blockwidth: error:")]
    assert len(errors) == 1 and "the target's folder" in errors[0] and "\\x1b" in errors[0], err
