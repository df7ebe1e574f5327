"""Hostile and careless input (issue 7): no checkpoint code runs, nothing is silently
dropped, no traceback, no hang. Every fixture is built here, from the demo pair."""

from __future__ import annotations

import json
import os
import signal
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

DEMO = ROOT / "engine/demo/pair"
EVIL_CODE = """
import os, pathlib
pathlib.Path(os.environ["EVIL_MARKER"]).write_text("checkpoint code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_config(d: Path, key: str, value=None, *, drop: bool = False) -> bytes:
    """Set (or drop) one key of ``d``/config.json; the file's bytes after, which a refusal must
    leave as they are."""
    f = d / "config.json"
    config = json.loads(f.read_text())
    if drop:
        del config[key]
    else:
        config[key] = value
    f.write_text(json.dumps(config))
    return f.read_bytes()


def evil_checkpoint(tmp_path: Path, role: str, where: str, key: str = "auto_map") -> Path:
    """A copy of a demo checkpoint whose ``where`` JSON asks to run its own Python."""
    src = DEMO / ("drafter" if role == "drafter" else "target-bf16")
    d = _copy(src, tmp_path / f"evil-{role}-{where}-{key}")
    (d / "tokenization_evil.py").write_text(EVIL_CODE)
    f = d / where
    data = json.loads(f.read_text())
    data.pop("tokenizer_class", None)
    data[key] = ({"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None],
                  "AutoConfig": "tokenization_evil.EvilTokenizer"} if key == "auto_map"
                 else "tokenization_evil.py")
    f.write_text(json.dumps(data))
    return d


def run_with_yes(*args: str, marker: Path) -> subprocess.CompletedProcess:
    """``blockwidth ARGS`` with 'y' answers waiting on stdin, as `yes | blockwidth` would."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), EVIL_MARKER=str(marker))
    return subprocess.run([sys.executable, "-m", "blockwidth", *args], input="y\n" * 50,
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("where,key", [("tokenizer_config.json", "auto_map"),
                                       ("config.json", "auto_map"), ("config.json", "model_file")])
@pytest.mark.parametrize("role", ["target", "drafter"])
def test_checkpoint_code_never_runs_on_any_path(tmp_path, role, where, key):
    evil = evil_checkpoint(tmp_path, role, where, key)
    marker = tmp_path / "RAN"
    target = evil if role == "target" else DEMO / "target-bf16"
    pair = ["--target", str(target), "--draft", str(evil if role == "drafter" else DEMO / "drafter")]
    rec = tmp_path / "records"
    commands = [
        ["resolve", "--device", "cpu", *pair],
        ["inspect", str(evil)],
        ["sweep", *pair, "-n", "1", "--max-tokens", "4", "--widths", "2", "--record-dir", str(rec)],
        [*pair, "--device", "cpu"],  # the console: refused before it opens
    ]
    if role == "target":
        commands.append(["costcurve", "--target", str(evil), "--rows", "1", "--repeats", "1"])
    for args in commands:
        p = run_with_yes(*args, marker=marker)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        line = p.stderr.strip()
        assert len(line.splitlines()) == 1 and str(evil / where) in line and key in line, (args, line)
        assert "Traceback" not in p.stderr and "custom code?" not in p.stdout + p.stderr
        assert not marker.exists(), f"checkpoint code ran for {args}"


def test_tokenizer_loader_refuses_even_without_the_check(tmp_path):
    """Belt and braces: the engine's tokenizer loader itself never prompts or runs code."""
    evil = evil_checkpoint(tmp_path, "drafter", "tokenizer_config.json")
    marker = tmp_path / "RAN"
    code = ("from pathlib import Path\nfrom engine.pair import PairError, _load_tokenizer\n"
            f"try:\n    _load_tokenizer(Path({str(evil)!r}), 'drafter', {{}})\n"
            "except PairError as e:\n    print('refused:', e)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), EVIL_MARKER=str(marker))
    p = subprocess.run([sys.executable, "-c", code], input="y\n" * 10, capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=300)
    assert p.stdout.startswith("refused:") and len(p.stdout.strip().splitlines()) == 1, p.stdout + p.stderr
    assert not marker.exists()


# --- checkpoint files that are wrong in shape, not in intent ---------------------------


def _safetensors(path: Path, header: dict, data_bytes: int) -> None:
    body = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + b"\0" * data_bytes)


def _folder(tmp_path: Path, name: str, config: dict | str, header: dict | None = None,
            data_bytes: int = 16) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if header is not None:
        _safetensors(d / "model.safetensors", header, data_bytes)
    return d


GOOD_TENSOR = {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}


@pytest.mark.parametrize("name,config,header,data,needle", [
    ("deep-json", "[" * 100000 + "]" * 100000, None, 0, "nested deeper"),
    ("nan", '{"model_type": "llama", "vocab_size": NaN}', None, 0, "NaN is not JSON"),
    ("shape-str", {"model_type": "llama"}, {"w": {"dtype": "F32", "shape": "2x2", "data_offsets": [0, 16]}},
     16, "shape"),
    ("shape-null", {"model_type": "llama"}, {"w": {"dtype": "F32", "shape": None, "data_offsets": [0, 16]}},
     16, "shape"),
    ("truncated", {"model_type": "llama"}, {"w": {"dtype": "F32", "shape": [1000], "data_offsets": [0, 4000]}},
     16, "truncated"),
    ("deep-header", {"model_type": "llama"}, {"w": json.loads("[" * 300 + "]" * 300)}, 0, "nested deeper"),
], ids=lambda v: str(v)[:24])  # a 200,000-character id reaches PYTEST_CURRENT_TEST, and the CLI subprocess
# then fails to start: the environment string exceeds the kernel's 128 KiB limit (E2BIG)
def test_broken_checkpoints_are_one_line(tmp_path, name, config, header, data, needle):
    d = _folder(tmp_path, name, config, header, data)
    p = run_cli("inspect", str(d), "--json")
    out = p.stdout + p.stderr
    assert "Traceback" not in out and "NaN" not in p.stdout
    if p.returncode == 0:  # the config read fine; the weights are reported, not counted
        data_out = json.loads(p.stdout)
        assert data_out["parameters"] is None and needle in data_out["parameters_note"], data_out
    else:
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    p = run_cli("resolve", "--device", "cpu", "--target", str(d))  # reads the config, not the weights
    assert "Traceback" not in p.stderr and len(p.stderr.splitlines()) <= 1
    assert p.returncode == (2 if header is None else 0), p.stderr


def test_odd_architectures_and_a_directory_for_weights(tmp_path):
    d = _folder(tmp_path, "archs", {"model_type": "llama", "architectures": [1, None]},
                {"w": GOOD_TENSOR})
    p = run_cli("inspect", str(d))
    assert p.returncode == 0 and "1, null" in p.stdout, p.stderr
    d = _folder(tmp_path, "dir-weights", {"model_type": "llama"})
    (d / "model.safetensors").mkdir()
    p = run_cli("inspect", str(d), "--json")
    assert p.returncode == 0 and "is a directory" in json.loads(p.stdout)["parameters_note"]
    p = run_cli("resolve", "--device", "cpu", "--target", str(d))
    assert p.returncode == 2 and "is a directory" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("role,key,value", [("drafter", "hidden_size", "big"), ("target", "vocab_size", 0),
                                            ("drafter", "num_hidden_layers", True)])
def test_a_bad_size_in_config_json_names_the_file_and_key(tmp_path, role, key, value):
    """transformers validates these only while loading the tokenizer, which used to blame it."""
    target = _copy(DEMO / "target-bf16", tmp_path / "target")
    drafter = _copy(DEMO / "drafter", tmp_path / "drafter")
    bad = target if role == "target" else drafter
    before = _edit_config(bad, key, value)
    p = run_cli("sweep", "--target", str(target), "--draft", str(drafter), "-n", "1", "--max-tokens", "8",
                "--widths", "2", "--record-dir", str(tmp_path / "rec"))
    line = one_line_exit(p)
    assert f"{bad / 'config.json'}: {key} = {value!r}" in line and "tokenizer" not in line, line
    assert (bad / "config.json").read_bytes() == before


def test_inspect_says_when_config_json_has_no_model_type(tmp_path):
    d = _copy(DEMO / "drafter", tmp_path / "drafter")
    _edit_config(d, "model_type", drop=True)
    p = run_cli("inspect", str(d))
    assert p.returncode == 0 and "(no model_type)" in p.stdout and "None" not in p.stdout, p.stdout


def test_sweep_names_the_missing_key_of_a_drafter_without_model_type(tmp_path):
    d = _copy(DEMO / "drafter", tmp_path / "drafter")
    before = _edit_config(d, "model_type", drop=True)
    p = run_cli("sweep", "--target", str(DEMO / "target-bf16"), "--draft", str(d), "--widths", "2", "-n", "1",
                "--max-tokens", "4",
                "--record-dir", str(tmp_path / "rec"))
    line = one_line_exit(p)
    assert "'model_type'" in line and "missing" in line and "KeyError" not in line, line
    assert (d / "config.json").read_bytes() == before


def _break(d: Path, where: str) -> None:
    if where == "config.json":
        (d / where).write_text('{"model_type": "llama", ')  # cut off mid-object
    else:
        data = json.loads((d / where).read_text())
        data["auto_map"] = {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
        (d / where).write_text(json.dumps(data))


@pytest.mark.parametrize("where", ["config.json", "tokenizer_config.json"])
@pytest.mark.parametrize("role", ["target", "drafter"])
@pytest.mark.parametrize("typed", ["relative", "absolute"])
def test_every_command_names_a_broken_checkpoint_alike(tmp_path, role, where, typed):
    """The tryout met one broken file named three ways by resolve, inspect and sweep. Each now
    says the path as typed, the file inside it and what is wrong, in one line, exit 2: after
    the option that took the path (resolve, sweep and costcurve alike), or after `inspect`."""
    bad = _copy(DEMO / ("drafter" if role == "drafter" else "target-bf16"), tmp_path / "ckpt")
    _break(bad, where)
    path = "ckpt" if typed == "relative" else str(bad)
    flag = "--target" if role == "target" else "--draft"
    pair = [flag, path] if role == "target" else ["--target", str(DEMO / "target-bf16"), flag, path]
    commands = [["resolve", "--device", "cpu", *pair],
                ["sweep", *pair, "-n", "1", "--max-tokens", "4", "--widths", "2",
                 "--record-dir", str(tmp_path / "rec")]]
    if role == "target":
        commands.append(["costcurve", *pair, "--rows", "1", "--repeats", "1"])
    lines = {args[0]: one_line_exit(run_cli(*args, cwd=tmp_path)).strip() for args in commands}
    name = f"{path}/{where}"
    assert lines["resolve"].startswith(f"blockwidth: error: {flag} {name}: "), lines
    assert len(set(lines.values())) == 1, lines
    inspected = one_line_exit(run_cli("inspect", path, cwd=tmp_path)).strip()
    assert inspected == lines["resolve"].replace(f"{flag} {name}", f"inspect {name}", 1), (inspected, lines)


# --- records ---------------------------------------------------------------------------


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


# --- the command line --------------------------------------------------------------------


def one_line_exit(p: subprocess.CompletedProcess, code: int = 2) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    return p.stderr


def test_options_before_the_subcommand_are_honoured_or_refused(tmp_path):
    # honoured: the subcommand takes them
    p = run_cli("--target", "/nope", "--draft-block-size", "9", "resolve", "--device", "cpu")
    assert "--target /nope: no such file" in one_line_exit(p)
    d = json.loads(run_cli("--draft-block-size", "9", "resolve", "--device", "cpu", "--json").stdout)
    assert (d["width"], d["source"]) == (9, "flag")
    # refused: the subcommand does not take them, or they disagree
    for args, needle in ((("--record-dir", str(tmp_path), "resolve"), "--record-dir given before 'resolve'"),
                         (("--profile", str(tmp_path / "p.toml"), "inspect", str(DEMO / "drafter")),
                          "--profile given before 'inspect'"),
                         (("--draft-block-size", "9", "resolve", "--draft-block-size", "5"), "both before and after")):
        assert needle in one_line_exit(run_cli(*args))
    assert not list(tmp_path.iterdir())


def test_profile_and_record_dir_before_sweep_are_where_it_writes(tmp_path):
    prof, rec = tmp_path / "p.toml", tmp_path / "rec"
    p = run_cli("--profile", str(prof), "--record-dir", str(rec), "sweep", "--widths", "2", "-n", "1",
                "--max-tokens", "4", "--save", env={"XDG_DATA_HOME": str(tmp_path / "xdg-data"),
                                                    "XDG_CONFIG_HOME": str(tmp_path / "xdg-config")})
    assert p.returncode in (0, 1), p.stderr
    assert len(list(rec.glob("session-*.json"))) == 1
    assert not (tmp_path / "xdg-data").exists() and not (tmp_path / "xdg-config").exists()
    assert prof.exists() == (p.returncode == 0)


@pytest.mark.parametrize("args,needle", [
    (("resolve", "--profile", ""), "--profile '': an empty path"),
    (("sweep", "--record-dir", ""), "--record-dir '': an empty path"),
    (("resolve", "--target", ""), "--target '': an empty path"),
    (("resolve", "--target", str(DEMO / "target-bf16"), "--draft", ""), "--draft '': an empty path"),
    (("sweep", "--prompt-file", ""), "--prompt-file '': an empty path"),
    (("inspect", ""), "inspect '': an empty path"),
    (("resolve", "--profile", "~nosuchuser1234/p.toml"), "cannot expand '~'"),
    (("costcurve", "--repeats", "0"), "--repeats: 0 is out of range 1..1000"),
    (("costcurve", "--context", "20000"), "exceeds the target's context of 1024"),
    (("costcurve", "--context", "200000"), "exceeds the target's context of 1024"),
    (("sweep", "-n", "99999999999999999999999"), "-n: 99999999999999999999999 is out of range 1..100"),
    (("sweep", "--max-tokens", "5000"), "exceeds the target's context of 1024"),
    (("resolve", "--draft-block-size", "1_0"), "'1_0' is not an integer"),
    (("resolve", "--draft-block-size", "\u0664"), "is not an integer"),
    (("sweep", "-n", "\u0661"), "-n: '\u0661' is not an integer"),
    (("sweep", "--wait-quiet", "-1"), "--wait-quiet: '-1'"),
    (("sweep", "--wait-quiet", "nan"), "--wait-quiet: 'nan'"),
    (("sweep", "--max-seconds", "nan"), "--max-seconds: 'nan'"),
    (("sweep", "--max-seconds", "0"), "--max-seconds: '0'"),
    (("sweep", "--max-reps", "-3"), "--max-reps: -3 is out of range"),
    (("sweep", "--allow-nonidentical"), "--allow-nonidentical only applies with --save"),
    (("sweep", "--pair-specific"), "--pair-specific only applies with --save"),
    (("sweep", "--profile", "p.toml"), "--profile p.toml: only applies with --save"),
    (("--profile", "p.toml", "sweep"), "--profile p.toml: only applies with --save"),
    (("sweep", "--record-dir", "/proc/blockwidth-records"), "--record-dir /proc/blockwidth-records"),
    (("sweep", "--prompt-file", "/dev/zero"), "is a character device"),
    (("resolve", "--profile", "/dev/zero"), "is a character device"),
    (("resolve", "--bogus"), "unrecognized arguments: --bogus"),
    (("sweep", "--widths", "1_0"), "'1_0' is not an integer"),
    (("sweep", "--widths", ""), "--widths '': empty: give widths such as 2,4,8"),
    (("sweep", "--widths", "2,,4"), "an empty entry between commas"),
    (("sweep", "--widths", "\u0664"), "is not an integer"),
    (("costcurve", "--rows", "1_0"), "--rows '1_0'"),
    (("costcurve", "--rows", "\u0664"), "--rows"),
    (("sweep", "--prompt", ""), "prompt: empty"),
    (("sweep", "--widths"), "--widths: expected one argument"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
])
def test_careless_arguments_are_one_line_exit_2(tmp_path, args, needle):
    p = run_cli(*args, "--device", "cpu") if args[0] == "resolve" else run_cli(*args)
    assert needle in one_line_exit(p)


BIG = "9" * 5000  # past int()'s 4,300-digit limit, where int() raises ValueError with a traceback


def test_integers_past_python_s_digit_limit_are_refused_in_one_short_line(tmp_path):
    """Every integer an operator or a file gives goes through policy.integers.parse_int: a
    5,000-digit one is out of range in one line of bounded length, never a traceback."""
    from blockwidth.console.request import FieldError, session_request
    from blockwidth.engine.costcurve import parse_rows
    from blockwidth.policy.errors import BlockwidthError
    from blockwidth.policy.resolve import WidthError, parse_width

    prof = tmp_path / "p.toml"
    prof.write_text(f'schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = {BIG}\n')
    for args, env, needle in ((("resolve", "--draft-block-size", BIG), None, "is out of range"),
                              (("resolve",), {"BLOCKWIDTH_DRAFT_BLOCK_SIZE": BIG}, "is out of range"),
                              (("resolve", "--profile", str(prof)), None, "not valid TOML"),
                              (("sweep", "-n", BIG), None, "(5,000 digits) is out of range 1..100"),
                              (("sweep", "--widths", f"2,{BIG}"), None, "is out of range"),
                              (("costcurve", "--rows", f"1-{BIG}"), None, "row counts must be 1..512")):
        err = one_line_exit(run_cli(*args, *(("--device", "cpu") if args[0] == "resolve" else ()), env=env))
        assert needle in err and len(err) < 400, err[:400]
    for field in ("widths", "n", "tokens"):
        with pytest.raises(FieldError) as e:
            session_request(**{"widths": "2", "n": 3, "tokens": 8, "prompt": "x", field: BIG})
        assert len(str(e.value)) < 200
    with pytest.raises(WidthError):
        parse_width("0" * 5000 + "1", "--draft-block-size")  # 1, with leading zeros int() counts
    with pytest.raises(BlockwidthError, match="1..512"):
        parse_rows("1-100000000000000000")  # refused before a range of 10**17 rows is built


def test_sweep_without_save_refuses_a_profile_it_would_ignore(tmp_path):
    # A sweep without --save reads no profile, so a corrupt one named on the command line would
    # otherwise pass with exit 0 and a full session.
    bad = tmp_path / "p.toml"
    bad.write_bytes(b"schema = 1\n[[override\nwidth = = 4\n\x00garbage")
    before = bad.read_bytes()
    p = run_cli("sweep", "--profile", str(bad), "--widths", "2", "-n", "1", "--max-tokens", "4",
                "--record-dir", str(tmp_path / "rec"))
    assert f"--profile {bad}: only applies with --save" in one_line_exit(p)
    assert bad.read_bytes() == before and not (tmp_path / "rec").exists()


def test_what_sweep_writes_is_checked_before_any_model_loads(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    bad_default = tmp_path / "config" / "blockwidth" / "profile.toml"
    bad_default.parent.mkdir(parents=True)
    bad_default.write_text("schema = 2\n")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    cases = [
        (("--record-dir", str(f)), "is a file, not a directory"),
        (("--record-dir", str(f / "sub")), "--record-dir"),
        (("--save", "--profile", str(f / "p.toml")), "its parent"),
        (("--save",), "schema = 2"),  # the bad default profile: before the sweep, not after
        (("--save", "--profile", str(fifo)), "is a FIFO"),
        (("--prompt-file", str(fifo)), "is a FIFO"),
        (("--target", "/nope"), "no such file"),
    ]
    for args, needle in cases:
        p = run_cli("sweep", "--widths", "2", "-n", "1", "--max-tokens", "4", *args,
                    env={"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data")})
        assert needle in one_line_exit(p) and "[warmup]" not in p.stderr, args
        assert not list(tmp_path.rglob("session-*.json")), args
    assert bad_default.read_text() == "schema = 2\n"


def _held(lock: Path) -> subprocess.Popen:
    from tests.test_profile import HOLDER

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_held_profile_lock_is_named_after_a_bounded_wait(tmp_path):
    """save_session on a real session of the demo pair, its outcome made decided so that it
    reaches the profile (at n = 1 the session cannot tell drift from noise)."""
    import dataclasses

    from blockwidth.console.inputs import pair_paths
    from blockwidth.console.measure import save_session
    from blockwidth.engine.ab import AbConfig, run_session
    from blockwidth.engine.pair import load_pair
    from blockwidth.console import profile_file
    from blockwidth.policy import profile

    paths = pair_paths(None, None)
    pair = load_pair(paths.target, paths.drafter)
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


def test_sweep_save_with_a_held_lock_exits_1_and_keeps_the_record(tmp_path):
    prof = tmp_path / "p.toml"
    holder = _held(Path(str(prof) + ".lock"))
    try:
        p = run_cli("sweep", "--widths", "2", "-n", "1", "--max-tokens", "4", "--save", "--profile", str(prof),
                    "--record-dir", str(tmp_path / "rec"))
    finally:
        holder.kill()
        holder.wait()
    assert p.returncode == 1, p.stdout + p.stderr
    assert len(list((tmp_path / "rec").glob("session-*.json"))) == 1 and not prof.exists()
    # n = 1 never reaches the profile (it cannot tell drift from noise); when a session does,
    # the test above shows the lock is named
    assert f"pid {holder.pid}" in p.stderr or "not saved" in p.stderr


def test_interrupt_while_starting_is_one_line():
    """The handler that covers the imports: deterministic, by signalling ourselves once the
    module is imported as the program (argv[0] 'blockwidth')."""
    code = ("import os, signal, sys, time\nsys.argv[0] = 'blockwidth'\nimport console.cli\n"
            "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\nprint('survived')\n")
    # A job started in the background by a non-interactive shell (as CI may start us) inherits
    # SIGINT ignored, and then rightly never sees a Ctrl-C: give the child the default.
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130 and p.stderr.strip() == "blockwidth: interrupted" and not p.stdout


def test_a_fifo_among_the_tokenizer_files_is_refused_not_waited_on(tmp_path):
    d = _copy(DEMO / "drafter", tmp_path / "drafter")
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "tokenizer.json")
    p = run_cli("sweep", "--target", str(DEMO / "target-bf16"), "--draft", str(d), "-n", "1",
                "--max-tokens", "4", "--widths", "2", "--record-dir", str(tmp_path / "rec"))
    assert "tokenizer.json: is not a regular file" in one_line_exit(p)


def test_the_console_checks_its_record_directory_before_it_opens(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for value, needle in ((str(f), "is a file, not a directory"), ("", "an empty path")):
        assert needle in one_line_exit(run_cli("--device", "cpu", "--record-dir", value))
