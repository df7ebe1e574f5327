"""SIGTERM is Ctrl-C for every measuring command: after the first repetition has finished, a
signal stops the measurement after the step under way and the record of what finished is
written, marked cancelled (a supervisor's SIGTERM to sweep lost classic, w2 and w4 measured;
SIGINT to a served sweep lost its first repetition). Real subprocesses, really signalled."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.test_served import Proc, _alive, _gone, _pids


def _stop_after_first_repetition(proc: Proc, sig: int, pattern: str = r"\[rep\] .*repetition 1 done") -> int:
    try:
        proc.wait_for("stderr", pattern, timeout=240)
        proc.proc.send_signal(sig)
    finally:
        code = proc.finish(timeout=240)
    return code


def _record(folder: Path) -> dict:
    (path,) = folder.glob("session-*.json")
    return json.loads(path.read_text())


def _kept_every_arm(rec: dict, arms: set[str]) -> None:
    assert rec["cancelled"] is True and rec["reps"] >= 1, (rec["cancelled"], rec["reps"])
    assert {a["arm"] for a in rec["arms"] if a["samples"]} == arms, [(a["arm"], len(a["samples"])) for a in rec["arms"]]


def test_sigterm_to_sweep_after_a_repetition_writes_the_record_marked_cancelled(tmp_path):
    proc = Proc("sweep", "--widths", "2,4", "-n", "100", "--max-tokens", "16", "--record-dir", str(tmp_path))
    code = _stop_after_first_repetition(proc, signal.SIGTERM)
    stderr = proc.text("stderr")
    assert code == 130 and "Traceback" not in stderr, stderr[-2000:]
    _kept_every_arm(_record(tmp_path), {"classic", "w2", "w4"})
    assert "record: " in proc.text("stdout") and "cancelled" in proc.text("stdout")
    # the signal it took is named (a tryout's SIGTERM read "Ctrl-C again quits now")
    assert "(SIGTERM; a second signal quits now)" in stderr and "Ctrl-C" not in stderr.split("stopping")[-1]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_a_served_sweep_after_a_repetition_writes_the_levels_record(tmp_path, sig):
    proc = Proc("sweep", "--path", "mlx-lm-server", "--widths", "2,4", "-n", "100", "--max-tokens", "8",
                "--record-dir", str(tmp_path))
    code = _stop_after_first_repetition(proc, sig)
    stderr = proc.text("stderr")
    assert code == 130 and "Traceback" not in stderr, stderr[-2000:]
    _kept_every_arm(_record(tmp_path), {"classic", "w2", "w4"})
    pids = _pids(stderr)
    assert len(pids) == 3 and _gone(pids.values()), [p for p in pids.values() if _alive(p)]


def test_sigterm_to_costcurve_prints_the_passes_it_finished(tmp_path):
    proc = Proc("costcurve", "--rows", "1-8", "--repeats", "400", "--context", "32")
    code = _stop_after_first_repetition(proc, signal.SIGTERM, r"measuring: \d+/\d+ forwards")
    out = proc.text("stdout")
    assert code == 130 and "Traceback" not in proc.text("stderr"), proc.text("stderr")[-2000:]
    assert "cancelled: " in out and "repeats per row count were measured" in out and "8 rows" in out, out


def test_sigterm_to_check_measure_writes_the_record_and_reports_the_cancel(tmp_path):
    p = tmp_path / "profile.toml"
    p.write_text('schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                 'note = "what --measure re-measures"\n')
    rec = tmp_path / "rec"
    proc = Proc("check", "--measure", "--profile", str(p), "-n", "100", "--max-tokens", "16",
                "--record-dir", str(rec), "--json")
    code = _stop_after_first_repetition(proc, signal.SIGTERM, r"measure .*\[rep\] .*repetition 1 done")
    assert code == 130 and "Traceback" not in proc.text("stderr"), proc.text("stderr")[-2000:]
    _kept_every_arm(_record(rec), {"classic", "w4"})
    doc = json.loads(proc.text("stdout"))
    measured = [c for c in doc["checks"] if c["category"] == "measure"]
    assert doc["exit_code"] == 130 and len(measured) == 1
    assert measured[0]["status"] == "inconclusive" and "cancelled" in measured[0]["detail"]
    assert measured[0]["figures"]["record"] == str(next(rec.glob("session-*.json")))
