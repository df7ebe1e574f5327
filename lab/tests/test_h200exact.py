"""lab/h200exact.sh (the exact path and the real models in one H200 lease), run on this CPU with a
stub python3 that records its calls: the steps' order and flags, training in the background before
anything timed, a deadline's skips, and the wait verb's tarball."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from lab.tests.stubbed import run_stubbed

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "lab" / "h200exact.sh"

STUB = r"""#!/bin/sh
echo "$*" >> "$CALLS"
case "$*" in
  *lab.gguf_convert*)
    out=$(echo "$*" | awk '{print $4}'); mkdir -p "$out"; echo '{}' > "$out/config.json" ;;
  *lab.build_gpu*)
    mkdir -p "$PAIR/target-4bit" "$PAIR/target-bf16" "$PAIR/drafter"
    echo '{}' > "$PAIR/target-4bit/config.json"; echo '{}' > "$PAIR/build.json" ;;
  *) echo '{}' ;;
esac
"""


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return run_stubbed(SCRIPT, tmp_path, STUB, *args, timeout=120, **{"GGUF": str(tmp_path / "model.gguf"), **env})


def _calls(tmp_path: Path) -> list[str]:
    return [c for c in (tmp_path / "calls").read_text().splitlines() if "-m" in c.split()]


def test_the_lease_converts_probes_trains_then_measures_on_the_exact_path(tmp_path):
    p = _run(tmp_path, "run", STEPS="convert,edits,train,chat,models,model,served,mixed,pair5b,stock,ops")
    assert p.returncode == 0, p.stderr
    calls = _calls(tmp_path)
    mods = [c.split()[1] for c in calls]
    assert mods[:4] == ["lab.gguf_convert"] * 4
    converts = calls[:4]
    assert "--variant native --scales-dtype float16" in converts[0]  # the GPU computes in f16 there
    assert all("--scales-dtype bfloat16" in c for c in converts[1:])
    sweeps = [c for c in calls if c.split()[1] == "blockwidth"]
    assert all("--exact" in c for c in sweeps)
    chat = next(c for c in sweeps if "records-smol-lookup-chat " in c + " ")
    assert "--workload chat" in chat and "--kind lookup" in chat and "--exact auto" in chat
    served = next(c for c in sweeps if "--path mlx-lm-server" in c)
    assert "--exact on" in served and "--concurrency 1,4" in served and "--workload chat" in served
    edits = next(c for c in sweeps if "records-smol-lookup-edits " in c + " ")
    assert "--workload lab/prompts/edits.jsonl" in edits and "--exact auto" in edits and "--sequential" in edits
    assert "--save --profile" in edits and "-n 3 " in edits
    stock = next(c for c in sweeps if "records-smol-lookup-chat-stock" in c)
    assert "--exact off" in stock  # the stock path beside it, for contrast
    # nothing timed while the training runs: the edits and the served A/B before it starts (on
    # an idle GPU, first, since the last leases lost them to the host going back), the rest after
    build = next(i for i, c in enumerate(calls) if "lab.build_gpu" in c)
    timed = [i for i, c in enumerate(calls) if c.split()[1] == "blockwidth"]
    assert calls.index(edits) < calls.index(served) < build < min(i for i in timed if i > build)
    r = tmp_path / "w" / "exact"
    log = (r / "run.log").read_text()
    assert log.index("served: rc") < log.index("train: the")
    assert log.index("train: done") < log.index("smol-lookup-chat: start")
    assert any("lab.probe_exact models" in c and "--target random:gemma3-270m" in c for c in calls)
    assert any("lab.probe_exact ops" in c for c in calls) and (r / "done").is_file()
    w = _run(tmp_path, "wait", "1")
    assert w.returncode == 0 and "exact: done" in w.stdout
    with tarfile.open(tmp_path / "out" / "exact.tgz") as tar:
        assert "exact/run.log" in tar.getnames()


def test_a_step_past_the_deadline_is_skipped_and_said(tmp_path):
    p = _run(tmp_path, "run", STEPS="convert,ops", DEADLINE="60", OPS_LIMIT="200")
    assert p.returncode == 0, p.stderr
    log = (tmp_path / "w" / "exact" / "run.log").read_text()
    assert "ops: skipped" in log and not any("lab.probe_exact ops" in c for c in _calls(tmp_path))


def test_the_stall_step_stops_after_the_way_it_ran_when_that_returns(tmp_path):
    p = _run(tmp_path, "run", STEPS="convert,stall")
    assert p.returncode == 0, p.stderr
    probes = [c for c in _calls(tmp_path) if "lab.probe_exact models" in c]
    assert len(probes) == 1 and "--widths 5-8" in probes[0] and "--probe-repeats 2" in probes[0]
    log = (tmp_path / "w" / "exact" / "run.log").read_text()
    assert "stall-STALL-as-run: start (limit 300 s)" in log and "stall: none as run" in log


def test_a_stall_as_it_ran_is_probed_two_more_ways_with_stacks_dumped(tmp_path):
    stalls = STUB.replace("case \"$*\" in", 'case "$*" in\n  *--probe-repeats*) [ "$STALL" = as-run ] && exit 124; echo ok ;;', 1)
    p = run_stubbed(SCRIPT, tmp_path, stalls, "run", timeout=120, GGUF=str(tmp_path / "model.gguf"),
                    STEPS="convert,stall")
    assert p.returncode == 0, p.stderr
    probes = [c for c in _calls(tmp_path) if "lab.probe_exact models" in c]
    assert len(probes) == 3 and all("--widths 5-8" in c and "--probe-repeats 2" in c and "--dump-after 30" in c
                                    for c in probes)
    log = (tmp_path / "w" / "exact" / "run.log").read_text()
    # the first way outlasts the 190 s the eval took when it ran; the other two are shorter
    assert "stall-STALL-as-run: rc 124" in log and "stall-CUDA_LAUNCH_BLOCKING-1: start (limit 120 s)" in log
    for name in ("MLX_USE_CUDA_GRAPHS-0", "CUDA_LAUNCH_BLOCKING-1"):
        assert f"stall-{name}: rc 0" in log


def test_the_5b_pair_runs_first_after_training_at_n_3_with_lookup_and_its_drafter(tmp_path):
    built = STUB.replace('echo \'{}\' > "$PAIR/build.json"', 'echo \'{}\' > "$PAIR/build.json"; echo \'{}\' > "$PAIR/drafter/config.json"')
    p = run_stubbed(SCRIPT, tmp_path, built, "run", timeout=120, GGUF=str(tmp_path / "model.gguf"),
                    STEPS="convert,train,pair5b,chat5b,chat,served")
    assert p.returncode == 0, p.stderr
    calls = _calls(tmp_path)
    build = next(i for i, c in enumerate(calls) if "lab.build_gpu" in c)
    sweeps = [c for c in calls[build:] if c.split()[1] == "blockwidth"]  # the served A/B ran before it
    names = [next(a for a in c.split() if "/records-" in a).rsplit("records-", 1)[1] for c in sweeps]
    assert names[:3] == ["pair5b-4bit-lookup-mixed", "pair5b-4bit-lookup-chat", "pair5b-4bit-drafter-mixed"]
    assert all("-n 3 " in c and "--exact auto" in c for c in sweeps[:3])
    assert "--kind lookup" in sweeps[0] and "--draft" in sweeps[2]
    assert not any("--target " in c and "target-bf16" in c for c in _calls(tmp_path))  # models5b not asked
