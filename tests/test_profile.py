"""The TOML profile: round trip, concurrent writers, corrupt files left alone."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from policy import profile
from policy.device import Backend
from policy.drafter import DrafterKind
from policy.profile import Override, ProfileError

ROOT = Path(__file__).resolve().parents[1]


def entry(**kw):
    base = dict(backend=Backend.CUDA, compute_capability="9.0", drafter_kind=DrafterKind.MODEL,
                width=8, quant_scheme="affine", quant_bits=4, quant_group_size=64, mlx="0.32.4",
                measured_at="2026-11-29T10:00:00Z",
                evidence={"n": 5, "classic_tok_s": [276.0, 280.0, 287.0],
                          "width_tok_s": [310.0, 320.0, 330.0], "prompt_sha256": "ab" * 8,
                          "record": "/tmp/r.json"})
    base.update(kw)
    return Override(**base)


def test_round_trip(tmp_path):
    p = tmp_path / "profile.toml"
    profile.save(p, entry())
    profile.save(p, entry(drafter_kind=DrafterKind.LOOKUP, width=None, decline=True))
    profile.save(p, entry(backend=Backend.CPU, compute_capability=None, width=3, byte_identical=False,
                          pair="aa+bb"))
    got = profile.load(p)
    assert len(got.entries) == 3
    assert got.entries[0] == entry()
    assert got.entries[0].evidence["classic_tok_s"] == [276.0, 280.0, 287.0]
    assert got.entries[1].decline and got.entries[1].width is None
    assert got.entries[2].byte_identical is False and got.entries[2].pair == "aa+bb"
    text = p.read_text()
    assert text.count("[[override]]") == 3 and "schema = 1" in text


def test_save_replaces_same_slot(tmp_path):
    p = tmp_path / "profile.toml"
    profile.save(p, entry(width=8))
    profile.save(p, entry(width=4))
    assert [e.width for e in profile.load(p).entries] == [4]
    profile.delete(p, entry())
    assert profile.load(p).entries == ()


def test_missing_default_is_empty_and_explicit_missing_is_error(tmp_path):
    assert profile.load(None).entries == ()
    with pytest.raises(ProfileError, match="no such file"):
        profile.load(tmp_path / "nope.toml", missing_ok=False)


def test_default_path_honours_xdg(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert profile.default_path() == tmp_path / "xdg" / "blockwidth" / "profile.toml"


@pytest.mark.parametrize("text,needle", [
    ("schema = 1\n[[override]\nwidth = 4\n", "not valid TOML"),
    ("schema = 2\n", "schema = 2"),
    ("schema = 1\n\n[[override]]\nbackend = 'cuda'\ndrafter_kind = 'model'\nwidth = 1\n",
     "entry 1 (line 3): width = 1"),
    ("schema = 1\n[[override]]\nbackend = 'tpu'\ndrafter_kind = 'model'\nwidth = 4\n", "backend = 'tpu'"),
    ("schema = 1\n[[override]]\nbackend = 'cpu'\ndrafter_kind = 'model'\n", "needs width"),
    ("schema = 1\n[[override]]\nbackend = 'cpu'\ndrafter_kind = 'model'\nwidth = 4\ndecline = true\n",
     "both width and decline"),
])
def test_invalid_profiles_are_located_and_untouched(tmp_path, text, needle):
    p = tmp_path / "profile.toml"
    p.write_text(text)
    before = p.read_bytes()
    with pytest.raises(ProfileError) as e:
        profile.load(p)
    assert needle in str(e.value) and str(p) in str(e.value)
    with pytest.raises(ProfileError):
        profile.save(p, entry())
    assert p.read_bytes() == before


def test_all_problems_reported_at_once(tmp_path):
    p = tmp_path / "profile.toml"
    p.write_text("schema = 1\n[[override]]\nbackend = 'x'\ndrafter_kind = 'y'\nwidth = 0\n"
                 "[[override]]\nbackend = 'cpu'\ndrafter_kind = 'model'\nwidth = 99\n")
    with pytest.raises(ProfileError) as e:
        profile.load(p)
    assert len(e.value.problems) == 4 and "entry 2 (line 6)" in str(e.value)


WRITER = textwrap.dedent("""
    import sys
    from policy import profile
    from policy.device import Backend
    from policy.drafter import DrafterKind
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(n):
        profile.save(path, profile.Override(backend=Backend.CPU, drafter_kind=DrafterKind.MODEL,
                                            width=2 + i % 8, pair=f"{tag}-{i}"))
""")


def test_concurrent_writers_lose_nothing(tmp_path):
    p = tmp_path / "profile.toml"
    env = {"PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(p), tag, "15"], env=env)
             for tag in ("a", "b")]
    assert all(proc.wait(timeout=120) == 0 for proc in procs)
    pairs = {e.pair for e in profile.load(p).entries}
    assert pairs == {f"{t}-{i}" for t in "ab" for i in range(15)}
    assert not list(tmp_path.glob(".profile.toml.*.tmp"))
