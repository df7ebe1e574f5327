"""Hostile and careless input (issue 7): no checkpoint code runs, nothing is silently
dropped, no traceback, no hang. Every fixture is built here, from the demo pair."""

from __future__ import annotations

import json
import os
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
    return subprocess.run([sys.executable, "-m", "console.cli", *args], input="y\n" * 50,
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
])
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


# --- records ---------------------------------------------------------------------------


def test_records_never_overwrite_and_leftovers_are_cleaned(tmp_path):
    from engine import record

    rec = {"created": "2026-11-29T10:00:00Z", "prompt": {"sha256": "ab" * 32}, "x": 1}
    first = record.write(rec, tmp_path)
    second = record.write(dict(rec, x=2), tmp_path)  # same second, prompt and pid
    assert first != second and record.load(first)["x"] == 1 and record.load(second)["x"] == 2
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    leftover = tmp_path / f".record.{dead}.abc.tmp"
    leftover.write_text('{"half": ')
    mine = tmp_path / f".record.{os.getpid()}.live.tmp"  # a live writer's: kept
    mine.write_text("{")
    record.write(rec, tmp_path)
    assert not leftover.exists() and mine.exists()
    assert len(list(tmp_path.glob("session-*.json"))) == 3
