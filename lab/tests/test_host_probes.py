"""The host-cost probes (lab/probe_host.py, lab/bench_route_host.py) run end to end on this CPU:
the figures docs/exact.md quotes come from them, so they must keep running."""

from __future__ import annotations

import json

from tests.conftest import ROOT


def test_probe_host_times_a_step_s_build_stock_and_on_the_path(tmp_path):
    from lab import probe_host

    out = tmp_path / "host.json"
    assert probe_host.main([str(ROOT / "engine" / "demo" / "pair" / "target-bf16"), "--steps", "3", "--reps", "1",
                            "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert set(row["build_ms_median"]) == {"stock", "path"} and all(v > 0 for v in row["build_ms_median"].values())


def test_the_attention_host_bench_prices_each_route_by_rows(monkeypatch, capsys):
    from lab import bench_route_host

    monkeypatch.setattr(bench_route_host, "CALLS", 50)
    monkeypatch.setattr(bench_route_host, "REPEATS", 1)
    got = bench_route_host.attention_host(rows=(1, 2, 8))
    assert set(got) == {"stock", "mlx", "hybrid"} and all(set(v) == {1, 2, 8} for v in got.values())
    assert "attention, hybrid" in capsys.readouterr().out
