"""sweep and costcurve as a user runs them, on the demo pair (CPU)."""

import json

import pytest

from blockwidth.policy import profile
from tests.conftest import ROOT, run_cli


def test_costcurve_json():
    p = run_cli("costcurve", "--rows", "1,2,4", "--repeats", "3", "--context", "16", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [x["rows"] for x in d["points"]] == [1, 2, 4] and d["target_quantization"]["scheme"] == "none"


def test_costcurve_takes_the_verify_linear_choice_and_says_when_it_routed_nothing():
    """--verify-linear reaches costcurve's forwards: the JSON carries the routing summary (no
    key for stock, so stock curves read as before), and on this CPU gemv, a CUDA kernel,
    routes nothing, which the text output says above its times."""
    p = run_cli("costcurve", "--rows", "1,2", "--repeats", "2", "--context", "8", "--verify-linear", "gemv",
                "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["linear"]["mode"] == "gemv" and d["linear"]["routed_calls"] == 0
    assert d["linear"]["stock_calls"] > 0
    p = run_cli("costcurve", "--rows", "1,2", "--repeats", "2", "--context", "8", "--verify-linear", "gemv")
    assert "verify linear gemv" in p.stdout and "routed no projection: its kernel runs on CUDA only" in p.stdout
    p = run_cli("costcurve", "--rows", "1,2", "--repeats", "2", "--context", "8", "--json")
    assert "linear" not in json.loads(p.stdout)


def test_costcurve_text_plot():
    p = run_cli("costcurve", "--demo-target", "4bit", "--rows", "1-3", "--repeats", "2", "--context", "8")
    assert p.returncode == 0, p.stderr
    assert "affine 4-bit g64" in p.stdout and "\n3 rows   |" in p.stdout and "\n1 row    |" in p.stdout
    # the figures beside each bar are named once, and none is rounded to whole ms
    assert "warm: median ms" in p.stdout and "first: ms" in p.stdout
    assert all(line.split(" first ")[1][:8].count(".") == 1 for line in p.stdout.splitlines()
               if " first " in line and "|" in line)


def test_sweep_json_and_record(tmp_path):
    p = run_cli("sweep", "--widths", "2,4", "-n", "2", "--max-tokens", "16", "--json",
                "--record-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert [a["arm"] for a in d["arms"]] == ["classic", "w2", "w4"]
    assert all(a["identity"]["identical_ids"] for a in d["arms"][1:])
    assert d["decision"]["decision"] and (tmp_path / d["record_path"].split("/")[-1]).exists()
    for a in d["arms"]:
        assert len(a["decode_tok_s"]) == 3 and a["decode_tok_s"][0] <= a["decode_tok_s"][2]


def test_sweep_save_saves_or_refuses_honestly(tmp_path):
    prof = tmp_path / "p.toml"
    p = run_cli("sweep", "--demo-target", "4bit", "--widths", "8", "-n", "2",
                "--max-tokens", "12", "--save", "--profile", str(prof), "--record-dir", str(tmp_path))
    # On a CPU a 4-bit verify costs every row (8 rows ~ 6x one row) and the demo drafter keeps
    # about half of 7 drafts: width 8 is far slower than classic, so the outcome is a decline.
    # (The width in effect, 4, is added and measured too; on a loaded host a noisy n = 2 can let
    # it win, and then that win is what is saved: the entry must be what the session decided.)
    if p.returncode == 0:
        e = profile.load(prof).entries
        if "saved: decline" in p.stdout:
            assert "slower" in p.stdout and e[0].decline, p.stdout + p.stderr
        else:
            assert "beats classic" in p.stdout and f"saved: width {e[0].width}" in p.stdout, p.stdout
        assert len(e) == 1 and e[0].quant_scheme == "affine" and e[0].quant_bits == 4
        assert e[0].evidence["record"].startswith(str(tmp_path))
        assert e[0].device_name  # issue 7: the device it was measured on is recorded
    else:
        # a noisy host can leave it undecided, or drift: then nothing is saved, and it says why
        assert p.returncode == 1 and "not saved" in p.stderr, p.stdout + p.stderr
        assert "drift" in p.stderr or "undecided" in p.stderr
        assert not prof.exists()


@pytest.mark.parametrize("args,needle", [
    (("--widths", "1,4"), "width 1 is out of range"),
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
def test_sweep_bad_input_exit_2(args, needle, tmp_path):
    p = run_cli("sweep", "-n", "1", "--max-tokens", "4", "--record-dir", str(tmp_path), *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert not list(tmp_path.glob("session-*.json"))  # no partial record presented as a measurement


def test_pair_specific_save_is_matched_by_resolve(tmp_path):
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
    d = json.loads(run_cli("resolve", "--device", "cpu", "--profile", str(prof), "--json").stdout)
    assert (d["width"], d["source"]) == (5, "profile")


def test_sweep_save_refuses_a_corrupt_default_profile_before_measuring(tmp_path):
    """The default profile is validated before any model loads, not after the sweep."""
    import os

    default = tmp_path / "config" / "blockwidth" / "profile.toml"
    default.parent.mkdir(parents=True)
    default.write_text("schema = 1\n[[override]\nwidth = 4\n")
    before = default.read_bytes()
    p = run_cli("sweep", "--widths", "2", "-n", "1", "--max-tokens", "4", "--save",
                "--record-dir", str(tmp_path / "rec"), env={"XDG_CONFIG_HOME": os.environ["XDG_CONFIG_HOME"]})
    assert p.returncode == 2 and str(default) in p.stderr and "not valid TOML" in p.stderr, p.stderr
    assert not list((tmp_path / "rec").glob("session-*.json")) and default.read_bytes() == before
