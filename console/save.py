"""Store a finished session in the profile: the one door from a session to the file.

The decision (an entry, or a refusal and why) is ``console.outcome.profile_entry``,
pure; this adds the device probe and the locked, atomic profile write
(``console.profile_file``). Both the ``sweep --save`` command and the console's ``s``
come through here.
"""

from __future__ import annotations

from pathlib import Path

from blockwidth.console.inputs import mlx_version, user_path
from blockwidth.policy.text import folder_label


def save_session(session, pair, record_path: Path, profile_path: str | Path | None, *,
                 allow_nonidentical: bool = False, pair_specific: bool = False,
                 front=None, route: str = "engine", concurrency: int | None = None,
                 server: dict | None = None) -> tuple[str | None, str | None]:
    """Store a session's outcome in the profile: (what was saved, None) or (None, why not).
    ``route``: what measured it (``engine`` or ``mlx-lm-server``: the profile's and the record's
    ``path`` key, named apart in code from a file's path)."""
    from blockwidth.console import profile_file
    from blockwidth.console.outcome import Front, PairFacts, Refusal, profile_entry
    from blockwidth.engine.device import probe

    drafter = folder_label(pair.drafter_path) if pair.drafter_path else (
        "the target's own MTP layers" if pair.kind.value == "mtp" else "prompt lookup")
    facts = PairFacts(pair.kind, pair.quantization, pair.pair_id, folder_label(pair.target_path), drafter,
                      getattr(pair, "target_dtypes", None))
    entry = profile_entry(session, facts, probe(),
                          mlx=mlx_version(), measured_at=profile_file.now_iso(),
                          record=str(Path(record_path).resolve()),  # --check reads a relative one beside the profile
                          allow_nonidentical=allow_nonidentical, pair_specific=pair_specific,
                          route=route, concurrency=concurrency, server=server)
    if isinstance(entry, Refusal):
        return None, entry.say(front or Front.CLI)
    profile_file_path = user_path(profile_path, "profile") if profile_path is not None else None
    prof = profile_file.save(profile_file_path, entry)
    what = f"width {entry.width}" if entry.width is not None else "decline (no width beat classic)"
    scope = "" if entry.pair else " (generic: any pair of this kind on this device and quantization)"
    return f"{what} for {entry.describe_keys()}{scope} in {prof.path}", None
