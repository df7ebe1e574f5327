"""The servers blockwidth starts: mlx_lm.server's options that set what is measured or where it
listens (and any abbreviation argparse takes for one) are blockwidth's alone, whoever passes
them (--server-args, serve's pass-through, a profile entry's server.args); a host beyond this
machine only when the operator says so; what serve prints is what it starts; a port left in
TIME_WAIT is free. Refusals in-process; one real server for the printed line."""

from __future__ import annotations

import argparse
import contextlib
import io
import shlex
import signal
import socket
import time
from pathlib import Path

import pytest

from blockwidth.console import cli
from blockwidth.engine.session.served import port_free
from blockwidth.policy import profile as profiles
from blockwidth.policy.profile import OWNED_SERVER_OPTIONS, REFUSED_SERVER_OPTIONS, server_arg_problem
from tests.test_served import Proc, _free_port, _gone


def _mlx_lm_server_parser() -> argparse.ArgumentParser:
    """The installed mlx_lm.server's own parser (its main() builds it and parses at once: the
    parse is stopped here, after the parser is built)."""
    from mlx_lm import server

    class Built(Exception):
        pass

    grabbed = {}

    def grab(self, args=None, namespace=None):
        grabbed["parser"] = self
        raise Built

    with pytest.MonkeyPatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", grab)
        with pytest.raises(Built):
            server.main()
    return grabbed["parser"]


def _what_argparse_sets(parser: argparse.ArgumentParser, word: str) -> set[str] | None:
    """The dests ``word 1`` sets in ``parser`` (None: argparse refuses it, e.g. ambiguous)."""
    base = vars(parser.parse_known_args([])[0])
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            got = vars(parser.parse_known_args([word, "1"])[0])
    except SystemExit:
        return None
    return {k for k in got if got[k] != base.get(k)}


def test_every_abbreviation_mlx_lm_server_reads_as_an_owned_option_is_refused():
    parser = _mlx_lm_server_parser()
    owned = {a.dest for a in parser._actions if set(a.option_strings) & {*OWNED_SERVER_OPTIONS, *REFUSED_SERVER_OPTIONS}}
    assert owned >= {"model", "draft_model", "num_draft_tokens", "host", "port"}, owned
    taken = 0
    for action in parser._actions:
        for option in (o for o in action.option_strings if o.startswith("--")):
            for end in range(3, len(option) + 1):
                word = option[:end]
                sets = _what_argparse_sets(parser, word)
                if sets and sets & owned:
                    taken += 1
                    assert server_arg_problem([word, "1"]) is not None, word
                    assert server_arg_problem([f"{word}=1"]) is not None, word
            if not {option} & {*OWNED_SERVER_OPTIONS, *REFUSED_SERVER_OPTIONS} and option != "--help":
                assert server_arg_problem([option, "1"]) is None, option  # its own options pass
    assert taken > 20  # --ho, --hos, --draft, --mod, --num... were each read as an owned option


@pytest.mark.parametrize("words,named", [
    ("--ho 0.0.0.0", "--host"), ("--draft /models/d", "--draft-model"), ("--mod T4", "--model"),
    ("--num-draft-tokens=15", "--num-draft-tokens"), ("--po 9", "--port"),
    ("--adapter-path /a", "--adapter-path"), ("--trust", "--trust-remote-code"),
    ("--chat-template 'a\x1b[2Jb'", "\\x1b"),
])
def test_server_args_that_set_the_pair_the_width_or_the_address_are_refused(capsys, tmp_path, words, named):
    code = cli.main(["sweep", "--path", "mlx-lm-server", f"--server-args={words}",
                     "--record-dir", str(tmp_path / "rec")])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and named in err and "--server-args" in err, err
    if words.startswith("--draft "):
        return  # serve's own --draft (the drafter folder), not mlx_lm.server's
    code = cli.main(["serve", *shlex.split(words)])
    out, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and named in err and "serve" in err, err
    assert not (tmp_path / "rec").exists() or not list((tmp_path / "rec").iterdir())


@pytest.mark.parametrize("args,named", [
    ('["--host", "0.0.0.0"]', "--host"), ('["--num-draft-tokens", "15"]', "--num-draft-tokens"),
    ('["--prompt-cache-size", "0", "--mod=x"]', "--model"), ('["--trust-remote-code"]', "--trust-remote-code"),
])
def test_an_entry_whose_server_args_set_them_is_refused_when_the_profile_is_read(capsys, tmp_path, args, named):
    p = tmp_path / "p.toml"
    p.write_text(f'schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                 f'path = "mlx-lm-server"\nserver = {{ args = {args} }}\n')
    with pytest.raises(profiles.ProfileError) as e:
        profiles.load(p)
    (problem,) = e.value.problems
    assert problem.startswith("entry 1 (line 3): server.args: ") and named in problem, problem
    code = cli.main(["export", "--format", "mlx-lm", "--profile", str(p), "--device", "cpu"])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and named in err and err.count("\n") == 1


def test_serve_listens_beyond_loopback_only_when_told(capsys):
    code = cli.main(["serve", "--host", "0.0.0.0"])
    _, err = capsys.readouterr()
    assert code == 2 and "--allow-non-loopback" in err and err.count("\n") == 1
    with socket.socket() as held:  # told: it gets as far as the port, which is taken (no server)
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        code = cli.main(["serve", "--host", "0.0.0.0", "--allow-non-loopback", "--port", str(port)])
    _, err = capsys.readouterr()
    launch = next(line for line in err.splitlines() if "mlx_lm.server --model" in line)
    assert shlex.split(launch.removeprefix("blockwidth serve: "))[-4:] == ["--host", "0.0.0.0", "--port", str(port)]
    assert code == 2 and f"port {port} on 0.0.0.0 is in use" in err


def test_a_port_left_in_time_wait_is_free():
    """serve stopped and started again on one port: the old server's connections linger in
    TIME_WAIT, which mlx_lm.server's listener (SO_REUSEADDR) may reuse, so the probe must too."""
    with socket.socket() as srv:
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as mlx_lm.server's HTTPServer listens
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()  # the server's side closes first: it is the one left in TIME_WAIT
        client.close()
    deadline = time.monotonic() + 5
    in_time_wait = False
    while not in_time_wait and time.monotonic() < deadline:
        with socket.socket() as bare:  # what the probe did: a bind without SO_REUSEADDR
            try:
                bare.bind(("127.0.0.1", port))
            except OSError:
                in_time_wait = True
        time.sleep(0.05)
    assert in_time_wait, "the port never reached TIME_WAIT: nothing tested"
    assert port_free(port)


def test_serve_starts_exactly_the_command_it_prints(tmp_path):
    """An entry measured with --prompt-cache-size 0: serve printed that option and started the
    server without it. The printed line's words against the started process's own argv."""
    p = tmp_path / "profile.toml"
    p.write_text('schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 3\n'
                 'path = "mlx-lm-server"\nserver = { args = ["--prompt-cache-size", "0"] }\n')
    port = _free_port()
    proc = Proc("serve", "--profile", str(p), "--port", str(port), "--max-tokens", "8")
    try:
        ready = proc.wait_for("stderr", r"ready at")
        launch = next(x for x in proc.lines["stderr"] if x.startswith("blockwidth serve: mlx_lm.server"))
        pid = int(ready.split("(pid ")[1].split(",")[0])
        started = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        proc.proc.send_signal(signal.SIGINT)
    finally:
        code = proc.finish()
    printed = shlex.split(launch.removeprefix("blockwidth serve: "))
    assert started[1:4] == ["-m", "mlx_lm", "server"] and printed[0] == "mlx_lm.server"
    assert printed[1:] == started[4:], (printed, started)
    assert printed[-8:] == ["--prompt-cache-size", "0", "--max-tokens", "8", "--host", "127.0.0.1", "--port", str(port)]
    assert "--num-draft-tokens" in printed and printed[printed.index("--num-draft-tokens") + 1] == "2"
    assert code == 130 and _gone([pid])
