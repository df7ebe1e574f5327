"""Bounds checked where values enter (policy/): an auto plan's costs and widths, a profile's
nesting (dotted keys too), entry counts with work linear in them, a config's sizes before a model
is built from it, names longer than a file system takes, error lines, and a rank's launch
environment. Each case is one line and exit 2 (or, for a group that never forms, a bounded
stop), never a traceback, a hang or unbounded memory. In-process, except a rank's environment:
a rank's watchdog ends its own process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from blockwidth.console import cli
from blockwidth.policy import checks
from blockwidth.policy import profile as profiles
from blockwidth.policy.device import Backend, Device
from tests.conftest import ROOT

DEMO = ROOT / "engine/demo/pair"


def one_line(capsys, code: int, expected: int = 2) -> str:
    out, err = capsys.readouterr()
    assert code == expected, (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def _auto(tmp_path: Path, **change) -> Path:
    plan = {"acceptance": 0.8, "max_width": 8, "draft": "linear", "draft_ms": 0.0, "overhead_ms": 0.0,
            "verify_ms": {"1": 45.7, "2": 62.4, "4": 59.7, "8": 114.5}}
    plan.update(change)
    p = tmp_path / "p.toml"
    verify = ", ".join(f'"{k}" = {v}' for k, v in plan.pop("verify_ms").items())
    rest = "\n".join(f"{k} = {json.dumps(v)}" for k, v in plan.items())
    p.write_text(f'schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = "auto"\n\n'
                 f'[override.auto]\n{rest}\nverify_ms = {{ {verify} }}\n')
    return p


@pytest.mark.parametrize("change,said", [
    ({"verify_ms": {"1": 45.7, "2": 0, "4": 59.7}}, "verify_ms[2] = 0: expected a time in ms, above 0"),
    ({"max_width": 1000}, "max_width = 1000: expected an integer 2..64"),
    ({"max_width": 100000}, "max_width = 100000: expected an integer 2..64"),
    ({"verify_ms": {"1": 45.7, "2": 62.4, "1000": 900.0}}, "row count '1000' is not an integer 1..64"),
])
def test_an_auto_plan_out_of_bounds_is_refused_where_the_profile_is_read(capsys, tmp_path, change, said):
    """verify_ms 0 at 2 rows was a ZeroDivisionError traceback; max_width 1000 answered
    --num-draft-tokens 999, and 100,000 had check --measure calibrate until it hung at 1.3 GB."""
    p = _auto(tmp_path, **change)
    with pytest.raises(profiles.ProfileError) as e:
        profiles.load(p)
    assert said in str(e.value), str(e.value)
    for argv in (["resolve", "--profile", str(p)], ["check", "--measure", "--profile", str(p)]):
        err = one_line(capsys, cli.main(argv))
        assert said in err and "entry 1" in err, err


@pytest.mark.parametrize("text", [
    "schema = 1\n" + "a" + ".a" * 20000 + " = 1\n",
    "schema = 1\n[" + "a." * 20000 + "a]\nx = 1\n",
    "schema = 1\nx = { " + "a." * 20000 + "a = 1 }\n",
], ids=["key", "table", "inline"])
def test_a_profile_nested_by_dotted_keys_is_refused_before_it_is_parsed(tmp_path, text):
    """40 KB of one dotted key 20,000 parts deep took tomllib to 1.56 GiB in 5 s."""
    p = tmp_path / "p.toml"
    p.write_text(text)
    tracemalloc.start()
    try:
        with pytest.raises(profiles.ProfileError, match="nested deeper than 200 levels"):
            profiles.load(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # (the read itself asks for a buffer of the profile's bound, 16 MiB; tomllib took 1.56 GiB)
    assert peak < 64 << 20, f"{peak / 2**20:.1f} MiB to refuse it"


def _cuda_entries(n: int) -> str:
    return "schema = 1\n" + "".join(
        f'\n[[override]]\nbackend = "cuda"\ncompute_capability = "9.0"\ndrafter_kind = "model"\n'
        f'width = {2 + i % 60}\npair = "p{i:06d}"\nmlx = "0.32.4"\nevidence = {{ record = "r{i}.json" }}\n'
        for i in range(n))


def test_four_thousand_entries_are_checked_with_work_linear_in_them(capsys, tmp_path, monkeypatch):
    """check --device cuda:9.0 on 4,000 CUDA entries gave no answer in 45 s: the shadowing check
    compared every entry with every other (16 million comparisons). The work is counted here,
    not timed: match keys are read a few times per entry, not once per pair."""
    p = tmp_path / "many.toml"
    p.write_text(_cuda_entries(4000))
    calls = [0]
    slot = profiles.Entry.slot

    def counted(self, **kw):
        calls[0] += 1
        return slot(self, **kw)

    monkeypatch.setattr(profiles.Entry, "slot", counted)
    code = cli.main(["check", "--device", "cuda:9.0", "--profile", str(p), "--json"])
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert code == 1 and doc["counts"]["fail"] == 4000  # every record is missing
    assert calls[0] <= 5 * 4000, calls[0]


def test_shadowing_says_the_first_hundred_and_that_there_are_more():
    broad = [profiles.Entry(Backend.CUDA, profiles.DrafterKind.MODEL, 4, quant_scheme="affine", quant_bits=b)
             for b in range(1, 151)]
    narrow = [profiles.Entry(Backend.CUDA, profiles.DrafterKind.MODEL, 8, pair=f"p{i}") for i in range(2)]
    prof = profiles.Profile(Path("p.toml"), tuple(broad + narrow), True)
    found = checks.shadow_checks(prof, Device(Backend.CUDA, compute_capability="9.0"))
    assert len(found) == checks.MAX_SHADOWS + 1 and found[-1].name == "shadowing: more", len(found)
    assert all(c.status is checks.Status.WARN for c in found)


def test_a_profile_of_more_entries_than_the_bound_is_refused_before_they_are_built(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text("schema = 1\n" + "[[override]]\n" * (profiles.MAX_ENTRIES + 1))
    with pytest.raises(profiles.ProfileError, match=f"{profiles.MAX_ENTRIES + 1:,} entries: at most"):
        profiles.load(p)


# ---- sizes from configs ------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["top", "text_config"])
def test_config_sizes_are_bounded_before_a_model_is_built_from_them(capsys, tmp_path, monkeypatch, where):
    """resolve and inspect read configs only, and grew to 3 GiB in 13 s on a million layers:
    mlx-lm built the model (weights unevaluated) to plan its caches."""
    t = tmp_path / "target"
    shutil.copytree(DEMO / "target-bf16", t)
    config = json.loads((t / "config.json").read_text())
    if where == "top":
        config["num_hidden_layers"] = 1_000_000
    else:
        config["text_config"] = {"num_hidden_layers": 1_000_000}
    (t / "config.json").write_text(json.dumps(config))
    from blockwidth.engine import kvcache

    def built(config):
        raise AssertionError("a model was built from the config")

    monkeypatch.setattr(kvcache, "plan_config", built)
    name = "num_hidden_layers" if where == "top" else "text_config.num_hidden_layers"
    for argv in (["inspect", str(t)], ["resolve", "--target", str(t), "--draft", str(DEMO / "drafter")]):
        err = one_line(capsys, cli.main(argv))
        assert f"{name} = 1,000,000: more than any model states" in err, err


# ---- names ---------------------------------------------------------------------------------------

LONG_FOLDER = "/tmp/" + "f" * 300
HUB_ID = "owner/" + "m" * 5000


@pytest.mark.parametrize("argv,flag", [
    (["inspect", LONG_FOLDER], "inspect"),
    (["resolve", "--target", str(DEMO / "target-bf16"), "--draft", LONG_FOLDER], "--draft"),
    (["resolve", "--target", HUB_ID, "--draft", str(DEMO / "drafter")], "--target"),
    (["inspect", HUB_ID], "inspect"),
    (["sweep", "--target", LONG_FOLDER], "--target"),
    (["check", "--profile", LONG_FOLDER + "/p.toml"], "--profile"),
])
def test_a_name_longer_than_a_file_system_takes_is_one_line(capsys, argv, flag):
    """These were OSError: File name too long tracebacks."""
    err = one_line(capsys, cli.main(argv))
    assert flag in err and len(err) < 400 and ("bytes in a path" in err or "a path of" in err), err


def test_an_entrys_record_named_longer_than_a_file_system_takes_is_refused(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(f'schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
                 f'evidence = {{ record = "{"r" * 300}.json" }}\n')
    with pytest.raises(profiles.ProfileError, match="evidence.record: .* a name of 305 bytes"):
        profiles.load(p)


# ---- error lines -----------------------------------------------------------------------------------

@pytest.mark.parametrize("ids", [("x" * (1 << 20),) * 2, ("y" * (1 << 20), "z")], ids=["shared", "long"])
def test_a_megabyte_request_id_does_not_make_a_megabyte_line(capsys, tmp_path, ids):
    f = tmp_path / "w.jsonl"
    f.write_text("".join(json.dumps({"id": i, "prompt": "p"}) + "\n" for i in ids))
    err = one_line(capsys, cli.main(["sweep", "--workload", str(f)]))
    assert len(err) < 400 and '"id"' in err, err[:400]


def test_every_error_line_is_bounded(capsys):
    err = one_line(capsys, _exit_code(lambda: cli.main(["sweep", "--path", "x" * 100000])))
    assert len(err) <= 2200, len(err)


def _exit_code(call) -> int:
    try:
        return call()
    except SystemExit as e:  # argparse's own refusal leaves through SystemExit
        return e.code


# ---- a rank's launch environment (a process of its own: its watchdog ends the process) -------------

def _rank(tmp_path: Path, env: dict, *extra: str, timeout: float = 120) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "blockwidth", "costcurve", "--distributed", "tensor",
                           *extra], capture_output=True, text=True, env=full, cwd=ROOT, timeout=timeout)


@pytest.mark.parametrize("env,said", [
    ({"MLX_RANK": "abc"}, "MLX_RANK=abc: expected a whole number"),
    ({"MLX_RANK": "5", "MLX_WORLD_SIZE": "2"}, "MLX_RANK=5: not a rank of a group of 2"),
    ({"MLX_RANK": "0", "MLX_HOSTFILE": "FIFO"}, "is a FIFO, not a regular file"),
])
def test_a_launch_environment_that_names_no_rank_or_hosts_is_one_line(tmp_path, env, said):
    fifo = tmp_path / "hosts"
    os.mkfifo(fifo)  # nobody writes it: MLX's read of it blocked with the interpreter held
    env = {"MLX_HOSTFILE": str(fifo), **env}
    if env["MLX_HOSTFILE"] == "FIFO":
        env["MLX_HOSTFILE"] = str(fifo)
    r = _rank(tmp_path, env, "--group-timeout", "30")
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert r.stderr.count("\n") == 1 and said in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_rank_whose_peer_never_joins_stops_at_its_group_timeout(tmp_path):
    """MLX waits for the peer with the interpreter held, so the rank's own timer never ran and
    the rank hung past --group-timeout 5: a process apart stops it (the subprocess's timeout is
    the hang bound here, not a speed claim)."""
    hosts = tmp_path / "hosts.json"
    from tests.test_served import _free_port

    ports = [_free_port(), _free_port()]
    hosts.write_text(json.dumps([[f"127.0.0.1:{ports[0]}"], [f"127.0.0.1:{ports[1]}"]]))  # rank 1 never starts
    r = _rank(tmp_path, {"MLX_RANK": "0", "MLX_HOSTFILE": str(hosts)}, "--group-timeout", "2", timeout=90)
    assert r.returncode in (124, -9), (r.returncode, r.stderr)
    assert "rank stopped after --group-timeout 2s" in r.stderr and "Traceback" not in r.stderr, r.stderr
