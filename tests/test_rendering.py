"""Every command line and config block blockwidth prints is rendered in one place
(policy.commands): parsed back the way its target reads it (a POSIX shell, Python, JSON), it
is the intended command and nothing else, whatever the profile's and the folders' strings hold;
a string no rendering keeps as written is refused where the profile is read. In-process."""

from __future__ import annotations

import ast
import json
import shlex
from pathlib import Path

import pytest

from blockwidth.console import cli
from blockwidth.policy import profile as profiles
from blockwidth.policy.commands import Unprintable, python_call, shell

# Folder names a shell would run something from, were they spliced: a space, both quotes, $(),
# backticks, a semicolon and a comment sign.
TARGET = "/models/my target's \"x\" $(touch PWNED_t) `id`; #t"
DRAFT = "/models/draft ; touch PWNED_d && echo 'x'"
SERVED_ARGS = ["--prompt-cache-size", "0", "--chat-template", "{{ '$(touch PWNED_a)' }}; echo \"x\""]


def _profile(tmp_path: Path) -> Path:
    """Two served levels of one situation (one with the arguments it was measured with and an
    MLX switch), whose record names the pair by the folders above."""
    rec = tmp_path / "served-1.json"
    rec.write_text(json.dumps({"pair": {"target": TARGET, "drafter": DRAFT}}))
    p = tmp_path / "profile.toml"
    args = ", ".join(json.dumps(a) for a in SERVED_ARGS)
    p.write_text(f"""schema = 1

[[override]]
backend = "cpu"
drafter_kind = "model"
width = 4
path = "mlx-lm-server"
concurrency = 1
mlx = "0.32.4 $(touch PWNED_mlx) 'x"
measured_at = "2026-12-01; touch PWNED_at"
server = {{ mlx_lm = "0.32.2", args = [{args}], env = {{ MLX_CUDA_USE_CUDNN_SDPA = "0" }} }}
evidence = {{ record = "served-1.json" }}

[[override]]
backend = "cpu"
drafter_kind = "model"
width = 8
path = "mlx-lm-server"
concurrency = 16
evidence = {{ record = "served-1.json" }}
""")
    return p


def _export(capsys, tmp_path: Path, fmt: str, *extra: str) -> str:
    """(The record's folders are not on this machine, so the pair is named as an operator does.)"""
    code = cli.main(["export", "--format", fmt, "--profile", str(_profile(tmp_path)), "--device", "cpu",
                     "--target", TARGET, "--draft", DRAFT, *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def _shell_commands(text: str) -> list[list[str]]:
    """What a shell runs from ``text``: each line's words, comments dropped (a comment sign that
    starts a word ends the line, as in sh)."""
    return [words for line in text.splitlines() if (words := shlex.split(line, comments=True))]


@pytest.mark.parametrize("fmt,expected", [
    ("mlx-lm", [["MLX_CUDA_USE_CUDNN_SDPA=0", "mlx_lm.server", "--model", TARGET, "--draft-model", DRAFT,
                 "--num-draft-tokens", "3", *SERVED_ARGS],
                ["mlx_lm.server", "--model", TARGET, "--draft-model", DRAFT, "--num-draft-tokens", "7"]]),
    ("sglang", [["python", "-m", "sglang.launch_server", "--model-path", TARGET, "--speculative-algorithm",
                 "STANDALONE", "--speculative-draft-model-path", DRAFT, "--speculative-num-steps", str(w - 1),
                 "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(w)] for w in (4, 8)]),
    ("llama.cpp", [["llama-server", "-m", f"{TARGET}.gguf", "-md", f"{DRAFT}.gguf", "--draft-max", str(k)]
                   for k in (3, 7)]),
])
def test_a_shell_reads_exactly_the_commands_meant(capsys, tmp_path, fmt, expected):
    assert _shell_commands(_export(capsys, tmp_path, fmt)) == expected


def test_vllm_reads_its_json_config_as_one_word(capsys, tmp_path):
    (cmd,) = _shell_commands(_export(capsys, tmp_path, "vllm"))
    assert cmd[:4] == ["vllm", "serve", TARGET, "--speculative-config"] and len(cmd) == 5
    assert json.loads(cmd[4]) == {"method": "draft_model", "model": DRAFT, "num_speculative_tokens": 7,
                                  "num_speculative_tokens_per_batch_size": [[1, 15, 3], [16, 16, 7]]}


def test_trtllm_is_python_that_builds_the_config_and_nothing_else(capsys, tmp_path):
    tree = ast.parse(_export(capsys, tmp_path, "trtllm"))
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds == ["ImportFrom", "ImportFrom", "Assign", "Assign"], kinds
    config, llm = tree.body[2].value, tree.body[3].value
    assert ast.unparse(config.func) == "DraftTargetDecodingConfig"
    assert {k.arg: ast.literal_eval(k.value) for k in config.keywords} == {
        "max_draft_len": 7, "speculative_model": DRAFT, "draft_len_schedule": {15: 3, 16: 7}}
    assert ast.unparse(llm.func) == "LLM" and ast.literal_eval(llm.args[0]) == TARGET
    assert [(k.arg, ast.unparse(k.value)) for k in llm.keywords] == [("speculative_config", "speculative_config")]


@pytest.mark.parametrize("fmt", ["mlx-lm", "vllm", "sglang", "llama.cpp", "trtllm"])
def test_a_name_typed_with_a_newline_is_refused_in_one_line(capsys, tmp_path, fmt):
    code = cli.main(["export", "--format", fmt, "--profile", str(_profile(tmp_path)), "--device", "cpu",
                     "--target", "/m/t\ntouch PWNED"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--target" in err and "\\n" in err, err


# ---- profile strings: refused where the file is read, naming the entry and the key -------------

@pytest.mark.parametrize("key,toml", [
    ("evidence.record", 'evidence = { record = "r.json\\ntouch PWNED_record" }'),
    ("mlx", 'mlx = "0.32.4\\ntouch PWNED_mlx"'),
    ("device_name", 'device_name = "cpu\\u001b]0;owned\\u0007"'),
    ("pair", 'pair = "abc\\rdef"'),
    ("measured_at", 'measured_at = "2026\\n$(touch PWNED)"'),
    ("server.mlx_lm", 'path = "mlx-lm-server"\nserver = { mlx_lm = "0.1\\ntouch PWNED" }'),
    ("server.args[1]", 'path = "mlx-lm-server"\nserver = { args = ["--chat-template", "a\\nb"] }'),
    ("note", 'note = "right\\u202eleft"'),  # a bidirectional override reorders what a line shows
])
def test_a_profile_string_holding_a_control_character_is_refused_naming_the_entry(capsys, tmp_path, key, toml):
    p = tmp_path / "p.toml"
    p.write_text(f'schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n{toml}\n')
    before = p.read_bytes()
    with pytest.raises(profiles.ProfileError) as e:
        profiles.load(p)
    (problem,) = e.value.problems
    assert problem.startswith(f"entry 1 (line 3): {key} = "), problem
    for fmt in ("mlx-lm", "trtllm"):
        code = cli.main(["export", "--format", fmt, "--profile", str(p), "--device", "cpu"])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and "PWNED" not in out
        assert err.count("\n") == 1 and "\x1b" not in err and "entry 1 (line 3)" in err and key in err, err
    assert p.read_bytes() == before


def test_a_save_escapes_the_names_it_takes_from_folders():
    """A session's profile entry names the pair's folders (measured_on): a folder name with an
    escape must not make the profile the save writes one that the next read refuses."""
    from blockwidth.policy.profile import string_problems

    from blockwidth.policy.text import shown

    assert string_problems({"evidence": {"measured_on": {"target": shown("t\x1b[31m")}}}) == []
    assert string_problems({"evidence": {"measured_on": {"target": "t\x1b[31m"}}})


# ---- the answer (resolve, the console's y) and serve's line --------------------------------------

def _resolution(width: int | None = 4):
    from blockwidth.policy.device import Backend, Device
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.quantization import Quantization, Scheme
    from blockwidth.policy.resolve import resolve

    return resolve(drafter_kind=DrafterKind.MODEL, device=Device(Backend.CPU), quantization=Quantization(Scheme.NONE),
                   flag=None if width is None else str(width), env={}, profile=None, declared_width=None,
                   declared_detail="", pair=None, mlx_version=None)


def test_the_answer_command_is_the_pair_quoted_for_a_shell(tmp_path):
    from blockwidth.console.answer import answer
    from blockwidth.console.inputs import PairPaths

    said = answer(_resolution(4), PairPaths(Path(TARGET), Path(DRAFT), False))
    assert shlex.split(said.command) == ["mlx_lm.server", "--model", TARGET, "--draft-model", DRAFT,
                                         "--num-draft-tokens", "3"]


def test_a_folder_no_line_can_name_gets_a_refusal_not_a_command():
    from blockwidth.console.answer import answer
    from blockwidth.console.inputs import PairPaths

    said = answer(_resolution(4), PairPaths(Path("/m/t\ntouch PWNED"), Path(DRAFT), False))
    assert said.command is None and "the target's folder" in said.refusal and "\\n" in said.refusal
    assert all("\n" not in line for line in said.lines())


def test_the_command_resolve_reports_is_the_one_serve_starts(tmp_path):
    """command_for (resolve's JSON, serve's printed line) and server_spec (what serve starts)
    are one construction: the entry's measured arguments are in both."""
    from blockwidth.console.serve import command_for, server_spec
    from blockwidth.engine.session.served import ServerSpec

    prof = profiles.load(_profile(tmp_path))
    res = _resolution(4)
    import dataclasses

    res = dataclasses.replace(res, entry=prof.entries[0])
    cmd = command_for(res, TARGET, DRAFT, ["--max-tokens", "8"])
    spec = server_spec(res, TARGET, DRAFT, ["--max-tokens", "8"])
    assert isinstance(spec, ServerSpec)
    assert shlex.split(cmd["mlx-lm-server"]["line"])[1:] == spec.command_line()
    assert spec.argv(8080)[-len(spec.command_line(8080)) + 1:] == spec.command_line(8080)[1:]
    assert "--prompt-cache-size" in spec.argv(8080) and spec.argv(8080)[-4:] == ["--host", "127.0.0.1", "--port", "8080"]


def test_the_renderers_refuse_what_they_cannot_keep():
    assert shlex.split(shell(["a b", "it's", "$(x)"], {"MLX_X": "1 2"})) == ["MLX_X=1 2", "a b", "it's", "$(x)"]
    with pytest.raises(Unprintable):
        shell(["ok", "line\nbreak"])
    with pytest.raises(Unprintable):
        shell(["ok"], {"NOT A NAME": "1"})
    call = ast.parse(python_call("f", "x'\"y", k={1: 2}), mode="eval").body
    assert ast.literal_eval(call.args[0]) == "x'\"y" and ast.literal_eval(call.keywords[0].value) == {1: 2}
    with pytest.raises(Unprintable):
        python_call("f", "esc\x1b")
