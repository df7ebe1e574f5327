"""The exact path (engine.exact): what it routes, what it refuses, what a session records.

The kernels themselves run on CUDA only and are checked on the H200 (lab/probe_exact.py, its
records under lab/evidence). Here, on the CPU, the routing is driven as it is on CUDA: the backend
reads "cuda" and each kernel is replaced by a reference that computes every row alone (what the
real kernels do, bitwise, by the H200 probe). So these tests check the plumbing the GPU run rests
on: every projection, tied head and attention call of 1..16 rows reaches a kernel, 9..16 rows go in
two calls, a sliding window reaches the attention kernel as a window (not an array mask), classic
and every width take the same path, and what no kernel covers is named."""

from __future__ import annotations

import json

import mlx.core as mx
import mlx.nn as nn
import pytest

from blockwidth.engine import attention, exact, linear, qmv
from blockwidth.engine.decode import classic, speculative
from blockwidth.engine.identity import probe
from tests import families

calls: dict[str, list] = {}


def _rowwise_qmv(x_shape, n, dt, bits, group, strategy="direct"):
    def fn(x, w, s, b):
        rows = x.size // x.shape[-1]
        calls.setdefault("qmv", []).append(rows)
        assert rows <= qmv.MAX_ROWS, rows  # one kernel call holds at most 8 rows
        flat = x.reshape(rows, x.shape[-1])
        out = [mx.quantized_matmul(flat[r:r + 1], w, s, b, transpose=True, group_size=group, bits=bits)
               for r in range(rows)]
        return mx.concatenate(out, axis=0).reshape(*x.shape[:-1], n)
    return fn


def _rowwise_gemv(x, weight, bias=None):
    rows = x.size // x.shape[-1]
    calls.setdefault("gemv", []).append(rows)
    assert rows <= linear.GEMV_MAX_ROWS, rows
    flat = x.reshape(rows, x.shape[-1])
    out = mx.concatenate([flat[r:r + 1] @ weight.T for r in range(rows)], axis=0)
    out = out.reshape(*x.shape[:-1], weight.shape[0])
    return out + bias if bias is not None else out


def _rowwise_rows(q, k, v, *, scale, causal=True, window=0):
    """Each query row alone against the keys it may see (its window's, when there is one)."""
    calls.setdefault("rows", []).append((q.shape[2], window))
    L, S = q.shape[2], k.shape[2]
    outs = []
    for r in range(L):
        limit = S - L + r + 1 if causal else S
        lo = max(0, limit - window) if window else 0
        outs.append(attention._fused(q[:, :, r:r + 1], k[:, :, lo:limit], v[:, :, lo:limit],
                                     scale=scale, mask=None))
    return mx.concatenate(outs, axis=2)


@pytest.fixture
def cuda(monkeypatch):
    """The routing as it runs on CUDA, with row-by-row references for the kernels: the
    ``kernels`` route (every projection on the engine's kernels)."""
    monkeypatch.setenv(linear.EXACT_ROUTE_ENV, "kernels")
    calls.clear()
    for mod in (attention, linear, exact):
        monkeypatch.setattr(mod, "current_backend", lambda: "cuda", raising=False)
    monkeypatch.setattr("blockwidth.engine.attention.current_backend", lambda: "cuda")
    monkeypatch.setattr(qmv, "bound", _rowwise_qmv)
    monkeypatch.setattr(linear, "gemv_linear", _rowwise_gemv)
    monkeypatch.setattr(attention, "rows_attention", _rowwise_rows)
    monkeypatch.setattr(exact, "prepare", lambda *a, **k: {})
    attention.install()
    return calls


@pytest.fixture
def cuda_mlx(cuda, monkeypatch):
    """The ``mlx`` route as it runs on CUDA: MLX's own projections (which run here as they are),
    each stock quantized call counted by its rows; gather_mv (16-bit on CUDA only) replaced by
    what it computes, every row a 1-row matmul; attention on the rows reference."""
    monkeypatch.setenv(linear.EXACT_ROUTE_ENV, "mlx")
    qmm = linear.mlx_qmm

    def counted_qmm(x, *a):
        calls.setdefault("mlx_qmm", []).append(x.size // x.shape[-1])
        return qmm(x, *a)

    def counted_gather(x, weight, bias=None):
        rows = x.size // x.shape[-1]
        calls.setdefault("gather", []).append(rows)
        flat = x.reshape(rows, x.shape[-1])
        out = mx.concatenate([flat[r:r + 1] @ weight.T for r in range(rows)], axis=0)
        out = out.reshape(*x.shape[:-1], weight.shape[0])
        return out + bias if bias is not None else out

    monkeypatch.setattr(linear, "mlx_qmm", counted_qmm)
    monkeypatch.setattr(linear, "gather_linear", counted_gather)
    return calls


class _Pair:
    def __init__(self, model):
        self.target = model
        self.context_length = None


def _llama(quantize: int | None = None, tied: bool = True, dtype: str = "bfloat16"):
    cfg = dict(families.NAMED["llama"], head_dim=32, num_attention_heads=2, num_key_value_heads=1,
               tie_word_embeddings=tied)
    model = families.build(cfg, seed=3, dtype=dtype)
    if quantize:
        nn.quantize(model, group_size=32, bits=quantize)
        mx.eval(model.parameters())
    return model


PROMPT = [5, 9, 17, 33, 2, 40, 41, 7, 19, 23, 29, 31]


@pytest.mark.parametrize("quantize", [None, 4, 8])
def test_classic_and_every_width_take_the_path_and_agree(cuda, quantize):
    """A 16-bit and an affine 4/8-bit target with a tied head: classic's 1-row steps and every
    verify route every projection (the tied head's as_linear too) and every attention call,
    widths past 8 in chunks of at most 8 rows, nothing left inexact; output identical."""
    model = _llama(quantize)
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.exact and plan.uncovered == ()
    pair = _Pair(model)
    base = classic(pair, PROMPT, 12, exact=plan)
    routed = base.attention["exact"]
    assert routed["exact"] and routed["inexact_calls"] == {}
    assert routed["linear"]["routed_calls"] > 0 and routed["attention"]["routed_calls"] > 0
    kernel = "gemv" if quantize is None else "qmv"
    assert 1 in calls[kernel]  # classic's steps: one row a call
    head = [k for k in routed["linear"]["served"] if k.startswith(f"{families.VOCAB}x")]
    assert head, routed["linear"]["served"]  # the tied head (as_linear) reached the kernel

    for width in (2, 5, 12):
        calls.clear()
        run = speculative(pair, PROMPT, 12, width, drafter=_Echo(base.tokens), exact=plan)
        assert run.tokens == base.tokens
        assert run.attention["mode"] == "exact" and run.attention["exact"]["exact"]
        if width > linear.CHUNK_ROWS:
            assert max(calls[kernel]) == linear.CHUNK_ROWS  # 12 rows: two calls, 8 and 4
            assert width - linear.CHUNK_ROWS in calls[kernel]
        assert (width, 0) in calls["rows"]  # the verify's attention: one kernel call, every row


@pytest.mark.parametrize("quantize", [None, 4, 8])
def test_the_mlx_route_keeps_classic_on_mlx_and_computes_each_verify_row_as_its_step(cuda_mlx, quantize):
    """On the ``mlx`` route classic's 1-row steps call none of the engine's projection kernels
    (attention alone takes the rows kernel); a verify of 8+ quantized rows goes to MLX's own
    quantized matmul in calls of at most 7 rows, 16-bit rows through gather_mv, the tied head
    too; the output is classic's, nothing left inexact, and the record names the route."""
    model = _llama(quantize)
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.exact and plan.route == "mlx" and plan.to_dict()["route"] == "mlx"
    assert "1-row step" in plan.reason
    pair = _Pair(model)
    base = classic(pair, PROMPT, 16, exact=plan)
    got = base.attention["exact"]
    assert got["exact"] and got["linear"]["route"] == "mlx" and "call" not in got["linear"]
    assert "qmv" not in calls and "gemv" not in calls
    # the 1-row steps: MLX's own calls as they come (only the 11-row prefill, on the path too,
    # gathers or splits: 6 and 5)
    assert set(calls.get("gather", [])) <= {11} and set(calls.get("mlx_qmm", [])) <= {5, 6}
    assert (1, 0) in calls["rows"]
    _widths_on_mlx_projections(pair, base, plan, quantize)


def _widths_on_mlx_projections(pair, base, plan, quantize, attention_check=None):
    """Widths 3 and 12 on a route of MLX's projections: classic's text, nothing inexact, none of
    the engine's projection kernels, 16-bit rows through gather_mv, 8+ quantized rows split into
    MLX calls of at most 7 (12: 6 and 6); ``attention_check(width)`` asks the route's own."""
    for width in (3, 12):
        calls.clear()
        run = speculative(pair, PROMPT, 16, width, drafter=_Echo(base.tokens), exact=plan)
        assert run.tokens == base.tokens
        assert run.attention["exact"]["exact"], run.attention["exact"]
        assert "qmv" not in calls and "gemv" not in calls
        if attention_check is not None:
            attention_check(width)
        if quantize is None:
            assert width in calls["gather"]
        elif width > linear.MLX_QUANT_ROWS:
            assert calls["mlx_qmm"] and max(calls["mlx_qmm"]) <= linear.MLX_QUANT_ROWS
            assert width // 2 in calls["mlx_qmm"]  # 12 rows: 6 and 6
        else:  # 3 rows: one stock call; only the prefill's 11 rows split
            assert set(calls["mlx_qmm"]) <= {5, 6}


@pytest.mark.parametrize("quantize", [None, 4])
def test_the_hybrid_route_keeps_mlx_s_projections_and_gives_attention_to_the_rows_kernel(cuda_mlx, monkeypatch,
                                                                                          quantize):
    """``hybrid``: the projections as on the mlx route (MLX's own 1-row calls in classic, 1..7-row
    quantized calls and gather_mv in a verify), attention on the rows kernel in classic's steps
    and in each verify as one call of all its rows (the mlx route makes one call a row); the
    output is classic's, nothing inexact, and the records name the route."""
    monkeypatch.setenv(linear.EXACT_ROUTE_ENV, "hybrid")
    model = _llama(quantize)
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.exact and plan.route == "hybrid" and "rows kernel at every length" in plan.reason
    pair = _Pair(model)
    base = classic(pair, PROMPT, 16, exact=plan)
    got = base.attention["exact"]
    assert got["exact"] and got["linear"]["route"] == "hybrid" and got["attention"]["route"] == "hybrid"
    assert "qmv" not in calls and "gemv" not in calls
    steps = len(base.tokens)  # an 11-row prefill, then 1-row steps from the prompt's last token
    layers = len(model.layers)
    assert calls["rows"].count((1, 0)) == steps * layers  # every classic step: the rows kernel

    def one_call_a_layer(width):  # the mlx route: one MLX call a row, no rows call
        assert (width, 0) in calls["rows"] and all(n <= width or n == len(PROMPT) - 1 for n, _ in calls["rows"])

    _widths_on_mlx_projections(pair, base, plan, quantize, one_call_a_layer)


def test_the_mlx_route_attention_is_mlx_s_own_at_every_length_on_the_engine_s_caches(cuda_mlx, monkeypatch):
    """On the mlx route every row is MLX's own 1-row attention (classic's step is the stock call
    itself; a verify row, that call on its own keys) at any number of keys, since the engine's
    caches keep their buffers off multiples of 256 (cuDNN never decodes them). On keys from any
    other cache (mlx-lm's own, as the served path has), a row that sees STOCK_KEYS keys or more
    takes the rows kernel, in classic and in a verify alike, so a verify straddling the threshold
    still gives classic's text. (STOCK_KEYS lowered to 20 so a short run crosses.)"""
    monkeypatch.setattr(attention, "STOCK_KEYS", 20)
    cfg = dict(families.NAMED["llama"], head_dim=64, num_attention_heads=2, num_key_value_heads=1,
               tie_word_embeddings=True)
    model = families.build(cfg, seed=3, dtype="bfloat16")
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.route == "mlx"
    pair = _Pair(model)
    stock_calls = []
    fused = attention._fused

    def counted(q, *a, **kw):
        stock_calls.append(q.shape[2])
        return fused(q, *a, **kw)

    monkeypatch.setattr(attention, "_fused", counted)
    base = classic(pair, PROMPT, 16, exact=plan)  # keys 12..27: MLX's at every length
    att = base.attention["exact"]["attention"]
    assert att["route"] == "mlx" and att["stock_rows"] > 0 and att["inexact_calls"] == {}
    assert 1 in stock_calls and "rows" not in calls
    for width in (4, 6):
        calls.clear()
        stock_calls.clear()
        run = speculative(pair, PROMPT, 16, width, drafter=_Echo(base.tokens), exact=plan)
        assert run.tokens == base.tokens
        assert run.attention["exact"]["exact"]
        assert stock_calls and all(n == 1 or n > exact.MAX_ROWS for n in stock_calls)  # 1-row calls (and no prefill past 16)
        assert "rows" not in calls

    # keys from mlx-lm's own cache (no off-step buffer): from 20 keys the rows kernel
    from mlx_lm.models.cache import make_prompt_cache

    def forwards(chunks):
        cache = make_prompt_cache(model)
        outs = []
        with exact.path(plan):
            for c in chunks:
                outs.append(model(mx.array(c, mx.uint32)[None], cache=cache)[0])
        mx.eval(outs)
        return mx.concatenate(outs, axis=0)

    seq = PROMPT + base.tokens
    calls.clear()
    steps = forwards([seq[:10]] + [[t] for t in seq[10:26]])  # 1-row steps from 10 to 26 keys
    assert (1, 0) in calls["rows"]
    calls.clear()
    verify = forwards([seq[:10], seq[10:18], seq[18:26]])  # 8-row verifies straddling 20 keys
    assert calls["rows"] and mx.array_equal(steps, verify).item()


def test_the_route_is_chosen_by_name_and_refuses_others(monkeypatch):
    monkeypatch.delenv(linear.EXACT_ROUTE_ENV, raising=False)
    assert linear.exact_route() == linear.DEFAULT_EXACT_ROUTE == "auto"
    assert linear.concrete_route() == "mlx"  # auto unresolved (the served path): MLX's own classic
    monkeypatch.setenv(linear.EXACT_ROUTE_ENV, "kernels")
    assert linear.exact_route() == "kernels"
    assert exact.plan(_llama(4), "auto", backend="cuda").route == "kernels"
    assert exact.plan(_llama(4), "auto", backend="cuda", route="mlx").route == "mlx"
    monkeypatch.setenv(linear.EXACT_ROUTE_ENV, "fast")
    with pytest.raises(ValueError, match="auto, mlx, hybrid, kernels"):
        linear.exact_route()
    assert linear.balanced(8, 7) == [(0, 4), (4, 8)]
    assert linear.balanced(16, 7) == [(0, 6), (6, 11), (11, 16)]
    assert linear.balanced(5, 7) == [(0, 5)]
    assert linear.mlx_quant_refusal("affine", 4, 32) is None
    assert "not probed" in linear.mlx_quant_refusal("mxfp4", 4, 32)
    assert "not probed" in linear.mlx_quant_refusal("affine", 3, 64)


class _Echo:
    """A drafter that proposes classic's own next tokens (every draft accepted), so every
    verify holds ``width`` rows."""

    kind = None

    def __init__(self, tokens):
        self.tokens = tokens
        self.pos = 0

    def prefill(self, ids):
        pass

    def propose(self, n):
        got = self.tokens[self.pos:self.pos + n]
        return mx.array(got, mx.uint32)

    def commit(self, drafted, n, nxt):
        self.pos += n + 1


def test_a_sliding_window_reaches_the_kernel_as_a_window_past_it(cuda):
    """Gemma 3 past its window: the verify's window goes to the rows kernel as a WindowMask
    (never an array mask, which would leave the path), and classic's steps read the window the
    cache slices; the output is classic's."""
    cfg = dict(families.NAMED["gemma3_text"], head_dim=32, num_attention_heads=2, num_key_value_heads=1)
    window = cfg["sliding_window"]
    model = families.build(cfg, seed=4)
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active, plan.reason
    pair = _Pair(model)
    prompt = [(7 * i + 3) % (families.VOCAB - 1) + 1 for i in range(window + 9)]
    base = classic(pair, prompt, 10, exact=plan)
    assert base.attention["exact"]["exact"], base.attention
    calls.clear()
    run = speculative(pair, prompt, 10, 4, drafter=_Echo(base.tokens), exact=plan)
    assert run.tokens == base.tokens
    assert any(w == window and n > 1 for n, w in calls["rows"]), calls["rows"]
    assert run.attention["exact"]["inexact_calls"] == {}


def test_the_probe_is_bitwise_on_the_path(cuda):
    model = _llama(4)
    plan = exact.plan(model, "on", backend="cuda")
    for k in (2, 9, 16):
        ex = probe(model, PROMPT, [3 + i for i in range(k)], exact=plan)
        assert ex.bitwise_equal and ex.max_abs_diff == 0.0


def test_what_is_not_covered_is_named_and_auto_stays_off():
    """float32 weights, a head size the rows kernel does not take, a family no probe checked,
    recurrent state: each named; auto keeps the stock path and says why; on runs it marked not
    exact; a CPU needs nothing routed."""
    f32 = _llama(dtype="float32")
    p = exact.plan(f32, "auto", backend="cuda")
    assert not p.active and not p.exact and "float32 projections" in p.reason
    on = exact.plan(f32, "on", backend="cuda")
    assert on.active and not on.exact and on.uncovered == p.uncovered
    odd = families.build(dict(families.NAMED["llama"], head_dim=16), seed=1)
    assert any("head size 16" in u for u in exact.uncovered_ops(odd))
    hybrid = families.build(families.tiny_config("qwen3_next"), seed=1)
    from blockwidth.engine.kvcache import make_cache

    missing = exact.uncovered_ops(hybrid, make_cache(hybrid, slack=1))
    assert any("recurrent state" in u for u in missing) and any("not probed" in u for u in missing)
    assert any("mixture-of-experts" in u for u in missing), missing
    cpu = exact.plan(f32, "auto", backend="cpu")
    assert not cpu.active and cpu.exact and "CPU" in cpu.reason
    assert not exact.plan(_llama(), "off", backend="cuda").active
    assert exact.plan(_llama(), "on", backend="cuda").width_note(24).startswith("width 24: not exact")
    with pytest.raises(exact.ExactError, match="auto, on, off"):
        exact.parse("sometimes")


def test_an_uncovered_call_on_the_path_is_counted_not_hidden(cuda):
    """`on` over a float32 target: the path runs, and every projection it could not route is
    counted by reason in the run's summary, so the session can say it was not exact."""
    model = _llama(dtype="float32")
    plan = exact.plan(model, "on", backend="cuda")
    run = classic(_Pair(model), PROMPT, 4, exact=plan)
    got = run.attention["exact"]
    assert not got["exact"] and any("16-bit projection" in k for k in got["inexact_calls"])


def test_a_window_mask_never_reaches_a_stock_kernel_as_plain_causal():
    """Off the kernel (a CPU, or a shape it does not take) a WindowMask becomes the array mask it
    stands for: stock attention must not read it as full causal attention."""
    mx.random.seed(0)
    q = mx.random.normal((1, 2, 3, 32))
    k = mx.random.normal((1, 1, 10, 32))
    v = mx.random.normal((1, 1, 10, 32))
    attention.install()
    with attention.verify_attention("fused", exact=True):
        got = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=attention.WindowMask(4))
    want = attention._fused(q, k, v, scale=0.2, mask=attention.window_array(3, 10, 4))
    assert mx.array_equal(got, want).item()
    full = attention._fused(q, k, v, scale=0.2, mask="causal")
    assert not mx.array_equal(got, full).item()


def test_a_session_on_the_path_records_both_classics_and_its_control(cuda, tmp_path):
    """With the path on, stock classic runs beside exact classic in every pass, the record keeps
    both and the plan, and the speed-ups' control is the faster of the two, which the record's
    samples reproduce."""
    from blockwidth.engine.session import record as records
    from blockwidth.engine.ab import AbConfig, STOCK_CLASSIC, run_session
    from blockwidth.engine.pair import load_pair
    from tests.conftest import ROOT

    demo = ROOT / "engine" / "demo" / "pair"
    pair = load_pair(demo / "target-bf16", demo / "drafter")
    s = run_session(pair, AbConfig(widths=(2,), prompt="def add(a, b):", n=2, max_tokens=6,
                                   exactness=True, predict=False, seed=7))
    assert s.exact.active and s.stock is not None and len(s.stock.runs) == 2
    assert STOCK_CLASSIC in s.order and s.order.count("classic") == 3  # opening two and closing
    assert s.arm(2).identity.identical_ids
    assert s.exactness[2].bitwise_equal
    rec = records.build(s, pair, host={})
    json.dumps(rec)
    assert rec["exact"]["active"] and rec["classic_stock"]["arm"] == STOCK_CLASSIC
    assert rec["baseline"] in ("classic", STOCK_CLASSIC)
    control = s.stock if rec["baseline"] == STOCK_CLASSIC else s.classic
    faster = max((s.classic, s.stock), key=lambda a: a.decode_range().median)
    assert control is faster
    assert records.reproduce(rec)[2].ratio == pytest.approx(s.estimates[2].ratio)



def test_the_served_path_takes_the_exact_path_in_process(tmp_path):
    """A served spec on the exact path runs mlx_lm.server in-process through the dispatcher with
    --exact on (every server of a served session alike), and says so as `blockwidth serve
    --exact`; the stock server stays the default."""
    from blockwidth.engine.session.served import DISPATCH_COMMAND, ServerSpec

    on = ServerSpec("draft", tmp_path / "t", tmp_path / "d", exact=True)
    argv = on.argv(8123)
    assert argv[1:3] == list(DISPATCH_COMMAND) and argv[3:7] == ["--verify-attention", "auto", "--exact", "on"]
    # printed as it runs (what serve prints is what it starts), the interpreter aside
    assert on.command_line()[:7] == ["python", *DISPATCH_COMMAND, "--verify-attention", "auto", "--exact", "on"]
    # prompt chunks of at most the path's rows, so a prefix the prompt cache reuses is the same
    # bits whichever request computed it; the operator's own step is kept
    assert argv[argv.index("--prefill-step-size") + 1] == "16"
    mine = ServerSpec("draft", tmp_path / "t", tmp_path / "d", args=("--prefill-step-size", "64"), exact=True)
    assert mine.argv(8123).count("--prefill-step-size") == 1 and "64" in mine.argv(8123)
    stock = ServerSpec("classic", tmp_path / "t")
    assert DISPATCH_COMMAND[1] not in stock.argv(8123) and stock.command_line()[0] == "mlx_lm.server"
    assert "--prefill-step-size" not in stock.argv(8123)


def test_on_the_exact_path_the_served_classic_decodes_one_request_at_a_time():
    """mlx_lm.server's batched decode masks by array, which the rows kernel does not take (its
    1-row steps would reach fused SDPA): on the exact path the classic server serves through
    generate_step, one request at a time, as the draft server does; off the path it batches."""
    from types import SimpleNamespace

    from blockwidth.engine.mlxserver import _generator_class

    args = SimpleNamespace(seed=None)
    for exact, batches in ((True, False), (False, True)):
        cls = _generator_class("auto", exact)
        gen = object.__new__(cls)  # no generation thread: only the batching decision is asked
        gen.model_provider = SimpleNamespace(is_batchable=True, cli_args=SimpleNamespace(kv_bits=None))
        assert gen._is_batchable(args) is batches


def test_auto_times_every_route_and_keeps_the_cheapest(cuda):
    """``auto`` on CUDA: each route's 1-row step plus its 4-row verify, the smallest sum taken,
    every figure in the plan's record and reason; a route named is left alone; off CUDA auto is
    mlx. Then the real measurement (engine.costcurve on the path, each route) runs end to end."""
    model = _llama(4)
    plan = exact.plan(model, "auto", backend="cuda", route="auto")
    assert plan.active and plan.route == "auto"
    fake = {"mlx": (3.7, 5.0), "hybrid": (3.9, 5.2), "kernels": (4.8, 5.1)}
    got = exact.choose_route(model, plan, measure=lambda m, p: fake[p.route])
    assert got.route == "mlx" and got.active and got.exact
    assert got.to_dict()["route_costs"] == {"mlx": {"1": 3.7, "4": 5.0}, "hybrid": {"1": 3.9, "4": 5.2},
                                            "kernels": {"1": 4.8, "4": 5.1}}
    assert "route mlx" in got.reason
    # a host-bound target whose verify pays an attention call a row on mlx (SmolLM2 on the H200:
    # a 2-row verify 1.43 steps): hybrid's one call a layer
    fake["hybrid"] = (3.8, 4.1)
    assert exact.choose_route(model, plan, measure=lambda m, p: fake[p.route]).route == "hybrid"
    fake["kernels"] = (2.6, 2.8)  # a weight-bound target: the engine's kernels read weights once
    assert exact.choose_route(model, plan, measure=lambda m, p: fake[p.route]).route == "kernels"
    named = exact.plan(model, "auto", backend="cuda", route="kernels")
    assert exact.choose_route(model, named, measure=None) is named
    cpu = exact.plan(model, "auto", backend="cpu", route="auto")
    assert exact.choose_route(model, cpu).route == "mlx"
    real = exact.choose_route(model, plan)
    assert real.route in exact.ROUTE_ORDER and {r for r, _, _ in real.route_costs} == set(exact.ROUTE_ORDER)
    assert all(a > 0 and b > 0 for _, a, b in real.route_costs)


def test_a_biased_16_bit_projection_takes_gemv_then_its_bias_on_the_mlx_route(cuda_mlx, monkeypatch):
    """MLX's biased 1-row x @ W.T + b is addmm (cuBLASLt, the bias inside the kernel) while a verify
    row is gather_mv's rounded product plus the bias: on the mlx route a biased 1-row step is
    computed as the verify rows are (x @ W.T, then + b), never by the stock biased call; the text
    is classic's and a CPU never routes at all."""
    cfg = dict(families.NAMED["llama"], head_dim=32, num_attention_heads=2, num_key_value_heads=1,
               attention_bias=True, tie_word_embeddings=True)
    model = families.build(cfg, seed=5, dtype="bfloat16")
    assert any("bias" in m for _, m in model.named_modules() if type(m) is nn.Linear)
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.route == "mlx"
    stock_biased_steps = []
    stock = linear._stock_call

    def counted(self, x):
        if "bias" in self and x.size == x.shape[-1]:
            stock_biased_steps.append(x.shape)
        return stock(self, x)

    monkeypatch.setattr(linear, "_stock_call", counted)
    pair = _Pair(model)
    base = classic(pair, PROMPT, 8, exact=plan)
    assert not stock_biased_steps and base.attention["exact"]["exact"]
    run = speculative(pair, PROMPT, 8, 4, drafter=_Echo(base.tokens), exact=plan)
    assert run.tokens == base.tokens and not stock_biased_steps
    with linear.exact_linear("cpu", route="mlx") as routing:  # a CPU: stock, counted as passed
        lin = nn.Linear(32, 16)
        lin.set_dtype(mx.bfloat16)
        lin(mx.zeros((1, 3, 32), mx.bfloat16))
    assert routing.inexact == {} and routing.passed == 1


def test_a_session_under_auto_records_the_route_it_timed(cuda_mlx, monkeypatch):
    """A session with no route named (auto) times both routes on its target before it runs and
    records the route it kept with both figures; the session runs on that route."""
    from blockwidth.engine.ab import AbConfig, run_session
    from blockwidth.engine.pair import load_pair
    from blockwidth.engine.session import record as records
    from tests.conftest import ROOT

    monkeypatch.delenv(linear.EXACT_ROUTE_ENV, raising=False)
    monkeypatch.setattr(exact, "_chosen", {})
    demo = ROOT / "engine" / "demo" / "pair"
    pair = load_pair(demo / "target-bf16", demo / "drafter")
    s = run_session(pair, AbConfig(widths=(2,), prompt="def add(a, b):", n=1, max_tokens=4,
                                   exactness=True, predict=False, seed=7))
    assert s.exact.active and s.exact.route in exact.ROUTE_ORDER
    assert {r for r, _, _ in s.exact.route_costs} == set(exact.ROUTE_ORDER)
    rec = records.build(s, pair, host={})
    assert rec["exact"]["route"] == s.exact.route and set(rec["exact"]["route_costs"]) == set(exact.ROUTE_ORDER)
    assert f"route {s.exact.route}" in rec["exact"]["reason"]
    assert s.arm(2).identity.identical_ids


GPU_RECORDS = "lab/evidence/h100-2026-12-05/exact"


def test_the_committed_gpu_records_say_every_row_count_and_every_text_matched():
    """The GPU's figures live in committed records; this reads them as the docs quote them. Real
    SmolLM2 (native 4-bit g32 and bf16): a K-row verify bitwise equal to K single steps at every
    K = 2..16 on both routes; the edits session exact on CUDA, its probe bitwise at each width and
    every request's text byte-identical at every width; the served A/B's texts identical at 1 and
    4 clients, its decline saveable."""
    from tests.conftest import ROOT

    base = ROOT / GPU_RECORDS
    models = json.loads((base / "models.json").read_text())
    assert models["backend"] == "cuda"
    seen = set()
    for m in models["models"]:
        for k, by_route in m["exactness"].items():
            for route in ("mlx", "hybrid"):
                assert by_route[route]["bitwise_equal"], (m["target"], k, route)
            seen.add((m["target"].rsplit("/", 1)[-1], k))
    assert {(v, f"{k}{after}") for v in ("native", "bf16") for k in range(2, 17) for after in ("", " after 250")} <= seen

    s = json.loads((base / "smol-lookup-edits.json").read_text())
    assert s["exact"]["backend"] == "cuda" and s["exact"]["active"] and s["exact"]["exact"]
    assert all(p["bitwise_equal"] for p in s["exactness"].values()) and len(s["exactness"]) == 3
    for arm in s["arms"][1:]:
        assert arm["identity"]["identical_bytes"], arm["arm"]
    per_request = [(r["id"], a["arm"], a["identity"]["identical_bytes"]) for r in s["requests"] for a in r["arms"][1:]]
    assert len(per_request) == 8 * 3 and all(same for _, _, same in per_request), per_request
    assert s["decision"]["decision"] == "undecided" and s["saved"] is None  # as docs/exact.md says

    served = json.loads((base / "served.json").read_text())
    assert len(served["levels"]) == 2
    for level in served["levels"]:
        assert all(a["identity"]["identical_bytes"] for a in level["arms"][1:])
        assert level["decision"]["saveable"] and level["decision"]["best"] is None


def test_the_per_class_gpu_sessions_kept_every_text_and_measured_against_the_faster_classic():
    """The H100 sessions of 2026-12-05b (docs/exact.md): SmolLM2 native + lookup over the spelling
    fixes, the list edits and the code edits, each on the exact path. Every probe bitwise, every
    request's text byte-identical at every width; the speed-ups are against stock classic, which
    was the faster classic in all three (exact classic 0.71-0.86x of it on the route auto took);
    nothing was decided well enough to save, as the docs and the README say."""
    import gzip

    from tests.conftest import ROOT

    base = ROOT / "lab/evidence/h100-2026-12-05b"
    expected = {"spelling": (5, "kernels", ("w2", "w3")), "lists": (3, "hybrid", ()),
                "code": (8, "hybrid", ("w8",))}
    for name, (n_requests, route, slower) in expected.items():
        s = json.loads(gzip.open(base / name / "smol-lookup-edits.json.gz").read())
        assert s["host"]["device"]["name"] == "NVIDIA H100 80GB HBM3", name
        assert s["exact"]["active"] and s["exact"]["exact"] and s["exact"]["route"] == route, name
        assert s["exactness"] and all(p["bitwise_equal"] for p in s["exactness"].values()), name
        assert len(s["requests"]) == n_requests, name
        for r in s["requests"]:
            assert all(a["identity"]["identical_bytes"] for a in r["arms"][1:]), (name, r["id"])
        assert s["baseline"] == "classic-stock", name  # the faster classic: stock's
        exact, stock = s["arms"][0]["decode_tok_s"][1], s["classic_stock"]["decode_tok_s"][1]
        assert 0.70 <= exact / stock <= 0.86, (name, exact / stock)
        assert tuple(a["arm"] for a in s["arms"][1:] if a["verdict"] == "slower") == slower, name
        assert s["decision"]["decision"] == "undecided" and not s["decision"]["saveable"], name


def _d64(**kw):
    cfg = dict(families.NAMED["llama"], head_dim=64, num_attention_heads=2, num_key_value_heads=1,
               tie_word_embeddings=True, **kw)
    return families.build(cfg, seed=3, dtype="bfloat16")


def test_exact_classic_on_the_mlx_route_drops_the_dispatcher_once_every_call_is_mlx_s_own(cuda_mlx):
    """On the mlx route classic's 1-row steps make MLX's own calls, as they come, on the path's
    off-step caches; the dispatcher in front of each was ~3 % of SmolLM2's step (0.969x of stock
    on the H100). After UNDISPATCHED_AFTER steps that were all such calls, classic runs the rest
    with no dispatcher: the same calls, the same text, and the record says from which step."""
    from blockwidth.engine import decode

    model = _d64()
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.route == "mlx"
    pair = _Pair(model)
    fast = classic(pair, PROMPT, 16, exact=plan)
    summary = fast.attention["exact"]
    assert summary["undispatched_from"] == decode.UNDISPATCHED_AFTER and summary["exact"]
    slow = classic(pair, PROMPT, 16, exact=plan, undispatched_after=None)  # every step through the dispatcher
    assert "undispatched_from" not in slow.attention["exact"]
    assert fast.tokens == slow.tokens
    # the dispatcher saw the prefill and two steps, not sixteen
    assert fast.attention["exact"]["linear"]["routed_calls"] < slow.attention["exact"]["linear"]["routed_calls"]
    run = speculative(pair, PROMPT, 16, 4, drafter=_Echo(fast.tokens), exact=plan)
    assert run.tokens == fast.tokens


class _Sometimes(_Echo):
    """Classic's own next tokens on every third round, nothing on the others (lookup finding no
    match): most rounds are 1-row steps."""

    def __init__(self, tokens):
        super().__init__(tokens)
        self.asked = 0

    def propose(self, n):
        self.asked += 1
        return super().propose(n) if self.asked % 3 == 0 else mx.array([], mx.uint32)


@pytest.mark.parametrize("route", ["mlx", "kernels"])
def test_rounds_that_draft_nothing_run_as_exact_classic_s_steps(cuda_mlx, monkeypatch, route):
    """A round that drafts nothing is a 1-row step. On the mlx route, once one made only MLX's
    own calls, the later ones run without the dispatcher, as classic's steps do: the same text,
    fewer routed calls, and the summary counts them; the kernels route keeps it in every round.
    The cost curve's 1-row point is timed the same way (``one_row_undispatched``)."""
    import contextlib

    from blockwidth.engine import costcurve

    monkeypatch.setenv(linear.EXACT_ROUTE_ENV, route)
    model = _d64()
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.route == route
    pair = _Pair(model)
    base = classic(pair, PROMPT, 16, exact=plan, undispatched_after=None)
    run = speculative(pair, PROMPT, 16, 4, drafter=_Sometimes(base.tokens), exact=plan)
    assert run.tokens == base.tokens
    summary = run.attention["exact"]
    assert summary["exact"]
    declined = run.declined_rounds
    assert declined >= 6
    curve = costcurve.measure(model, (1, 4), context=16, repeats=2, warmup=1, warm=True, exact=plan)
    if route == "mlx":
        # the first declined round on the path, the rest without it: the path saw none of their calls
        assert summary["undispatched_rounds"] == declined - 1
        assert curve.linear.get("one_row_undispatched") is True
        monkeypatch.setattr(exact, "undispatched", contextlib.nullcontext)
        seen = speculative(pair, PROMPT, 16, 4, drafter=_Sometimes(base.tokens), exact=plan)
        assert seen.tokens == base.tokens
        calls = (lambda r: r.attention["exact"]["linear"]["stock_calls"] + r.attention["exact"]["linear"]["routed_calls"])
        per_step = (calls(seen) - calls(run)) // (declined - 1)
        assert per_step > 0 and calls(seen) - calls(run) == per_step * (declined - 1)
    else:
        assert "undispatched_rounds" not in summary
        assert "one_row_undispatched" not in curve.linear
    assert [p.rows for p in curve.points] == [1, 4]


@pytest.mark.parametrize("why", ["biased projections", "head size 32", "kernels route"])
def test_exact_classic_keeps_the_dispatcher_where_a_step_is_not_mlx_s_own_call(cuda_mlx, monkeypatch, why):
    """A biased 16-bit projection's step is gemv then its bias (not MLX's addmm), a head size the
    vector kernel does not take goes to the rows kernel, the kernels route runs its own kernels:
    there every step stays on the path, and the text is the speculative arms'."""
    if why == "kernels route":
        monkeypatch.setenv(linear.EXACT_ROUTE_ENV, "kernels")
    model = _d64(attention_bias=True) if why == "biased projections" else _d64() if why == "kernels route" \
        else _llama()
    plan = exact.plan(model, "auto", backend="cuda")
    assert plan.active and plan.route == ("kernels" if why == "kernels route" else "mlx")
    pair = _Pair(model)
    base = classic(pair, PROMPT, 10, exact=plan)
    assert "undispatched_from" not in base.attention["exact"] and base.attention["exact"]["exact"]
    run = speculative(pair, PROMPT, 10, 4, drafter=_Echo(base.tokens), exact=plan)
    assert run.tokens == base.tokens


def test_the_committed_h100_record_has_exact_classic_at_stock_speed_once_undispatched():
    """lab/evidence/h100-2026-12-05c: SmolLM2 native and bf16, 64 tokens after 64- and 400-token
    prompts, 9 interleaved repetitions: exact classic on the mlx route, undispatched from step 2,
    at 0.979-1.003x of stock (the issue's bar: 0.97x), with the dispatcher kept 0.930-0.973x,
    stock's text throughout; and a session whose classic ran undispatched gave every request's
    w4 text byte for byte."""
    import gzip

    from tests.conftest import ROOT

    base = ROOT / "lab/evidence/h100-2026-12-05c"
    speed = json.loads((base / "speed/models-speed.json").read_text())
    seen = set()
    for m in speed["models"]:
        for prompt, got in m["classic_speed_by_prompt"].items():
            r = got["ratio_to_stock"]
            assert r["mlx"] >= 0.97 and r["mlx"] > r["mlx-dispatched"], (m["target"], prompt, r)
            assert all(got["same_text_as_stock"].values()), (m["target"], prompt)
            seen.add((m["target"].rsplit("/", 1)[-1], prompt))
    assert seen == {(t, p) for t in ("native", "bf16") for p in ("64", "400")}
    s = json.loads(gzip.open(base / "code/identity-n1.json.gz").read())
    assert s["host"]["device"]["name"] == "NVIDIA H100 80GB HBM3" and s["exact"]["route"] == "mlx"
    for r in s["requests"]:
        classic_arm, w4 = r["arms"][0], r["arms"][1]
        assert all(x["attention"]["exact"]["undispatched_from"] == 2 for x in classic_arm["samples"]), r["id"]
        assert w4["identity"]["identical_bytes"], r["id"]


def test_exact_classic_keeps_the_dispatcher_where_a_layer_has_a_window(cuda_mlx):
    """A window cache may hand a 1-row step a mask once it is full (a review): a target with
    a sliding-window layer keeps the dispatcher in every step, whatever its first steps did."""
    from blockwidth.engine.kvcache import make_cache, only_off_step_kv

    cfg = dict(families.NAMED["gemma3_text"], head_dim=64, query_pre_attn_scalar=64)
    model = families.build(cfg, seed=3, dtype="bfloat16")
    assert not only_off_step_kv(make_cache(model, slack=1, off_step_buffers=True))
    assert only_off_step_kv(make_cache(_d64(), slack=1, off_step_buffers=True))
    plan = exact.plan(model, "auto", backend="cuda")
    if not plan.active:
        pytest.skip(f"the path does not take this tiny gemma3: {plan.reason}")
    base = classic(_Pair(model), PROMPT, 24, exact=plan)  # past its 16-key window
    assert "undispatched_from" not in base.attention["exact"]


def test_the_committed_h100_file_edits_win_was_saved_on_the_exact_path(real_models, capsys):
    """lab/evidence/h100-2026-12-05d: SmolLM2 native 4-bit + lookup over whole-file edits on an
    H100 reached a saved decision, w4 1.26x [1.05, 1.54] against the faster classic (exact:
    313 tok/s, stock 284), every request's text classic's at both widths, classic undispatched,
    the curve's 1-row point too; its README's figures are the record's, and `check` passes the
    saved entry for that device here."""
    import gzip

    from blockwidth.console.cli import main
    from tests.conftest import ROOT

    base = ROOT / "lab/evidence/h100-2026-12-05d/file-edits"
    s = json.loads(gzip.open(base / "smol-lookup-edits.json.gz").read())
    assert s["host"]["device"]["name"] == "NVIDIA H100 80GB HBM3" and s["exact"]["route"] == "mlx"
    assert s["workload"]["name"] == "file-edits.jsonl" and len(s["requests"]) == 8
    arms = {a["arm"]: a for a in s["arms"]}
    assert arms["w4"]["verdict"] == "wins" and arms["w6"]["verdict"] == "undecided"
    assert [round(x, 2) for x in (arms["w4"]["ratio"], *arms["w4"]["ratio_ci"])] == [1.26, 1.05, 1.54]
    assert s["baseline"] == "classic" and arms["classic"]["decode_tok_s"][1] > s["classic_stock"]["decode_tok_s"][1]
    assert s["decision"]["saveable"] and s["saved"] and s["exactness"]["4"]["bitwise_equal"]
    assert s["costcurve"]["linear"]["one_row_undispatched"] is True
    declined = undispatched = 0
    for r in s["requests"]:
        assert all(a["identity"]["identical_bytes"] for a in r["arms"][1:]), r["id"]
        assert all(x["attention"]["exact"]["undispatched_from"] == 2 for x in r["arms"][0]["samples"]), r["id"]
        for x in (x for a in r["arms"][1:] for x in a["samples"]):
            declined += x["declined_rounds"]
            undispatched += x["attention"]["exact"].get("undispatched_rounds", 0)
    assert (declined, undispatched) == (1170, 1116)
    readme = (base.parent / "README.md").read_text()
    assert "**1.26x [1.05, 1.54]**" in readme and "311.4 / 313.4 / 314.3" in readme
    assert main(["check", "--profile", str(base / "profile.toml"), "--device", "cuda:9.0"]) == 0
    capsys.readouterr()
    assert main(["resolve", "--profile", str(base / "profile.toml"), "--device", "cuda:9.0", "--kind", "lookup",
                 "--target", str(real_models / "smollm2" / "native")]) == 0
    assert capsys.readouterr().out.startswith("width 4   source profile")
