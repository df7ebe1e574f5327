"""The resolver per arm, without any device."""

from pathlib import Path

import pytest

from blockwidth.policy.device import Backend, parse_device_spec, DeviceSpecError
from blockwidth.policy.drafter import DrafterKind, detect_drafter
from blockwidth.policy.profile import Entry, Profile
from blockwidth.policy.quantization import classify
from blockwidth.policy.resolve import Source, WidthError, resolve

AFFINE4 = classify({"quantization": {"group_size": 64, "bits": 4}})
NVFP4 = classify({"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4"}})
BF16 = classify({"torch_dtype": "bfloat16"})
GB10 = parse_device_spec("cuda:12.1")
H200 = parse_device_spec("cuda:9.0")
TURING = parse_device_spec("cuda:7.5")
CPU = parse_device_spec("cpu")
METAL = parse_device_spec("metal")


def r(**kw):
    kw.setdefault("drafter_kind", DrafterKind.DFLASH)
    kw.setdefault("device", GB10)
    kw.setdefault("quantization", AFFINE4)
    return resolve(**kw)


def test_gb10_affine_dflash_is_measured_default():
    res = r()
    assert (res.width, res.source) == (4, Source.TABLE)
    assert "draft-block-width-default-gb10-2026-09-20" in res.reason


def test_every_table_row_names_its_record_and_says_whether_output_matched():
    from blockwidth.policy import resolve as res_mod
    from blockwidth.policy.table import TABLE

    for row in TABLE:
        assert row.record and row.mlx and row.evidence
        assert row.byte_identical in (True, False, None)
    assert res_mod._identity_note(None) == ""
    assert "byte-identical to classic" in res_mod._identity_note(True)
    assert "not byte-identical" in res_mod._identity_note(False)


def test_gb10_nvfp4_falls_back_naming_inputs():
    res = r(quantization=NVFP4)
    assert (res.width, res.source) == (16, Source.FALLBACK)
    assert "sm_121" in res.reason and "nvfp4" in res.reason


def test_reason_shape_matches_design():
    res = r(device=H200)
    assert res.reason.startswith("16 (per-kind default: no measurement for dflash drafter on cuda sm_90 "
                                 "with an affine 4-bit g64 target")


@pytest.mark.parametrize("device", [METAL, TURING, H200])
def test_no_table_row_off_gb10(device):
    res = r(device=device)
    assert (res.width, res.source) == (16, Source.FALLBACK)


def test_a_declared_width_a_committed_record_measured_slower_is_not_the_first_answer():
    """The demo DFlash drafter declares 16; the committed CPU sweeps measured 16 slower than
    classic (bf16: the slowest but one; 4-bit: every width slower). The declaration is passed
    over, and the chain says which record contradicted it."""
    declared = dict(drafter_kind=DrafterKind.DFLASH, device=CPU, declared_width=16,
                    declared_detail="block_size 16")
    bf16 = r(quantization=BF16, **declared)
    assert (bf16.width, bf16.source) == (4, Source.TABLE)
    assert "not a win there" in bf16.reason and "sweep-dflash-bf16-cpu.json" in bf16.reason
    step = next(s for s in bf16.chain if s.source is Source.DRAFTER)
    assert not step.applied and step.width == 16 and "passed over" in step.why
    four = r(quantization=AFFINE4, **declared)
    assert (four.width, four.source, four.decline) == (None, Source.TABLE, True)
    assert "every width measured was slower" in four.reason
    # the seeds' case: a b16 DFlash drafter on a GB10, where the record measured 16 losing to 4
    gb10 = r(device=GB10, drafter_kind=DrafterKind.DFLASH, declared_width=16)
    assert (gb10.width, gb10.source) == (4, Source.TABLE)
    # a declared width no record contradicts still applies
    assert r(quantization=BF16, **{**declared, "declared_width": 3}).source is Source.DRAFTER


def test_each_table_rows_slower_widths_are_slower_in_its_committed_record():
    """A row's ``slower`` widths pass over declarations: each must be "slower" in the record it
    names (where that record is committed here), and its width the fastest that is not."""
    from blockwidth.engine.session.record import load
    from blockwidth.policy.table import TABLE

    root = Path(__file__).resolve().parent.parent
    checked = 0
    for row in TABLE:
        path = root / row.record
        if not path.is_file():
            continue  # the GB10 row's record is another project's
        rec = load(path)
        arms = {a["width"]: a for a in rec["arms"] if a["width"] is not None}
        for w in row.slower:
            assert arms[w]["verdict"] == "slower", (row.record, w)
        rest = [w for w in arms if w not in row.slower]
        if row.width is None:
            assert not rest, row.record
        else:
            best = max(rest, key=lambda w: arms[w]["decode_tok_s"][1])
            assert best == row.width and (arms[best]["verdict"] == "wins") is row.won, row.record
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("kind,width", [(DrafterKind.DFLASH, 16), (DrafterKind.MTP, 4),
                                        (DrafterKind.MODEL, 4), (DrafterKind.LOOKUP, 4),
                                        (DrafterKind.EAGLE, 4)])
def test_kind_fallbacks(kind, width):
    res = r(drafter_kind=kind, device=METAL)  # the CPU has measured DFlash rows
    assert (res.width, res.source) == (width, Source.FALLBACK)


def profile_with(*entries):
    from pathlib import Path
    return Profile(Path("/tmp/p.toml"), tuple(entries), True)


GB10_ENTRY = Entry(backend=Backend.CUDA, compute_capability="12.1", drafter_kind=DrafterKind.DFLASH,
                      width=6, quant_scheme="affine", quant_bits=4, quant_group_size=64, mlx="0.32.4")


def test_precedence_each_level():
    env = {"BLOCKWIDTH_DRAFT_BLOCK_SIZE": "5"}
    prof = profile_with(GB10_ENTRY)
    full = dict(flag="3", env=env, profile=prof, declared_width=8)
    assert r(**full).source is Source.FLAG and r(**full).width == 3
    full.pop("flag")
    assert (r(**full).source, r(**full).width) == (Source.ENV, 5)
    full.pop("env")
    assert (r(**full).source, r(**full).width) == (Source.PROFILE, 6)
    full.pop("profile")
    assert (r(**full).source, r(**full).width) == (Source.DRAFTER, 8)
    full.pop("declared_width")
    assert (r(**full).source, r(**full).width) == (Source.TABLE, 4)


def test_explicit_16_stays_16_on_gb10():
    assert r(flag=16).width == 16
    assert r(env={"BLOCKWIDTH_DRAFT_BLOCK_SIZE": "16"}).width == 16


def test_env_names_which_variable():
    res = r(env={"MLXCEL_DRAFT_BLOCK_SIZE": "7"})
    assert res.width == 7 and "MLXCEL_DRAFT_BLOCK_SIZE" in res.reason
    both = r(env={"MLXCEL_DRAFT_BLOCK_SIZE": "7", "BLOCKWIDTH_DRAFT_BLOCK_SIZE": "9"})
    assert both.width == 9 and "MLXCEL_DRAFT_BLOCK_SIZE also set and ignored" in both.reason


@pytest.mark.parametrize("bad", ["0", "1", "-3", "abc", "10000", "4.5", ""])
def test_invalid_flag(bad):
    with pytest.raises(WidthError) as e:
        r(flag=bad)
    assert "--draft-block-size" in str(e.value) and "2 to 64" in str(e.value)


@pytest.mark.parametrize("bad", ["0", "1", "-3", "abc", "10000"])
def test_invalid_env(bad):
    with pytest.raises(WidthError) as e:
        r(env={"BLOCKWIDTH_DRAFT_BLOCK_SIZE": bad})
    assert "BLOCKWIDTH_DRAFT_BLOCK_SIZE" in str(e.value)


def test_chain_lists_every_source_once():
    res = r(device=METAL)
    assert [s.source for s in res.chain] == list(Source)
    assert [s.applied for s in res.chain] == [False] * 5 + [True]
    top = r(flag=3)
    assert [s.source for s in top.chain] == list(Source) and top.chain[0].applied


def test_profile_pair_specific_beats_generic_and_stale():
    from dataclasses import replace
    specific = replace(GB10_ENTRY, width=9, pair="abc+def", mlx="0.31.0")
    prof = profile_with(GB10_ENTRY, specific)
    assert r(profile=prof, pair="abc+def").width == 9
    assert r(profile=prof, pair="other").width == 6
    stale = r(profile=prof, pair="abc+def", mlx_version="0.32.4")
    assert stale.stale and "stale" in stale.reason and "0.31.0" in stale.reason
    assert not r(profile=prof, pair="other", mlx_version="0.32.4").stale


def test_profile_must_match_device_quant_kind():
    prof = profile_with(GB10_ENTRY)
    assert r(profile=prof, device=H200).source is Source.FALLBACK
    assert r(profile=prof, quantization=NVFP4).source is Source.FALLBACK
    assert r(profile=prof, drafter_kind=DrafterKind.MODEL).source is Source.FALLBACK


def test_profile_decline_means_classic():
    from dataclasses import replace
    prof = profile_with(replace(GB10_ENTRY, width=None, decline=True))
    res = r(profile=prof)
    assert res.width is None and res.decline and res.source is Source.PROFILE
    assert res.to_dict()["width"] is None and "no width beat classic" in res.reason


def test_drafter_detection():
    d = detect_drafter({"architectures": ["DFlashDraftModel"], "block_size": 16})
    assert (d.kind, d.declared_width) == (DrafterKind.DFLASH, 16)
    assert detect_drafter({"architectures": ["LlamaForCausalLM"]}).kind is DrafterKind.MODEL
    assert detect_drafter({"architectures": ["Eagle3LlamaForCausalLM"]}).kind is DrafterKind.EAGLE
    assert detect_drafter({"architectures": ["DeepseekV3MTP"]}).kind is DrafterKind.MTP
    e = detect_drafter({"architectures": ["EagleLlamaForCausalLM"], "num_speculative_tokens": 5})
    assert e.declared_width == 6


def test_declared_width_used_then_out_of_range_ignored():
    # metal: no committed record contradicts a DFlash declaration there (the CPU's does: above)
    res = r(declared_width=12, declared_detail="block_size 12", device=METAL)
    assert (res.width, res.source) == (12, Source.DRAFTER)
    assert res.reason == "12 (drafter checkpoint: block_size 12)"
    d = detect_drafter({"architectures": ["DFlashDraftModel"], "block_size": 16})
    said = r(declared_width=d.declared_width, declared_detail=d.detail, device=METAL).reason
    assert said == "16 (drafter checkpoint: architectures ['DFlashDraftModel'] name DFlash; declares block_size 16)"
    bad = r(declared_width=1000, device=METAL)
    assert bad.source is Source.FALLBACK and "outside" in bad.chain[3].why


@pytest.mark.parametrize("spec,backend,cc", [("cuda:9.0", "cuda", "9.0"), ("cuda:12.1", "cuda", "12.1"),
                                             ("metal", "metal", None), ("cpu", "cpu", None)])
def test_device_specs(spec, backend, cc):
    d = parse_device_spec(spec)
    assert (d.backend.value, d.compute_capability, d.probed) == (backend, cc, False)


@pytest.mark.parametrize("bad", ["cuda", "tpu", "cuda:nine", "cpu:1.0"])
def test_bad_device_specs(bad):
    with pytest.raises(DeviceSpecError):
        parse_device_spec(bad)


def test_entries_record_and_match_the_device_name():
    """An H200 measurement must not silently match an H100 of the same compute capability."""
    from blockwidth.policy.device import Device
    from blockwidth.policy.quantization import Quantization, Scheme

    q = Quantization(Scheme.AFFINE, 4, 64)
    h200 = Entry(backend=Backend.CUDA, drafter_kind=DrafterKind.MODEL, width=8, compute_capability="9.0",
                    device_name="NVIDIA H200")
    generic = Entry(backend=Backend.CUDA, drafter_kind=DrafterKind.MODEL, width=5, compute_capability="9.0")
    prof = Profile(Path("p.toml"), (h200,), True)
    on = lambda name: Device(Backend.CUDA, name=name, architecture="sm_90", compute_capability="9.0",  # noqa: E731
                             probed=bool(name))
    kw = dict(drafter_kind=DrafterKind.MODEL, quantization=q)
    r = resolve(device=on("NVIDIA H200"), profile=prof, **kw)
    assert (r.width, r.source) == (8, Source.PROFILE) and "matched only" not in r.reason
    r = resolve(device=on("NVIDIA H100 80GB HBM3"), profile=prof, **kw)
    assert r.source is not Source.PROFILE
    r = resolve(device=on(""), profile=prof, **kw)  # --device cuda:9.0 names no GPU
    assert r.width == 8 and "matched only by compute capability" in r.reason and "NVIDIA H200" in r.reason
    r = resolve(device=on("NVIDIA H100 80GB HBM3"), profile=Profile(Path("p.toml"), (generic,), True), **kw)
    assert r.width == 5 and "matched only by compute capability 9.0" in r.reason


def test_nvml_describes_the_gpu_cuda_visible_devices_selects():
    from blockwidth.engine.device import nvml_handle
    from blockwidth.policy.device import visible_device

    class Lib:  # records which NVML lookup was asked for; not an engine stand-in
        def nvmlDeviceGetHandleByIndex(self, i):
            return ("index", i)

        def nvmlDeviceGetHandleByUUID(self, u):
            return ("uuid", u)

    assert nvml_handle(Lib(), {}) == ("index", 0)
    assert nvml_handle(Lib(), {"CUDA_VISIBLE_DEVICES": "3,1"}) == ("index", 3)
    assert nvml_handle(Lib(), {"CUDA_VISIBLE_DEVICES": "GPU-8a9b,GPU-1"}) == ("uuid", "GPU-8a9b")
    assert visible_device({"CUDA_VISIBLE_DEVICES": ""}) == ""
    with pytest.raises(LookupError):
        nvml_handle(Lib(), {"CUDA_VISIBLE_DEVICES": ""})


def test_the_profile_step_says_when_there_is_no_profile_or_no_entry(tmp_path):
    from blockwidth.policy import profile as profiles

    missing = profiles.load(tmp_path / "none.toml", missing_ok=True)
    (tmp_path / "empty.toml").write_text("schema = 1\n")
    empty = profiles.load(tmp_path / "empty.toml")
    steps = {name: next(s for s in r(profile=p).chain if s.source is Source.PROFILE).why
             for name, p in (("missing", missing), ("empty", empty))}
    assert steps["missing"].startswith(f"{tmp_path / 'none.toml'} is not present: nothing measured")
    assert steps["empty"].startswith(f"{tmp_path / 'empty.toml'} has no entries: nothing measured")
    assert "of 0" not in steps["missing"] + steps["empty"]
