"""``blockwidth export``: this device's profile entries as the configuration other engines take.

Each block names the record it came from and says that the width was measured on MLX (by
blockwidth's engine or through mlx_lm.server): another engine runs other kernels, so the width
is where to start there, not a measurement of it. The option names are the engines' documented
ones: mlx_lm.server ``--num-draft-tokens``; vLLM ``--speculative-config`` with
``num_speculative_tokens`` and, for entries measured at several loads,
``num_speculative_tokens_per_batch_size`` ([start, end, K] ranges); SGLang
``--speculative-num-draft-tokens`` (with ``--speculative-num-steps`` and ``--speculative-eagle-topk
1``, a chain); llama.cpp ``--draft-max``; TensorRT-LLM ``DraftTargetDecodingConfig(max_draft_len,
draft_len_schedule)`` (batch size upper bound to draft length; above the last key it drafts none).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from blockwidth.console.inputs import ExitCode, InputError
from blockwidth.policy.commands import Name, comment, json_text, printable, python_call, shell
from blockwidth.policy.profile import num_draft_tokens

FORMATS = ("mlx-lm", "vllm", "sglang", "llama.cpp", "trtllm")


def _for_device(entry, device) -> bool:
    if entry.backend is not device.backend:
        return False
    if entry.compute_capability and entry.compute_capability != device.compute_capability:
        return False
    return not (entry.device_name and device.name and entry.device_name.lower() != device.name.lower())


def _situation(e) -> tuple:
    return (e.drafter_kind, e.quant_scheme, e.quant_bits, e.quant_group_size, e.pair)


def _record_pair(entry, profile_path: Path) -> tuple[str | None, str | None]:
    """The target and drafter folders the entry's record names (None where it cannot be read)."""
    from blockwidth.policy import files

    rec = (entry.evidence or {}).get("record")
    if not isinstance(rec, str):
        return None, None
    path = Path(rec)
    if not path.is_absolute():
        path = profile_path.parent / path
    try:
        data = files.read_json(path, files.MAX_RECORD_BYTES)
        pair = data.get("pair") or {}
        names = (pair.get("target"), pair.get("drafter"))
    except (files.FileProblem, ValueError, AttributeError):
        return None, None
    return tuple(n if isinstance(n, str) and n else None for n in names)  # type: ignore[return-value]


def _here(path: str | None, placeholder: str, flag: str, out: list[str]) -> str:
    """A folder the record names, where it is a folder on this machine; else the placeholder,
    with a comment naming only the folder's last part: a record keeps the measuring host's
    absolute paths (a helper's worktree, a GPU host's results), which mean nothing here and are
    that host's business."""
    from blockwidth.policy import files
    from blockwidth.policy.text import shown

    if not path:
        return placeholder
    if files.name_problem(path) is None and Path(path).is_dir():  # a record is input: any name
        return path
    out.append(comment(f"{placeholder}: the record's was a folder named {shell([shown(Path(path).name)])} "
                       f"on the machine that measured it (not here); {flag} names yours"))
    return placeholder


def _levels(entries: list) -> list:
    """One situation's entries to export: the served path's where there are any (what a server
    runs), else the engine's; one per concurrency level, lowest first."""
    served = [e for e in entries if e.path == "mlx-lm-server"]
    chosen = served or entries
    by_level = {}
    for e in sorted(chosen, key=lambda e: (e.specificity(), e.measured_at or "")):
        by_level[e.load] = e  # the most specific (then newest) per level
    return [by_level[c] for c in sorted(by_level)]


def _comment(e, lines: list[str]) -> None:
    what = "decline (no width beat classic)" if e.decline else f"width {e.width}"
    where = ("through mlx_lm.server" + (f" {e.server.get('mlx_lm')}" if e.server and e.server.get("mlx_lm") else "")
             if e.path == "mlx-lm-server" else "on blockwidth's engine path")
    rec = (e.evidence or {}).get("record", "no record named")
    lines.append(comment(f"{what} at concurrency {e.load}: measured on MLX {e.mlx or '?'} {where}, "
                         f"{e.measured_at or 'undated'}; record {rec}"))
    if not e.byte_identical:
        lines.append(comment("  output NOT byte-identical to classic there (saved explicitly)"))
    if e.auto is not None:
        lines.append(comment(f"  an auto entry: blockwidth's engine adapts the width per round; this "
                             f"engine takes one, so {e.width} (the entry's best fixed width on its curve "
                             f"at pooled acceptance {e.auto.acceptance:.2f}) and it cannot adapt"))


def _ranges(levels: list) -> list[tuple[int, int, Any]]:
    """Each measured level covers the loads from itself (the first: from 1) up to just below the
    next level; the last covers only its own level (above it nothing was measured)."""
    out = []
    for i, e in enumerate(levels):
        lo = 1 if i == 0 else e.load
        hi = levels[i + 1].load - 1 if i + 1 < len(levels) else e.load
        out.append((lo, hi, e))
    return out


def _k(e) -> int:
    return 0 if e.decline else num_draft_tokens(e.width)


def render(fmt: str, levels: list, target: str, drafter: str) -> list[str]:
    """The configuration block for ``fmt``: comments (policy.commands.comment: one line each) and
    commands whose every value is quoted for its target (policy.commands: a POSIX shell, JSON in
    a shell word, Python literals), so that what a shell or Python reads is the command meant."""
    lines: list[str] = []
    for e in levels:
        _comment(e, lines)
    if fmt != "mlx-lm":
        lines.append(comment("the width was measured on MLX; this engine runs its own kernels and "
                             "batching: start here, then measure it there"))
    elif any(e.path != "mlx-lm-server" for e in levels):
        lines.append(comment("measured on blockwidth's engine (MLX), not through mlx_lm.server, whose "
                             "loop is slower: blockwidth sweep --path mlx-lm-server measures this command"))
    widths = [e for e in levels if not e.decline]
    if fmt == "mlx-lm":
        for e in levels:
            cmd = ["mlx_lm.server", "--model", target]
            if not e.decline:
                cmd += ["--draft-model", drafter, "--num-draft-tokens", str(_k(e))]
            cmd += list((e.server or {}).get("args") or [])  # checked when the profile was read
            if len(levels) > 1:
                lines.append(comment(f"for a load of about {e.load} concurrent requests"))
            # the MLX_* switches it was measured with (they pick the kernels)
            lines.append(shell(cmd, e.server_env))
    elif fmt == "vllm":
        if not widths:
            lines.append(comment("no speculative config: classic won"))
            lines.append(shell(["vllm", "serve", target]))
        else:
            cfg: dict[str, Any] = {"method": "draft_model", "model": drafter,
                                   "num_speculative_tokens": max(_k(e) for e in widths)}
            if len(levels) > 1:
                cfg["num_speculative_tokens_per_batch_size"] = [[lo, hi, _k(e)] for lo, hi, e in _ranges(levels)]
                lines.append(comment(f"per batch size [start, end, K]: each measured load up to the "
                                     f"next; above {levels[-1].load} nothing was measured"))
            lines.append(shell(["vllm", "serve", target, "--speculative-config", json_text(cfg)]))
    elif fmt == "sglang":
        for e in levels:
            if len(levels) > 1:
                lines.append(comment(f"for a load of about {e.load} concurrent requests"))
            cmd = ["python", "-m", "sglang.launch_server", "--model-path", target]
            if not e.decline:
                cmd += ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", drafter,
                        "--speculative-num-steps", str(_k(e)), "--speculative-eagle-topk", "1",
                        "--speculative-num-draft-tokens", str(e.width)]
            lines.append(shell(cmd))
        if widths:
            lines.append(comment("a chain (topk 1): num-draft-tokens counts the verified rows, the "
                                 "width; num-steps the drafted tokens, width - 1"))
    elif fmt == "llama.cpp":
        for e in levels:
            if len(levels) > 1:
                lines.append(comment(f"for a load of about {e.load} concurrent requests"))
            cmd = ["llama-server", "-m", f"{target}.gguf"]
            if not e.decline:
                cmd += ["-md", f"{drafter}.gguf", "--draft-max", str(_k(e))]
            lines.append(shell(cmd))
        if widths:
            lines.append(comment("-m/-md: the GGUF conversions of these checkpoints; --draft-max is the "
                                 "drafted tokens (width - 1); llama.cpp may draft fewer (--draft-min, "
                                 "--draft-p-min)"))
        else:
            lines.append(comment("-m: the GGUF conversion of this checkpoint (a path made from its folder's: "
                                 "convert it with llama.cpp's convert_hf_to_gguf.py); no draft model"))
    elif fmt == "trtllm":
        if not widths:
            lines.append(comment("no speculative_config: classic won"))
            lines += ["from tensorrt_llm import LLM", f"llm = {python_call('LLM', target)}"]
        else:
            kw: dict[str, Any] = {"max_draft_len": max(_k(e) for e in widths), "speculative_model": drafter}
            if len(levels) > 1:
                kw["draft_len_schedule"] = {hi: _k(e) for lo, hi, e in _ranges(levels)}
                lines.append(comment(f"draft_len_schedule: batch size up to each key drafts its value; "
                                     f"above {levels[-1].load} it drafts none (not measured there)"))
            lines += ["from tensorrt_llm import LLM",
                      "from tensorrt_llm.llmapi import DraftTargetDecodingConfig",
                      f"speculative_config = {python_call('DraftTargetDecodingConfig', **kw)}",
                      f"llm = {python_call('LLM', target, speculative_config=Name('speculative_config'))}"]
    return lines


def cmd_export(args: argparse.Namespace) -> int:
    from blockwidth.console.inputs import device_for, load_profile

    prof = load_profile(args.profile)
    device = device_for(args.device)
    mine = [e for e in prof.entries if _for_device(e, device)]
    if not mine:
        raise InputError(f"export: no entry of {len(prof.entries)} in {prof.path} is for this device "
                         f"({device.describe()}); nothing to export")
    groups: dict[tuple, list] = {}
    for e in mine:
        groups.setdefault(_situation(e), []).append(e)
    out = [comment(f"blockwidth export --format {args.format}: {len(mine)} entr{'y' if len(mine) == 1 else 'ies'} "
                   f"of {prof.path} for {device.describe()}")]
    for entries in groups.values():
        levels = _levels(entries)
        first = levels[0]
        t, d = _record_pair(first, prof.path)
        rec = (first.evidence or {}).get("record")
        out.append("")
        out.append(comment(first.describe_keys().split(', served by')[0].split(', concurrency')[0]))
        # a name that a printed command cannot hold as written is refused, naming where it came from
        target = printable(args.target or _here(t, "TARGET", "--target", out),
                           "--target" if args.target else f"the target record {rec} names")
        # a decline's command names no drafter: nothing to say about one
        drafter = printable(args.draft or (_here(d, "DRAFT", "--draft", out) if any(not e.decline for e in levels)
                                           else "DRAFT"),
                            "--draft" if args.draft else f"the drafter record {rec} names")
        if first.drafter_kind.value != "model" and any(not e.decline for e in levels):  # a decline drafts nothing
            out.append(comment(f"drafter kind {first.drafter_kind.value}: the command below assumes a "
                               f"draft model; map it to the engine's own {first.drafter_kind.value} drafter"))
        out += render(args.format, levels, target, drafter)
    print("\n".join(out))
    return ExitCode.OK


def register(sub) -> None:
    p = sub.add_parser("export", help="this device's profile entries as another engine's configuration")
    p.add_argument("--format", choices=FORMATS, required=True)
    p.add_argument("--profile", metavar="FILE", help="profile TOML (default: the user profile)")
    p.add_argument("--device", metavar="SPEC", help="export another device's entries: cuda:9.0, metal, cpu")
    p.add_argument("--target", metavar="T", help="the target to name (default: the entry's record's)")
    p.add_argument("--draft", metavar="D", help="the draft model to name (default: the entry's record's)")
    p.set_defaults(func=cmd_export)
