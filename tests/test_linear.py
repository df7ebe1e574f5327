"""The verify-projection choice (engine.linear) on this CPU.

``gather`` exists for CUDA, where it keeps 2..64-row 16-bit projections off cuBLAS;
MLX's CPU gather_mm takes float32 only, so here it is exercised on float32 weights
(the demo target cast to float32) and must leave 16-bit ones to the stock matmul."""

import threading
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from blockwidth.engine import demo
from blockwidth.engine.decode import classic, speculative
from blockwidth.engine.demo.prompts import DEMO_PROMPTS
from blockwidth.engine.linear import CHOICES, gather_linear, gemv_fits, parse, verify_linear
from blockwidth.engine.pair import load_pair

_STOCK = nn.Linear.__call__


@pytest.mark.parametrize("shape", [(1, 5, 64), (7, 64), (2, 3, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_gather_linear_is_the_stock_product(shape, bias):
    lin = nn.Linear(64, 48, bias=bias)
    x = mx.random.normal(shape)
    want = lin(x)
    got = gather_linear(x, lin.weight, lin.bias if bias else None)
    assert got.shape == want.shape
    assert mx.allclose(got, want, atol=1e-5).item()


def test_only_verify_shaped_float_projections_are_routed():
    lin = nn.Linear(64, 32)
    half = nn.Linear(64, 32)
    half.set_dtype(mx.bfloat16)
    with verify_linear("gather") as r:
        lin(mx.zeros((1, 1, 64)))  # a 1-row step
        lin(mx.zeros((1, 100, 64)))  # prefill
        half(mx.zeros((1, 4, 64), mx.bfloat16))  # 16-bit: CUDA only
        assert (r.routed, r.passed) == (0, 3)
        x = mx.random.normal((1, 4, 64))
        got = lin(x)  # routed, with the layer's bias
        assert r.routed == 1
    assert mx.allclose(got, lin(x), atol=1e-5).item()
    with verify_linear("stock") as r:
        lin(mx.zeros((1, 4, 64)))
        assert r.routed == 0
    with verify_linear("auto") as r:
        assert r.mode.value == "stock"  # until the H200 has measured gather
        assert nn.Linear.__call__ is _STOCK  # stock blocks add nothing to a projection
    assert nn.Linear.__call__ is _STOCK  # nor does anything after a gather block


def test_the_choice_stays_in_its_thread():
    """A projection in another thread, under no block of its own, takes the stock matmul and
    is not counted in this thread's block, though the dispatcher is in place for both."""
    lin = nn.Linear(64, 32)
    mx.eval(lin.parameters())
    seen = {}

    def other():
        with mx.stream(mx.new_stream(mx.cpu)):  # MLX's streams are per thread
            seen["out"] = lin(mx.ones((1, 4, 64)))
            mx.eval(seen["out"])
        with verify_linear("stock") as r:
            lin(mx.zeros((1, 4, 64)))
            seen["other"] = r.routed

    with verify_linear("gather") as r:
        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert (r.routed, r.passed) == (0, 0)
        lin(mx.zeros((1, 4, 64)))
        assert r.routed == 1
    assert seen["other"] == 0
    assert mx.array_equal(seen["out"], lin(mx.ones((1, 4, 64)))).item()


def test_a_closing_block_leaves_the_blocks_still_open_routed():
    """Blocks nest (probe_gpu's ``gathermv`` around a gather decode) and overlap across
    threads: the dispatcher stays until the last gather block closes."""
    lin = nn.Linear(64, 32)
    x = mx.zeros((1, 4, 64))
    with verify_linear("gather") as outer:
        with verify_linear("gather") as inner:
            lin(x)
        assert inner.routed == 1
        lin(x)
        assert outer.routed == 1  # the inner block's close did not remove the dispatcher
    assert nn.Linear.__call__ is _STOCK

    opened, closed = threading.Event(), threading.Event()

    def other():
        with verify_linear("gather"):
            opened.set()
            closed.wait(60)

    t = threading.Thread(target=other, daemon=True)
    with verify_linear("gather") as r:
        t.start()
        assert opened.wait(60), "the other thread never opened its block"
        closed.set()
        t.join(60)  # the other thread's block has closed; this one is still open
        assert not t.is_alive()
        lin(x)
        assert r.routed == 1
    assert nn.Linear.__call__ is _STOCK


def test_a_bad_choice_names_the_choices():
    with pytest.raises(ValueError, match="gather"):
        parse("cublas")
    assert set(CHOICES) == {"auto", "stock", "gather", "gemv", "qmv"}


@pytest.mark.parametrize("width", [2, 4, 8])
def test_gather_keeps_classic_tokens_on_the_demo_pair_in_float32(width):
    pair = load_pair(demo.target("bf16"), demo.DRAFTER)  # its own: set to float32 here
    pair.target.set_dtype(mx.float32)
    pair.drafter.set_dtype(mx.float32)
    ids = pair.tokenizer.encode(DEMO_PROMPTS[1])
    want = classic(pair, ids, 48).tokens
    run = speculative(pair, ids, 48, width, linear="gather")
    assert run.tokens == want
    assert run.attention["linear"]["routed_calls"] > 0
    # Without the argument the summary is what it always was.
    assert "linear" not in speculative(pair, ids, 8, width).attention


def test_a_gather_session_judges_and_predicts_with_the_gather_projections(monkeypatch):
    """run_session with verify_linear gather: the exactness probe, the divergence replay and the
    cost curve run the same verify projections as the arms, so its prediction is of the arms
    it ran. Counted at engine.linear's gather route: the same session with those stages off
    routes only its runs (warm-up included); with them on it must route more."""
    from blockwidth.engine import linear
    from blockwidth.engine.ab import AbConfig, run_session

    pair = load_pair(demo.target("bf16"), demo.DRAFTER)  # its own: set to float32 here
    pair.target.set_dtype(mx.float32)
    pair.drafter.set_dtype(mx.float32)
    calls = [0]
    route = linear.gather_linear

    def counted(*args, **kwargs):
        calls[0] += 1
        return route(*args, **kwargs)

    monkeypatch.setattr(linear, "gather_linear", counted)
    routed = {}
    for stages in (False, True):
        calls[0] = 0
        session = run_session(pair, AbConfig(widths=(4,), prompt=DEMO_PROMPTS[1], n=1, max_tokens=12,
                                             verify_linear="gather", exactness=stages, predict=stages))
        assert sum(r.attention["linear"]["routed_calls"] for a in session.arms for r in a.runs) > 0
        routed[stages] = calls[0]
    assert session.curve is not None and 4 in session.exactness
    assert routed[True] > routed[False]


def test_a_gather_session_that_routed_nothing_says_its_figures_are_stocks(demo_pairs):
    from blockwidth.engine.ab import AbConfig, run_session

    pair = demo_pairs()  # bf16: nothing routable on a CPU
    cfg = dict(widths=(2,), prompt=DEMO_PROMPTS[0], n=1, max_tokens=8, exactness=False,
               predict=False, warmup=False)
    gathered = run_session(pair, AbConfig(**cfg, verify_linear="gather"))
    said = [w for w in gathered.warnings() if "routed no projection" in w]
    assert said
    # The session's Markdown (m in the console) names the mode and carries the warning too.
    from blockwidth.engine.session import host, record

    md = record.markdown(record.build(gathered, pair, host.identity(), host.gate().to_dict()))
    assert "- verify linear: gather" in md and f"- {said[0]}" in md
    assert not any("routed no projection" in w for w in run_session(pair, AbConfig(**cfg)).warnings())


def test_gemv_routes_nothing_on_a_cpu_keeps_classic_tokens_and_says_so(demo_pairs):
    """``gemv`` is a CUDA kernel: on this CPU every projection stays on the stock matmul (the
    tokens are classic's, the run counts the passes) and the session warns that its figures
    are stock's."""
    from blockwidth.engine.ab import AbConfig, run_session

    pair = demo_pairs()
    ids = pair.tokenizer.encode(DEMO_PROMPTS[1])
    run = speculative(pair, ids, 24, 4, linear="gemv")
    assert run.tokens == classic(pair, ids, 24).tokens
    assert run.attention["linear"]["routed_calls"] == 0
    assert run.attention["linear"]["stock_calls"] > 0
    assert nn.Linear.__call__ is _STOCK
    session = run_session(pair, AbConfig(widths=(2,), prompt=DEMO_PROMPTS[0], n=1, max_tokens=8,
                                         exactness=False, predict=False, warmup=False,
                                         verify_linear="gemv"))
    assert any("verify linear gemv routed no projection" in w and "CUDA only" in w
               for w in session.warnings())


def test_gemv_takes_only_the_shapes_its_kernel_reads_in_bounds():
    """The CUDA kernel cannot run here, so its dispatch rule is checked as a rule: it reads
    D = x's last dim from every weight row with 16-byte loads and keeps 8 row sums, so only
    2..8 rows, D a multiple of 8, a weight of exactly D inputs and one 16-bit dtype may go."""
    bf, half, f32 = mx.bfloat16, mx.float16, mx.float32
    cuda = (bf, half)
    assert gemv_fits((1, 4, 64), bf, (48, 64), bf, cuda)
    assert gemv_fits((2, 64), half, (48, 64), half, cuda)
    assert gemv_fits((1, 8, 64), bf, (48, 64), bf, cuda)
    assert not gemv_fits((1, 1, 64), bf, (48, 64), bf, cuda)  # a 1-row step: MLX's own gemv
    assert not gemv_fits((1, 9, 64), bf, (48, 64), bf, cuda)  # more rows than accumulators
    assert not gemv_fits((1, 4, 60), bf, (48, 60), bf, cuda)  # 16-byte loads would run past D
    assert not gemv_fits((1, 4, 64), bf, (48, 32), bf, cuda)  # would read past each weight row
    assert not gemv_fits((1, 4, 64), bf, (48, 128), bf, cuda)  # the stock matmul's shape error
    assert not gemv_fits((1, 4, 64), bf, (2, 48, 64), bf, cuda)
    assert not gemv_fits((1, 4, 64), f32, (48, 64), bf, cuda)  # one type T for both
    assert not gemv_fits((1, 4, 64), f32, (48, 64), f32, cuda)
    assert not gemv_fits((1, 4, 64), bf, (48, 64), bf, ())  # a CPU routes nothing
    assert not gemv_fits((), bf, (48, 64), bf, cuda)


def _linear_session(mode: str, backend: str, routed: dict[int, int]):
    """A session's arms as their records hold them: per run, the projections the route took."""
    from blockwidth.engine.ab import AbConfig, Arm, Session, Verdict
    from blockwidth.engine.decode import DecodeRun, Round

    s = Session(AbConfig(widths=tuple(routed), prompt="x", verify_linear=mode), [1],
                Arm(None, verdict=Verdict.CONTROL), [])
    s.backend = backend
    s.classic.runs = [DecodeRun(None, [1, 2], 5, 0.01, 0.02, [Round(0, 0, 1, 0.0, 0.0, 0.0)])]
    for w, n in routed.items():
        summary = {"linear": {"mode": mode, "routed_calls": n, "stock_calls": 0 if n else 7}}
        s.arms.append(Arm(w, runs=[DecodeRun(w, [1, 2], 5, 0.01, 0.02,
                                             [Round(3, 2, 1, 0.0, 0.0, 0.0)], summary)]))
    return [w for w in s.warnings() if "routed no projection" in w]


def test_the_routed_nothing_warning_says_why_on_cuda_and_names_the_arms_left_stock():
    """On CUDA the reason is the pair or the widths, not "MLX's CPU"; a gemv sweep with widths
    over 8 names those arms (their figures are stock's) though the others routed."""
    said = _linear_session("gemv", "cuda", {4: 0, 8: 0})
    assert len(said) == 1 and "CPU" not in said[0] and "of 2..8 rows" in said[0], said
    said = _linear_session("gather", "cuda", {4: 0})
    assert len(said) == 1 and "CPU" not in said[0] and "of 2..64 rows" in said[0], said
    said = _linear_session("gemv", "cuda", {4: 154, 8: 154, 12: 0, 16: 0})
    assert said == ["verify linear gemv routed no projection at w12, w16: it takes verifies of "
                    "2..8 rows (a width's rows), so those arms' figures are stock's."]
    assert not _linear_session("gemv", "cuda", {4: 154, 8: 154})
    assert "CUDA only" in _linear_session("gemv", "cpu", {4: 0})[0]
    assert "float32" in _linear_session("gather", "cpu", {4: 0})[0]


def help_of(flag: str, *module_args: str) -> str:
    """``flag``'s entry in ``python -m MODULE ... --help``, one line."""
    import os
    import re
    import subprocess
    import sys

    from tests.conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    out = subprocess.run([sys.executable, "-m", *module_args, "--help"], capture_output=True,
                         text=True, env=env, cwd=ROOT, timeout=300).stdout
    m = re.search(rf"^ +{flag} \{{.*?(?=^ +-|\Z)", out, re.S | re.M)
    assert m, out
    return " ".join(m.group(0).split())


@pytest.mark.parametrize("flag, said", [("--verify-linear", "auto = stock"),
                                        ("--verify-attention", "auto = plain on CUDA")])
def test_verify_choices_are_one_declaration_in_the_front_end(flag, said):
    """bench, soak and coldcheck each declared --verify-linear once (three helps, defaults None
    and "auto"), and the engine declared both flags; now console/request.py declares each once,
    every command takes it from there (the lab's tools too: lab/tests/test_tool_flags.py), and
    the engine declares no flag at all."""
    import re

    from tests.conftest import ROOT

    helps = {args: help_of(flag, *args) for args in [("blockwidth.console.cli", "sweep"), ("blockwidth.console.cli", "costcurve")]}
    assert len(set(helps.values())) == 1 and said in helps[("blockwidth.console.cli", "sweep")], helps
    # engine/mlxserver.py is not a command of blockwidth's: it is the process engine.session.served spawns
    # (mlx_lm.server's own main with the dispatcher), told its mode on its argv by engine.session.served.
    spawned = ROOT / "engine" / "mlxserver.py"
    declared = [p.relative_to(ROOT) for d in ("engine", "console", "lab") for p in (ROOT / d).rglob("*.py")
                if p != spawned and re.search(rf'add_argument\(\s*"{flag}"', p.read_text(encoding="utf-8"))]
    assert declared == [Path("console/request.py")], declared
    engine = [p.name for p in (ROOT / "engine").rglob("*.py") if p != spawned and
              re.search(r"^\s*(import argparse|[\w.]+\.add_argument\()", p.read_text(encoding="utf-8"), re.M)]
    assert engine == []  # the engine declares no flag of blockwidth's command line
