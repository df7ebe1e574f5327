"""Text from checkpoints, paths, records and profiles reaches the terminal escaped: no escape
sequence, no forged line, through one function for every front end."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.conftest import DEMO, edit_json, one_line

EVIL = "llama\x1b]0;pwned\x07\x1b[2J\nforged: line\u202e"


def test_names_from_a_checkpoint_reach_the_terminal_escaped(tmp_path, blockwidth):
    t = shutil.copytree(DEMO / "target-bf16", tmp_path / "t")
    edit_json(t / "config.json", lambda c: c.update(model_type=EVIL, architectures=["A\x1b[31mB"]))
    p = blockwidth("inspect", str(t))
    assert p.returncode == 0 and "\x1b" not in p.stdout and "\x07" not in p.stdout and "\u202e" not in p.stdout
    assert not any(line.startswith("forged") for line in p.stdout.splitlines())
    assert "llama\\x1b]0;pwned\\x07\\x1b[2J\\nforged: line\\u202e" in p.stdout
    assert json.loads(blockwidth("inspect", "--json", str(t)).stdout)["model_type"] == EVIL


def test_a_path_with_escapes_and_newlines_is_one_line_everywhere(tmp_path, blockwidth):
    evil = tmp_path / "t\x1b[2J\nforged"
    for args in (("resolve", "--device", "cpu", "--target", str(evil)), ("inspect", str(evil)),
                 ("sweep", "--target", str(evil)), ("--check", "--profile", str(evil), "--device", "cpu")):
        line = one_line(blockwidth(*args))
        assert "t\\x1b[2J\\nforged" in line, (args, line)
    shutil.copytree(DEMO / "target-bf16", evil)  # a real folder of that name: its name in normal output too
    p = blockwidth("resolve", "--device", "cpu", "--target", str(evil))
    assert p.returncode == 0 and "\x1b" not in p.stdout and "t\\x1b[2J\\nforged" in p.stdout


def test_a_record_named_by_the_profile_reaches_the_check_report_escaped(tmp_path, blockwidth):
    (tmp_path / "rec.json").write_text(json.dumps({"host": {"mlx": "0.1", "device": {
        "backend": "cpu", "name": "x\x1b[2J\nforged: pass"}}}))
    prof = tmp_path / "p.toml"
    prof.write_text('schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                    'evidence = { record = "rec.json" }\n')
    p = blockwidth("--check", "--profile", str(prof), "--device", "cpu")
    assert "\x1b" not in p.stdout and not any(line.startswith("forged") for line in p.stdout.splitlines())
    assert "x\\x1b[2J\\nforged: pass" in p.stdout, p.stdout


def test_one_function_escapes_for_every_front_end():
    from blockwidth.policy.text import error_lines, shown, shown_block

    assert shown("a\x1b[2Jb\nc\td\x7f\x9b\u2028\udcff") == "a\\x1b[2Jb\\nc\\td\\x7f\\x9b\\u2028\\xff"
    assert shown("plain text, with spaces and ünïcode") == "plain text, with spaces and ünïcode"
    assert shown_block("line 1\nline\x1b 2") == "line 1\nline\\x1b 2"
    from blockwidth.policy.profile import ProfileError

    assert error_lines(ProfileError(Path("p\n.toml"), ["a\nb", "c"])) == ["profile p\\n.toml: a\\nb",
                                                                          "profile p\\n.toml: c"]


