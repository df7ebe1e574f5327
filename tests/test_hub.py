"""--target and --draft take a Hugging Face repo id, resolved from the local cache (no network)."""

import json
import shutil

from blockwidth.engine import demo
from tests.conftest import run_cli


def _cache(tmp_path, repo: str, source) -> dict:
    """A hub cache laid out as huggingface_hub writes it, holding a copy of ``source``."""
    rev = "0123456789abcdef0123456789abcdef01234567"
    root = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(rev)
    shutil.copytree(source, root / "snapshots" / rev)
    return {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}


def test_repo_id_resolves_from_the_local_cache(tmp_path):
    env = _cache(tmp_path, "acme/tiny-target", demo.target("4bit"))
    p = run_cli("resolve", "--target", "acme/tiny-target", "--device", "cpu", "--json", env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert "models--acme--tiny-target/snapshots/" in d["target"]
    assert d["target_quantization"]["scheme"] == "affine" and d["drafter_kind"] == "lookup"
    # loading it (weights from the cache) works too
    p = run_cli("costcurve", "--target", "acme/tiny-target", "--rows", "1,2", "--repeats", "1",
                "--context", "8", "--json", env=env)
    assert p.returncode == 0, p.stderr
    assert "models--acme--tiny-target" in json.loads(p.stdout)["target"]


def test_missing_repo_id_offline_is_one_line_exit_2(tmp_path):
    env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    p = run_cli("resolve", "--target", "acme/nowhere", "--device", "cpu", env=env)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--target acme/nowhere" in p.stderr and "not in the Hugging Face cache" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
