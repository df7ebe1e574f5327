"""lab.served_gpu, the GPU host's served-path run, on the demo pair on this CPU: every step
writes its records and the summary sets the served arms beside the engine's."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.lease
def test_served_gpu_runs_every_step_and_summarises_them(tmp_path):
    out = tmp_path / "served"
    r = subprocess.run([sys.executable, "-m", "lab.served_gpu", "--pair", str(ROOT / "engine/demo/pair"),
                        "--out", str(out), "--widths", "2", "-n", "1", "--tokens", "6",
                        "--concurrency", "1,2", "--step-timeout", "120"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr
    status = json.loads((out / "status.json").read_text())
    assert {k: v["code"] for k, v in status.items()} == {"stock": 0, "nocudnn": 0, "dispatch": 0, "engine": 0}
    recs = {step: [json.loads(f.read_text()) for f in sorted((out / step).glob("session-*.json"))]
            for step in status}
    # one record a level (file names sort by second, then pid: not by level)
    assert sorted(rec["concurrency"] for rec in recs["stock"]) == [1, 2]
    assert recs["nocudnn"][0]["host"]["env"].get("MLX_CUDA_USE_CUDNN_SDPA") == "0"
    assert recs["dispatch"][0]["server"]["verify_attention"] == "auto"
    assert recs["stock"][0]["server"]["verify_attention"] is None
    assert recs["engine"][0]["path"] == "engine"
    table = (out / "summary.md").read_text()
    for step in status:
        assert f"| {step} |" in table
    assert "| stock | mlx-lm-server | 2 | w2 |" in table
