"""lab/probe_rows.py on this CPU: it refuses what it cannot run in one line, its parity grid
reaches the rows kernel's edges, and its timing runs every mode through probe_overlap's loop.
(The rows kernel itself is the engine's: tests/test_attention.py.)"""

import mlx.core as mx

from blockwidth.engine import attention
from lab import probe_rows


def test_probe_rows_says_why_it_cannot_run_here(capsys):
    assert probe_rows.main(["--rows", "1,4"]) == 2
    assert "--rows '1,4'" in capsys.readouterr().err
    assert probe_rows.main(["--modes", "plain,cudnn"]) == 2
    assert "--modes" in capsys.readouterr().err
    assert probe_rows.main(["--shape", "70b"]) == 2
    assert "--shape '70b'" in capsys.readouterr().err
    assert probe_rows.main([]) == 2  # this CPU: the kernel is CUDA source
    assert "CUDA source" in capsys.readouterr().err


def test_probe_rows_parity_cases_reach_the_kernels_edges():
    """probe_rows's parity grid: the 1080 cases of the H200 run (batch 1, head sizes 64-128,
    2-16 rows) never reached what the kernel's source varies with at its limits: a head size
    of 32 (one value a lane) or 256 (eight, and the largest shared output), a batch stride, 64
    rows. Each case is one rows_fits takes (a case it refused would only count as failed)."""
    cases = probe_rows.cases()
    assert len(cases) == 1108 and all(c[1] == 1 and 64 <= c[2] <= 128 and c[5] <= 16 for c in cases[:1080])
    assert {c[2] for c in cases} >= {32, 256} and any(c[1] == 2 for c in cases)
    assert any(c[5] == 64 == c[6] for c in cases) and any(c[5] == 64 < c[6] for c in cases)
    for name, B, D, n_q, n_kv, L, S, causal in cases:
        dt = (getattr(mx, name),) * 3
        assert attention.rows_fits((B, n_q, L, D), (B, n_kv, S, D), (B, n_kv, S, D), dt,
                                   "causal" if causal else None, None, D ** -0.5)


def test_probe_rows_times_every_mode_on_a_cpu_through_probe_overlaps_loop():
    """probe_rows' timing (the part that needs no CUDA kernel) on a tiny random model: each row
    count has a median for every mode and that mode's routing, through probe_overlap's verify loop
    (plain routes every layer's verify call; fused routes none)."""
    out = probe_rows.timing("tiny", [2, 3], 7, ["plain", "fused"])
    assert set(out) == {"rows2", "rows3"}
    for per in out.values():
        assert per["plain"] > 0 and per["fused"] > 0
        assert per["plain_routing"]["routed_calls"] == 7 * 2  # 7 steps, 2 layers (first pass)
        assert per["fused_routing"]["routed_calls"] == 0
