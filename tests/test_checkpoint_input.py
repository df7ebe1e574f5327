"""Checkpoints a user points at that are hostile or broken: no checkpoint code runs (whatever
stdin answers), a broken file is named in one line the same way by every command, sizes that
disagree with the weights or with the machine are refused before a model is built. Every
fixture is built here, from the demo pair."""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEMO, GiB, edit_json, one_line, run_cli

EVIL_CODE = """
import os, pathlib
pathlib.Path(os.environ["EVIL_MARKER"]).write_text("checkpoint code ran")
from transformers import PreTrainedTokenizerFast
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


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
    d = shutil.copytree(src, tmp_path / f"evil-{role}-{where}-{key}")
    (d / "tokenization_evil.py").write_text(EVIL_CODE)
    f = d / where
    data = json.loads(f.read_text())
    data.pop("tokenizer_class", None)
    data[key] = ({"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None],
                  "AutoConfig": "tokenization_evil.EvilTokenizer"} if key == "auto_map"
                 else "tokenization_evil.py")
    f.write_text(json.dumps(data))
    return d


@pytest.mark.parametrize("where,key", [("tokenizer_config.json", "auto_map"),
                                       ("config.json", "auto_map"), ("config.json", "model_file")])
@pytest.mark.parametrize("role", ["target", "drafter"])
def test_checkpoint_code_never_runs_on_any_path(tmp_path, role, where, key, blockwidth):
    evil = evil_checkpoint(tmp_path, role, where, key)
    marker = tmp_path / "RAN"
    target = evil if role == "target" else DEMO / "target-bf16"
    pair = ["--target", str(target), "--draft", str(evil if role == "drafter" else DEMO / "drafter")]
    rec = tmp_path / "records"
    commands = [
        ["resolve", "--device", "cpu", *pair],
        ["inspect", str(evil)],
        ["sweep", *pair, "-n", "1", "--max-tokens", "4", "--widths", "2", "--record-dir", str(rec)],
        [*pair, "--device", "cpu"],  # the console: refused before it opens (a process: it would open)
    ]
    if role == "target":
        commands.append(["costcurve", "--target", str(evil), "--rows", "1", "--repeats", "1"])
    for args in commands:
        run = run_cli if args[0].startswith("-") else blockwidth
        yes = {"input" if run is run_cli else "stdin": "y\n" * 50}  # as `yes | blockwidth`
        p = run(*args, env={"EVIL_MARKER": str(marker)}, **yes)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        line = p.stderr.strip()
        assert len(line.splitlines()) == 1 and str(evil / where) in line and key in line, (args, line)
        assert "Traceback" not in p.stderr and "custom code?" not in p.stdout + p.stderr
        assert not marker.exists(), f"checkpoint code ran for {args}"


def test_tokenizer_loader_refuses_even_without_the_check(tmp_path, monkeypatch, capfd):
    """Belt and braces: the engine's tokenizer loader itself never prompts or runs code."""
    from blockwidth.engine.pair import PairError, _load_tokenizer

    evil = evil_checkpoint(tmp_path, "drafter", "tokenizer_config.json")
    marker = tmp_path / "RAN"
    monkeypatch.setenv("EVIL_MARKER", str(marker))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 10))
    with pytest.raises(PairError) as e:
        _load_tokenizer(evil, "drafter", {})
    assert len(str(e.value).strip().splitlines()) == 1, str(e.value)
    out, err = capfd.readouterr()
    assert "custom code?" not in out + err and not marker.exists()  # no prompt, no code


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
def test_broken_checkpoints_are_one_line(tmp_path, name, config, header, data, needle, blockwidth):
    d = _folder(tmp_path, name, config, header, data)
    p = blockwidth("inspect", str(d), "--json")
    out = p.stdout + p.stderr
    assert "Traceback" not in out and "NaN" not in p.stdout
    if p.returncode == 0:  # the config read fine; the weights are reported, not counted
        data_out = json.loads(p.stdout)
        assert data_out["parameters"] is None and needle in data_out["parameters_note"], data_out
    else:
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    p = blockwidth("resolve", "--device", "cpu", "--target", str(d))  # reads the config, not the weights
    assert "Traceback" not in p.stderr and len(p.stderr.splitlines()) <= 1
    assert p.returncode == (2 if header is None else 0), p.stderr


def test_odd_architectures_and_a_directory_for_weights(tmp_path, blockwidth):
    d = _folder(tmp_path, "archs", {"model_type": "llama", "architectures": [1, None]},
                {"w": GOOD_TENSOR})
    p = blockwidth("inspect", str(d))
    assert p.returncode == 0 and "1, null" in p.stdout, p.stderr
    d = _folder(tmp_path, "dir-weights", {"model_type": "llama"})
    (d / "model.safetensors").mkdir()
    p = blockwidth("inspect", str(d), "--json")
    assert p.returncode == 0 and "is a directory" in json.loads(p.stdout)["parameters_note"]
    p = blockwidth("resolve", "--device", "cpu", "--target", str(d))
    assert p.returncode == 2 and "is a directory" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("role,key,value", [("drafter", "hidden_size", "big"), ("target", "vocab_size", 0),
                                            ("drafter", "num_hidden_layers", True)])
def test_a_bad_size_in_config_json_names_the_file_and_key(tmp_path, role, key, value, blockwidth):
    """transformers validates these only while loading the tokenizer, which used to blame it."""
    target = shutil.copytree(DEMO / "target-bf16", tmp_path / "target")
    drafter = shutil.copytree(DEMO / "drafter", tmp_path / "drafter")
    bad = target if role == "target" else drafter
    before = _edit_config(bad, key, value)
    p = blockwidth("sweep", "--target", str(target), "--draft", str(drafter), "-n", "1", "--max-tokens", "8",
                   "--widths", "2", "--record-dir", str(tmp_path / "rec"))
    line = one_line(p)
    assert f"{bad / 'config.json'}: {key} = {value!r}" in line and "tokenizer" not in line, line
    assert (bad / "config.json").read_bytes() == before


def test_inspect_says_when_config_json_has_no_model_type(tmp_path, blockwidth):
    d = shutil.copytree(DEMO / "drafter", tmp_path / "drafter")
    _edit_config(d, "model_type", drop=True)
    p = blockwidth("inspect", str(d))
    assert p.returncode == 0 and "(no model_type)" in p.stdout and "None" not in p.stdout, p.stdout


def test_sweep_names_the_missing_key_of_a_drafter_without_model_type(tmp_path, blockwidth):
    d = shutil.copytree(DEMO / "drafter", tmp_path / "drafter")
    before = _edit_config(d, "model_type", drop=True)
    p = blockwidth("sweep", "--target", str(DEMO / "target-bf16"), "--draft", str(d), "--widths", "2", "-n", "1",
                   "--max-tokens", "4",
                   "--record-dir", str(tmp_path / "rec"))
    line = one_line(p)
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
def test_every_command_names_a_broken_checkpoint_alike(tmp_path, role, where, typed, blockwidth):
    """The tryout met one broken file named three ways by resolve, inspect and sweep. Each now
    says the path as typed, the file inside it and what is wrong, in one line, exit 2: after
    the option that took the path (resolve, sweep and costcurve alike), or after `inspect`."""
    bad = shutil.copytree(DEMO / ("drafter" if role == "drafter" else "target-bf16"), tmp_path / "ckpt")
    _break(bad, where)
    path = "ckpt" if typed == "relative" else str(bad)
    flag = "--target" if role == "target" else "--draft"
    pair = [flag, path] if role == "target" else ["--target", str(DEMO / "target-bf16"), flag, path]
    commands = [["resolve", "--device", "cpu", *pair],
                ["sweep", *pair, "-n", "1", "--max-tokens", "4", "--widths", "2",
                 "--record-dir", str(tmp_path / "rec")]]
    if role == "target":
        commands.append(["costcurve", *pair, "--rows", "1", "--repeats", "1"])
    lines = {args[0]: one_line(blockwidth(*args, cwd=tmp_path)).strip() for args in commands}
    name = f"{path}/{where}"
    assert lines["resolve"].startswith(f"blockwidth: error: {flag} {name}: "), lines
    assert len(set(lines.values())) == 1, lines
    inspected = one_line(blockwidth("inspect", path, cwd=tmp_path)).strip()
    assert inspected == lines["resolve"].replace(f"{flag} {name}", f"inspect {name}", 1), (inspected, lines)


def test_a_fifo_among_the_tokenizer_files_is_refused_not_waited_on(tmp_path, blockwidth):
    d = shutil.copytree(DEMO / "drafter", tmp_path / "drafter")
    (d / "tokenizer.json").unlink()
    os.mkfifo(d / "tokenizer.json")
    p = blockwidth("sweep", "--target", str(DEMO / "target-bf16"), "--draft", str(d), "-n", "1",
                   "--max-tokens", "4", "--widths", "2", "--record-dir", str(tmp_path / "rec"))
    assert "tokenizer.json: is not a regular file" in one_line(p)


def test_a_safetensors_header_mlx_refuses_is_not_counted(tmp_path, blockwidth):
    d = tmp_path / "corrupt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [1_000_000, 1_000_000], "data_offsets": [0, 16]}}).encode()
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 16)
    import mlx.core as mx

    with pytest.raises(RuntimeError):  # what MLX says of it
        mx.load(str(d / "model.safetensors"))
    doc = json.loads(blockwidth("inspect", "--json", str(d)).stdout)
    assert doc["parameters"] is None and "needs 4000000000000 bytes" in doc["parameters_note"]


def test_a_broken_quantization_sidecar_is_an_error_not_unquantized(tmp_path, blockwidth):
    t = shutil.copytree(DEMO / "target-bf16", tmp_path / "t")
    (t / "hf_quant_config.json").write_text('{"producer": {"name": "modelopt"}, "quantization": {"quant_al')
    for args in (("inspect", str(t)), ("resolve", "--device", "cpu", "--target", str(t)),
                 ("sweep", "--target", str(t), "-n", "1", "--max-tokens", "4", "--widths", "2",
                  "--record-dir", str(tmp_path / "rec"))):
        line = one_line(blockwidth(*args))
        assert "hf_quant_config.json" in line and "not valid JSON" in line, (args, line)


# --- sizes: crashes and runaway memory, under an address-space limit in the child -----


def sweep(target: Path, tmp_path: Path, *extra: str, **kw) -> subprocess.CompletedProcess:
    return run_cli("sweep", "--target", str(target), "-n", "1", "--max-tokens", "4", "--widths", "2",
               "--record-dir", str(tmp_path / "rec"), *extra, **kw)


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
    t = shutil.copytree(DEMO / "target-bf16", tmp_path / "target")
    _shift_vocab(t, shift, 2048 - 40)
    p = sweep(t, tmp_path, memory=6 * GiB)
    line = one_line(p)
    assert "token id" in line and "2,048 rows" in line and "embed_tokens" in line, line
    assert not (tmp_path / "rec").exists() or not list((tmp_path / "rec").glob("session-*"))
    # the served path (mlx_lm.server loads the weights) checks the same, through the same door
    from blockwidth.engine.session.served import served_pair
    from blockwidth.policy.errors import BlockwidthError

    # (a drafter with the same shifted tokenizer: the served path compares the tokenizers too)
    d = shutil.copytree(DEMO / "drafter", tmp_path / "drafter")
    _shift_vocab(d, shift, 2048 - 40)
    with pytest.raises(BlockwidthError, match="token id"):
        served_pair(t, d)


def test_a_prompt_id_the_tables_have_no_row_for_is_refused(tmp_path):
    """The vocabulary can be in range while the tokenizer still emits an id outside it (a
    post-processor's special token): the prompt's own ids are checked before any forward."""
    t = shutil.copytree(DEMO / "target-bf16", tmp_path / "target")

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
    t = shutil.copytree(DEMO / "target-bf16", tmp_path / "target")
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


