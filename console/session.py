"""The one door to a recorded session. Every front end (``sweep`` on the engine path and on the
served path, ``check --measure``, the console's ``a``) runs its session through here: the session
runs, its record is built and written, and what was measured comes back with where the record
went (or why it could not be written: the results stand all the same). The front ends only wire
it up: their flags or fields, their progress, their words.

Also here, once, what each front end checks before a model loads: the record directory, the
profile a ``--save`` will write, and the answer after a save. No Textual.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from blockwidth.console import outputs
from blockwidth.console.inputs import CLI_NAMES, BlockwidthError, InputError, user_path

if TYPE_CHECKING:
    from blockwidth.console.request import SessionRequest
    from blockwidth.engine.ab import AbConfig
    from blockwidth.engine.session.host import GateReport


# ---- before a model loads ---------------------------------------------------------------------

def record_dir(value: str | None) -> Path:
    """The record directory, checked before any model loads: it exists (or is created) and a
    file can be written in it. Raises InputError naming it."""
    import tempfile

    from blockwidth.console import records

    d = user_path(value, "record dir") or records.default_dir()
    what = f"--record-dir {d}" if value is not None else f"record directory {d}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=d, prefix=".record.probe.", suffix=".tmp"):
            pass
    except FileExistsError:
        raise InputError(f"{what}: is a file, not a directory") from None
    except OSError as e:
        raise InputError(f"{what}: cannot be written ({e.strerror})") from None
    return d


def profile_for_save(value: str | None, inputs: Iterable[tuple[str, Path | None]] = ()) -> None:
    """The profile a --save will write, validated before any model loads: a profile that can be
    written, and none of the run's other inputs under another name (``inputs``)."""
    from blockwidth.console import profile_file
    from blockwidth.policy import profile as profiles

    path = user_path(value, "profile")
    profile_file.check_writable(path)
    outputs.not_an_input(path or profiles.default_path(), "--profile", list(inputs))


def config(req: SessionRequest | None = None, **options: Any) -> AbConfig:
    """The session's settings (engine.ab.AbConfig), built here for every front end: from the
    request the sweep and the console parse (console.request), and the options only some front
    ends have (``widths`` and ``prompt`` where the front end changed them: the width in effect
    added, a literal prompt). ``check --measure`` has no request: its settings are its entry's."""
    from blockwidth.engine.ab import AbConfig

    fields: dict[str, Any] = {} if req is None else dict(
        widths=req.widths, prompt=req.prompt, n=req.n, max_tokens=req.tokens,
        sequential=req.sequential, max_reps=req.max_reps, max_seconds=req.max_seconds)
    fields.update(options)
    return AbConfig(**fields)


# ---- the session, run and recorded ------------------------------------------------------------

@dataclass
class Recorded:
    """A finished (or cancelled) session and its record: ``record_path`` where it was written, or
    None and ``write_error`` the OSError that stopped the write (each front end words it)."""

    session: Any  # engine.ab.Session (a served level's too)
    record: dict
    record_path: Path | None
    write_error: OSError | None = None
    record_dir: Path | None = None  # where it was to go (None: the user data directory)


def write(rec: dict, directory: Path | None, session: Any) -> Recorded:
    """Write a built record; a failed write is returned, never raised: the measurement stands."""
    from blockwidth.console import records

    try:
        path = records.write(rec, directory)
    except OSError as e:
        return Recorded(session, rec, None, e, directory)
    outputs.keep("record", path)
    return Recorded(session, rec, path, None, directory)


def run(pair: Any, config: AbConfig, *, record_dir: Path | None, gate: GateReport | None = None,
        on_event: Callable[[Any], None] | None = None, cancel: threading.Event | None = None,
        lockstep: Any = None, annotate: Callable[[dict, Any], None] | None = None) -> Recorded:
    """Run an A/B session on a loaded pair (engine.ab.run_session), build its record and write it.
    ``gate``: the host gate the front end already ran (and warned of); run here when None.
    ``annotate(record, session)``: what a front end adds to the record before it is written (a
    sharded group's ranks). Raises what the session raises (a DecodeError for bad input)."""
    from blockwidth.engine.ab import run_session
    from blockwidth.engine.session import host, record

    gate = gate if gate is not None else host.gate()
    session = run_session(pair, config, on_event=on_event, cancel=cancel, lockstep=lockstep)
    rec = record.build(session, pair, host.identity(), gate.to_dict())
    if annotate is not None:
        annotate(rec, session)
    return write(rec, record_dir, session)


def run_served(pair: Any, config: Any, *, record_dir: Path | None, gate: GateReport,
               on_level: Callable[[Recorded, Any], None], on_event: Callable[[Any], None] | None = None,
               on_server: Callable[[Any], None] | None = None,
               cancel: threading.Event | None = None) -> Any:
    """A served session (engine.session.served.run_served): each concurrency level's record is
    written as the level ends (a later level's failure loses nothing measured) and handed to
    ``on_level(recorded, level)``. Returns the ServedSession; raises what it raises."""
    from blockwidth.engine.session import host
    from blockwidth.engine.session.served import level_record, run_served as served

    identity = host.identity()

    def level(session: Any, lv: Any) -> None:
        on_level(write(level_record(session, lv, identity, gate.to_dict()), record_dir, lv.session), lv)

    return served(pair, config, on_event=on_event, on_server=on_server, on_level=level, cancel=cancel)


# ---- after a save -----------------------------------------------------------------------------

def answer_after(args: Any, session: Any, route: str = "engine") -> Any:
    """The answer as ``resolve`` now gives it (after the save) for ``route``, with this session's
    word on it."""
    from blockwidth.console.answer import answer
    from blockwidth.console.inputs import resolution
    from blockwidth.console.outcome import in_effect_note

    try:
        res, paths, _ = resolution(target=args.target, draft=args.draft, kind=args.kind, flag=None,
                                   device=None, profile=args.profile, variant=args.demo_target,
                                   profile_missing_ok=True, route=route)
    except BlockwidthError as e:
        return answer(None, None, resolve_error=e.say(CLI_NAMES))
    note = in_effect_note(session, res.width)
    return answer(res, paths, session=note[0] if note else None)
