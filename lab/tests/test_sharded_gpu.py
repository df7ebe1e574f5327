"""lab/sharded_gpu.sh on this CPU, on the demo pair, the ring backend instead of NCCL: the stages
the coordinator runs on a 2-GPU host write what they say (docs/distributed.md). Bounded: every command in
the script has its timeout, and this test one over all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _stage(stage: str, tmp_path: Path) -> Path:
    env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"),
               P=str(ROOT / "engine/demo/pair"), BACKEND="ring", ONE="", WIDTHS="2", N="1", TOKENS="8",
               ROWS="1,2", CONTEXT="16", REPEATS="1", PYTHON=sys.executable, PYTHONPATH=str(ROOT), GROUP_T="400", SWEEP_T="450",
               XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    r = subprocess.run(["bash", "lab/sharded_gpu.sh", stage], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return tmp_path / "out" / stage


def _record(d: Path) -> dict:
    recs = sorted(d.glob("*.json"))
    assert len(recs) == 1, recs
    return json.loads(recs[0].read_text())


@pytest.mark.lease
def test_sweeps_stage(tmp_path):
    out = _stage("sweeps", tmp_path)
    one, group = _record(out / "one"), _record(out / "tensor")
    assert "group" not in one and "group" not in one["host"]["device"]
    assert group["group"]["sharding"] == "tensor" and group["group"]["size"] == 2
    assert group["pair"]["target"] == one["pair"]["target"]
    check = (out / "check-one.txt").read_text()
    if (out / "profile.toml").exists():  # a saveable session saved the group's entry
        assert "[override.group]" in (out / "profile.toml").read_text()
        assert "2 ranks over ring, tensor-sharded" in check  # ... which one device skips
    assert "rc " in check


@pytest.mark.lease
def test_curves_stage(tmp_path):
    out = _stage("curves", tmp_path)
    one = json.loads((out / "costcurve-one.json").read_text())
    assert "group" not in one
    for s, said in (("tensor", "all_sum"), ("pipeline", "send/recv")):
        c = json.loads((out / f"costcurve-{s}.json").read_text())
        assert c["group"]["sharding"] == s and said in c["group"]["communication"]["collectives"]
        assert [p["rows"] for p in c["points"]] == [1, 2]
    assert _record(out / "tensor-rank0")["group"]["drafter"] == "rank0"
