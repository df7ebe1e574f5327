"""Engine-backed headless commands: ``sweep`` (an A/B session) and ``costcurve``."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys

from blockwidth.engine import linear
from blockwidth.console.inputs import BlockwidthError, ExitCode, InputError, mlx_version, pair_paths, user_path
from blockwidth.console.render import (arm_rows, arm_table, auto_lines, bars, class_lines, ratio_rows,
                                       request_table, speedup_lines)
from blockwidth.console.request import (MAX_N, MAX_REPS, MAX_SECONDS, MAX_TOKENS, add_exact, add_pair_args,
                                        add_verify_attention, add_verify_linear, integer, read_prompt,
                                        seconds, session_request)
from blockwidth.console import outputs
from blockwidth.console import distributed
from blockwidth.console.save import save_session
from blockwidth.console.session import answer_after, profile_for_save, record_dir  # noqa: F401 (their home)
from blockwidth.policy import bounds, files
from blockwidth.policy.profile import MAX_WIDTH, MIN_WIDTH
from blockwidth.policy.pace import minutes as pace_minutes
from blockwidth.policy.text import error_line, error_lines, shown


def _memory_bytes() -> int | None:
    from blockwidth.engine.shapes import device_memory  # one definition: the pair's load bounds by it too

    return device_memory()


def _context_bound(pair, what: str, tokens: int, detail: str) -> None:
    """Refuse a run the target cannot take (its context) or the machine cannot hold
    (policy.bounds); the device's memory is probed only when the config says enough."""
    why = bounds.context_problem(pair.context_length, tokens)
    need = bounds.memory_need(pair.target_config, tokens) if why is None else None
    if need is not None:
        why = bounds.memory_problem(need, _memory_bytes())
    if why:
        raise InputError(f"{what}: {detail} = {tokens} tokens {why}")


def _widest(widths, auto_max: int | None) -> int:
    """The widest verify a sweep may run: its fixed widths and, with auto, auto's widest."""
    from blockwidth.policy.auto import AUTO, DEFAULT_AUTO_MAX

    fixed = [w for w in widths if w != AUTO]
    cap = (auto_max or max(fixed, default=DEFAULT_AUTO_MAX)) if AUTO in widths else 0
    return max([*fixed, cap])


def _load(target: str | None, draft: str | None, kind: str | None, variant: str | None):
    if distributed.active():  # a rank of a sharded target's group
        return distributed.load(target, draft, kind, variant)
    paths = pair_paths(target, draft, variant, kind, weights=True)  # a hub id: weights too
    from blockwidth.engine.pair import load_pair

    return load_pair(paths.target, paths.drafter, kind)


def run_interruptibly(work, cancel, what: str):
    """Run ``work()`` in a thread while this (main) thread waits: Ctrl-C (SIGTERM, SIGHUP too) sets
    ``cancel``, which the work checks between forwards, so it stops after the one under way and
    returns what it measured; a second Ctrl-C quits at once. MLX does not return to Python inside a forward,
    so a Ctrl-C met there waited for the whole measurement (two were ignored for 7 minutes).
    Returns (the result, whether it was interrupted)."""
    import threading

    box: dict = {}
    finished = threading.Event()

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as e:  # re-raised on the main thread
            box["error"] = e
        finally:
            finished.set()

    from blockwidth.console.inputs import note_mlx_thread

    note_mlx_thread()
    thread = threading.Thread(target=run, name=what, daemon=True)
    thread.start()
    interrupted = False
    # An Event, not Thread.join: a KeyboardInterrupt inside join can leave the thread looking
    # finished while it still runs. SIGTERM and SIGHUP are Ctrl-C here (console.signals): a
    # supervisor's stop keeps the record of what finished too.
    from blockwidth.console.signals import LAST, as_interrupt

    LAST.clear()  # Ctrl-C (SIGINT) raises KeyboardInterrupt without the handler: it leaves none
    with as_interrupt():
        while not finished.is_set():
            try:
                finished.wait(0.2)
            except KeyboardInterrupt:
                if interrupted:
                    print("\nblockwidth: interrupted", file=sys.stderr, flush=True)
                    os._exit(ExitCode.INTERRUPTED)
                interrupted = True
                cancel.set()
                from blockwidth.console.signals import stop_words

                print(f"\n{stop_words(what)}", file=sys.stderr, flush=True)
    thread.join()  # done: it only returns now
    if "error" in box:
        raise box["error"]
    return box["value"], interrupted


# Say how long the forwards will take when the total is at least this (or one forward is).
LONG_TOTAL_S = 60.0
LONG_FORWARD_S = 2.0


def _say_how_long(model, forwards: list[int], what: str, *, quiet: bool, cancel, lower_only: bool = False,
                  prefills: list[int] = ()) -> None:
    """Before a long measurement starts, time one 1-row forward and say what it implies: at
    least len(forwards) of those, and up to rows x that for a many-row forward on a CPU (where
    every row costs); and every prefill in ``prefills`` (its prompt's tokens) at the per-row rate
    of one forward of up to PREFILL_SAMPLE rows, timed too (a sweep said 45.6 s and
    took 832 s, its prefills counted as one row each). Silent when it is short. On a sharded
    target the timed forwards are collectives: every rank of the group runs them or none does,
    as rank 0 decides (a follower is always quiet: it times them with rank 0 and says nothing)."""
    from blockwidth.engine import costcurve

    if not distributed.agreed(not quiet and not cancel.is_set()):
        return
    one = costcurve.forward_seconds(model)
    sample = min(max(prefills, default=0), PREFILL_SAMPLE)
    per_row = costcurve.forward_seconds(model, sample) / sample if sample > 1 else one
    if quiet:
        return
    prefill_s = sum(max(one, per_row * p) for p in prefills)
    least = one * len(forwards) + prefill_s
    biggest = max(forwards, default=1)
    if least < LONG_TOTAL_S and one * biggest < LONG_FORWARD_S * 5 and one < LONG_FORWARD_S:
        return
    most = "" if lower_only else f", and a {biggest}-row forward alone up to {_dur(one * biggest)} on a CPU"
    pre = (f" and {len(prefills)} prefill{'s' if len(prefills) != 1 else ''} of {sum(prefills)} tokens "
           f"({per_row * 1e3:.0f} ms a token: {_dur(prefill_s)})") if prefills else ""
    print(f"blockwidth: {what}: one forward of this target takes {_dur(one)} here; it runs "
          f"{len(forwards)} forwards{pre}: about {_dur(least)} at that rate{most} (Ctrl-C stops it between "
          f"forwards)", file=sys.stderr, flush=True)


# Rows of the forward timed for the prefill rate: enough to be a prefill's per-row cost, few
# enough that timing it is cheap on a CPU (where a row costs about a 1-row forward).
PREFILL_SAMPLE = 16


def session_prefills(config, lengths: list[int], longest: int) -> list[int]:
    """The prompt tokens of every prefill an A/B session runs (engine.ab.run_session): the warm-up
    of every arm (on the first request), n runs of every arm on each request, the closing classic
    on each, the exactness probe of each fixed width, and the cost curve's prefix."""
    arms = 1 + len(dict.fromkeys(config.widths))
    out = [lengths[0]] * (arms if config.warmup else 0)
    for n in lengths:
        out += [n] * (config.n * arms + 1)
    if config.exactness:
        out += [lengths[0]] * len(config.fixed_widths)
    if config.predict:
        out.append(longest + config.max_tokens + config.widest)
    return out


def _say_pilot(pair, ids: list[int], reqs: tuple[tuple[int, int], ...], config, cancel,
               longest: list[int] | None = None):
    """Before a session of a minute or more: what it costs here, from a pilot (a few tokens
    decoded, classic and at its smallest and widest widths: policy.pace), prefill counted (a forward-count
    estimate said 9.2 s for a run of minutes), and whether its repetitions can reach a win.
    Returns the pilot's rates (policy.pace.Pace; None: no pilot ran), which the progress line's
    time left is priced by."""
    from blockwidth.engine.pace import pilot
    from blockwidth.policy import pace

    fixed = [w for w in config.widths if isinstance(w, int)]
    try:
        rates = pilot(pair, ids, min(fixed) if fixed else 2, cancel=cancel.is_set, longest=longest,
                      wide=max(fixed) if fixed else None)
    except (BlockwidthError, ValueError, RuntimeError):  # no estimate; the session says what fails
        return None
    if rates is None:
        return None
    arms = tuple(dict.fromkeys(config.widths))
    shape = pace.Shape(reqs, len(arms), config.n, config.sequential, config.max_reps, config.max_seconds, arms)
    plan = pace.plan(rates, shape)
    # --sequential adds repetitions while an arm is undecided, up to its budgets: the n alone
    # said "about 6.6 min" over a session that ran on to 17
    adds = config.sequential and plan.reached > config.n
    if max(plan.first_s, plan.reached_s if adds else 0) < LONG_TOTAL_S and plan.can_decide:
        return rates
    said = f"about {pace.minutes(plan.first_s)} here for its n {config.n}, prefill counted ({rates.describe()})"
    if adds:
        said += (f"; --sequential adds repetitions while undecided: {plan.reached} by about "
                 f"{pace.minutes(plan.reached_s)}, more while --max-reps {config.max_reps} and --max-seconds {config.max_seconds:g} allow")
    if not plan.can_decide:
        said += (f"; a win needs {plan.need} repetitions (its p below {stats_alpha()}), which it does not reach"
                 + (f": -n {plan.need}, or --sequential --max-seconds {plan.seconds_for_need()}"
                    if not config.sequential else f": --max-seconds {plan.seconds_for_need()}"))
    print(f"blockwidth: sweep: {said} (Ctrl-C stops it between forwards)", file=sys.stderr, flush=True)
    return rates


def stats_alpha() -> str:
    from blockwidth.policy.stats import ALPHA

    return f"{ALPHA:g}"


def _dur(s: float) -> str:
    return f"{s:.1f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _width_in_effect(args: argparse.Namespace) -> tuple[int | str, str] | None:
    """The width ``resolve`` gives for this pair (and its reason), or None: a decline, or a
    resolution that fails (a broken profile is --save's to report, not a reason to stop)."""
    from blockwidth.console.inputs import resolution
    from blockwidth.policy.resolve import label

    try:
        res, _, _ = resolution(target=args.target, draft=args.draft, kind=args.kind, flag=None,
                               device=None, profile=args.profile if args.save else None,
                               variant=args.demo_target, profile_missing_ok=True)
    except BlockwidthError:
        return None
    # an auto entry: the engine runs auto (the console's rule: Resolution.engine_width)
    width = res.engine_width
    return (width, label(res.source)) if width is not None else None


def read_workload(value: str | None, prompt: str | None, prompt_file: str | None):
    """``--workload`` (a file or a built-in's name), read and checked before any model loads;
    None without it. Refused beside --prompt or --prompt-file."""
    if value is None:
        return None
    from blockwidth.policy.workload import read

    if prompt is not None or prompt_file is not None:
        raise InputError(f"give --workload or {'--prompt' if prompt is not None else '--prompt-file'}, not both")
    return read(value)  # a WorkloadError is one line naming where and what


def prepare_workload(pair, workload, max_tokens: int, widths: tuple[int | str, ...],
                     auto_max: int | None = None):
    """Every request rendered for this pair, each checked against the target's context as a
    single prompt is (the line and id of one that does not fit named)."""
    from blockwidth.engine.shapes import check_ids
    from blockwidth.engine.workload import prepare

    prepared = prepare(workload, pair.tokenizer, max_tokens)  # a WorkloadError names the request
    widest = _widest(widths, auto_max)
    for p in prepared:
        # each request's ids, as a single prompt's (Pair.encode): a row of every embedding table
        check_ids(p.ids, pair.token_rows, f"request {p.id} (line {p.request.line}), target {pair.target_path}",
                  "workload")
        extra = max(0, 7 - p.max_tokens)
        _context_bound(pair, f"sweep: request {p.id} (line {p.request.line})",
                       len(p.ids) + p.max_tokens + widest + extra,
                       f"prompt {len(p.ids)} + {'its max_tokens' if p.request.max_tokens else '--max-tokens'} "
                       f"{p.max_tokens} + width {widest}" + (f" + {extra} cost-curve steps" if extra else ""))
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

    from blockwidth.console import served, session as recorded_session
    from blockwidth.engine.session import host

    code = distributed.run(args, cmd_sweep)  # --distributed: as a rank of a group, or its launcher
    if code is not None:
        return code
    if args.path == "mlx-lm-server":
        return served.cmd_sweep_served(args)
    served.served_only(args)
    workload = read_workload(args.workload, args.prompt, args.prompt_file)
    req = session_request(widths=args.widths, n=args.n, tokens=args.max_tokens,
                          prompt=read_prompt(args.prompt, args.prompt_file),
                          sequential=args.sequential, max_reps=args.max_reps, max_seconds=args.max_seconds)
    widths, prompt = req.widths, req.prompt
    if args.auto_max is not None and "auto" not in widths:
        raise InputError(f"--auto-max {args.auto_max}: only applies with auto among --widths")
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
        profile_for_save(args.profile, [("--prompt-file", user_path(args.prompt_file, "prompt file")),
                                         ("--workload", user_path(args.workload, "workload"))])
    _qmv_call()
    in_effect = _width_in_effect(args)
    pair = _load(args.target, args.draft, args.kind, args.demo_target)
    # In a group every rank runs the same arms: rank 0's width in effect (a follower has no
    # profile, _follow), else a follower's session has one arm fewer and the ranks part ways.
    in_effect = distributed.agreed(in_effect)
    in_effect = tuple(in_effect) if in_effect is not None else None
    if in_effect is not None and in_effect[0] not in widths:
        # The width `resolve` gives is always among the measured ones, as in the console: a
        # sweep that skipped it could not say whether the answer an operator gets loses.
        # (Said once the pair and the prompt have passed their checks: a refusal stays one line.)
        widths = (*widths, in_effect[0])
    else:
        in_effect = None
    if workload is not None:
        prepared = prepare_workload(pair, workload, args.max_tokens, widths, args.auto_max)
    else:
        n_prompt = len(pair.encode(prompt))  # a ShapeError: an id the pair's tables have no row for
        if n_prompt == 0:
            raise InputError("prompt: empty (it must hold at least one token)")
        # the session's cost curve runs 7 forwards past the prompt when there is no room past the decode
        extra = max(0, 7 - args.max_tokens)
        widest = _widest(widths, args.auto_max)
        _context_bound(pair, "sweep", n_prompt + args.max_tokens + widest + extra,
                       f"prompt {n_prompt} + --max-tokens {args.max_tokens} + width {widest}"
                       + (f" + {extra} cost-curve steps" if extra else ""))
    if in_effect is not None and not args.json:
        print(f"blockwidth: + width {in_effect[0]}, the width in effect ({in_effect[1]})", file=sys.stderr)
    if args.wait_quiet > 0 and not args.json:
        print(f"blockwidth: waiting up to {args.wait_quiet:g}s for a quiet host", file=sys.stderr)
    gate = host.gate(wait_s=args.wait_quiet)
    for w in gate.warnings:
        print(f"blockwidth: warning: {shown(w)}", file=sys.stderr)
    config = recorded_session.config(req, widths=widths, verify_attention=args.verify_attention or "auto",
                                     verify_linear=args.verify_linear, workload=workload,
                                     min_gain=args.min_gain, seed=args.seed, auto_max=args.auto_max,
                                     exact=getattr(args, "exact", "auto"))
    quiet = args.json

    tty = sys.stderr.isatty()
    clock: list = [None, 0]  # policy.pace.Clock once the pilot has priced the runs; runs planned

    def follow(e) -> None:
        """The clock follows the runs: each run's start, and the runs planned (a repetition's end
        carries no run count)."""
        c = clock[0]
        if c is None or e.phase != "runs":
            return
        if e.kind == "arm":
            c.started(e.run, e.elapsed, e.request, e.arm)
        if e.kind in ("arm", "progress"):
            clock[1] = e.runs

    def left(e) -> str:
        """The time left, from the runs measured so far (sequential: to the end of the runs
        planned now; it adds repetitions while undecided): asked only where it is printed."""
        c = clock[0]
        s = c.left_s(clock[1], e.elapsed) if c is not None and e.phase == "runs" else None
        if s is None:
            return ""
        return f"about {pace_minutes(s)} left" + (" (for now)" if config.sequential else "")

    def told(e) -> str:
        try:
            return left(e)
        except Exception:  # noqa: BLE001 (the time left is a help: never a session's end)
            return ""

    def redraw(line: str, end: str = "", cut: bool = True) -> None:
        """The progress line drawn over the last: the line erased first (a shorter one left the
        last one's end: "single stepst 6 s left"), and cut to the terminal's width (a wrapped
        line is not redrawn by a carriage return)."""
        if cut:
            line = line[:max(shutil.get_terminal_size((80, 24)).columns - 1, 20)]
        print(f"\r\x1b[K{line}", end=end, file=sys.stderr, flush=True)

    def on_event(e):
        if quiet:
            return
        try:
            follow(e)
        except Exception:  # noqa: BLE001 (the time left is a help: never a session's end)
            clock[0] = None
        if tty and e.kind == "progress":
            # one redrawn line: a bar over all runs, where this run is, and the time left
            frac = e.fraction
            fill = int(frac * 16)
            where = f"{e.arm} {'closing' if e.closing else 'warm-up' if e.rep == 0 else f'rep {e.rep}'}"
            if e.request:
                where = f"{e.request[:14]} {where}"
            # the time left before where the run is: the line is cut to the terminal's width,
            # and at 80 columns a workload's request ids pushed it past the end
            said = told(e)
            redraw(f"  [{'#' * fill}{'.' * (16 - fill)}] {frac:4.0%}  " + (f"{said} · " if said else "") + where)
        elif tty and e.kind == "phase":
            # after the runs: say which stage is working instead of leaving the bar at 100 %
            stage, unit = {"exactness": ("exactness probe", "widths"),
                           "divergence": ("divergence margin", "widths")}.get(e.phase, ("cost curve", "forwards"))
            redraw(f"  {stage} {e.run}/{e.runs} {unit} {e.arm}")
        elif tty and e.kind == "cancelled":
            redraw("  cancelled", end="\n")  # its message is the word again ("cancelled: cancelled")
        elif tty and e.kind in ("exactness", "costcurve", "done"):
            redraw(f"  {e.kind}: {shown(e.message)}", end="\n", cut=False)
        elif not tty and e.kind in ("warmup", "rep", "exactness", "costcurve"):
            left_words = told(e) if e.kind == "rep" else ""
            said = f"  [{e.kind}] {e.arm} {e.message}".rstrip() + (f"; {left_words}" if left_words else "")
            print(shown(said), file=sys.stderr)
        elif not tty and e.kind == "progress" and e.tokens >= e.total and not e.request:
            print(f"  rep {e.rep} {e.arm:>8} done", file=sys.stderr)

    cancel = threading.Event()
    if distributed.active():
        # at least: every planned run's prefill, and its tokens at the widest width's rate (a
        # group's ranks time one forward together: a pilot's decodes would be collectives too)
        per_run = -(-args.max_tokens // _widest(widths, args.auto_max))
        longest = n_prompt if workload is None else max(len(p.ids) for p in prepared)
        lengths = [n_prompt] if workload is None else [len(p.ids) for p in prepared]
        _say_how_long(pair.target, [1] * (config.planned_runs * per_run), "sweep", quiet=args.json,
                      cancel=cancel, lower_only=True, prefills=session_prefills(config, lengths, longest))
    elif not args.json:
        reqs = (((n_prompt, args.max_tokens),) if workload is None
                else tuple((len(p.ids), p.max_tokens) for p in prepared))
        ids = (pair.encode(prompt) if workload is None
               else list(min(prepared, key=lambda p: abs(len(p.ids) - sum(r[0] for r in reqs) / len(reqs))).ids))
        longest = None if workload is None else list(max(prepared, key=lambda p: len(p.ids)).ids)
        rates = _say_pilot(pair, ids, reqs, config, cancel, longest)
        from blockwidth.policy import pace

        arms = tuple(dict.fromkeys(config.widths))
        clock[0] = pace.Clock(rates, pace.Shape(reqs, len(arms), config.n, arm_widths=arms),
                              () if workload is None else tuple(p.id for p in prepared))
    # Ctrl-C stops the session after the forward under way; the cancelled session's record is
    # written, as any other (a measured result is never lost). A DecodeError is a BlockwidthError:
    # it reaches the front end as it is.
    # The record is written as the session ends (console.session), the group's part added when
    # sharded (distributed.annotate: every rank, collective).
    done, _ = run_interruptibly(
        lambda: recorded_session.run(pair, config, record_dir=records, gate=gate, on_event=on_event,
                                     cancel=cancel, lockstep=distributed.lockstep(),
                                     annotate=lambda rec, s: distributed.annotate(rec, pair, s)),
        cancel, "the session")
    session, rec, record_file = done.session, done.record, done.record_path
    # The measurement is done: a write that fails now (a full disk, a file-size limit, a profile
    # made read-only or rewritten as bad TOML meanwhile) is reported after the results, in one
    # line that names what was kept, and exits 2; it never throws the results away.
    late: list[str] = []
    if done.write_error is not None:
        e = done.write_error
        late.append(f"record directory {records}: the record cannot be written ({e.strerror or e})")

    saved, refusal = None, None
    if args.save and record_file is None:
        late.append("--save: nothing saved (a profile entry names its record, which was not written)")
    elif args.save:
        from blockwidth.console.profile_file import ProfileBusy
        from blockwidth.policy.profile import ProfileError

        try:
            saved, refusal = save_session(session, pair, record_file, args.profile,
                                          allow_nonidentical=args.allow_nonidentical,
                                          pair_specific=args.pair_specific)
        except ProfileBusy as e:  # the record stays; the operator can save from it later
            refusal = f"{e} (the record is kept: {record_file})"
        except ProfileError as e:
            late.append("; ".join(error_lines(e)) + " (nothing saved)")
        else:
            if saved:
                from blockwidth.policy import profile as profiles

                outputs.keep("profile entry", user_path(args.profile, "profile") or profiles.default_path())

    said = answer_after(args, session) if args.save else None
    if args.json:
        out = dict(rec)
        out["record_path"] = str(record_file) if record_file else None
        out["saved"] = saved
        out["save_refused"] = refusal
        if said is not None:
            out["answer"] = said.to_dict()
        out["errors"] = late
        out["exit_code"] = _sweep_exit(session, refusal, late)
        out.pop("host", None)
        out["host"] = {k: rec["host"][k] for k in ("device", "mlx", "mlx_lm")}
        for arm in [a for r in (out.get("requests") or []) for a in r["arms"]] + out["arms"]:
            for s in arm["samples"]:
                s.pop("rounds_detail", None)
        print(files.dumps_json(out, indent=1))
    else:
        def say(line: str = "") -> None:  # one line each; names from the checkpoint shown escaped
            print(shown(line))

        say(f"pair   {pair.describe()}")
        if distributed.active():
            say(distributed.describe_line())
        if session.single:
            say(f"prompt {len(session.prompt_ids)} tokens, {config.max_tokens} new, n={config.n}, "
                f"reps run {session.reps}, {session.elapsed_s:.1f}s, verify attention {session.attention}"
                + _linear_note(session.config.verify_linear))
        else:
            say(f"{workload.describe()}; {config.max_tokens} new tokens a request unless it says, "
                f"n={config.n}, reps run {session.reps}, {session.elapsed_s:.1f}s, verify attention "
                f"{session.attention}" + _linear_note(session.config.verify_linear))
            for line in request_table(session):
                for part in line.split("\n"):  # its heading starts with a blank line, not a "\n"
                    say(part)
            say()
            say("per pass (one run of every request):")
        if session.exact is not None:
            say(f"exact path: {session.exact.reason}")
        rows = arm_table(session)
        if rows:  # a cancel before a pass finished leaves none: no headings over nothing
            say(f"{'arm':<8}  {'decode tok/s min/med/max':>26}  {'e2e med':>8}  {'accept':>6}  "
                f"{'identity':<16} verdict")
            for row in rows:
                d = row.decode
                say(f"{row.name:<8}  {d.min:8.1f} {d.median:8.1f} {d.max:8.1f}  {row.e2e.median:8.1f}  "
                    f"{row.acceptance:>6}  {row.identity:<16} {row.verdict.value}")
            say()
            say("decode tok/s by width (= min, # median, - max):")
            for line in bars(arm_rows(session), "tok/s"):
                say(line)
        elif not session.single:
            say("no pass finished: no per-pass figures (the requests above hold what ran)")
        for line in speedup_lines(session):
            say(line)
        ratios = [] if session.single else ratio_rows(session)
        if ratios:  # none where a cancel came inside the first request: no heading over nothing
            say()
            say("per-request speed-up by width (= min, # median, - max over the requests; the figure is "
                "the median request's, the verdict's ratio above is over all tokens):")
            for line in bars(ratios, "x", digits=2, columns=76):  # whole at 80 columns
                say(line)
        for line in class_lines(session):
            say(line)
        for line in auto_lines(session):
            say(line)
        for r in session.per_request:
            for arm in r.arms:
                if arm.identity and not arm.identity.identical_ids:
                    on = "" if session.single else f" on request {r.id}"
                    say(f"  {arm.name}{on}: {arm.identity.describe()}")
        for ex in session.exactness.values():
            say(f"  probe {ex.describe()}")
        if session.prediction:  # both terms per width
            for line in session.prediction_lines():
                say(line)
        elif session.predicted_best:
            say(session.prediction_line(per_width=True))
        if session.curve_skipped:
            say(session.curve_skipped)
        for line in session.round_lines():
            say(line)
        if session.rollback_line():
            say(session.rollback_line())
        for warning in session.warnings():
            say(f"warning: {warning}")
        from blockwidth.console.outcome import headline

        say(f"verdict: {headline(session).text}")  # the same words as the console's headline
        say(f"decision: {session.decision} — {session.why}")
        say(f"record: {record_file}" if record_file else "record: not written (below)")
        if saved:
            say(f"saved: {saved}")
        if refusal:
            print(f"not saved: {shown(refusal)}", file=sys.stderr)
        elif not args.save and record_file and headline(session).saveable and not session.cancelled:
            # a tryout read "width 2 beats classic", then resolve still gave the per-kind default
            what = (f"width {session.recommendation}" if session.recommendation is not None
                    else "the decline (classic)")
            say(f"not saved: rerun with --save to store {what} in the profile, so resolve and serve use it")
        if said is not None:
            for i, line in enumerate(said.lines()):
                say(f"{'answer' if i == 0 else '':<6} {line}")
    sys.stdout.flush()  # the results are out before the line that says what failed after them
    for line in late:
        print(f"blockwidth: error: {error_line(line)}{outputs.kept_note()}", file=sys.stderr)
    return _sweep_exit(session, refusal, late)


def _sweep_exit(session, refusal: str | None, late: list[str]) -> int:
    if late:
        return ExitCode.USAGE
    if session.cancelled:
        return ExitCode.INTERRUPTED
    return ExitCode.CHECK_FAILED if refusal else ExitCode.OK


def cmd_costcurve(args: argparse.Namespace) -> int:
    from blockwidth.engine import costcurve

    code = distributed.run(args, cmd_costcurve)  # --distributed: as a rank of a group, or its launcher
    if code is not None:
        return code
    rows = costcurve.parse_rows(args.rows)
    _qmv_call()
    pair = _load(args.target, None, "lookup", args.demo_target)  # only the target is timed
    from blockwidth.engine import exact as exact_path

    plan = exact_path.choose_route(pair.target, exact_path.plan(pair.target, getattr(args, "exact", "auto")))
    # each cold forward runs one position past the last: warm-up 2 + repeats of them
    steps = args.repeats + 2
    _context_bound(pair, "costcurve", args.context + max(rows) + steps,
                   f"--context {args.context} + {max(rows)} rows + {steps} cold steps")

    tty = sys.stderr.isatty()

    def progress(i, n):
        # one redrawn line on a terminal; in a log, a line per tenth
        if args.json:
            return
        if tty:
            print(f"\r  measuring: {i}/{n} forwards", end="", file=sys.stderr, flush=True)
        elif i == n or i % max(n // 10, 1) == 0:
            print(f"  measuring: {i}/{n} forwards", file=sys.stderr, flush=True)

    import threading

    cancel = threading.Event()
    forwards = costcurve.curve_forwards(rows, args.context, args.repeats)
    # the first is the context's prefix: a prefill, at the prefill rate
    _say_how_long(pair.target, forwards[1:], "costcurve", quiet=args.json, cancel=cancel, prefills=forwards[:1])
    from blockwidth.engine.kvcache import RewindError

    try:
        curve, _ = run_interruptibly(
            lambda: costcurve.measure(pair.target, rows, context=args.context, repeats=args.repeats,
                                      attention=args.verify_attention, linear=args.verify_linear,
                                      on_progress=progress, cancel=cancel.is_set, exact=plan),
            cancel, "the cost curve")
    except RewindError as e:  # the cache cannot put a forward back: one line, not a traceback
        raise e.adding(before="costcurve: ") from None
    if not args.json and tty:
        print(file=sys.stderr)
    data = {"target": str(pair.target_path), "target_quantization": pair.quantization.to_dict(),
            "mlx": mlx_version(), **curve.to_dict(), "exact": plan.to_dict()}
    comm = distributed.communication(pair, rows) if distributed.active() else None
    if comm is not None:
        data["group"] = {**distributed.active().rank.to_dict(), "communication": comm.to_dict()}
    if args.json:
        print(files.dumps_json(data, indent=1))
        return ExitCode.OK
    print(shown(f"verify-forward time by rows: {pair.target_path.name} [{pair.quantization.describe()}], "
                f"context {curve.context}, median of {curve.repeats}, each forward at a new KV length "
                f"(cold); verify attention {curve.attention}" + _linear_note(args.verify_linear)))
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
    for line in curve.boundary_lines():  # boundaries only where the repeats agree
        print(line)
    if comm is not None:
        print(distributed.describe_line(drafter=False))
        print("\n".join(distributed.comm_lines(comm, curve.ms)))
    if curve.cancelled:
        print(f"cancelled: {curve.repeats} of {args.repeats} repeats per row count were measured "
              f"(the figures above are theirs)")
        return ExitCode.INTERRUPTED
    return ExitCode.OK


def register(sub) -> None:
    p = sub.add_parser("sweep", help="A/B session: widths against classic, with a record")
    add_pair_args(p)
    p.add_argument("--widths", default="2,3,4,6,8",
                   help="comma-separated widths (default 2,3,4,6,8); auto is one more arm: a width "
                        "per round from the process-wide controller")
    p.add_argument("--auto-max", type=integer(MIN_WIDTH, MAX_WIDTH, "the auto arm's widest width"), default=None,
                   metavar="N", help="the auto arm's widest width (default: the widest fixed width "
                                     "swept, 16 with none)")
    p.add_argument("-n", type=integer(1, MAX_N, "repetitions per arm"), default=3,
                   help=f"repetitions per arm, 1..{MAX_N} (default 3)")
    p.add_argument("--max-tokens", type=integer(1, MAX_TOKENS, "then bounded by the target's context"),
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
    p.add_argument("--max-reps", type=integer(1, MAX_REPS, "sequential repetitions"), default=12,
                   help=f"sequential budget: repetitions, 1..{MAX_REPS} (default 12)")
    p.add_argument("--max-seconds", type=seconds(0, MAX_SECONDS, open_low=True), default=600,
                   help=f"sequential budget: seconds, up to {MAX_SECONDS:.0f} (default 600)")
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
    add_exact(p)
    from blockwidth.console import served

    served.add_arguments(p)
    distributed.add_arguments(p)
    p.add_argument("--json", action="store_true", help="the session as one JSON document on stdout")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("costcurve", help="verify-forward time against rows, with kernel boundaries")
    p.add_argument("--target", metavar="T", help="target checkpoint folder (default: the demo target)")
    p.add_argument("--demo-target", choices=("bf16", "4bit"), default=None,
                   help="which demo target when --target is not given (default bf16)")
    p.add_argument("--rows", default="1-16,24,32", help="row counts, e.g. 1-16,24,32 (default)")
    p.add_argument("--context", type=integer(1, 1 << 20, "then bounded by the target's context"),
                   default=128, help="prefix tokens before the timed rows (context + rows must fit "
                                     "the target's context)")
    p.add_argument("--repeats", type=integer(1, 1000, "timed repeats"), default=7,
                   help="timed repeats per row count (median), 1..1000")
    add_verify_attention(p)
    add_verify_linear(p)
    add_exact(p)
    distributed.add_arguments(p, drafter=False)
    p.add_argument("--json", action="store_true", help="the curve as one JSON document on stdout")
    p.set_defaults(func=cmd_costcurve)


def _qmv_call() -> None:
    """A bad BLOCKWIDTH_QMV_CALL is bad input, named before any model loads (it chooses how the
    qmv kernel is called: engine.qmv.call_strategy)."""
    from blockwidth.engine import qmv

    try:
        qmv.call_strategy()
    except ValueError as e:
        raise InputError(str(e)) from None


def _linear_note(mode: str) -> str:
    """", verify linear M" for a header line; nothing for stock (linear.named)."""
    lin = linear.named(mode)
    return f", verify linear {lin}" if lin else ""
