"""A target sharded with MLX's distributed layer (docs/distributed.md): two processes on this machine, the
ring backend on 127.0.0.1 only, every subprocess bounded in time.

The demo target tensor-sharded (its 4 heads and 2 KV heads split 2 ways) and pipeline-split (the
demo target written as mlx-lm's qwen2, the family of its kind that has a pipeline split in this
mlx-lm; llama has none): classic equals the unsharded classic's tokens, widths 2 and 4 equal
classic byte for byte, every rank agrees at every forward, and the record names the group. The
group key keeps a group's width and one device's apart.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

GROUP_TIMEOUT = "420"  # every rank stops by then, whatever it is doing (a shared 2-core runner)
TOKENS = 16  # several rounds at widths 2 and 4; each group start is most of a test's time


def _sha(tokens) -> str:
    from blockwidth.engine.distributed import digest

    return digest(tokens)


@pytest.fixture(scope="module")
def qwen2_target(tmp_path_factory) -> Path:
    """The demo target as mlx-lm's qwen2 (zero q/k/v biases: the same function), whose model
    has ``pipeline(group)``; a single weights file, as the demo's (blockwidth writes the index
    mlx-lm's pipeline loader reads)."""
    from blockwidth.engine.demo import target
    from tests.qwen2_form import write

    return write(target("bf16"), tmp_path_factory.mktemp("qwen2") / "target-qwen2")


def _classic(target: Path, ids: list[int] | None = None) -> list[int]:
    """The unsharded classic's tokens of the sweep's default prompt (as this target's tokenizer
    reads it, as the sweep does, unless ``ids``), in this process."""
    from blockwidth.engine.decode import classic
    from blockwidth.engine.demo.prompts import DEFAULT_PROMPT
    from blockwidth.engine.pair import load_pair

    pair = load_pair(target, None, "lookup")
    return classic(pair, ids or pair.tokenizer.encode(DEFAULT_PROMPT), TOKENS).tokens


def _demo_ids() -> list[int]:
    from blockwidth.engine.demo.prompts import DEFAULT_PROMPT
    from blockwidth.engine.pair import load_pair
    from blockwidth.engine.demo import target

    return load_pair(target("bf16"), None, "lookup").tokenizer.encode(DEFAULT_PROMPT)


def _sweep(tmp_path: Path, sharding: str, *extra: str):
    rec_dir = tmp_path / "records"
    r = run_cli("sweep", "--distributed", sharding, "--ranks", "2", "--group-backend", "ring",
                "--agree", "round", "--widths", "2,4", "-n", "1", "--max-tokens", str(TOKENS),
                "--record-dir", str(rec_dir), "--group-timeout", GROUP_TIMEOUT, "--json", *extra,
                env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)  # rank 0's JSON alone: another rank printing would break it
    record = json.loads(Path(out["record_path"]).read_text())
    assert sorted(p.name for p in rec_dir.iterdir()) == [Path(out["record_path"]).name]  # rank 0's only
    return out, record


def _judge(record: dict, unsharded: list[int], sharding: str, drafter: str) -> None:
    group = record["group"]
    assert (group["backend"], group["sharding"], group["size"]) == ("ring", sharding, 2)
    assert [m["backend"] for m in group["members"]] == ["cpu", "cpu"]
    assert [x["rank"] for x in group["ranks"]] == [0, 1]
    assert record["host"]["device"]["group"]["sharding"] == sharding  # what the profile keys on
    assert group["drafter"] == drafter and group["launcher"] == "blockwidth --ranks"
    agree = group["agreement"]
    assert agree["every"] == "round" and agree["agreed"] and agree["forwards_compared"] > 0
    assert agree["runs_compared"] == len(agree["runs"]) >= 7  # 3 warm-ups, 3 runs, the closing
    arms = {a["arm"]: a for a in record["arms"]}
    classic = [s["tokens_sha256"] for s in arms["classic"]["samples"]]
    assert classic and set(classic) == {_sha(unsharded)}  # the sharded classic is the unsharded's
    for w in ("w2", "w4"):
        assert [s["tokens_sha256"] for s in arms[w]["samples"]] == [classic[0]]  # byte for byte
        assert arms[w]["identity"]["identical_ids"] and arms[w]["identity"]["identical_bytes"]
    points = group["communication"]["points"]
    assert [p["rows"] for p in points] == [1, 2, 4] and all(p["median_ms"] > 0 for p in points)


def test_tensor_sharded_demo_target(tmp_path):
    from blockwidth.engine.demo import target

    out, record = _sweep(tmp_path, "tensor")
    assert out["group"]["communication"]["collectives"].startswith("12 all_sum of [1, rows, 256]")
    _judge(record, _classic(target("bf16")), "tensor", "replicated")


def test_pipeline_split_demo_target(tmp_path, qwen2_target):
    from blockwidth.engine.demo import target

    ids = _demo_ids()  # transformers reads a qwen2 folder with Qwen2Tokenizer: same vocabulary,
    assert _classic(qwen2_target, ids) == _classic(target("bf16"), ids)  # the demo target's function
    unsharded = _classic(qwen2_target)  # ... and the prompt as that tokenizer reads it, as sweep does
    out, record = _sweep(tmp_path, "pipeline", "--target", str(qwen2_target),
                         "--draft", str(ROOT / "engine/demo/pair/drafter"), "--drafter-on", "rank0")
    assert "send/recv" in out["group"]["communication"]["collectives"]
    _judge(record, unsharded, "pipeline", "rank0")


def test_text_output_is_rank_zeros_alone(tmp_path):
    r = run_cli("costcurve", "--distributed", "tensor", "--ranks", "2", "--group-backend", "ring",
                "--rows", "1,2", "--repeats", "2", "--context", "16", "--group-timeout", GROUP_TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("verify-forward time by rows") == 1
    assert "group  2 ranks over ring, tensor-sharded" in r.stdout
    assert "communication of one forward, alone (12 all_sum" in r.stdout
    assert "not measurable apart" in r.stdout


def test_llama_has_no_pipeline_split(tmp_path):
    r = run_cli("sweep", "--distributed", "pipeline", "--ranks", "2", "--group-backend", "ring",
                "--kind", "lookup", "--widths", "2", "-n", "1", "--max-tokens", "2",
                "--record-dir", str(tmp_path), "--group-timeout", GROUP_TIMEOUT)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "llama model has no pipeline split" in r.stderr
    assert "Traceback" not in r.stderr and not list(tmp_path.iterdir())


def test_ranks_that_disagree_are_caught(tmp_path):
    from blockwidth.console import distributed

    port = distributed._free_ports(2)
    cmd = [sys.executable, "-c", distributed.LAUNCH, "--hosts", "127.0.0.1", "-n", "2", "--backend",
           "ring", "--starting-port", str(port), "--", sys.executable, str(ROOT / "tests/distributed_rank.py"),
           str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert distributed.run_group(cmd, env, 300) is None
    seen = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for s in seen:
        assert s["decode_s"] == 0.2 and s["verify_s"] == [0.01] * 3  # rank 0's clock on both
        assert "run 2 (w4): rank 1 decoded other tokens than rank 0" in s["tokens_differ"]
        assert "forward 2: rank 1 fed other tokens" in s["inputs_differ"]
        assert s["forwards"] == 1 and s["budget"] == "seconds" and s["gathered"] == ["x", "xx"]
        assert s["group"]["members"] == [{"backend": "cpu", "device_name": s["group"]["members"][0]["device_name"]}] * 2


def test_the_group_is_stopped_past_its_timeout(tmp_path):
    from blockwidth.console import distributed

    port = distributed._free_ports(2)
    sleeper = ("import os, sys, time; open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close(); "
               "time.sleep(600)")
    cmd = [sys.executable, "-c", distributed.LAUNCH, "--hosts", "127.0.0.1", "-n", "2", "--backend",
           "ring", "--starting-port", str(port), "--", sys.executable, "-c", sleeper, str(tmp_path)]
    t0 = time.monotonic()
    code = distributed.run_group(cmd, dict(os.environ), 8)
    assert code == 124 and time.monotonic() - t0 < 40
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 2  # both ranks had started
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("argv, said", [
    (["sweep", "--ranks", "2"], "--ranks only applies with --distributed"),
    (["sweep", "--distributed", "tensor"], "no group: run under mlx.launch"),
    (["sweep", "--distributed", "tensor", "--kind", "dflash"], "--kind dflash with --distributed"),
    (["sweep", "--distributed", "tensor", "--ranks", "9"], "--ranks"),
    (["costcurve", "--agree", "round"], "unrecognized arguments"),
])
def test_refused_in_one_line(argv, said, blockwidth):
    r = blockwidth(*argv)
    assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- the group key (pure) -----------------------------------------------------------------------

def _one_gpu():
    from blockwidth.policy.device import Backend, Device

    return Device(Backend.CUDA, "NVIDIA H200", "sm_90", "9.0", probed=True)


def _entry(group=None, width=4):
    from blockwidth.policy.device import Backend
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.profile import Entry

    return Entry(Backend.CUDA, DrafterKind.MODEL, width, compute_capability="9.0",
                    device_name="NVIDIA H200", quant_scheme="affine", quant_bits=4, quant_group_size=64,
                    mlx="0.32.4", group=group)


def test_a_groups_width_never_matches_one_device_nor_the_reverse():
    from blockwidth.policy.device import parse_group_spec
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.profile import Profile
    from blockwidth.policy.quantization import Quantization, Scheme

    one = _one_gpu()
    two = parse_group_spec("nccl:2:tensor", one)
    grouped, single = _entry(two.group, 6), _entry(None, 4)
    q = Quantization(Scheme.AFFINE, bits=4, group_size=64)
    prof = Profile(Path("p.toml"), (grouped, single), True)
    assert prof.match(one, q, DrafterKind.MODEL, None) is single
    assert prof.match(two, q, DrafterKind.MODEL, None) is grouped
    for other in ("nccl:2:pipeline", "ring:2:tensor", "nccl:4:tensor"):
        assert prof.match(parse_group_spec(other, one), q, DrafterKind.MODEL, None) is None, other
    assert "this is a single device" in grouped.device_mismatch(one)
    assert "for a single device" in single.device_mismatch(two)
    assert grouped.slot() != single.slot()  # both can be saved: two situations


def test_group_members_are_compared_rank_by_rank():
    import dataclasses

    from blockwidth.policy.device import Backend, Device, Member, parse_group_spec

    two = parse_group_spec("nccl:2:tensor", _one_gpu())
    mixed = dataclasses.replace(two, group=dataclasses.replace(
        two.group, members=(two.group.members[0], Member(Backend.CUDA, "8.0", "NVIDIA A100"))))
    why = _entry(two.group).device_mismatch(mixed)
    assert why and "rank 1 here" in why and "8.0" in why
    named = parse_group_spec("nccl:2:tensor", Device(Backend.CUDA, "", "sm_90", "9.0"))
    assert _entry(two.group).device_mismatch(named) is None  # a named device has no name to compare


def test_profile_entry_of_a_group_round_trips_and_is_validated():
    from blockwidth.policy.device import parse_group_spec
    from blockwidth.policy.profile import ProfileError, dumps, parse

    e = _entry(parse_group_spec("nccl:2:tensor", _one_gpu()).group)
    text = dumps([e])
    assert "[override.group]" in text and 'sharding = "tensor"' in text
    assert parse(text, Path("p.toml"))[0] == e
    bad = text.replace("size = 2", "size = 3").replace('backend = "nccl"', 'backend = "gloo"')
    with pytest.raises(ProfileError) as info:
        parse(bad, Path("p.toml"))
    said = str(info.value)
    assert "group.backend = 'gloo'" in said and "lists 2 devices for group.size = 3" in said


def test_sweep_save_writes_the_group(tmp_path):
    """What sweep --save stores from a session run in a group: its entry names the group."""
    from blockwidth.console.outcome import PairFacts, profile_entry
    from blockwidth.policy.device import parse_group_spec
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.quantization import Quantization, Scheme
    from tests.states import fixture_session  # a decided session (w4 wins), judged by the real rules

    device = parse_group_spec("ring:2:pipeline", _one_gpu())
    entry = profile_entry(fixture_session(), PairFacts(DrafterKind.MODEL, Quantization(Scheme.NONE), "p" * 16),
                          device, mlx="0.32.4", measured_at="2026-12-01T00:00:00Z", record="r.json")
    assert entry.group == device.group
    assert "2 ranks over ring, pipeline-sharded" in entry.describe_keys()


def test_check_skips_another_groups_entry(tmp_path):
    from blockwidth.console.check import entry_checks
    from blockwidth.policy.checks import Status
    from blockwidth.policy.device import parse_group_spec
    from blockwidth.policy.profile import Profile

    grouped = _entry(parse_group_spec("nccl:2:tensor", _one_gpu()).group)
    prof = Profile(tmp_path / "p.toml", (grouped,), True)
    first = entry_checks(prof, _one_gpu(), "0.32.4")[0]
    assert first.status is Status.SKIP and "2 ranks over nccl, tensor-sharded" in first.detail
    here = entry_checks(prof, parse_group_spec("nccl:2:tensor", _one_gpu()), "0.32.4")[0]
    assert here.status is Status.PASS


def test_launched_backend_and_what_cannot_split():
    from blockwidth.engine.distributed import launched_backend, shard_problem
    from blockwidth.policy.device import Sharding

    assert launched_backend({"MLX_RANK": "0", "MLX_HOSTFILE": "/tmp/h"}) == "ring"
    assert launched_backend({"MLX_RANK": "1", "MLX_WORLD_SIZE": "2", "NCCL_HOST_IP": "1.2.3.4"}) == "nccl"
    assert launched_backend({"OMPI_COMM_WORLD_SIZE": "2"}) == "mpi"
    assert launched_backend({}) is None
    demo = {"num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 640, "num_hidden_layers": 6}
    assert shard_problem(demo, Sharding.TENSOR, 2) is None
    assert "num_key_value_heads = 2" in shard_problem(demo, Sharding.TENSOR, 4)
    assert shard_problem(demo, Sharding.PIPELINE, 6) is None
    assert "fewer layers" in shard_problem(demo, Sharding.PIPELINE, 8)


def test_resolve_for_a_group_named_with_device(tmp_path, blockwidth):
    from blockwidth.policy.device import Backend, Device, group_of
    from blockwidth.policy.drafter import DrafterKind
    from blockwidth.policy.profile import Entry, dumps

    group = group_of(Device(Backend.CPU), "ring", "tensor", 2)
    entry = Entry(Backend.CPU, DrafterKind.MODEL, 3, mlx="0.32.4", quant_scheme="none", group=group)
    prof = tmp_path / "profile.toml"
    prof.write_text(dumps([entry]))
    grouped = json.loads(blockwidth("resolve", "--device", "cpu@ring:2:tensor", "--profile", str(prof),
                                    "--json").stdout)
    assert (grouped["width"], grouped["source"]) == (3, "profile")
    assert grouped["device"]["group"]["size"] == 2
    alone = json.loads(blockwidth("resolve", "--device", "cpu", "--profile", str(prof), "--json").stdout)
    assert alone["source"] != "profile" and alone["width"] != 3


def test_every_rank_adds_rank_zeros_width_in_effect(tmp_path):
    """sweep --save --profile P adds the width P gives for this group (3 here) to the arms.
    Only rank 0 reads P (a follower runs without one), so every rank must take rank 0's width
    in effect, or a follower runs one arm fewer and the group parts ways at its first run."""
    prof = tmp_path / "profile.toml"
    prof.write_text('schema = 1\n\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 3\n'
                    'target_quantization = {scheme = "none"}\n\n[override.group]\nbackend = "ring"\n'
                    'sharding = "tensor"\nsize = 2\nmembers = [{backend = "cpu"}, {backend = "cpu"}]\n')
    before = prof.read_text()
    r = run_cli("sweep", "--distributed", "tensor", "--ranks", "2", "--group-backend", "ring",
                "--widths", "2", "-n", "1", "--max-tokens", str(TOKENS), "--record-dir", str(tmp_path / "r"),
                "--group-timeout", GROUP_TIMEOUT, "--save", "--profile", str(prof), "--json",
                env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert r.returncode in (0, 1), r.stderr[-3000:]  # 1: n = 1 decides nothing, so nothing is saved
    out = json.loads(r.stdout)
    record = json.loads(Path(out["record_path"]).read_text())
    assert [a["arm"] for a in record["arms"]] == ["classic", "w2", "w3"]
    assert record["group"]["agreement"]["agreed"]
    if r.returncode == 1:
        assert prof.read_text() == before
