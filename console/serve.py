"""``blockwidth serve``: mlx_lm.server with the width the profile holds for this pair, device and
load, and the command line for the path a width was measured on.

The width is resolved exactly as ``blockwidth resolve`` resolves it (console.inputs.resolution:
flag, environment, profile, drafter checkpoint, table, fallback), for the served path and the
``--concurrency`` given; one startup line says it, its source and its reason; then mlx_lm.server
runs with ``--draft-model D --num-draft-tokens width-1`` (no draft model for a decline) and every
other argument passed through. blockwidth supervises it: the readiness wait is bounded, a port
in use or a model it cannot load is one line and exit 2, and Ctrl-C (or SIGTERM) stops it.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Sequence

from blockwidth.console import signals
from blockwidth.console.inputs import ExitCode, InputError
from blockwidth.policy.commands import Unprintable, env_words, printable, shell
from blockwidth.policy.text import shown

SERVE_HELP = ("run mlx_lm.server with the resolved width (one startup line says it, its source and "
              "why); other arguments go to mlx_lm.server")


def server_spec(res, target, drafter, server_args: Sequence[str] = ()):
    """The mlx_lm.server process for a resolution (engine.session.served.ServerSpec): the pair, the width
    (no draft model for a decline), the entry's own arguments (what it was measured with), then
    the operator's. ``resolve`` and ``export`` print it, ``serve`` prints and starts it."""
    from blockwidth.engine.session.served import ServerSpec

    w = res.width
    draft = drafter if w is not None and drafter is not None else None
    entry = res.entry
    measured_args = tuple((entry.server or {}).get("args") or ()) if entry is not None and entry.server else ()
    return ServerSpec("serve", target, draft, (*measured_args, *server_args),
                      draft_tokens=None if draft is None else w - 1)


def command_for(res, target, drafter, server_args: Sequence[str] = ()) -> dict[str, Any]:
    """The command line for the path the width was measured on: the engine's environment
    variable, or the mlx_lm.server command that was measured (a served entry's own arguments).
    A folder no printed line can name as written (a newline in it) has no line: ``refusal``
    says why."""
    measured = res.measured_path
    w = res.width
    spec = server_spec(res, target, drafter, server_args)
    line = spec.command_line()
    entry = res.entry
    env = entry.server_env if entry is not None else {}
    # the MLX_* switches it was measured with go before the command, as a shell sets them
    server: dict[str, Any] = {"argv": line, "env": env, "measured": measured == "mlx-lm-server"}
    try:
        printable(target, "the target's folder")
        if drafter is not None:
            printable(drafter, "the drafter's folder")
        server["line"] = shell(line, env)
        server["serve"] = shell(["blockwidth", "serve", "--target", target]
                                + (["--draft", drafter] if drafter is not None else []))
    except Unprintable as e:
        server.update(line=None, serve=None, refusal=f"no command is printed: {e}")
    if entry is not None and (entry.server or {}).get("verify_attention"):
        mode = entry.server["verify_attention"]
        server["verify_attention"] = mode
        server["note"] = (f"measured with blockwidth's verify attention {shell([mode])}: run it as "
                          f"{shell(['blockwidth', 'serve', '--verify-attention', mode])}")
    engine_env = {} if w is None else {"BLOCKWIDTH_DRAFT_BLOCK_SIZE": str(w)}
    engine = {"env": engine_env, "line": env_words(engine_env), "measured": measured == "engine"}
    if drafter is None and w is not None:
        server["note"] = "mlx_lm.server has no prompt-lookup drafter; the width applies to blockwidth's engine"
    if res.auto is not None:
        fixed = (f"it cannot adapt per round: {w} is the auto entry's best fixed width on its curve "
                 f"at pooled acceptance {res.auto.acceptance:.2f}")
        server["note"] = f"mlx_lm.server takes one width for the whole process, so {fixed}"
        engine["note"] = (f"an engine that reads one width (BLOCKWIDTH_DRAFT_BLOCK_SIZE) cannot adapt "
                          f"either: {w} is the entry's best fixed width; blockwidth's engine adapts per "
                          f"round on the entry's curve (sweep --widths auto)")
    path = measured if measured in ("engine", "mlx-lm-server") else res.path
    chosen = server if path == "mlx-lm-server" else engine
    return {"path": path, "measured": chosen["measured"], "line": chosen["line"],
            "engine": engine, "mlx-lm-server": server}


def provenance(res) -> str:
    """The startup line: ``block_size=4, block_size_from=profile: ...`` (the seed's words)."""
    from blockwidth.policy.resolve import label

    w = "classic" if res.width is None else str(res.width)
    head = f"{w} ({label(res.source)}: "
    body = res.reason[len(head):-1] if res.reason.startswith(head) else res.reason
    if res.auto is not None:
        head = res.reason.split(" (", 1)[0] + f" ({label(res.source)}: "
        body = res.reason[len(head):-1] if res.reason.startswith(head) else res.reason
        body = (f"an auto entry; mlx_lm.server takes one width and cannot adapt per round, so it "
                f"gets {w}, the entry's best fixed width at pooled acceptance "
                f"{res.auto.acceptance:.2f}: {body}")
    return f"block_size={w}, block_size_from={label(res.source)} ({body})"


def loopback(host: str) -> bool:
    """Whether ``host`` listens on this machine only: localhost, 127.0.0.0/8, ::1."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def cmd_serve(args: argparse.Namespace) -> int:
    import dataclasses
    import os

    from blockwidth.console.inputs import resolution
    from blockwidth.engine.session.served import READY_TIMEOUT_S, Server, ServedError, check_server_args, port_free
    from blockwidth.policy.drafter import DrafterKind

    # the operator's mlx_lm.server arguments: none that sets what blockwidth sets (the pair, the
    # width, where it listens), nor an abbreviation of one (a ServedError names it)
    rest = list(check_server_args(list(getattr(args, "server_args", []) or []), "serve"))
    host, port = args.host, args.port
    if not loopback(host) and not args.allow_non_loopback:
        raise InputError(f"serve: --host {shown(host)} listens beyond this machine (every interface "
                         f"or a network one); say so with --allow-non-loopback, or leave --host out "
                         f"(127.0.0.1)")
    res, paths, info = resolution(target=args.target, draft=args.draft, kind=args.kind,
                                  flag=args.flag, device=args.device, profile=args.profile,
                                  variant=args.demo_target, route="mlx-lm-server",
                                  concurrency=args.concurrency)
    if paths.drafter is None and info.kind in (DrafterKind.MODEL, DrafterKind.LOOKUP):
        raise InputError("serve needs --draft: mlx_lm.server drafts with a draft model (no prompt "
                         "lookup); blockwidth's engine runs --kind lookup")
    if info.kind is not DrafterKind.MODEL:
        raise InputError(f"serve: mlx_lm.server drafts with a draft model only; --kind "
                         f"{info.kind.value} runs on blockwidth's engine")
    drafter = paths.drafter if res.width is not None else None
    cmd = command_for(res, paths.target, drafter, rest)
    if cmd["mlx-lm-server"]["line"] is None:
        raise InputError(f"serve: {cmd['mlx-lm-server']['refusal']}")
    # The entry's MLX_* switches, as it was measured; a variable the operator set already is
    # theirs, and the startup line says that it differs from what was measured.
    measured_env = cmd["mlx-lm-server"]["env"]
    env = {k: v for k, v in measured_env.items() if k not in os.environ}
    in_effect = {k: os.environ.get(k, v) for k, v in measured_env.items()}
    # one spec: what is printed below is what is started (argv, environment, host and port)
    spec = dataclasses.replace(server_spec(res, paths.target, drafter, rest),
                               verify_attention=args.verify_attention, port=port, host=host,
                               env=tuple(env.items()), exact=args.exact)
    launch = shell(spec.command_line(port), in_effect, "an argument")
    print(f"blockwidth serve: {shown(provenance(res))}", flush=True)
    from blockwidth.console.answer import caution

    said = caution(res, res.measured_path) if drafter is not None else None
    if said:  # an unmeasured speculative server on CUDA: what the one measurement there says
        print(f"blockwidth serve: caution: {said}", file=sys.stderr, flush=True)
    for k, v in measured_env.items():
        if k in os.environ and os.environ[k] != v:
            print(f"blockwidth serve: warning: {shown(k + '=' + os.environ[k])} in this environment; "
                  f"the entry was measured with {k}={v}", file=sys.stderr, flush=True)
    print(f"blockwidth serve: {launch}", file=sys.stderr, flush=True)
    if not port_free(port, host):
        raise InputError(f"serve: port {port} on {shown(host)} is in use: mlx_lm.server cannot listen "
                         f"there; choose another (--port)")
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="blockwidth-serve-")
    server = Server(spec, log_dir, tee=sys.stderr)
    timeout = args.ready_timeout if args.ready_timeout is not None else READY_TIMEOUT_S
    try:
        with signals.as_interrupt():  # SIGTERM and SIGHUP stop the server as Ctrl-C does
            try:
                server.start()
                server.wait_ready(time.monotonic() + timeout)
            except ServedError as e:
                raise e.adding(before="serve: ") from None
            print(f"blockwidth serve: ready at {server.url} (pid {server.pid}, {server.ready_s:.1f} s)",
                  file=sys.stderr, flush=True)
            code = server.proc.wait()
        crash = f"mlx_lm.server exited (code {code}): {server.last_error()}"
        print(f"blockwidth serve: {shown(crash)}", file=sys.stderr)
        return ExitCode.ENVIRONMENT if code else ExitCode.OK  # it crashed: not the input's fault
    except KeyboardInterrupt:
        print("blockwidth serve: stopping mlx_lm.server", file=sys.stderr)
        with signals.shielded():  # a second Ctrl-C or SIGTERM must not orphan the server mid-stop
            server.stop(graceful=True)
        return ExitCode.INTERRUPTED
    finally:
        with signals.shielded():
            server.stop(graceful=True)
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)


def register(sub, resolution_args, pair_args) -> None:
    from blockwidth.console.request import add_verify_attention
    from blockwidth.console.served import _ready_timeout

    p = sub.add_parser("serve", help=SERVE_HELP, allow_abbrev=False,
                       description=SERVE_HELP + ". Any option not listed here is mlx_lm.server's "
                                   "(e.g. --max-tokens 512 --prompt-cache-size 4), passed through; "
                                   "none that sets the pair, the width or where it listens.")
    pair_args(p)
    resolution_args(p)
    p.add_argument("--concurrency", type=_concurrency, default=1, metavar="N",
                   help="the load it will serve: picks the profile entry measured at N concurrent "
                        "requests (else the nearest level below)")
    add_verify_attention(p, served=True)
    p.add_argument("--exact", action="store_true",
                   help="run mlx_lm.server in-process on the exact path: every forward of 1..16 rows "
                        "row-invariant (each verify row computed as MLX's 1-row step; prompts prefilled "
                        "16 rows at a time unless --prefill-step-size is passed), so a speculative "
                        "server answers byte for byte what a classic one answers (CUDA; a no-op route "
                        "on a CPU)")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST",
                   help="where mlx_lm.server listens (default 127.0.0.1); one beyond this machine only "
                        "with --allow-non-loopback")
    p.add_argument("--port", type=_port, default=8080, help="its port (default 8080)")
    p.add_argument("--allow-non-loopback", action="store_true",
                   help="let --host name an address other machines reach (0.0.0.0, a network one)")
    p.add_argument("--ready-timeout", type=_ready_timeout, default=None, metavar="S",
                   help="seconds mlx_lm.server may take to load and answer (default 180)")
    p.set_defaults(func=cmd_serve)
    parse = p.parse_known_args

    def pass_through(arg_strings=None, namespace=None):
        # Everything serve does not know is mlx_lm.server's: kept in order, not an error.
        ns, rest = parse(arg_strings, namespace)
        ns.server_args = list(getattr(ns, "server_args", None) or []) + [a for a in rest if a != "--"]
        return ns, []

    p.parse_known_args = pass_through  # type: ignore[method-assign]


def _port(text: str) -> int:
    from blockwidth.policy.integers import IntegerError, parse_int

    try:
        return parse_int(text, 1, 65535, signed=False)
    except IntegerError as e:
        raise argparse.ArgumentTypeError(f"{e.shown}: a port is 1..65535") from None


def _concurrency(text: str) -> int:
    from blockwidth.console.served import concurrency_levels

    levels = concurrency_levels(text)
    if len(levels) != 1:
        raise argparse.ArgumentTypeError(f"{text!r}: one level (the load served)")
    return levels[0]


def add_resolve_arguments(p: argparse.ArgumentParser) -> None:
    """``resolve --path --concurrency``: which path and load the width is resolved for."""
    p.add_argument("--path", choices=("engine", "mlx-lm-server"), default="engine",
                   help="resolve for blockwidth's engine (default) or for mlx_lm.server (what "
                        "blockwidth serve uses)")
    p.add_argument("--concurrency", type=_concurrency, default=1, metavar="N",
                   help="the load: picks the profile entry measured at N concurrent requests")
