"""The TOML profile: measured width overrides that later runs and CI honour.

Reading validates every entry and reports every problem with the file, the
entry and its line; matching picks the entry for a device, quantization, kind
and pair. ``edited`` is what a save or a delete makes of the text on disk: the
document edited in place (tomlkit), so the operator's comments and layout
survive. Writing it (locked, atomic, merged with what is on disk now) is the
console's ``console.profile_file``: nothing here writes a file.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import stat
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from blockwidth.policy import files
from blockwidth.policy.auto import AUTO, WIDTH_BOUND, AutoError, Plan
from blockwidth.policy.errors import BlockwidthError
from blockwidth.policy.device import Backend, Device, Group, group_from_dict, group_problems, mismatch
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.quantization import Quantization, Scheme
from blockwidth.policy.text import hidden_char

SCHEMA = 1
# the widest width any input may give (a flag, a variable, an entry, a field): one bound, which
# policy.auto holds (an auto plan's widths too)
MAX_WIDTH = WIDTH_BOUND
MIN_WIDTH = 2


def num_draft_tokens(width: int) -> int:
    """What mlx-lm (and every server taking a draft count) calls the width: the drafted tokens,
    ``width - 1`` (the verify adds the one row the target decodes itself)."""
    return width - 1

# What an entry measured: this engine's decode loop, or the real mlx_lm.server (the served path,
# docs/served.md).
PATH_ENGINE = "engine"
PATH_SERVER = "mlx-lm-server"
PATHS = (PATH_ENGINE, PATH_SERVER)
MAX_CONCURRENCY = 64  # concurrent requests a served entry may have been measured at
# The environment variables a served measurement keeps (server.env) and a served command sets
# again: MLX's own switches, which pick its kernels. On the H200 (2026-12-02) the same
# mlx_lm.server command ran width 8 at 0.43x classic with cuDNN's attention and at 3.96x with
# MLX_CUDA_USE_CUDNN_SDPA=0: a command without the variable is not the one that was measured.
SERVER_ENV_PREFIX = "MLX_"
_ENV_NAME = re.compile(r"MLX_[A-Z0-9_]{1,60}")
_ENV_VALUE = re.compile(r"[A-Za-z0-9._:/+-]{0,200}")


# mlx_lm.server's options that decide what is measured or where it listens: blockwidth sets them
# from the pair, the width and its loopback port, and no other argument may (argparse takes the
# last of two, and reads any unambiguous prefix as the option: --ho 0.0.0.0 is --host 0.0.0.0).
OWNED_SERVER_OPTIONS = ("--model", "--draft-model", "--num-draft-tokens", "--host", "--port")
# And two it never passes: another model's weights on the target, and checkpoint code.
REFUSED_SERVER_OPTIONS = {
    "--adapter-path": "loads adapter weights onto the target, another model than the record names",
    "--trust-remote-code": "runs code shipped with the checkpoint, which blockwidth never does",
}


def server_arg_problem(args: object) -> str | None:
    """Why ``args`` (mlx_lm.server arguments an operator or an entry passes through) may not be
    passed: one of OWNED_SERVER_OPTIONS or REFUSED_SERVER_OPTIONS, or any prefix of one (every
    prefix is refused, whether argparse would take it as that option or find it ambiguous);
    None when they may. ``--name=value`` is judged by its name."""
    if not isinstance(args, (list, tuple)) or not all(isinstance(a, str) for a in args):
        return f"{_short(args)}: expected a list of strings"
    for a in args:
        bad = hidden_char(a)
        if bad is not None:  # every command that names them prints them (serve, export, a record)
            return f"{_short(a, 40)} holds {bad}, which no printed command keeps as written"
        name = a.split("=", 1)[0]
        if not name.startswith("--") or len(name) < 3:
            continue
        for option in (*OWNED_SERVER_OPTIONS, *REFUSED_SERVER_OPTIONS):
            if not option.startswith(name):
                continue
            said = option if name == option else f"{_short(name, 40)} (an abbreviation of {option} to argparse)"
            if option in REFUSED_SERVER_OPTIONS:
                return f"{said} {REFUSED_SERVER_OPTIONS[option]}; leave it out"
            return (f"{said} is set by blockwidth (the pair, the width and a loopback port); "
                    f"leave it out")
    return None


def server_env_problems(env: object) -> list[str]:
    """What is wrong with a served entry's ``server.env``: a table of MLX_* names to plain
    values (a value a shell line can carry unquoted), at most 32 of them."""
    if not isinstance(env, dict):
        return [f"server.env = {_short(env)}: expected a table of MLX_* variables, e.g. "
                f"{{MLX_CUDA_USE_CUDNN_SDPA = \"0\"}}"]
    errs = []
    if len(env) > 32:
        errs.append(f"server.env has {len(env)} variables: at most 32")
    for k, v in list(env.items())[:33]:
        if not isinstance(k, str) or not _ENV_NAME.fullmatch(k):
            errs.append(f"server.env key {_short(k)}: expected an MLX_ variable name (MLX_ and A-Z, 0-9, _)")
        elif not isinstance(v, str) or not _ENV_VALUE.fullmatch(v):
            errs.append(f"server.env.{k} = {_short(v)}: expected a string of letters, digits and ._:/+-")
    return errs
MAX_BYTES = 16 * files.MiB  # far above any real profile; bounds a read of /dev/zero or a huge file
SHOW_PROBLEMS = 10  # problems printed before "and N more"
# Entries a profile may hold: a team's file for every machine it has holds dozens; the bound
# keeps every check of a file (each linear in its entries) within seconds.
MAX_ENTRIES = 10_000


def default_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("blockwidth")) / "profile.toml"


@dataclass(frozen=True)
class Entry:
    """One profile entry (a measured override): its match keys, its width (or decline) and its evidence."""

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
    path: str = PATH_ENGINE  # what was measured: the engine's loop or mlx_lm.server
    concurrency: int | None = None  # concurrent requests it was measured at (None: 1)
    # the served path's server: {mlx_lm: version, args: [...], env: {MLX_*: value},
    # verify_attention: mode or absent}
    server: Mapping[str, Any] | None = field(default=None, compare=False, hash=False)
    # An ``auto`` entry (width = "auto"): the controller's plan, the curve it was built on
    # (policy.auto.Plan); ``width`` then holds the fixed width a consumer that cannot adapt takes.
    auto: Plan | None = field(default=None, compare=False, hash=False)
    # measured on a sharded target's group (docs/distributed.md); None: on one device, and only there
    group: Group | None = None

    @property
    def server_env(self) -> dict[str, str]:
        """The MLX_* switches a served entry was measured with (server.env), or {}."""
        env = self.server.get("env") if isinstance(self.server, Mapping) else None
        return dict(env) if isinstance(env, dict) and env and not server_env_problems(env) else {}

    @property
    def load(self) -> int:
        """The concurrency it was measured at (an entry that names none: 1)."""
        return self.concurrency or 1

    def slot(self, *, case_blind: bool = False) -> tuple[tuple[str, Any], ...]:
        """The keys this entry matches on, those it sets, as (key, value) pairs: two entries
        with one slot describe the same situation, and a save replaces. ``case_blind``: as
        the matcher compares them (device names case-blind), which is what --check's duplicate
        and shadowing checks need; the file's own slot keeps the name as written."""
        name = self.device_name.lower() if case_blind and self.device_name else self.device_name
        keys = (("backend", self.backend.value), ("drafter_kind", self.drafter_kind.value),
                ("compute_capability", self.compute_capability), ("device_name", name),
                ("quant_scheme", self.quant_scheme), ("quant_bits", self.quant_bits),
                ("quant_group_size", self.quant_group_size), ("pair", self.pair),
                # the served path and each load are their own situations (docs/served.md); the engine
                # path at concurrency 1 is what an entry naming neither means
                ("path", None if self.path == PATH_ENGINE else self.path),
                ("concurrency", None if self.load == 1 else self.load),
                ("group", self.group.key(case_blind=case_blind) if self.group else None))
        return tuple((k, v) for k, v in keys if v is not None)

    def matches(self, device: Device, quant: Quantization, kind: DrafterKind,
                pair: str | None) -> bool:
        # A device named by --device has no name: the entry still matches, and
        # match_note() says that only the compute capability was compared.
        if self.drafter_kind is not kind or self.device_mismatch(device):
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

    def device_mismatch(self, device: Device) -> str | None:
        """Why this entry is for another device (policy.device.mismatch), or None."""
        return mismatch(device, self.backend, self.compute_capability, self.device_name, self.group)

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
        return (self.pair is not None, bool(self.group and self.group.members), self.device_name is not None,
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
        served = ""
        if self.path == PATH_SERVER:
            served = ", served by mlx_lm.server"
        if self.concurrency is not None:
            served += f", concurrency {self.concurrency}"
        group = f", {self.group.describe()}" if self.group else ""
        return f"{dev}, {q} target, {self.drafter_kind.value} drafter{pair}{served}{group}"

    def measured_on(self, pair: str | None = None) -> str:
        """The pair and the prompt (or workload) this entry was measured on, from its evidence,
        and whether that is the pair being resolved (``pair``: its fingerprint). Evidence is
        input: only short strings and integers are taken from it."""
        ev = self.evidence if isinstance(self.evidence, Mapping) else {}
        on = ev.get("measured_on") if isinstance(ev.get("measured_on"), Mapping) else {}

        def text(v: Any, limit: int = 60) -> str | None:
            if not isinstance(v, str) or not v.strip():
                return None
            v = " ".join(v.split())
            return v if len(v) <= limit else v[:limit - 1] + "…"

        names = [n for n in (text(on.get("target")), text(on.get("drafter"))) if n]
        measured_pair = self.pair or text(on.get("pair"), 80)
        if names:
            where = " + ".join(names)
        elif measured_pair:
            where = f"pair {measured_pair[:12]}"
        else:
            where = "a pair the entry does not name"
        if self.pair is not None:
            where += " (this pair: a pair-specific entry)"
        elif measured_pair and pair:
            where += (" (this pair; the entry is generic: any pair of this kind)" if measured_pair == pair
                      else " (another pair; the entry is generic: any pair of this kind)")
        else:
            where += " (a generic entry: any pair of this kind)"
        wl = ev.get("workload")
        tokens = ev.get("prompt_tokens")
        if isinstance(wl, Mapping) and text(wl.get("name")):
            n = wl.get("requests")
            what = f"workload {text(wl.get('name'))}" + (f" ({n} requests)" if isinstance(n, int) else "")
        elif text(on.get("prompt")):
            what = f"prompt {text(on.get('prompt'), 40)!r}"
        elif isinstance(ev.get("prompt_sha256"), str):
            what = f"a prompt of sha256 {ev['prompt_sha256'][:12]}"
        else:
            what = "a prompt the entry does not name"
        if isinstance(tokens, int) and not isinstance(tokens, bool) and "workload" not in what:
            what += f" ({tokens} tokens)"
        return f"{where}, {what}"

    def to_toml(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.backend.value, "drafter_kind": self.drafter_kind.value}
        if self.decline:
            d["decline"] = True
        elif self.auto is not None:
            d["width"] = AUTO
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
        d["path"] = self.path
        if self.concurrency is not None:
            d["concurrency"] = self.concurrency
        if self.server:
            d["server"] = {k: v for k, v in self.server.items() if v is not None}
        if self.auto is not None:
            d["auto"] = self.auto.to_dict()
        if self.group:
            d["group"] = self.group.to_dict()
        if self.evidence:
            d["evidence"] = {k: v for k, v in self.evidence.items() if v is not None}
        return d


@dataclass(frozen=True)
class Profile:
    path: Path
    entries: tuple[Entry, ...]
    exists: bool

    def match(self, device: Device, quant: Quantization, kind: DrafterKind,
              pair: str | None, *, route: str | None = None,
              concurrency: int | None = None) -> Entry | None:
        """The entry for this situation: one measured on ``route`` (default the engine's) before
        one measured on the other path; then the one measured at ``concurrency`` (default 1),
        else the highest level below it, else the lowest above; then the most specific."""
        found = [e for e in self.entries if e.matches(device, quant, kind, pair)]
        if not found:
            return None
        want, load = route or PATH_ENGINE, concurrency or 1

        def rank(e: Entry) -> tuple:
            c = e.load
            return (e.path == want, c == load, c <= load, c if c <= load else -c,
                    e.specificity(), e.measured_at or "")

        return max(found, key=rank)


class ProfileError(BlockwidthError):
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
               "note", "path", "concurrency", "server", "auto", "group"}


def parse(text: str, path: Path) -> tuple[Entry, ...]:
    """Parse and validate profile text; every problem is reported at once."""
    if files.nesting_depth(text, toml=True) > files.MAX_NESTING:
        raise ProfileError(path, [f"nested deeper than {files.MAX_NESTING} levels (brackets, and the dots of "
                                  f"a line outside strings: dotted keys); not a profile"])
    lines = _override_lines(text)
    if len(lines) > MAX_ENTRIES:  # before tomllib builds them all
        raise ProfileError(path, [f"{len(lines):,} entries: at most {MAX_ENTRIES:,}"])
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(path, [f"not valid TOML: {e}"]) from None
    except ValueError:  # tomllib's int() past 4,300 digits: not a TOMLDecodeError
        line = _long_number_line(text)
        raise ProfileError(path, [f"not valid TOML: {'line ' + str(line) + ': ' if line else ''}a number of "
                                  f"more than {sys.get_int_max_str_digits():,} digits"]) from None
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
    if len(raw) > MAX_ENTRIES:  # written inline (override = [{...}, ...]): no headers counted
        raise ProfileError(path, [f"{len(raw):,} entries: at most {MAX_ENTRIES:,}"])
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


def _strings(value: Any, where: str):
    """Every string in an entry (keys too), with where it is: ``evidence.record``, ``server.args[2]``."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for k, v in value.items():
            at = f"{where}.{k}" if where else str(k)
            yield at, str(k)
            yield from _strings(v, at)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _strings(v, f"{where}[{i}]")


def string_problems(item: Mapping[str, Any]) -> list[str]:
    """A profile is shared through a team's repository, and its strings are printed into shell
    commands, Python, comments and reports: one that holds a control, format or separator
    character (a newline, ESC, BEL, a bidirectional override) cannot be printed as written and
    mean the same, so it is refused here, where the file is read, naming the key. So is an
    evidence.record that no file system can name."""
    errs = []
    for where, text in _strings(item, ""):
        bad = hidden_char(text)
        if bad is not None:
            errs.append(f"{where} = {_short(text)} holds {bad}: a profile's strings reach commands, "
                        f"comments and reports as written, so none may hold a control character")
            if len(errs) >= SHOW_PROBLEMS:
                break
    rec = item.get("evidence", {}).get("record") if isinstance(item.get("evidence"), dict) else None
    if isinstance(rec, str) and not errs and files.name_problem(rec):
        errs.append(f"evidence.record: {files.name_problem(rec)}")
    return errs


def _entry(item: Any, line: int | None) -> tuple[Entry | None, list[str]]:
    errs: list[str] = []
    if not isinstance(item, dict):
        return None, ["is not a table"]
    errs.extend(string_problems(item))
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
    plan = None
    if decline:
        if width is not None:
            errs.append("has both width and decline = true; a decline has no width")
    elif width is None:
        errs.append("needs width = N (or decline = true, or width = \"auto\")")
    elif width == AUTO:
        if "auto" not in item:
            errs.append("width = \"auto\" needs its [override.auto] table (the curve it was built on)")
        else:
            try:
                plan = Plan.from_dict(item["auto"])
            except AutoError as e:
                errs.append(f"auto: {e}")
            else:
                width = plan.static_width
    elif not isinstance(width, int) or isinstance(width, bool) or not MIN_WIDTH <= width <= MAX_WIDTH:
        errs.append(f"width = {_short(width)}: expected an integer {MIN_WIDTH}..{MAX_WIDTH} or \"auto\"")
    if "auto" in item and item.get("width") != AUTO:
        errs.append("an [override.auto] table is only for width = \"auto\"")
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
    path = item.get("path", PATH_ENGINE)
    if path not in PATHS:
        errs.append(f"path = {_short(path)}: expected one of {', '.join(PATHS)}")
    conc = item.get("concurrency")
    if conc is not None and (not isinstance(conc, int) or isinstance(conc, bool)
                             or not 1 <= conc <= MAX_CONCURRENCY):
        errs.append(f"concurrency = {_short(conc)}: expected an integer 1..{MAX_CONCURRENCY}")
    server = item.get("server")
    if server is not None:
        if not isinstance(server, dict):
            errs.append("server must be a table {mlx_lm, args, env, verify_attention}")
            server = None
        else:
            extra = set(server) - {"mlx_lm", "args", "env", "verify_attention"}
            if extra:
                errs.append(f"server has unknown keys {_short(sorted(extra), 160)} "
                            f"(expected mlx_lm, args, env, verify_attention)")
            if "env" in server:
                errs.extend(server_env_problems(server["env"]))
            args = server.get("args", [])
            if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                errs.append(f"server.args = {_short(args)}: expected a list of strings")
            elif not any(hidden_char(a) for a in args) and server_arg_problem(args):
                # what serve would start and export would print (a control character: said above)
                errs.append(f"server.args: {server_arg_problem(args)}")
            for key in ("mlx_lm", "verify_attention"):
                if server.get(key) is not None and not isinstance(server[key], str):
                    errs.append(f"server.{key} = {_short(server[key])}: expected a string")
            if path != PATH_SERVER:
                errs.append(f"server is only for path = \"{PATH_SERVER}\"")
    on_group = None
    if item.get("group") is not None:
        gerrs = group_problems(item["group"])
        errs.extend(gerrs)
        if not gerrs:
            on_group = group_from_dict(item["group"])
            if on_group.members and backend is not None \
                    and on_group.members[0].backend is not backend:
                errs.append(f"group.members[0].backend = {on_group.members[0].backend.value!r}: rank 0 "
                            f"is the entry's own device, backend = {backend.value!r}")
    if errs or backend is None or kind is None:
        return None, errs
    return Entry(
        backend=backend, drafter_kind=kind, width=None if decline else width, decline=decline,
        compute_capability=cc, device_name=item.get("device_name"), quant_scheme=scheme,
        quant_bits=bits, quant_group_size=group, pair=item.get("pair"), mlx=item.get("mlx"),
        measured_at=measured, byte_identical=ident, evidence=evidence, note=item.get("note"),
        line=line, path=path, concurrency=conc, server=server, auto=plan, group=on_group,
    ), []


HEADER = ("blockwidth profile: measured draft block widths. Written by blockwidth;",
          "edits by hand, comments included, are kept as long as they validate (README, 'Profile').")


def _table(entry: Entry) -> Any:
    import tomlkit

    t = tomlkit.table()
    for key, value in entry.to_toml().items():
        if key == "target_quantization":
            q = tomlkit.inline_table()
            q.update(value)
            t[key] = q
        elif key in ("evidence", "server"):
            ev = tomlkit.table()
            ev.update(value)
            t[key] = ev
        elif key == "auto":
            ev = tomlkit.table()
            for k, v in value.items():
                if isinstance(v, dict):  # the curve by rows: one line each
                    inline = tomlkit.inline_table()
                    inline.update(v)
                    ev[k] = inline
                else:
                    ev[k] = v
            t[key] = ev
        elif key == "group":
            g = tomlkit.table()
            for k, v in value.items():
                if k == "members":  # one inline table a rank: the list reads as the group
                    arr = tomlkit.array()
                    for m in v:
                        it = tomlkit.inline_table()
                        it.update(m)
                        arr.append(it)
                    g[k] = arr
                else:
                    g[k] = v
            t[key] = g
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


def dumps(entries: tuple[Entry, ...] | list[Entry]) -> str:
    """A fresh profile holding ``entries`` (what a first save writes)."""
    import tomlkit

    doc = _new_document()
    if entries:
        aot = tomlkit.aot()
        for e in entries:
            aot.append(_table(e))
        doc.append("override", aot)
    return doc.as_string()


def edited(text: str | None, path: Path, drop: tuple, add: Entry | None) -> str:
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


def stat_problem(path: Path) -> str | None:
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
    problem = stat_problem(path)
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
