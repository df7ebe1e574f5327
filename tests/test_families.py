"""Speculative decoding on every model family mlx-lm ships: tiny random checkpoints built with
mlx-lm's own classes (tests/families.py), on this CPU.

For the families the product is measured on (recurrent state, sliding windows of 16 that a run
leaves, MoE): classic equals mlx-lm's own greedy tokens (generate_step), and widths 2, 4 and 8
equal classic byte for byte with prompt lookup, a draft model of the same family that does not
agree, and a drafter that agrees 3 times in 4 (rounds that accept and rounds that reject). Then
every other family: byte-identical, or refused at load in one line naming the real cause."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from blockwidth.policy.errors import BlockwidthError  # a refusal reaches the caller as its reader raised it
from blockwidth.engine.decode import classic, speculative
from blockwidth.engine.kvcache import CacheKindError, Method, WindowCache, plan, rewind
from blockwidth.engine.pair import load_pair
from tests import families as F

PROMPT = "The quick brown fox jumps over the lazy dog, and the dog sleeps under the old tree."
TOKENS = 32
DRAFTED = 20  # a draft model's runs (the costliest, a forward per drafted token): still past the window
WIDTHS = (2, 4, 8)
WINDOWED = ("gemma3_text", "gemma4_text", "laguna", "gpt_oss", "cohere2", "muse_glimmer")
RECURRENT = ("qwen3_5", "qwen3_next", "lfm2", "nemotron_h", "granitemoehybrid")


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """``checkpoint(family, seed)``: the tiny checkpoint's folder, written once a session."""
    root = tmp_path_factory.mktemp("families")
    made: dict[tuple, Path] = {}

    def get(family: str, seed: int = 1, config: dict | None = None, tag: str = "", **kw) -> Path:
        key = (family, seed, tag)
        if key not in made:
            cfg = config if config is not None else F.tiny_config(family)
            made[key] = F.write(root / f"{family}-{seed}{tag}", cfg, seed=seed, **kw)
        return made[key]

    return get


def _mlx_lm_greedy(model, ids: list[int], n: int) -> list[int]:
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(mx.array(ids), model, max_tokens=n):
        out.append(int(tok))
        if len(out) == n:
            break
    return out


def _agreeing(ids, ref, seed, agree=0.75, inner=None):
    return F.AgreeingDrafter([ids[-1]] + ref.tokens, agree, seed=seed, inner=inner)


@pytest.mark.parametrize("family", list(F.NAMED))
def test_every_width_equals_classic_and_classic_equals_mlx_lm(checkpoint, family):
    target = load_pair(checkpoint(family, 1))
    model_pair = load_pair(checkpoint(family, 1), checkpoint(family, 2), "model")
    ids = target.tokenizer.encode(PROMPT)
    ref = classic(target, ids, TOKENS)
    assert ref.tokens == _mlx_lm_greedy(target.target, ids, TOKENS)
    if family in WINDOWED:  # the runs leave the sliding window
        assert target.window == F.WINDOW and len(ids) + DRAFTED > 2 * target.window
    if family in RECURRENT:
        assert target.caches.recurrent
    accepted = rejected = 0
    for w in WIDTHS:
        for pair, drafter in ((target, None), (model_pair, None), (target, _agreeing(ids, ref, w))):
            n = DRAFTED if pair is model_pair else TOKENS
            run = speculative(pair, ids, n, w, drafter=drafter)
            assert run.tokens == ref.tokens[:n], (family, w, pair.kind.value, type(drafter).__name__)
            if drafter is not None:
                accepted += sum(1 for r in run.rounds if r.accepted)
                rejected += sum(1 for r in run.rounds if r.accepted < r.drafted)
    assert accepted and rejected  # both kinds of round were rolled back


@pytest.mark.parametrize("method", list(Method))
@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "lfm2"])
def test_each_rollback_of_recurrent_state_is_exact(checkpoint, family, method):
    pair = load_pair(checkpoint(family, 1))
    ids = pair.tokenizer.encode(PROMPT)
    ref = classic(pair, ids, TOKENS)
    for w in (2, 5):
        run = speculative(pair, ids, TOKENS, w, drafter=_agreeing(ids, ref, w), rollback=method)
        assert run.tokens == ref.tokens, (family, method, w)
        assert run.rollback == {"method": method.value, "fallback": None}
        timed = [r.rollback_s for r in run.rounds if r.accepted < r.drafted]
        assert timed and all(t > 0 for t in timed)  # recurrent work is evaluated and timed
        assert all(r.rollback_s == 0 for r in run.rounds if r.accepted == r.drafted)


def _attend(q, k, v, mask):
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)


def test_window_cache_sees_exactly_the_window_and_drops_a_rejected_tail():
    """Against attention over the full history cut to the window: single rows past the window,
    verify blocks of 4 with a rejected tail dropped, and mlx-lm's own RotatingKVCache alongside."""
    from mlx_lm.models.base import create_causal_mask
    from mlx_lm.models.cache import RotatingKVCache

    W, D = 8, 16
    mx.random.seed(3)
    win, rot = WindowCache(W, slack=4), RotatingKVCache(max_size=W)
    win.step = 8  # compacts every few rows instead of every 256
    keys, values = [], []

    def reference(q, start):
        k = mx.concatenate(keys, axis=2)
        v = mx.concatenate(values, axis=2)
        mask = create_causal_mask(q.shape[2], start, window_size=W)
        return _attend(q, k, v, mask)

    for step in range(30):
        n = 1 if step % 3 else 4
        q = mx.random.normal((1, 2, n, D))
        k = mx.random.normal((1, 2, n, D))
        v = mx.random.normal((1, 2, n, D))
        start = sum(x.shape[2] for x in keys)
        mask = win.make_mask(n, window_size=W)
        got = _attend(q, *win.update_and_fetch(k, v), mask)
        keys.append(k)
        values.append(v)
        assert mx.allclose(got, reference(q, start), atol=1e-5)
        if n == 1:
            rmask = rot.make_mask(1, window_size=W)
            assert mx.allclose(got, _attend(q, *rot.update_and_fetch(k, v), rmask), atol=1e-5)
        else:
            win.trim(2)  # the verify kept 2 of its 4 rows
            keys[-1], values[-1] = k[:, :, :2], v[:, :, :2]
            rot = RotatingKVCache(max_size=W)  # mlx-lm's cannot drop them: rebuilt from history
            rot.update_and_fetch(mx.concatenate(keys, axis=2), mx.concatenate(values, axis=2))
    assert win.offset == sum(x.shape[2] for x in keys) and win.start > 0
    assert win.keys.shape[2] <= W - 1 + 4 + 4 + win.step  # bounded, not the history


def test_the_exact_path_s_caches_keep_their_buffers_off_multiples_of_256():
    """make_cache(off_step_buffers=True): plain KV and window buffers hold one row past a multiple
    of 256 through growth, verify blocks and trims (MLX's CUDA 1-row attention decodes through
    cuDNN only on a buffer that is a multiple of 256), the keys they hand out are what mlx-lm's
    KVCache and the plain WindowCache hand out, and each handed-out key array is marked for the
    exact path's dispatcher while a routing is active."""
    from mlx_lm.models.cache import KVCache

    from blockwidth.engine import attention
    from blockwidth.engine.kvcache import off_step

    assert [off_step(n) for n in (1, 255, 256, 257, 512)] == [257, 257, 257, 513, 513]
    mx.random.seed(5)
    for off, plain in ((_off_step_kv_cache(), KVCache()), (WindowCache(300, 4, True), WindowCache(300, 4))):
        marked = []
        routing = attention.Routing(attention.VerifyAttention.ROWS)
        token = attention._active.set(routing)
        try:
            for step in range(260):
                n = 1 if step % 5 else 6
                k = mx.random.normal((1, 2, n, 8))
                got = off.update_and_fetch(k, k + 1)
                want = plain.update_and_fetch(k, k + 1)
                marked.append(routing.off_step_keys is got[0])
                assert off.keys.shape[2] % 256 != 0
                assert mx.array_equal(got[0], want[0]).item() and mx.array_equal(got[1], want[1]).item()
                if n > 1:  # the verify kept 2 of its 6 rows
                    off.trim(4)
                    plain.trim(4)
        finally:
            attention._active.reset(token)
        assert all(marked) and off.offset == plain.offset > 256


def _off_step_kv_cache():
    from blockwidth.engine.kvcache import _off_step_kv

    return _off_step_kv()()


def test_window_cache_refuses_to_drop_more_than_its_slack():
    from blockwidth.engine.kvcache import RewindError

    win = WindowCache(4, slack=2)
    win.step = 4
    x = mx.zeros((1, 1, 1, 8))
    for _ in range(40):
        win.update_and_fetch(x, x)
    with pytest.raises(RewindError, match="slack 2"):
        win.trim(win.offset - win.start - 2)


def test_recurrent_state_is_not_trimmed_silently(checkpoint):
    from blockwidth.engine.kvcache import RewindError, make_cache

    pair = load_pair(checkpoint("qwen3_5", 1))
    cache = make_cache(pair.target, slack=4)
    pair.target(mx.array([[3, 4, 5]]), cache=cache)
    with pytest.raises(RewindError, match="ArraysCache holds recurrent state"):
        rewind(cache, 1)


def _qwen35_with_mtp() -> dict:
    cfg = F.tiny_config("qwen3_5")
    cfg["text_config"]["mtp_num_hidden_layers"] = 1
    return cfg


@pytest.fixture(scope="module")
def qwen35_seeds(checkpoint, tmp_path_factory):
    """A Qwen 3.5-layout target carrying its own MTP layer, and a DFlash drafter reading its
    layers 0-2 (gated-delta, attention, gated-delta)."""
    from tests import checkpoints as bd

    cfg = _qwen35_with_mtp()
    mx.random.seed(5)
    extra = bd.mtp_tensors(bd.mtp_head(cfg), "qwen3.5", cfg)
    target = checkpoint("qwen3_5", 1, config=cfg, tag="-mtp", extra=extra)
    root = tmp_path_factory.mktemp("seeds")
    dflash = bd.write_dflash(root / "dflash", bd.dflash_config(cfg, layers=(0, 1, 2), n_layers=1,
                                                              block=8), seed=3)
    return target, dflash


@pytest.mark.parametrize("kind", ["dflash", "mtp"])
def test_dflash_and_mtp_on_a_qwen35_target_equal_classic(qwen35_seeds, kind):
    from blockwidth.engine.drafters import make_drafter

    target, dflash = qwen35_seeds
    pair = load_pair(target, dflash if kind == "dflash" else None, kind)
    assert pair.caches.recurrent
    ids = pair.tokenizer.encode(PROMPT)
    ref = classic(pair, ids, 20)
    accepted = 0
    for w in range(2, 9):
        assert speculative(pair, ids, 20, w).tokens == ref.tokens, (kind, w)
        if w in (2, 4, 8):  # its own drafts where it disagrees: its state follows accepted rounds
            run = speculative(pair, ids, 20, w, drafter=_agreeing(ids, ref, w, inner=make_drafter(pair, w)))
            assert run.tokens == ref.tokens, (kind, w, "agreeing")
            accepted += run.accepted
    assert accepted


@pytest.mark.parametrize("family", ["gemma3_text", "gemma4_text"])
def test_a_model_drafter_on_a_gemma_target_equals_classic_at_widths_2_to_8(checkpoint, family):
    """A draft model that is the target with its weights perturbed by 2 %: it agrees part of the
    time, so its own windowed cache goes back to the step after the last accepted draft in rounds
    that accept and in rounds that reject."""
    from mlx.utils import tree_map

    model = F.build(F.tiny_config(family), seed=1)
    mx.random.seed(7)
    model.update(tree_map(lambda p: (p * (1 + 0.02 * mx.random.normal(p.shape))).astype(p.dtype)
                          if mx.issubdtype(p.dtype, mx.floating) else p, model.parameters()))
    near = checkpoint(family, 1, tag="-near", model=model)
    pair = load_pair(checkpoint(family, 1), near, "model")
    assert pair.drafter_caches.window == F.WINDOW
    ids = pair.tokenizer.encode(PROMPT)
    ref = classic(pair, ids, 20)
    accepted = rejected = 0
    for w in range(2, 9):
        run = speculative(pair, ids, 20, w)
        assert run.tokens == ref.tokens, (family, w)
        accepted += run.accepted
        rejected += sum(1 for r in run.rounds if r.accepted < r.drafted)
    assert accepted and rejected


def test_mtp_norms_of_a_published_qwen35_checkpoint_are_shifted(checkpoint, tmp_path):
    """A Qwen 3.5 checkpoint in its published layout stores RMSNorm weights as w - 1 (mlx-lm adds
    1 to the target's when it converts them): the MTP head read from it gets the same."""
    import shutil

    from blockwidth.engine import mtp
    from tests import checkpoints as bd

    cfg = _qwen35_with_mtp()
    mx.random.seed(5)
    extra = bd.mtp_tensors(bd.mtp_head(cfg), "qwen3.5", cfg)
    mlx_layout = checkpoint("qwen3_5", 1, config=cfg, tag="-mtp", extra=extra)
    hf = tmp_path / "hf"
    shutil.copytree(mlx_layout, hf)
    weights = mx.load(str(hf / "model.safetensors"))
    weights = {k: (v.moveaxis(2, 1) if k.endswith("conv1d.weight") else v) for k, v in weights.items()}
    mx.save_safetensors(str(hf / "model.safetensors"), weights)
    pair = load_pair(mlx_layout)
    a = mtp.load(None, pair.target, mlx_layout, cfg).heads[0]
    b = mtp.load(None, pair.target, hf, cfg).heads[0]
    assert mx.allclose(b.hnorm.weight, a.hnorm.weight + 1.0)
    assert mx.allclose(b.blocks[0].input_layernorm.weight, a.blocks[0].input_layernorm.weight + 1.0)
    assert mx.array_equal(b.proj.weight, a.proj.weight)


def test_sizes_under_text_config_are_read(checkpoint, tmp_path):
    """A Qwen 3.5 checkpoint in its published layout pairs with a model drafter; a drafter of
    another vocabulary is refused naming both sizes (it read None before)."""
    target = checkpoint("qwen3_5", 1)
    pair = load_pair(target, checkpoint("qwen3_5", 2), "model")
    assert pair.context_length == 4096 and pair.drafter_caches.recurrent
    cfg = F.tiny_config("qwen3_5")
    cfg["text_config"]["vocab_size"] = 4096
    other = F.write(tmp_path / "other", cfg, seed=2)
    with pytest.raises(BlockwidthError, match="vocabulary of 4096 tokens differs from target .*'s 2048"):
        load_pair(target, other, "model")


def test_a_cache_kind_without_a_rewind_is_refused_at_load_in_one_line(checkpoint, blockwidth):

    path = checkpoint("deepseek_v41", 1, dtype="float32")
    with pytest.raises(BlockwidthError) as e:
        load_pair(path)
    msg = str(e.value)
    assert "\n" not in msg and "layer 0 cache is LayerCache" in msg and "refused" in msg
    out = blockwidth("resolve", "--target", str(path))  # a width, and the warning that it cannot run
    assert out.returncode == 0 and "warning: the engine refuses this target at load" in out.stderr
    assert "LayerCache" in out.stderr and "Traceback" not in out.stderr


# The token table each family names its own way (mamba's backbone.embeddings, openelm's
# transformer.token_embeddings, talkie's model.embed, ...): found in the headers and in the built
# model, and every tokenizer id checked against it before any forward.
OWN_EMBEDDING = {"nemotron_h": "backbone.embeddings", "openelm": "transformer.token_embeddings",
                 "talkie": "model.embed"}


@pytest.mark.parametrize("family", sorted(OWN_EMBEDDING))
def test_a_family_with_its_own_embedding_name_loads_and_its_table_bounds_the_ids(checkpoint, tmp_path,
                                                                                 family):
    import shutil

    from blockwidth.engine import shapes

    name = OWN_EMBEDDING[family]
    path = checkpoint(family, 1, dtype="float32")
    assert shapes.read_weights(path).embedding() == (f"{name}.weight", F.VOCAB)  # the served path's
    pair = load_pair(path)
    assert pair.token_rows == F.VOCAB
    assert [(t.name, t.rows) for t in shapes.module_tables(pair.target, "target")] == [(name, F.VOCAB)]
    hostile = shutil.copytree(path, tmp_path / family)
    tok = json.loads((hostile / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab.update({k: v + 40 for k, v in vocab.items() if v >= F.VOCAB - 40})  # ids past the table
    (hostile / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(BlockwidthError) as e:
        load_pair(hostile)
    msg = str(e.value)
    assert "\n" not in msg and "token id 2,087" in msg and f"{name}.weight has 2,048 rows" in msg, msg


def test_a_quantized_table_counts_its_rows_and_position_tables_are_not_token_tables():
    """A QuantizedEmbedding packs its columns: its rows are weight.shape[0]. gpt2's wpe (positions)
    and gemma3n's per-layer table (ids past it are masked) do not bound the token ids."""
    import mlx.nn as nn

    from blockwidth.engine import shapes

    model = F.build(F.tiny_config("mamba"), seed=1, dtype="float32")
    nn.quantize(model, group_size=32, bits=4, class_predicate=lambda _, m: isinstance(m, nn.Embedding))
    assert isinstance(model.backbone.embeddings, nn.QuantizedEmbedding)
    assert model.backbone.embeddings.weight.shape[1] < F.tiny_config("mamba")["hidden_size"]
    assert [(t.name, t.rows) for t in shapes.module_tables(model, "m")] == [("backbone.embeddings", F.VOCAB)]
    for family, table in (("gpt2", "model.wte"), ("gemma3n", "model.language_model.embed_tokens")):
        model = F.build(F.tiny_config(family), seed=1)
        assert [t.name for t in shapes.module_tables(model, "m")] == [table]


def test_a_model_with_no_token_embedding_at_all_is_refused_in_one_line(checkpoint):
    import mlx.nn as nn

    from blockwidth.engine import shapes
    from blockwidth.engine.pair import token_rows

    path = checkpoint("llama", 1)
    tokenizer = load_pair(path).tokenizer
    headless = shapes.Weights(path, {"lm_head.weight": (F.VOCAB, 64)})
    with pytest.raises(BlockwidthError) as e:
        token_rows(tokenizer, path, headless, None, "target", "draft", nn.Sequential(nn.Linear(64, 64)))
    msg = str(e.value)
    assert "\n" not in msg and "no token embedding found (in the weights or the built model)" in msg


def test_the_session_fits_a_short_context_and_skips_the_curve_with_a_reason(checkpoint, tmp_path):
    from blockwidth.engine.ab import AbConfig, run_session

    prompt = PROMPT + " " + PROMPT  # prompt lookup finds something to draft
    ids_len = len(load_pair(checkpoint("gemma3_text", 1)).tokenizer.encode(prompt))
    for context, tokens, curve in ((ids_len + 24 + 4 + 40, 24, True), (ids_len + 10, 6, False)):
        cfg = F.tiny_config("gemma3_text")
        cfg["max_position_embeddings"] = context
        pair = load_pair(F.write(tmp_path / f"ctx{context}", cfg, seed=1))
        s = run_session(pair, AbConfig(widths=(4,), prompt=prompt, n=1, max_tokens=tokens,
                                       exactness=False))
        assert s.arms[0].identity.identical_ids
        if curve:
            assert s.curve is not None and not s.curve_skipped
            assert s.curve.rollback == "trim" and s.prediction[4].rollback_ms >= 0
        else:
            assert s.curve is None and s.curve_skipped.startswith("cost curve skipped: its 11 positions")
        assert s.rollback_line().startswith("rollback: KV rows trimmed")


def test_cost_curve_and_prediction_carry_the_recurrent_rollback(checkpoint):
    from blockwidth.engine import costcurve

    pair = load_pair(checkpoint("qwen3_5", 1))
    curve = costcurve.measure(pair.target, (1, 2, 4), context=24, repeats=2)
    assert curve.rollback == "replay" and curve.rollback_ms(1) is None
    assert curve.rollback_ms(2) > 0 and curve.rollback_ms(4) > 0
    pred = costcurve.predict_terms(curve, 0.5, 1.0, (2, 4))
    assert pred[4].rollback_ms == pytest.approx(curve.rollback_ms(4) * (1 - 0.5 ** 3))
    assert "rollback" in pred[4].describe()
    measured = costcurve.predict_terms(curve, 0.5, 1.0, (4,), rollback_ms={4: 2.0})[4]
    assert measured.rollback_ms == 2.0
    assert measured.speedup == pytest.approx(measured.tokens_per_round * curve.ms(1)
                                             / (measured.draft_ms + measured.verify_ms + 2.0))


def test_inspect_and_sweep_name_the_caches_and_the_rollback(checkpoint, blockwidth):

    target = checkpoint("qwen3_5", 1)
    out = blockwidth("inspect", str(target), "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["rollback"] == "replay" and {e["kind"] for e in data["caches"]} == {"ArraysCache", "KVCache"}
    out = blockwidth("inspect", str(checkpoint("gemma3_text", 1)))
    assert "RotatingKVCache x2: windowed with slack" in out.stdout
    out = blockwidth("sweep", "--target", str(target), "--widths", "2,4", "-n", "1", "--max-tokens", "16")
    assert out.returncode == 0, out.stderr
    assert "rollback: recurrent state restored and advanced by the kept rows (replay)" in out.stdout
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------------------------------------
# The sweep: every family mlx-lm 0.32.2 ships


SWEEP = [f for f in F.families() if f not in F.NAMED]
SWEEP_TOKENS = 12


@pytest.mark.slow
@pytest.mark.parametrize("family", SWEEP)
def test_every_family_runs_byte_identically_or_is_refused_at_load(checkpoint, family):
    if family in F.CANNOT:
        pytest.skip(f"mlx-lm itself cannot decode a tiny {family} here: {F.CANNOT[family]}")
    path = checkpoint(family, 1, dtype="float32")
    try:
        pair = load_pair(path)
    except BlockwidthError as e:
        msg = str(e)
        assert "\n" not in msg and family in F.REFUSED and F.REFUSED[family] in msg
        return
    assert family not in F.REFUSED
    ids = [5, 17, 33, 60, 5, 17, 90, 12]
    ref = classic(pair, ids, SWEEP_TOKENS)
    assert ref.tokens == _mlx_lm_greedy(pair.target, ids, SWEEP_TOKENS)
    run = speculative(pair, ids, SWEEP_TOKENS, 3, drafter=_agreeing(ids, ref, 3, agree=0.6))
    assert run.tokens == ref.tokens
    assert (run.rollback["fallback"] is None) == (family not in F.FALLBACK)


def test_the_sweep_covers_every_family_mlx_lm_ships():
    import pkgutil

    import mlx_lm.models as M

    shipped = {m.name for m in pkgutil.iter_modules(M.__path__)} - F.NOT_FAMILIES
    assert shipped == set(SWEEP) | set(F.NAMED)
    with pytest.raises(CacheKindError, match="mlx-lm cannot build model_type 'nope'"):
        from blockwidth.engine.kvcache import plan_config

        plan_config({"model_type": "nope"})
    assert plan  # the load-time classifier the sweep exercises


def test_a_sweep_runs_a_model_whose_module_keeps_a_lazy_array(tmp_path, capsys):
    """gemma4_text's proportional rope keeps its frequencies under a private name,
    which mlx-lm does not evaluate; built on the main thread, that graph failed the session's
    worker thread ("There is no Stream(cpu, 0) in current thread"). --json skips the estimate's
    forward, so the worker is the first to run the model."""
    from blockwidth.console.cli import main

    target = F.write(tmp_path / "g4", F.NAMED["gemma4_text"])
    code = main(["sweep", "--target", str(target), "--kind", "lookup", "--widths", "2", "-n", "1",
                 "--max-tokens", "4", "--record-dir", str(tmp_path / "rec"), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["arms"][1]["identity"]["identical_ids"]
