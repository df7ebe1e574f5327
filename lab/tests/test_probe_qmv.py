"""lab.probe_qmv on this CPU: its CPU parts on tiny shapes, its refusals, its sources for nvcc,
the auto rows it derives, and the committed GPU records it produced (read once they exist)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

EVIDENCE = ROOT / "lab" / "evidence"


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "lab.probe_qmv", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def test_on_a_cpu_the_probe_runs_its_cpu_parts_on_tiny_shapes_and_refuses_the_kernel_in_one_line(tmp_path):
    out = _run("--out", str(tmp_path), "--shape", "tiny")
    assert out.returncode == 0, out.stderr[-3000:]
    refusals = [ln for ln in out.stdout.splitlines() if "no CUDA here" in ln]
    assert len(refusals) == 1 and "refused" in refusals[0], out.stdout
    rec = json.loads((tmp_path / "probe_qmv.json").read_text())
    assert rec["kind"] == "qmv-probe" and rec["cuda"] is False and rec["parity_ok"] is None
    assert rec["compile"]["refused"] == "no CUDA" and rec["compile"]["instances"]
    par = rec["parity"]
    assert par["cases"] == 24 and par["kernel_passed"] == 0 and par["complete"] and par["stock_rows"] == list(range(1, 8))
    for case in par["results"]:  # the CPU's float32 reference and stock's verdict against it ran
        assert case["kernel"] == "refused: no CUDA"
        if case["rows"] < 8:
            assert case["stock"]["finite"] and case["stock"]["rel_l2"] > 0
        else:  # stock's qmm, which a CUDA host JIT-compiles at first use, only with --stock-qmm
            assert case["stock"].startswith("not run: qmm") and set(case["seconds"]) == {
                "setup", "reference", "stock", "kernel"}
    # every section's seconds and what MLX JIT-compiled in it (nothing, on a CPU)
    assert set(rec["sections"]) == {"compile", "parity", "projections", "curves"}
    assert all(v["s"] >= 0 and v["jit_compiled"] == [] for v in rec["sections"].values())
    assert {v["impl"] for v in rec["projections"].values()} == {"stock"}
    assert all(v["warm_us"] > 0 and v["chain_us"] > 0 for v in rec["projections"].values())
    curves = rec["curves"]
    assert curves["quantization"]["bits"] == 4 and len(curves["passes"]) == 1
    assert list(curves["passes"][0]["curves"]) == ["stock"]
    assert [p["rows"] for p in curves["passes"][0]["curves"]["stock"]["points"]] == [1, 2, 4]
    assert rec["auto_affine-4"] == [] and rec["wins_affine-4"] == []
    assert (tmp_path / "log.txt").read_text().count("\n") >= 5


def test_parity_stops_at_its_share_of_the_budget_and_says_what_it_skipped(tmp_path):
    out = _run("--out", str(tmp_path), "--shape", "tiny", "--sections", "parity", "--budget-s", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads((tmp_path / "probe_qmv.json").read_text())
    par = rec["parity"]
    assert par["cases"] == 0 and not par["complete"] and not par["all_ok"] and len(par["skipped"]) == 3
    assert "3 shapes skipped at the budget" in out.stdout and set(rec["sections"]) == {"compile", "parity"}
    out = _run("--out", str(tmp_path / "qmm"), "--shape", "tiny", "--sections", "parity", "--stock-qmm")
    par = json.loads((tmp_path / "qmm" / "probe_qmv.json").read_text())["parity"]
    assert par["complete"] and par["stock_rows"] == list(range(1, 9))
    assert all(c["stock"]["finite"] for c in par["results"])


def test_the_jit_modules_are_read_from_mlxs_ptx_cache(tmp_path, monkeypatch):
    from lab import probe_qmv

    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    assert probe_qmv.ptx_cache_dir() == tmp_path and probe_qmv.jit_modules() == set()
    (tmp_path / "qmm_sm80_tn_bfloat16_m16_b4_g64_affine.ptx").write_text("x")
    (tmp_path / "qmm_sm80_tn_bfloat16_m16_b4_g64_affine.txt").write_text("x")  # its kernel names
    (tmp_path / "a_long_name_split").mkdir()  # MLX splits names past the file system's limit
    (tmp_path / "a_long_name_split" / "tail.ptx").write_text("x")
    assert probe_qmv.jit_modules() == {"qmm_sm80_tn_bfloat16_m16_b4_g64_affine", "a_long_name_split/tail"}
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path / "none"))
    assert probe_qmv.jit_modules() == set()


def test_without_cuda_a_real_shape_and_bad_input_are_refused_in_one_line(tmp_path):
    out = _run("--out", str(tmp_path), "--shape", "8b")
    assert out.returncode == 2 and "needs CUDA" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "probe_qmv.json").exists()
    for bad in (["--passes", "0"], ["--sections", "parity,speed"]):
        out = _run("--out", str(tmp_path), *bad)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    out = _run("ncu", "--out", str(tmp_path))
    assert out.returncode == 2 and "needs CUDA" in out.stderr


def test_emit_writes_every_instance_as_mlx_would_build_it(tmp_path):
    from blockwidth.engine import qmv
    from lab import probe_qmv

    assert _run("emit", "--out", str(tmp_path)).returncode == 0
    files = sorted(tmp_path.glob("*.cu"))
    assert len(files) == len(qmv.BITS) * len(qmv.GROUPS) * len(qmv.DTYPES) * 4
    name, src = probe_qmv.generated_source(4, 64, "bfloat16", 4)
    assert (tmp_path / f"{name}.cu").read_text() == src
    # the parameters MLX adds for the names the source reads: x's shape and rank, w's shape
    assert "const __grid_constant__ Shape x_shape,\n    const __grid_constant__ int x_ndim,\n    const uint32_t* w," in src
    assert src.count("__grid_constant__") == 3


STUB = """#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
}
"""


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc here: the CUDA source is compiled on the GPU host")
@pytest.mark.parametrize("bits, group, dtype, u", [(4, 64, "bfloat16", 4), (4, 64, "bfloat16", 8),
                                                   (8, 128, "float16", 2), (4, 32, "float16", 8)])
def test_the_generated_source_compiles_for_sm90_without_spills(tmp_path, bits, group, dtype, u):
    """nvcc (where this machine has it) builds what MLX would hand NVRTC, with a stand-in for
    MLX's device header (its Shape type and the 16-bit types), for the H200's sm_90a."""
    from lab import probe_qmv

    inc = tmp_path / "mlx" / "backend" / "cuda" / "device"
    inc.mkdir(parents=True)
    (inc / "utils.cuh").write_text(STUB)
    name, src = probe_qmv.generated_source(bits, group, dtype, u)
    cu = tmp_path / f"{name}.cu"
    cu.write_text(src)
    out = subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-std=c++17", "-I", str(tmp_path), "-Xptxas", "-v",
                          "-o", str(tmp_path / "k.cubin"), str(cu)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "0 bytes spill stores, 0 bytes spill loads" in out.stderr, out.stderr


def _curves(stock: list[float], route: dict[str, list[list[float]]]) -> dict:
    def curve(ms):
        return {"points": [{"rows": r + 1, "median_ms": v} for r, v in enumerate(ms)]}

    passes = []
    for p in range(len(next(iter(route.values())))):
        c = {"stock": curve(stock)}
        for name, per_pass in route.items():
            c[name] = curve(per_pass[p])
        passes.append({"curves": c})
    return {"quantization": {"bits": 4, "group_size": 64, "mode": "affine"}, "passes": passes}


def test_auto_rows_are_the_rows_won_by_ten_percent_in_every_pass():
    from lab.probe_qmv import derive_auto, win_entries

    stock = [9.0, 13.0, 17.0, 21.0, 25.0, 29.0, 33.0, 16.0, 17.0]
    curves = _curves(stock, {
        "qmv-direct": [[9.5, 10.0, 10.2, 10.5, 11.0, 11.2, 11.5, 14.9, 17.0],
                       [9.6, 11.9, 10.1, 10.4, 11.1, 11.0, 11.6, 13.0, 17.5]],
        "qmv-compile": [[9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0, 9.0]] * 2})
    auto = derive_auto(curves, "9.0")
    by = {a["call"]: a for a in auto}
    assert by["direct"]["rows"] == [3, 4, 5, 6, 7]  # 2: 8.5 % in the second pass; 8: 6.9 % in the first
    assert by["compile"]["rows"] == [2, 3, 4, 5, 6, 7, 8, 9] and by["compile"]["passes"] == 2  # 1: a tie
    lines = win_entries(auto, "0.32.4", "lab/evidence/x/probe_qmv.json")
    assert lines == ['KernelWin(4, 64, "9.0", (2, 3, 4, 5, 6, 7, 8), "compile", "0.32.4", '
                     '"lab/evidence/x/probe_qmv.json"),',
                     'KernelWin(4, 64, "9.0", (3, 4, 5, 6, 7), "direct", "0.32.4", "lab/evidence/x/probe_qmv.json"),']


def _qmv_records() -> list[Path]:
    out = []
    for p in sorted(EVIDENCE.rglob("probe_qmv*.json")):
        data = json.loads(p.read_text())
        if isinstance(data, dict) and data.get("kind") == "qmv-probe" and data.get("cuda"):
            out.append(p)
    return out


def test_no_qmv_win_without_a_committed_record_and_each_win_follows_its_record():
    """blockwidth.engine.linear.QMV_WINS (what auto routes to the kernel) holds an entry only where a
    committed GPU record of this probe has its rows won, and holds exactly those rows; a
    committed record whose curves won must have its entries (adding the record flips auto)."""
    from blockwidth.engine.linear import QMV_WINS
    from lab.probe_qmv import derive_auto

    records = _qmv_records()
    if not records:
        assert QMV_WINS == ()
        return
    derived = set()
    for path in records:
        rec = json.loads(path.read_text())
        for key in ("curves", "curves_8bit"):
            if key in rec and "passes" in rec[key]:
                for a in derive_auto(rec[key], a_cc := _cc(rec)):
                    rows = tuple(r for r in a["rows"] if 2 <= r <= 8)
                    if rows:
                        derived.add((a["bits"], a["group_size"], a_cc, rows, a["call"], str(path.relative_to(ROOT))))
    table = {(w.bits, w.group_size, w.compute_capability, w.rows, w.call, w.record) for w in QMV_WINS}
    assert table == derived


def _cc(rec: dict) -> str:
    d = rec["env"]["device"]
    return f"{d['compute_capability_major']}.{d['compute_capability_minor']}"


PARITY_RECORD = EVIDENCE / "h200-2026-12-01" / "qmv" / "probe_qmv.json"  # the H200's first parity run


def test_the_committed_parity_records_passed_every_case():
    """Every committed GPU record with a parity section passed every case, and the H200's of
    2026-12-01 is one of them. That run's harness stopped it (300 s) after the parity section,
    so its record has no final ``parity_ok``: the section's own verdict (``all_ok``) is read."""
    records = [p for p in _qmv_records() if "parity" in json.loads(p.read_text())]
    assert PARITY_RECORD in records
    for path in records:
        rec = json.loads(path.read_text())
        par = rec["parity"]
        assert rec.get("parity_ok", True) is True and par["all_ok"] is True, path
        assert par["kernel_passed"] == par["cases"] >= 150, path  # 19 shapes x rows 1-8
        seen = {(c["bits"], c["group"], c["dtype"]) for c in par["results"]}
        assert {(b, g, "bfloat16") for b in (4, 8) for g in (32, 64, 128)} <= seen
        assert {(4, 64, "float16"), (8, 64, "float16")} <= seen
        assert {c["rows"] for c in par["results"]} == set(range(1, 9))
        assert any(c["n"] % 16 for c in par["results"]) and any(c["k"] % 512 for c in par["results"])
        for c in par["results"]:
            k = c["kernel"]
            assert k["ok"] and k["finite"] and k["max_abs_over_max_ref"] <= k["max_tol"], (path, c)
            assert k["rel_l2"] <= k["rel_l2_tol"], (path, c)
            if c["rows"] in (2, 8):  # the product's calls, direct and compiled, gave the checked bits
                assert c["product_call_equal"] == {"direct": True, "compile": True}, (path, c)
