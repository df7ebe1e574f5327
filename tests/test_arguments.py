"""The command line given careless or hostile arguments: each refusal is one line, exit 2,
before any model loads or any file is written, never a traceback; options before the
subcommand are honoured or refused, never dropped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import DEMO, GiB, ROOT, one_line, run_cli

def test_options_before_the_subcommand_are_honoured_or_refused(tmp_path, blockwidth):
    # honoured: the subcommand takes them
    p = blockwidth("--target", "/nope", "--draft-block-size", "9", "resolve", "--device", "cpu")
    assert "--target /nope: no such file" in one_line(p)
    d = json.loads(blockwidth("--draft-block-size", "9", "resolve", "--device", "cpu", "--json").stdout)
    assert (d["width"], d["source"]) == (9, "flag")
    # refused: the subcommand does not take them, or they disagree
    for args, needle in ((("--record-dir", str(tmp_path), "resolve"), "--record-dir given before 'resolve'"),
                         (("--profile", str(tmp_path / "p.toml"), "inspect", str(DEMO / "drafter")),
                          "--profile given before 'inspect'"),
                         (("--draft-block-size", "9", "resolve", "--draft-block-size", "5"), "both before and after")):
        assert needle in one_line(blockwidth(*args))
    assert not list(tmp_path.iterdir())


def test_profile_and_record_dir_before_sweep_are_where_it_writes(tmp_path, blockwidth):
    prof, rec = tmp_path / "p.toml", tmp_path / "rec"
    p = blockwidth("--profile", str(prof), "--record-dir", str(rec), "sweep", "--widths", "2", "-n", "1",
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
    (("resolve", "--bogus"), "unrecognized arguments: --bogus (see blockwidth resolve --help)"),
    # a typo names the option it is nearest, and the command's own help (not the top's)
    (("sweep", "--sequental"), "--sequental; did you mean --sequential? (see blockwidth sweep --help)"),
    (("sweep", "--width", "2"), "--width 2; did you mean --widths?"),  # no prefix is taken as its option
    (("--profil", "p.toml"), "unrecognized arguments: --profil; did you mean --profile?"),  # not "invalid choice"
    (("inspect", "--target", "x"), "inspect takes one checkpoint folder: blockwidth inspect PATH"),
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
def test_careless_arguments_are_one_line_exit_2(tmp_path, args, needle, blockwidth):
    p = blockwidth(*args, "--device", "cpu") if args[0] == "resolve" else blockwidth(*args)
    assert needle in one_line(p)


BIG = "9" * 5000  # past int()'s 4,300-digit limit, where int() raises ValueError with a traceback


def test_integers_past_python_s_digit_limit_are_refused_in_one_short_line(tmp_path, blockwidth):
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
        err = one_line(blockwidth(*args, *(("--device", "cpu") if args[0] == "resolve" else ()), env=env))
        assert needle in err and len(err) < 400, err[:400]
    for field in ("widths", "n", "tokens"):
        with pytest.raises(FieldError) as e:
            session_request(**{"widths": "2", "n": 3, "tokens": 8, "prompt": "x", field: BIG})
        assert len(str(e.value)) < 200
    with pytest.raises(WidthError):
        parse_width("0" * 5000 + "1", "--draft-block-size")  # 1, with leading zeros int() counts
    with pytest.raises(BlockwidthError, match="1..512"):
        parse_rows("1-100000000000000000")  # refused before a range of 10**17 rows is built
    with pytest.raises(BlockwidthError, match="the range 5-2 runs backwards; write it 2-5"):
        parse_rows("5-2")  # a tryout read "row counts must be 1..512" for it


ONES = "1" * 5000  # as BIG, in a digit the cut-off echo of it shows as itself


@pytest.mark.parametrize("args,env,needle", [
    (("resolve", "--device", "cpu", "--draft-block-size", ONES), {}, "--draft-block-size = 111"),
    (("resolve", "--device", "cpu"), {"BLOCKWIDTH_DRAFT_BLOCK_SIZE": ONES}, "BLOCKWIDTH_DRAFT_BLOCK_SIZE = 111"),
    (("resolve", "--device", "cpu"), {"MLXCEL_DRAFT_BLOCK_SIZE": ONES}, "MLXCEL_DRAFT_BLOCK_SIZE = 111"),
    (("resolve", "--device", f"cuda:{ONES}.0"), {}, "--device 'cuda:111"),
    (("sweep", "--widths", ONES), {}, "--widths '111"),
    (("sweep", "-n", ONES), {}, "-n: 111"),
    (("sweep", "--max-tokens", ONES), {}, "--max-tokens: 111"),
    (("costcurve", "--context", ONES), {}, "--context: 111"),
    (("sweep", "--max-seconds", ONES), {}, "--max-seconds"),
])
def test_numbers_of_more_than_4300_digits_are_one_line(args, env, needle, blockwidth):
    line = one_line(blockwidth(*args, env=env))
    assert needle in line and len(line) < 400, line


def test_a_profile_number_of_more_than_4300_digits_still_gives_json_and_junit(tmp_path, blockwidth):
    prof = tmp_path / "p.toml"
    prof.write_text(f'schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = {ONES}\n')
    junit = tmp_path / "r.xml"
    p = blockwidth("--check", "--json", "--junit", str(junit), "--profile", str(prof), "--device", "cpu")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    doc = json.loads(p.stdout)
    assert doc["exit_code"] == 2 and "line 5: a number of more than 4,300 digits" in doc["errors"][0]
    assert b'errors="1"' in junit.read_bytes()


def test_row_ranges_are_bounded_before_they_are_expanded():
    for rows in ("1-99999999999999", "1-" + ONES, "5-600", "0-3"):
        line = one_line(run_cli("costcurve", "--rows", rows, memory=2 * GiB, timeout=120))
        assert "row counts must be 1..512" in line, line
    from blockwidth.engine.costcurve import parse_rows

    assert parse_rows("1-4,8") == (1, 2, 3, 4, 8)


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


@pytest.mark.parametrize("spec", ["cuda:\u0669.0", "cuda:9.\u0660", "cuda:\uff19.0"])
def test_a_device_spec_takes_ascii_digits_only(spec, blockwidth):
    assert "ASCII digits" in one_line(blockwidth("resolve", "--device", spec))


@pytest.mark.parametrize("command", [("resolve", "--device", "cpu"), ("sweep",), ("costcurve",), ()])
def test_demo_target_with_a_target_is_refused(command, blockwidth):
    args = [*command, "--target", str(DEMO / "target-bf16"), "--demo-target", "4bit"]
    if not command:
        args += ["--device", "cpu"]
    run = blockwidth if command else run_cli  # the console in a process: it would open
    assert "--demo-target 4bit given with a target" in one_line(run(*args))


def test_sweep_without_save_refuses_a_profile_it_would_ignore(tmp_path, blockwidth):
    # A sweep without --save reads no profile, so a corrupt one named on the command line would
    # otherwise pass with exit 0 and a full session.
    bad = tmp_path / "p.toml"
    bad.write_bytes(b"schema = 1\n[[override\nwidth = = 4\n\x00garbage")
    before = bad.read_bytes()
    p = blockwidth("sweep", "--profile", str(bad), "--widths", "2", "-n", "1", "--max-tokens", "4",
                   "--record-dir", str(tmp_path / "rec"))
    assert f"--profile {bad}: only applies with --save" in one_line(p)
    assert bad.read_bytes() == before and not (tmp_path / "rec").exists()


def test_what_sweep_writes_is_checked_before_any_model_loads(tmp_path, blockwidth):
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
        p = blockwidth("sweep", "--widths", "2", "-n", "1", "--max-tokens", "4", *args,
                       env={"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_DATA_HOME": str(tmp_path / "data")})
        assert needle in one_line(p) and "[warmup]" not in p.stderr, args
        assert not list(tmp_path.rglob("session-*.json")), args
    assert bad_default.read_text() == "schema = 2\n"


def test_interrupt_while_starting_is_one_line():
    """The handler that covers the imports: deterministic, by signalling ourselves once the
    module is imported as the program (argv[0] 'blockwidth')."""
    code = ("import os, signal, sys, time\nsys.argv[0] = 'blockwidth'\nimport blockwidth.console.cli\n"
            "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(30)\nprint('survived')\n")
    # A job started in the background by a non-interactive shell (as CI may start us) inherits
    # SIGINT ignored, and then rightly never sees a Ctrl-C: give the child the default.
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.returncode == 130 and p.stderr.strip() == "blockwidth: interrupted" and not p.stdout


def test_the_console_checks_its_record_directory_before_it_opens(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    for value, needle in ((str(f), "is a file, not a directory"), ("", "an empty path")):
        assert needle in one_line(run_cli("--device", "cpu", "--record-dir", value))


@pytest.mark.parametrize("args,needle", [
    (("--kind", "dflash"), "--draft missing: drafter kind dflash needs a drafter checkpoint folder"),
    (("--kind", "lookup", "--draft", str(DEMO / "drafter")), "given with drafter kind lookup"),
])
def test_the_console_refuses_what_sweep_refuses_before_it_opens(args, needle, blockwidth):
    target = ("--target", str(DEMO / "target-bf16"))
    assert needle in one_line(blockwidth("sweep", *target, *args))
    assert needle in one_line(run_cli(*target, *args, "--device", "cpu"))  # the console, in a process




def test_the_console_fields_take_the_clis_bounds(blockwidth):
    """A tryout: the console's n field took 99999999999999999999 and offered to run it for
    2.9e19 minutes, while `sweep -n` said 1..100; and "n field -5: must be a whole number" (it
    is one). The fields and the flags share their bounds, and say them."""
    from blockwidth.console.request import MAX_N, MAX_REPS, MAX_TOKENS, FieldError, session_request

    ok = {"widths": "2", "n": 3, "tokens": 8, "prompt": "x"}
    for field, value, words in (("n", "99999999999999999999", f"must be 1..{MAX_N}"),
                                ("n", str(MAX_N + 1), f"must be 1..{MAX_N}"),
                                ("n", "-5", f"must be 1..{MAX_N}"), ("n", "0", f"must be 1..{MAX_N}"),
                                ("n", "x", f"must be a whole number 1..{MAX_N}"),
                                ("tokens", str(MAX_TOKENS + 1), f"must be 1..{MAX_TOKENS}"),
                                ("max_reps", str(MAX_REPS + 1), f"must be 1..{MAX_REPS}"),
                                ("max_seconds", "86401", "at most 86400")):
        with pytest.raises(FieldError) as e:
            session_request(**{**ok, field: value})
        assert words in str(e.value), (field, value, str(e.value))
    assert session_request(**{**ok, "n": str(MAX_N), "max_reps": str(MAX_REPS)}).n == MAX_N
    err = one_line(blockwidth("sweep", "-n", str(MAX_N + 1)))
    assert f"1..{MAX_N}" in err
