"""The ``blockwidth`` command line: headless subcommands, each with ``--json``.

Data goes to stdout, diagnostics to stderr; expected failures are one line and
exit code 2, never a traceback. Nothing here imports Textual.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

from console.inputs import ExitCode, InputError, chain_lines, resolution
from policy.profile import MAX_WIDTH, MIN_WIDTH, ProfileError
from policy.resolve import WidthError

KINDS = ("model", "lookup", "dflash", "mtp", "eagle")


def _emit(data: dict[str, Any], as_json: bool, text: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=False))
    else:
        print(text(data))


def _pair_args(p: argparse.ArgumentParser, draft_required: bool = False) -> None:
    p.add_argument("--target", metavar="T", help="target checkpoint folder (default: the demo pair)")
    p.add_argument("--draft", metavar="D", required=draft_required,
                   help="drafter checkpoint folder (none: the model-free lookup drafter)")
    p.add_argument("--kind", choices=KINDS, help="drafter kind; wins over detection")
    p.add_argument("--demo-target", choices=("bf16", "4bit"), default="bf16",
                   help="which demo target when --target is not given (default bf16)")


def _resolution_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft-block-size", metavar="N", dest="flag",
                   help=f"operator override: the width, {MIN_WIDTH}..{MAX_WIDTH}")
    p.add_argument("--device", metavar="SPEC",
                   help="resolve for another device: cuda:9.0, cuda:12.1, metal, cpu")
    p.add_argument("--profile", metavar="FILE", help="profile TOML (default: the user profile)")


def cmd_resolve(args: argparse.Namespace) -> int:
    res, paths, info = resolution(target=args.target, draft=args.draft, kind=args.kind,
                                  flag=args.flag, device=args.device, profile=args.profile,
                                  variant=args.demo_target)
    data = res.to_dict()
    data["target"] = str(paths.target)
    data["drafter"] = str(paths.drafter) if paths.drafter else None
    data["drafter_detail"] = info.detail

    def text(d: dict[str, Any]) -> str:
        width = d["width"] if d["width"] is not None else "classic (no speculation)"
        lines = [
            f"width {width}   source {d['source']}{'   STALE' if d['stale'] else ''}",
            f"  reason   {d['reason']}",
            f"  device   {res.device.describe()}"
            + ("" if res.device.probed else " (named, not probed)"),
            f"  target   {d['target']}  [{res.quantization.describe()}]",
            f"  drafter  {d['drafter'] or '(none)'}  [{d['drafter_kind']}: {info.detail}]",
            "  chain:",
            *chain_lines(res.chain),
        ]
        return "\n".join(lines)

    _emit(data, args.json, text)
    return ExitCode.OK


def cmd_inspect(args: argparse.Namespace) -> int:
    from console.inputs import checkpoint_dir
    from engine.checkpoint import CheckpointError, parameter_count
    from policy.drafter import DrafterKind, detect_drafter
    from policy.quantization import ConfigError, classify, read_config, read_sidecar

    path = checkpoint_dir(args.path, "inspect")
    try:
        config = read_config(path)
    except ConfigError as e:
        raise InputError(str(e)) from None
    quant = classify(config, read_sidecar(path))
    info = detect_drafter(config)
    try:
        params = parameter_count(path, quant.bits)
        params_note = None
    except CheckpointError as e:
        params, params_note = None, str(e)
    archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    arch_words = [a if isinstance(a, str) else json.dumps(a) for a in archs]  # [1, null] is not text
    looks = (info.kind is not DrafterKind.MODEL or info.declared_width is not None
             or "draft" in path.name.lower())
    data = {
        "path": str(path),
        "model_type": config.get("model_type"),
        "architectures": archs,
        "parameters": params,
        "quantization": quant.to_dict(),
        "dtype": quant.dtype,
        "looks_like_drafter": looks,
        "drafter_kind": info.kind.value,
        "declared_width": info.declared_width,
        "drafter_detail": info.detail,
        "vocab_size": config.get("vocab_size"),
    }
    if params_note:
        data["parameters_note"] = params_note

    def text(d: dict[str, Any]) -> str:
        p = f"{d['parameters'] / 1e6:.2f}M" if d["parameters"] else "unknown"
        return "\n".join([
            f"{d['path']}",
            f"  model        {d['model_type']} {', '.join(arch_words)}",
            f"  parameters   {p}" + (f" ({params_note})" if params_note else ""),
            f"  quantization {quant.describe()}  ({quant.detail})",
            f"  dtype        {d['dtype']}",
            f"  drafter?     {'yes' if looks else 'no'}: {d['drafter_kind']} ({d['drafter_detail']})",
            f"  declared     {d['declared_width'] if d['declared_width'] else 'no width'}",
        ])

    _emit(data, args.json, text)
    return ExitCode.OK


def _console(args: argparse.Namespace) -> int:
    """The Textual console. Bad input is checked first, so it fails like the headless commands."""
    from console.inputs import resolution

    resolution(target=args.target, draft=args.draft, kind=args.kind, flag=args.flag,
               device=args.device, profile=args.profile, variant=args.demo_target,
               profile_missing_ok=True)
    from console.app import Options, run_app  # Textual loads only here

    return run_app(Options(target=args.target, draft=args.draft, kind=args.kind, flag=args.flag,
                           device=args.device, profile=args.profile, variant=args.demo_target,
                           record_dir=args.record_dir))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="blockwidth",
        description="Operator console for the draft block width of speculative decoding on MLX. "
                    "With no COMMAND it opens the console (on the demo pair unless --target).",
    )
    _pair_args(ap)
    _resolution_args(ap)
    ap.add_argument("--record-dir", help="where A/B session records go (default: user data dir)")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("resolve", help="the width this pair would use, its source and why")
    _pair_args(p)
    _resolution_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_resolve)

    p = sub.add_parser("inspect", help="what a checkpoint folder is: model, quantization, drafter")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)

    from console import measure  # engine-backed: sweep, costcurve (MLX loads only when they run)

    measure.register(sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        if not getattr(args, "func", None):
            return _console(args)
        return int(args.func(args))
    except (InputError, WidthError, ProfileError) as e:
        for line in str(e).splitlines():
            print(f"blockwidth: error: {line}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        print("blockwidth: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
