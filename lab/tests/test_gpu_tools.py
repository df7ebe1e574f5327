"""The tools behind the H200 evidence (lab.soak, lab.coldcheck, lab.bench --fresh),
run on the demo pair on this CPU so that what the GPU host runs is known to work."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from blockwidth.engine import demo
from tests.conftest import ROOT


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)


def test_soak_counts_rounds_across_decodes_and_reports_survival():
    out = _run("lab.soak", "--target", str(demo.target("bf16")), "--draft", str(demo.DRAFTER),
               "--rounds", "60", "--width", "3", "--verify-attention", "plain", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["survived"] and res["error"] is None
    assert res["rounds_done"] == 60 and res["verify_attention"] == "plain"
    assert res["median_ms_per_round_by_250"]


def test_coldcheck_sets_a_session_beside_fresh_processes(tmp_path):
    dest = tmp_path / "cold.json"
    out = _run("lab.coldcheck", "--target", str(demo.target("bf16")), "--draft", str(demo.DRAFTER),
               "--widths", "2", "--n", "1", "--max-tokens", "12", "--fresh-runs", "2",
               "--out", str(dest))
    assert out.returncode == 0, out.stderr
    res = json.loads(dest.read_text())
    assert [a["arm"] for a in res["arms"]] == ["classic", "w2"]
    for arm in res["arms"]:
        assert arm["error"] is None and arm["fresh_process_tok_s"] > 0
        assert arm["fresh_over_session"] is not None and len(arm["fresh_runs_tok_s"]) == 2


def test_bench_fresh_uses_a_new_prompt_each_repetition(tmp_path):
    prompts = tmp_path / "p.json"
    prompts.write_text(json.dumps(["def f(x):\n    return", "class A:\n    def", "import os\nimport"]))
    dest = tmp_path / "bench.json"
    out = _run("lab.bench", "--prompts-file", str(prompts), "--fresh", "--n", "2", "--tokens", "8",
               "--widths", "2", "--json-out", str(dest))
    res = json.loads(dest.read_text())
    assert res["fresh"] and set(res["modes"]) == {"classic", "w2"}
    assert all(m["identical"] for m in res["modes"].values()), out.stdout  # same arithmetic on a CPU
    assert len(res["modes"]["w2"]["ratios"]) == 2
    # which arm ran first on each prompt, and each run's seconds: the order effect is visible
    assert res["engine_first"] == [True, False]
    for m in res["modes"].values():
        assert len(m["engine_s"]) == len(m["mlx_lm_s"]) == 2 and min(m["engine_s"] + m["mlx_lm_s"]) > 0
    assert out.stdout.count("order: first in its pair engine ") == 2, out.stdout


@pytest.mark.lease
def test_the_gpu_probe_runs_on_a_cpu_and_says_what_it_could_not_run(tmp_path):
    """lab.probe_gpu (the evidence behind the CUDA choices) on a tiny random model:
    every combination asked for is timed or, where this backend lacks a kernel (gather_mm
    in bf16 on a CPU), recorded as an error instead of stopping the probe."""
    from lab import probe_gpu

    out = tmp_path / "probe.json"
    assert probe_gpu.main(["--out", str(out), "--shape", "tiny", "--skip-8b", "--rows", "1,2",
                           "--repeats", "1", "--attentions", "plain,vector", "--streams", "default",
                           "--linears", "stock,gather"]) == 0
    res = json.loads(out.read_text())
    for q in ("bf16", "4bit"):
        cell = res[q]["vector/default/stock/engine"]
        assert set(cell) == {"1", "2"} and all(v["median_ms"] > 0 for v in cell.values())
    assert str(res["bf16"]["plain/default/gather/forward"]).startswith("error")  # CPU gather_mm: f32 only
    assert set(res["linear_micro"]) >= {"stock 1", "stock 2"}


def test_the_loop_probe_times_each_arm_and_picks_only_a_setting_that_wins_every_pass(tmp_path):
    """lab.probe_loop: the engine's own loops on a tiny random model in this process
    (every arm timed; the model is bf16, so on a CPU the gather arms route nothing and time
    the stock projections: engine.linear routes float32 only here), and its pick rule: a
    setting replaces ``default`` only when its modelled ms per token is 10 % lower in every pass."""
    from lab import probe_loop

    r = probe_loop.one("tiny", False, [4], 8, 1, ("", "gather", "gv", "gemv"))
    assert set(r["arms"]) == {"classic", "w4", "w4gather", "w4gv", "w4gemv"}
    assert r["arms"]["w4gemv"]["linear_routed_calls"] == 0  # the kernel is CUDA's
    assert r["arms"]["classic"]["step_ms"] > 0 and r["arms"]["w4"]["round_ms"] > 0

    def res(round_ms):
        return {"arms": {"classic": {"step_ms": 1.0}, "w4": {"round_ms": round_ms}}}

    assert probe_loop.pick({"default": [res(10), res(10)], "a": [res(8), res(8.5)]}) == "a"
    assert probe_loop.pick({"default": [res(10), res(10)], "a": [res(5), res(9.5)]}) == "default"
    assert probe_loop.pick({"default": [res(10)], "a": [{"error": "timed out"}]}) == "default"

    def arms(stock, **variants):
        """A pass with w4 at ``stock`` round ms and w4<variant> at each given one."""
        r = res(stock)
        r["arms"].update({f"w4{v}": {"round_ms": ms} for v, ms in variants.items()})
        return r

    assert probe_loop.pick_linear({"default": [arms(10, gather=8), arms(10, gather=8.9)]}) == "gather"
    assert probe_loop.pick_linear({"default": [arms(10, gather=8), arms(10, gather=9.5)]}) == "stock"
    assert probe_loop.pick_linear({"default": [res(10)]}) == "stock"  # gather not timed

    def lin(stock, gather, gemv, **more):
        return arms(stock, gather=gather, gemv=gemv, **more)

    # gemv alone wins every pass; both win and the faster median is picked, whichever it is
    assert probe_loop.pick_linear({"default": [lin(10, 9.5, 8), lin(10, 9.5, 8.5)]}) == "gemv"
    assert probe_loop.pick_linear({"default": [lin(10, 7, 8.5), lin(10, 7, 8.5)]}) == "gather"
    assert probe_loop.pick_linear({"default": [lin(10, 8.5, 7), lin(10, 8.5, 7)]}) == "gemv"
    assert probe_loop.pick_linear({"default": [lin(10, 9.5, 8), lin(10, 9.5, 9.5)]}) == "stock"
    # gemv picked, no gemv + vector arm timed: the attention stays auto
    assert probe_loop.pick_attention({"default": [lin(10, 8.5, 7), lin(10, 8.5, 7)]}) == "auto"
    # vector is judged beside the picked route: gemv + vector against gemv
    def gemvv(*ms):
        return {"default": [lin(10, 9.5, 8, gemvv=m) for m in ms]}

    assert probe_loop.pick_attention(gemvv(6.5, 7)) == "vector"
    assert probe_loop.pick_attention(gemvv(6.5, 7.5)) == "auto"

    # ... and gather + vector against gather
    def gv(gather, *ms):
        return {"default": [arms(10, gather=gather, gv=m) for m in ms]}

    assert probe_loop.pick_attention(gv(8, 6, 7)) == "vector"
    assert probe_loop.pick_attention(gv(8, 6, 7.5)) == "auto"
    assert probe_loop.pick_attention(gv(9.5, 6, 6)) == "auto"


def test_the_gpu_tools_refuse_an_unknown_verify_linear_before_loading_a_model(capfd):
    """A misspelt --verify-linear used to load the pair, run classic and then stop in a
    ValueError traceback at the first speculative run; now: exit 2, one line naming it. Each
    tool's main() in this process (argparse's refusal leaves through SystemExit, as in one)."""
    import importlib

    for tool in ("lab.bench", "lab.soak", "lab.coldcheck"):
        main = importlib.import_module(tool).main
        capfd.readouterr()
        with pytest.raises(SystemExit) as e:
            main(["--target", "no-such-target", "--verify-linear", "cublas"])
        err = capfd.readouterr().err
        assert e.value.code == 2, (tool, err)
        assert "--verify-linear: invalid choice: 'cublas'" in err.splitlines()[-1], tool


BAD_PROMPT_LISTS = {  # file text -> what the one line must say
    None: "no such file",
    "{not json": "not valid JSON",
    '{"prompts": ["a"]}': "an object; expected a non-empty JSON list",
    "[]": "an empty list",
    '["def f():", 3]': "item 1 (from 0) is a number, not a string",
    '[{"prompt": "a"}]': "item 0 (from 0) is an object, not a string",
    '["a", ""]': "item 1 (from 0) is an empty string",
}


@pytest.mark.parametrize("text", list(BAD_PROMPT_LISTS))
def test_bench_refuses_a_bad_prompts_file_in_one_line_before_loading(tmp_path, capsys, text):
    """bench read --prompts-file with json.loads and no checks: a missing file or bad JSON
    stopped in a traceback, and a list of objects or an empty one was measured (or failed)
    after the pair loaded. The target does not exist: a file past the check fails on it."""
    from lab import bench

    f = tmp_path / "prompts.json"
    if text is not None:
        f.write_text(text)
    got = bench.main(["--target", str(tmp_path / "no-target"), "--prompts-file", str(f)])
    err = capsys.readouterr().err.strip().splitlines()
    assert got == 2 and len(err) == 1, err
    assert err[0].startswith(f"--prompts-file {f}: ") and BAD_PROMPT_LISTS[text] in err[0], err


@pytest.mark.parametrize("text, index, needle", [
    (None, 0, "--prompt-file {f}: no such file"),
    ("[1]", 0, "--prompt-file {f}: item 0 (from 0) is a number"),
    ('["a", "b"]', 2, "--prompt-index 2: {f} holds 2 prompts; give 0 to 1"),
    ('["a", "b"]', -1, "--prompt-index -1: {f} holds 2 prompts; give 0 to 1"),
    ("", 0, "--prompt-file {f}: empty"),
    ("def f():", 1, "--prompt-index 1: {f} is one prompt (plain text, not a JSON list)"),
])
def test_coldcheck_refuses_a_bad_prompt_file_or_index_in_one_line_before_loading(tmp_path, capsys,
                                                                                   text, index, needle):
    """coldcheck's --prompt-file may be build_gpu's prompts.json with --prompt-index: an index
    past its end (or below 0, which Python counted from the end) stopped in an IndexError, or
    took another prompt, after the session's pair had loaded."""
    from lab import coldcheck

    f = tmp_path / "prompts.json"
    if text is not None:
        f.write_text(text)
    got = coldcheck.main(["--target", str(tmp_path / "no-target"), "--prompt-file", str(f),
                          "--prompt-index", str(index)])
    err = capsys.readouterr().err.strip().splitlines()
    assert got == 2 and err == [err[0]] and err[0].startswith(needle.format(f=f)), err


_FAIL = "#!/bin/sh\nexit 1\n"  # a stub python3: every step of the pipeline fails at once


def _samplers(work: Path) -> list[int]:
    """Live ``h200pipe.sh sampler`` processes whose $WORK is ``work`` (start runs one detached,
    in its own session, and the pipeline's end stops it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            # bytes: another test's process may hold an argument that is not UTF-8 (xdist runs them side by side)
            if not proc.name.isdigit() or b"h200pipe.sh\0sampler" not in (proc / "cmdline").read_bytes():
                continue
            if f"WORK={work}\0".encode() not in (proc / "environ").read_bytes():
                continue
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(proc.name))
        except OSError:  # gone meanwhile, or another user's
            continue
    return found


def _pipe(tmp_path: Path, verb: str, stub: str = _FAIL, wait_s: int = 100, wait_timeout: int = 120,
          drop: tuple[str, ...] = (), **extra: str) -> str:
    """lab/h200pipe.sh ``verb`` (``pipeline``, or ``start`` and then ``wait wait_s``) with
    ``stub`` as python3 and $WORK in tmp_path/work, ``extra`` in its environment and ``drop``
    taken out of it; each call must succeed. Returns pipeline.log."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "python3").write_text(stub)
    (bin_ / "python3").chmod(0o755)
    work = tmp_path / "work"
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "WORK": str(work), **extra}
    for k in drop:
        env.pop(k, None)
    try:
        out = subprocess.run(["bash", "lab/h200pipe.sh", verb], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        if verb == "start":
            # the pipeline runs detached; with every step failing at once it ends within moments
            wait = subprocess.run(["bash", "lab/h200pipe.sh", "wait", str(wait_s)], cwd=ROOT,
                                  env={**env, "OUT": str(tmp_path)}, capture_output=True, text=True,
                                  timeout=wait_timeout)
            assert wait.returncode == 0, wait.stderr
            # start's sampler ran, and the pipeline's end stopped it (its SIGTERM is sent before
            # "pipeline done"; a few seconds for the loop's processes to go)
            assert (work / "results" / "cpu_mhz.log").exists()
            for _ in range(50):
                if not _samplers(work):
                    break
                subprocess.run(["sleep", "0.2"])
            assert not _samplers(work), "the pipeline's end left its sampler running"
    finally:
        # a test that failed before the pipeline's end must not leave a sampler looping forever
        for pid in _samplers(work):
            os.killpg(pid, 15)
    return (work / "results" / "pipeline.log").read_text()


def test_the_h200_pipeline_falls_back_to_width_4_when_a_sweep_names_no_best(tmp_path):
    """lab/h200pipe.sh with every Python step failing (a stub python3 that exits 1):
    no sweep record, so no best width; the cold check and the bench must still get width 4,
    not an empty --widths, and the pipeline must run to its end."""
    work = tmp_path / "work"
    log = _pipe(tmp_path, "pipeline")
    assert "coldcheck bf16 width 4 with " in log, log
    assert "bench bf16 widths 4 (" in log, log
    # the save step still runs, and with no profile written checks nothing
    assert "sweep save bf16 prompt 6, --save to gpu-profile.toml" in log and "no profile saved: no check" in log, log
    assert (work / "pipeline.done").exists()


def test_the_h200_pipeline_on_one_gpu_waits_for_no_side_chain_an_earlier_run_started(tmp_path):
    """``start`` on one GPU on a host where an earlier two-GPU run left results/side.out: the
    pipeline (and ``wait``) read side.out as "a side chain runs" and would wait SIDE_WAIT (900 s)
    for a side.done that start has removed; start removes the stale side.out too."""
    work = tmp_path / "work"
    (work / "results").mkdir(parents=True)
    (work / "results" / "side.out").write_text("an earlier run's side chain\n")
    log = _pipe(tmp_path, "start", wait_s=60, GPUS="1")
    assert "pipeline done" in log and "build B not done" not in log, log


def test_the_h200_pipeline_does_not_take_an_earlier_runs_pick_when_the_loop_probe_fails(tmp_path):
    """``start`` with a failing probe_loop (stub python3) on a host where an earlier run left
    pick.env: the detached pipeline must run under MLX's defaults, not the stale settings."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "pick.env").write_text("export MLX_STALE_PICK=1\n")
    log = _pipe(tmp_path, "start", PROBE_LOOP="1")
    assert "pipeline done" in log, log
    assert "MLX_STALE_PICK" not in log, log


def _gpu_records():
    # the H200's folders only: lab/evidence also keeps CPU evidence (cpu-*), which is no GPU record
    root = ROOT / "lab" / "evidence"
    out = []
    for p in sorted(q for d in root.glob("h200-*") for q in d.rglob("*.json")):
        data = json.loads(p.read_text())
        if isinstance(data, dict) and data.get("kind") == "ab-session":
            out.append(p)
    return out


def test_the_committed_gpu_records_are_data_and_the_table_follows_them():
    """The H200 records are data the tests read. Every committed A/B record loads,
    was made on CUDA, re-derives its verdicts from its own samples (a width 'wins' only if
    its slowest run beat classic's fastest), and policy/table.py holds a cuda row for a
    (kind, compute capability, quantization scheme) only where some record has a win."""
    from blockwidth.engine.session.record import load
    from blockwidth.policy.device import Backend
    from blockwidth.policy.table import TABLE

    records = _gpu_records()
    assert len(records) >= 6  # two sweeps a session, DFlash sweeps on the demo pair
    won = set()
    for path in records:
        r = load(path)
        dev = r["host"]["device"]
        assert dev["backend"] == "cuda" and dev["compute_capability"], path.name
        classic = next(a for a in r["arms"] if a["width"] is None)
        for arm in r["arms"]:
            if arm["width"] is None or not arm["decode_tok_s"]:
                continue
            disjoint = arm["decode_tok_s"][0] > classic["decode_tok_s"][2]
            if arm["verdict"] == "wins":
                assert disjoint and arm["identity"]["identical_bytes"], (path.name, arm["arm"])
                won.add((r["pair"]["drafter_kind"], dev["compute_capability"],
                         r["pair"]["target_quantization"]["scheme"]))
            if not disjoint:
                # anything but a win ("below min gain": the workloads' verdict, decided and not worth it)
                assert arm["verdict"] in ("undecided", "slower", "not measured", "below min gain",
                                          "faster, output differs"), (path.name, arm["arm"])
    for row in TABLE:
        if row.backend is Backend.CUDA and row.compute_capability == "9.0":
            assert (row.drafter_kind.value, "9.0", row.scheme.value) in won, row
            # the row's record is one of these, and the width it names won there
            r = load(ROOT / row.record)
            arm = next(a for a in r["arms"] if a["width"] == row.width)
            assert arm["verdict"] == "wins" and r["pair"]["target_quantization"]["scheme"] == row.scheme.value
            assert row.byte_identical is arm["identity"]["identical_bytes"] is True


def test_each_h200_build_json_is_committed_and_the_builds_table_quotes_it():
    """docs/gpu-builds.md's table of the H200 builds (the README's until the README became the
    manual) quotes each build's build.json (its acceptance at
    width 4 on the held-out prompts). .gitignore's bare ``build/`` ignored every evidence folder's
    build/, so none of them was committed and no reader could check a figure: the folders are
    data, and the table's kept column must be what they hold, build by build."""
    import re

    # a lease that built no pair (probes only), or whose build stopped before its build.json,
    # says so on its README's first line, and has no row
    def probes_only(d):
        readme = d / "README.md"
        first = readme.read_text().partition("\n")[0] if readme.exists() else ""
        return "no pair built" in first or ("no build.json" in first and not (d / "build" / "build.json").exists())

    evidence = [d for d in sorted((ROOT / "lab" / "evidence").glob("h200-*")) if not probes_only(d)]
    kept = []
    for d in evidence:
        acc = json.loads((d / "build" / "build.json").read_text())["acceptance_held_out_width4"]
        kept.append((acc["bf16"]["pooled"], acc["4bit"]["pooled"]))
    rows = re.findall(r"^\| \d+\w\w, 1[12]-\d\d \d\d:\d\d \|[^|]*\| \**([\d.]+) / ([\d.]+)\** \|",
                      (ROOT / "docs" / "gpu-builds.md").read_text(), re.M)
    assert [(float(a), float(b)) for a, b in rows] == kept
    # and git keeps them (the files above may be a checkout's ignored leftovers)
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *(str(d / "build" / "build.json") for d in evidence)],
                             cwd=ROOT, capture_output=True, text=True)
    assert ignored.returncode != 0 and not ignored.stdout, ignored.stdout


# A stub python3 for the pipeline: every step fails; with TARGET_FIRST=1 GPU 0's build
# (build_gpu --out $WORK/gpupair) writes its target's config.json first, as a build that dies
# after its target does; with TARGET_FIRST=1b only the 1B fallback build does.
_PIPE_STUB = """#!/bin/sh
echo "$@" >> "$WORK/calls"
[ "$2" = lab.probe_rows ] && [ "$ROWS_OK" = 1 ] && exit 0
if [ "$2" = lab.build_drafters ] && [ "$DFLASH_OK" = 1 ]; then
    prev=; for a in "$@"; do [ "$prev" = --out ] && out=$a; prev=$a; done
    mkdir -p "$out/dflash" && echo {} > "$out/dflash/config.json"
fi
if [ "$2" = lab.build_gpu ] && [ "$4" = "$WORK/gpupair" ]; then
    case "$TARGET_FIRST $*" in
    "1 "* | "1b "*"--shape 1b"*) mkdir -p "$4/target-4bit" && echo {} > "$4/target-4bit/config.json" ;;
    esac
fi
exit 1
"""


@pytest.mark.lease
@pytest.mark.parametrize("target_first", ["0", "1", "1b"])
def test_the_h200_pipeline_on_two_gpus_distils_build_b_for_this_runs_target(tmp_path, target_first):
    """``GPUS=2 start`` (stub python3, every step failing): GPU 1 waits for GPU 0's target, not
    one a reused host left in $WORK (start removes the pairs). When build A writes its target,
    build B runs on it; when build A fails before that, it is followed by a build of the 1B
    pair on GPU 0, and GPU 1 waits for that one's target, at the default TARGET_WAIT of 900 s:
    with one, build B distils a 1B drafter for it (a 3.5b one is refused for a 1B target);
    without, GPU 1 stops as soon as the builds have ended (build.rc) and runs no build B, so
    the sweeps do not wait on it. The pipeline falls back to pair A when B has nothing to
    compare, and sweeps bf16 (all widths), then 4-bit; GPU 1 probed the rows kernel first,
    and its failure leaves no rows sweep."""
    work = tmp_path / "work"
    stale = work / "gpupair" / "target-4bit" / "config.json"
    stale.parent.mkdir(parents=True)
    stale.write_text('{"stale": true}')
    log = _pipe(tmp_path, "start", stub=_PIPE_STUB, wait_timeout=160, drop=("TARGET_WAIT",), GPUS="2",
                TARGET_FIRST=target_first, SHAPE="3.5b")
    assert "pipeline done" in log, log
    if target_first == "0":
        assert "side: no target from GPU 0 (build rc 1); no build B" in log, log
        assert "side: build B" not in log, log
    else:
        shape = "1b" if target_first == "1b" else "3.5b"
        assert f"side: build B (--shape {shape} --target-from {work / 'gpupair'} --drafter-labels all" in log, log
    assert "pair for the sweeps: A (" in log, log
    order = [log.index(f"sweep {s}\n") for s in ("model bf16", "model 4bit")]
    assert order == sorted(order), log
    assert "sweep gemvv" not in log and "sweep rows" not in log, log  # GEMVV_ORDER: none; no rows.ok
    assert "probe_rows rc 1" in log, log
    calls = (work / "calls").read_text().splitlines()
    probe = next(i for i, c in enumerate(calls) if "lab.probe_rows" in c)
    assert f"--shape 3.5b --out {work / 'results' / 'probe_rows.json'}" in calls[probe], calls[probe]
    builds = [c.split() for c in (work / "calls").read_text().splitlines() if "lab.build_gpu" in c]
    shapes = [c[c.index("--shape") + 1] for c in builds]
    assert shapes == {"0": ["3.5b", "1b"], "1": ["3.5b", "3.5b"], "1b": ["3.5b", "1b", "1b"]}[target_first], builds
    assert ("building the 1b pair instead" in log) is (target_first != "1"), log
    # the sampler ran beside it (no nvidia-smi here: the host's lines only) and was stopped
    host = (work / "results" / "cpu_mhz.log").read_text().splitlines()
    assert host and all(" | cpu " in ln for ln in host), host[:3]
    n = len(host)
    time.sleep(2.5)
    assert len((work / "results" / "cpu_mhz.log").read_text().splitlines()) == n
    assert not stale.exists() or stale.read_text().strip() == "{}"  # this run's, not the stale one


@pytest.mark.lease
@pytest.mark.parametrize("gpus", ["1", "2"])
def test_the_h200_pipeline_sweeps_rows_first_when_its_probe_passed(tmp_path, gpus):
    """probe_rows passing (ROWS_OK in the stub) gives rows.ok: the rows bf16 sweep runs before
    the stock one, on GPU 1's probe with two GPUs or GPU 0's own with one. No sweep record (the
    stub writes none), so the rest keeps the stock attention and width 4."""
    work = tmp_path / "work"
    log = _pipe(tmp_path, "start", stub=_PIPE_STUB, wait_timeout=160, GPUS=gpus, TARGET_FIRST="1",
                ROWS_OK="1", TARGET_WAIT="5")
    assert "pipeline done" in log and "probe_rows rc 0" in log, log
    assert log.index("sweep rows bf16\n") < log.index("sweep model bf16\n") < log.index("sweep model 4bit\n"), log
    assert "verify attention from here: auto" in log, log
    assert "coldcheck bf16 width 4 with " in log and ", auto attention" in log, log
    calls = (work / "calls").read_text().splitlines()
    rows = [c for c in calls if "--record-dir" in c and "records-rows-bf16" in c]
    assert len(rows) == 1 and "--verify-attention rows" in rows[0], rows
    assert (work / "rows.ok").exists()


def test_the_h200_pipeline_on_one_gpu_probes_rows_on_the_shape_it_built(tmp_path):
    """On one GPU probe_rows runs after the build: a 3.5b build that left no target is followed
    by the 1b fallback, and the probe's verify times must be the 1B's, the pair the sweeps run
    on. It was given $SHAPE (3.5b) whatever was built."""
    work = tmp_path / "work"
    log = _pipe(tmp_path, "pipeline", stub=_PIPE_STUB, TARGET_FIRST="1b", SHAPE="3.5b")
    assert "building the 1b pair instead" in log, log
    assert "verify ms by attention; 1b)" in log, log
    calls = (work / "calls").read_text().splitlines()
    probe = [c for c in calls if "lab.probe_rows" in c]
    assert len(probe) == 1 and "--shape 1b " in probe[0], probe


# best_arm runs python3 too: "-" (its heredoc) goes to the real interpreter. Each sweep writes
# one record with classic at 100 tok/s and one width at the tok/s its label is given in the
# environment (ROWS_W / ROWS_TOKS, MODEL_W / MODEL_TOKS).
_RECORD_STUB = """#!/bin/sh
[ "$1" = - ] && exec {python} "$@"
echo "$@" >> "$WORK/calls"
case "$*" in
*lab.probe_rows*) exit 0 ;;
*lab.build_gpu*) mkdir -p "$4/target-4bit" && echo {{}} > "$4/target-4bit/config.json"; exit 0 ;;
esac
prev=; rd=
for a; do [ "$prev" = --record-dir ] && rd=$a; prev=$a; done
[ -n "$rd" ] || exit 1
case $rd in *records-rows-*) w=$ROWS_W t=$ROWS_TOKS ;; *) w=$MODEL_W t=$MODEL_TOKS ;; esac
mkdir -p "$rd"
echo '{{"arms": [{{"width": null, "decode_tok_s": [1, 100, 1]}}, {{"width": '$w', "decode_tok_s": [1, '$t', 1]}}]}}' > "$rd/r.json"
# sweep --save --profile F writes F, as a win's save would
prev=; for a; do [ "$prev" = --profile ] && [ "$*" != "${{*#*--save}}" ] && echo "schema = 1" > "$a"; prev=$a; done
exit 0
"""


@pytest.mark.parametrize("winner", ["rows", "model"])
def test_the_h200_pipeline_runs_the_rest_with_the_attention_of_the_better_sweep(tmp_path, winner):
    """With both bf16 sweeps recorded, the one whose best width did better over its classic
    names the attention of the rest: the bench (at that sweep's best width), the 4-bit sweep
    and the cold check (at the best width of the two sweeps, with that sweep's attention)."""
    work = tmp_path / "work"
    toks = {"rows": ("6", "130", "5", "110"), "model": ("6", "90", "5", "120")}[winner]
    log = _pipe(tmp_path, "pipeline", stub=_RECORD_STUB.format(python=sys.executable),
                SHAPE="3.5b", ROWS_W=toks[0], ROWS_TOKS=toks[1], MODEL_W=toks[2], MODEL_TOKS=toks[3],
                BW_VERIFY_ATTENTION="auto")
    va, w = ("rows", "6") if winner == "rows" else ("auto", "5")
    assert f"verify attention from here: {va}" in log, log
    calls = (work / "calls").read_text().splitlines()
    bench = [c for c in calls if "lab.bench" in c]
    assert len(bench) == 1 and f"--widths 4,{w} " in bench[0] and f"--verify-attention {va} " in bench[0], bench
    q4 = [c for c in calls if "records-model-4bit" in c]
    assert len(q4) == 1 and f"--verify-attention {va} " in q4[0], q4
    cold = [c for c in calls if "lab.coldcheck" in c]
    assert len(cold) == 1 and f"--widths {w} " in cold[0] and f"--verify-attention {va} " in cold[0], cold
    assert f"coldcheck bf16 width {w} with {work / 'gpupair' / 'drafter'}, {va} attention" in log, log
    # then a winner saved on a second prompt, and the saved profile re-measured by --check
    save = [c for c in calls if "records-save-bf16" in c]
    assert len(save) == 1 and "--save --profile" in save[0] and f"--verify-attention {va} " in save[0], save
    assert "--prompt-file " + str(work / "results" / "prompt-save.txt") in save[0], save
    check = [c for c in calls if "--check --measure" in c]
    assert len(check) == 1 and f"--profile {work / 'results' / 'gpu-profile.toml'} " in check[0], check
    assert "check --measure rc 1" in log, log  # the stub's exit without a --record-dir: logged


@pytest.mark.lease
def test_the_h200_side_chain_can_train_a_dflash_drafter_for_the_target_and_the_pipeline_sweeps_it(tmp_path):
    """GPUS=2 SIDE=dflash: GPU 1 runs no build B; once GPU 0's target is written it trains a
    DFlash drafter for it (build_drafters --pair, only dflash, bf16), whose weights move out of
    the results to $WORK/dflashpair, and the pipeline sweeps it after the model drafter's bf16
    sweep. Without a target, no DFlash drafter and no dflash sweep; a reused host's earlier
    drafter is not swept."""
    work = tmp_path / "work"
    stale = work / "dflashpair" / "config.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    log = _pipe(tmp_path, "start", stub=_PIPE_STUB, wait_timeout=160, GPUS="2", SIDE="dflash", SHAPE="3.5b",
                TARGET_FIRST="1", DFLASH_OK="1", TARGET_WAIT="30")
    assert "pipeline done" in log and "side: build B" not in log, log
    assert log.index("side: DFlash drafter for the target on GPU 1") < log.index("sweep model bf16\n"), log
    assert log.index("sweep model bf16\n") < log.index("sweep dflash bf16\n") < log.index("sweep model 4bit\n"), log
    calls = (work / "calls").read_text().splitlines()
    train = [c for c in calls if "lab.build_drafters" in c]
    assert len(train) == 1 and f"--pair {work / 'gpupair'} --out {work / 'results' / 'dflashpair'} --only dflash --targets bf16" in train[0], train
    sweep = [c for c in calls if "-m blockwidth sweep" in c and "records-dflash-bf16" in c]
    assert len(sweep) == 1 and f"--draft {work / 'dflashpair'} " in sweep[0], sweep
    assert (work / "dflashpair" / "config.json").exists() and not (work / "results" / "dflashpair" / "dflash").exists()
    # no target: no DFlash drafter, and the one the run above left is not swept
    for f in ("calls", "results/pipeline.log"):
        (work / f).unlink()
    log = _pipe(tmp_path, "start", stub=_PIPE_STUB, wait_timeout=160, GPUS="2", SIDE="dflash", SHAPE="3.5b",
                TARGET_FIRST="0", DFLASH_OK="1", TARGET_WAIT="30")
    assert "no DFlash drafter" in log and "sweep dflash" not in log, log


def test_the_h200_samplers_nvidia_smi_calls_only_query(tmp_path):
    """start's sampler asks nvidia-smi once whether the driver knows clocks_event_reasons.active,
    then samples every CLOCK_MS. It asked with "-c 1", which is not a count but --compute-mode 1,
    a device setting (on the seventh run that call failed, so gpu_clocks.csv has no reasons
    column): every call must be a query, and the column is there when the driver has it.
    Stubs: python3 fails every step once the sampler is sampling; nvidia-smi prints a row."""
    import re

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "nvidia-smi").write_text(
        '#!/bin/sh\necho "$@" >> "$WORK/smi_calls"\n'
        'case "$*" in *-lms*) while :; do echo "0, now, 1980 MHz"; sleep 0.2; done ;; esac\n'
        'echo "0, now, 1980 MHz"\n')
    (bin_ / "nvidia-smi").chmod(0o755)
    stub = ('#!/bin/sh\nfor i in $(seq 50); do grep -q -- -lms "$WORK/smi_calls" 2>/dev/null && break; '
            'sleep 0.1; done\nexit 1\n')
    log = _pipe(tmp_path, "start", stub=stub)
    assert "pipeline done" in log, log
    calls = (tmp_path / "work" / "smi_calls").read_text().splitlines()
    assert len(calls) == 2 and all(c.startswith("--query-gpu=") for c in calls), calls
    assert not any(re.search(r"(^| )-(c|pm|pl|ac|rac|lgc|rgc|e|r)( |$)|--compute-mode", c) for c in calls), calls
    header = (tmp_path / "work" / "results" / "gpu_clocks.csv").read_text().splitlines()[0]
    assert header.endswith(",clocks_event_reasons.active"), header


def test_the_h200_pipeline_stops_no_process_group_but_its_own_sampler(tmp_path):
    """The pipeline's end stops the sampler that start recorded in $WORK/sampler.pid. That file
    outlives a run on a reused host, where by the next run its number can name another process
    group: the pipeline killed that group (here a sleep standing for it) and left the stale
    file for the next start to kill again."""
    work = tmp_path / "work"
    work.mkdir()
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        (work / "sampler.pid").write_text(f"{other.pid}\n")
        log = _pipe(tmp_path, "pipeline")
        assert "pipeline done" in log, log
        assert other.poll() is None, "the pipeline killed a process group that was not its sampler"
        assert not (work / "sampler.pid").exists()
    finally:
        other.kill()
        other.wait()


@pytest.mark.lease
def test_the_h200_side_chain_waits_for_the_1b_fallback_build_before_training_on_it(tmp_path):
    """GPUS=2 MTP1B=1 start (stub python3, every step failing; the 1B fallback build takes a few
    seconds): build.rc tells GPU 1 that GPU 0's build has ended, and the MTP head trains on
    $WORK/gpupair after it. It was written before the fallback build, so the side chain started
    the MTP head on a pair the fallback was still writing."""
    stub = '#!/bin/sh\ncase "$*" in *"--shape 1b"*) sleep 8 ;; esac\nexit 1\n'
    log = _pipe(tmp_path, "start", stub=stub, GPUS="2", MTP1B="1", SHAPE="3.5b")
    assert "pipeline done" in log, log
    assert log.index("build 1b rc 1") < log.index("MTP head for the target"), log


def test_the_h200_pipeline_sweeps_no_earlier_runs_mtp_head(tmp_path):
    """On two GPUs the pipeline waits a while for the side chain's 1B MTP head, then sweeps
    $WORK/mtp1b: a head an earlier run left there (a reused host) must not be swept as this
    run's when the side chain has not finished (stub python3; no wait)."""
    work = tmp_path / "work"
    (work / "mtp1b").mkdir(parents=True)
    (work / "mtp1b" / "config.json").write_text("{}")
    log = _pipe(tmp_path, "pipeline", GPUS="2", MTP1B_WAIT="0")
    assert "sweep mtp" not in log and "no mtp sweep" in log, log
    assert "coldcheck bf16 width 4 with " in log and "mtp1b" not in log.split("coldcheck")[1], log


def test_best_arm_compares_record_dirs_and_skips_arms_without_figures(tmp_path):
    """gpu_lib.sh best_arm picks the cold check's (dir, width) by median over classic's median
    across the drafter kinds' newest records. An arm with no figures (not measured) or a
    record without a classic median used to stop it with nothing printed, so the cold check
    fell back to width 4 and the model drafter whatever the other records said."""
    def rec(d: Path, name: str, classic, arms: dict) -> None:
        d.mkdir(exist_ok=True)
        doc = {"arms": [{"width": None, "decode_tok_s": classic}]
               + [{"width": w, "decode_tok_s": v} for w, v in arms.items()]}
        (d / name).write_text(json.dumps(doc))

    model, mtp, broken = tmp_path / "records-model-bf16", tmp_path / "records-mtp-bf16", tmp_path / "b"
    rec(model, "session-1.json", [90, 100, 110], {4: [100, 120, 130]})  # older: not read
    rec(model, "session-2.json", [90, 100, 110], {4: [95, 105, 115], 16: []})
    rec(mtp, "session-1.json", [40, 50, 60], {6: [50, 55, 60], 8: []})
    rec(broken, "session-1.json", [], {4: [1, 2, 3]})

    def best(*dirs: Path) -> str:
        out = subprocess.run(["bash", "-c", '. lab/gpu_lib.sh; best_arm "$@"', "_",
                              *map(str, dirs)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert best(model, mtp, broken) == f"{mtp} 6 1.1"
    assert best(model) == f"{model} 4 1.05"
    assert best(broken, tmp_path / "none") == ""


def test_better_build_takes_the_pair_whose_worse_target_keeps_more(tmp_path):
    """gpu_lib.sh better_build picks which of the two 1B builds the H200 pipeline sweeps: the one
    whose drafter keeps more drafted tokens on its worse target; the first build when the second
    has no build.json (it failed) or does no better."""
    def build(name: str, bf16: float, q4: float) -> Path:
        d = tmp_path / name
        d.mkdir()
        acc = {"bf16": {"pooled": bf16}, "4bit": {"pooled": q4}}
        (d / "build.json").write_text(json.dumps({"acceptance_held_out_width4": acc}))
        return d

    def pick(a: Path, b: Path) -> str:
        out = subprocess.run(["bash", "-c", '. lab/gpu_lib.sh; better_build "$@"', "_", str(a),
                              str(b)], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    a, b = build("a", 0.62, 0.55), build("b", 0.60, 0.58)
    assert pick(a, b) == "B worse-target acceptance A 0.55 B 0.58"
    assert pick(b, a).startswith("A ")
    assert pick(a, tmp_path / "missing") == "A worse-target acceptance A 0.55 B None"


def test_wait_for_succeeds_on_a_file_and_fails_when_its_time_is_up(tmp_path):
    """gpu_lib.sh wait_for, the pipeline's waits for the build, the side chain and the MTP head:
    its status says whether the file came, which the pipeline reads to go on or to skip."""
    there = tmp_path / "build.rc"
    there.write_text("0")

    def status(path: Path, seconds: int) -> int:
        return subprocess.run(["bash", "-c", '. lab/gpu_lib.sh; wait_for "$@"', "_", str(path),
                               str(seconds)], cwd=ROOT, timeout=60).returncode

    assert status(there, 0) == 0
    assert status(tmp_path / "side.done", 0) == 1
    def any_(seconds: int, *paths: Path) -> int:
        return subprocess.run(["bash", "-c", '. lab/gpu_lib.sh; wait_for_any "$@"', "_", str(seconds),
                               *map(str, paths)], cwd=ROOT, timeout=60).returncode

    assert any_(0, tmp_path / "target-4bit", there) == 0
    assert any_(0, tmp_path / "target-4bit", tmp_path / "side.done") == 1


def test_the_forward_probes_run_on_a_tiny_model_and_report_every_part(capsys):
    """lab.probe_overlap, probe_parts and probe_classic, the H200 probes behind docs/verify-attention.md's account of
    a verify's cost, on a tiny random model in this process: every figure is there and positive,
    and gemv (a CUDA kernel) routed nothing here while its products still match float32."""
    from lab import probe_overlap, probe_parts

    assert probe_overlap.main(["--shape", "tiny", "--rows", "1,2", "--steps", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["pipelined_1row_ms"] > 0
    assert all(d[f"rows{k}"][f] > 0 for k in (1, 2) for f in ("build_ms", "eval_ms", "synced_ms"))
    assert probe_parts.main(["--shape", "tiny", "--rows", "1,2", "--reps", "7", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(d["rows1"][f] > 0 for f in ("proj", "attn", "rest", "layers", "forward"))
    two = d["rows2"]
    assert all(two[f] > 0 for f in ("proj", "proj_gather", "proj_gemv", "attn", "attn_vector",
                                    "attn_fused", "rest", "layers", "forward"))
    assert two["gemv_routed"] == 0 and two["gemv_max_rel_err"] < 0.01
    from lab import probe_classic

    assert probe_classic.main(["--shape", "tiny", "--variant", "gemvv", "--reps", "2", "--tokens", "8",
                               "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["classic_step_ms_alone"]) == len(d["classic_step_ms_after_spec"]) == 2
    assert d["alone_median"] > 0 and all(v > 0 for v in d["spec_verify_ms"])
    # the host's share of each timed classic run, in the runs' order (alone, then between)
    assert len(d["classic_host"]) == 4 == len(d["classic_sm_mhz"])
    assert all(h["wall_s"] > 0 and h["thread_cpu_s"] > 0 for h in d["classic_host"])


def _tiny_target():
    import mlx.core as mx

    from lab import build as small
    from lab.build_gpu import COMMON, SHAPES

    mx.random.seed(3)
    model = small.make_model(dict(COMMON, **SHAPES["tiny"][0]))
    model.eval()
    return model


def test_distillation_rows_label_every_position_with_the_targets_argmax_after_its_prefix():
    """build_gpu's distillation rows: the labels are what one forward over the whole row picks at
    each position (inside the corpus prompt too), the next token from the prompt's end on, and the
    kept top-k holds the argmax with the forward's own logits (on a CPU a row's forward equals
    its steps, so the comparison is exact up to float16 storage)."""
    import mlx.core as mx
    import numpy as np

    from lab.build_gpu import greedy_rows

    model = _tiny_target()
    prompts = mx.array(np.random.default_rng(0).integers(1, 2048, size=(3, 10)))
    rows = greedy_rows(model, prompts, 6, topk=5)
    assert rows.tokens.shape == (3, 16) and rows.labels.shape == (3, 15)
    assert (rows.tokens[:, :10] == np.array(prompts)).all()
    assert (rows.labels[:, 9:] == rows.tokens[:, 10:]).all()
    full = model(mx.array(rows.tokens[:, :-1]))
    assert (rows.labels == np.array(mx.argmax(full, axis=-1))).all()
    assert rows.top_ids.shape == rows.top_logits.shape == (3, 15, 5)
    assert all(rows.labels[b, t] in rows.top_ids[b, t] for b in range(3) for t in range(15))
    want = np.take_along_axis(np.array(full.astype(mx.float32)), rows.top_ids.astype(np.int64), axis=-1)
    assert np.allclose(rows.top_logits.astype(np.float32), want, atol=2e-2, rtol=1e-2)
    x, y, ids, logits = rows.batch(np.array([2, 0]))
    assert x.shape == (2, 15) and (np.array(y) == rows.labels[[2, 0]]).all() and ids.dtype == mx.int32
    assert greedy_rows(model, prompts, 6, topk=0).top_ids is None


def test_top_ids_splits_the_rows_and_finds_the_largest(monkeypatch):
    """build_gpu.top_ids in chunks of rows (CUDA's partition takes at most 65535 a call): the same
    sets of ids as one call, and they are the largest logits."""
    import mlx.core as mx
    import numpy as np

    from lab import build_gpu

    x = mx.random.normal((3, 5, 40), key=mx.random.key(0))
    whole = np.sort(np.array(build_gpu.top_ids(x, 4)), axis=-1)
    monkeypatch.setattr(build_gpu, "TOPK_ROWS", 4)
    split = np.sort(np.array(build_gpu.top_ids(x, 4)), axis=-1)
    assert (whole == split).all() and split.shape == (3, 5, 4)
    assert (whole == np.sort(np.argsort(-np.array(x), axis=-1)[..., :4], axis=-1)).all()


def test_the_drafter_loss_is_the_hard_label_cross_entropy_plus_its_soft_share():
    """distil_loss: soft 0 (or no top-k) is the plain cross-entropy against the argmax; soft 1
    over the whole vocabulary is the cross-entropy against the target's full distribution, which is
    at its least when the drafter's logits are the target's."""
    import mlx.core as mx
    import mlx.nn as nn

    from lab.build_gpu import distil_loss

    mx.random.seed(1)
    teacher = mx.random.normal((2, 4, 8))
    labels = mx.argmax(teacher, axis=-1)
    everything = (mx.broadcast_to(mx.arange(8), (2, 4, 8)), teacher)
    z = mx.random.normal((2, 4, 8))
    hard = nn.losses.cross_entropy(z, labels, reduction="mean").item()
    assert abs(distil_loss(z, labels, (), 0.5).item() - hard) < 1e-6
    assert abs(distil_loss(z, labels, everything, 0.0).item() - hard) < 1e-6
    p = mx.softmax(teacher, axis=-1)
    want = -(p * (z - mx.logsumexp(z, axis=-1, keepdims=True))).sum(-1).mean().item()
    assert abs(distil_loss(z, labels, everything, 1.0).item() - want) < 1e-5
    half = distil_loss(z, labels, everything, 0.5).item()
    assert abs(half - (hard + want) / 2) < 1e-5
    assert distil_loss(teacher, labels, everything, 1.0).item() < distil_loss(z, labels, everything, 1.0).item()
    # a position mask: the mean over the marked positions only
    first = mx.array([1.0, 0.0, 0.0, 0.0])
    alone = nn.losses.cross_entropy(z[:, :1], labels[:, :1], reduction="mean").item()
    assert abs(distil_loss(z, labels, (), 0.0, first).item() - alone) < 1e-6


# Three tiny builds of about 30 s of CPU each, fixed step counts: 200 s each at load 17 on 2
# cores, past the suite's 600 s per test; bounded on its own, at 1500.
@pytest.mark.lease
@pytest.mark.timeout(1500)
def test_the_gpu_pair_build_runs_on_a_cpu_with_soft_labels_and_refuses_a_bad_weight(tmp_path, capfd):
    """lab.build_gpu end to end at its tiny shape (seconds): both targets, the drafter and
    build.json with the recipe; a soft-label weight outside 0..1 is refused in one line, exit 2,
    before anything is built. The builds run as the GPU host runs them, a process each; the
    refusals are its main() here (a process each proved nothing more and cost an MLX import)."""
    from lab.build_gpu import main

    def refused(*args: str) -> subprocess.CompletedProcess:
        capfd.readouterr()
        code = main(list(args))
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(args, code, out, err)

    out = refused("--out", str(tmp_path / "bad"), "--shape", "tiny", "--drafter-soft", "1.5")
    assert out.returncode == 2 and out.stderr.strip() == "--drafter-soft 1.5: a weight from 0 to 1"
    assert not (tmp_path / "bad").exists()
    out = _run("lab.build_gpu", "--out", str(tmp_path / "pair"), "--shape", "tiny",
               "--target-seconds", "1", "--drafter-seconds", "1", "--gen-seconds", "0",
               "--gen-batch", "4", "--prompts", "1", "--batch", "2", "--seq", "80",
               "--drafter-soft", "0.5", "--drafter-topk", "8", "--drafter-labels", "all")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "pair" / "build.json").read_text())
    assert got["drafter_soft"] == 0.5 and got["drafter_topk"] == 8 and got["generated_rows"] == 4
    assert got["drafter_labels"] == "all"
    for v in ("bf16", "4bit"):
        assert 0 <= got["acceptance_held_out_width4"][v]["pooled"] <= 1
    for d in ("target-bf16", "target-4bit", "drafter"):
        assert (tmp_path / "pair" / d / "model.safetensors").is_file()
    # another recipe on the same target: nothing trained but the drafter, the targets linked
    out = _run("lab.build_gpu", "--out", str(tmp_path / "b"), "--shape", "tiny",
               "--target-from", str(tmp_path / "pair"), "--drafter-seconds", "1", "--gen-seconds", "0",
               "--gen-batch", "4", "--prompts", "1", "--batch", "2", "--seq", "80")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "b" / "build.json").read_text())
    assert got["target_from"] == str(tmp_path / "pair") and got["target_steps"] == 0
    assert got["target_last_loss"] is None and "NaN" not in (tmp_path / "b" / "build.json").read_text()
    assert (tmp_path / "b" / "target-4bit").resolve() == (tmp_path / "pair" / "target-4bit").resolve()
    assert json.loads((tmp_path / "pair" / "prompts.json").read_text()) == json.loads(
        (tmp_path / "b" / "prompts.json").read_text())
    out = refused("--out", str(tmp_path / "c"), "--target-from", str(tmp_path / "b" / "drafter"))
    assert out.returncode == 2 and "--target-from" in out.stderr and not (tmp_path / "c").exists()
    # a target of another shape than --shape (1b by default): refused before anything is built
    out = refused("--out", str(tmp_path / "c"), "--target-from", str(tmp_path / "pair"))
    assert out.returncode == 2 and out.stderr.strip().startswith(
        f"--target-from {tmp_path / 'pair'}: its target is not the --shape 1b shape (hidden_size 128,")
    assert len(out.stderr.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
    # a folder with targets of its own is not overwritten by links
    before = (tmp_path / "pair" / "target-bf16" / "model.safetensors").read_bytes()
    out = refused("--out", str(tmp_path / "pair"), "--shape", "tiny", "--target-from", str(tmp_path / "b"))
    assert out.returncode == 2 and out.stderr.startswith(f"--out {tmp_path / 'pair'}: holds targets")
    assert (tmp_path / "pair" / "target-bf16" / "model.safetensors").read_bytes() == before
    # a whole build into the folder of links: its own targets there, the linked pair's untouched
    out = _run("lab.build_gpu", "--out", str(tmp_path / "b"), "--shape", "tiny", "--seed", "1",
               "--target-seconds", "1", "--drafter-seconds", "1", "--gen-seconds", "0",
               "--gen-batch", "4", "--prompts", "1", "--batch", "2", "--seq", "80")
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (tmp_path / "b" / "target-bf16").is_symlink() and not (tmp_path / "b" / "target-4bit").is_symlink()
    assert (tmp_path / "pair" / "target-bf16" / "model.safetensors").read_bytes() == before


def test_a_checkpoint_writes_its_config_json_last(tmp_path, monkeypatch):
    """build_gpu writes its targets early so that GPU 1 can start on them (h200pipe waits for
    target-4bit/config.json): config.json must be the last file of a checkpoint, so its presence
    says the folder is whole. It was written before the tokenizer files were copied."""
    import shutil

    from lab import build as small
    from lab.build_gpu import COMMON, SHAPES

    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    out = tmp_path / "target"
    seen = []
    copy = shutil.copy

    def spy(src, dst):
        seen.append((Path(dst).name, (out / "config.json").exists()))
        return copy(src, dst)

    monkeypatch.setattr(small.shutil, "copy", spy)
    small.save_checkpoint(_tiny_target(), dict(COMMON, **SHAPES["tiny"][0]), out, tok, "bfloat16")
    assert seen == [("tokenizer.json", False)] and (out / "config.json").is_file()


def test_the_builds_page_quotes_probe_classic_as_recorded():
    """The sixth build's probe_classic bullet (docs/gpu-builds.md): classic's step range over every run of the four processes, and the w6
    verify medians by routing, as probes/probe_classic.jsonl holds them (it said 2.6-4.6 ms while
    two runs took 5.1 and 5.3, and 7.6 for a median of 7.4)."""
    import re
    import statistics

    lines = (ROOT / "lab" / "evidence" / "h200-2026-11-30d" / "probes" / "probe_classic.jsonl")
    runs = [json.loads(x) for x in lines.read_text().splitlines() if x.strip()]
    steps = [s for r in runs for s in r["classic_step_ms_alone"] + r["classic_step_ms_after_spec"]]
    verify = {v: [statistics.median(r["spec_verify_ms"]) for r in runs if r["variant"] == v]
              for v in ("stock", "gemvv")}
    readme = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())
    said = re.search(r"classic's step moves \*\*between runs in every process\*\*, from ([\d.]+) to ([\d.]+) ms",
                     readme)
    assert said and (float(said[1]), float(said[2])) == (round(min(steps), 1), round(max(steps), 1))
    said = re.search(r"gemvv's verify was ([\d.]+)-([\d.]+) ms against stock's ([\d.]+)-([\d.]+) \(w6 medians\)",
                     readme)
    assert said and [float(x) for x in said.groups()] == [
        round(f(verify[v]), 1) for v in ("gemvv", "stock") for f in (min, max)]


def test_the_h200_pipeline_builds_5b_by_default_and_falls_back_to_3_5b(tmp_path):
    """The default shape is 5b; a 5b build that leaves no target is followed by a 3.5b build (a
    shape measured on the H200), not a 1B one; FALLBACK=none builds nothing more."""
    work = tmp_path / "work"
    log = _pipe(tmp_path, "pipeline", stub=_PIPE_STUB, TARGET_FIRST="0", drop=("SHAPE",))
    builds = [c.split() for c in (work / "calls").read_text().splitlines() if "lab.build_gpu" in c]
    assert [c[c.index("--shape") + 1] for c in builds] == ["5b", "3.5b"], builds
    assert "build (5b) left no target: building the 3.5b pair instead" in log, log
    assert "--target-seconds 170 --gen-seconds 60" in " ".join(builds[0]), builds[0]
    (work / "calls").unlink()
    log = _pipe(tmp_path, "pipeline", stub=_PIPE_STUB, TARGET_FIRST="0", drop=("SHAPE",), FALLBACK="none")
    builds = [c for c in (work / "calls").read_text().splitlines() if "lab.build_gpu" in c]
    assert len(builds) == 1 and "--shape 5b" in builds[0], builds


def test_the_5b_shape_is_a_70b_layer_six_times_with_a_drafter_of_one():
    """--shape 5b: 6 layers of a 70B Llama's layer (hidden 8192, MLP 28672, 64 heads of 128, 8 KV
    heads; counted lazily, nothing allocated), a drafter of one such layer, the target's first
    (build_gpu copies every drafter weight whose name and shape the target shares), and its own
    rates."""
    from mlx.utils import tree_flatten

    from lab import build as small
    from lab.build_gpu import COMMON, LRS, SHAPES

    tconf, dconf = (dict(COMMON, **s) for s in SHAPES["5b"])
    target = dict(tree_flatten(small.make_model(tconf).parameters()))
    drafter = dict(tree_flatten(small.make_model(dconf).parameters()))
    n, d = sum(v.size for v in target.values()), sum(v.size for v in drafter.values())
    assert 5.1e9 < n < 5.2e9 and 0.85e9 < d < 0.9e9
    per_layer = sum(v.size for k, v in target.items() if k.startswith("model.layers.0."))
    assert 0.85e9 < per_layer < 0.86e9  # a 70B layer: 855.6M
    assert tconf["hidden_size"] // tconf["num_attention_heads"] == 128
    assert all(k in target and target[k].shape == v.shape for k, v in drafter.items())
    assert LRS["5b"] == (2e-4, 6e-4)
    # and docs/gpu-builds.md's shape list quotes them (it said 0.87B for the drafter: one layer and
    # the embedding and output matrices, 0.889B)
    readme = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())
    assert f"{n / 1e9:.2f}B parameters, with a drafter of one such layer ({d / 1e9:.2f}B)" in readme


@pytest.mark.lease
def test_the_3_5b_shape_is_an_8b_layer_sixteen_times_and_trains_at_its_own_rates(tmp_path):
    """--shape 3.5b: 16 layers of an 8B Llama's layer (weights counted lazily, nothing allocated),
    a drafter of two of them, and learning rates by shape unless given (recorded in build.json)."""
    from mlx.utils import tree_flatten

    from lab import build as small
    from lab.build_gpu import COMMON, LRS, SHAPES

    tconf, dconf = (dict(COMMON, **s) for s in SHAPES["3.5b"])
    n = sum(v.size for _, v in tree_flatten(small.make_model(tconf).parameters()))
    d = sum(v.size for _, v in tree_flatten(small.make_model(dconf).parameters()))
    assert 3.4e9 < n < 3.6e9 and 0.4e9 < d < 0.5e9
    assert tconf["hidden_size"] // tconf["num_attention_heads"] == 128  # the 8B's head size
    assert set(LRS) == set(SHAPES) and LRS["3.5b"] == (3e-4, 1e-3)
    # tiny's rates are the 1B's, which were the fixed defaults before LRS: a build whose default
    # did not come from LRS by shape would pass with them, so this build sets its own
    run = ("import sys; from lab import build_gpu as b; b.LRS['tiny'] = (1.5e-4, 2.5e-4); "
           "sys.exit(b.main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", run, "--out", str(tmp_path / "pair"), "--shape", "tiny",
                          "--target-seconds", "1", "--drafter-seconds", "1", "--gen-seconds", "0",
                          "--drafter-lr", "5e-4", "--gen-batch", "4", "--prompts", "1", "--batch", "2",
                          "--seq", "80"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads((tmp_path / "pair" / "build.json").read_text())
    assert (got["target_lr"], got["drafter_lr"]) == (1.5e-4, 5e-4)


def test_the_gemv_probe_times_stock_on_a_cpu(capsys):
    """lab.probe_gemv: on a CPU only the stock matmul is timed (the kernels are CUDA
    source), each figure with its error against float32."""
    from lab import probe_gemv

    assert probe_gemv.main(["--shapes", "a=64x32", "--rows", "1,2", "--reps", "2", "--copies", "2", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["us_per_call"]["a 64x32"]
    assert set(got) == {"stock m1", "stock m2"} and all(v["rel_err"] < 0.01 and v["us"] > 0 for v in got.values())


@pytest.mark.parametrize("argv, line", [
    (["--shapes", "a=64x30"], "--shapes a=64x30: name=NxD items"),
    (["--shapes", "a=64x32,a=32x32"], "--shapes a=64x32,a=32x32: name=NxD items, distinct names"),
    (["--shapes", "a=64"], "--shapes a=64: name=NxD items"),
    (["--rows", "1,x"], "--rows 1,x: comma-separated positive integers"),
    (["--rows", "0"], "--rows 0: comma-separated positive integers"),
    (["--npw", "1,-2"], "--npw 1,-2: comma-separated positive integers"),
    (["--copies", "0"], "--copies 0: at least 1"),
    (["--reps", "0"], "--reps 0: at least 1"),
])
def test_the_gemv_probe_refuses_bad_input_in_one_line(capsys, argv, line):
    """A probe input it cannot run is one line naming it, exit 2, before any weight is made:
    --rows x and --npw x were tracebacks, --copies 0 a division by zero and --reps 0 an
    IndexError after the weights were built, and a repeated --shapes name silently dropped one."""
    from lab import probe_gemv

    small = [] if "--shapes" in argv else ["--shapes", "a=8x8"]  # on the old code: small weights first
    assert probe_gemv.main(argv + small) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err


def test_the_builds_page_quotes_the_seventh_builds_verify_and_clocks_as_recorded():
    """The seventh build's account (docs/gpu-builds.md), against its files: the verify and drafting
    figures are medians of each run's split rounds (the rounds that time drafting and verify
    apart) in the bf16 sweep records, and the training clock range is the nvidia-smi samples'
    (it said a median verify of 6.03 ms, drafting 0.42-0.96 ms a token, gemv + vector
    5.91-9.21, and 1230 MHz at the least while training: the files hold 5.92, 0.41-0.94,
    5.84-9.20 and 1185)."""
    import gzip
    import re
    import statistics

    d = ROOT / "lab" / "evidence" / "h200-2026-11-30e"
    readme = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())

    def split_medians(sweep: str) -> tuple[list[float], list[float]]:
        rec = json.loads(next((d / "sweeps" / f"records-{sweep}-bf16").glob("*.json")).read_text())
        verify, draft = [], []
        for arm in rec["arms"]:
            if arm["width"] and 3 <= arm["width"] <= 8:
                for run in arm["samples"]:
                    split = [r for r in run["rounds_detail"] if r[0] > 0 and r[6]]
                    verify.append(statistics.median(r[4] for r in split))
                    draft.append(statistics.median(r[3] / r[0] for r in split))
        return verify, draft

    def figures(xs: list[float]) -> list[float]:
        return [round(min(xs), 2), round(max(xs), 2), round(statistics.median(xs), 2)]

    stock_v, stock_d = split_medians("model")
    gemvv_v, _ = split_medians("gemvv")
    said = re.search(r"a verify of 3-8 rows took ([\d.]+)-([\d.]+) ms \(median ([\d.]+)\)", readme)
    assert said and [float(x) for x in said.groups()] == figures(stock_v)
    said = re.search(r"drafting took ([\d.]+)-([\d.]+) ms a token \(median ([\d.]+)\)", readme)
    assert said and [float(x) for x in said.groups()] == figures(stock_d)
    said = re.search(r"\*\*gemv \+ vector\*\* verified in ([\d.]+)-([\d.]+) ms \(median ([\d.]+)\), "
                     r"against stock's ([\d.]+)-([\d.]+) \(([\d.]+)\)", readme)
    assert said and [float(x) for x in said.groups()] == figures(gemvv_v) + figures(stock_v)

    # nvidia-smi every 200 ms on both GPUs: busy (>= 50 %) before the first sweep is training
    first_sweep = re.search(r"^\[(\d\d:\d\d:\d\d)\] sweep ", (d / "pipeline.log").read_text(), re.M)[1]
    rows = [line.split(", ") for line in gzip.open(d / "probes" / "gpu_clocks.csv.gz", "rt").read().splitlines()[1:]]
    busy = [int(r[2].split()[0]) for r in rows if r[1].split()[1] < first_sweep and int(r[5].split()[0]) >= 50]
    watts = max(float(r[4].split()[0]) for r in rows)
    said = re.search(r"and (\d+)-(\d+) while training, drawing up to (\d+) W", readme)
    assert said and [int(x) for x in said.groups()] == [min(busy), max(busy), round(watts)]


def test_the_docs_quote_the_eighth_builds_verify_times_and_gpu_busy_share_as_recorded():
    """The eighth build's account against its files: rows' and plain's verify medians (each arm's
    split rounds pooled over its runs, widths 4-7) in the two pairs of sweeps, and the GPU's busy
    share through each sweep (nvidia-smi samples of GPU 0 between the sweep's start and end lines
    in pipeline.log, 0 % samples left out)."""
    import gzip
    import re
    import statistics

    d = ROOT / "lab" / "evidence" / "h200-2026-11-30f"
    # docs/verify-attention.md's rows paragraph quotes the verify medians; the build's account
    # (GPU busy share) is in docs/gpu-builds.md
    readme = " ".join((ROOT / "docs" / "verify-attention.md").read_text().split())
    evidence = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())

    def verify(sweep: str) -> tuple[float, float]:
        rec = json.loads(next((d / "sweeps" / f"records-{sweep}-bf16").glob("*.json")).read_text())
        meds = [statistics.median(r[4] for run in arm["samples"] for r in run["rounds_detail"]
                                  if r[0] > 0 and r[6])
                for arm in rec["arms"] if arm["width"] and 4 <= arm["width"] <= 7]
        return round(min(meds), 2), round(max(meds), 2)

    said = re.search(r"rows' verify took ([\d.]+)-([\d.]+) ms at widths 4-7 against plain's ([\d.]+)-([\d.]+) "
                     r"in the sweeps run back to back, but ([\d.]+)-([\d.]+) against ([\d.]+)-([\d.]+)", readme)
    assert said and [float(x) for x in said.groups()] == [
        *verify("rows-2"), *verify("auto-2"), *verify("rows"), *verify("model")]

    log = (d / "pipeline.log").read_text()
    rows = [r.split(", ") for r in gzip.open(d / "probes" / "gpu_clocks.csv.gz", "rt").read().splitlines()[1:]]

    def busy(start: str, end: str) -> list[int]:
        a = re.search(rf"^\[(\S+)\] {start}", log, re.M)[1]
        b = re.search(rf"^\[(\S+)\] {end}", log, re.M)[1]
        u = sorted(int(r[5].split()[0]) for r in rows if r[0] == "0" and a <= r[1].split()[1] <= b)
        return [x for x in u if x > 0]

    first = busy("sweep model bf16$", "sweep model bf16 rc")
    said = re.search(r"a median (\d+) % of the time through the first sweep \(10th-90th percentile "
                     r"(\d+)-(\d+) %\), and (\d+)-(\d+) % through the other three", evidence)
    others = [statistics.median(busy(a, b)) for a, b in (
        ("lead: pipeline stopped", "sweep rows bf16 rc"), ("lead: sweep auto-2", "sweep auto-2 rc"),
        ("lead: sweep rows-2", "sweep rows-2 rc"))]
    assert said and [int(x) for x in said.groups()] == [
        statistics.median(first), first[len(first) // 10], first[int(len(first) * 0.9)],
        min(others), max(others)]


def test_the_builds_page_quotes_the_eighth_builds_host_cpu_share_as_recorded():
    """"Every run's main thread was on the CPU for A-B % of its wall time": each timed run's
    host_cpu (thread CPU seconds over wall seconds) in the eighth build's four sweep records,
    every arm. The account said 85-100 %, the first sweep's range; the rows sweeps' runs went
    down to 82 %."""
    import re

    d = ROOT / "lab" / "evidence" / "h200-2026-11-30f" / "sweeps"
    readme = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())
    shares = []
    for f in d.glob("records-*-bf16/*.json"):
        for arm in json.loads(f.read_text())["arms"]:
            shares += [s["host_cpu"]["thread_cpu_s"] / s["host_cpu"]["wall_s"] for s in arm["samples"]]
    said = re.search(r"Every run's main thread was on the CPU for (\d+)-(\d+) % of its wall time", readme)
    assert len(shares) > 100 and said
    assert [int(x) for x in said.groups()] == [round(min(shares) * 100), round(max(shares) * 100)]


def test_the_docs_quote_the_rows_probes_as_recorded():
    """docs/verify-attention.md's paragraph on ``rows``: the parity figures (the ninth build's
    probes/probe_rows.json, against a CPU reference; the eighth's float32 failures against a GPU
    one) and the table of verify times against the eighth build's probes/probe_rows-quiet.json
    (3.5B) and probe_overlap_5b_3.5b.jsonl (5B, plain is its "auto" line) and the ninth's
    probe_rows.json, and the 5B trial's ratios of a verify to a pipelined step (now on the
    builds page, docs/gpu-builds.md, with the eighth build's account)."""
    import re

    d = ROOT / "lab" / "evidence" / "h200-2026-11-30f" / "probes"
    readme = " ".join((ROOT / "docs" / "verify-attention.md").read_text().split())
    evidence = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())
    ninth = json.loads((d.parent.parent / "h200-2026-11-30g" / "probes" / "probe_rows.json").read_text())
    assert ninth["parity"]["failed"] == []
    err = ninth["parity"]["max_abs_err"]
    assert f"over {ninth['parity']['cases']} cases" in readme
    assert (f"every case passed: bf16 within {round(err['bfloat16'], 4)}, f16 within {err['float16']:.2g} "
            f"(the rounding of their outputs), float32 within {err['float32']:.1e}".replace("e-06", "e-6") in readme)
    probe = json.loads((d / "probe_rows-quiet.json").read_text())
    par = probe["parity"]
    f32 = [c["max_abs_err"] for c in par["failed"] if c["dtype"] == "float32"]
    assert len(f32) == len(par["failed"])  # no bf16 or f16 case failed
    assert f"failed {len(f32)} float32 cases at {min(f32):.0e} to {max(f32):.1e}".replace("e-04", "e-4").replace(
        "e-03", "e-3") in readme
    from decimal import ROUND_HALF_UP, Decimal

    # the JSON's 3-decimal figures rounded half up (4.755 -> 4.76; a float's :.2f gives 4.75)
    fmt = lambda xs: " / ".join(str(Decimal(str(x)).quantize(Decimal("0.01"), ROUND_HALF_UP))  # noqa: E731
                                for x in xs)
    ms = probe["verify_ms"]
    row = f"| 3.5B, 16 layers of 4096 | {fmt(ms[f'rows{k}']['plain'] for k in (2, 4, 6, 8))} | " \
          f"{fmt(ms[f'rows{k}']['rows'] for k in (2, 4, 6, 8))} | - |"
    assert row in readme, row
    lines = {(o["shape"], o["attention"]): o for o in map(json.loads, (d / "probe_overlap_5b_3.5b.jsonl").open())}
    plain, rows, old = lines["5b", "auto"], lines["5b", "rows"], lines["3.5b", "auto"]
    row = (f"| 5B, 6 layers of 8192 (`probe_overlap`) | {fmt(plain[f'rows{k}']['synced_ms'] for k in (2, 4, 6, 8))} | "
           f"{fmt(rows[f'rows{k}']['synced_ms'] for k in (2, 4, 6, 8))} | {plain['pipelined_1row_ms']:.2f} |")
    assert row in readme, row
    nm = ninth["verify_ms"]
    row = f"| 5B (ninth build, `probe_rows`) | {fmt(nm[f'rows{k}']['plain'] for k in (2, 4, 6, 8))} | " \
          f"{fmt(nm[f'rows{k}']['rows'] for k in (2, 4, 6, 8))} | - |"
    assert row in readme, row
    ratio = lambda o, ks: [o[f"rows{k}"]["synced_ms"] / o["pipelined_1row_ms"] for k in ks]  # noqa: E731
    five = ratio(plain, (2, 4, 6, 8)) + ratio(rows, (2, 4, 6, 8))
    said = re.search(r"with rows: ([\d.]+)-([\d.]+)x the step, against the 3.5B's ([\d.]+)-([\d.]+)x", evidence)
    assert said and [float(x) for x in said.groups()] == [
        round(min(five), 1), round(max(five), 1), *(round(f(ratio(old, (2, 4, 6, 8))), 1) for f in (min, max))]


def test_devwheels3_refuses_a_bad_parts_and_its_install_joins_exactly_its_own_parts(tmp_path):
    """lab/devwheels3.sh splits the MLX CUDA wheel into PARTS transfers; the last one's
    install.sh joins them on the GPU host. PARTS=0 or x was bash's "division by 0" and 11 ran
    out of split's one-digit suffixes; and install.sh joined every mlxpart.* in /root/dw, so a
    longer split's leftover part (a warm host) was appended to the wheel. Here the host's
    folder (DW) holds a stale mlxpart.3 and python3 is a stub: the joined wheel is the wheel."""
    import shutil

    repo, host, out = tmp_path / "repo", tmp_path / "dw", tmp_path / "wheel"
    for d in (repo / ".devwheels" / "a", repo / ".devwheels" / "b", host, out, tmp_path / "bin"):
        d.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    wheel = os.urandom(10_001)
    dw = repo / ".devwheels"
    (dw / "a" / "part.aa").write_bytes(wheel[:6000])
    (dw / "b" / "part.ab").write_bytes(wheel[6000:])
    (dw / "b" / "NAME").write_text("mlx_cuda-0-py3-none-any.whl\n")
    (dw / "b" / "mlx-0-py3-none-any.whl").write_bytes(b"metadata")

    def split(parts: str, path: str = os.environ["PATH"]) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(ROOT / "lab" / "devwheels3.sh")], cwd=repo,
                              env={**os.environ, "PARTS": parts, "PATH": path}, capture_output=True,
                              text=True, timeout=60)

    # no tomlkit wheel kept and pip cannot fetch one (a stub python3 that fails, no network): one
    # line, exit 2, no parts written (2026-11-30g: the host's set lacked it and --save failed there)
    (tmp_path / "nopip").mkdir()
    (tmp_path / "nopip" / "python3").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "nopip" / "python3").chmod(0o755)
    got = split("3", f"{tmp_path / 'nopip'}:{os.environ['PATH']}")
    assert got.returncode == 2 and got.stderr.splitlines() == [
        "tomlkit: no wheel in .devwheels/extra and pip could not download one"], got.stderr
    assert not list(dw.glob("p*"))
    (dw / "extra").mkdir()
    (dw / "extra" / "tomlkit-0-py3-none-any.whl").write_bytes(b"toml")

    for bad in ("0", "11", "x"):
        got = split(bad)
        assert got.returncode == 2 and got.stderr.splitlines() == [f"PARTS {bad}: a whole number from 1 to 10"]
    got = split("3")
    assert got.returncode == 0, got.stderr
    assert sorted(p.name for p in dw.glob("p*/mlxpart.*")) == ["mlxpart.0", "mlxpart.1", "mlxpart.2"]
    (host / "mlxpart.3").write_bytes(b"an earlier, longer split's")
    for k in (1, 2):  # the first two device calls
        shutil.copy(dw / f"p{k}" / f"mlxpart.{k - 1}", host)
    (tmp_path / "bin" / "python3").write_text("#!/bin/sh\necho \"$@\" >> \"$CALLS\"\n")
    (tmp_path / "bin" / "python3").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "DW": str(host),
           "WHEEL_DIR": str(out), "CALLS": str(tmp_path / "calls")}
    got = subprocess.run(["bash", ".devwheels/p3/install.sh"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert (out / "mlx_cuda-0-py3-none-any.whl").read_bytes() == wheel
    # the project's own dependencies travel with the last part: tomlkit for the profile
    assert (f"{out}/mlx_cuda-0-py3-none-any.whl .devwheels/p3/mlx-0-py3-none-any.whl "
            ".devwheels/p3/tomlkit-0-py3-none-any.whl") in (tmp_path / "calls").read_text()
    # a tree that leaves no room for a part in one 64 MiB device call (a sparse file: no disk)
    with open(repo / "evidence.bin", "wb") as f:
        f.truncate(64 * 1024 * 1024)
    got = split("3")
    assert got.returncode == 2 and len(got.stderr.splitlines()) == 1, got.stderr
    assert got.stderr.startswith("PARTS 3: the tree (") and "more than 64 MiB" in got.stderr, got.stderr


def test_the_builds_page_quotes_the_ninth_builds_sweeps_as_recorded():
    """The ninth build's sweep table against its records: classic's min-max (median), the
    decision's width with its median and range, and the ratio of the medians; and the
    acceptance the account quotes for prompt 0 and prompt 6."""
    d = ROOT / "lab" / "evidence" / "h200-2026-11-30g" / "sweeps"
    readme = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())

    def arms(rec: dict) -> tuple[dict, dict]:
        best = next(a for a in rec["arms"] if a["width"] == rec["decision"]["recommendation"])
        return next(a for a in rec["arms"] if a["width"] is None), best

    recs = {}
    for name, ratio, shown in (("records-rows-bf16", 2.89, "**2.89x**"), ("records-model-bf16", 2.83, "2.83x"),
                               ("records-model-4bit", 2.51, "2.51x"), ("records-dflash-bf16", 1.31, "1.31x")):
        rec = recs[name] = json.loads(next((d / name).glob("*.json")).read_text())
        classic, best = arms(rec)
        (c0, cm, c1), (b0, bm, b1) = classic["decode_tok_s"], best["decode_tok_s"]
        assert f"| {c0:.1f}-{c1:.1f} ({cm:.1f}) | {best['arm']} {bm:.1f} ({b0:.1f}-{b1:.1f}) | {shown} |" in readme
        assert round(bm / cm, 2) == ratio, name
        assert rec["decision"]["saveable"] and all(
            a["identity"]["identical_bytes"] for a in rec["arms"] if a["width"] and a["decode_tok_s"])
    p6recs = [json.loads(p.read_text()) for p in sorted((d / "records-rows-bf16-p6").glob("*.json"))]
    classic = [arms(r)[0]["decode_tok_s"] for r in p6recs]
    best = [arms(r)[1]["decode_tok_s"] for r in p6recs]
    assert (f"| {min(c[0] for c in classic):.1f}-{max(c[2] for c in classic):.1f} "
            f"({classic[0][1]:.1f}, {classic[1][1]:.1f}) | w8 {best[0][1]:.1f}, {best[1][1]:.1f} "
            f"({min(b[0] for b in best):.1f}-{max(b[2] for b in best):.1f}) | "
            f"{best[0][1] / classic[0][1]:.2f}x, {best[1][1] / classic[1][1]:.2f}x |") in readme
    acc = {a["width"]: a["acceptance"] for a in recs["records-model-bf16"]["arms"] if a["width"]}
    p6 = {a["width"]: a["acceptance"] for a in p6recs[1]["arms"] if a["width"]}
    assert (f"the drafter kept {acc[2]:.2f} of the drafted tokens at width 2 and {acc[16]:.2f} at 16. On prompt 6 "
            f"({p6[4]:.2f} at width 4, {p6[16]:.2f} at 16)") in readme


def test_the_builds_page_quotes_the_ninth_builds_bench_order_effect_as_recorded():
    """The bench alternates which arm runs first on each fresh prompt (the engine on even
    repetitions); its classic ratio followed that order. docs/gpu-builds.md's figures: what running
    first cost each arm (its first-run time less its next second-run time, 128 tokens), and how
    far apart the two were when each ran second."""
    import re

    b = json.loads((ROOT / "lab" / "evidence" / "h200-2026-11-30g" / "sweeps" / "bench-bf16.json")
                   .read_text())
    e, m = (b["modes"]["classic"][k] for k in ("engine_tok_s", "mlx_lm_tok_s"))
    sec = lambda xs: [b["tokens"] / x for x in xs]  # noqa: E731
    es, ms = sec(e), sec(m)
    engine_extra = [es[0] - es[1], es[2] - es[3]]
    mlx_extra = [ms[1] - ms[0], ms[3] - ms[2]]
    apart = [abs(1 - e[1] / m[0]), abs(1 - e[3] / m[2])]
    readme = " ".join((ROOT / "docs" / "gpu-builds.md").read_text().split())
    said = re.search(r"run first, the engine took ([\d.]+)-([\d.]+) s longer than run second, mlx-lm "
                     r"([\d.]+)-([\d.]+) s; run second, they were about (\d+) % apart", readme)
    assert said and [float(x) for x in said.groups()[:4]] == [
        round(min(engine_extra), 2), round(max(engine_extra), 2), round(min(mlx_extra), 2), round(max(mlx_extra), 2)]
    assert int(said[5]) == round(max(apart) * 100)
