"""Hostile input, second round (issue 24): a test per class, each fixture built here.

Cases that could grow memory run under an address-space limit (RLIMIT_AS) in the child, so a
regression fails the test instead of filling the shared machine; cases that must not hang run
under a timeout."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

DEMO = ROOT / "engine/demo/pair"
GiB = 1 << 30
BIG = "1" * 5000  # int() of more than 4,300 digits raises


def cli(*args: str, env: dict | None = None, memory: int | None = None, fsize: int | None = None,
        stdout=subprocess.PIPE, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``blockwidth ARGS`` in a child with resource limits: ``memory`` bytes of address space,
    ``fsize`` bytes per written file (a record or a report larger fails with EFBIG)."""
    def limits() -> None:
        if memory:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        if fsize:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    full = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    return subprocess.run([sys.executable, "-m", "blockwidth", *args], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, env=full, cwd=cwd or ROOT,
                          timeout=timeout, preexec_fn=limits)


def one_line(p: subprocess.CompletedProcess, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "\x1b" not in err, err
    return err


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(f: Path, change) -> bytes:
    data = json.loads(f.read_text())
    change(data)
    f.write_text(json.dumps(data))
    return f.read_bytes()


def sweep(target: Path, tmp_path: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return cli("sweep", "--target", str(target), "-n", "1", "--max-tokens", "4", "--widths", "2",
               "--record-dir", str(tmp_path / "rec"), *extra, **kw)


# ---- 1. crashes and runaway memory -------------------------------------------------------------

def _shift_vocab(d: Path, shift: int, least: int) -> None:
    """Move every token id >= ``least`` up by ``shift``: ids the embedding table has no row for."""
    def change(t):
        vocab = t["model"]["vocab"]
        for k, v in vocab.items():
            if v >= least:
                vocab[k] = v + shift
    edit_json(d / "tokenizer.json", change)


@pytest.mark.parametrize("shift", [1 << 28, 40], ids=["far", "just-past"])
def test_token_ids_past_the_embedding_are_refused_before_any_forward(tmp_path, shift):
    """Far past the table this was SIGSEGV; just past it, a run that read beyond the table, exit 0."""
    t = copy(DEMO / "target-bf16", tmp_path / "target")
    _shift_vocab(t, shift, 2048 - 40)
    p = sweep(t, tmp_path, memory=6 * GiB)
    line = one_line(p)
    assert "token id" in line and "2,048 rows" in line and "embed_tokens" in line, line
    assert not (tmp_path / "rec").exists() or not list((tmp_path / "rec").glob("session-*"))
    # the served path (mlx_lm.server loads the weights) checks the same, through the same door
    from blockwidth.policy.errors import BlockwidthError
    from blockwidth.engine.session.served import served_pair

    # (a drafter with the same shifted tokenizer: the served path compares the tokenizers too)
    d = copy(DEMO / "drafter", tmp_path / "drafter")
    _shift_vocab(d, shift, 2048 - 40)
    with pytest.raises(BlockwidthError, match="token id"):
        served_pair(t, d)


def test_a_prompt_id_the_tables_have_no_row_for_is_refused(tmp_path):
    """The vocabulary can be in range while the tokenizer still emits an id outside it (a
    post-processor's special token): the prompt's own ids are checked before any forward."""
    t = copy(DEMO / "target-bf16", tmp_path / "target")

    def change(tok):
        tok["post_processor"] = {"type": "TemplateProcessing",
                                 "single": [{"SpecialToken": {"id": "<evil>", "type_id": 0}},
                                            {"Sequence": {"id": "A", "type_id": 0}}],
                                 "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                                 "special_tokens": {"<evil>": {"id": "<evil>", "ids": [1 << 28],
                                                               "tokens": ["<evil>"]}}}
    edit_json(t / "tokenizer.json", change)
    p = sweep(t, tmp_path, memory=6 * GiB)
    line = one_line(p)
    assert "token id 268,435,456" in line and "2,048 rows" in line, line


@pytest.mark.parametrize("key,value,needle", [
    ("num_hidden_layers", 1_000_000, "num_hidden_layers = 1,000,000: more than any model states"),
    ("vocab_size", 4096, "vocab_size = 4,096, but the weights' model.embed_tokens.weight has 2,048 rows"),
    ("hidden_size", 512, "hidden_size = 512, but the weights' model.embed_tokens.weight is 256 wide"),
    ("intermediate_size", 10**9, "intermediate_size = 1,000,000,000: more than any model states"),
])
def test_config_sizes_are_checked_against_the_weights_before_a_model_is_built(tmp_path, key, value, needle):
    """A million layers grew to 23 GB before the machine ran out: under a 3 GiB limit here."""
    t = copy(DEMO / "target-bf16", tmp_path / "target")
    before = edit_json(t / "config.json", lambda c: c.__setitem__(key, value))
    line = one_line(sweep(t, tmp_path, memory=3 * GiB))
    assert needle in line and "config.json" in line, line
    assert (t / "config.json").read_bytes() == before


def test_weights_larger_than_the_device_are_refused_before_loading(tmp_path):
    """A sparse file: 1 TiB of weights on disk that cost nothing, and would fill any machine."""
    from blockwidth.engine.shapes import device_memory

    t = tmp_path / "huge"
    t.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEMO / "target-bf16" / f, t / f)
    n = 1 << 39  # BF16 elements: 1 TiB
    header = json.dumps({"blob": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}}).encode()
    with open(t / "model.safetensors", "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        try:
            fh.truncate(8 + len(header) + 2 * n)
        except OSError:
            pytest.skip("this file system has no sparse files")
    if (device_memory() or 0) >= 2 * n:
        pytest.skip("a device with more than 1 TiB")
    line = one_line(sweep(t, tmp_path, memory=3 * GiB))
    assert "of memory" in line and "1024.0 GiB" in line, line


def test_row_ranges_are_bounded_before_they_are_expanded():
    for rows in ("1-99999999999999", "1-" + BIG, "5-600", "0-3"):
        line = one_line(cli("costcurve", "--rows", rows, memory=2 * GiB, timeout=120))
        assert "row counts must be 1..512" in line, line
    from blockwidth.engine.costcurve import parse_rows

    assert parse_rows("1-4,8") == (1, 2, 3, 4, 8)


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
    p = cli("--check", "--json", "--profile", str(prof), "--device", "cpu", memory=2 * GiB, timeout=300)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    record_check = next(c for c in doc["checks"] if c["name"] == "entry 1: record")
    assert record_check["status"] == "fail" and "over the 128 MiB limit" in record_check["detail"]


# ---- 2. hangs -----------------------------------------------------------------------------------

def test_outputs_that_are_not_regular_files_are_refused_before_any_work(tmp_path):
    fifo = tmp_path / "report.xml"
    os.mkfifo(fifo)
    profile = ROOT / "examples/profile.toml"
    for junit, needle in ((fifo, "is a FIFO"), (Path("/dev/null"), "is a character device"),
                          (tmp_path, "is a directory"), (tmp_path / "no" / "r.xml", "does not exist")):
        p = cli("--check", "--profile", str(profile), "--device", "cpu", "--junit", str(junit), timeout=120)
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


# ---- 3. a write that fails after the measurement ------------------------------------------------

def test_a_record_that_cannot_be_written_keeps_the_results(tmp_path):
    """A file-size limit (EFBIG) on the record: the table is printed, then one line, exit 2."""
    p = cli("sweep", "-n", "1", "--max-tokens", "4", "--widths", "2", "--record-dir", str(tmp_path / "rec"),
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


# ---- 4. tracebacks ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,env,needle", [
    (("resolve", "--device", "cpu", "--draft-block-size", BIG), {}, "--draft-block-size = 111"),
    (("resolve", "--device", "cpu"), {"BLOCKWIDTH_DRAFT_BLOCK_SIZE": BIG}, "BLOCKWIDTH_DRAFT_BLOCK_SIZE = 111"),
    (("resolve", "--device", "cpu"), {"MLXCEL_DRAFT_BLOCK_SIZE": BIG}, "MLXCEL_DRAFT_BLOCK_SIZE = 111"),
    (("resolve", "--device", f"cuda:{BIG}.0"), {}, "--device 'cuda:111"),
    (("sweep", "--widths", BIG), {}, "--widths '111"),
    (("sweep", "-n", BIG), {}, "-n: 111"),
    (("sweep", "--max-tokens", BIG), {}, "--max-tokens: 111"),
    (("costcurve", "--context", BIG), {}, "--context: 111"),
    (("sweep", "--max-seconds", BIG), {}, "--max-seconds"),
])
def test_numbers_of_more_than_4300_digits_are_one_line(args, env, needle):
    line = one_line(cli(*args, env=env, timeout=120))
    assert needle in line and len(line) < 400, line


def test_a_profile_number_of_more_than_4300_digits_still_gives_json_and_junit(tmp_path):
    prof = tmp_path / "p.toml"
    prof.write_text(f'schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = {BIG}\n')
    junit = tmp_path / "r.xml"
    p = cli("--check", "--json", "--junit", str(junit), "--profile", str(prof), "--device", "cpu", timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    doc = json.loads(p.stdout)
    assert doc["exit_code"] == 2 and "line 5: a number of more than 4,300 digits" in doc["errors"][0]
    assert b'errors="1"' in junit.read_bytes()


def test_an_argument_that_is_not_utf8_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "blockwidth", "sweep", b"--prompt", b"ab\xff\xfe"],
                       capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=120)
    err = p.stderr.decode()
    assert p.returncode == 2 and len(err.strip().splitlines()) == 1 and "not valid UTF-8" in err, err
    # a path that is not UTF-8 is a name, not an error of its own: shown escaped, in one line
    p = subprocess.run([sys.executable, "-m", "blockwidth", "inspect", os.fsencode(tmp_path) + b"/\xff"],
                       capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=120)
    err = p.stderr.decode()
    assert p.returncode == 2 and "\\xff: no such file" in err and len(err.strip().splitlines()) == 1, err


def test_stdout_on_a_full_device_is_one_line():
    with open("/dev/full", "w") as full:
        for args in (("resolve", "--device", "cpu"), ("resolve", "--device", "cpu", "--json"),
                     ("inspect", str(DEMO / "drafter"))):
            p = cli(*args, stdout=full, timeout=120)
            assert p.returncode == 2, p.stderr
            assert p.stderr.strip() == "blockwidth: error: stdout cannot be written (No space left on device)"


# ---- 5. outputs that lie or destroy -------------------------------------------------------------

def test_check_json_says_the_exit_code_the_process_exits_with(tmp_path):
    """--junit that fails when written (a file-size limit): the JSON says exit 2, as the exit."""
    p = cli("--check", "--json", "--profile", str(ROOT / "examples/profile.toml"), "--device", "cpu",
            "--junit", str(tmp_path / "r.xml"), fsize=512, timeout=120)
    doc = json.loads(p.stdout)
    assert p.returncode == 2 and doc["exit_code"] == 2 and "cannot be written" in doc["errors"][0]
    assert p.stderr.strip().splitlines()[-1].startswith("blockwidth: error: --junit")


@pytest.mark.parametrize("how", ["hard link", "symlink"])
def test_an_output_that_is_an_input_under_another_name_is_refused(tmp_path, how):
    prof = tmp_path / "p.toml"
    shutil.copy(ROOT / "examples/profile.toml", prof)
    before = prof.read_bytes()
    other = tmp_path / "report.xml"
    os.link(prof, other) if how == "hard link" else os.symlink(prof, other)
    p = cli("--check", "--profile", str(prof), "--device", "cpu", "--junit", str(other), timeout=120)
    assert "the profile" in one_line(p) and "never writes over its inputs" in p.stderr
    assert prof.read_bytes() == before


def test_json_never_says_infinity_and_files_never_hold_it(tmp_path):
    from blockwidth.policy import files

    assert json.loads(files.dumps_json({"a": float("inf"), "b": [float("nan"), 1.5]})) == {"a": None,
                                                                                            "b": [None, 1.5]}
    t = copy(DEMO / "target-bf16", tmp_path / "t")
    (t / "config.json").write_text((t / "config.json").read_text().replace('"vocab_size": 2048',
                                                                           '"vocab_size": 1e400'))
    p = cli("inspect", "--json", str(t), timeout=120)
    assert "Infinity" not in p.stdout and "1e400 is out of range" in one_line(p)


def test_a_safetensors_header_mlx_refuses_is_not_counted(tmp_path):
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 16]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    import mlx.core as mx

    with pytest.raises(RuntimeError):  # what MLX says of it
        mx.load(str(d / "model.safetensors"))
    doc = json.loads(cli("inspect", "--json", str(d), timeout=120).stdout)
    assert doc["parameters"] is None and "needs 4000000000000 bytes" in doc["parameters_note"]


def test_a_broken_quantization_sidecar_is_an_error_not_unquantized(tmp_path):
    t = copy(DEMO / "target-bf16", tmp_path / "t")
    (t / "hf_quant_config.json").write_text('{"producer": {"name": "modelopt"}, "quantization": {"quant_al')
    for args in (("inspect", str(t)), ("resolve", "--device", "cpu", "--target", str(t)),
                 ("sweep", "--target", str(t), "-n", "1", "--max-tokens", "4", "--widths", "2",
                  "--record-dir", str(tmp_path / "rec"))):
        line = one_line(cli(*args, timeout=300))
        assert "hf_quant_config.json" in line and "not valid JSON" in line, (args, line)


# ---- 6. terminal injection ----------------------------------------------------------------------

EVIL = "llama\x1b]0;pwned\x07\x1b[2J\nforged: line\u202e"


def test_names_from_a_checkpoint_reach_the_terminal_escaped(tmp_path):
    t = copy(DEMO / "target-bf16", tmp_path / "t")
    edit_json(t / "config.json", lambda c: c.update(model_type=EVIL, architectures=["A\x1b[31mB"]))
    p = cli("inspect", str(t), timeout=120)
    assert p.returncode == 0 and "\x1b" not in p.stdout and "\x07" not in p.stdout and "\u202e" not in p.stdout
    assert not any(line.startswith("forged") for line in p.stdout.splitlines())
    assert "llama\\x1b]0;pwned\\x07\\x1b[2J\\nforged: line\\u202e" in p.stdout
    assert json.loads(cli("inspect", "--json", str(t), timeout=120).stdout)["model_type"] == EVIL


def test_a_path_with_escapes_and_newlines_is_one_line_everywhere(tmp_path):
    evil = tmp_path / "t\x1b[2J\nforged"
    for args in (("resolve", "--device", "cpu", "--target", str(evil)), ("inspect", str(evil)),
                 ("sweep", "--target", str(evil)), ("--check", "--profile", str(evil), "--device", "cpu")):
        line = one_line(cli(*args, timeout=120))
        assert "t\\x1b[2J\\nforged" in line, (args, line)
    copy(DEMO / "target-bf16", evil)  # a real folder of that name: its name in normal output too
    p = cli("resolve", "--device", "cpu", "--target", str(evil), timeout=120)
    assert p.returncode == 0 and "\x1b" not in p.stdout and "t\\x1b[2J\\nforged" in p.stdout


def test_a_record_named_by_the_profile_reaches_the_check_report_escaped(tmp_path):
    (tmp_path / "rec.json").write_text(json.dumps({"host": {"mlx": "0.1", "device": {
        "backend": "cpu", "name": "x\x1b[2J\nforged: pass"}}}))
    prof = tmp_path / "p.toml"
    prof.write_text('schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                    'evidence = { record = "rec.json" }\n')
    p = cli("--check", "--profile", str(prof), "--device", "cpu", timeout=120)
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


# ---- 7. small promise gaps ----------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["cuda:\u0669.0", "cuda:9.\u0660", "cuda:\uff19.0"])
def test_a_device_spec_takes_ascii_digits_only(spec):
    assert "ASCII digits" in one_line(cli("resolve", "--device", spec, timeout=120))


@pytest.mark.parametrize("command", [("resolve", "--device", "cpu"), ("sweep",), ("costcurve",), ()])
def test_demo_target_with_a_target_is_refused(command):
    args = [*command, "--target", str(DEMO / "target-bf16"), "--demo-target", "4bit"]
    if not command:
        args += ["--device", "cpu"]
    assert "--demo-target 4bit given with a target" in one_line(cli(*args, timeout=120))


@pytest.mark.parametrize("args,needle", [
    (("--kind", "dflash"), "--draft missing: drafter kind dflash needs a drafter checkpoint folder"),
    (("--kind", "lookup", "--draft", str(DEMO / "drafter")), "given with drafter kind lookup"),
])
def test_the_console_refuses_what_sweep_refuses_before_it_opens(args, needle):
    target = ("--target", str(DEMO / "target-bf16"))
    for command in (("sweep", *target, *args), (*target, *args, "--device", "cpu")):
        assert needle in one_line(cli(*command, timeout=120)), command


def test_a_profile_error_names_the_right_line_after_a_multiline_string(tmp_path):
    from blockwidth.policy import profile

    text = ('schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
            'note = """\n[[override]]\nnot a header, a note\n"""\n'
            "[[override]]\nbackend = 'cpu'\ndrafter_kind = 'model'\nwidth = 1\n")
    with pytest.raises(profile.ProfileError) as e:
        profile.parse(text, Path("p.toml"))
    assert "entry 2 (line 10): width = 1" in str(e.value), str(e.value)


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
