"""lab/h200round.sh (one H200 lease's steps, detached, with a deadline), run on this CPU with a stub
python3 that records its calls: the steps' order and flags, the deadline's skips, the pairless
stop, and the ``wait`` verb's tarball."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from lab.tests.stubbed import run_stubbed

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "h200round.sh"

STUB = r"""#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  *lab.build_gpu*)
    [ -n "$NO_PAIR" ] && exit 1
    mkdir -p "$PAIR/target-4bit"; echo '{}' > "$PAIR/target-4bit/config.json"
    echo '{"shape": "tiny"}' > "$PAIR/build.json"; echo '[]' > "$PAIR/prompts.json" ;;
  *read_prompts*) printf 'the last prompt' ;;
  *) echo '{}' ;;
esac
"""


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run_stubbed(SCRIPT, tmp_path, STUB, *args, timeout=60, **env)


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


def test_every_step_runs_in_its_order_with_its_flags(tmp_path):
    p = _run(tmp_path, "run")
    assert p.returncode == 0, p.stderr
    calls = [c for c in _calls(tmp_path) if "-m" in c.split()]
    # most needed first: the served path, then the 4-bit control beside the kernel (2026-12-02b)
    assert [c.split()[1] for c in calls] == ["lab.build_gpu", "lab.served_gpu", "blockwidth",
                                             "blockwidth", "blockwidth", "blockwidth"]
    build, served, stock, qmv, last, workload = calls
    assert "--shape 5b" in build and "--target-seconds 90" in build
    assert "--widths 2,3,4,5,6,7,8" in qmv and "--verify-linear qmv" in qmv and "target-4bit" in qmv
    assert "--workload mixed" in workload and "--widths auto,4,8,12" in workload and "target-bf16" in workload
    assert "--widths 4,8" in served
    assert "--verify-linear stock" in stock and "--widths 2,4,8" in stock
    assert "prompt-last.txt" in last
    r = tmp_path / "w" / "round"
    assert (r / "done").is_file() and (r / "build" / "build.json").is_file()
    assert (r / "prompt-last.txt").read_text() == "the last prompt"
    # a step's stdout is its JSON alone: the log lines go to round.log and stderr
    assert (r / "qmv-4bit-p0.json").read_text() == "{}\n"


def test_a_step_that_would_pass_the_deadline_is_skipped_and_said(tmp_path):
    p = _run(tmp_path, "run", STEPS="build,qmv,workload", DEADLINE="200", BUILD_LIMIT="100")
    assert p.returncode == 0, p.stderr
    log = (tmp_path / "w" / "round" / "round.log").read_text()
    assert "workload-bf16: skipped" in log and "qmv-4bit-p0: rc 0" in log
    assert not any("--workload" in c for c in _calls(tmp_path))


def test_no_pair_stops_the_round_and_says_so(tmp_path):
    p = _run(tmp_path, "run", NO_PAIR="1")
    assert p.returncode == 1
    r = tmp_path / "w" / "round"
    assert "no pair in" in (r / "round.log").read_text() and (r / "done").is_file()
    assert not any("-m blockwidth " in c for c in _calls(tmp_path))


def test_wait_packs_what_the_round_has_so_far(tmp_path):
    _run(tmp_path, "run", STEPS="build,qmv")
    p = _run(tmp_path, "wait", "5")
    assert p.returncode == 0 and p.stdout.startswith("round: done")
    with tarfile.open(tmp_path / "out" / "round.tgz") as t:
        names = t.getnames()
    assert "round/round.log" in names and "round/qmv-4bit-p0.json" in names


def test_an_unknown_verb_is_refused(tmp_path):
    p = _run(tmp_path, "start")
    assert p.returncode == 2 and "unknown verb start" in p.stderr
