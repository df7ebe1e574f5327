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
import shlex
import sys
import time
from typing import Any, Sequence

from blockwidth.console.inputs import ExitCode, InputError
from blockwidth.policy.profile import env_words, num_draft_tokens

SERVE_HELP = ("run mlx_lm.server with the resolved width (one startup line says it, its source and "
              "why); other arguments go to mlx_lm.server")


def command_for(res, target, drafter, server_args: Sequence[str] = ()) -> dict[str, Any]:
    """The command line for the path the width was measured on: the engine's environment
    variable, or the mlx_lm.server command that was measured (a served entry's own arguments)."""
    measured = res.measured_path
    w = res.width
    line = ["mlx_lm.server", "--model", str(target)]
    if w is not None and drafter is not None:
        line += ["--draft-model", str(drafter), "--num-draft-tokens", str(num_draft_tokens(w))]
    entry = res.entry
    if entry is not None and entry.server:
        line += list(entry.server.get("args") or [])
    line += list(server_args)
    env = entry.server_env if entry is not None else {}
    # the MLX_* switches it was measured with go before the command, as a shell sets them
    server = {"argv": line, "env": env, "line": " ".join(filter(None, [env_words(env), shlex.join(line)])),
              "measured": measured == "mlx-lm-server",
              "serve": shlex.join(["blockwidth", "serve", "--target", str(target)]
                                  + (["--draft", str(drafter)] if drafter is not None else []))}
    if entry is not None and (entry.server or {}).get("verify_attention"):
        server["verify_attention"] = entry.server["verify_attention"]
        server["note"] = (f"measured with blockwidth's verify attention "
                          f"{entry.server['verify_attention']}: run it as blockwidth serve "
                          f"--verify-attention {entry.server['verify_attention']}")
    engine = {"env": {} if w is None else {"BLOCKWIDTH_DRAFT_BLOCK_SIZE": str(w)},
              "line": "" if w is None else f"BLOCKWIDTH_DRAFT_BLOCK_SIZE={w}",
              "measured": measured == "engine"}
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


def _split_serve_args(argv: list[str]) -> tuple[str, int, list[str]]:
    """The host and port mlx_lm.server will listen on, and the other pass-through arguments."""
    host, port, rest = "127.0.0.1", 8080, []
    i = 0
    while i < len(argv):
        a = argv[i]
        name, eq, val = a.partition("=")
        if name in ("--host", "--port"):
            if not eq:
                if i + 1 >= len(argv):
                    raise InputError(f"serve: {name} needs a value")
                val = argv[i + 1]
                i += 1
            if name == "--host":
                host = val
            else:
                if not val.isascii() or not val.isdigit() or not 1 <= int(val) <= 65535:
                    raise InputError(f"serve: --port {val!r}: a port is 1..65535")
                port = int(val)
        else:
            rest.append(a)
        i += 1
    return host, port, rest


def cmd_serve(args: argparse.Namespace) -> int:
    from blockwidth.console.inputs import resolution
    from blockwidth.engine.session.served import READY_TIMEOUT_S, Server, ServedError, ServerSpec, check_server_args, port_free
    from blockwidth.policy.drafter import DrafterKind

    extra = list(getattr(args, "server_args", []) or [])
    host, port, rest = _split_serve_args(extra)
    rest = list(check_server_args(rest, "serve"))  # a ServedError names what is wrong
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
    # The entry's MLX_* switches, as it was measured; a variable the operator set already is
    # theirs, and the startup line says that it differs from what was measured.
    import os

    measured_env = cmd["mlx-lm-server"]["env"]
    env = {k: v for k, v in measured_env.items() if k not in os.environ}
    spec = ServerSpec("serve", paths.target, drafter,
                      tuple(rest) + (("--num-draft-tokens", str(num_draft_tokens(res.width))) if drafter else ()),
                      args.verify_attention, port, host, tuple(env.items()), exact=args.exact)
    print(f"blockwidth serve: {provenance(res)}", flush=True)
    from blockwidth.console.answer import caution

    said = caution(res, res.measured_path) if drafter is not None else None
    if said:  # an unmeasured speculative server on CUDA: what the one measurement there says
        print(f"blockwidth serve: caution: {said}", file=sys.stderr, flush=True)
    for k, v in measured_env.items():
        if k in os.environ and os.environ[k] != v:
            print(f"blockwidth serve: warning: {k}={shlex.quote(os.environ[k])} in this environment; the "
                  f"entry was measured with {k}={v}", file=sys.stderr, flush=True)
    print(f"blockwidth serve: {cmd['mlx-lm-server']['line']} --host {host} --port {port}"
          + ("" if spec.dispatcher is None else
             f"  (in-process, verify attention {spec.dispatcher}"
             + (", exact path" if args.exact else "") + ")"), file=sys.stderr, flush=True)
    if not port_free(port, host):
        raise InputError(f"serve: port {port} on {host} is in use: mlx_lm.server cannot listen there; "
                         f"choose another (--port)")
    import tempfile

    log_dir = tempfile.mkdtemp(prefix="blockwidth-serve-")
    server = Server(spec, log_dir, tee=sys.stderr)
    timeout = args.ready_timeout if args.ready_timeout is not None else READY_TIMEOUT_S
    try:
        with _interruptible():
            try:
                server.start()
                server.wait_ready(time.monotonic() + timeout)
            except ServedError as e:
                raise e.adding(before="serve: ") from None
            print(f"blockwidth serve: ready at {server.url} (pid {server.pid}, {server.ready_s:.1f} s)",
                  file=sys.stderr, flush=True)
            code = server.proc.wait()
        crash = f"mlx_lm.server exited (code {code}): {server.last_error()}"
        print(f"blockwidth serve: {crash}", file=sys.stderr)
        return ExitCode.ENVIRONMENT if code else ExitCode.OK  # it crashed: not the input's fault
    except KeyboardInterrupt:
        print("blockwidth serve: stopping mlx_lm.server", file=sys.stderr)
        with _shielded():  # a second Ctrl-C or SIGTERM must not orphan the server mid-stop
            server.stop(graceful=True)
        return ExitCode.INTERRUPTED
    finally:
        with _shielded():
            server.stop(graceful=True)
        import shutil

        shutil.rmtree(log_dir, ignore_errors=True)


class _signals:
    """``handler`` for ``sigs`` inside the block (the main thread's alone: only it may set
    them), the old handlers back after it."""

    def __init__(self, handler, *sigs) -> None:
        self.handler, self.sigs, self.old = handler, sigs, {}

    def __enter__(self):
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in self.sigs:
                self.old[sig] = signal.signal(sig, self.handler)
        return self

    def __exit__(self, *exc):
        import signal

        for sig, h in self.old.items():
            signal.signal(sig, h)
        return False


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _interruptible() -> _signals:
    """SIGTERM and SIGHUP to blockwidth serve stop the server as Ctrl-C does."""
    import signal

    return _signals(_raise_interrupt, signal.SIGTERM, signal.SIGHUP)


def _shielded() -> _signals:
    """SIGINT, SIGTERM and SIGHUP ignored while the server stops (bounded: stop's own timeout,
    then a kill): outside _interruptible a second signal would end blockwidth at once and
    leave mlx_lm.server, in its own session, running with nobody to stop it."""
    import signal

    return _signals(signal.SIG_IGN, signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def register(sub, resolution_args, pair_args) -> None:
    from blockwidth.console.request import add_verify_attention
    from blockwidth.console.served import _ready_timeout

    p = sub.add_parser("serve", help=SERVE_HELP, allow_abbrev=False,
                       description=SERVE_HELP + ". Any option not listed here is mlx_lm.server's "
                                   "(e.g. --port 8080 --max-tokens 512), passed through.")
    pair_args(p)
    resolution_args(p)
    p.add_argument("--concurrency", type=_concurrency, default=1, metavar="N",
                   help="the load it will serve: picks the profile entry measured at N concurrent "
                        "requests (else the nearest level below)")
    add_verify_attention(p, served=True)
    p.add_argument("--exact", action="store_true",
                   help="run mlx_lm.server in-process on the exact path: every forward of 1..16 rows "
                        "on row-invariant kernels, so a speculative server answers byte for byte what "
                        "a classic one answers (CUDA; a no-op route on a CPU)")
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
