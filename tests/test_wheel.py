"""The wheel holds the product and nothing of the lab, and runs on its own: built from this tree
(offline, no build isolation: setuptools comes with the test extra) and installed into a fresh
venv without its dependencies, which it borrows from the running environment's site-packages."""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT


# The wheel is built once: its tests run on one worker (make test's --dist loadgroup).
pytestmark = pytest.mark.xdist_group("wheel")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this tree as it stands (what git tracks or would add), built in a copy so the
    build leaves no build/ or egg-info in the checkout."""
    src = tmp_path_factory.mktemp("src")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "--no-index", "--disable-pip-version-check", "-q", "-w", str(out)],
                   check=True, capture_output=True, timeout=600)
    return next(out.glob("blockwidth-*.whl"))


def test_the_wheel_holds_no_lab_no_logs_no_evidence(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    # one package, named after the tool: nothing generic (console, engine, policy) in site-packages
    assert tops == {"blockwidth", f"{wheel.name.split('-py3')[0]}.dist-info"}, tops
    assert [n for n in names if n.endswith(".log") or "evidence" in n.split("/") or "/lab/" in f"/{n}"] == []
    assert [n for n in names if n.startswith("tests/") or n.endswith((".sh", ".svg"))] == []
    assert "blockwidth/console/app.tcss" in names  # the console's styles are package data
    assert any(n.startswith("blockwidth/engine/demo/pair/target-bf16/") and n.endswith(".safetensors") for n in names)


def test_the_wheel_runs_help_and_resolve_from_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; "
                                   "print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # the dependencies (mlx, mlx-lm, textual...), visible as plain paths: their .pth files (this
    # checkout's editable install among them) are not run, so only the wheel provides blockwidth
    (purelib / "borrowed-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "--no-deps", "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
                   check=True, capture_output=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    exe = str(venv / "bin" / "blockwidth")
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import blockwidth.console as c, blockwidth.engine.demo as d; "
                            "print(c.__file__); print(d.PAIR_DIR)"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, check=True).stdout
    assert where.count(str(purelib)) == 2, where  # the wheel's code and its demo pair, not the checkout's
    h = subprocess.run([exe, "--help"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert h.returncode == 0 and "resolve" in h.stdout and "check" in h.stdout, h.stderr
    r = subprocess.run([exe, "resolve", "--device", "cpu", "--json"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["width"] >= 2 and Path(d["target"]).is_relative_to(purelib)
    py = str(venv / "bin" / "python")
    v = subprocess.run([py, "-m", "blockwidth", "--version"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=300)
    assert v.returncode == 0 and v.stdout.strip() == "blockwidth 0.1.0", (v.stdout, v.stderr)
    s = subprocess.run([py, "-m", "blockwidth", "sweep", "-n", "1", "--max-tokens", "4", "--widths", "2",
                        "--record-dir", str(tmp_path / "rec"), "--json"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=600)
    assert s.returncode == 0, s.stderr
    assert json.loads(s.stdout)["arms"] and list((tmp_path / "rec").glob("*.json"))


def test_no_module_imports_the_repository_folders_by_their_bare_names():
    """console/, engine/ and policy/ install as blockwidth.console, ...: a bare `import engine`
    works from the repository root only (and would load a second copy of the module beside
    blockwidth.engine's, with its own state), never from the wheel."""
    import re

    bare = re.compile(r"^\s*(from|import)\s+(console|engine|policy)\b", re.M)
    hits = [str(p.relative_to(ROOT)) for d in ("blockwidth", "console", "engine", "policy", "tests", "lab",
                                                "screenshots", "examples")
            for p in (ROOT / d).rglob("*.py") if bare.search(p.read_text(encoding="utf-8"))]
    assert hits == []


def test_the_product_tests_need_nothing_from_the_lab():
    """tests/ tests the product: the lab's own tests (probes, pipelines, its tools' flags) are in
    lab/tests, and the tiny drafter checkpoints the product's tests load come from
    tests/checkpoints.py (the lab's drafter builds write theirs with it)."""
    import re

    users = [p.name for p in (ROOT / "tests").glob("*.py")
             if re.search(r"^\s*(from lab\b|import lab\b)|[\"']lab\.", p.read_text(encoding="utf-8"), re.M)]
    assert users == [] and (ROOT / "lab" / "tests" / "test_probe_rows.py").is_file()
