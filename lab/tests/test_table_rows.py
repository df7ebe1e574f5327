"""policy/table.py's cuda 9.0 rows re-derived from the sweep records each rests on, by one rule.

The rule (the one the bf16 row was chosen by: "8 is the width that won on both" prompts): over
a row's records (one sweep session each, a prompt or a repetition apiece), the candidates are
the widths that won, byte-identical, in every record; each candidate's score is its worst
median speed-up over classic (the lowest across the records); the row's width is the best
score and its record the session where that worst case was measured. On 2026-11-30g's records
this gives the bf16 row (8: 1.55x on prompt 6, where 12 gave 1.29x) and the 4-bit row (16:
2.51x; 2-7 lost under stock's per-row qmv).

The qmv kernel's sweeps of the 4-bit target (docs/qmv.md, "The product's answer") change the
4-bit row by one line here: ``ROW_SOURCES``' 4-bit entry becomes their record folders; the test
then says which width and record the row must name, and holds the row to them.
"""

import json
from pathlib import Path

from tests.conftest import ROOT

EVIDENCE = ROOT / "lab" / "evidence"

# (scheme, bits) -> the record folders (under lab/evidence) of the cuda 9.0 row of the model drafter
ROW_SOURCES = {
    ("none", None): ("h200-2026-11-30g/sweeps/records-rows-bf16", "h200-2026-11-30g/sweeps/records-rows-bf16-p6"),
    ("affine", 4): ("h200-2026-12-02/records-qmv-4bit-p0",),
}


def _records(folders) -> list[tuple[Path, dict]]:
    out = []
    for f in folders:
        paths = sorted((EVIDENCE / f).glob("*.json"))
        assert paths, f"{f}: no session record there"
        for p in paths:
            rec = json.loads(p.read_text())
            assert rec.get("kind") == "ab-session", p
            out.append((p, rec))
    return out


def derive(records: list[tuple[Path, dict]]) -> tuple[int, Path, float] | None:
    """(width, record, its worst median speed-up) by the rule above; None when no width won,
    byte-identical, in every record."""
    scores: dict[int, list[tuple[float, Path]]] = {}
    for path, rec in records:
        classic = next(a for a in rec["arms"] if a["width"] is None)["decode_tok_s"][1]
        for arm in rec["arms"]:
            w = arm["width"]
            if w and arm["verdict"] == "wins" and (arm["identity"] or {}).get("identical_bytes") is True:
                scores.setdefault(w, []).append((arm["decode_tok_s"][1] / classic, path))
    full = {w: v for w, v in scores.items() if len(v) == len(records)}
    if not full:
        return None
    worst = {w: min(v, key=lambda t: t[0]) for w, v in full.items()}
    width = max(worst, key=lambda w: (worst[w][0], -w))  # a tie goes to the narrower width
    return width, worst[width][1], worst[width][0]


def _linear(rec: dict) -> dict | None:
    """The qmv routing a record's speculative samples report (None: stock's, which none report)."""
    for arm in rec["arms"]:
        for s in arm["samples"] if arm["width"] else ():
            lin = (s.get("attention") or {}).get("linear")
            if lin:
                return lin
    return None


def qmv_route_problem(rec: dict, width: int) -> str | None:
    """Why a row of ``width`` resting on ``rec`` would not hold for a run with the defaults, or
    None: where the record routed the verify to the qmv kernel (2..8 rows), auto must route
    this target's projections at that width too, under the default call strategy, which must
    be the one the record used (engine.linear.QMV_WINS, engine.qmv.DEFAULT_CALL)."""
    from blockwidth.engine import qmv
    from blockwidth.engine.linear import auto_allowed

    lin, q = _linear(rec), rec["pair"]["target_quantization"]
    if lin is None or not 2 <= width <= qmv.MAX_ROWS:
        return None
    if lin.get("mode") != "qmv" or not lin.get("routed_calls"):
        return f"the record's qmv block routed nothing ({lin})"
    if lin.get("call") != qmv.DEFAULT_CALL:
        return f"measured with the {lin.get('call')} call; the default is {qmv.DEFAULT_CALL}"
    if width not in (auto_allowed("cuda", "9.0", call=lin["call"]) or {}).get((q["bits"], q["group_size"]), ()):
        return f"auto does not route {width} rows of {q['bits']}-bit group {q['group_size']} (QMV_WINS)"
    return None


def test_each_cuda_9_0_row_is_what_its_records_derive():
    from blockwidth.policy.device import Backend
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.table import TABLE

    rows = {(r.scheme.value, r.bits): r for r in TABLE
            if r.backend is Backend.CUDA and r.compute_capability == "9.0" and r.drafter_kind is DrafterKind.MODEL}
    assert set(rows) == set(ROW_SOURCES)
    for key, folders in ROW_SOURCES.items():
        row, records = rows[key], _records(folders)
        for path, rec in records:  # every record is of the row's device, drafter and target
            q = rec["pair"]["target_quantization"]
            assert rec["host"]["device"]["backend"] == "cuda" and rec["host"]["device"]["compute_capability"] == "9.0", path
            assert rec["pair"]["drafter_kind"] == row.drafter_kind.value and q["scheme"] == row.scheme.value, path
            assert row.bits is None or q["bits"] == row.bits, path
        got = derive(records)
        assert got is not None, (key, "no width won in every record")
        width, record, ratio = got
        want = f"width={width}, record={str(record.relative_to(ROOT))!r} (worst median {ratio:.2f}x classic)"
        assert (row.width, row.record) == (width, str(record.relative_to(ROOT))), f"{key}: the row should say {want}"
        assert row.byte_identical is True
        for path, rec in records:  # where the records routed the qmv kernel, auto must too
            assert qmv_route_problem(rec, width) is None, (path, qmv_route_problem(rec, width))


def _session(created: str, classic: float, arms: dict) -> dict:
    def arm(w, verdict, med, ident=True):
        return {"width": w, "verdict": verdict, "decode_tok_s": [med - 5, med, med + 5],
                "identity": {"identical_bytes": ident}, "samples": []}
    return {"created": created, "arms": [{"width": None, "verdict": "control", "decode_tok_s": [classic - 5, classic,
                                                                                                classic + 5],
                                          "identity": None, "samples": []}]
            + [arm(w, *v) for w, v in arms.items()]}


def test_the_rule_takes_the_best_worst_case_among_the_widths_that_won_everywhere():
    easy = _session("2026-12-02T10:00:00Z", 300, {4: ("wins", 600), 8: ("wins", 900), 16: ("wins", 1000)})
    hard = _session("2026-12-02T10:05:00Z", 300, {4: ("wins", 450), 8: ("wins", 420), 16: ("slower", 250)})
    width, record, ratio = derive([(Path("easy"), easy), (Path("hard"), hard)])
    assert (width, record, round(ratio, 2)) == (4, Path("hard"), 1.5)  # 16 lost on the hard prompt
    assert derive([(Path("easy"), easy)])[:2] == (16, Path("easy"))
    # a faster width whose output differed is no candidate; nothing that won everywhere: None
    odd = _session("2026-12-02T10:10:00Z", 300, {4: ("wins", 700, False), 8: ("wins", 650)})
    assert derive([(Path("odd"), odd)])[0] == 8
    lost = _session("2026-12-02T10:15:00Z", 300, {4: ("slower", 250)})
    assert derive([(Path("easy"), easy), (Path("lost"), lost)]) is None


def test_a_row_on_qmv_records_needs_auto_to_route_its_width_under_the_default_call():
    def rec(call="compile", bits=4, routed=900):
        lin = {"mode": "qmv", "routed_calls": routed, "call": call}
        return {"pair": {"target_quantization": {"scheme": "affine", "bits": bits, "group_size": 64}},
                "arms": [{"width": None, "samples": [{"attention": None}]},
                         {"width": 4, "samples": [{"attention": {"mode": "rows", "linear": lin}}]}]}

    assert qmv_route_problem(rec(), 4) is None and qmv_route_problem(rec(), 8) is None
    assert qmv_route_problem(rec(), 16) is None  # 9+ rows: stock's qmm, whatever the block
    assert "direct call" in qmv_route_problem(rec("direct"), 4)
    assert "auto does not route 4 rows of 8-bit" in qmv_route_problem(rec(bits=8), 4)
    assert "routed nothing" in qmv_route_problem(rec(routed=0), 4)
    stock = rec()
    stock["arms"][1]["samples"][0]["attention"].pop("linear")
    assert qmv_route_problem(stock, 4) is None  # a stock record: nothing to hold


# A stub python3 for lab/qmv_sweeps.sh: notes each call with the call strategy it was given; the
# build writes a 4-bit target and the prompts; a sweep writes its record folder
_STUB = """#!/bin/sh
[ "$1" = -c ] && exec {python} "$@"
echo "QMV_CALL=$BLOCKWIDTH_QMV_CALL $*" >> "$WORK/calls"
case "$*" in
*lab.build_gpu*) mkdir -p "$4/target-4bit" && echo {{}} > "$4/target-4bit/config.json"
    echo '["p0", "p1", "p2", "p3", "p4", "p5", "the sixth"]' > "$4/prompts.json"; echo p0 > "$4/prompt.txt" ;;
esac
prev=; for a; do [ "$prev" = --record-dir ] && mkdir -p "$a"; prev=$a; done
exit 0
"""


def _sweeps(tmp_path, *verb, **env):
    import os
    import subprocess
    import sys

    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "python3").write_text(_STUB.format(python=sys.executable))
    (bin_ / "python3").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    full = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "WORK": str(work), "PYTHONPATH": str(ROOT), **env}
    full.pop("BLOCKWIDTH_QMV_CALL", None)
    full.update(env)
    return subprocess.run(["bash", "lab/qmv_sweeps.sh", *verb], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=120)


def test_the_qmv_sweeps_script_builds_once_and_sweeps_both_prompts_qmv_and_stock(tmp_path):
    out = _sweeps(tmp_path, "run")
    assert out.returncode == 0, out.stdout + out.stderr
    work = tmp_path / "work"
    calls = (work / "calls").read_text().splitlines()
    assert all(c.startswith("QMV_CALL=compile ") for c in calls), calls  # said, for every step
    build = [c for c in calls if "lab.build_gpu" in c]
    assert len(build) == 1 and "--shape 5b" in build[0] and "--drafter-labels all --drafter-soft 0.5" in build[0]
    curves = [c for c in calls if " costcurve " in c]
    assert [c.split("--verify-linear ")[1].split()[0] for c in curves] == ["stock", "qmv"]
    sweeps = [c for c in calls if " sweep " in c]
    assert len(sweeps) == 4
    for c, (vl, p) in zip(sweeps, [("qmv", 0), ("stock", 0), ("qmv", 6), ("stock", 6)]):
        assert f"--verify-linear {vl} " in c and f"records-{vl}-4bit-p{p}" in c, c
        assert "--target " + str(work / "gpupair" / "target-4bit") in c and "--draft " + str(work / "gpupair" / "drafter") in c
        assert "-n 5 --sequential --max-reps 10 --max-seconds 110 --max-tokens 256 --verify-attention rows" in c, c
        assert ("--widths 2,3,4,5,6,7,8,12,16 " if vl == "qmv" else "--widths 2,3,4,5,6,7,8 ") in c, c
    assert "--prompt-file " + str(work / "gpupair" / "prompt.txt") in sweeps[0]
    assert "--prompt-file " + str(work / "qmv-results" / "prompt6.txt") in sweeps[2]
    assert (work / "qmv-results" / "prompt6.txt").read_text() == "the sixth"
    assert (work / "qmv-results" / "done").exists()
    # a second run finds the pair and does not build it again; pack leaves one archive in $OUT
    (work / "calls").unlink()
    assert _sweeps(tmp_path, "run", BLOCKWIDTH_QMV_CALL="direct").returncode == 0
    calls = (work / "calls").read_text().splitlines()
    assert not any("lab.build_gpu" in c for c in calls) and all(c.startswith("QMV_CALL=direct ") for c in calls)
    out = _sweeps(tmp_path, "pack", OUT=str(tmp_path))
    assert out.returncode == 0 and "qmv sweeps: done" in out.stdout and (tmp_path / "qmv-sweeps.tgz").stat().st_size > 0
    assert _sweeps(tmp_path, "go").returncode == 2
