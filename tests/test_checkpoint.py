"""A checkpoint folder is read once per pair load (engine.checkpoint.Checkpoint), and the engine
path and the served path check a pair with the one check (engine.pair.check_pair)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from blockwidth.engine import demo
from blockwidth.engine.pair import PairError, load_pair
from blockwidth.policy import files

from conftest import ROOT


@pytest.fixture
def reads(monkeypatch):
    """Every file this tool's own reader opens (policy.files.read_bytes), and every safetensors
    header it reads, counted by path. mlx-lm's and transformers' own loaders are not counted:
    they read config.json and the tokenizer files themselves, as they are written."""
    from blockwidth.engine import checkpoint, shapes

    seen: Counter = Counter()
    read_bytes, read_header = files.read_bytes, checkpoint.read_header

    def counted_bytes(path, limit):
        seen[Path(path).resolve()] += 1
        return read_bytes(path, limit)

    def counted_header(file):
        seen[Path(file).resolve()] += 1
        return read_header(file)

    monkeypatch.setattr(files, "read_bytes", counted_bytes)
    monkeypatch.setattr(checkpoint, "read_header", counted_header)
    monkeypatch.setattr(shapes, "read_header", counted_header)
    return seen


def _configs(seen: Counter) -> dict[str, int]:
    return {p.parent.name: n for p, n in seen.items() if p.name == "config.json"}


@pytest.mark.parametrize("kind", ["model", "dflash", "mtp"])
def test_a_pair_load_reads_each_config_and_each_header_once(kind, reads):
    drafter = demo.DRAFTERS[kind]
    pair = load_pair(demo.target("bf16"), drafter, kind)
    assert _configs(reads) == {"target-bf16": 1, drafter.name: 1}
    headers = {p: n for p, n in reads.items() if p.suffix == ".safetensors"}
    assert headers and set(headers.values()) == {1}, headers
    # what was read is what the pair holds: one value per folder, the fingerprint from it
    assert pair.checkpoints["target"].config is pair.target_config
    assert pair.fingerprints["drafter"] == pair.checkpoints["drafter"].fingerprint


def test_a_resolution_reads_each_config_once(reads):
    from blockwidth.console.inputs import resolution

    resolution(target=None, draft=None, kind="model", flag=None, device="cpu", profile=None)
    assert _configs(reads) == {"target-bf16": 1, "drafter": 1}


def test_the_served_path_reads_each_config_once_and_checks_as_the_engine_path(reads):
    from blockwidth.engine.session.served import served_pair

    pair = served_pair(demo.target("bf16"), demo.DRAFTERS["model"])
    assert _configs(reads) == {"target-bf16": 1, "drafter": 1}
    assert pair.context_length == 1024


def test_the_served_path_refuses_a_drafter_whose_tokenizer_differs(tmp_path):
    """Same vocabulary size, another tokenizer: the engine path refused it, the served path did
    not look (it compared the configs' sizes only)."""
    from blockwidth.engine.session.served import served_pair

    drafter = tmp_path / "drafter"
    shutil.copytree(demo.DRAFTERS["model"], drafter)
    tok = json.loads((drafter / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
    (drafter / "tokenizer.json").write_text(json.dumps(tok))
    for load in (lambda: served_pair(demo.target("bf16"), drafter),
                 lambda: load_pair(demo.target("bf16"), drafter, "model")):
        with pytest.raises(PairError, match="tokenizer of 2048 tokens differs from target") as e:
            load()
        assert e.value.input_name == "draft"


def test_the_served_pairs_context_honours_text_config():
    from blockwidth.engine.session.served import ServedPair

    nested = {"text_config": {"max_position_embeddings": 4096}}
    assert ServedPair(Path("t"), Path("d"), None, {}, nested, None).context_length == 4096


def test_engine_session_loads_no_mlx():
    """engine.session holds what does not run the model: importing it loads no MLX."""
    code = ("import sys\nimport blockwidth.engine.session.host, blockwidth.engine.session.record, "
            "blockwidth.engine.session.served\n"
            "assert not [m for m in sys.modules if m == 'mlx' or m.startswith('mlx.')], 'mlx imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)


def test_a_float32_copy_whose_config_says_bfloat16_is_described_by_its_tensors(tmp_path, capsys):
    """mlx_lm.convert --dtype float32 keeps config.json's torch_dtype "bfloat16": the pair, its
    records and inspect call it float32 (what the CPU computes in, and costs), and inspect says
    what the config claimed. Without the tensors' word the console printed 'unquantized bfloat16'
    over a float32 costcurve."""
    import mlx.core as mx

    from blockwidth.console.cli import main

    src, folder = demo.target("bf16"), tmp_path / "f32"
    shutil.copytree(src, folder)
    for f in folder.glob("*.safetensors"):
        mx.save_safetensors(str(f), {k: v.astype(mx.float32) for k, v in mx.load(str(f)).items()},
                            metadata={"format": "mlx"})
    config = json.loads((folder / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    (folder / "config.json").write_text(json.dumps(config))
    pair = load_pair(folder, None, "lookup")
    assert pair.quantization.describe() == "unquantized float32"
    assert "tensors float32, config.json says bfloat16" in pair.quantization.detail
    assert pair.quantization.to_dict()["dtype"] == "float32"  # what a record stores
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "quantization unquantized float32" in out and "dtype        float32 (config.json says bfloat16)" in out
    # a bfloat16 checkpoint that says so keeps its words
    assert load_pair(src, None, "lookup").quantization.describe() == "unquantized bfloat16"
