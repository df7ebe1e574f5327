"""blockwidth: an operator console for the draft block width of speculative decoding on MLX.

The repository keeps the design card's top-level folders (``console/``, ``engine/``,
``policy/``); the wheel installs them as ``blockwidth.console``, ``blockwidth.engine`` and
``blockwidth.policy`` (pyproject.toml's package-dir), so nothing but ``blockwidth`` lands in
site-packages.
"""

from importlib.metadata import PackageNotFoundError, version as _version
from pathlib import Path as _Path

# A source checkout on PYTHONPATH without an install (the GPU host runs the tree so): the three
# folders sit beside this one, at the repository's top level, so the package looks there too.
# An install (the wheel, or pip install -e's finder) never needs this.
_here = _Path(__file__).resolve().parent
if not (_here / "engine").is_dir() and (_here.parent / "pyproject.toml").is_file() \
        and all((_here.parent / name / "__init__.py").is_file() for name in ("console", "engine", "policy")):
    __path__.append(str(_here.parent))  # noqa: F821 (a package's __path__)

try:
    __version__ = _version("blockwidth")
except PackageNotFoundError:  # a source tree on PYTHONPATH (the GPU host), not installed
    __version__ = "0+unknown"
