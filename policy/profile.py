"""The TOML profile: measured width overrides that later runs and CI honour.

Reading validates every entry and reports every problem with the file, the
entry and its line. Writing is atomic (temp file + rename), under a lock, and
merges with what is on disk so two writers lose nothing; a profile that does
not parse or validate is never overwritten. Writes edit the document in place
(tomlkit), so the operator's comments and layout survive a save or a delete.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import os
import re
import stat
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from policy import files
from policy.device import Backend, Device
from policy.drafter import DrafterKind
from policy.quantization import Quantization, Scheme

SCHEMA = 1
MAX_WIDTH = 64
MIN_WIDTH = 2
MAX_BYTES = 16 * files.MiB  # far above any real profile; bounds a read of /dev/zero or a huge file
LOCK_WAIT_S = 10.0  # a save waits this long for another writer, then says who holds the lock
SHOW_PROBLEMS = 10  # problems printed before "and N more"


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
        # A device named by --device has no name: the entry still matches, and
        # match_note() says that only the compute capability was compared.
        if self.device_name and device.name and self.device_name.lower() != device.name.lower():
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

    def match_note(self, device: Device) -> str | None:
        """Why a match may not carry over, for a CUDA entry matched without comparing GPU names:
        one compute capability spans GPUs of different memory bandwidth (H100 and H200)."""
        if self.backend is not Backend.CUDA:
            return None
        if not self.device_name:
            what = f"compute capability {self.compute_capability}" if self.compute_capability else "backend"
            return (f"matched only by {what}: the entry names no device_name, so it may have been "
                    f"measured on another GPU")
        if not device.name:
            return (f"matched only by compute capability: the entry was measured on {self.device_name}; "
                    f"the device named here has no name to compare")
        return None

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
        # scheme "none" is an unquantized target: say so, as the resolution's header does
        q = "unquantized" if self.quant_scheme == "none" else self.quant_scheme or "any quantization"
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
    """A profile that does not parse, validate or cannot be written; str() is located lines,
    at most SHOW_PROBLEMS of them and a count of the rest."""

    def __init__(self, path: Path, problems: list[str]):
        self.path = Path(path)
        self.problems = problems
        shown = [f"profile {path}: {p}" for p in problems[:SHOW_PROBLEMS]]
        if len(problems) > SHOW_PROBLEMS:
            shown.append(f"profile {path}: ... and {len(problems) - SHOW_PROBLEMS:,} more problems")
        self.lines = shown  # one line each, as policy.text.error_lines shows them
        super().__init__("\n".join(shown))


class ProfileBusy(ProfileError):
    """Another process held the profile's lock for longer than a save waits."""


def _long_number_line(text: str) -> int | None:
    m = re.search(r"[0-9_]{%d,}" % (sys.get_int_max_str_digits() + 1), text)
    return text.count("\n", 0, m.start()) + 1 if m else None


# An [[override]] header at the start of a line, outside every string: the strings are matched
# (and passed over) first, so a multi-line string holding "[[override]]" is not an entry.
_HEADERS = re.compile(files.TOML_SKIP + r"""|(?m:^[ \t]*\[\[[ \t]*(?:override|"override"|'override')[ \t]*\]\])""")


def _override_lines(text: str) -> list[int]:
    lines, pos, line = [], 0, 1
    for m in _HEADERS.finditer(text):
        if m.group().lstrip(" \t").startswith("[["):
            line += text.count("\n", pos, m.start())
            pos = m.start()
            lines.append(line)
    return lines


_KNOWN_KEYS = {"backend", "drafter_kind", "width", "decline", "compute_capability", "device_name",
               "target_quantization", "pair", "mlx", "measured_at", "byte_identical", "evidence",
               "note"}


def parse(text: str, path: Path) -> tuple[Override, ...]:
    """Parse and validate profile text; every problem is reported at once."""
    if files.nesting_depth(text, toml=True) > files.MAX_NESTING:
        raise ProfileError(path, [f"nested deeper than {files.MAX_NESTING} levels; not a profile"])
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(path, [f"not valid TOML: {e}"]) from None
    except ValueError as e:  # tomllib's int() of a number of more than 4,300 digits
        line = _long_number_line(text)
        raise ProfileError(path, [f"{'line ' + str(line) + ': ' if line else ''}a number of more "
                                  f"than {sys.get_int_max_str_digits():,} digits; not a profile"]) from None
    except RecursionError:
        raise ProfileError(path, ["nested too deeply to parse; not a profile"]) from None
    problems: list[str] = []
    schema = data.get("schema")
    # `true == 1` and `1.0 == 1` in Python: the type is part of the check.
    if type(schema) is not int or schema != SCHEMA:
        problems.append(f"schema = {_toml_repr(schema)}: expected schema = {SCHEMA} (an integer) at the top")
    extra = set(data) - {"schema", "override"}
    if extra:
        problems.append(f"unknown top-level keys {_short(sorted(extra), 160)} (expected schema and [[override]])")
    raw = data.get("override", [])
    if not isinstance(raw, list):
        problems.append("override must be an array of tables ([[override]])")
        raw = []
    lines = _override_lines(text)
    entries = []
    seen: dict[tuple, str] = {}
    for i, item in enumerate(raw):
        line = lines[i] if i < len(lines) else None
        where = f"entry {i + 1}" + (f" (line {line})" if line else "")
        entry, errs = _entry(item, line)
        problems.extend(f"{where}: {e}" for e in errs)
        if entry is not None:
            first = seen.setdefault(entry.slot(), where)
            if first != where:
                # Which one would win is an accident of order: make the operator choose.
                problems.append(f"{where}: same slot ({entry.describe_keys()}) as {first}; "
                                f"keep one of them")
            entries.append(entry)
    if problems:
        raise ProfileError(path, problems)
    return tuple(entries)


def _short(v: Any, limit: int = 60) -> str:
    """A value for a problem line: a hostile file should not make one line a megabyte."""
    text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is(key: str, item: dict) -> str:
    """``key = value`` for a problem line, or ``key is missing`` (not ``key = None``)."""
    return f"{key} is missing" if key not in item else f"{key} = {_short(item[key])}"


def _toml_repr(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "(missing)"
    return _short(v)


def _entry(item: Any, line: int | None) -> tuple[Override | None, list[str]]:
    errs: list[str] = []
    if not isinstance(item, dict):
        return None, ["is not a table"]
    unknown = set(item) - _KNOWN_KEYS
    if unknown:
        errs.append(f"unknown keys {_short(sorted(unknown), 160)}")
    try:
        backend = Backend(item.get("backend"))
    except ValueError:
        errs.append(f"{_is('backend', item)}: expected one of cuda, metal, cpu")
        backend = None
    try:
        kind = DrafterKind(item.get("drafter_kind"))
    except ValueError:
        errs.append(f"{_is('drafter_kind', item)}: expected one of "
                    + ", ".join(k.value for k in DrafterKind))
        kind = None
    decline = item.get("decline", False)
    if not isinstance(decline, bool):
        errs.append(f"decline = {_short(decline)}: expected true or false")
        decline = False
    width = item.get("width")
    if decline:
        if width is not None:
            errs.append("has both width and decline = true; a decline has no width")
    elif width is None:
        errs.append("needs width = N (or decline = true)")
    elif not isinstance(width, int) or isinstance(width, bool) or not MIN_WIDTH <= width <= MAX_WIDTH:
        errs.append(f"width = {_short(width)}: expected an integer {MIN_WIDTH}..{MAX_WIDTH}")
    cc = item.get("compute_capability")
    if cc is not None and not (isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc)):
        errs.append(f"compute_capability = {_short(cc)}: expected a string like \"9.0\"")
    if cc is not None and backend is not None and backend is not Backend.CUDA:
        errs.append("compute_capability is only for backend = \"cuda\"")
    for key in ("device_name", "pair", "mlx", "note"):
        v = item.get(key)
        if v is not None and not isinstance(v, str):
            errs.append(f"{key} = {_short(v)}: expected a string")
    measured = item.get("measured_at")
    if isinstance(measured, (_dt.datetime, _dt.date)):
        measured = measured.isoformat()
    elif measured is not None and not isinstance(measured, str):
        errs.append(f"measured_at = {_short(measured)}: expected a date-time")
    ident = item.get("byte_identical", True)
    if not isinstance(ident, bool):
        errs.append(f"byte_identical = {_short(ident)}: expected true or false")
    q = item.get("target_quantization")
    scheme = bits = group = None
    if q is not None:
        if not isinstance(q, dict):
            errs.append("target_quantization must be a table {scheme, bits, group_size}")
        else:
            unknown_q = set(q) - {"scheme", "bits", "group_size"}
            if unknown_q:
                # An unknown key would be ignored by matching and widen the entry.
                errs.append(f"target_quantization has unknown keys {_short(sorted(unknown_q), 160)} "
                            f"(expected scheme, bits, group_size)")
            scheme = q.get("scheme")
            if not isinstance(scheme, str) or scheme not in {s.value for s in Scheme}:
                errs.append(f"target_quantization.scheme = {_short(scheme)}: expected one of "
                            + ", ".join(s.value for s in Scheme))
            bits, group = q.get("bits"), q.get("group_size")
            for name, v in (("bits", bits), ("group_size", group)):
                if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                    errs.append(f"target_quantization.{name} = {_short(v)}: expected a positive integer")
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


HEADER = ("blockwidth profile: measured draft block widths. Written by blockwidth;",
          "edits by hand, comments included, are kept as long as they validate (README, 'Profile').")


def _table(entry: Override) -> Any:
    import tomlkit

    t = tomlkit.table()
    for key, value in entry.to_toml().items():
        if key == "target_quantization":
            q = tomlkit.inline_table()
            q.update(value)
            t[key] = q
        elif key == "evidence":
            ev = tomlkit.table()
            ev.update(value)
            t[key] = ev
        else:
            t[key] = value
    return t


def _new_document() -> Any:
    import tomlkit

    doc = tomlkit.document()
    for line in HEADER:
        doc.add(tomlkit.comment(line))
    doc["schema"] = SCHEMA
    return doc


def dumps(entries: tuple[Override, ...] | list[Override]) -> str:
    """A fresh profile holding ``entries`` (what a first save writes)."""
    import tomlkit

    doc = _new_document()
    if entries:
        aot = tomlkit.aot()
        for e in entries:
            aot.append(_table(e))
        doc.append("override", aot)
    return doc.as_string()


def _edited(text: str | None, path: Path, drop: tuple, add: Override | None) -> str:
    """``text`` with the entries in slot ``drop`` removed and ``add`` appended, edited in
    place so that everything else (comments, order, layout) is kept as the operator left it.
    ``text`` has been validated, so its n-th [[override]] is the n-th parsed entry."""
    import tomlkit

    entries = parse(text, path) if text is not None else ()
    doc = tomlkit.parse(text) if text is not None else _new_document()
    keep = [i for i, e in enumerate(entries) if e.slot() != drop]
    raw = doc.get("override")
    if raw is not None and not isinstance(raw, tomlkit.items.AoT):
        # `override = [{...}]` written inline: rewrite that one key as [[override]] tables.
        del doc["override"]
        aot = tomlkit.aot()
        for i in keep:
            aot.append(_table(entries[i]))
        if len(aot):
            doc.append("override", aot)
    elif raw is not None:
        for i in reversed(range(len(entries))):
            if i not in keep:
                del raw[i]
        if not len(raw):
            del doc["override"]
    if add is not None:
        table = _table(add)
        before = doc.as_string()
        table.trivia.indent = "" if before.endswith("\n\n") or not before else "\n"
        if "override" in doc:
            doc["override"].append(table)
        else:
            aot = tomlkit.aot()
            aot.append(table)
            doc.append("override", aot)
    out = doc.as_string()
    parse(out, path)  # what we write must read back; never write a profile we would refuse
    return out


def _stat_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a profile file, or None (it is a file, or it does not exist yet)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        parent = next((p for p in path.parents if p.exists() and not p.is_dir()), path.parent)
        return f"its parent {parent} is a file, not a directory"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a TOML file"
    if not stat.S_ISREG(st.st_mode):
        return f"is {files._kind(st.st_mode)}, not a TOML file"
    return None


def load(path: Path | None = None, *, missing_ok: bool = True) -> Profile:
    """Read and validate a profile. A missing file is an empty profile when missing_ok."""
    path = Path(path) if path is not None else default_path()
    problem = _stat_problem(path)
    if problem:
        raise ProfileError(path, [problem])
    if not path.exists():
        if missing_ok:
            return Profile(path, (), False)
        raise ProfileError(path, ["no such file"])
    try:
        text = files.read_text(path, MAX_BYTES)
    except files.FileProblem as e:
        raise ProfileError(path, [str(e).removeprefix(f"{path}: ")]) from None
    return Profile(path, parse(text, path), True)


def real_path(path: Path | None) -> Path:
    """Where a write lands: a symlinked profile is written through to its target (the link
    stays a link), and the lock sits beside the target, so writers via either name meet."""
    path = Path(path) if path is not None else default_path()
    return Path(os.path.realpath(path))


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def check_writable(path: Path | None) -> Profile:
    """Before any work whose result will be saved: the profile validates and can be written.
    Creates nothing: a read (and this check) never changes a file."""
    shown = Path(path) if path is not None else default_path()
    prof = load(shown, missing_ok=True)
    real = real_path(shown)
    problem = _stat_problem(lock_path(real))
    if problem and "no such" not in problem:
        raise ProfileError(shown, [f"lock file {lock_path(real)} {problem}"])
    if os.path.islink(lock_path(real)) and not lock_path(real).exists():
        raise ProfileError(shown, [f"lock file {lock_path(real)} is a symbolic link to a missing file"])
    existing = next((p for p in [real.parent, *real.parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        raise ProfileError(shown, [f"its parent {existing} is a file, not a directory"])
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ProfileError(shown, [f"{existing} is not writable"])
    if real.exists() and not os.access(real.parent, os.W_OK | os.X_OK):
        raise ProfileError(shown, [f"{real.parent} is not writable (a save replaces the file)"])
    return prof


def _lock_holder(fd: int) -> str:
    """Who holds the flock on ``fd``'s file, from /proc/locks (Linux); else 'another process'."""
    try:
        inode = os.fstat(fd).st_ino
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            for line in fh:
                parts = line.split()
                if "->" in parts or len(parts) < 6 or parts[1] != "FLOCK":
                    continue
                if parts[5].rsplit(":", 1)[-1] == str(inode):
                    pid = parts[4]
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as c:
                            cmd = c.read(200).replace(b"\0", b" ").decode(errors="replace").strip()
                    except OSError:
                        cmd = ""
                    return f"pid {pid}" + (f" ({cmd})" if cmd else "")
    except OSError:
        pass
    return "another process"


def _open_lock(lock: Path, shown: Path) -> int:
    try:
        # O_NOFOLLOW: a symlinked lock file must not create the file it points to.
        return os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            try:  # a link to an existing file is locked through; a dangling one is refused
                return os.open(lock, os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                raise ProfileError(shown, [f"lock file {lock} is a symbolic link to a missing "
                                           f"file; remove it"]) from None
        if e.errno == errno.EISDIR:
            raise ProfileError(shown, [f"lock file {lock} is a directory; remove it"]) from None
        raise ProfileError(shown, [f"lock file {lock} cannot be opened ({e.strerror})"]) from None


@contextlib.contextmanager
def _locked(path: Path, shown: Path, wait_s: float) -> Iterator[None]:
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ProfileError(shown, [f"its parent {path.parent} is not a directory"]) from None
    except OSError as e:
        raise ProfileError(shown, [f"{path.parent} cannot be created ({e.strerror})"]) from None
    fd = _open_lock(lock_path(path), shown)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ProfileBusy(shown, [f"locked by {_lock_holder(fd)} for over {wait_s:g}s "
                                              f"({lock_path(path)}); nothing was written"]) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _clean_leftovers(path: Path) -> None:
    """Temp files of writers killed mid-save. Every writer makes its temp file under the
    lock we hold, so any one still here belongs to a dead process."""
    for tmp in path.parent.glob(f".{glob_escape(path.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _write_atomic(path: Path, text: str, shown: Path) -> None:
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        mode = 0o644
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise ProfileError(shown, [f"{path.parent} is not writable ({e.strerror})"]) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fchmod(fh.fileno(), mode)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise ProfileError(shown, [f"cannot be written ({e.strerror})"]) from None
        raise


def _current_text(path: Path, shown: Path, must_exist: bool) -> str | None:
    problem = _stat_problem(path)
    if problem:
        raise ProfileError(shown, [problem])
    if not path.exists():
        if must_exist:
            raise ProfileError(shown, ["no such file"])
        return None
    try:
        return files.read_text(path, MAX_BYTES)
    except files.FileProblem as e:
        raise ProfileError(shown, [str(e)]) from None


def save(path: Path | None, entry: Override, *, wait_s: float | None = None) -> Profile:
    """Add ``entry`` (replacing one in the same slot) to what is on disk now."""
    shown = Path(path) if path is not None else default_path()
    real = real_path(shown)
    with _locked(real, shown, LOCK_WAIT_S if wait_s is None else wait_s):
        _clean_leftovers(real)
        text = _current_text(real, shown, must_exist=False)
        if text is not None:
            parse(text, shown)  # raises, writing nothing, if what is on disk is bad
        _write_atomic(real, _edited(text, shown, entry.slot(), entry), shown)
    return load(shown)


def delete(path: Path | None, entry: Override, *, wait_s: float | None = None) -> Profile:
    """Remove the entry in ``entry``'s slot from what is on disk now."""
    shown = Path(path) if path is not None else default_path()
    real = real_path(shown)
    with _locked(real, shown, LOCK_WAIT_S if wait_s is None else wait_s):
        _clean_leftovers(real)
        text = _current_text(real, shown, must_exist=True) or ""
        parse(text, shown)
        _write_atomic(real, _edited(text, shown, entry.slot(), None), shown)
    return load(shown)


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")
