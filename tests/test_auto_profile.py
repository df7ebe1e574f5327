"""An ``auto`` profile entry (width = "auto" with the curve it was built on): read, written,
refused when malformed, resolved with its reason, and handed to mlx_lm.server as a fixed width."""

import json
import socket

import pytest

from blockwidth.console import profile_file
from blockwidth.policy import profile
from blockwidth.policy.auto import Costs, DraftCost, Plan
from blockwidth.policy.device import Backend
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.profile import Entry, ProfileError
from tests.conftest import run_cli

CURVE = {1: 45.7, 2: 62.4, 3: 50.9, 4: 59.7, 5: 70.2, 6: 171.6, 7: 163.7, 8: 114.5}
PLAN = Plan(Costs(CURVE, DraftCost.LINEAR, 14.3, overhead_ms=0.5), 0.84, 8)

TEXT = '''schema = 1

[[override]]
backend = "cpu"
drafter_kind = "model"
width = "auto"

[override.auto]
acceptance = 0.84
max_width = 8
draft = "linear"
draft_ms = 14.3
overhead_ms = 0.5
verify_ms = { "1" = 45.7, "2" = 62.4, "3" = 50.9, "4" = 59.7, "5" = 70.2, "6" = 171.6, "7" = 163.7, "8" = 114.5 }
'''


def test_an_auto_entry_reads_with_its_plan_and_its_fixed_width(tmp_path):
    p = tmp_path / "profile.toml"
    p.write_text(TEXT)
    (e,) = profile.load(p).entries
    assert e.auto == PLAN and e.width == PLAN.static_width and not e.decline
    # written back (a save), it reads the same: width = "auto", the curve by rows
    q = tmp_path / "saved.toml"
    profile_file.save(q, Entry(Backend.CPU, DrafterKind.MODEL, e.width, auto=PLAN))
    text = q.read_text()
    assert 'width = "auto"' in text and "[override.auto]" in text
    (back,) = profile.load(q).entries
    assert back.auto == PLAN and back.width == e.width
    # an auto entry and a fixed one for one situation share a slot: a save replaces either
    profile_file.save(q, Entry(Backend.CPU, DrafterKind.MODEL, 4))
    (only,) = profile.load(q).entries
    assert only.auto is None and only.width == 4


@pytest.mark.parametrize("change, problem", [
    (lambda t: t.split("[override.auto]")[0], 'width = "auto" needs its [override.auto] table'),
    (lambda t: t.replace('width = "auto"', "width = 4"), "[override.auto] table is only for width = \"auto\""),
    (lambda t: t.replace('"1" = 45.7, ', ""), "auto: verify_ms needs the 1-row forward"),
    (lambda t: t.replace("acceptance = 0.84", "acceptance = 1.5"), "auto: acceptance = 1.5"),
    (lambda t: t.replace("acceptance = 0.84\n", ""), "auto: acceptance is missing"),
    (lambda t: t.replace('draft = "linear"', 'draft = "sideways"'), "auto: costs: draft = 'sideways'"),
    (lambda t: t.replace("max_width = 8", "max_width = 8\ncolour = 1"), "auto: unknown keys ['colour']"),
    (lambda t: t.replace('width = "auto"', 'width = "wide"'), "width = 'wide': expected an integer 2..64 or \"auto\""),
])
def test_a_malformed_auto_entry_is_refused_naming_its_entry_and_line(tmp_path, change, problem):
    p = tmp_path / "profile.toml"
    p.write_text(change(TEXT))
    with pytest.raises(ProfileError) as e:
        profile.load(p)
    assert "entry 1 (line 3)" in str(e.value) and problem in str(e.value), str(e.value)


def test_resolve_says_auto_its_curve_and_the_fixed_width_for_what_cannot_adapt(tmp_path, blockwidth):
    p = tmp_path / "profile.toml"
    p.write_text(TEXT)
    r = blockwidth("resolve", "--profile", str(p), "--json")
    d = json.loads(r.stdout)
    assert r.returncode == 0 and d["source"] == "profile" and d["width"] == PLAN.static_width
    assert d["auto"]["static_width"] == PLAN.static_width and d["auto"]["verify_ms"]["8"] == 114.5
    assert d["reason"].startswith(f"auto, fixed {PLAN.static_width} where the width cannot adapt")
    assert "it adapts per round on its curve (built on verify 1..8 rows" in d["reason"]
    r = blockwidth("resolve", "--profile", str(p))
    assert r.stdout.startswith(f"width auto (fixed {PLAN.static_width} where the width cannot adapt)")
    assert "cannot adapt either" in r.stdout


def test_serve_passes_the_fixed_width_and_says_mlx_lm_server_cannot_adapt(tmp_path):
    p = tmp_path / "profile.toml"
    p.write_text(TEXT)
    w = PLAN.static_width
    with socket.socket() as s:  # the port is taken: serve says its line and stops, no process
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("serve", "--profile", str(p), "--port", str(port))  # serve: a process, as a server
    assert r.returncode == 2
    assert r.stdout.startswith(f"blockwidth serve: block_size={w}, block_size_from=profile (an auto "
                               f"entry; mlx_lm.server takes one width and cannot adapt per round")
    launched = next(x for x in r.stderr.splitlines() if "--num-draft-tokens" in x)
    assert f"--num-draft-tokens {w - 1}" in launched


def test_export_says_the_auto_entry_becomes_one_width(tmp_path, blockwidth):
    p = tmp_path / "profile.toml"
    p.write_text(TEXT)
    r = blockwidth("export", "--format", "mlx-lm", "--profile", str(p))
    assert r.returncode == 0
    assert "an auto entry: blockwidth's engine adapts the width per round" in r.stdout
    assert f"--num-draft-tokens {PLAN.static_width - 1}" in r.stdout


def test_check_measure_re_measures_an_auto_entry_as_auto(tmp_path, blockwidth):
    from pathlib import Path

    p = tmp_path / "profile.toml"
    p.write_text(TEXT.replace('drafter_kind = "model"\n', 'drafter_kind = "model"\n'
                              'target_quantization = { scheme = "affine", bits = 4, group_size = 64 }\n')
                 .replace("max_width = 8", "max_width = 4"))
    r = blockwidth("--check", "--measure", "--device", "cpu", "--demo-target", "4bit", "-n", "1",
                   "--max-tokens", "12", "--profile", str(p), "--record-dir", str(tmp_path / "rec"), "--json")
    assert r.returncode in (0, 1), r.stdout + r.stderr  # pass, fail or inconclusive: timing decides
    m = next(c for c in json.loads(r.stdout)["checks"] if c["name"].startswith("measure:"))
    assert m["figures"]["widths"] == ["auto"] and "auto (fixed" in m["detail"]
    assert m["figures"]["arms"]["auto"]["identical"] is True
    rec = json.loads(Path(m["figures"]["record"]).read_text())
    assert rec["config"]["auto_max"] == 4 and rec["auto"]["params"]["max_width"] == 4
