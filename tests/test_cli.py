"""The headless CLI as a user runs it: exit codes, JSON keys, one-line errors."""

import json

import pytest

from tests.conftest import ROOT

RESOLVE_KEYS = {"width", "source", "reason", "drafter_kind", "device", "target_quantization", "chain"}


def test_resolve_demo_json(blockwidth):
    p = blockwidth("resolve", "--json", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert RESOLVE_KEYS <= set(d)
    assert d["source"] in {"flag", "env", "profile", "drafter-checkpoint", "measured-default", "kind-default"}
    assert set(d["target_quantization"]) >= {"scheme", "bits", "group_size"}
    assert d["width"] == 4 and d["drafter_kind"] == "model"


def test_resolve_gb10_dflash_and_flag(tmp_path, blockwidth):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "config.json").write_text(json.dumps({"quantization": {"group_size": 64, "bits": 4}}))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"]}))
    args = ("resolve", "--target", str(tmp_path / "t"), "--draft", str(tmp_path / "d"), "--json")
    d = json.loads(blockwidth(*args, "--device", "cuda:12.1").stdout)
    assert (d["width"], d["source"], d["drafter_kind"]) == (4, "measured-default", "dflash")
    d = json.loads(blockwidth(*args, "--device", "cuda:12.1", "--draft-block-size", "16").stdout)
    assert (d["width"], d["source"]) == (16, "flag")
    d = json.loads(blockwidth(*args, "--device", "cuda:9.0").stdout)
    assert (d["width"], d["source"]) == (16, "kind-default") and "sm_90" in d["reason"]


@pytest.mark.parametrize("bad", ["0", "1", "-3", "abc", "10000"])
def test_bad_width_flag_and_env(bad, blockwidth):
    p = blockwidth("resolve", "--device", "cpu", f"--draft-block-size={bad}")
    assert p.returncode == 2 and "--draft-block-size" in p.stderr and "2 to 64" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr
    p = blockwidth("resolve", "--device", "cpu", env={"BLOCKWIDTH_DRAFT_BLOCK_SIZE": bad})
    assert p.returncode == 2 and "BLOCKWIDTH_DRAFT_BLOCK_SIZE" in p.stderr


def test_bad_target_paths(tmp_path, blockwidth):
    f = tmp_path / "file"
    f.write_text("x")
    for path, msg in ((tmp_path / "nope", "no such file"), (f, "is a file")):
        p = blockwidth("resolve", "--device", "cpu", "--target", str(path))
        assert p.returncode == 2 and str(path) in p.stderr and msg in p.stderr


def test_resolve_with_a_profile_not_there_yet_says_so_in_its_chain(tmp_path, blockwidth):
    """resolve --profile FILE exited 2 for a file not there yet, which the console and sweep
    --save take (a save creates it): it resolves, its chain saying the file is not present."""
    p = blockwidth("resolve", "--device", "cpu", "--profile", str(tmp_path / "p.toml"))
    assert p.returncode == 0, p.stderr
    assert f"{tmp_path / 'p.toml'} is not present: nothing measured" in p.stdout
    assert not (tmp_path / "p.toml").exists()


@pytest.mark.parametrize("config", [None, "{not json", "[1, 2]"])
def test_target_and_drafter_without_a_readable_config_are_refused_alike(tmp_path, config, blockwidth):
    """A target without config.json once resolved with exit 0 while a drafter exited 2."""
    bad = tmp_path / "bad"
    bad.mkdir()
    if config is not None:
        (bad / "config.json").write_text(config)
    good = ROOT / "engine/demo/pair/target-bf16"
    for args in (("--target", str(bad)), ("--target", str(good), "--draft", str(bad))):
        p = blockwidth("resolve", "--device", "cpu", *args)
        assert p.returncode == 2 and str(bad) in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_resolve_with_an_odd_quantization_says_unknown(tmp_path, blockwidth):
    (tmp_path / "config.json").write_text(json.dumps({"quantization": {"mode": "future-fp3"}}))
    p = blockwidth("resolve", "--device", "cpu", "--target", str(tmp_path), "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["target_quantization"]["scheme"] == "unknown" and "unknown quantization" in d["reason"]


def test_corrupt_profile_exit_2_untouched(tmp_path, blockwidth):
    prof = tmp_path / "p.toml"
    prof.write_text("schema = 1\n[[override]]\nbackend = 'cpu'\nwidth = 'x'\n")
    before = prof.read_bytes()
    p = blockwidth("resolve", "--device", "cpu", "--profile", str(prof))
    assert p.returncode == 2 and str(prof) in p.stderr and "line 2" in p.stderr
    assert prof.read_bytes() == before


def test_profile_entry_applies(tmp_path, blockwidth):
    prof = tmp_path / "p.toml"
    prof.write_text('schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 3\n'
                    'mlx = "0.0.1"\ntarget_quantization = { scheme = "none", bits = 16 }\n')
    d = json.loads(blockwidth("resolve", "--device", "cpu", "--profile", str(prof), "--json").stdout)
    assert (d["width"], d["source"], d["stale"]) == (3, "profile", True)


def test_inspect(blockwidth):
    d = json.loads(blockwidth("inspect", str(ROOT / "engine/demo/pair/target-4bit"), "--json").stdout)
    assert d["quantization"]["scheme"] == "affine" and d["quantization"]["bits"] == 4
    assert 4_000_000 < d["parameters"] < 5_000_000 and d["model_type"] == "llama"
    d = json.loads(blockwidth("inspect", str(ROOT / "engine/demo/pair/drafter"), "--json").stdout)
    # an ordinary causal LM: usable as a model drafter, but nothing in it declares one, so the
    # answer does not depend on the folder being called "drafter"
    assert not d["looks_like_drafter"] and d["drafter_kind"] == "model"
    d = json.loads(blockwidth("inspect", str(ROOT / "engine/demo/pair/dflash"), "--json").stdout)
    assert d["looks_like_drafter"] and d["drafter_kind"] == "dflash"


def test_inspect_odd_config_answers_and_missing_is_2(tmp_path, blockwidth):
    (tmp_path / "config.json").write_text(json.dumps({"quantization": "weird"}))
    p = blockwidth("inspect", str(tmp_path), "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["quantization"]["scheme"] == "unknown"
    # a config alone answers, but says it is not loadable (a tryout read "parameters unknown"
    # and "usable as kind model" for a folder that sweep refuses)
    assert json.loads(p.stdout)["parameters_note"] == "no *.safetensors weights: not loadable"
    p = blockwidth("inspect", str(tmp_path))
    assert "parameters   unknown (no *.safetensors weights: not loadable)" in p.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    for path in (tmp_path / "nope", empty):
        p = blockwidth("inspect", str(path))
        assert p.returncode == 2 and str(path) in p.stderr


def test_headless_never_imports_textual():
    import subprocess, sys
    code = ("import sys, blockwidth.console.cli, blockwidth.console.inputs; "
            "assert 'textual' not in sys.modules, 'textual imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_subcommand_option_before_its_subcommand_says_where_it_goes(blockwidth):
    for args, name, owner in ((("--widths", "2"), "--widths", "sweep"),
                              (("--rows", "1-4", "costcurve"), "--rows", "costcurve")):
        p = blockwidth(*args)
        assert p.returncode == 2
        assert p.stderr.strip().splitlines() == [
            f"blockwidth: error: {name} is an option of {owner}: put it after the command, "
            f"e.g. blockwidth {owner} {name} ... (see blockwidth --help)"]


def test_documented_sweeps_measured_once_say_they_cannot_be_saved():
    """A reader copies a documented sweep (README or docs/) and then adds --save: at -n 1
    (without --sequential) the method refuses every such session (classic's two single runs
    cannot tell drift from noise), so the page must say so next to the command, or the reader
    meets only the refusal."""
    import re

    from blockwidth.engine.ab import DRIFT_CHANCE, disjoint_by_chance

    assert disjoint_by_chance(1, 1) > DRIFT_CHANCE  # the note's reason, as the method has it
    once = []
    for page in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        lines = page.read_text(encoding="utf-8").splitlines()
        once += [(page.name, lines, i) for i, line in enumerate(lines)
                 if re.search(r"\bblockwidth sweep\b.*\s-n 1\b", line) and "--sequential" not in line]
    assert once  # the DFlash sweeps of the seeds' scenario (docs/dflash-mtp.md)
    for name, lines, i in once:
        near = " ".join(lines[max(0, i - 4):i + 3])
        assert "a look, not a decision" in near and "--save" in near, (name, lines[i])
