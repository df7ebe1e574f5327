"""The ``blockwidth`` command line: headless subcommands, each with ``--json``.

Data goes to stdout, diagnostics to stderr; expected failures are one line and
exit code 2, never a traceback. Nothing here imports Textual.
"""

from __future__ import annotations

import os
import signal
import sys

from blockwidth.policy.errors import ExitCode  # light: no MLX, no Textual


def _interrupted_while_starting(signum: int, frame: object) -> None:
    # Ctrl-C while the imports below run would print a traceback from inside some library;
    # main() puts the ordinary handler back once it is running.
    sys.stderr.write("blockwidth: interrupted\n")
    os._exit(ExitCode.INTERRUPTED)


_ARGV0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
# the console script, or `python -m blockwidth` (whose argv[0] is the package's __main__.py)
_PROGRAM = __name__ == "__main__" or os.path.basename(_ARGV0) == "blockwidth" \
    or _ARGV0.endswith("blockwidth/__main__.py")
if _PROGRAM and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_starting)

import argparse  # noqa: E402
import json  # noqa: E402
from typing import Any, Callable, Mapping, NoReturn, Sequence  # noqa: E402

from blockwidth.console import check  # noqa: E402
from blockwidth.console.inputs import CLI_NAMES, chain_lines, resolution  # noqa: E402
from blockwidth.policy import files  # noqa: E402
from blockwidth.policy.errors import BlockwidthError  # noqa: E402
from blockwidth.policy.profile import MAX_WIDTH, MIN_WIDTH  # noqa: E402
from blockwidth.policy.text import error_line, error_lines, shown  # noqa: E402

from blockwidth.console.request import KINDS, add_pair_args, add_verify_attention, integer, seconds  # noqa: E402,F401 (one home: request.py)

_pair_args = add_pair_args


class Parser(argparse.ArgumentParser):
    """argparse that fails in one line, exit 2 (the usage block is what --help is for), and
    keeps what it declares: ``declared`` maps each option's dest to the Action that add_argument
    returned, so the CLI can tell which options a command takes without argparse's private lists."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.declared: dict[str, argparse.Action] = {}
        # no prefixes: `--width 2,3` read as --widths, which sweeps a list, not one width pinned
        # (a tryout's); a typo is refused with the option it is nearest instead
        kw.setdefault("allow_abbrev", False)
        super().__init__(*args, **kw)

    def add_argument(self, *args: Any, **kw: Any) -> argparse.Action:
        action = super().add_argument(*args, **kw)
        if action.option_strings and action.dest != "help":
            self.declared[action.dest] = action
        return action

    def error(self, message: str) -> NoReturn:
        # argparse quotes the argument it refused, as typed: shown and bounded like any error
        self.exit(ExitCode.USAGE, f"blockwidth: error: {error_line(' '.join(message.split()))} "
                                  f"(see {self.prog} --help)\n")


def _did_you_mean(typed: Sequence[str], options: set[str]) -> str:
    """"; did you mean --x?" for the long options among ``typed`` nearest one of ``options``
    (difflib, as Python's own suggestion), or nothing."""
    import difflib

    known = sorted(o for o in options if o.startswith("--"))
    near = [m for x in typed if x.startswith("--")
            for m in difflib.get_close_matches(x.split("=", 1)[0], known, n=1, cutoff=0.75)]
    return f"; did you mean {', '.join(dict.fromkeys(near))}?" if near else ""


_BEFORE = "before:"  # dest prefix of an option given before the subcommand


class TopParser(Parser):
    """The top-level parser. Its options (the console's, which the subcommands share) land in
    dests of their own, and only when given, so that ``apply_before`` can honour them for the
    subcommand or refuse them, never drop them: argparse would let a subcommand's defaults
    overwrite them. The console (no subcommand) reads them under their plain names."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.plain: dict[str, Any] = {}  # plain dest -> default
        self.flags: dict[str, str] = {}  # plain dest -> the flag that names it in a message
        self.commands: Mapping[str, Parser] = {}
        super().__init__(*args, **kw)

    def add_argument(self, *args: Any, **kw: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and kw.get("action") not in ("help", "version"):
            dest = kw.get("dest") or next((a for a in args if a.startswith("--")), args[0]).lstrip("-").replace("-", "_")
            self.plain[dest], self.flags[dest] = kw.get("default"), args[-1]
            if "metavar" not in kw and "choices" not in kw and kw.get("action") not in ("store_true", "store_false"):
                kw["metavar"] = dest.upper()  # --help shows RECORD_DIR, not the internal dest
            kw.update(dest=_BEFORE + dest, default=argparse.SUPPRESS)
        return super().add_argument(*args, **kw)

    def add_commands(self) -> Any:
        sub = self.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
        self.commands = sub.choices  # name -> parser, filled as commands are added
        self.set_defaults(**self.plain)
        return sub

    def apply_before(self, args: argparse.Namespace) -> None:
        before = {k[len(_BEFORE):]: v for k, v in vars(args).items() if k.startswith(_BEFORE)}
        for name in before:
            delattr(args, _BEFORE + name)
        command = getattr(args, "command", None)
        accepted = self.commands[command].declared if command else {}
        for name, value in before.items():
            flag = self.flags[name]
            if command is None:
                setattr(args, name, value)
            elif name not in accepted:
                self.error(f"{flag} given before '{command}', which does not take it")
            elif getattr(args, name) not in (accepted[name].default, value):
                self.error(f"{flag} given both before and after '{command}', with different values")
            else:
                setattr(args, name, value)

    def misplaced(self, argv: list[str]) -> None:
        """A subcommand's own option before the subcommand (``blockwidth -n 1 sweep``) reads to
        argparse as an unknown option and a bad COMMAND; say what it is and where it goes."""
        top = {o for a in self.declared.values() for o in a.option_strings} | {"-h", "--help"}
        for tok in argv:
            if tok in self.commands:
                return  # options after the subcommand are the subcommand's to judge
            if not tok.startswith("-") or tok == "--":
                continue
            name = tok.split("=", 1)[0]
            if name in top:
                continue
            owners = [n for n, p in self.commands.items()
                      if any(name in a.option_strings for a in p.declared.values())]
            if owners:
                self.error(f"{name} is an option of {' and '.join(owners)}: put it after the command, "
                           f"e.g. blockwidth {owners[0]} {name} ...")
            # no command takes it: argparse would take the next word for the COMMAND and say
            # "invalid choice: 'x'" (`--profil x`); name the option and the one it is nearest
            self.error(f"unrecognized arguments: {name}{_did_you_mean([name], top)}")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        # argparse reports a subcommand's unknown options from the top parser, pointing at
        # `blockwidth --help`, which lists no subcommand's options: name the command's own help
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            cmd = self.commands.get(getattr(ns, "command", None) or "")
            where = cmd if cmd is not None else self
            hint = ""
            if getattr(ns, "command", None) == "inspect" and {"--target", "--draft"} & set(extras):
                # the other commands take a pair; inspect takes one folder
                hint = "; inspect takes one checkpoint folder: blockwidth inspect PATH"
            else:
                hint = _did_you_mean(extras, {o for a in where.declared.values() for o in a.option_strings})
            where.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return ns

    def check_alias(self, argv: list[str]) -> list[str]:
        """``--check`` is the check command's alias (CI scripts and the design card name it):
        ``blockwidth --check ...`` reads as ``blockwidth check ...``, every option its own. A
        COMMAND beside it is refused, never one of the two dropped."""
        end = argv.index("--") if "--" in argv else len(argv)
        if "--check" not in argv[:end]:
            return argv
        rest = [a for i, a in enumerate(argv) if not (a == "--check" and i < end)]
        check = self.commands["check"]
        takes_value = {o for a in check.declared.values() if a.nargs != 0 for o in a.option_strings}
        skip = False
        for tok in rest[:end]:
            if skip:
                skip = False
            elif tok in takes_value:
                skip = True
            elif tok in self.commands:
                self.error(f"--check is the check command's alias: it takes no other COMMAND (got {tok!r})")
        return ["check", *rest]


def _emit(data: dict[str, Any], as_json: bool, text: Callable[[dict[str, Any]], list[str]]) -> None:
    """JSON (which escapes every control character itself), or the text's lines, each shown as
    one line: a name from a checkpoint's files never reaches the terminal raw."""
    if as_json:
        print(files.dumps_json(data, indent=2, sort_keys=False))
    else:
        for line in text(data):
            print(shown(line))


def _resolution_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-block-size", metavar="N", dest="flag",
                   help=f"operator override: the width, {MIN_WIDTH}..{MAX_WIDTH}")
    p.add_argument("--device", metavar="SPEC",
                   help="resolve for another device: cuda:9.0, cuda:12.1, metal, cpu; for a "
                        "sharded target's group add @BACKEND:RANKS:SHARDING (cuda:9.0@nccl:2:tensor)")
    p.add_argument("--profile", metavar="FILE", help="profile TOML (default: the user profile)")


def cmd_resolve(args: argparse.Namespace) -> int:
    from blockwidth.console.serve import command_for

    # a named profile not there yet resolves as the console does ("is not present: nothing
    # measured", in the chain), the file `sweep --save` would create; serve and check still
    # refuse one, where a mistyped path would serve or pass on what nobody measured
    res, paths, info = resolution(target=args.target, draft=args.draft, kind=args.kind,
                                  flag=args.flag, device=args.device, profile=args.profile,
                                  variant=args.demo_target, route=args.path,
                                  concurrency=args.concurrency, profile_missing_ok=True)
    from blockwidth.console.answer import answer

    said = answer(res, paths)
    data = res.to_dict()
    data["target"] = str(paths.target)
    data["drafter"] = str(paths.drafter) if paths.drafter else None
    data["drafter_detail"] = info.detail
    data["num_draft_tokens"] = said.num_draft_tokens
    data["serve_command"] = said.command
    data["answer"] = said.to_dict()
    # the command for each path, as blockwidth serve and export read it (docs/served.md)
    data["command"] = command_for(res, paths.target, paths.drafter)
    refused = _caches_refused(paths.target)
    data["caches_refused"] = refused
    if refused and not args.json:
        # the width is the policy's; the engine would refuse this target at load
        print(f"blockwidth: warning: the engine refuses this target at load: {shown(refused)}",
              file=sys.stderr)

    def text(d: dict[str, Any]) -> list[str]:
        width = d["width"] if d["width"] is not None else "classic (no speculation)"
        if d.get("auto"):
            width = f"auto (fixed {d['width']} where the width cannot adapt)"
        note = d["command"]["engine" if d["command"]["path"] == "engine" else "mlx-lm-server"].get("note")
        lines = [
            f"width {width}   source {d['source']}{'   STALE' if d['stale'] else ''}",
            f"  reason   {d['reason']}",
            f"  device   {res.device.describe()}"
            + ("" if res.device.probed else " (named, not probed)"),
            f"  target   {d['target']}  [{res.quantization.describe()}]",
            f"  drafter  {d['drafter'] or '(none)'}  [{d['drafter_kind']}: {info.detail}]",
            # the answer (console.answer): the width, whether anything measured it and on which
            # path, and the mlx_lm.server command, or why there is none
            f"  answer   {said.head()}",
            f"  serve    {said.command or 'no mlx_lm.server command: ' + str(said.refusal)}",
            *([f"  caution  {said.caution}"] if said.caution else []),
            # an auto entry: what the server gets instead (it cannot adapt per round)
            *([f"           {note}"] if note and d.get("auto") else []),
            "  chain:",
            *chain_lines(res.chain),
        ]
        return lines

    _emit(data, args.json, text)
    return ExitCode.OK


def _caches_refused(target) -> str | None:
    """Why the engine would refuse ``target``'s caches at load (engine.kvcache.plan_config on its
    config.json: the model is built with its weights unevaluated), or None."""
    from blockwidth.policy.config import ConfigError, read_config

    try:
        config = read_config(target)
    except ConfigError:
        return None  # the resolution above has read it already; nothing more to say here
    from blockwidth.engine.kvcache import CacheKindError, plan_config

    try:
        plan_config(config)
    except CacheKindError as e:
        return str(e)
    return None


def cmd_inspect(args: argparse.Namespace) -> int:
    from blockwidth.console.inputs import checkpoint_dir
    from blockwidth.engine.checkpoint import CheckpointError, module_bits, parameter_count, tensor_dtypes
    from blockwidth.policy.config import size
    from blockwidth.policy.drafter import DrafterKind, detect_drafter
    from blockwidth.policy.config import ConfigError, names_no_model, read_config, read_sidecar
    from blockwidth.policy.quantization import classify

    path = checkpoint_dir(args.path, "inspect")
    try:
        config = read_config(path)
        sidecar = read_sidecar(path)
        empty = names_no_model(path, config)
        if empty:
            raise empty
    except ConfigError as e:
        # named after what was typed before the path, as resolve's --target and sweep's are
        raise e.about("inspect") from None
    quant = classify(config, sidecar)
    info = detect_drafter(config)
    try:
        params = parameter_count(path, quant.bits, module_bits(config))
        dtypes = tensor_dtypes(path)
        # a config alone answers what it says, but is no checkpoint: sweep and the console refuse it
        params_note = None if params is not None else "no *.safetensors weights: not loadable"
    except CheckpointError as e:
        params, params_note, dtypes = None, str(e), {"weights": None, "scales": None}
    config_dtype = quant.dtype
    quant = quant.with_tensors(dtypes["weights"])  # a float32 copy is not its config's bfloat16
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    arch_words = [a if isinstance(a, str) else json.dumps(a) for a in archs]  # [1, null] is not text
    # From the checkpoint alone: a folder's name ("draft") does not make a model a drafter, and a
    # copy of one under another name must get the same answer.
    looks = info.kind is not DrafterKind.MODEL or info.declared_width is not None
    data = {
        "path": str(path),
        "model_type": config.get("model_type"),
        "architectures": archs,
        "parameters": params,
        "quantization": quant.to_dict(),
        # the tensors' dtype (config.json's where no tensor says), the scales', and what the config says
        "dtype": dtypes["weights"] or quant.dtype,
        "scales_dtype": dtypes["scales"],
        "config_dtype": config_dtype,
        "looks_like_drafter": looks,
        "drafter_kind": info.kind.value,
        "declared_width": info.declared_width,
        "drafter_detail": info.detail,
        "target_layers": list(info.target_layers) if info.target_layers else None,
        "reads": info.needs(),
        "mtp_layers": next((size(config, k) for k in ("num_nextn_predict_layers", "mtp_num_hidden_layers")
                            if isinstance(size(config, k), int)), None),
        "vocab_size": size(config, "vocab_size"),
    }
    if params_note:
        data["parameters_note"] = params_note
    caches_line = None
    if info.kind in (DrafterKind.MODEL, DrafterKind.LOOKUP):  # an mlx-lm model, not a head
        from blockwidth.engine.kvcache import CacheKindError, DEFAULT_METHOD, plan_config

        try:
            plan = plan_config(config)
            data["caches"] = plan.summary()
            data["sliding_window"] = plan.window
            data["rollback"] = DEFAULT_METHOD.value if plan.recurrent else "trim"
            caches_line = plan.describe() + (f" (recurrent state: {DEFAULT_METHOD.value})"
                                             if plan.recurrent else "")
        except CacheKindError as e:
            data["caches"] = None
            data["caches_refused"] = str(e)
            caches_line = f"refused for speculative decoding: {e}"

    def text(d: dict[str, Any]) -> list[str]:
        p = f"{d['parameters'] / 1e6:.2f}M" if d["parameters"] else "unknown"
        return [
            f"{d['path']}",
            f"  model        {d['model_type'] or '(no model_type)'} {', '.join(arch_words)}",
            f"  parameters   {p}" + (f" ({params_note})" if params_note else ""),
            f"  quantization {quant.describe()}  ({quant.detail})",
            f"  dtype        {d['dtype']}" + (f" (config.json says {d['config_dtype']})"
                                                  if d["config_dtype"] and d["config_dtype"] != d["dtype"] else ""),
        ] + ([f"  scales       {d['scales_dtype']}"] if d["scales_dtype"] else []) + [
            (f"  drafter?     yes: {d['drafter_kind']} ({d['drafter_detail']})" if looks else
             f"  drafter?     usable as kind {d['drafter_kind']} ({d['drafter_detail']}); "
             f"nothing in it declares a drafter"),
            f"  declared     {d['declared_width'] if d['declared_width'] else 'no width'}",
            f"  reads        {d['reads']}",
        ] + ([f"  caches       {caches_line}"] if caches_line else []) + (
            [f"  MTP layers   {d['mtp_layers']} (usable with --kind mtp and no --draft)"]
            if d["mtp_layers"] and info.kind is not DrafterKind.MTP else [])

    _emit(data, args.json, text)
    return ExitCode.OK


def _console(args: argparse.Namespace) -> int:
    """The Textual console. Bad input is checked first, so it fails like the headless commands."""
    from blockwidth.console.inputs import pair_paths, resolution

    # A hub id is fetched here, with progress on the terminal, before the console takes it over.
    pair_paths(args.target, args.draft, args.demo_target, args.kind, weights=True)
    # (resolution refuses a kind the drafter given cannot run with, as sweep does)
    resolution(target=args.target, draft=args.draft, kind=args.kind, flag=args.flag,
               device=args.device, profile=args.profile, variant=args.demo_target,
               profile_missing_ok=True)
    from blockwidth.console.session import record_dir

    record_dir(args.record_dir)  # where sessions will be written: checked before it opens
    from blockwidth.console.app import Options, run_app  # Textual loads only here

    return run_app(Options(target=args.target, draft=args.draft, kind=args.kind, flag=args.flag,
                           device=args.device, profile=args.profile, variant=args.demo_target,
                           record_dir=args.record_dir, verify_attention=args.verify_attention))


def build_parser() -> TopParser:
    ap = TopParser(
        prog="blockwidth",
        description="Operator console for the draft block width of speculative decoding on MLX. "
                    "With no COMMAND it opens the console (on the demo pair unless --target).",
    )
    from blockwidth import __version__

    ap.add_argument("--version", action="version", version=f"blockwidth {__version__}")
    _pair_args(ap)
    _resolution_args(ap)
    ap.add_argument("--record-dir", help="where A/B session records go (default: user data dir)")
    add_verify_attention(ap)
    sub = ap.add_commands()

    p = sub.add_parser("resolve", help="the width this pair would use, its source and why")
    _pair_args(p)
    _resolution_args(p)
    from blockwidth.console import serve

    serve.add_resolve_arguments(p)
    p.add_argument("--json", action="store_true", help="the resolution as one JSON document on stdout")
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("inspect", help="what a checkpoint folder is: model, quantization, drafter")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="what it found as one JSON document on stdout")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("check", help="CI: is the profile still true for this runner? (alias: --check)")
    _pair_args(p)
    _resolution_args(p)
    p.add_argument("--record-dir", help="with --measure: where its session records go")
    add_verify_attention(p)
    check.add_arguments(p)
    p.set_defaults(func=check.run)

    from blockwidth.console import measure  # engine-backed: sweep, costcurve (MLX loads only when they run)

    measure.register(sub)
    serve.register(sub, _resolution_args, _pair_args)
    from blockwidth.console import export

    export.register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    if signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from blockwidth.console import outputs

    outputs.forget_kept()
    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        ap = build_parser()
        argv = ap.check_alias(argv)
        ap.misplaced(argv)
        args = ap.parse_args(argv)
        # how a group's launcher (console.distributed) starts each rank: this command again
        args.rank_command = [sys.executable, "-m", "blockwidth", *argv]
        ap.apply_before(args)
        if getattr(args, "func", None):
            outputs.guard_stdout()  # headless: a stdout that fails is named, not a traceback
        if not getattr(args, "func", None):
            return _console(args)
        code = int(args.func(args))
        sys.stdout.flush()  # here, where a failure can still be said in one line
        return code
    except outputs.StreamError as e:
        return outputs.stdout_failed(e)
    except BlockwidthError as e:  # each says its exit code (a held profile lock: 1, a failed check)
        _say(e)
        return e.exit_code
    except KeyboardInterrupt:
        print("blockwidth: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:  # `blockwidth ... | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.BROKEN_PIPE
    finally:
        outputs.unguard_stdout()


def _say(e: BaseException) -> None:
    """An expected failure: its line (or its located lines), each shown as one line."""
    for line in error_lines(e, CLI_NAMES):
        print(f"blockwidth: error: {line}", file=sys.stderr)


def entry() -> None:
    """The ``blockwidth`` command: ``main``, then the exit. After MLX ran in a worker thread
    (the console's sessions, a measurement Ctrl-C can stop), MLX 0.32's C++ teardown at exit
    aborts now and then ("terminate called without an active exception", ml-explore/mlx#3126),
    turning a finished command's exit code into 134: everything is written and flushed by
    then, so the process leaves without running that teardown."""
    code = main()
    from blockwidth.console.inputs import mlx_ran_in_thread

    if mlx_ran_in_thread():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
