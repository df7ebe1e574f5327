"""lab.target_drafters and lab/target_drafters_gpu.sh on this CPU: the padded greedy batch is each
row's own greedy text, bad input is one line, and the detached script runs end to end on a chat
target (the demo target given a ChatML template, tiny sizes) and writes drafters that this engine
sweeps and mlx-lm drafts with."""

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from blockwidth.engine import demo
from lab import target_drafters as td

ROOT = Path(__file__).resolve().parents[2]
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def chat_target(tmp_path_factory) -> Path:
    """The demo bf16 target with a chat template, as a chat model's folder has one."""
    out = tmp_path_factory.mktemp("chat") / "target"
    shutil.copytree(demo.target("bf16"), out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(dict(cfg, chat_template=CHATML)))
    return out


def test_a_padded_batch_is_each_rows_own_greedy_text():
    """Prompts of different lengths in one left-padded batch continue exactly as each alone does
    (mlx-lm's BatchKVCache alone let the padding's NaN reach the real rows: padded rows came out
    as token 0 throughout), and the rows come back right-padded after their continuation."""
    from mlx_lm.utils import load_model

    from lab.build import greedy_continuations

    target, _ = load_model(demo.target("bf16"))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(1, 2000, size=n).tolist() for n in (5, 17, 11)]
    rows, lengths = td.greedy_batch(target, prompts, 12, pad=0)
    assert lengths.tolist() == [5, 17, 11] and rows.shape == (3, 17 + 12)
    for r, p in enumerate(prompts):
        alone = np.array(greedy_continuations(target, mx.array([p]), 12))[0]
        assert rows[r, :len(p) + 12].tolist() == alone.tolist(), r
        assert (rows[r, len(p) + 12:] == 0).all()


def test_layer_choices():
    assert td.spread(36, 5) == (1, 9, 17, 25, 33)  # z-lab's Qwen3-8B DFlash
    assert td.spread(30, 4) == (1, 10, 18, 27)  # SmolLM2-135M
    assert td.drafter_layers(30, 4) == (0, 1, 2, 3)
    assert td.drafter_layers(2, 4) == (0, 1)


def test_held_out_requests_are_not_what_training_asks():
    """The held-out chat requests are hand-written on other subjects: none is a training request,
    and no training topic or task is named in one."""
    groups = td.held_out(list(td.HELD_OUT_DEFAULT))
    # what the requests ask (a system prompt such as "You are a helpful assistant." is shared)
    held = [m.content for _, w in groups for r in w.requests for m in r.messages if m.role != "system"]
    assert [len(w.requests) for _, w in groups] == [16, 8, 4]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    rng = np.random.default_rng(0)
    material = td.harvest(td.stdlib_files(stdlib)[:40], stdlib, 50, rng)
    asked = {m["content"] for msgs in td.chat_requests(3000, material, rng) for m in msgs
             if m["role"] == "user"}
    assert not asked & set(held)
    for subject in td.TOPICS + td.TASKS:
        assert not any(re.search(rf"\b{re.escape(subject)}\b", h, re.I) for h in held), subject


@pytest.mark.parametrize("argv, says", [
    (["text", "--chat-share", "2"], "--chat-share 2.0: "),
    (["measure", "--widths", "1,4"], "--widths: 1 is not"),
    (["measure", "--kinds", "eagle"], "--kinds: eagle is not"),
    (["dflash", "--target", "NO-SUCH"], "--target NO-SUCH: no config.json"),
    (["dflash"], "no text.npz there"),
    (["measure", "--kinds", "mtp,drafter"], "no mtp/ drafter there"),
    (["text"], "no chat template"),  # the demo target as it ships has none
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    out = tmp_path / "out"
    base = ["--target", str(demo.target("bf16")), "--out", str(out)]
    if "--target" in argv:
        base = ["--out", str(out)]
    assert td.main(argv[:1] + base + argv[1:]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not out.exists()


def test_measure_says_in_one_line_why_the_engine_refuses_a_drafter(tmp_path, capsys):
    from tests.checkpoints import dflash_config, write_dflash

    tconfig = json.loads((demo.target("bf16") / "config.json").read_text())
    write_dflash(tmp_path / "dflash", dflash_config(tconfig, layers=(1, 9)))
    argv = ["measure", "--target", str(demo.target("bf16")), "--out", str(tmp_path), "--kinds", "dflash"]
    assert td.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "name layer 9, but the target has 6 layers" in err[0], err
    assert not (tmp_path / "acceptance-dflash.json").exists()


def _sh(verb: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / "lab" / "target_drafters_gpu.sh"), verb, *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.lease
def test_the_gpu_script_runs_end_to_end_and_its_drafters_load(tmp_path, chat_target, capsys):
    held = tmp_path / "held.jsonl"
    held.write_text('{"id": "h1", "messages": [{"role": "user", "content": "Say hello."}]}\n'
                    '{"id": "h2", "messages": [{"role": "user", "content": "Name a colour."}]}\n')
    res, out = tmp_path / "results", tmp_path / "OUT"
    out.mkdir()
    env = dict(os.environ, TARGET=str(chat_target), RESULTS=str(res), OUT=str(out),
               PYTHONPATH=str(ROOT), GEN_S="0", DFLASH_S="0", MTP_S="0", DRAFTER_S="0", BATCH="2",
               TOKENS="6", DEADLINE="3000",
               # limits for a busy 2-core CPU: the steps' own (100 s and so on) are the H200's
               **{f"{s}_LIMIT": "600" for s in ("TEXT", "DFLASH", "MTP", "DRAFTER", "MEASURE")},
               EXTRA=f"--rows 12 --new 20 --gen-batch 6 --val 4 --steps 3 --blocks 2 "
                     f"--held-out {held}")
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"  # python3: this venv's
    run = _sh("run", env=env)
    log = (res / "run.log").read_text()
    assert run.returncode == 0 and (res / "done").is_file(), log + run.stderr
    assert all(f"{s}: rc 0" in log for s in ("text", "dflash", "mtp", "drafter", "measure-dflash",
                                              "measure-mtp", "measure-drafter")), log
    for kind in td.KINDS:
        acc = json.loads((res / f"acceptance-{kind}.json").read_text())
        assert set(acc["widths"]) == {"2", "4", "8"}, kind
        for w in acc["widths"].values():
            assert w["all"]["drafted"] > 0 and 0 <= w["all"]["pooled"] <= 1
            assert set(w["held.jsonl"]["per_request"]) == {"h1", "h2"}
        assert json.loads((res / f"build-{kind}.json").read_text())["params"] > 0
    text = json.loads((res / "build-text.json").read_text())
    assert text["rows"] == 12 and text["held_out_rows"] == 4 and text["chat_rows"] == 9
    assert _sh("wait", "5", env=env).stdout.startswith("drafters: done")
    with tarfile.open(out / "drafters.tgz") as t:
        names = t.getnames()
    assert "results/acceptance-mtp.json" in names and not [n for n in names if n.endswith(
        (".safetensors", ".npz"))]
    got = _sh("weights", "1", env=env)
    assert got.returncode == 0 and "of 1 in" in got.stdout, got.stdout + got.stderr
    back = tmp_path / "back"
    back.mkdir()
    whole = b"".join(p.read_bytes() for p in sorted(out.glob("drafters-weights.tgz.*")))
    (back / "w.tgz").write_bytes(whole)
    with tarfile.open(back / "w.tgz") as t:
        t.extractall(back, filter="data")
    for kind in td.KINDS:
        assert (back / kind / "model.safetensors").read_bytes() == (res / kind / "model.safetensors").read_bytes()

    # the engine sweeps each drafter (in this process), and mlx-lm drafts with the model drafter
    # as mlx_lm.server --draft-model does
    from blockwidth.console.cli import main as cli

    for kind in td.KINDS:
        capsys.readouterr()
        rc = cli(["sweep", "--target", str(chat_target), "--draft", str(res / kind), "--kind",
                  td.ENGINE_KIND[kind], "--widths", "2,4", "-n", "1", "--max-tokens", "8",
                  "--record-dir", str(tmp_path / "rec"), "--json"])
        assert rc == 0, capsys.readouterr().err
        report = json.loads(capsys.readouterr().out)
        assert report["pair"]["drafter_kind"] == td.ENGINE_KIND[kind], report["pair"]
    from mlx_lm import load
    from mlx_lm.generate import speculative_generate_step

    target, tok = load(str(chat_target))
    drafter, _ = load(str(res / "drafter"))
    steps = list(speculative_generate_step(mx.array(tok.encode("def main():")), target, drafter,
                                           num_draft_tokens=3, max_tokens=8))
    assert len(steps) == 8
