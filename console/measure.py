"""Engine-backed headless commands: ``sweep`` (an A/B session) and ``costcurve``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

from engine import attention, linear
from console.inputs import ExitCode, InputError, mlx_version, pair_paths, user_path
from console.render import arm_rows, arm_table, bars, ratio_rows, request_table, speedup_lines
from console.request import (add_pair_args, add_verify_attention, add_verify_linear, integer, read_prompt,
                             seconds, session_request)
from console import distributed
from console.save import save_session
from policy import bounds


def record_dir(value: str | None) -> Path:
    """The record directory, checked before any model loads: it exists (or is created) and a
    file can be written in it. Raises InputError naming it."""
    import tempfile

    from console import records

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


def profile_for_save(value: str | None):
    """The profile a --save will write, validated before any model loads."""
    from console import profile_file

    profile_file.check_writable(user_path(value, "profile"))


def _memory_bytes() -> int | None:
    """What the device can hold: its own memory where MLX reports it, else physical RAM."""
    from engine.device import probe

    mem = probe().memory_bytes
    if mem:
        return mem
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _context_bound(pair, what: str, tokens: int, detail: str) -> None:
    """Refuse a run the target cannot take (its context) or the machine cannot hold
    (policy.bounds); the device's memory is probed only when the config says enough."""
    why = bounds.context_problem(pair.context_length, tokens)
    need = bounds.memory_need(pair.target_config, tokens) if why is None else None
    if need is not None:
        why = bounds.memory_problem(need, _memory_bytes())
    if why:
        raise InputError(f"{what}: {detail} = {tokens} tokens {why}")


def _load(target: str | None, draft: str | None, kind: str | None, variant: str):
    if distributed.active():  # a rank of a sharded target's group
        return distributed.load(target, draft, kind, variant)
    paths = pair_paths(target, draft, variant, kind, weights=True)  # a hub id: weights too
    from engine.pair import load_pair

    return load_pair(paths.target, paths.drafter, kind)


def read_workload(value: str | None, prompt: str | None, prompt_file: str | None):
    """``--workload`` (a file or a built-in's name), read and checked before any model loads;
    None without it. Refused beside --prompt or --prompt-file."""
    if value is None:
        return None
    from policy.workload import read

    if prompt is not None or prompt_file is not None:
        raise InputError(f"give --workload or {'--prompt' if prompt is not None else '--prompt-file'}, not both")
    return read(value)  # a WorkloadError is one line naming where and what


def prepare_workload(pair, workload, max_tokens: int, widths: tuple[int, ...]):
    """Every request rendered for this pair, each checked against the target's context as a
    single prompt is (the line and id of one that does not fit named)."""
    from engine.workload import prepare

    prepared = prepare(workload, pair.tokenizer, max_tokens)  # a WorkloadError names the request
    for p in prepared:
        extra = max(0, 7 - p.max_tokens)
        _context_bound(pair, f"sweep: request {p.id} (line {p.request.line})",
                       len(p.ids) + p.max_tokens + max(widths) + extra,
                       f"prompt {len(p.ids)} + {'its max_tokens' if p.request.max_tokens else '--max-tokens'} "
                       f"{p.max_tokens} + width {max(widths)}" + (f" + {extra} cost-curve steps" if extra else ""))
    return prepared


def gain(text: str) -> float:
    """An argparse type: the minimum gain as a fraction (0.03) or a percentage (3%), 0 up to 1."""
    t = text.strip()
    pct = t.endswith("%")
    body = t[:-1].strip() if pct else t
    try:
        if not body.isascii() or "_" in body:
            raise ValueError
        v = float(body) / (100 if pct else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction (0.03) or a percentage (3%)") from None
    if not math.isfinite(v) or not 0 <= v < 1:
        hint = f" (did you mean {body}%?)" if not pct and 1 <= v < 100 else ""
        raise argparse.ArgumentTypeError(f"{text!r}: expected a gain from 0 up to 1 (0 % to 100 %){hint}")
    return v


def cmd_sweep(args: argparse.Namespace) -> int:
    import threading

    from console import records as record_files
    from engine import host, record
    from engine.ab import AbConfig, run_session
    from engine.decode import DecodeError

    from console import served

    code = distributed.run(args, cmd_sweep)  # --distributed: as a rank of a group, or its launcher
    if code is not None:
        return code
    if args.path == "mlx-lm-server":
        if args.workload is not None:  # not yet: the served session runs one prompt
            raise InputError("--workload runs on the engine path only (--path engine); the served "
                             "path measures one prompt")
        return served.cmd_sweep_served(args)
    served.served_only(args)
    workload = read_workload(args.workload, args.prompt, args.prompt_file)
    req = session_request(widths=args.widths, n=args.n, tokens=args.max_tokens,
                          prompt=read_prompt(args.prompt, args.prompt_file),
                          sequential=args.sequential, max_reps=args.max_reps, max_seconds=args.max_seconds)
    widths, prompt = req.widths, req.prompt
    for flag, given in (("--allow-nonidentical", args.allow_nonidentical),
                        ("--pair-specific", args.pair_specific)):
        if given and not args.save:
            raise InputError(f"{flag} only applies with --save")
    if args.profile is not None and not args.save:
        # Without --save a sweep neither reads nor writes a profile: ignoring the flag would let
        # a mistyped or corrupt profile pass unnoticed.
        raise InputError(f"--profile {args.profile}: only applies with --save (a sweep without "
                         f"--save reads and writes no profile)")
    if args.max_reps < args.n and args.sequential:
        raise InputError(f"--max-reps {args.max_reps}: below -n {args.n}; the budget must allow the "
                         f"first n repetitions")
    # Everything this command will write is checked before any model loads.
    records = record_dir(args.record_dir)
    if args.save:
        profile_for_save(args.profile)
    _qmv_call()
    pair = _load(args.target, args.draft, args.kind, args.demo_target)
    if workload is not None:
        prepared = prepare_workload(pair, workload, args.max_tokens, widths)
    else:
        n_prompt = len(pair.tokenizer.encode(prompt))
        if n_prompt == 0:
            raise InputError("prompt: empty (it must hold at least one token)")
        # the session's cost curve runs 7 forwards past the prompt when there is no room past the decode
        extra = max(0, 7 - args.max_tokens)
        _context_bound(pair, "sweep", n_prompt + args.max_tokens + max(widths) + extra,
                       f"prompt {n_prompt} + --max-tokens {args.max_tokens} + width {max(widths)}"
                       + (f" + {extra} cost-curve steps" if extra else ""))
    if args.wait_quiet > 0 and not args.json:
        print(f"blockwidth: waiting up to {args.wait_quiet:g}s for a quiet host", file=sys.stderr)
    gate = host.gate(wait_s=args.wait_quiet)
    for w in gate.warnings:
        print(f"blockwidth: warning: {w}", file=sys.stderr)
    config = AbConfig(widths=widths, prompt=prompt, n=args.n, max_tokens=args.max_tokens,
                      sequential=args.sequential, max_reps=args.max_reps,
                      max_seconds=args.max_seconds, verify_attention=args.verify_attention or "auto",
                      verify_linear=args.verify_linear, workload=workload, min_gain=args.min_gain,
                      seed=args.seed)
    quiet = args.json

    tty = sys.stderr.isatty()

    def on_event(e):
        if quiet:
            return
        if tty and e.kind == "progress":
            # one redrawn line: a bar over all runs, and where this run is
            frac = e.fraction
            fill = int(frac * 30)
            where = f"{e.arm} {'closing' if e.closing else 'warm-up' if e.rep == 0 else f'rep {e.rep}'}"
            if e.request:
                where = f"{e.request[:14]} {where}"
            print(f"\r  [{'#' * fill}{'.' * (30 - fill)}] {frac:4.0%}  {where:<32}", end="",
                  file=sys.stderr, flush=True)
        elif tty and e.kind == "phase":
            # after the runs: say which stage is working instead of leaving the bar at 100 %
            stage = "exactness probe" if e.phase == "exactness" else "cost curve"
            print(f"\r  {stage} {e.run}/{e.runs} {e.arm}".ljust(60), end="", file=sys.stderr, flush=True)
        elif tty and e.kind in ("exactness", "costcurve", "done", "cancelled"):
            print(f"\r  {e.kind}: {e.message}".ljust(60), file=sys.stderr)
        elif not tty and e.kind in ("warmup", "rep", "exactness", "costcurve"):
            print(f"  [{e.kind}] {e.arm} {e.message}".rstrip(), file=sys.stderr)
        elif not tty and e.kind == "progress" and e.tokens >= e.total and not e.request:
            print(f"  rep {e.rep} {e.arm:>8} done", file=sys.stderr)

    cancel = threading.Event()
    try:
        session = run_session(pair, config, on_event=on_event, cancel=cancel, lockstep=distributed.lockstep())
    except KeyboardInterrupt:
        cancel.set()
        raise
    rec = record.build(session, pair, host.identity(), gate.to_dict())
    distributed.annotate(rec, pair, session)  # the group, when sharded (every rank, collective)
    try:
        path = record_files.write(rec, records)
    except OSError as e:
        raise InputError(f"record directory {records}: cannot be written ({e.strerror})") from None

    saved, refusal = None, None
    if args.save:
        from console.profile_file import ProfileBusy

        try:
            saved, refusal = save_session(session, pair, path, args.profile,
                                          allow_nonidentical=args.allow_nonidentical,
                                          pair_specific=args.pair_specific)
        except ProfileBusy as e:  # the record stays; the operator can save from it later
            refusal = f"{e} (the record is kept: {path})"

    if args.json:
        out = dict(rec)
        out["record_path"] = str(path)
        out["saved"] = saved
        out["save_refused"] = refusal
        out.pop("host", None)
        out["host"] = {k: rec["host"][k] for k in ("device", "mlx", "mlx_lm")}
        for arm in [a for r in (out.get("requests") or []) for a in r["arms"]] + out["arms"]:
            for s in arm["samples"]:
                s.pop("rounds_detail", None)
        print(json.dumps(out, indent=1))
    else:
        print(f"pair   {pair.describe()}")
        if distributed.active():
            print(distributed.describe_line())
        if session.single:
            print(f"prompt {len(session.prompt_ids)} tokens, {config.max_tokens} new, n={config.n}, "
                  f"reps run {session.reps}, {session.elapsed_s:.1f}s, verify attention {session.attention}"
                  + _linear_note(session.config.verify_linear))
        else:
            print(f"{workload.describe()}; {config.max_tokens} new tokens a request unless it says, "
                  f"n={config.n}, reps run {session.reps}, {session.elapsed_s:.1f}s, verify attention "
                  f"{session.attention}" + _linear_note(session.config.verify_linear))
            for line in request_table(session):
                print(line)
            print("\nper pass (one run of every request):")
        print(f"{'arm':<8}  {'decode tok/s min/med/max':>26}  {'e2e med':>8}  {'accept':>6}  "
              f"{'identity':<16} verdict")
        for row in arm_table(session):
            d = row.decode
            print(f"{row.name:<8}  {d.min:8.1f} {d.median:8.1f} {d.max:8.1f}  {row.e2e.median:8.1f}  "
                  f"{row.acceptance:>6}  {row.identity:<16} {row.verdict.value}")
        print("\ndecode tok/s by width (= min, # median, - max):")
        print("\n".join(bars(arm_rows(session), "tok/s")))
        for line in speedup_lines(session):
            print(line)
        if not session.single:
            print("\nper-request speed-up by width (= min, # median, - max over the requests):")
            print("\n".join(bars(ratio_rows(session), "x", digits=2)))
        for r in session.per_request:
            for arm in r.arms:
                if arm.identity and not arm.identity.identical_ids:
                    on = "" if session.single else f" on request {r.id}"
                    print(f"  {arm.name}{on}: {arm.identity.describe()}")
        for ex in session.exactness.values():
            print(f"  probe {ex.describe()}")
        if session.prediction:  # both terms per width
            for line in session.prediction_lines():
                print(line)
        elif session.predicted_best:
            pred = ", ".join(f"w{k} {v:.2f}x" for k, v in sorted(session.predicted.items()))
            print(f"model prediction (cost curve x acceptance, not a measurement): best width "
                  f"{session.predicted_best}  [{pred}]")
        if session.curve_skipped:
            print(session.curve_skipped)
        if session.rollback_line():
            print(session.rollback_line())
        for warning in session.warnings():
            print(f"warning: {warning}")
        from console.outcome import headline

        print(f"verdict: {headline(session).text}")  # the same words as the console's headline
        print(f"decision: {session.decision} — {session.why}")
        print(f"record: {path}")
        if saved:
            print(f"saved: {saved}")
        if refusal:
            print(f"not saved: {refusal}", file=sys.stderr)
    if session.cancelled:
        return 130
    return ExitCode.CHECK_FAILED if refusal else ExitCode.OK


def cmd_costcurve(args: argparse.Namespace) -> int:
    from engine import costcurve

    code = distributed.run(args, cmd_costcurve)  # --distributed: as a rank of a group, or its launcher
    if code is not None:
        return code
    rows = costcurve.parse_rows(args.rows)
    _qmv_call()
    pair = _load(args.target, None, "lookup", args.demo_target)  # only the target is timed
    # each cold forward runs one position past the last: warm-up 2 + repeats of them
    steps = args.repeats + 2
    _context_bound(pair, "costcurve", args.context + max(rows) + steps,
                   f"--context {args.context} + {max(rows)} rows + {steps} cold steps")

    def progress(i, n):
        if not args.json:
            print(f"\r  measuring {i}/{n} row counts", end="", file=sys.stderr, flush=True)

    from engine.kvcache import RewindError

    try:
        curve = costcurve.measure(pair.target, rows, context=args.context, repeats=args.repeats,
                                  attention=args.verify_attention, linear=args.verify_linear,
                                  on_progress=progress)
    except RewindError as e:  # the cache cannot put a forward back: one line, not a traceback
        raise RewindError(f"costcurve: {e}") from None
    if not args.json:
        print(file=sys.stderr)
    data = {"target": str(pair.target_path), "target_quantization": pair.quantization.to_dict(),
            "mlx": mlx_version(), **curve.to_dict()}
    comm = distributed.communication(pair, rows) if distributed.active() else None
    if comm is not None:
        data["group"] = {**distributed.active().rank.to_dict(), "communication": comm.to_dict()}
    if args.json:
        print(json.dumps(data, indent=1))
        return ExitCode.OK
    print(f"verify-forward time by rows: {pair.target_path.name} [{pair.quantization.describe()}], "
          f"context {curve.context}, median of {curve.repeats}, each forward at a new KV length "
          f"(cold); verify attention {curve.attention}"
          + _linear_note(args.verify_linear))
    # "warm" and "first" were bare numbers beside the bar, "first" rounded to whole ms: say
    # once what each is, and print both as the bar's median is printed.
    print("  bar: cold ms (= min, # median, - max); warm: median ms of one forward repeated at "
          "one KV length; first: ms of this process's first forward of that many rows")
    base = curve.ms(rows[0]) or 1.0

    def note(p) -> str:
        warm = f" warm {p.warm_ms:.1f}" if p.warm_ms is not None else ""
        first = f" first {p.first_ms:.1f}" if p.first_ms is not None else ""
        return f"({p.median_ms / base:.2f}x){warm}{first}" + (f"  <- {p.boundary}" if p.boundary else "")

    points = [(f"{p.rows} row{'' if p.rows == 1 else 's'}", p.min_ms, p.median_ms, p.max_ms, note(p))
              for p in curve.points]
    print("\n".join(bars(points, "ms")))
    backs = [p for p in curve.points if p.rollback_ms is not None]
    if backs:
        print(f"rollback ({curve.rollback}), keeping half the rows: " + ", ".join(
            f"{p.rows} rows {p.rollback_ms:.3f} ms" for p in backs))
    if curve.linear is not None and not curve.linear["routed_calls"]:
        print(f"verify linear {curve.linear['mode']} routed no projection: "
              f"{linear.unrouted_reason(curve.linear['mode'])}, so these are the stock matmul's times")
    replayed = [p for p in curve.points if p.rows >= 2 and p.cold_over_warm and p.cold_over_warm >= 1.5]
    if replayed:
        print("cold >> warm: " + ", ".join(f"{p.rows} rows {p.cold_over_warm:.1f}x" for p in replayed)
              + " (work keyed on the KV length is rebuilt every round, as fused attention's cuDNN "
                "plans are on CUDA; on a busy host it can also be noise)")
    if curve.boundaries():
        print("kernel boundaries: " + ", ".join(f"{p.boundary} at {p.rows} rows" for p in curve.boundaries()))
    else:
        print("no kernel boundary: time grows smoothly with rows")
    if comm is not None:
        print(distributed.describe_line(drafter=False))
        print("\n".join(distributed.comm_lines(comm, curve.ms)))
    return ExitCode.OK


def register(sub) -> None:
    p = sub.add_parser("sweep", help="A/B session: widths against classic, with a record")
    add_pair_args(p)
    p.add_argument("--widths", default="2,3,4,6,8", help="comma-separated widths (default 2,3,4,6,8)")
    p.add_argument("-n", type=integer(1, 100, "repetitions per arm"), default=3,
                   help="repetitions per arm, 1..100 (default 3)")
    p.add_argument("--max-tokens", type=integer(1, 65536, "then bounded by the target's context"),
                   default=64, help="new tokens per run (default 64; prompt + tokens + width must fit "
                                    "the target's context)")
    p.add_argument("--prompt", help="prompt text (default: a demo prompt)")
    p.add_argument("--prompt-file", help="read the prompt from a file")
    p.add_argument("--workload", metavar="FILE|mixed",
                   help="run every arm on every request of a JSONL workload (one {\"prompt\": ...} or "
                        "{\"messages\": [...]} a line, optional max_tokens and id), or the built-in "
                        "mixed workload")
    p.add_argument("--min-gain", type=gain, default=0.03, metavar="G",
                   help="a win's speed-up interval must clear 1 + G: a fraction or a percentage "
                        "(default 3%%)")
    p.add_argument("--seed", type=integer(0, 2**32 - 1, "the statistics' seed"), default=None,
                   help="seed of the bootstrap and permutations (default: drawn, and recorded)")
    p.add_argument("--sequential", action="store_true",
                   help="keep adding repetitions until every arm is decided or the budget runs out")
    p.add_argument("--max-reps", type=integer(1, 1000, "sequential repetitions"), default=12,
                   help="sequential budget: repetitions, 1..1000 (default 12)")
    p.add_argument("--max-seconds", type=seconds(0, 86400, open_low=True), default=600,
                   help="sequential budget: seconds, up to 86400 (default 600)")
    p.add_argument("--wait-quiet", type=seconds(0, 3600), default=0, metavar="S",
                   help="wait up to S seconds (0..3600) for a quiet host before timing")
    p.add_argument("--record-dir", help="where the session record goes (default: user data dir)")
    p.add_argument("--save", action="store_true", help="store the measured winner (or decline) in the profile")
    p.add_argument("--allow-nonidentical", action="store_true",
                   help="with --save: save a faster width whose output differs, marked not byte-identical")
    p.add_argument("--pair-specific", action="store_true",
                   help="with --save: the entry matches only this pair (by content fingerprint)")
    p.add_argument("--profile", metavar="FILE",
                   help="with --save: the profile TOML it writes (default: the user profile)")
    add_verify_attention(p)
    # Not given: "auto" on the engine path, the stock server on the served path (given there, it
    # runs mlx_lm.server in-process with the dispatcher in that mode).
    p.set_defaults(verify_attention=None)
    add_verify_linear(p)
    from console import served

    served.add_arguments(p)
    distributed.add_arguments(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("costcurve", help="verify-forward time against rows, with kernel boundaries")
    p.add_argument("--target", metavar="T", help="target checkpoint folder (default: the demo target)")
    p.add_argument("--demo-target", choices=("bf16", "4bit"), default="bf16")
    p.add_argument("--rows", default="1-16,24,32", help="row counts, e.g. 1-16,24,32 (default)")
    p.add_argument("--context", type=integer(1, 1 << 20, "then bounded by the target's context"),
                   default=128, help="prefix tokens before the timed rows (context + rows must fit "
                                     "the target's context)")
    p.add_argument("--repeats", type=integer(1, 1000, "timed repeats"), default=7,
                   help="timed repeats per row count (median), 1..1000")
    add_verify_attention(p)
    add_verify_linear(p)
    distributed.add_arguments(p, drafter=False)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_costcurve)


def _qmv_call() -> None:
    """A bad BLOCKWIDTH_QMV_CALL is bad input, named before any model loads (it chooses how the
    qmv kernel is called: engine.qmv.call_strategy)."""
    from engine import qmv

    try:
        qmv.call_strategy()
    except ValueError as e:
        raise InputError(str(e)) from None


def _linear_note(mode: str) -> str:
    """", verify linear M" for a header line; nothing for stock (linear.named)."""
    lin = linear.named(mode)
    return f", verify linear {lin}" if lin else ""
