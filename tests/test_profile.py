"""The TOML profile: round trip, concurrent writers, corrupt files left alone."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from blockwidth.console import profile_file
from blockwidth.policy import profile
from blockwidth.policy.device import Backend
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.profile import Entry, ProfileError

ROOT = Path(__file__).resolve().parents[1]


def entry(**kw):
    base = dict(backend=Backend.CUDA, compute_capability="9.0", drafter_kind=DrafterKind.MODEL,
                width=8, quant_scheme="affine", quant_bits=4, quant_group_size=64, mlx="0.32.4",
                measured_at="2026-11-29T10:00:00Z",
                evidence={"n": 5, "classic_tok_s": [276.0, 280.0, 287.0],
                          "width_tok_s": [310.0, 320.0, 330.0], "prompt_sha256": "ab" * 8,
                          "record": "/tmp/r.json"})
    base.update(kw)
    return Entry(**base)


def test_round_trip(tmp_path):
    p = tmp_path / "profile.toml"
    profile_file.save(p, entry())
    profile_file.save(p, entry(drafter_kind=DrafterKind.LOOKUP, width=None, decline=True))
    profile_file.save(p, entry(backend=Backend.CPU, compute_capability=None, width=3, byte_identical=False,
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
    profile_file.save(p, entry(width=8))
    profile_file.save(p, entry(width=4))
    assert [e.width for e in profile.load(p).entries] == [4]
    profile_file.delete(p, entry())
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
    ("schema = 1\n[[override]]\nbackend = 'cpu'\nwidth = 4\n", "drafter_kind is missing: expected one of"),
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
        profile_file.save(p, entry())
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
    from blockwidth.console import profile_file
    from blockwidth.policy import profile
    from blockwidth.policy.device import Backend
    from blockwidth.policy.drafter import DrafterKind
    path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    for i in range(n):
        profile_file.save(path, profile.Entry(backend=Backend.CPU, drafter_kind=DrafterKind.MODEL,
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


# --- hostile and careless input, and writes that keep the file's comments and layout ---

ONE = 'schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 3\n'


def test_save_and_delete_keep_comments_and_layout(tmp_path):
    p = tmp_path / "profile.toml"
    p.write_text("# my notes: do not lose me\nschema = 1\n\n"
                 "# measured by hand on the lab box\n[[override]]\nbackend = \"cpu\"   # the 2-core CI\n"
                 "drafter_kind = \"lookup\"\nwidth = 3\n")
    profile_file.save(p, entry())
    text = p.read_text()
    assert "# my notes: do not lose me" in text and "# measured by hand on the lab box" in text
    assert 'backend = "cpu"   # the 2-core CI' in text and text.count("[[override]]") == 2
    profile_file.delete(p, entry())
    text = p.read_text()
    assert "# my notes: do not lose me" in text and 'backend = "cpu"   # the 2-core CI' in text
    assert text.count("[[override]]") == 1 and len(profile.load(p).entries) == 1


@pytest.mark.parametrize("text,needle", [
    ("schema = true\n", "schema = true"),
    ("schema = 1.0\n", "schema = 1.0"),
    (ONE + ONE.replace("schema = 1\n", "").replace("width = 3", "width = 5"), "same slot"),
    (ONE.replace("width = 3", "width = 3\ntarget_quantization = { scheme = 'affine', bitz = 4 }"),
     "unknown keys ['bitz']"),
    ("schema = 1\nx = " + "[" * 5000 + "]" * 5000 + "\n", "nested"),
    (ONE.replace("width = 3", "width = [" + "1," * 100000 + "1]"), "width = [1, 1,"),
    (ONE.replace("width = 3", "width = 3\ntarget_quantization = { scheme = [1] }"), "scheme = [1]"),
])
def test_accepted_but_wrong_profiles_are_refused(tmp_path, text, needle):
    p = tmp_path / "profile.toml"
    p.write_text(text)
    with pytest.raises(ProfileError) as e:
        profile.load(p)
    assert needle in str(e.value) and len(str(e.value).splitlines()) == 1
    assert len(str(e.value)) < 400
    before = p.read_bytes()
    with pytest.raises(ProfileError):
        profile_file.save(p, entry())
    assert p.read_bytes() == before


def test_many_problems_are_capped_with_a_count(tmp_path):
    p = tmp_path / "profile.toml"
    # (within profile.MAX_ENTRIES: a file of more entries is refused before they are read)
    p.write_text("schema = 1\n" + "[[override]]\nbackend = 'x'\ndrafter_kind = 'model'\nwidth = 4\n" * 4000)
    with pytest.raises(ProfileError) as e:
        profile.load(p)
    lines = str(e.value).splitlines()
    assert len(e.value.problems) == 4000 and len(lines) == profile.SHOW_PROBLEMS + 1
    assert lines[-1].endswith("... and 3,990 more problems")


def test_symlinked_profile_is_written_through(tmp_path):
    real = tmp_path / "real.toml"
    link = tmp_path / "link.toml"
    real.write_text(ONE)
    link.symlink_to(real)
    profile_file.save(link, entry())
    assert link.is_symlink() and len(profile.load(real).entries) == 2
    assert (tmp_path / "real.toml.lock").exists() and not (tmp_path / "link.toml.lock").exists()


def test_concurrent_writers_through_link_and_target_lose_nothing(tmp_path):
    real, link = tmp_path / "real.toml", tmp_path / "link.toml"
    link.symlink_to(real)
    env = {"PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), tag, "8"], env=env)
             for path, tag in ((real, "r"), (link, "l"))]
    assert all(proc.wait(timeout=120) == 0 for proc in procs)
    assert link.is_symlink()
    assert {e.pair for e in profile.load(real).entries} == {f"{t}-{i}" for t in "rl" for i in range(8)}


def test_bad_lock_and_parent_paths_are_one_line_errors(tmp_path):
    p = tmp_path / "p.toml"
    (tmp_path / "p.toml.lock").symlink_to(tmp_path / "victim")
    with pytest.raises(ProfileError, match="symbolic link to a missing file"):
        profile_file.save(p, entry())
    assert not (tmp_path / "victim").exists() and not p.exists()
    q = tmp_path / "q.toml"
    (tmp_path / "q.toml.lock").mkdir()
    with pytest.raises(ProfileError, match="is a directory"):
        profile_file.save(q, entry())
    with pytest.raises(ProfileError, match="is a directory"):
        profile_file.check_writable(q)
    f = tmp_path / "file"
    f.write_text("x")
    for call in (lambda: profile.load(f / "p.toml"), lambda: profile_file.save(f / "p.toml", entry()),
                 lambda: profile_file.check_writable(f / "p.toml")):
        with pytest.raises(ProfileError, match="is a file, not a directory|is not a directory"):
            call()


def test_fifo_and_devices_do_not_hang(tmp_path):
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero"), Path("/dev/null")):
        with pytest.raises(ProfileError, match="not a TOML file"):
            profile.load(path)


HOLDER = textwrap.dedent("""
    import fcntl, sys, time
    fh = open(sys.argv[1], "a+")
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(60)
""")


def test_a_held_lock_is_waited_for_a_bounded_time_and_named(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(ONE)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(p) + ".lock"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(profile_file.ProfileBusy) as e:
            profile_file.save(p, entry(), wait_s=0.3)
        assert f"pid {holder.pid}" in str(e.value) and "nothing was written" in str(e.value)
        assert p.read_text() == ONE
    finally:
        holder.kill()
        holder.wait()
    profile_file.save(p, entry(), wait_s=0.3)  # released: the save goes through
    assert len(profile.load(p).entries) == 2


def test_leftover_temp_files_are_cleaned_and_ignored(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text(ONE)
    left = tmp_path / ".p.toml.abc123.tmp"
    left.write_text("half a profile [[")
    assert len(profile.load(p).entries) == 1  # a read ignores it
    profile_file.save(p, entry())
    assert not left.exists()


def test_an_unquantized_entry_is_described_as_unquantized():
    # what the console's "saved ..." and the resolution reason say about a bf16 target's entry
    e = entry(backend=Backend.CPU, compute_capability=None, quant_scheme="none", quant_bits=16,
              quant_group_size=None)
    assert e.describe_keys() == "cpu, unquantized 16-bit target, model drafter"
    assert entry().describe_keys() == "cuda cc 9.0, affine 4-bit g64 target, model drafter"


def test_a_profile_error_names_the_right_line_after_a_multiline_string(tmp_path):
    from blockwidth.policy import profile

    text = ('schema = 1\n[[override]]\nbackend = "cpu"\ndrafter_kind = "model"\nwidth = 4\n'
            'note = """\n[[override]]\nnot a header, a note\n"""\n'
            "[[override]]\nbackend = 'cpu'\ndrafter_kind = 'model'\nwidth = 1\n")
    with pytest.raises(profile.ProfileError) as e:
        profile.parse(text, Path("p.toml"))
    assert "entry 2 (line 10): width = 1" in str(e.value), str(e.value)

