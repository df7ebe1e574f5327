"""The TOML profile: measured width overrides that later runs and CI honour.

Reading validates every entry and reports every problem with the file, the
entry and its line. Writing is atomic (temp file + rename), under a lock, and
merges with what is on disk so two writers lose nothing; a profile that does
not parse or validate is never overwritten.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

import tomli_w

from policy.device import Backend, Device
from policy.drafter import DrafterKind
from policy.quantization import Quantization, Scheme

SCHEMA = 1
MAX_WIDTH = 64
MIN_WIDTH = 2


def default_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("blockwidth")) / "profile.toml"


@dataclass(frozen=True)
class Override:
    """One measured override: its match keys, its width (or decline) and its evidence."""

    backend: Backend
    drafter_kind: DrafterKind
    width: int | None  # None with decline=True: no width beat classic
    decline: bool = False
    compute_capability: str | None = None
    device_name: str | None = None
    quant_scheme: str | None = None  # None: any target quantization
    quant_bits: int | None = None
    quant_group_size: int | None = None
    pair: str | None = None  # a pair fingerprint; None: any pair of this kind
    mlx: str | None = None
    measured_at: str | None = None
    byte_identical: bool = True
    evidence: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    note: str | None = None
    line: int | None = field(default=None, compare=False, hash=False)  # where it was read

    def slot(self) -> tuple:
        """Two entries with one slot describe the same situation: a save replaces."""
        return (self.backend, self.compute_capability, self.device_name, self.quant_scheme,
                self.quant_bits, self.quant_group_size, self.drafter_kind, self.pair)

    def matches(self, device: Device, quant: Quantization, kind: DrafterKind,
                pair: str | None) -> bool:
        if self.backend is not device.backend or self.drafter_kind is not kind:
            return False
        if self.compute_capability and self.compute_capability != device.compute_capability:
            return False
        if self.device_name and self.device_name.lower() != (device.name or "").lower():
            return False
        if self.quant_scheme is not None and self.quant_scheme != quant.scheme.value:
            return False
        if self.quant_bits is not None and self.quant_bits != quant.bits:
            return False
        if self.quant_group_size is not None and self.quant_group_size != quant.group_size:
            return False
        if self.pair is not None and self.pair != pair:
            return False
        return True

    def specificity(self) -> tuple[int, ...]:
        return (self.pair is not None, self.device_name is not None,
                self.compute_capability is not None, self.quant_scheme is not None,
                self.quant_bits is not None, self.quant_group_size is not None)

    def describe_keys(self) -> str:
        dev = self.backend.value
        if self.compute_capability:
            dev += f" cc {self.compute_capability}"
        if self.device_name:
            dev += f" ({self.device_name})"
        q = self.quant_scheme or "any quantization"
        if self.quant_bits:
            q += f" {self.quant_bits}-bit"
        if self.quant_group_size:
            q += f" g{self.quant_group_size}"
        pair = f", pair {self.pair[:12]}" if self.pair else ""
        return f"{dev}, {q} target, {self.drafter_kind.value} drafter{pair}"

    def to_toml(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.backend.value, "drafter_kind": self.drafter_kind.value}
        if self.decline:
            d["decline"] = True
        else:
            d["width"] = self.width
        for key in ("compute_capability", "device_name", "pair", "mlx", "measured_at", "note"):
            v = getattr(self, key)
            if v is not None:
                d[key] = v
        if self.quant_scheme is not None:
            q: dict[str, Any] = {"scheme": self.quant_scheme}
            if self.quant_bits is not None:
                q["bits"] = self.quant_bits
            if self.quant_group_size is not None:
                q["group_size"] = self.quant_group_size
            d["target_quantization"] = q
        d["byte_identical"] = self.byte_identical
        if self.evidence:
            d["evidence"] = {k: v for k, v in self.evidence.items() if v is not None}
        return d


@dataclass(frozen=True)
class Profile:
    path: Path
    entries: tuple[Override, ...]
    exists: bool

    def match(self, device: Device, quant: Quantization, kind: DrafterKind,
              pair: str | None) -> Override | None:
        found = [e for e in self.entries if e.matches(device, quant, kind, pair)]
        if not found:
            return None
        return max(found, key=lambda e: (e.specificity(), e.measured_at or ""))


class ProfileError(Exception):
    """A profile that does not parse or validate; str() is one or more located lines."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = Path(path)
        self.problems = problems
        super().__init__("\n".join(f"profile {path}: {p}" for p in problems))


def _override_lines(text: str) -> list[int]:
    return [i + 1 for i, line in enumerate(text.splitlines())
            if re.match(r"^\s*\[\[\s*override\s*\]\]", line)]


_KNOWN_KEYS = {"backend", "drafter_kind", "width", "decline", "compute_capability", "device_name",
               "target_quantization", "pair", "mlx", "measured_at", "byte_identical", "evidence",
               "note"}


def parse(text: str, path: Path) -> tuple[Override, ...]:
    """Parse and validate profile text; every problem is reported at once."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(path, [f"not valid TOML: {e}"]) from None
    problems: list[str] = []
    schema = data.get("schema")
    if schema != SCHEMA:
        problems.append(f"schema = {schema!r}: expected schema = {SCHEMA} at the top")
    extra = set(data) - {"schema", "override"}
    if extra:
        problems.append(f"unknown top-level keys {sorted(extra)} (expected schema and [[override]])")
    raw = data.get("override", [])
    if not isinstance(raw, list):
        problems.append("override must be an array of tables ([[override]])")
        raw = []
    lines = _override_lines(text)
    entries = []
    for i, item in enumerate(raw):
        line = lines[i] if i < len(lines) else None
        where = f"entry {i + 1}" + (f" (line {line})" if line else "")
        entry, errs = _entry(item, line)
        problems.extend(f"{where}: {e}" for e in errs)
        if entry is not None:
            entries.append(entry)
    if problems:
        raise ProfileError(path, problems)
    return tuple(entries)


def _entry(item: Any, line: int | None) -> tuple[Override | None, list[str]]:
    errs: list[str] = []
    if not isinstance(item, dict):
        return None, ["is not a table"]
    unknown = set(item) - _KNOWN_KEYS
    if unknown:
        errs.append(f"unknown keys {sorted(unknown)}")
    try:
        backend = Backend(item.get("backend"))
    except ValueError:
        errs.append(f"backend = {item.get('backend')!r}: expected one of cuda, metal, cpu")
        backend = None
    try:
        kind = DrafterKind(item.get("drafter_kind"))
    except ValueError:
        errs.append(f"drafter_kind = {item.get('drafter_kind')!r}: expected one of "
                    + ", ".join(k.value for k in DrafterKind))
        kind = None
    decline = item.get("decline", False)
    if not isinstance(decline, bool):
        errs.append(f"decline = {decline!r}: expected true or false")
        decline = False
    width = item.get("width")
    if decline:
        if width is not None:
            errs.append("has both width and decline = true; a decline has no width")
    elif width is None:
        errs.append("needs width = N (or decline = true)")
    elif not isinstance(width, int) or isinstance(width, bool) or not MIN_WIDTH <= width <= MAX_WIDTH:
        errs.append(f"width = {width!r}: expected an integer {MIN_WIDTH}..{MAX_WIDTH}")
    cc = item.get("compute_capability")
    if cc is not None and not (isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc)):
        errs.append(f"compute_capability = {cc!r}: expected a string like \"9.0\"")
    if cc is not None and backend is not None and backend is not Backend.CUDA:
        errs.append("compute_capability is only for backend = \"cuda\"")
    for key in ("device_name", "pair", "mlx", "note"):
        v = item.get(key)
        if v is not None and not isinstance(v, str):
            errs.append(f"{key} = {v!r}: expected a string")
    measured = item.get("measured_at")
    if isinstance(measured, (_dt.datetime, _dt.date)):
        measured = measured.isoformat()
    elif measured is not None and not isinstance(measured, str):
        errs.append(f"measured_at = {measured!r}: expected a date-time")
    ident = item.get("byte_identical", True)
    if not isinstance(ident, bool):
        errs.append(f"byte_identical = {ident!r}: expected true or false")
    q = item.get("target_quantization")
    scheme = bits = group = None
    if q is not None:
        if not isinstance(q, dict):
            errs.append("target_quantization must be a table {scheme, bits, group_size}")
        else:
            scheme = q.get("scheme")
            if scheme not in {s.value for s in Scheme}:
                errs.append(f"target_quantization.scheme = {scheme!r}: expected one of "
                            + ", ".join(s.value for s in Scheme))
            bits, group = q.get("bits"), q.get("group_size")
            for name, v in (("bits", bits), ("group_size", group)):
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                    errs.append(f"target_quantization.{name} = {v!r}: expected a positive integer")
    evidence = item.get("evidence", {})
    if not isinstance(evidence, dict):
        errs.append("evidence must be a table")
        evidence = {}
    if errs or backend is None or kind is None:
        return None, errs
    return Override(
        backend=backend, drafter_kind=kind, width=None if decline else width, decline=decline,
        compute_capability=cc, device_name=item.get("device_name"), quant_scheme=scheme,
        quant_bits=bits, quant_group_size=group, pair=item.get("pair"), mlx=item.get("mlx"),
        measured_at=measured, byte_identical=ident, evidence=evidence, note=item.get("note"),
        line=line,
    ), []


def dumps(entries: tuple[Override, ...] | list[Override]) -> str:
    doc = {"schema": SCHEMA, "override": [e.to_toml() for e in entries]}
    if not entries:
        doc.pop("override")
    header = ("# blockwidth profile: measured draft block widths. Written by blockwidth;\n"
              "# edits by hand are kept as long as they validate (see README, 'Profile').\n")
    return header + tomli_w.dumps(doc)


def load(path: Path | None = None, *, missing_ok: bool = True) -> Profile:
    """Read and validate a profile. A missing file is an empty profile when missing_ok."""
    path = Path(path) if path is not None else default_path()
    if not path.exists():
        if missing_ok:
            return Profile(path, (), False)
        raise ProfileError(path, ["no such file"])
    if path.is_dir():
        raise ProfileError(path, ["is a directory, not a TOML file"])
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(path, [f"cannot be read ({e})"]) from None
    return Profile(path, parse(text, path), True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save(path: Path | None, entry: Override) -> Profile:
    """Add ``entry`` (replacing one in the same slot) to what is on disk now."""
    path = Path(path) if path is not None else default_path()
    with _locked(path):
        current = load(path, missing_ok=True)  # raises, writing nothing, if on-disk is bad
        kept = [e for e in current.entries if e.slot() != entry.slot()]
        kept.append(replace(entry, line=None))
        _write_atomic(path, dumps(kept))
    return load(path)


def delete(path: Path | None, entry: Override) -> Profile:
    """Remove the entry in ``entry``'s slot from what is on disk now."""
    path = Path(path) if path is not None else default_path()
    with _locked(path):
        current = load(path, missing_ok=False)
        kept = [e for e in current.entries if e.slot() != entry.slot()]
        _write_atomic(path, dumps(kept))
    return load(path)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
