"""The operator's answer, in one place: the command for the path that was measured, the width's
source and whether anything measured it, or why there is no command. ``y`` in the console,
``resolve`` (text and ``--json``) and ``sweep --save`` all say what ``answer`` returns.

Pure: a resolution and the pair's folders in, an ``Answer`` out (no files, no probes, no
Textual). The command is mlx_lm.server's, since that is what an operator runs; it names the
folders by absolute path, so it works from any directory.

- a model drafter: ``mlx_lm.server --model T --draft-model D --num-draft-tokens width-1``;
- a decline (classic measured faster): ``mlx_lm.server --model T``, no draft model;
- a drafter mlx_lm.server cannot run (dflash, mtp, eagle: it loads ``--draft-model`` as an
  ordinary mlx-lm model and fails on the first request with "Received N parameters not in
  model"; prompt lookup: it has none), a pair that did not load, nothing resolved: no command,
  a refusal that says why (the width still applies to blockwidth's own engine, where it runs).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.profile import PATH_ENGINE as ENGINE_PATH  # blockwidth's own decode loop
from blockwidth.policy.profile import PATH_SERVER as SERVER_PATH  # the real mlx_lm.server (the served path)
from blockwidth.policy.commands import Unprintable, env_words, printable, shell
from blockwidth.policy.profile import num_draft_tokens
from blockwidth.policy.resolve import Source, label

# Why mlx_lm.server cannot draft with a kind, said where the command would be.
_CANNOT = {
    DrafterKind.DFLASH: "mlx_lm.server cannot run a dflash drafter: it loads --draft-model as an "
                        "ordinary mlx-lm model, and the first request fails with \"Received N "
                        "parameters not in model\"",
    DrafterKind.MTP: "mlx_lm.server cannot run an mtp drafter: it loads --draft-model as an ordinary "
                     "mlx-lm model (the first request fails with \"Received N parameters not in "
                     "model\"), and it has no use for a target's own MTP layers",
    DrafterKind.EAGLE: "mlx_lm.server cannot run an eagle drafter: it drafts with an ordinary "
                       "mlx-lm draft model only",
    DrafterKind.LOOKUP: "mlx_lm.server has no prompt-lookup drafter (it drafts with a --draft-model only)",
}


# A speculative mlx_lm.server on CUDA that nobody measured: what the one measurement there says.
CUDA_SERVED = ("on CUDA, stock mlx_lm.server's draft path ran 0.22-0.43x classic with cuDNN's "
               "attention and 2.4-4.0x with MLX_CUDA_USE_CUDNN_SDPA=0 (H200, 5B pair, "
               "lab/evidence/h200-2026-12-02b); measure this command with blockwidth sweep --path "
               "mlx-lm-server before serving it")


def caution(res: Any, route: str | None) -> str | None:
    """CUDA_SERVED where a speculative mlx_lm.server command on CUDA was not measured on the
    served path (``route``: the path the width was measured on), else None."""
    device = getattr(res, "device", None)
    if route != SERVER_PATH and getattr(getattr(device, "backend", None), "value", None) == "cuda":
        return CUDA_SERVED
    return None


@dataclass(frozen=True)
class Answer:
    """What to run, or why there is nothing to run, and how far to trust the width."""

    width: int | None  # None: a decline (classic), or nothing resolved
    command: str | None  # the mlx_lm.server command line; None: refused (``refusal`` says why)
    refusal: str | None
    source: str  # where the width came from, in words ("profile", "per-kind default", ...)
    measured: bool  # something measured this width (a session's profile entry, a table row)
    trust: str  # one line: measured on what and with which verdict, or "not measured: ..."
    path: str | None = None  # the path the width was measured on (None: not measured)
    session: str | None = None  # what the session on screen says about the width, if any
    decline: bool = False
    # The engine's own setting for the same width: none for a decline (no width to set) or for
    # a pair that did not load (nothing of it runs anywhere).
    env: str | None = None
    caution: str | None = None  # what is known of the command where it was not measured
    # The session on screen measured classic faster than every width it ran: the command without
    # a draft model is what this machine just measured (``session_why``: saved or why not).
    session_command: str | None = None
    session_why: str | None = None

    @property
    def num_draft_tokens(self) -> int | None:
        return None if self.width is None else num_draft_tokens(self.width)

    def head(self) -> str:
        """One line: the width, num_draft_tokens, the source and, in the same line, whether it
        was measured."""
        if self.width is None and not self.decline:
            return f"no width: {self.refusal}"
        if self.decline:
            w = "classic (no draft model)"
        elif self.command is None:  # no mlx_lm.server command: its flag would name nothing
            w = f"width {self.width} ({self.num_draft_tokens} drafted tokens a round)"
        else:
            w = f"width {self.width} (--num-draft-tokens {self.num_draft_tokens})"
        return f"{w} · source {self.source} · {self.trust}"

    def lines(self) -> list[str]:
        """The answer as the front ends print it: the head, the command or the refusal, the
        session's word on it."""
        out = [self.head()]
        if self.command is not None:
            out.append(self.command)
        elif self.width is not None or self.decline:
            out.append(f"no mlx_lm.server command: {self.refusal}")
        if self.caution:
            out.append(f"caution: {self.caution}")
        if self.session_command:
            out.append(f"this session measured classic faster than every width ({self.session_why}): "
                       f"{self.session_command}")
        if self.session:
            out.append(f"this session: {self.session}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"width": self.width, "num_draft_tokens": self.num_draft_tokens,
                "serve_command": self.command, "serve_refusal": self.refusal,
                "source": self.source, "measured": self.measured, "measured_path": self.path,
                "trust": self.trust, "env": self.env, "decline": self.decline,
                "caution": self.caution, "session": self.session,
                "session_command": self.session_command, "session_why": self.session_why}


def _abs(path: Path, what: str) -> str:
    # absolute, and normalised, but through the links the operator named: a folder opened by a
    # relative path or from another directory still works in the copied line (quoted where the
    # line is rendered: policy.commands)
    return printable(os.path.abspath(Path(path).expanduser()), what)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _range(v: Any) -> str | None:
    """A [min, median, max] list from a profile's evidence (input: checked, never trusted)."""
    if isinstance(v, list) and len(v) == 3 and all(_num(x) is not None for x in v):
        return f"{_num(v[0]):.1f}-{_num(v[2]):.1f}"
    return None


def entry_verdict(evidence: Mapping[str, Any], width: int | None) -> str:
    """The verdict a profile entry's session reached, from its evidence: ``width 4 beat classic,
    60.0-63.0 against 40.0-42.0 tok/s, n 3`` (what is missing is left out)."""
    ev = evidence if isinstance(evidence, Mapping) else {}
    c, w = _range(ev.get("classic_tok_s")), _range(ev.get("width_tok_s"))
    n = ev.get("n") if isinstance(ev.get("n"), int) and not isinstance(ev.get("n"), bool) else None
    if width is None:
        head = "no measured width beat classic"  # slower, or short of the minimum gain
        tail = f" (classic {c} tok/s" + (f", n {n})" if n else ")") if c else (f" (n {n})" if n else "")
        return head + tail
    head = f"width {width} beat classic"
    if c and w:
        head += f", {w} against {c} tok/s"
    return head + (f", n {n}" if n else "")


def _trust(res: Any, session: bool = False) -> tuple[bool, str, str | None]:
    """(measured, the one line that says so, the path it was measured on). ``session``: a
    session on screen measured the width in effect (not saved: an unmeasured line says so)."""
    measured, line, path = _trust_line(res, session)
    if session and not measured:
        # right after a session, "run an A/B session to measure it" read as if none had run
        line += "; this session measured it (below), not saved"
    return measured, line, path


def _trust_line(res: Any, session: bool) -> tuple[bool, str, str | None]:
    src = res.source
    entry = getattr(res, "entry", None)
    if src is Source.PROFILE and entry is not None:
        path = getattr(entry, "path", None) or ENGINE_PATH
        on = "mlx_lm.server (the served path)" if path == SERVER_PATH else "blockwidth's engine"
        line = f"measured on {on}: {entry_verdict(entry.evidence, res.width)}"
        if path != SERVER_PATH:
            line += "; the served path (mlx_lm.server) was not measured"
        server = entry.server if isinstance(getattr(entry, "server", None), Mapping) else {}
        if entry.server_env:
            line += (f"; measured with {env_words(entry.server_env)} in the server's environment, "
                     f"which the command sets")
        if isinstance(server.get("verify_attention"), str):
            mode = server["verify_attention"]  # a profile is input: quoted as a command renders it
            line += (f"; measured with blockwidth's verify attention {shell([mode])}: run it as "
                     f"{shell(['blockwidth', 'serve', '--verify-attention', mode])}")
        if res.stale:
            line += "; STALE (another MLX version)"
        return True, line, path
    if src is Source.TABLE:
        path = getattr(res, "measured_path", None) or ENGINE_PATH
        row = getattr(res, "row", None)
        if row is not None and row.width is None:
            what = "every width was slower than classic there"
        elif row is not None and not row.won:
            what = f"width {res.width} was the fastest not slower there, not a win"
        else:
            what = f"width {res.width} beat classic there"
        return True, (f"measured for this device class in a committed record on blockwidth's engine "
                      f"({what}), not on this pair; the served path was not measured"), path
    if src is Source.FLAG:
        return False, "not measured: the operator's --draft-block-size", None
    if src is Source.ENV:
        return False, "not measured: the operator's environment variable", None
    if src is Source.DRAFTER:
        return False, "not measured: the width the drafter checkpoint declares", None
    hint = "" if session else " (run an A/B session to measure it)"
    return False, f"not measured: the per-kind constant{hint}", None


def answer(res: Any, paths: Any, *, load_error: str | None = None, resolve_error: str | None = None,
           session: str | None = None, session_decline: str | None = None) -> Answer:
    """The answer for a resolution (``res``, a policy.resolve.Resolution) and the pair's folders
    (``paths``: target and drafter). ``load_error``: why the pair did not load (then there is
    no command for it); ``session``: what the session on screen says about the width in effect."""
    if res is None:
        why = f"the resolution failed: {resolve_error}" if resolve_error else "the width is not resolved yet"
        return Answer(None, None, why, "-", False, why, session=session)
    measured, trust, path = _trust(res, bool(session))
    source = label(res.source)
    env = None if res.width is None else f"BLOCKWIDTH_DRAFT_BLOCK_SIZE={res.width}"
    base = dict(width=res.width, source=source, measured=measured, trust=trust, path=path,
                session=session, decline=res.width is None, env=None if load_error else env)
    if load_error:
        return Answer(command=None, refusal=f"the pair did not load ({load_error}); no command for it",
                      **base)
    try:
        return _answer(res, paths, base, path, session_decline)
    except Unprintable as e:  # a folder named with a newline or an escape: no line means it
        return Answer(command=None, refusal=f"no command is printed: {e}", **base)


def _answer(res: Any, paths: Any, base: dict, path: str | None, session_decline: str | None) -> Answer:
    target = _abs(paths.target, "the target's folder")
    classic = shell(["mlx_lm.server", "--model", target])
    if res.width is None:  # a decline: classic was faster, so the server runs without a draft model
        return Answer(command=classic, refusal=None, **base)
    # ``session_decline``: the session on screen found every width it ran slower than classic
    # (or short of the minimum gain), saved or not (the words say which): its command is classic's,
    # whether or not the resolved width has one (a lookup pair has none, and its answer said only
    # "not measured: the per-kind constant" after a session had measured it slower)
    extra = {"session_command": classic, "session_why": session_decline} if session_decline else {}
    kind = res.drafter_kind
    if kind in _CANNOT or paths.drafter is None:
        why = _CANNOT.get(kind, _CANNOT[DrafterKind.LOOKUP])
        where = ("blockwidth's engine does not run it either" if kind is DrafterKind.EAGLE else
                 f"width {res.width} runs on blockwidth's engine (BLOCKWIDTH_DRAFT_BLOCK_SIZE={res.width})")
        return Answer(command=None, refusal=f"{why}; {where}", **extra, **base)
    argv = ["mlx_lm.server", "--model", target, "--draft-model", _abs(paths.drafter, "the drafter's folder"),
            "--num-draft-tokens", str(num_draft_tokens(res.width))]
    env: dict[str, str] = {}
    entry = getattr(res, "entry", None)
    server = getattr(entry, "server", None) if entry is not None else None
    if path == SERVER_PATH and isinstance(server, Mapping):
        args = server.get("args")
        if isinstance(args, list) and all(isinstance(a, str) for a in args):
            argv += args  # the arguments it was measured with
        env = entry.server_env  # the environment it was measured in: without it, another kernel runs
    return Answer(command=shell(argv, env), refusal=None, caution=caution(res, path), **extra, **base)
