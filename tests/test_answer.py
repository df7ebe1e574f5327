"""The operator's answer (console.answer) in every front end: the mlx_lm.server command for what
was measured, or a refusal with its reason; resolve's text and --json; sweep --save; the reasons
a profile entry gives; and Ctrl-C inside a long measurement."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockwidth.console.answer import answer
from blockwidth.console.inputs import PairPaths, resolution
from tests.conftest import ROOT, run_cli


def _answer(kind=None, variant="bf16", **kw):
    res, paths, _ = resolution(target=None, draft=None, kind=kind, flag=None, device="cpu",
                               profile=None, variant=variant)
    return answer(res, paths, **kw), res, paths


def test_a_model_drafter_gets_the_server_command_with_absolute_paths_and_says_it_is_unmeasured():
    said, res, paths = _answer()
    assert said.command == (f"mlx_lm.server --model {paths.target} --draft-model {paths.drafter} "
                            f"--num-draft-tokens 3")
    assert Path(said.command.split()[2]).is_absolute() and said.num_draft_tokens == 3
    assert said.env == "BLOCKWIDTH_DRAFT_BLOCK_SIZE=4" and not said.measured
    # unmeasured, said in the same line as the width
    assert said.head().startswith("width 4 (--num-draft-tokens 3) · source per-kind default · not measured")


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
    res, paths, _ = resolution(target=None, draft=None, kind=None, flag=None, device="cpu", profile=None)
    monkeypatch.chdir(paths.target.parent)
    rel = PairPaths(Path(paths.target.name), Path(paths.drafter.name), False)
    line = answer(res, rel).command
    assert f"--model {paths.target} " in line and f"--draft-model {paths.drafter} " in line


@pytest.mark.parametrize("kind,why", [
    ("lookup", "mlx_lm.server has no prompt-lookup drafter"),
    ("dflash", "cannot run a dflash drafter"),
    ("mtp", "cannot run an mtp drafter"),
])
def test_kinds_mlx_lm_server_cannot_run_are_refused_with_the_reason(kind, why):
    said, res, _ = _answer(kind)
    assert said.command is None and why in said.refusal
    assert "runs on blockwidth's engine" in said.refusal and said.env  # the engine still runs it


@pytest.mark.parametrize("kind", ["lookup", "dflash", None])
def test_a_session_that_found_every_width_slower_hands_classics_command_for_every_kind(kind):
    """From a tryout: after a lookup session measured its width slower than classic, y said only
    "not measured: the per-kind constant" and offered the width's variable (a lookup pair has no
    server command, and the session's word was dropped with it)."""
    said, res, paths = _answer(kind, session_decline="a decline: s saves it")
    assert said.session_command == f"mlx_lm.server --model {paths.target}"
    assert said.session_why == "a decline: s saves it"
    assert any(line.startswith("this session measured classic faster than every width") for line in said.lines())
    plain, _, _ = _answer(kind)
    assert plain.session_command is None


def test_an_unmeasured_width_the_session_on_screen_measured_says_so():
    """A tryout: straight after a session, y said "not measured: the per-kind constant (run an
    A/B session to measure it)" above "this session: width 4 in effect is SLOWER than classic"."""
    said, _, _ = _answer(session="width 4 in effect is SLOWER than classic here")
    assert "run an A/B session" not in said.trust and said.trust.endswith("this session measured it (below), not saved")
    assert "run an A/B session to measure it" in _answer()[0].trust


def test_the_refusal_for_dflash_and_mtp_is_what_mlx_lm_does_with_them():
    """mlx_lm.server loads --draft-model with mlx_lm's loader; the demo DFlash and MTP drafters
    fail there as the refusal says (the first request died with this in the tryout)."""
    from mlx_lm.utils import load_model

    from blockwidth.engine import demo

    for kind in ("dflash", "mtp"):
        with pytest.raises(ValueError, match=r"Received \d+ parameters not in model"):
            load_model(Path(demo.DRAFTERS[kind]))


def test_a_decline_gets_the_command_without_a_draft_model_and_a_failed_pair_no_command():
    said, res, paths = _answer("dflash", variant="4bit")  # the CPU record: every width slower
    assert res.width is None and said.decline
    assert said.command == f"mlx_lm.server --model {paths.target}" and said.env is None
    assert said.head().startswith("classic (no draft model) · source measured default · measured")
    failed, _, _ = _answer(load_error="target x: mlx-lm cannot load it")
    assert failed.command is None and failed.env is None and "did not load" in failed.refusal
    none = answer(None, None, resolve_error="profile p.toml line 3: width = 1 is out of range")
    assert none.command is None and "resolution failed" in none.refusal


def test_resolve_says_num_draft_tokens_and_the_command_in_text_and_json(blockwidth):
    p = blockwidth("resolve", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert "--num-draft-tokens 3" in p.stdout and "serve    mlx_lm.server --model /" in p.stdout
    d = json.loads(blockwidth("resolve", "--device", "cpu", "--json").stdout)
    assert d["num_draft_tokens"] == 3 and d["serve_command"].startswith("mlx_lm.server --model /")
    assert d["answer"]["measured"] is False
    d = json.loads(blockwidth("resolve", "--device", "cpu", "--kind", "dflash", "--json").stdout)
    assert d["serve_command"] is None and "dflash" in d["answer"]["serve_refusal"]
    # the declared 16 the committed CPU sweep measured slower is not the answer
    assert (d["width"], d["source"]) == (4, "measured-default")
    # lookup: no checkpoint to declare a width, and no mlx_lm.server flag for its width
    p = blockwidth("resolve", "--device", "cpu", "--kind", "lookup")
    assert "none: prompt lookup has no checkpoint" in p.stdout and "declares no width" not in p.stdout
    assert "width 4 (3 drafted tokens a round)" in p.stdout and "--num-draft-tokens" not in p.stdout, p.stdout


def test_resolve_refuses_the_pair_the_console_refuses(tmp_path, blockwidth):
    import shutil

    from blockwidth.engine import demo

    other = tmp_path / "other"
    shutil.copytree(demo.DRAFTER, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["vocab_size"] = 4096
    (other / "config.json").write_text(json.dumps(cfg))
    p = blockwidth("resolve", "--device", "cpu", "--target", str(demo.target("bf16")), "--draft", str(other))
    assert p.returncode == 2 and "vocabulary of 4096 tokens differs" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    # a kind that needs a drafter, named without one: refused as sweep refuses it (a tryout's
    # resolve said "width 4" where sweep said the drafter was missing)
    p = blockwidth("resolve", "--device", "cpu", "--target", str(demo.target("bf16")), "--kind", "dflash")
    assert p.returncode == 2 and "--draft missing: drafter kind dflash needs a drafter checkpoint" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr


def test_a_generic_entry_names_the_pair_and_prompt_it_was_measured_on(tmp_path):
    """A lookup win saved as generic answered for an unrelated model with no word of where it
    came from: the reason now names the pair and the prompt, and that it was another pair."""
    from blockwidth.policy.device import Backend
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.profile import Entry

    entry = Entry(backend=Backend.CPU, drafter_kind=DrafterKind.LOOKUP, width=8,
                     evidence={"measured_on": {"target": "target-bf16", "drafter": "prompt lookup",
                                               "pair": "aaaa", "prompt": "say it again: say it again"},
                               "prompt_tokens": 12})
    said = entry.measured_on("bbbb")
    assert said == ("target-bf16 + prompt lookup (another pair; the entry is generic: any pair of this "
                    "kind), prompt 'say it again: say it again' (12 tokens)")
    assert "(this pair;" in entry.measured_on("aaaa")
    bare = Entry(backend=Backend.CPU, drafter_kind=DrafterKind.LOOKUP, width=8)
    assert bare.measured_on("bbbb") == ("a pair the entry does not name (a generic entry: any pair of "
                                        "this kind), a prompt the entry does not name")
    hostile = Entry(backend=Backend.CPU, drafter_kind=DrafterKind.LOOKUP, width=8,
                       evidence={"measured_on": {"target": ["x"], "prompt": "y" * 500}, "prompt_tokens": True})
    assert len(hostile.measured_on(None)) < 160  # evidence is input: bounded, wrong types ignored


def test_sweep_save_prints_the_answer(tmp_path, blockwidth):
    prof = tmp_path / "p.toml"
    p = blockwidth("sweep", "--widths", "2", "-n", "1", "--max-tokens", "8", "--save", "--profile", str(prof),
                   "--record-dir", str(tmp_path / "rec"))
    assert p.returncode in (0, 1), p.stderr
    assert "+ width 4, the width in effect" in p.stderr  # resolve's width is always measured
    answer_lines = [line for line in p.stdout.splitlines() if line.startswith("answer")]
    assert answer_lines and "--num-draft-tokens" in answer_lines[0]
    assert "mlx_lm.server --model /" in p.stdout
    d = json.loads(blockwidth("sweep", "--widths", "2", "-n", "1", "--max-tokens", "8", "--save", "--profile",
                              str(prof), "--record-dir", str(tmp_path / "rec"), "--json").stdout)
    assert d["answer"]["num_draft_tokens"] is not None or d["answer"]["decline"]
    assert {"serve_command", "source", "measured", "trust"} <= set(d["answer"])


def test_ctrl_c_stops_costcurve_between_forwards_and_keeps_what_it_measured():
    """costcurve ignored two Ctrl-C presses for 7 minutes: MLX does not return to Python inside
    a forward. It now measures in a thread and stops after the forward under way."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-m", "blockwidth", "costcurve", "--rows", "1-8", "--repeats",
                          "200", "--context", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        line = ""
        while "measuring:" not in line and time.monotonic() < deadline:
            line = p.stderr.readline()  # a line per tenth of the forwards, off a terminal
        assert "measuring:" in line
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    assert "stopping the cost curve after the forward under way" in err and "Traceback" not in err
    # 3,200 forwards, up to 8 rows each (about a minute on a loaded 2-core CPU): the first
    # progress line comes after a tenth of them, so a slow reader still signals it mid-way
    assert "cancelled:" in out and "repeats per row count were measured" in out and "1 row" in out
    import re

    kept = int(re.search(r"cancelled: (\d+) of 200 repeats", out).group(1))
    assert kept < 200  # it stopped where it was, not after the thousands of forwards left


def test_an_unmeasured_served_command_on_cuda_carries_the_h200_caution(blockwidth):
    """Resolved for an H200 from the table (measured on the engine path), the mlx_lm.server
    command was never measured; stock mlx_lm.server's draft path lost there with cuDNN's
    attention (lab/evidence/h200-2026-12-02b), and the answer says so beside the command."""
    res, paths, _ = resolution(target=None, draft=None, kind=None, flag=None, device="cuda:9.0",
                               profile=None, variant="bf16")
    said = answer(res, paths)
    assert said.command and said.caution and "MLX_CUDA_USE_CUDNN_SDPA=0" in said.caution
    assert "h200-2026-12-02b" in said.caution and (ROOT / "lab" / "evidence" / "h200-2026-12-02b").is_dir()
    assert said.lines()[2].startswith("caution: on CUDA, stock mlx_lm.server's draft path ran 0.22-0.43x")
    assert _answer()[0].caution is None  # on the CPU nothing is known against the command
    p = blockwidth("resolve", "--device", "cuda:9.0")
    assert "  caution  on CUDA" in p.stdout, p.stdout
    import socket

    # serve says it at startup too (a port in use stops it there); a server, so a process
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        p = run_cli("serve", "--device", "cuda:9.0", "--port", str(held.getsockname()[1]))
    assert p.returncode == 2 and "blockwidth serve: caution: on CUDA" in p.stderr, p.stderr
