"""The demo build's training forwards compute what the engine computes when it drafts.

A drafter trained on inputs the engine never gives it (another hidden state, other positions,
another attention context for chained steps) learns the wrong task: its training loss falls
while its acceptance does not. Here, after a few training steps of lab.build_drafters on
a fixed batch, a real speculative decode of the demo target (float32, so that a full forward and
the incremental verify forwards agree to rounding) records the logits of every draft the engine
proposes, and the training forward, run on the same committed text and drafts, must give the
same logits and the same argmax, round after round (so also after commits and rejections)."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map

from blockwidth.engine import demo, hidden
from blockwidth.engine.decode import speculative
from lab import build_drafters as bd
from blockwidth.engine.demo.prompts import DEMO_PROMPTS, read_prompts
from blockwidth.engine.dflash import DFlashDrafter
from blockwidth.engine.mtp import MTPDrafter
from blockwidth.engine.pair import load_pair

TARGET = demo.target("bf16")
TCONFIG = json.loads((TARGET / "config.json").read_text())
WIDTH = 4
TOKENS = 24


def _f32(model) -> None:
    model.update(tree_map(lambda p: p.astype(mx.float32) if p.dtype == mx.bfloat16 else p,
                          model.parameters()))


@pytest.fixture(scope="module")
def text() -> tuple[object, np.ndarray]:
    """The target and a fixed batch: the demo prompts' tokens, two rows of 48."""
    from mlx_lm.utils import load_model
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    ids: list[int] = []
    for p in DEMO_PROMPTS:
        ids.extend(tok.encode(p).ids)
    ids = (ids * 4)[:96]
    target, _ = load_model(TARGET)
    return target, np.array(ids, dtype=np.int32).reshape(2, 48)


class Recorder:
    """Wraps a drafter's LM head to keep the logits of every draft it proposes."""

    def __init__(self, drafter):
        self.logits: list[mx.array] = []
        head = drafter.head
        drafter.head = lambda h: self._keep(head(h))

    def _keep(self, logits: mx.array) -> mx.array:
        self.logits.append(logits.reshape(-1, logits.shape[-1]))
        return logits


def _rounds(run, prompt: list[int]):
    """(committed text before the round, drafts of the round) for each round of ``run``."""
    done = 0
    for r in run.rounds:
        yield prompt + run.tokens[:done], r.drafted
        done += r.emitted


def _engine(path, kind: str, make_drafter):
    """The demo target with the drafter at ``path``, both in float32, decoding a demo prompt:
    (pair, prompt, the run, the recorder of the drafter's logits)."""
    pair = load_pair(TARGET, path, kind)
    _f32(pair.target)
    _f32(pair.drafter)
    prompt = pair.tokenizer.encode(DEMO_PROMPTS[2])
    drafter = make_drafter(pair.drafter, pair.target)
    rec = Recorder(drafter)
    run = speculative(pair, prompt, TOKENS, WIDTH, drafter=drafter)
    assert run.rounds and sum(r.drafted for r in run.rounds) > len(run.rounds)
    return pair, prompt, run, rec


def _same(train: mx.array, engine: mx.array) -> None:
    np.testing.assert_allclose(np.array(train), np.array(engine), atol=2e-3, rtol=1e-3)
    assert mx.array_equal(mx.argmax(train, axis=-1), mx.argmax(engine, axis=-1))


def test_dflash_training_forward_is_what_the_engine_drafts(tmp_path, text):
    target, rows = text
    cfg = bd.dflash_config(TCONFIG)
    model, _ = bd.train_dflash([target], [rows], 4, 2, 2, 2e-3, cfg, np.random.default_rng(0), 24)
    path = bd.write_dflash(tmp_path / "dflash", cfg, model)
    pair, prompt, run, rec = _engine(path, "dflash", DFlashDrafter)
    spec = pair.drafter.spec
    for (committed, k), logits in zip(_rounds(run, prompt), rec.logits):
        p = len(committed) - 1  # the pending token's position: context is rows 0..p-1
        feats = bd._features(pair.target, mx.array([committed]), spec.target_layer_ids)
        block = np.array([[committed[-1]] + [0] * k])
        got = bd.dflash_blocks(pair.drafter, pair.target, feats, block, np.array([p]), np.array([0]))
        _same(got[0], logits)


def test_mtp_training_forward_is_what_the_engine_drafts(tmp_path, text):
    target, rows = text
    head, _ = bd.train_mtp([target], [rows], 4, 2, 2e-3, TCONFIG, np.random.default_rng(0), 24)
    path = bd.write_mtp(tmp_path / "mtp", TCONFIG, head)
    pair, prompt, run, rec = _engine(path, "mtp", MTPDrafter)
    head = pair.drafter.heads[0]
    at = 0
    for committed, k in _rounds(run, prompt):
        engine = mx.concatenate(rec.logits[at:at + k])
        at += k
        p = len(committed) - 1
        # the committed text, then the round's own drafts: what each chained step is fed
        drafts = [int(t) for t in mx.argmax(engine, axis=-1).tolist()]
        x = mx.array([committed + drafts])
        _, got = bd.target_features(pair.target, x[:, :p], (hidden.FINAL,))
        outs = bd.mtp_forward(head, hidden.embed(pair.target), got[hidden.FINAL], x, k)
        lm = hidden.lm_head(pair.target)
        # depth d of row p - 1 (hidden at p - 1, token at p) proposes the round's d-th draft
        train = mx.concatenate([lm(o[0, p - 1:p]) for o in outs])
        _same(train, engine)


def test_build_drafters_refuses_a_bad_prompts_file_in_one_line_before_loading(tmp_path, capsys):
    """--prompts-file used to take any JSON list through str() (objects measured on their
    reprs; [] fell back to the demo prompts silently) and to stop in a traceback otherwise.
    The pair does not exist: a file that got past the check would fail on loading it."""
    f = tmp_path / "prompts.json"
    for text in ("{not json", '{"prompts": ["a"]}', "[]", '[{"prompt": "a"}]', '["a", ""]', None):
        if text is None:
            f.unlink()
        else:
            f.write_text(text)
        argv = ["--out", str(tmp_path / "out"), "--pair", str(tmp_path / "no-pair"),
                "--prompts-file", str(f)]
        assert bd.main(argv) == 2, text
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"--prompts-file {f}: "), (text, err)
    assert not (tmp_path / "out").exists()
    f.write_text('["def f(x):", "import os"]')  # a pair's prompts.json
    assert read_prompts(f) == ["def f(x):", "import os"]


def test_acceptance_is_measured_on_the_prompts_it_is_given():
    """--prompts-file's prompts reach acceptance and measure as an argument (they were a module
    global that main() set, and reset so that one call's did not leak into the next); without
    them the demo prompts are measured."""
    mine = ["def f(x):", "import os"]
    got = bd.acceptance(bd.PAIR, bd.PAIR, tokens=(8,), names={"drafter"}, prompts=mine)
    assert set(got) == {"model bf16 8 tokens", "model 4bit 8 tokens"}
    assert all(len(v["per_prompt"]) == len(mine) for v in got.values()), got
    demo_run = bd.measure(bd.PAIR, "model", bd.PAIR / "drafter", "bf16", tokens=(8,))
    assert len(demo_run[8]["per_prompt"]) == len(DEMO_PROMPTS)


def test_dflash_training_can_continue_a_checkpoint(text):
    """--dflash-init: training starts from the checkpoint's weights (at learning rate 0 they are
    what it holds after a step), not from random ones."""
    from blockwidth.engine.dflash import load_model, parse_spec, read_config

    target, rows = text
    path = demo.DFLASH
    cfg = read_config(path)
    model, _ = bd.train_dflash([target], [rows], 1, 2, 2, 0.0, cfg, np.random.default_rng(0), 8,
                               init=path)
    ref = load_model(path, parse_spec(cfg, "ref"), cfg, "ref")
    got, want = dict(tree_flatten(model.parameters())), dict(tree_flatten(ref.parameters()))
    assert got.keys() == want.keys()
    for k in want:
        assert mx.array_equal(got[k].astype(mx.float32), want[k].astype(mx.float32)), k


def test_a_drafter_is_adopted_when_its_worse_target_improves():
    """One drafter serves both demo targets: a candidate that trades part of the bf16 target's
    surplus for the 4-bit target's shortfall is kept; one that lowers the worse figure is not."""
    assert bd.adopt({"bf16": {"candidate": 0.65, "committed": 0.70},
                     "4bit": {"candidate": 0.61, "committed": 0.557}})
    assert not bd.adopt({"bf16": {"candidate": 0.55, "committed": 0.70},
                         "4bit": {"candidate": 0.62, "committed": 0.557}})
    assert not bd.adopt({"bf16": {"candidate": 0.70, "committed": 0.70},
                         "4bit": {"candidate": 0.557, "committed": 0.557}})


@pytest.mark.parametrize("argv, names", [
    (["--drafter-4bit-share", "1.5"], "--drafter-4bit-share 1.5: "),
    (["--dflash-init", "no-such-dir"], "--dflash-init no-such-dir: "),
])
def test_build_drafters_refuses_bad_training_options_in_one_line(tmp_path, capsys, argv, names):
    assert bd.main(["--out", str(tmp_path / "out"), "--pair", str(tmp_path / "no-pair"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(names), err
    assert not (tmp_path / "out").exists()
