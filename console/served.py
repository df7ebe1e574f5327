"""``sweep --path mlx-lm-server``: the A/B session through the real mlx_lm.server, headless.

The session is engine.session.served's; this is its front end: the checks before anything starts, a
record per concurrency level written as soon as the level ends, ``--save`` per level, and the
table. Nothing here imports Textual.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from blockwidth.console import outputs
from blockwidth.console.inputs import ExitCode, InputError, pair_paths, user_path
from blockwidth.policy import files
from blockwidth.policy.commands import server_how
from blockwidth.policy.text import error_line, error_lines, shown

PATH_HELP = ("what is measured: engine (blockwidth's decode loop, default) or mlx-lm-server (the "
             "installed mlx_lm.server on loopback: one process with the draft model, one without, "
             "streamed /v1/completions)")


def concurrency_levels(text: str) -> tuple[int, ...]:
    """``--concurrency 1,4,16``: an argparse type, each level 1..MAX_CONCURRENCY."""
    from blockwidth.policy.profile import MAX_CONCURRENCY

    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isascii() or not part.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r}: levels are whole numbers, e.g. 1,4,16")
        v = int(part)
        if not 1 <= v <= MAX_CONCURRENCY:
            raise argparse.ArgumentTypeError(f"{v} is out of range 1..{MAX_CONCURRENCY} concurrent requests")
        out.append(v)
    return tuple(dict.fromkeys(out))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The served path's options of ``sweep`` (the others are the engine path's own)."""
    p.add_argument("--path", choices=("engine", "mlx-lm-server"), default="engine", help=PATH_HELP)
    p.add_argument("--concurrency", type=concurrency_levels, default=None, metavar="1,4,16",
                   help="with --path mlx-lm-server: concurrent clients per arm, each level 1..64 "
                        "judged on its own (default 1)")
    p.add_argument("--server-args", default="", metavar="ARGS",
                   help="with --path mlx-lm-server: more mlx_lm.server arguments, as one string "
                        "(--server-args=\"--prompt-cache-size 4\"); the pair, host and port are "
                        "blockwidth's")
    p.add_argument("--port", type=_port, default=None,
                   help="with --path mlx-lm-server: the classic server's loopback port (the draft "
                        "server takes the next); default: free ports")
    p.add_argument("--ready-timeout", type=_ready_timeout, default=None, metavar="S",
                   help="with --path mlx-lm-server: seconds each server may take to load its model "
                        "(default 180)")


def _port(text: str) -> int:
    t = text.strip()
    if not t.isascii() or not t.isdigit() or not 1 <= int(t) <= 65534:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 1..65534")
    return int(t)


def _ready_timeout(text: str) -> float:
    from blockwidth.console.request import seconds

    return seconds(0, 3600, open_low=True)(text)


def served_only(args: argparse.Namespace) -> None:
    """Served options given to the engine path: refused, not ignored."""
    for flag, given in (("--concurrency", args.concurrency is not None),
                        ("--server-args", bool(args.server_args)), ("--port", args.port is not None),
                        ("--ready-timeout", args.ready_timeout is not None)):
        if given:
            raise InputError(f"{flag} only applies with --path mlx-lm-server")


def server_args(text: str) -> tuple[str, ...]:
    from blockwidth.engine.session.served import check_server_args

    try:
        words = shlex.split(text or "")
    except ValueError as e:  # shlex: an unclosed quote
        raise InputError(f"--server-args {text!r}: {e}") from None
    return check_server_args(words)  # a ServedError names what is wrong


def cmd_sweep_served(args: argparse.Namespace) -> int:
    import threading

    from blockwidth.console import session as recorded_session
    from blockwidth.console.request import read_prompt, session_request
    from blockwidth.console.session import profile_for_save, record_dir
    from blockwidth.engine.session import host
    from blockwidth.engine.session.served import READY_TIMEOUT_S, ServedConfig, ServedError, served_pair
    from blockwidth.policy.drafter import DrafterKind

    if args.kind not in (None, DrafterKind.MODEL.value):
        raise InputError(f"--kind {args.kind}: mlx_lm.server drafts with a draft model only (--kind "
                         f"model); the engine path (--path engine) runs {args.kind}")
    if args.target is not None and args.draft is None:
        raise InputError("--path mlx-lm-server needs --draft: mlx_lm.server drafts with a draft model")
    from blockwidth.console.measure import read_workload

    workload = read_workload(args.workload, args.prompt, args.prompt_file)  # checked before any server
    req = session_request(widths=args.widths, n=args.n, tokens=args.max_tokens,
                          prompt=read_prompt(args.prompt, args.prompt_file),
                          sequential=args.sequential, max_reps=args.max_reps, max_seconds=args.max_seconds)
    if getattr(args, "auto_max", None) is not None:
        raise InputError(f"--auto-max {args.auto_max}: the auto arm runs on the engine path only")
    if "auto" in req.widths:
        raise InputError("--widths auto: mlx_lm.server takes one width per request (num_draft_tokens) "
                         "and cannot adapt per round; the auto arm runs on the engine path")
    for flag, given in (("--allow-nonidentical", args.allow_nonidentical),
                        ("--pair-specific", args.pair_specific)):
        if given and not args.save:
            raise InputError(f"{flag} only applies with --save")
    if args.profile is not None and not args.save:
        raise InputError(f"--profile {args.profile}: only applies with --save (a sweep without "
                         f"--save reads and writes no profile)")
    if args.max_reps < args.n and args.sequential:
        raise InputError(f"--max-reps {args.max_reps}: below -n {args.n}; the budget must allow the "
                         f"first n repetitions")
    if args.verify_linear not in (None, "auto", "stock"):
        raise InputError(f"--verify-linear {args.verify_linear}: the served path runs mlx_lm.server's "
                         f"own projections; only the engine path routes them")
    extra = server_args(args.server_args)
    levels = args.concurrency or (1,)
    records = record_dir(args.record_dir)
    if args.save:
        profile_for_save(args.profile, [("--prompt-file", user_path(args.prompt_file, "prompt file"))])
    paths = pair_paths(args.target, args.draft, args.demo_target, "model", weights=True)
    pair = served_pair(paths.target, paths.drafter)  # a PairError names its input
    from blockwidth.engine.shapes import check_ids

    if workload is None:
        # the prompt's own ids, as the engine path checks them (Pair.encode) before the server sees it
        check_ids(pair.tokenizer.encode(req.prompt), pair.token_rows, f"target {pair.target_path}", "prompt")
    else:  # every request renders (a WorkloadError names its line) and fits, before a server starts
        from blockwidth.engine.workload import prepare

        for p in prepare(workload, pair.tokenizer, req.tokens):
            check_ids(list(p.ids), pair.token_rows, f"target {pair.target_path}", f"request {p.id}")
    if args.wait_quiet > 0 and not args.json:
        print(f"blockwidth: waiting up to {args.wait_quiet:g}s for a quiet host", file=sys.stderr)
    gate = host.gate(wait_s=args.wait_quiet)
    for w in gate.warnings:
        print(f"blockwidth: warning: {shown(w)}", file=sys.stderr)
    config = ServedConfig(
        recorded_session.config(req, exactness=False, predict=False,
                                verify_attention=args.verify_attention or "fused",
                                min_gain=args.min_gain, seed=args.seed, workload=workload),
        levels, extra, args.verify_attention, args.port,
        ready_timeout=args.ready_timeout if args.ready_timeout is not None else READY_TIMEOUT_S,
        # the served path's default is the stock server an operator runs: on asks for the
        # exact path in-process (engine.exact), on every server alike
        exact=getattr(args, "exact", "auto") == "on")
    quiet = args.json
    written: list[tuple[Any, dict, Any, str | None, str | None]] = []
    late: list[str] = []

    def on_server(server) -> None:
        # The pids, so that an operator (or a test) can see what runs and that it is gone.
        spec = server.spec
        how = server_how(spec.exact, spec.verify_attention)
        print(f"blockwidth: started {server.name} on {server.url}" + ("" if how == "stock" else f" ({how})"),
              file=sys.stderr, flush=True)

    def on_event(e) -> None:
        if quiet:
            return
        if e.kind == "session":
            print(f"  [{e.message}]", file=sys.stderr, flush=True)
        elif e.kind == "phase":
            print(f"  [{e.phase}] {e.arm}".rstrip(), file=sys.stderr, flush=True)
        elif e.kind in ("warmup", "rep"):
            print(shown(f"  [{e.kind}] {e.arm} {e.message}".rstrip()), file=sys.stderr, flush=True)

    def on_level(done, lv) -> None:
        # Written as the level ended (console.session): a later level's failure loses nothing
        # measured here. A write that failed is said after the results, never instead of them.
        rec, record_file = done.record, done.record_path
        if done.write_error is not None:
            e = done.write_error
            late.append(f"record directory {records}: the record of concurrency {lv.concurrency} "
                        f"cannot be written ({e.strerror or e})")
        saved = refusal = None
        if args.save and record_file is None:
            late.append(f"--save: nothing saved for concurrency {lv.concurrency} (a profile entry names "
                        f"its record, which was not written)")
        elif args.save:
            from blockwidth.console.profile_file import ProfileBusy
            from blockwidth.console.save import save_session
            from blockwidth.policy.profile import ProfileError

            srv = {"mlx_lm": rec["server"]["mlx_lm"], "args": list(extra),
                   "verify_attention": args.verify_attention}
            if rec["server"].get("env"):  # the MLX_* switches it was measured with
                srv["env"] = dict(rec["server"]["env"])
            try:
                saved, refusal = save_session(lv.session, pair, record_file, args.profile,
                                              allow_nonidentical=args.allow_nonidentical,
                                              pair_specific=args.pair_specific, route="mlx-lm-server",
                                              concurrency=lv.concurrency, server=srv)
            except ProfileBusy as e:
                refusal = f"{e} (the record is kept: {record_file})"
            except ProfileError as e:
                late.append("; ".join(error_lines(e)) + " (nothing saved)")
        written.append((lv, rec, record_file, saved, refusal))

    cancel = threading.Event()
    from blockwidth.console.signals import cancelling

    try:
        # Ctrl-C, SIGTERM or SIGHUP: the level under way stops after the request in flight and
        # its record is written, marked cancelled, as a finished level's is; a second one quits
        with cancelling(cancel, "the served session"):
            session = recorded_session.run_served(pair, config, record_dir=records, gate=gate,
                                                  on_level=on_level, on_event=on_event,
                                                  on_server=on_server, cancel=cancel)
    except ServedError as e:
        raise e.adding(_kept(written)) from None
    except KeyboardInterrupt:
        cancel.set()
        if written:
            print(f"blockwidth: records kept: {', '.join(str(w[2]) for w in written)}", file=sys.stderr)
        raise
    from blockwidth.console.session import answer_after

    # the answer as resolve now gives it for serving, with the first level's word on it
    said = answer_after(args, written[0][0].session, route="mlx-lm-server") if args.save and written else None
    if args.json:
        out = []
        for lv, rec, record_file, saved, refusal in written:
            r = dict(rec)
            r.update(record_path=str(record_file) if record_file else None, saved=saved, save_refused=refusal)
            r["host"] = {k: rec["host"][k] for k in ("device", "mlx", "mlx_lm")}
            out.append(r)
        code = _exit(session, written, late)
        print(files.dumps_json({"path": "mlx-lm-server", "levels": out, "errors": late, "exit_code": code,
                                **({"answer": said.to_dict()} if said is not None else {})}, indent=1))
    else:
        _print(session, written, pair)
        for i, line in enumerate(said.lines() if said is not None else []):
            print(shown(f"{'answer' if i == 0 else '':<6} {line}"))
    sys.stdout.flush()
    for line in late:
        print(f"blockwidth: error: {error_line(line)}{outputs.kept_note()}", file=sys.stderr)
    return _exit(session, written, late)


def _exit(session, written, late: list[str]) -> int:
    if late:
        return ExitCode.USAGE
    if session.cancelled:
        return ExitCode.INTERRUPTED
    return ExitCode.CHECK_FAILED if any(w[4] for w in written) else ExitCode.OK


def _kept(written) -> str:
    return f" (records of the finished levels are kept: {', '.join(str(w[2]) for w in written)})" if written else ""


def _print(session, written, pair) -> None:
    from blockwidth.console.outcome import headline
    from blockwidth.engine.session.served import level_warnings, server_env, server_version
    from blockwidth.policy.commands import env_words, shell

    def say(line: str = "", **kw) -> None:  # one line each; names from the checkpoint shown escaped
        print(shown(line), **kw)

    c = session.config
    how = server_how(c.exact, c.verify_attention)
    say(f"pair   {pair.describe()}")
    env = server_env()
    say(f"path   mlx-lm-server: mlx_lm.server {server_version()} ({how})"
        + (f", args {shell(c.server_args)}" if c.server_args else "")
        + (f", environment {env_words(env)}" if env else ""))
    ref = session.reference
    if c.ab.workload is not None:
        say(f"{c.ab.workload.describe()}; {c.ab.max_tokens} new tokens a request unless it says, n={c.ab.n}")
    else:
        say(f"prompt {ref.prompt_tokens} tokens, {c.ab.max_tokens} new (classic's first sending made "
            f"{ref.tokens}), n={c.ab.n}")
    for rid, firsts in (session.first_by_request.items() if c.ab.workload is not None
                        else [(None, session.first_sendings)]):
        mine = session.references.get(rid, ref) if rid else ref
        for w, first in sorted(firsts.items()):
            same = "identical" if first.text == mine.text else "DIFFERS"
            say(f"  first sending w{w}{' on ' + rid if rid else ''}: {same} to classic's first sending")
    for lv, rec, record_file, saved, refusal in written:
        s = lv.session
        figure = "decode tok/s" if lv.concurrency == 1 else "aggregate tok/s"
        say()
        say(f"concurrency {lv.concurrency}: reps run {s.reps}, {s.elapsed_s:.1f}s")
        say(f"{'arm':<8}  {figure + ' min/med/max':>28}  {'TTFT med':>9}  {'latency med':>11}  "
            f"{'identity':<24} verdict")
        for arm, a in zip([s.classic, *s.arms], rec["arms"]):
            d = arm.decode_range()
            ttft = a["ttft_s"][1] if a.get("ttft_s") else None
            lat = a["latency_s"][1] if a.get("latency_s") else None
            ident = "-" if arm.width is None else _identity_words(lv.identity.get(arm.name, {}))
            rng = f"{d.min:8.1f} {d.median:8.1f} {d.max:8.1f}" if d else f"{'-':>26}"
            say(f"{arm.name:<8}  {rng:>28}  {_s(ttft):>9}  {_s(lat):>11}  {ident:<24} {arm.verdict.value}")
        for arm in s.arms:
            if arm.identity is not None and not arm.identity.identical:
                say(f"  {arm.name}: {arm.identity.describe()}")
        for warning in [*s.warnings(), *level_warnings(session, lv)]:
            say(f"warning: {warning}")
        say(f"verdict: {headline(s).text}")
        say(f"decision: {s.decision} — {s.why}")
        say(f"record: {record_file}" if record_file else "record: not written (below)")
        if saved:
            say(f"saved: {saved}")
        if refusal:
            say(f"not saved: {refusal}", file=sys.stderr)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.0f} ms"


def _identity_words(entry: dict) -> str:
    first, cached = entry.get("first_sending"), entry.get("cached_repeat")

    def word(i) -> str:
        return "-" if i is None else ("same" if i.identical else "DIFFERS")

    return f"first {word(first)}, cached {word(cached)}"
