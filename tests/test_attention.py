"""The verify-attention choice (engine.attention) on the demo pair, on this CPU.

On a CPU, MLX's fused attention is its own fallback arithmetic, which ``plain``
mirrors, so every choice must give bitwise-equal logits and the same tokens; on
CUDA they differ only in what each costs (docs/verify-attention.md)."""

import threading

import mlx.core as mx
import numpy as np
import pytest

from blockwidth.engine import attention, costcurve
from blockwidth.engine.attention import VerifyAttention, plain_attention, verify_attention
from blockwidth.engine.decode import classic, speculative
from blockwidth.engine.demo.prompts import DEMO_PROMPTS

MODES = ("fused", "plain", "bucketed")


@pytest.fixture(scope="module", params=("bf16", "4bit"))
def pair(request, demo_pairs):
    return demo_pairs(None, request.param)


@pytest.fixture(scope="module")
def ids(pair):
    return pair.tokenizer.encode(DEMO_PROMPTS[1])


def _verify_logits(model, ids, rows, mode):
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array(ids[:-rows], mx.uint32)[None], cache=cache))
    with verify_attention(mode) as routing:
        out = model(mx.array(ids[-rows:], mx.uint32)[None], cache=cache)
    mx.eval(out)
    return np.array(out.astype(mx.float32)), routing


@pytest.mark.parametrize("rows", (2, 5, 8))
def test_every_choice_gives_the_fused_logits(pair, ids, rows):
    ref, routing = _verify_logits(pair.target, ids, rows, "fused")
    assert routing.routed == 0
    for mode in ("plain", "bucketed"):
        got, routing = _verify_logits(pair.target, ids, rows, mode)
        assert routing.routed == pair.target_config["num_hidden_layers"]  # one call per layer
        assert np.array_equal(got, ref), f"{mode} at {rows} rows differs from fused"


def test_same_tokens_at_every_width_and_choice(pair, ids):
    # 20 tokens: several rounds at every width (the 4-bit demo's bfloat16 scales make each of
    # its forwards slow on this CPU; 40 tokens took 24 s)
    reference = classic(pair, ids, 20).tokens
    for width in (2, 4, 8):
        for mode in MODES:
            run = speculative(pair, ids, 20, width, attention=mode)
            assert run.tokens == reference, f"width {width} with {mode} attention"
            assert run.attention["mode"] == mode
            if mode != "fused":
                assert run.attention["routed_calls"] > 0
            # 1-row draft steps never reach the verify attention
            assert run.attention["fused_calls"] > 0


def test_auto_means_plain_on_cuda_and_fused_elsewhere():
    assert attention.effective("auto", "cuda") is VerifyAttention.PLAIN
    assert attention.effective("auto", "cpu") is VerifyAttention.FUSED
    assert attention.effective("auto", "metal") is VerifyAttention.FUSED
    assert attention.effective("bucketed", "cpu") is VerifyAttention.BUCKETED
    assert attention.effective(None, "cuda") is VerifyAttention.PLAIN
    assert attention.effective("vector", "cuda") is VerifyAttention.VECTOR
    with pytest.raises(ValueError, match="expected one of auto, fused, plain, bucketed, vector, rows"):
        attention.parse("cudnn")


def test_only_verify_shapes_are_routed():
    attention.install()
    q = mx.random.normal((1, 4, 1, 32))
    k = mx.random.normal((1, 2, 20, 32))
    with verify_attention("plain") as r:
        mx.fast.scaled_dot_product_attention(q, k, k, scale=0.2)  # 1 row: decode
        big = mx.random.normal((1, 4, 65, 32))
        kk = mx.random.normal((1, 2, 80, 32))
        mx.fast.scaled_dot_product_attention(big, kk, kk, scale=0.2, mask="causal")  # 65 rows
        same = mx.random.normal((1, 4, 20, 32))
        mx.fast.scaled_dot_product_attention(same, k, k, scale=0.2, mask="causal")  # no cache
    assert (r.routed, r.passed) == (0, 3)


def test_the_choice_stays_in_its_thread():
    attention.install()
    q = mx.random.normal((1, 4, 3, 32))
    k = mx.random.normal((1, 2, 30, 32))
    seen = {}

    def other():
        with verify_attention("fused") as r:
            mx.fast.scaled_dot_product_attention(q, k, k, scale=0.2, mask="causal")
        seen["other"] = r.routed

    with verify_attention("plain") as mine:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        mx.fast.scaled_dot_product_attention(q, k, k, scale=0.2, mask="causal")
    assert seen["other"] == 0 and mine.routed == 1


@pytest.mark.parametrize("mask", ("causal", "bool", "additive", "sinks"))
def test_plain_matches_the_fused_kernel_on_masks_gqa_and_sinks(mask):
    attention.install()
    mx.random.seed(3)
    q = mx.random.normal((1, 8, 5, 64)).astype(mx.bfloat16)
    k = mx.random.normal((1, 2, 40, 64)).astype(mx.bfloat16)
    v = mx.random.normal((1, 2, 40, 64)).astype(mx.bfloat16)
    kw = {"mask": "causal"}
    if mask == "bool":
        kw = {"mask": mx.random.uniform(shape=(1, 8, 5, 40)) > 0.3}
    elif mask == "additive":
        kw = {"mask": (mx.random.normal((1, 1, 5, 40)) * 2).astype(mx.bfloat16)}
    elif mask == "sinks":
        kw = {"mask": "causal", "sinks": mx.random.normal((8,)).astype(mx.bfloat16)}
    ref = attention._fused(q, k, v, scale=0.125, **kw)
    for got in (plain_attention(q, k, v, scale=0.125, **kw),
                attention.bucketed_attention(q, k, v, scale=0.125, **kw)):
        assert np.allclose(np.array(got.astype(mx.float32)), np.array(ref.astype(mx.float32)),
                           atol=2e-2), mask


@pytest.mark.parametrize("rows", (2, 3, 4, 7))
def test_vector_chunks_rows_into_the_keys_each_may_see(rows):
    """``vector`` computes in float32 in chunks of at most 3 rows, each against its own
    prefix of the keys: it must equal float32 causal attention over all rows at once."""
    attention.install()
    mx.random.seed(rows)
    q = mx.random.normal((1, 8, rows, 64))
    k = mx.random.normal((1, 2, 30, 64))
    v = mx.random.normal((1, 2, 30, 64))
    ref = attention._fused(q, k, v, scale=0.125, mask="causal")
    got = attention.vector_attention(q, k, v, scale=0.125, mask="causal")
    assert np.allclose(np.array(got), np.array(ref), atol=1e-5)
    with verify_attention("vector") as r:
        mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask="causal")
    assert r.routed == 1


def test_vector_keeps_the_fused_argmax_and_classic_tokens_on_the_bf16_target(demo_pairs):
    pair = demo_pairs()
    ids = pair.tokenizer.encode(DEMO_PROMPTS[1])
    for rows in (2, 3, 7):
        ref, _ = _verify_logits(pair.target, ids, rows, "fused")
        got, routing = _verify_logits(pair.target, ids, rows, "vector")
        assert routing.routed == pair.target_config["num_hidden_layers"]
        # float32 attention is not bf16's arithmetic: close, and the same choices
        assert np.array_equal(got.argmax(-1), ref.argmax(-1))
        assert np.abs(got - ref).max() < 0.5
    reference = classic(pair, ids, 40).tokens
    for width in (2, 4, 8):
        run = speculative(pair, ids, 40, width, attention="vector")
        assert run.tokens == reference and run.attention["mode"] == "vector"


def test_plain_builds_the_causal_mask_once_per_verify_shape():
    attention.install()
    q = mx.random.normal((1, 4, 3, 32))
    k = mx.random.normal((1, 2, 30, 32))
    with verify_attention("plain") as r:
        mx.fast.scaled_dot_product_attention(q, k, k, scale=0.2, mask="causal")
        first = r._mask
        mx.fast.scaled_dot_product_attention(q, k, k, scale=0.2, mask="causal")  # next layer
        assert r._mask is first
        k2 = mx.random.normal((1, 2, 33, 32))
        mx.fast.scaled_dot_product_attention(q, k2, k2, scale=0.2, mask="causal")  # next round
        assert r._mask is not first and r._mask.shape == (3, 33)


def test_costcurve_reports_cold_and_warm(demo_pairs):
    pair = demo_pairs("lookup")
    curve = costcurve.measure(pair.target, (1, 2, 4), context=16, repeats=2, attention="plain")
    assert curve.attention == "plain"
    for p in curve.points:
        assert p.warm_ms is not None and p.warm_ms > 0
        assert p.first_ms is not None and p.first_ms > 0
        assert p.cold_over_warm is not None
    assert curve.to_dict()["points"][1]["warm_ms"] == curve.points[1].warm_ms


def test_divergence_margin_reads_both_paths_at_one_position(pair, ids):
    from blockwidth.engine.identity import NEAR_TIE, NOT_REPRODUCED, REAL, classify_margin, divergence_margin

    ref = classic(pair, ids, 24).tokens
    # Pretend the width chose classic's own token at 9: on a CPU both paths agree bitwise,
    # so the replay reproduces classic's choice in both and the gaps are zero.
    m = divergence_margin(pair, ids, 4, ref, ref, 9, max_abs_diff=0.0)
    assert (m.classic_gap, m.width_gap) == (0.0, 0.0) and m.kind == NEAR_TIE
    # A width token the replay does not choose is reported as such, not classified.
    other = list(ref)
    other[9] = (ref[9] + 1) % 2048
    assert divergence_margin(pair, ids, 4, ref, other, 9, max_abs_diff=0.0).kind == NOT_REPRODUCED
    assert classify_margin(3, 1, 2, 0.05, 0.02, max_abs_diff=0.02).kind == NEAR_TIE
    assert classify_margin(3, 1, 2, 0.5, 0.4, max_abs_diff=0.02).kind == REAL
    assert classify_margin(3, 1, 2, 0.0, 0.01, max_abs_diff=0.0).kind == REAL  # bitwise probe
    assert "still not byte-identical" in classify_margin(3, 1, 2, 0.01, 0.01, 0.02).describe()


def test_a_cache_that_cannot_rewind_is_refused_not_silently_kept():
    from mlx_lm.models.cache import KVCache, RotatingKVCache

    from blockwidth.engine.kvcache import RewindError, rewind

    rot = RotatingKVCache(max_size=4)
    k = mx.zeros((1, 1, 6, 8))
    rot.update_and_fetch(k, k)  # past its window: it can no longer trim
    plain = KVCache()
    plain.update_and_fetch(k, k)
    with pytest.raises(RewindError, match="RotatingKVCache cannot drop 2 rejected rows: a sliding "
                                          "window of 4 past its size"):
        rewind([plain, rot], 2)
    assert plain.offset == 6  # nothing dropped anywhere when one layer cannot
    rewind([plain], 2)
    assert plain.offset == 4


def test_plain_takes_a_mask_whose_rows_broadcast():
    attention.install()
    q = mx.random.normal((1, 8, 4, 32))
    k = mx.random.normal((1, 2, 24, 32))
    m = mx.random.normal((1, 8, 1, 24))
    ref = attention._fused(q, k, k, scale=0.2, mask=m)
    got = plain_attention(q, k, k, scale=0.2, mask=m)
    assert np.allclose(np.array(ref), np.array(got), atol=1e-5)


def test_rows_falls_back_to_plain_off_cuda_with_the_same_tokens(pair, ids):
    """``rows`` is CUDA source: on this CPU every verify call it routes goes to ``plain``, and
    the record says so (plain_fallback_calls), with classic's tokens at every width."""
    reference = classic(pair, ids, 40).tokens
    for width in (2, 5):
        run = speculative(pair, ids, 40, width, attention="rows")
        assert run.tokens == reference, f"width {width} with rows attention"
        assert run.attention["mode"] == "rows"
        assert run.attention["routed_calls"] > 0
        assert run.attention["plain_fallback_calls"] == run.attention["routed_calls"]
    # the other modes' records keep their keys
    assert "plain_fallback_calls" not in speculative(pair, ids, 8, 2, attention="plain").attention


def test_rows_fits_only_what_its_kernel_assumes():
    bf = (mx.bfloat16,) * 3
    q, kv = (1, 32, 4, 128), (1, 8, 300, 128)
    assert attention.rows_fits(q, kv, kv, bf, "causal", None, 128 ** -0.5)
    assert attention.rows_fits(q, kv, kv, bf, None, None, 0.1)  # unmasked: every key
    assert attention.rows_fits(q, kv, kv, (mx.float32,) * 3, "causal", None, 0.1)
    bad = {
        "array mask": (q, kv, kv, bf, mx.zeros((4, 300)), None, 0.1),
        "sinks": (q, kv, kv, bf, "causal", mx.zeros((32,)), 0.1),
        "mixed dtypes": (q, kv, kv, (mx.bfloat16, mx.float16, mx.bfloat16), "causal", None, 0.1),
        "int dtype": (q, kv, kv, (mx.int32,) * 3, "causal", None, 0.1),
        "head 80": ((1, 32, 4, 80), (1, 8, 300, 80), (1, 8, 300, 80), bf, "causal", None, 0.1),
        "head 512": ((1, 32, 4, 512), (1, 8, 300, 512), (1, 8, 300, 512), bf, "causal", None, 0.1),
        "heads not a multiple": ((1, 30, 4, 128), kv, kv, bf, "causal", None, 0.1),
        "more rows than keys": ((1, 32, 9, 128), (1, 8, 8, 128), (1, 8, 8, 128), bf, "causal",
                                None, 0.1),
        "v unlike k": (q, kv, (1, 8, 300, 64), bf, "causal", None, 0.1),
        "other mask name": (q, kv, kv, bf, "sliding", None, 0.1),
        "zero scale": (q, kv, kv, bf, "causal", None, 0.0),
        "3-D": ((32, 4, 128), kv, kv, bf, "causal", None, 0.1),
    }
    for why, a in bad.items():
        assert not attention.rows_fits(*a), why


def _rows_emulated(q, k, v, scale, causal):
    """The rows kernel's algorithm in numpy, step for step, with the two lines that decide which
    keys a row sees and which KV head a query head reads taken from the CUDA source itself:
    32 warps take keys warp, warp + 32, ... below ``limit``, each keeps an online softmax in the
    log2 domain (max from -inf, sum, output), and the block merges the 32 through their maxima,
    a warp that saw no key adding nothing."""
    import re

    src = attention._ROWS_SOURCE
    limit_expr = re.search(r"const int limit = CAUSAL \? (.+?) : S;", src)[1]
    head_expr = re.search(r"const T\* kp = k \+ b \* k_strides\[0\] \+ \((.+?)\) \* k_strides\[1\];", src)[1]
    assert re.search(r"const T\* vp = v \+ b \* v_strides\[0\] \+ \(" + re.escape(head_expr) + r"\)", src)
    B, n_q, L, D = q.shape
    S, gqa = k.shape[2], n_q // k.shape[1]
    out = np.zeros(q.shape, np.float32)
    for b in range(B):
        for h in range(n_q):
            kv = eval(head_expr.replace("/", "//"), {}, {"h": h, "GQA": gqa})
            for row in range(L):
                limit = eval(limit_expr, {}, {"S": S, "L": L, "row": row}) if causal else S
                qf = q[b, h, row].astype(np.float32) * np.float32(scale * 1.4426950408889634)
                ms, ls, os_ = [], [], []
                for warp in range(32):
                    m, l, o = -np.inf, 0.0, np.zeros(D, np.float32)
                    for j in range(warp, limit, 32):
                        s = float(qf @ k[b, kv, j])
                        nm = max(m, s)
                        f, p = 2.0 ** (m - nm), 2.0 ** (s - nm)
                        l, o, m = l * f + p, o * f + p * v[b, kv, j], nm
                    ms.append(m), ls.append(l), os_.append(o)
                big = max(ms)
                mine = [0.0 if m == -np.inf else 2.0 ** (m - big) for m in ms]
                total = sum(l * w for l, w in zip(ls, mine))
                out[b, h, row] = sum(o * w for o, w in zip(os_, mine)) / total
    return out


def test_the_rows_kernels_algorithm_matches_attention_with_bottom_right_causal_rows():
    """The kernel cannot run on this CPU; its algorithm can (``_rows_emulated``, which reads
    the causal limit and the KV head from the source). Against plain softmax attention with
    row i of L seeing keys 0..S-L+i: fewer keys than warps (warps with nothing, -inf), a key
    count that is not a multiple of 32, grouped heads, a batch of 2, unmasked too."""
    rng = np.random.default_rng(3)
    for B, n_q, n_kv, L, S, D in ((1, 4, 4, 3, 5, 32), (2, 8, 2, 4, 70, 64), (1, 2, 1, 8, 8, 32)):
        q = rng.standard_normal((B, n_q, L, D)).astype(np.float32)
        k = rng.standard_normal((B, n_kv, S, D)).astype(np.float32)
        v = rng.standard_normal((B, n_kv, S, D)).astype(np.float32)
        scale = D ** -0.5
        for causal in (True, False):
            kk, vv = np.repeat(k, n_q // n_kv, axis=1), np.repeat(v, n_q // n_kv, axis=1)
            scores = np.einsum("bhld,bhsd->bhls", q, kk) * scale
            if causal:
                seen = np.arange(S)[None, :] <= (S - L + np.arange(L))[:, None]
                scores = np.where(seen, scores, -np.inf)
            w = np.exp(scores - scores.max(-1, keepdims=True))
            ref = np.einsum("bhls,bhsd->bhld", w / w.sum(-1, keepdims=True), vv)
            got = _rows_emulated(q, k, v, scale, causal)
            assert np.allclose(got, ref, atol=1e-4), (B, n_q, n_kv, L, S, D, causal)
