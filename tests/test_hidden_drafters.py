"""DFlash and MTP drafters on the demo target, on CPU: published layouts written here with random
weights load, malformed ones are refused in one line, greedy output equals classic, one drafter
forward per DFlash round, and the hidden states come from the verify forward itself."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

from blockwidth.policy.errors import BlockwidthError  # a refusal reaches the caller as its reader raised it
from blockwidth.engine import costcurve, demo, hidden
from blockwidth.engine.decode import classic, speculative
from blockwidth.engine.demo.prompts import DEMO_PROMPTS
from blockwidth.engine.pair import load_pair
from blockwidth.policy.drafter import DrafterKind, read_drafter
from tests import checkpoints as bd

TOKENS = 40
TARGET = demo.target("bf16")
TCONFIG = json.loads((TARGET / "config.json").read_text())


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafters")
    out = {"dflash": bd.write_dflash(root / "dflash", bd.dflash_config(TCONFIG), seed=1)}
    for layout in ("deepseek-v3", "qwen3.5", "mimo"):
        out[layout] = bd.write_mtp(root / f"mtp-{layout}", TCONFIG, layout=layout, seed=2)
    return out


def _drafter(kind: str, ckpts) -> Path:
    """The trained demo drafter when the repository has it, else the random one written here."""
    trained = demo.DRAFTERS[kind]
    return trained if trained.is_dir() else ckpts["dflash" if kind == "dflash" else "deepseek-v3"]


@pytest.fixture(scope="module")
def pairs(ckpts):
    return {k: load_pair(TARGET, _drafter(k, ckpts), k) for k in ("dflash", "mtp")}


@pytest.fixture(scope="module")
def prompt_ids(pairs):
    return pairs["dflash"].tokenizer.encode(DEMO_PROMPTS[0])


@pytest.fixture(scope="module")
def reference(pairs, prompt_ids):
    return classic(pairs["dflash"], prompt_ids, TOKENS)


def test_published_layouts_load(ckpts):
    p = load_pair(TARGET, ckpts["dflash"], "dflash")
    assert p.kind is DrafterKind.DFLASH and p.drafter.spec.target_layer_ids == bd.DFLASH_LAYERS
    assert p.drafter.spec.block_size == 16 and p.drafter_path == ckpts["dflash"]
    info = read_drafter(ckpts["dflash"])
    assert info.kind is DrafterKind.DFLASH and info.declared_width == 16 and info.target_layers == (1, 3, 5)
    for layout in ("deepseek-v3", "qwen3.5", "mimo"):
        p = load_pair(TARGET, ckpts[layout], "mtp")
        assert p.drafter.layout.value == layout and len(p.drafter.heads) == 1
    assert read_drafter(ckpts["deepseek-v3"]).kind is DrafterKind.MTP  # detected, no --kind needed


@pytest.mark.parametrize("kind", ["dflash", "mtp"])
@pytest.mark.parametrize("width", range(2, 9))
def test_greedy_output_equals_classic(pairs, prompt_ids, reference, kind, width):
    run = speculative(pairs[kind], prompt_ids, TOKENS, width)
    assert run.tokens == reference.tokens
    assert sum(r.emitted for r in run.rounds) == TOKENS
    for r in run.rounds[:-1]:
        assert r.emitted == r.accepted + 1 and r.accepted <= r.drafted <= width - 1


def test_random_mtp_layouts_are_exact(ckpts, prompt_ids, reference):
    for layout in ("qwen3.5", "mimo"):
        p = load_pair(TARGET, ckpts[layout], "mtp")
        assert speculative(p, prompt_ids, TOKENS, 4).tokens == reference.tokens


class Counting:
    """The target, counting its forwards (and delegating everything else)."""

    def __init__(self, model):
        self.__dict__["_model"] = model
        self.__dict__["calls"] = []

    def __call__(self, x, *a, **kw):
        self.calls.append(x.shape[1])
        return self._model(x, *a, **kw)

    def __getattr__(self, name):
        return getattr(self._model, name)


@pytest.mark.parametrize("kind", ["dflash", "mtp"])
def test_one_target_forward_per_round_and_hidden_states_from_it(pairs, prompt_ids, kind):
    from blockwidth.engine.drafters import make_drafter

    pair = pairs[kind]
    counted = replace(pair, target=Counting(pair.target))
    drafter = make_drafter(counted)
    width = 5
    run = speculative(counted, prompt_ids, TOKENS, width, drafter=drafter)
    # one prefill forward (the prompt is shorter than a prefill chunk), then one verify per round
    assert len(counted.target.calls) == 1 + len(run.rounds)
    assert counted.target.calls[0] == len(prompt_ids) - 1
    assert counted.target.calls[1:] == [r.drafted + 1 for r in run.rounds]
    if kind == "dflash":
        # one drafter forward per round proposes the whole block
        assert drafter.forwards == len(run.rounds)
        done = 0
        for r in run.rounds:  # width - 1 drafts, fewer only where fewer tokens are still wanted
            assert r.drafted == min(width - 1, TOKENS - done)
            done += r.emitted
    else:
        # chained heads: one forward per drafted token
        assert drafter.forwards == sum(r.drafted for r in run.rounds)
    # What the drafter was handed equals the target's hidden states of the committed text at
    # those positions (recomputed here by one fresh forward), and it came without extra forwards.
    got = mx.concatenate(drafter.received, axis=1)
    layers = pair.drafter.spec.target_layer_ids if kind == "dflash" else (hidden.FINAL,)
    seen: dict = {}
    with hidden.Capture(pair.target, layers, seen.update):
        pair.target(mx.array(prompt_ids + run.tokens, mx.uint32)[None])
    want = mx.concatenate([seen[i] for i in layers], axis=-1)[:, : got.shape[1]]
    assert got.shape[1] >= len(prompt_ids) - 1 + len(run.rounds) - 1
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)),
                               atol=0.05, rtol=0.05)


def test_capture_leaves_the_target_as_it_was(pairs, prompt_ids):
    target = pairs["dflash"].target
    before = [type(m) for m in hidden.inner(target).layers] + [type(hidden.inner(target).norm)]
    with hidden.Capture(target, (0, 5, hidden.FINAL), lambda s: None):
        assert type(hidden.inner(target).layers[0]) is not before[0]
    after = [type(m) for m in hidden.inner(target).layers] + [type(hidden.inner(target).norm)]
    assert after == before


def _edit(src: Path, dst: Path, change) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    change(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _drop_mask(c):
    del c["dflash_config"]["mask_token_id"]


@pytest.mark.parametrize("change,msg", [
    (lambda c: c["dflash_config"].update(target_layer_ids=[1, 9]), "name layer 9, but the target has 6 layers"),
    (lambda c: c.update(hidden_size=128), "hidden_size 128 differs from the target's 256"),
    (lambda c: c.update(vocab_size=4096), "vocabulary of 4096 tokens differs from the target's 2048"),
    (_drop_mask, "no mask_token_id"),
    (lambda c: c["dflash_config"].update(mask_token_id=5000), "mask_token_id 5000 is outside"),
    (lambda c: c.update(num_target_layers=36), "made for a 36-layer target"),
    (lambda c: c.update(architectures=["DFlash2DraftModel"]), "is not DFlashDraftModel"),
])
def test_malformed_dflash_refused(ckpts, tmp_path, change, msg):
    bad = _edit(ckpts["dflash"], tmp_path / "bad", change)
    with pytest.raises(BlockwidthError, match=msg) as e:
        load_pair(TARGET, bad, "dflash")
    assert "\n" not in str(e.value) and str(bad) in str(e.value)


def test_a_dflash_drafters_sizes_count_no_vocabulary_table(ckpts, tmp_path):
    """A DFlash drafter reads the target's embedding and LM head, so its config's vocab_size
    names no table it holds: SmolLM2-135M's trained drafter (8.4M weights, vocabulary 49152 x
    576) was refused as a config "describing about 35,389,440 weights". Here a drafter whose
    vocabulary would be most of it reaches the check that names what is really wrong."""
    from blockwidth.engine import shapes

    big = _edit(ckpts["dflash"], tmp_path / "big", lambda c: c.update(vocab_size=49152))
    with pytest.raises(BlockwidthError, match="vocabulary of 49152 tokens differs from the target's 2048"):
        load_pair(TARGET, big, "dflash")
    cfg = json.loads((big / "config.json").read_text())
    assert shapes.implied_parameters(cfg) - shapes.implied_parameters(cfg, tables=False) == 49152 * 256


def test_malformed_mtp_refused(ckpts, tmp_path):
    other = _edit(ckpts["deepseek-v3"], tmp_path / "other", lambda c: c.update(model_type="deepseek_v3"))
    with pytest.raises(BlockwidthError, match="made for another architecture: model_type deepseek_v3"):
        load_pair(TARGET, other, "mtp")
    # a block of another kind (MLA attention tensors) under the right names
    mla = tmp_path / "mla"
    shutil.copytree(ckpts["deepseek-v3"], mla)
    w = mx.load(str(mla / "model.safetensors"))
    w["model.layers.6.self_attn.kv_a_proj_with_mqa.weight"] = mx.zeros((8, 256))
    mx.save_safetensors(str(mla / "model.safetensors"), w)
    with pytest.raises(BlockwidthError, match="model.layers.6.self_attn.kv_a_proj_with_mqa.weight does not fit the target's llama block"):
        load_pair(TARGET, mla, "mtp")
    none = _edit(ckpts["deepseek-v3"], tmp_path / "none", lambda c: c.pop("num_nextn_predict_layers"))
    with pytest.raises(BlockwidthError, match="no MTP layers"):
        load_pair(TARGET, none, "mtp")
    with pytest.raises(BlockwidthError, match=f"target {TARGET}: no MTP layers"):
        load_pair(TARGET, None, "mtp")  # the demo target carries none


def test_mtp_from_the_target_checkpoint_itself(tmp_path, prompt_ids):
    """A MiMo target whose own checkpoint holds its MTP layer (mlx-lm drops it when loading)."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import mimo

    cfg = dict(model_type="mimo", architectures=["MiMoForCausalLM"], hidden_size=64, num_hidden_layers=2,
               intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5,
               vocab_size=2048, max_position_embeddings=1024, tie_word_embeddings=True,
               num_nextn_predict_layers=1)
    mx.random.seed(3)
    model = mimo.Model(mimo.ModelArgs.from_dict(cfg))
    weights = dict(tree_flatten(model.parameters()))
    weights.update(bd.mtp_tensors(bd.mtp_head(cfg), "mimo", cfg))
    out = tmp_path / "mimo"
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(cfg))
    for f in TARGET.iterdir():
        if f.name.startswith(("tokenizer", "special")):
            shutil.copy(f, out / f.name)
    pair = load_pair(out, None, "mtp")
    assert pair.drafter.layout.value == "mimo" and "own MTP layers" in pair.describe()
    ref = classic(pair, prompt_ids, 24)
    for w in (2, 3, 6):
        assert speculative(pair, prompt_ids, 24, w).tokens == ref.tokens


def test_draft_cost_models_flat_and_linear():
    curve = costcurve.CostCurve(16, 3, tuple(costcurve.Point(k, ms, ms, ms) for k, ms in
                                             [(1, 10.0), (2, 11.0), (4, 12.0), (8, 14.0)]))
    flat = costcurve.predict_terms(curve, 0.8, 3.0, (2, 4, 8), costcurve.DraftCost.FLAT)
    lin = costcurve.predict_terms(curve, 0.8, 3.0, (2, 4, 8), costcurve.DraftCost.LINEAR)
    assert [flat[k].draft_ms for k in (2, 4, 8)] == [3.0, 3.0, 3.0]
    assert [lin[k].draft_ms for k in (2, 4, 8)] == [3.0, 9.0, 21.0]
    assert flat[8].verify_ms == lin[8].verify_ms == 14.0
    assert flat[8].speedup == pytest.approx(costcurve.expected_tokens(0.8, 8) / 17.0 * 10.0)
    assert max(flat, key=lambda k: flat[k].speedup) == 8 and max(lin, key=lambda k: lin[k].speedup) < 8
    assert costcurve.draft_cost("dflash") is costcurve.DraftCost.FLAT
    assert "draft 3.00 + verify 14.00 ms" in flat[8].describe()


def test_cli_refuses_malformed_dflash_and_inspect_reports(ckpts, tmp_path, blockwidth):
    bad = _edit(ckpts["dflash"], tmp_path / "bad", lambda c: c["dflash_config"].update(target_layer_ids=[40]))
    r = blockwidth("sweep", "--target", str(TARGET), "--draft", str(bad), "--widths", "4", "-n", "1")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "name layer 40, but the target has 6 layers" in lines[0] and str(bad) in lines[0]
    r = blockwidth("inspect", str(ckpts["dflash"]), "--json")
    d = json.loads(r.stdout)
    assert d["drafter_kind"] == "dflash" and d["declared_width"] == 16 and d["target_layers"] == [1, 3, 5]
    r = blockwidth("inspect", str(ckpts["deepseek-v3"]))
    assert "mtp" in r.stdout and "final hidden state" in r.stdout


def test_console_refuses_a_malformed_dflash_pair_and_says_why(ckpts, tmp_path):
    import asyncio

    from blockwidth.console.app import BlockwidthApp, Options

    bad = _edit(ckpts["dflash"], tmp_path / "bad", lambda c: c.update(hidden_size=128))

    async def go():
        app = BlockwidthApp(Options(target=str(TARGET), draft=str(bad), kind="dflash", device="cpu",
                                    profile=str(tmp_path / "p.toml"), record_dir=str(tmp_path / "rec")))
        async with app.run_test(size=(140, 48)) as pilot:
            await pilot.pause()
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert app.pair is None
            shown = str(app.query_one("#pair").render())
            assert "pair not loaded" in shown and "hidden_size 128 differs from the target's 256" in shown

    asyncio.run(go())


@pytest.mark.skipif(not (demo.DFLASH.is_dir() and demo.MTP.is_dir()), reason="demo drafters not built")
def test_demo_hidden_state_drafters_accept(pairs):
    """Per-drafted-token acceptance at width 4 over the demo prompts (lab/demo-build/README.md: first 0.273 and 0.467)."""
    seen = {}
    for kind in ("dflash", "mtp"):
        acc = dra = 0
        for p in DEMO_PROMPTS:
            run = speculative(pairs[kind], pairs[kind].tokenizer.encode(p), 64, 4)
            acc, dra = acc + run.accepted, dra + run.drafted
        seen[kind] = acc / dra
    assert seen["dflash"] >= 0.2 and seen["mtp"] >= 0.4, seen


def test_4bit_target_exact_with_hidden_state_drafters(ckpts):
    """The quantized target: its quantized embedding and LM head serve the drafters too."""
    target = demo.target("4bit")
    for kind in ("dflash", "mtp"):
        pair = load_pair(target, _drafter(kind, ckpts), kind)
        ids = pair.tokenizer.encode(DEMO_PROMPTS[1])
        assert speculative(pair, ids, 16, 4).tokens == classic(pair, ids, 16).tokens
