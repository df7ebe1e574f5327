"""``blockwidth check`` (alias ``--check``) for CI: is the profile still true for this runner?

Static checks read the profile, the records it names and the configured pairs,
and never run a model. Measured checks (``--measure``) run a short A/B with the
engine's method and decision rules. One profile serves every machine a team
has: entries for another device are skipped, never failed. What is decided from
what was read or measured (statuses, marks, the exit code) is ``policy.checks``.

No Textual here (a test proves it), and MLX loads only to probe the device and to
measure, so the console's Profile tab and the headless command share this module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from blockwidth.console.inputs import ExitCode
from blockwidth.policy import files
from blockwidth.policy.checks import (Category, Check, EntryMark, Mark, Status, device_agrees,  # noqa: F401
                           duplicate_checks, entry_label, exit_code, for_device, marks,
                           measured_status, outcome, shadow_checks, stale_check)
from blockwidth.policy.device import Device
from blockwidth.policy.errors import BlockwidthError
from blockwidth.policy.text import error_line, error_lines, shown
from blockwidth.policy.profile import Entry, Profile
from blockwidth.policy.resolve import Resolution, Source


# ---- the entries, read statically -------------------------------------------------------------

def record_path(e: Entry, profile: Profile) -> Path | None:
    """The record an entry names; a relative path is read beside the profile (records
    committed with it), an absolute one as written."""
    rec = e.evidence.get("record") if isinstance(e.evidence, Mapping) else None
    if not isinstance(rec, str) or not rec:
        return None
    p = Path(rec).expanduser()
    return p if p.is_absolute() else profile.path.parent / p


def record_check(i: int, e: Entry, profile: Profile) -> Check:
    name = f"entry {i}: record"
    path = record_path(e, profile)
    if path is None:
        return Check(name, Status.WARN, "names no record (evidence.record): "
                     "nothing shows what it was decided on", Category.ENTRY, entry=i, line=e.line)
    figures = {"record": str(path)}
    if path.is_file():
        try:
            rec = files.read_json(path, files.MAX_RECORD_BYTES)
        except (OSError, UnicodeDecodeError, ValueError) as err:
            return Check(name, Status.FAIL, f"record {path} cannot be read ({err})",
                         Category.ENTRY, figures, entry=i, line=e.line)
        host = rec.get("host", {}) if isinstance(rec, dict) else {}
        dev = host.get("device", {}) if isinstance(host, dict) else {}
        dev = dev if isinstance(dev, dict) else {}
        where = " ".join(str(x) for x in (dev.get("backend"), dev.get("name")) if x) or "unknown host"
        return Check(name, Status.PASS, f"record {path} present (written on {where}, MLX {host.get('mlx')})",
                     Category.ENTRY, figures, entry=i, line=e.line)
    # A folder that exists here but lacks the file: deleted or moved on this machine. A folder
    # that does not exist here: the record stayed on the machine that measured it.
    if path.parent.is_dir():
        return Check(name, Status.FAIL, f"record {path} is missing (its folder "
                     "is here: deleted or moved?)", Category.ENTRY, figures, entry=i, line=e.line)
    return Check(name, Status.WARN, f"record {path} is not on this machine "
                 "(written on another machine); commit records beside the profile and name them "
                 "relative to it", Category.ENTRY, figures, entry=i, line=e.line)


def entry_checks(profile: Profile, device: Device, mlx: str | None) -> list[Check]:
    """Per entry: whether it applies here; if it does, its record and its MLX version."""
    out = []
    for i, e in enumerate(profile.entries, 1):
        applies, why = for_device(e, device)
        head = f"{outcome(e)} for {e.describe_keys()}"
        if not applies:
            out.append(Check(f"entry {i}: device", Status.SKIP, f"another machine's entry ({why}): {head}",
                             Category.ENTRY, {"outcome": outcome(e)}, entry=i, line=e.line))
            continue
        out.append(Check(f"entry {i}: device", Status.PASS, f"{why}: {head}", Category.ENTRY,
                         {"outcome": outcome(e)}, entry=i, line=e.line))
        out.append(record_check(i, e, profile))
        out.append(stale_check(i, e, mlx))
    return out


# ---- configured pairs -------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfiguredPair:
    """A pair this runner uses: from the command line, or named by a record in the profile."""

    label: str
    target: Path
    drafter: Path | None
    kind: str  # the drafter kind it resolved with
    pair_id: str
    origin: str
    resolution: Resolution
    entry: int | None  # the profile entry that matches it here (1-based), whatever won


def configure_pair(*, target: str | None, draft: str | None, kind: str | None, variant: str | None,
                   flag: str | None, device: Device, profile: Profile, mlx: str | None,
                   origin: str, env: Mapping[str, str] | None = None) -> ConfiguredPair:
    """Resolve one pair against the loaded profile and device. Raises a BlockwidthError."""
    from blockwidth.console.inputs import drafter_info, pair_paths, read_checkpoint, target_quantization
    from blockwidth.engine.checkpoint import pair_id
    from blockwidth.policy.resolve import resolve

    paths = pair_paths(target, draft, variant, kind)
    drafter_ck = read_checkpoint(paths.drafter, "draft") if paths.drafter is not None else None
    info = drafter_info(paths, kind, drafter=drafter_ck)
    target_ck = read_checkpoint(paths.target, "target")  # each folder read once
    quant = target_quantization(target_ck)
    pid = pair_id(target_ck, drafter_ck)
    res = resolve(drafter_kind=info.kind, device=device, quantization=quant, flag=flag,
                  env=os.environ if env is None else env, profile=profile,
                  declared_width=info.declared_width, declared_detail=info.detail, pair=pid,
                  mlx_version=mlx)
    entry = profile.match(device, quant, info.kind, pid)
    index = next((i for i, e in enumerate(profile.entries, 1) if e is entry), None)
    label = f"{paths.target.name} + {paths.drafter.name if paths.drafter else 'lookup'}"
    if origin != "command line":
        label += f" ({origin})"  # folder names alone can repeat across pairs
    return ConfiguredPair(label, paths.target, paths.drafter, info.kind.value, pid, origin, res, index)


def recorded_pairs(profile: Profile, device: Device) -> list[tuple[int, str, str | None, str]]:
    """Pairs the profile names through the records of this device's entries, where the
    record and the pair's folders exist on this machine: (entry, target, drafter, kind)."""
    out = []
    for i, e in enumerate(profile.entries, 1):
        if not for_device(e, device)[0]:
            continue
        path = record_path(e, profile)
        if path is None or not path.is_file():
            continue
        try:
            pair = files.read_json(path, files.MAX_RECORD_BYTES).get("pair")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            continue  # the record check reports it
        if not isinstance(pair, dict):
            continue
        target, drafter = pair.get("target"), pair.get("drafter")
        if not isinstance(target, str) or not Path(target).is_dir():
            continue
        if drafter is not None and not (isinstance(drafter, str) and Path(drafter).is_dir()):
            continue
        out.append((i, target, drafter, str(pair.get("drafter_kind") or "")))
    return out


def resolve_check(p: ConfiguredPair) -> Check:
    r = p.resolution
    figures = {"target": str(p.target), "drafter": str(p.drafter) if p.drafter else None,
               "drafter_kind": p.kind, "pair": p.pair_id, "origin": p.origin, "width": r.width,
               "source": r.source.value, "decline": r.decline, "stale": r.stale, "entry": p.entry}
    detail = r.reason + ("" if p.origin == "command line" else f"; {p.target} + {p.drafter or 'lookup'}")
    if r.source in (Source.FLAG, Source.ENV) and p.entry is not None:
        detail += f"; the operator override hides profile entry {p.entry}"
    return Check(f"resolve: {p.label}", Status.PASS, detail, Category.RESOLVE, figures, entry=p.entry)


def static_checks(profile: Profile, device: Device, mlx: str | None,
                  pairs: Sequence[ConfiguredPair] = ()) -> list[Check]:
    """Every check that needs no model run, in the order the summary prints them."""
    n = len(profile.entries)
    where = str(profile.path) if profile.exists else f"{profile.path} (not present: empty)"
    checks = [Check("profile", Status.PASS, f"{where} parses and validates: schema 1, {n} "
                    f"entr{'y' if n == 1 else 'ies'}", figures={"path": str(profile.path), "entry_count": n})]
    checks += duplicate_checks(profile)
    checks += entry_checks(profile, device, mlx)
    checks += shadow_checks(profile, device)
    checks += [resolve_check(p) for p in pairs]
    return checks


def profile_marks(profile: Profile, device: Device, mlx: str | None = None) -> list[EntryMark]:
    """The Profile tab's column: each entry's mark for this device, from the static checks."""
    if mlx is None:
        from blockwidth.console.inputs import mlx_version

        mlx = mlx_version()
    return marks(static_checks(profile, device, mlx), len(profile.entries))


# ---- measured checks ------------------------------------------------------------------------

DEFAULT_DECLINED = (2, 4, 8)  # widths a decline is re-tried at when it says none itself


def declined_widths(e: Entry, profile: Profile) -> tuple[tuple[int, ...], str]:
    """The widths a decline declined: its evidence, else its record's session, else a default."""
    ws = e.evidence.get("widths") if isinstance(e.evidence, Mapping) else None
    if isinstance(ws, list) and ws and all(isinstance(w, int) and w >= 2 for w in ws):
        return tuple(ws), "the entry's evidence"
    path = record_path(e, profile)
    if path is not None and path.is_file():
        try:
            ws = files.read_json(path, files.MAX_RECORD_BYTES)["config"]["widths"]
            if ws and all(isinstance(w, int) and w >= 2 for w in ws):
                return tuple(ws), f"record {path.name}"
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            pass
    return DEFAULT_DECLINED, "no widths recorded; the default"


@dataclass(frozen=True)
class MeasureOptions:
    n: int = 3
    max_tokens: int = 32
    record_dir: Path | None = None
    verify_attention: str = "auto"  # the engine's choice of verify attention (--verify-attention)


def _prompt_for(e: Entry) -> tuple[str, str]:
    """The demo prompt the entry was measured on, when its hash names one; else the default."""
    import hashlib

    from blockwidth.engine.demo.prompts import DEFAULT_PROMPT, DEMO_PROMPTS

    want = e.evidence.get("prompt_sha256") if isinstance(e.evidence, Mapping) else None
    for p in DEMO_PROMPTS:
        if want and hashlib.sha256(p.encode("utf-8")).hexdigest() == want:
            return p, "the entry's prompt (a demo prompt)"
    return DEFAULT_PROMPT, ("the default demo prompt" + (" (the entry's prompt is not known here)"
                                                          if want else ""))


def _workload_for(e: Entry) -> tuple[Any, str]:
    """The workload the entry was decided on, when its evidence names one that is here with the
    same content: (workload, where it came from); else (None, why not, or "" when it names none)."""
    from blockwidth.policy import workload

    wl = e.evidence.get("workload") if isinstance(e.evidence, Mapping) else None
    if not isinstance(wl, Mapping):
        return None, ""
    name, source, sha = (wl.get(k) for k in ("name", "source", "sha256"))
    if not all(isinstance(x, str) and x for x in (name, source, sha)):
        return None, "the entry's workload is not named in full (name, source, sha256)"
    got = workload.find(name, source, sha)
    if got is None:
        return None, f"the entry's workload {name} ({source}) is not here with sha256 {sha[:12]}"
    return got, f"the entry's workload: {got.describe()}"


def measure_pair(p: ConfiguredPair, profile: Profile, options: MeasureOptions,
                 on_event: Callable[[Any], None] | None = None, cancel: Any = None) -> Check:
    """A short A/B of the entry this pair matches here: its width, or the widths it declined.
    ``cancel`` (a threading.Event; Ctrl-C, SIGTERM or SIGHUP set it): the session stops after
    the forward under way and its record is written, marked cancelled."""
    from blockwidth.console import records, session as recorded_session
    from blockwidth.engine.session import host
    from blockwidth.engine.pair import RUNNABLE, load_pair
    from blockwidth.policy.drafter import DrafterKind

    name = f"measure: {p.label}"
    if p.entry is None:
        return Check(name, Status.SKIP, f"no profile entry applies to {p.label} here: nothing to confirm",
                     Category.MEASURE)
    e = profile.entries[p.entry - 1]
    head = f"{entry_label(p.entry, e)} ({outcome(e)})"
    if DrafterKind(p.kind) not in RUNNABLE:
        return Check(name, Status.SKIP, f"{head}: the embedded engine does not run {p.kind} drafters",
                     Category.MEASURE, entry=p.entry, line=e.line)
    if e.path != "engine":  # re-measured where it was measured, or not at all (docs/served.md)
        return Check(name, Status.SKIP, f"{head}: measured through mlx_lm.server; --measure re-runs "
                     f"the engine path only (blockwidth sweep --path mlx-lm-server measures it again)",
                     Category.MEASURE, entry=p.entry, line=e.line)
    if e.decline:
        widths, widths_from = declined_widths(e, profile)
    elif e.auto is not None:  # the engine adapts on it: auto is what is re-measured
        widths, widths_from = ("auto",), "the entry (auto)"
    else:
        widths, widths_from = (e.width,), "the entry"
    prompt, prompt_from = _prompt_for(e)
    replay, replay_from = _workload_for(e)
    if replay is not None:
        prompt_from = replay_from
    elif replay_from:
        prompt_from = f"{prompt_from}; {replay_from}"
    gain = e.evidence.get("min_gain") if isinstance(e.evidence, Mapping) else None
    pair = load_pair(p.target, p.drafter, p.kind)  # a PairError names its input; run() words it
    gate = host.gate()
    config = recorded_session.config(widths=widths, prompt=prompt, n=options.n, max_tokens=options.max_tokens,
                                     predict=False, verify_attention=options.verify_attention, workload=replay,
                      auto_max=e.auto.max_width if e.auto is not None else None,
                      **({"min_gain": float(gain)} if isinstance(gain, (int, float)) and 0 <= gain < 1 else {}))
    import threading

    from blockwidth.console.measure import run_interruptibly

    cancel = cancel if cancel is not None else threading.Event()
    try:
        done, _ = run_interruptibly(
            lambda: recorded_session.run(pair, config, record_dir=options.record_dir, gate=gate,
                                         on_event=on_event, cancel=cancel),
            cancel, f"measuring {p.label}")
    except BlockwidthError as err:  # bad input (a DecodeError, a WorkloadError...): said, not a failed check
        raise err.adding(before=f"{p.label}: ") from None
    except Exception as err:  # the engine broke on this runner: that is the check's answer
        return Check(name, Status.FAIL, f"{head}: the measurement failed ({type(err).__name__}: {err})",
                     Category.MEASURE, {"widths": list(widths)}, entry=p.entry, line=e.line)
    session, rec_path, err = done.session, done.record_path, done.write_error
    record_error = None
    if err is not None:  # the measurement stands; run() reports the write after the results
        record_error = (f"--record-dir {options.record_dir or records.default_dir()}: the record of "
                        f"{p.label} cannot be written ({err.strerror or err})")
    status, why = measured_status(e, session)
    figures = {
        "entry": p.entry, "outcome": outcome(e), "widths": list(widths), "widths_from": widths_from,
        "n": options.n, "reps": session.reps, "new_tokens": options.max_tokens,
        "verify_attention": session.attention,
        "prompt": prompt_from, "prompt_sha256": session.prompt_sha256,
        "classic_tok_s": session.classic.decode_range().to_list(),
        "arms": {a.name: {"decode_tok_s": a.decode_range().to_list() if a.runs else None,
                          "verdict": a.verdict.value,
                          "identical": a.identity.identical_ids if a.identity else None,
                          **(session.estimates[a.width].to_dict() if a.width in session.estimates else {})}
                 for a in session.arms},
        "workload": replay.to_dict() if replay is not None else None,
        "drift": session.drift, "drift_chance": session.drift_chance,
        "host_warnings": list(gate.warnings), "record": str(rec_path) if rec_path else None,
        **({"record_error": record_error} if record_error else {}),
        "claimed": {k: e.evidence.get(k) for k in ("classic_tok_s", "width_tok_s", "ratio", "ratio_ci")
                    if isinstance(e.evidence, Mapping) and k in e.evidence},
    }
    return Check(name, status, f"{head}: {why}", Category.MEASURE, figures, entry=p.entry, line=e.line)


# ---- the command --------------------------------------------------------------------------

def add_arguments(p: Any) -> None:
    """The check command's own options (``blockwidth check``, or its alias ``--check``)."""
    from blockwidth.console.request import MAX_N, MAX_TOKENS, integer

    p.add_argument("--measure", action="store_true",
                   help="a short A/B of each matching entry's width (or declined widths)")
    p.add_argument("--strict", action="store_true",
                   help="warnings (stale MLX version, missing record...) fail")
    p.add_argument("--allow-inconclusive", action="store_true",
                   help="with --measure: an undecided or drifted measurement does not fail")
    p.add_argument("--json", action="store_true", help="one JSON document, an object per check, on stdout")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML to FILE")
    p.add_argument("-n", type=integer(1, MAX_N, "repetitions per arm"), default=None, metavar="N",
                   help="with --measure: repetitions per arm (default 3)")
    p.add_argument("--max-tokens", type=integer(1, MAX_TOKENS, "then bounded by the target's context"),
                   default=None, metavar="T", help="with --measure: new tokens per run (default 32)")


def _inputs(profile_path: Path | None, profile: Profile | None) -> list[tuple[str, Path | None]]:
    """What a check reads, which no output of it may be: the profile and the records it names."""
    out: list[tuple[str, Path | None]] = [("the profile", profile_path)]
    for i, e in enumerate(profile.entries if profile else (), 1):
        out.append((f"entry {i}'s record", record_path(e, profile)))
    return out


def _validate_output(path_text: str, inputs: list[tuple[str, Path | None]]) -> tuple[Path | None, str | None]:
    from blockwidth.console.outputs import OutputError, check_output

    try:
        return check_output(path_text, "--junit", inputs), None
    except OutputError as e:
        return None, str(e)


def run(args: Any, out: Any = None, err: Any = None) -> int:
    """``blockwidth check`` (``--check``): problems with the input are all reported (exit 2)
    before anything is checked or measured; the profile is only read."""
    import sys

    from blockwidth.console import check_report
    from blockwidth.console.inputs import CLI_NAMES, device_for, mlx_version
    from blockwidth.engine.device import probe
    from blockwidth.policy import profile as profiles
    from blockwidth.policy.errors import BlockwidthError

    out = out or sys.stdout
    err = err or sys.stderr
    problems: list[str] = []
    n = 3 if args.n is None else args.n
    max_tokens = 32 if args.max_tokens is None else args.max_tokens
    measure, strict = bool(args.measure), bool(args.strict)
    allow = bool(args.allow_inconclusive)
    if args.n is not None and not args.measure:
        problems.append("-n is for --check --measure (repetitions per arm)")
    if args.max_tokens is not None and not args.measure:
        problems.append("--max-tokens is for --check --measure (new tokens per run)")
    if args.allow_inconclusive and not args.measure:
        problems.append("--allow-inconclusive is for --check --measure (only a measurement is inconclusive)")

    device = None
    try:
        device = device_for(args.device)
    except BlockwidthError as e:
        problems.append(e.say(CLI_NAMES))
    if measure and device is not None and args.device:
        here = probe()
        if not device_agrees(device, here):
            problems.append(f"--measure times this machine ({here.describe()}); --device {args.device} "
                            f"names another: drop one")
            device = None

    prof_path = Path(args.profile).expanduser() if args.profile else profiles.default_path()
    too_long = files.name_problem(args.profile) if args.profile else None
    if args.profile == "":
        problems.append("--profile '': give a file name")
    elif too_long:  # as every path option is refused (policy.files.user_path)
        problems.append(f"--profile {too_long}")
    prof = None
    if args.profile != "" and not too_long:
        try:
            prof = profiles.load(prof_path, missing_ok=False)
        except profiles.ProfileError as e:
            problems += [f"profile {e.path}: {p}" for p in e.problems]
            if not args.profile and "no such file" in " ".join(e.problems):
                problems[-1] += " (the default profile; give --profile FILE)"

    if getattr(args, "verify_attention", "auto") not in (None, "auto") and not measure:
        problems.append("--verify-attention is for --check --measure (the attention its sessions verify with)")
    if args.record_dir is not None and not measure:
        problems.append("--record-dir is for --check --measure (where its session records go)")
    record_dir = None
    if measure:  # where the sessions' records go, checked (and created) before anything runs
        from blockwidth.console.session import record_dir as checked_record_dir

        try:
            record_dir = checked_record_dir(args.record_dir)
        except BlockwidthError as e:
            problems.append(e.say(CLI_NAMES))

    junit_path = None
    inputs = _inputs(prof_path, prof)
    if args.junit is not None:
        junit_path, why = _validate_output(args.junit, inputs)
        if why:
            problems.append(why)

    mlx = mlx_version()
    pairs: list[ConfiguredPair] = []
    if prof is None or device is None:  # the pair's paths are still worth a line of their own
        from blockwidth.console.inputs import pair_paths

        try:
            pair_paths(args.target, args.draft, args.demo_target, args.kind)
        except BlockwidthError as e:
            problems.append(e.say(CLI_NAMES))
    else:
        try:
            pairs.append(configure_pair(target=args.target, draft=args.draft, kind=args.kind,
                                        variant=args.demo_target, flag=args.flag, device=device,
                                        profile=prof, mlx=mlx, origin="command line"))
        except BlockwidthError as e:
            problems.append(e.say(CLI_NAMES))
        seen = {(p.target.resolve(), p.drafter.resolve() if p.drafter else None) for p in pairs}
        for i, target, drafter, kind in recorded_pairs(prof, device):
            key = (Path(target).resolve(), Path(drafter).resolve() if drafter else None)
            if key in seen or problems:
                continue
            seen.add(key)
            try:
                pairs.append(configure_pair(target=target, draft=drafter, kind=kind or None,
                                            variant=None, flag=args.flag, device=device,
                                            profile=prof, mlx=mlx, origin=f"record of entry {i}"))
            except (BlockwidthError, ValueError) as e:  # a record's pair: its own words, not flags
                problems.append(f"entry {i}'s record names a pair that cannot be resolved: {e}")

    meta: dict[str, Any] = {
        "profile": str(prof_path), "device": device.describe() if device else args.device,
        "device_named": bool(args.device), "mlx": mlx, "strict": strict,
        "allow_inconclusive": allow, "measure": measure,
    }
    if problems:
        if junit_path is not None:
            why = _write_junit(junit_path, check_report.junit_input_error(problems, meta), inputs)
            if why:
                problems.append(why)
        for p in problems:
            print(f"blockwidth: error: {error_line(p)}", file=err)
        if args.json:  # a CI step parsing stdout gets the reason, not an empty document
            print(files.dumps_json({**meta, "exit_code": int(ExitCode.USAGE), "errors": problems,
                              "counts": {}, "checks": []}, indent=1), file=out)
        return ExitCode.USAGE

    checks = static_checks(prof, device, mlx, pairs)
    import threading

    cancel = threading.Event()  # Ctrl-C, SIGTERM: the session under way keeps its record; none after it
    if measure:
        options = MeasureOptions(n=n, max_tokens=max_tokens, record_dir=record_dir,
                                 verify_attention=getattr(args, "verify_attention", None) or "auto")
        for p in pairs:
            if cancel.is_set():
                break
            def progress(e: Any, label: str = p.label) -> None:
                if e.kind in ("warmup", "rep", "done"):
                    print(shown(f"  measure {label}: [{e.kind}] {e.arm} {e.message}".rstrip()), file=err)
            try:
                checks.append(measure_pair(p, prof, options, progress, cancel))
            except BlockwidthError as e:  # a pair from the flags is named by them
                for line in error_lines(e, CLI_NAMES if p.origin == "command line" else None):
                    print(f"blockwidth: error: {line}", file=err)
                return ExitCode.USAGE
    code = exit_code(checks, strict=strict, allow_inconclusive=allow)
    if cancel.is_set():
        code = ExitCode.INTERRUPTED  # as Ctrl-C ends every measuring command; the report says what finished
    # The files first, so that what stdout says (exit_code in the JSON, the tally's exit) is
    # what the process exits with; a write that fails is exit 2, said after the report.
    late = [c.figures["record_error"] for c in checks if c.figures.get("record_error")]
    if junit_path is not None:
        why = _write_junit(junit_path, check_report.junit(checks, {**meta, "exit_code": int(
            ExitCode.USAGE if late else code)}), inputs)
        if why:
            late.append(why)
    if late:
        code = ExitCode.USAGE
        meta["errors"] = late
    meta["exit_code"] = int(code)
    if args.json:
        print(files.dumps_json(check_report.json_doc(checks, meta), indent=1), file=out)
    else:
        print(check_report.text(checks, meta), file=out)
    if hasattr(out, "flush"):
        out.flush()
    from blockwidth.console.outputs import kept_note

    for line in late:
        print(f"blockwidth: error: {error_line(line)}{kept_note()}", file=err)
    return code


def _write_junit(path: Path, data: bytes, inputs: list[tuple[str, Path | None]]) -> str | None:
    """Write the JUnit report (checked again, atomically); the one-line reason when it fails."""
    from blockwidth.console.outputs import OutputError, keep, write_output

    try:
        keep("JUnit report", write_output(path, data, "--junit", inputs))
    except OutputError as e:
        return str(e)
    return None
