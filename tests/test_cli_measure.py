"""sweep and costcurve as a user runs them, on the demo pair (CPU)."""

import json

import sys

import pytest

from blockwidth.policy import profile
from tests.conftest import ROOT


def test_costcurve_json(blockwidth):
    p = blockwidth("costcurve", "--rows", "1,2,4", "--repeats", "3", "--context", "16", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [x["rows"] for x in d["points"]] == [1, 2, 4] and d["target_quantization"]["scheme"] == "none"


def test_costcurve_takes_the_verify_linear_choice_and_says_when_it_routed_nothing(blockwidth):
    """--verify-linear reaches costcurve's forwards: the JSON carries the routing summary (no
    key for stock, so stock curves read as before), and on this CPU gemv, a CUDA kernel,
    routes nothing, which the text output says above its times."""
    p = blockwidth("costcurve", "--rows", "1,2", "--repeats", "2", "--context", "8", "--verify-linear", "gemv",
                   "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["linear"]["mode"] == "gemv" and d["linear"]["routed_calls"] == 0
    assert d["linear"]["stock_calls"] > 0
    p = blockwidth("costcurve", "--rows", "1,2", "--repeats", "2", "--context", "8", "--verify-linear", "gemv")
    assert "verify linear gemv" in p.stdout and "routed no projection: its kernel runs on CUDA only" in p.stdout
    p = blockwidth("costcurve", "--rows", "1,2", "--repeats", "2", "--context", "8", "--json")
    assert "linear" not in json.loads(p.stdout)


def test_costcurve_text_plot(blockwidth):
    p = blockwidth("costcurve", "--demo-target", "4bit", "--rows", "1-3", "--repeats", "2", "--context", "8")
    assert p.returncode == 0, p.stderr
    assert "affine 4-bit g64" in p.stdout and "\n3 rows   |" in p.stdout and "\n1 row    |" in p.stdout
    # the figures beside each bar are named once, and none is rounded to whole ms
    assert "warm: median ms" in p.stdout and "first: ms" in p.stdout
    assert all(line.split(" first ")[1][:8].count(".") == 1 for line in p.stdout.splitlines()
               if " first " in line and "|" in line)


def test_sweep_json_and_record(tmp_path, blockwidth):
    p = blockwidth("sweep", "--widths", "2,4", "-n", "2", "--max-tokens", "16", "--json",
                   "--record-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [a["arm"] for a in d["arms"]] == ["classic", "w2", "w4"]
    assert all(a["identity"]["identical_ids"] for a in d["arms"][1:])
    assert d["decision"]["decision"] and (tmp_path / d["record_path"].split("/")[-1]).exists()
    for a in d["arms"]:
        assert len(a["decode_tok_s"]) == 3 and a["decode_tok_s"][0] <= a["decode_tok_s"][2]


@pytest.mark.parametrize("w4", [50.0, 200.0], ids=["decline", "win"])
def test_sweep_save_saves_what_the_session_decided(tmp_path, blockwidth, monkeypatch, w4):
    """The entry is what the session decided: a decline where every width measured slower (what
    a CPU's 4-bit verify gives, which costs every row), and where w4 wins, that win. The decodes
    are real; their clocks are set (classic 100 tok/s, w2 30, w4 ``w4``), so the verdict is known
    on any host, and the real work is kept small (the bf16 demo target: the 4-bit one's bfloat16
    scales make a 27-token prefill take ~0.9 s on this CPU, 24 s a test; widths 2 and 4, 4
    tokens; n 3, the fewest whose permutation p can be below 0.05 with the closing run)."""
    import itertools

    from tests.conftest import clocked_decodes

    # classic steady (its opening and closing runs overlap: no drift), each width a little spread
    clocked_decodes(monkeypatch, {None: itertools.repeat(100.0), 2: itertools.cycle([30.0, 31.0]),
                                  4: itertools.cycle([w4, w4 + 1])})
    prof = tmp_path / "p.toml"
    p = blockwidth("sweep", "--widths", "2,4", "-n", "3",
                   "--max-tokens", "4", "--save", "--profile", str(prof), "--record-dir", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    e = profile.load(prof).entries
    if w4 < 100:
        assert "saved: decline" in p.stdout and "slower" in p.stdout and e[0].decline, p.stdout + p.stderr
    else:
        assert "beats classic" in p.stdout and "saved: width 4" in p.stdout and e[0].width == 4, p.stdout
    assert len(e) == 1 and e[0].quant_scheme == "none"  # keyed on the target it was measured on
    assert e[0].evidence["record"].startswith(str(tmp_path))
    assert e[0].device_name  # the device it was measured on is recorded


def test_a_workload_sessions_entry_names_its_workload_not_the_built_in_prompt(tmp_path, blockwidth, monkeypatch):
    """SmolLM2 spelling (2 requests) saved an entry whose measured_on.prompt was the built-in
    demo prompt ("class Stack: ..."), which the session never ran."""
    import itertools

    from tests.conftest import clocked_decodes

    clocked_decodes(monkeypatch, {None: itertools.repeat(100.0), 2: itertools.cycle([30.0, 31.0]),
                                  4: itertools.cycle([200.0, 201.0])})
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"id": "a", "prompt": "def f(x):\\n    return"}\n{"id": "b", "prompt": "import os\\n"}\n')
    prof = tmp_path / "p.toml"
    p = blockwidth("sweep", "--widths", "2,4", "-n", "3", "--max-tokens", "4", "--workload", str(wl),
                   "--save", "--profile", str(prof), "--record-dir", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    (entry,) = profile.load(prof).entries
    assert "prompt" not in entry.evidence["measured_on"], entry.evidence["measured_on"]
    assert entry.evidence["workload"]["name"] == "w.jsonl" and entry.evidence["workload"]["requests"] == 2
    assert "class Stack" not in prof.read_text()
    # each repetition's end says the time left, from the runs measured so far (policy.pace.Clock)
    import re

    reps = [line for line in p.stderr.splitlines() if "[rep]" in line]
    assert len(reps) == 3 and all(re.search(r"repetition \d done; about (\d+ s|\d+\.\d min) left$", r)
                                  for r in reps), p.stderr


def test_the_tty_progress_line_says_the_time_left_before_where_the_run_is(tmp_path, blockwidth, monkeypatch):
    """The redrawn progress line is cut to the terminal's width; with the time left last, a
    workload's request ids pushed it off an 80-column line. It now comes right after the bar."""
    import io
    import itertools
    import re

    from tests.conftest import clocked_decodes

    class Tty(io.TextIOBase):
        def __init__(self, inner):
            self.inner = inner

        def isatty(self):
            return True

        def write(self, s):
            return self.inner.write(s)

        def flush(self):
            self.inner.flush()

    clocked_decodes(monkeypatch, {None: itertools.repeat(100.0), 2: itertools.repeat(30.0),
                                  4: itertools.repeat(30.0)})  # 4: the width in effect, added
    monkeypatch.setattr(sys, "stderr", Tty(sys.stderr))
    monkeypatch.setenv("COLUMNS", "80")
    wl = tmp_path / "w.jsonl"
    wl.write_text('{"id": "a-long-request-id", "prompt": "def f(x):\\n    return"}\n'
                  '{"id": "b-long-request-id", "prompt": "import os\\n"}\n')
    p = blockwidth("sweep", "--widths", "2", "-n", "2", "--max-tokens", "4", "--workload", str(wl),
                   "--record-dir", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [seg for seg in p.stderr.replace("\x1b[K", "").split("\r") if "%" in seg and "[" in seg]
    timed = [seg for seg in lines if " left" in seg]
    assert timed, lines
    assert all(len(seg.rstrip("\n")) <= 79 for seg in lines)
    assert all(re.match(r"  \[[#.]{16}\] +\d+%  about [\d.]+ (s|min) left · [ab]-long-request ", seg)
               for seg in timed), timed


def test_a_sweep_without_save_says_its_saveable_answer_was_not_saved(tmp_path, blockwidth, monkeypatch):
    """A tryout read "width 2 beats classic" on SmolLM2, then resolve still gave the per-kind
    default: nothing said the winner was not stored. It says so now, and how to store it."""
    import itertools

    from tests.conftest import clocked_decodes

    clocked_decodes(monkeypatch, {None: itertools.repeat(100.0), 2: itertools.cycle([30.0, 31.0]),
                                  4: itertools.cycle([200.0, 201.0])})
    p = blockwidth("sweep", "--widths", "2,4", "-n", "3", "--max-tokens", "4", "--record-dir", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "beats classic" in p.stdout
    assert "not saved: rerun with --save to store width 4 in the profile, so resolve and serve use it" in p.stdout


@pytest.mark.parametrize("args,needle", [
    (("--widths", "1,4"), "width 1 is out of range; each width is 2..64 (width 1 is classic, which every session runs)"),
    (("--widths", "4,x"), "'x' is not an integer"),
    (("--max-tokens", "0"), "--max-tokens: 0 is out of range"),
    (("--prompt", ""), "prompt: empty"),
    (("--prompt-file", "/nope/prompt.txt"), "--prompt-file /nope/prompt.txt"),
    (("--target", "/nope"), "--target /nope: no such file"),
    (("--target", str(ROOT / "engine/demo/pair/target-bf16"), "--draft", str(ROOT / "engine/demo/pair/drafter"),
      "--kind", "dflash"), "architectures [LlamaForCausalLM] is not DFlashDraftModel"),
    (("--target", str(ROOT / "engine/demo/pair/target-bf16"), "--draft", str(ROOT / "engine/demo/pair/drafter"),
      "--kind", "eagle"), "the embedded engine runs only"),
])
def test_sweep_bad_input_exit_2(args, needle, tmp_path, blockwidth):
    p = blockwidth("sweep", "-n", "1", "--max-tokens", "4", "--record-dir", str(tmp_path), *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert not list(tmp_path.glob("session-*.json"))  # no partial record presented as a measurement


def test_pair_specific_save_is_matched_by_resolve(tmp_path, blockwidth):
    """A --pair-specific entry written from a sweep must be found again by resolve."""
    from blockwidth.console.inputs import pair_paths
    from blockwidth.engine.checkpoint import pair_id
    from blockwidth.engine.pair import load_pair

    paths = pair_paths(None, None)
    assert load_pair(paths.target, paths.drafter).pair_id == pair_id(paths.target, paths.drafter)
    prof = tmp_path / "p.toml"
    pid = pair_id(paths.target, paths.drafter)
    prof.write_text(f'schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 5\n'
                    f'pair = "{pid}"\n')
    d = json.loads(blockwidth("resolve", "--device", "cpu", "--profile", str(prof), "--json").stdout)
    assert (d["width"], d["source"]) == (5, "profile")


def test_sweep_save_refuses_a_corrupt_default_profile_before_measuring(tmp_path, blockwidth):
    """The default profile is validated before any model loads, not after the sweep."""
    import os

    default = tmp_path / "config" / "blockwidth" / "profile.toml"
    default.parent.mkdir(parents=True)
    default.write_text("schema = 1\n[[override]\nwidth = 4\n")
    before = default.read_bytes()
    p = blockwidth("sweep", "--widths", "2", "-n", "1", "--max-tokens", "4", "--save",
                   "--record-dir", str(tmp_path / "rec"), env={"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]})
    assert p.returncode == 2 and str(default) in p.stderr and "not valid TOML" in p.stderr, p.stderr
    assert not list((tmp_path / "rec").glob("session-*.json")) and default.read_bytes() == before
