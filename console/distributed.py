"""``sweep`` and ``costcurve`` on a target sharded with MLX's distributed layer (``--distributed
tensor|pipeline``): run under ``mlx.launch``, or with ``--ranks N`` blockwidth starts mlx.launch
itself for N processes on this machine (loopback only), bounded in time, and stops every one of
them however it ends.

Every rank runs the same command (engine.distributed says why and how they stay the same); only
rank 0 prints, writes the record and touches the profile. The other ranks follow with their
stdout closed, their record going to a folder of their own that is removed, and no profile.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from blockwidth.console.inputs import CLI_NAMES, BlockwidthError, ExitCode, InputError
from blockwidth.policy.text import error_line

# Set by the launcher (--ranks) for its ranks: where each writes how it ended, and the time bound.
GROUP_DIR = "BLOCKWIDTH_GROUP_DIR"
GROUP_TIMEOUT = "BLOCKWIDTH_GROUP_TIMEOUT"
MAX_LOCAL_RANKS = 8
DEFAULT_TIMEOUT = 3600.0
# mlx.launch's own entry point (its console script), run by this interpreter
LAUNCH = "import sys; from mlx._distributed_utils.launch import main; sys.argv[0] = 'mlx.launch'; main()"


def add_arguments(p: argparse.ArgumentParser, *, drafter: bool = True) -> None:
    from blockwidth.console.request import integer, seconds

    g = p.add_argument_group("sharded target (MLX distributed; docs/distributed.md)")
    g.add_argument("--distributed", choices=("tensor", "pipeline"),
                   help="the target sharded over a group with mlx-lm's loader: tensor (its "
                        "shard(group)) or pipeline (its pipeline(group)); under mlx.launch, or --ranks")
    g.add_argument("--ranks", type=integer(2, MAX_LOCAL_RANKS, "local processes"), metavar="N",
                   help=f"with --distributed: start mlx.launch for N (2..{MAX_LOCAL_RANKS}) processes "
                        "on this machine, over 127.0.0.1")
    g.add_argument("--group-backend", choices=("ring", "nccl"),
                   help="with --ranks: MLX's backend (default: nccl where CUDA is, else ring, as "
                        "mlx.launch chooses)")
    g.add_argument("--group-timeout", type=seconds(1, 86400), default=DEFAULT_TIMEOUT, metavar="S",
                   help=f"with --distributed: every rank is stopped after S seconds (default "
                        f"{DEFAULT_TIMEOUT:g})")
    if drafter:
        g.add_argument("--drafter-on", choices=("replicated", "rank0"), default="replicated",
                       help="with --distributed: a model drafter on every rank (replicated, the "
                            "default: nothing sent) or on rank 0 only (rank0: its drafts sent "
                            "every round)")
        g.add_argument("--agree", choices=("run", "round"), default="run",
                       help="with --distributed: ranks compare their tokens after every run (run), "
                            "or every forward's input before it runs (round: slower, for tests)")


# ---- this process as a rank ---------------------------------------------------------------------

@dataclass
class Context:
    """What a rank knows of its group while its command runs."""

    rank: Any  # engine.distributed.Rank
    placement: str
    agree: str
    launcher: str  # "blockwidth --ranks N" or "mlx.launch"
    lockstep: Any = None
    target: Any = None  # engine.distributed.CheckedTarget with --agree round

    @property
    def writer(self) -> bool:
        return self.rank.writer


_context: Context | None = None


def active() -> Context | None:
    """This process's group while it runs a command as a rank; None when alone."""
    return _context


def _given(args: argparse.Namespace) -> list[str]:
    out = []
    for flag, key, default in (("--ranks", "ranks", None), ("--group-backend", "group_backend", None),
                               ("--drafter-on", "drafter_on", "replicated"), ("--agree", "agree", "run"),
                               ("--group-timeout", "group_timeout", DEFAULT_TIMEOUT)):
        if getattr(args, key, default) != default:
            out.append(flag)
    return out


def run(args: argparse.Namespace, command: Callable[[argparse.Namespace], int]) -> int | None:
    """``command`` on a sharded target, or None where --distributed is not given (the caller
    runs alone). Outside a group: start one (--ranks), or say how to. Inside: run as a rank."""
    from blockwidth.engine import distributed as dist

    if _context is not None:
        return None  # already a rank: the command runs on
    if not getattr(args, "distributed", None):
        stray = _given(args)
        if stray:
            raise InputError(f"{stray[0]} only applies with --distributed tensor|pipeline")
        return None
    if getattr(args, "path", "engine") not in (None, "engine"):
        raise InputError("--distributed: measures the engine's decode loop; the served path "
                         "(--path mlx-lm-server) runs mlx_lm.server, which is not sharded here")
    if getattr(args, "kind", None) in ("dflash", "mtp"):
        raise InputError(f"--kind {args.kind} with --distributed: its drafter reads the target's hidden "
                         "states layer by layer, which a sharded target holds apart; the engine runs "
                         "model and lookup drafters on a sharded target")
    if dist.launched_backend(os.environ) is None:
        if args.ranks is None:
            raise InputError(f"--distributed {args.distributed}: no group: run under mlx.launch "
                             f"(e.g. mlx.launch -n 2 -- blockwidth ...), or give --ranks N to have "
                             f"blockwidth start N local processes")
        return launch(args)
    if args.group_backend is not None and args.ranks is None:
        raise InputError("--group-backend only applies with --ranks (mlx.launch chose the backend)")
    return _as_rank(args, command)


def _as_rank(args: argparse.Namespace, command: Callable[[argparse.Namespace], int]) -> int:
    global _context
    from blockwidth.engine import distributed as dist

    from blockwidth.policy.device import launch_rank

    group_dir = os.environ.get(GROUP_DIR)
    timeout = _group_timeout(args)
    _watchdog(timeout)
    rank_no = launch_rank(os.environ)  # a LaunchError names the variable
    _hostfile_problem(os.environ.get("MLX_HOSTFILE"))
    if rank_no != 0:
        _follower_streams(group_dir, rank_no)
    code: int | None = None
    error = ""
    private = None
    try:
        rank = dist.init(args.group_backend, args.distributed)  # a DistributedError names --distributed
        if args.ranks is not None and args.ranks != rank.size:
            raise InputError(f"--ranks {args.ranks}: this group has {rank.size} ranks")
        if not rank.writer:
            private = tempfile.TemporaryDirectory(prefix=f"blockwidth-rank{rank.rank}-")
            _follow(args, private.name)
        _context = Context(rank, getattr(args, "drafter_on", "replicated"), getattr(args, "agree", "run"),
                           "blockwidth --ranks" if group_dir else "mlx.launch")
        try:
            code = int(command(args))
        except dist.DistributedError as e:  # the ranks parted (1), or a target they cannot split (2)
            error = error_line(e.say(CLI_NAMES))
            print(f"blockwidth: error: {error}", file=sys.stderr)
            code = e.exit_code
        return code
    except BaseException as e:
        code = _code_of(e)
        said = e.say(CLI_NAMES) if isinstance(e, BlockwidthError) else str(e)
        error = " ".join(said.split()) or type(e).__name__
        raise
    finally:
        _context = None
        dist.leave()
        if private is not None:
            private.cleanup()
        if group_dir:
            _write_result(group_dir, rank_no, code, error)


def _code_of(e: BaseException) -> int:
    if isinstance(e, BlockwidthError):  # each says its own (a held profile lock: 1)
        return e.exit_code
    if isinstance(e, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    if isinstance(e, SystemExit):
        return e.code if isinstance(e.code, int) else ExitCode.ENVIRONMENT
    return ExitCode.ENVIRONMENT  # not an expected failure: the rank's environment failed


def _write_result(group_dir: str, rank: int, code: int | None, error: str) -> None:
    try:
        Path(group_dir, f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "code": code, "error": error}))
    except OSError:
        pass  # the launcher then says this rank ended without a result


def _group_timeout(args: argparse.Namespace) -> float:
    """--group-timeout, or the launcher's (``BLOCKWIDTH_GROUP_TIMEOUT``), which it set itself."""
    raw = os.environ.get(GROUP_TIMEOUT, "").strip()
    if not raw:
        return float(args.group_timeout)
    from blockwidth.console.request import seconds

    try:
        return seconds(1, 86400)(raw)
    except argparse.ArgumentTypeError as e:
        raise InputError(f"{GROUP_TIMEOUT}={e}") from None


def _hostfile_problem(path: str | None) -> None:
    """MLX_HOSTFILE, read by MLX when the group forms: a FIFO nobody writes (or a device that
    never ends) blocked MLX's read with the interpreter held, so that nothing, not even the
    group's timeout, ran again. It must be a regular file of JSON, read here first."""
    if not path:
        return
    from blockwidth.policy import files

    try:
        files.read_json(files.user_path(path, "MLX_HOSTFILE"), files.MiB)
    except files.FileProblem as e:  # said of MLX_HOSTFILE, as it was raised (no re-wrap)
        if not e.message.startswith("MLX_HOSTFILE"):
            e.adding(before="MLX_HOSTFILE ")
        raise e.adding(": the group's hosts (JSON, as mlx.launch writes it)") from None


# Ends a rank from outside when its interpreter cannot run the timer below: MLX forms a group
# (and waits in a collective) with the interpreter held, so a peer that never joins kept a rank
# waiting past --group-timeout with its timer never run. This process sleeps apart; it leaves
# as soon as the rank is gone.
_KILLER = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
parent, end = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    if os.getppid() != parent:
        sys.exit(0)
    time.sleep(0.2)
try:
    os.write(2, sys.argv[3].encode())
    os.kill(parent, signal.SIGKILL)
except OSError:
    pass
"""
KILL_GRACE_S = 2.0  # after the timer's moment: the timer says it first when it can run


def _watchdog(seconds: float) -> None:
    """Stop this rank after ``seconds`` whatever it is doing (a collective whose peer is gone
    waits forever): the time bound holds under an operator's mlx.launch too. A timer here ends
    it with 124; where MLX holds the interpreter, a process apart kills it just after."""
    def fire() -> None:
        sys.stderr.write(f"blockwidth: error: rank stopped after --group-timeout {seconds:g}s\n")
        sys.stderr.flush()
        os._exit(ExitCode.TIMED_OUT)

    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()
    line = (f"blockwidth: error: rank stopped after --group-timeout {seconds:g}s (killed: MLX held "
            f"the process, waiting for its group)\n")
    with contextlib.suppress(OSError):
        subprocess.Popen([sys.executable, "-S", "-c", _KILLER, str(os.getpid()),
                          str(seconds + KILL_GRACE_S), line], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def _follower_streams(group_dir: str | None, rank: int) -> None:
    """Only rank 0 prints: another rank's stdout goes nowhere, and under the launcher its stderr
    goes to a log the launcher shows only if this rank fails."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    if group_dir:
        log = os.open(os.path.join(group_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 2)


def _follow(args: argparse.Namespace, private: str) -> None:
    """A rank other than 0 runs the same session but writes nothing the operator sees: its
    record goes to ``private`` (removed when it ends) and it neither reads nor writes a profile
    (what rank 0 saves is the group's; another host may not even have the folder)."""
    for key, value in (("record_dir", private), ("save", False), ("profile", None),
                       ("allow_nonidentical", False), ("pair_specific", False), ("json", True)):
        if hasattr(args, key):
            setattr(args, key, value)


# ---- what a rank's command asks of its group ---------------------------------------------------

def load(target, draft, kind, variant):
    """The pair with its target sharded over this rank's group (the drafter where --drafter-on
    puts it). A PairError, or a DistributedError about the target, for what cannot be loaded or
    split."""
    from blockwidth.console.inputs import pair_paths
    from blockwidth.engine import distributed as dist
    from blockwidth.engine.pair import load_pair

    ctx = _context
    assert ctx is not None
    paths = pair_paths(target, draft, variant, kind, weights=True)
    rank = ctx.rank
    draws = ctx.placement != dist.RANK0 or rank.writer

    pair = load_pair(paths.target, paths.drafter, kind, target_loader=lambda path: dist.load_target(path, rank),
                     drafter_model=draws)
    pair.drafter_factory = dist.drafter_factory(pair, rank, ctx.placement)
    if ctx.agree == dist.AGREE_ROUND:
        ctx.target = pair.target = dist.CheckedTarget(pair.target, rank.group)
    ctx.lockstep = dist.Lockstep(rank)
    return pair


def agreed(value):
    """Rank 0's ``value`` (JSON) on every rank of the group, ``value`` itself when alone: for a
    choice that leads to a collective (a forward of the sharded target), which every rank must
    make as rank 0 does; a follower's arguments differ from rank 0's (_follow: --json, no
    profile). Collective in a group: every rank calls it at the same point."""
    if _context is None:
        return value
    import json

    from blockwidth.engine.distributed import broadcast_bytes

    return json.loads(broadcast_bytes(_context.rank.group, json.dumps(value).encode()))


def lockstep():
    """The session's lockstep in a rank (engine.ab.run_session(lockstep=...)), else None."""
    return _context.lockstep if _context is not None else None


def annotate(record: dict, pair, session) -> None:
    """The record's ``group`` section: the group (every rank's device and host), how it was
    launched, where the drafter ran, how the ranks agreed, and the communication one verify
    forward pays at the session's widths. Collective: every rank calls it at the same point."""
    from blockwidth.engine import distributed as dist

    ctx = _context
    if ctx is None:
        return
    rows = sorted({1, *session.config.widths})
    comm = communication(pair, rows)
    section = {**ctx.rank.to_dict(), "launcher": ctx.launcher,
               "drafter": "every rank (lookup: no model)" if pair.kind.value == "lookup" else ctx.placement,
               "agreement": {"every": ctx.agree, **ctx.lockstep.to_dict()},
               "communication": comm.to_dict()}
    if ctx.target is not None:
        section["agreement"]["forwards_compared"] = ctx.target.forwards
    record["group"] = section
    # each sample names its tokens, so a record shows which runs decoded the same text
    for arm, out in zip([session.classic, *session.arms], record["arms"]):
        for run, sample in zip(arm.runs, out["samples"]):
            sample["tokens_sha256"] = dist.digest(run.tokens)


def communication(pair, rows):
    from blockwidth.engine import distributed as dist

    ctx = _context
    assert ctx is not None
    model = ctx.target._model if ctx.target is not None else pair.target
    text = pair.target_config.get("text_config") or pair.target_config
    return dist.communication(model, ctx.rank, rows, int(text.get("hidden_size") or 0))


def describe_line(drafter: bool = True) -> str | None:
    """One line for a header: the group (and for a sweep where the drafter ran)."""
    ctx = _context
    if ctx is None:
        return None
    line = f"group  {ctx.rank.info.describe()}"
    return line + (f"; drafter {ctx.placement}; ranks agree every {ctx.agree}" if drafter else "")


def comm_lines(curve, verify: Callable[[int], float | None]) -> list[str]:
    """The communication by rows beside the verify forward's time, and what was not measurable."""
    from blockwidth.engine import distributed as dist

    out = [f"communication of one forward, alone ({curve.what}):"]
    for p in curve.points:
        v = verify(p.rows)
        rest = ""
        if v:
            rest = (f"  verify {v:.2f} ms, the rest {v - p.median_ms:.2f} ms" if v >= p.median_ms else
                    f"  verify {v:.2f} ms: less than the communication alone (noise: the host was busy)")
        out.append(f"  {p.rows:>3} row{'' if p.rows == 1 else 's'}  {p.median_ms:8.2f} ms "
                   f"(min {p.min_ms:.2f}, max {p.max_ms:.2f}){rest}")
    out.append(f"  not measurable apart: {dist.NOT_MEASURED}")
    return out


# ---- the launcher (--ranks) ---------------------------------------------------------------------

def _free_ports(count: int) -> int:
    """A first port of ``count`` consecutive ports free on 127.0.0.1 now (mlx.launch's ring
    listens on starting-port + rank)."""
    for _ in range(64):
        base = random.randint(20000, 60000 - count)
        socks = []
        try:
            for i in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise InputError("--ranks: no free ports on 127.0.0.1 for the group")


def launch_command(command: list[str], ranks: int, backend: str, port: int) -> list[str]:
    """mlx.launch for ``ranks`` processes on 127.0.0.1 each running ``command`` (the CLI's own
    command line again, which the CLI sets as args.rank_command)."""
    where = ["--starting-port", str(port)] if backend == "ring" else ["--nccl-port", str(port)]
    return [sys.executable, "-c", LAUNCH, "--hosts", "127.0.0.1", "-n", str(ranks), "--backend", backend,
            *where, "--", *command]


def _default_backend() -> str:
    import mlx.core as mx

    return "nccl" if hasattr(mx, "cuda") and mx.cuda.is_available() else "ring"


def _local_target(args: argparse.Namespace) -> Path | None:
    """The target folder when it is here (the demo's, or --target a folder); None for a hub id,
    which each rank resolves (and checks) itself."""
    from blockwidth.engine import demo

    given = getattr(args, "target", None)
    if given is None:
        return Path(demo.target(getattr(args, "demo_target", None) or "bf16"))
    path = Path(given).expanduser()
    return path if (path / "config.json").is_file() else None


def launch(args: argparse.Namespace) -> int:
    """Start the group (mlx.launch, N local processes), wait for it within --group-timeout,
    stop every process it started however this ends, and end as rank 0 ended."""
    command = getattr(args, "rank_command", None)
    if command is None:
        raise InputError("--ranks: the command line to start the ranks with is not known here")
    target = _local_target(args)
    if target is not None:  # a target mlx-lm cannot split is refused before any rank starts
        from blockwidth.engine import distributed as dist
        from blockwidth.policy.device import Sharding

        dist.check_split(target, Sharding(args.distributed), args.ranks)
    backend = args.group_backend or _default_backend()
    port = _free_ports(args.ranks if backend == "ring" else 1)
    with tempfile.TemporaryDirectory(prefix="blockwidth-group-") as group_dir:
        env = dict(os.environ, **{GROUP_DIR: group_dir, GROUP_TIMEOUT: str(args.group_timeout)})
        code = run_group(launch_command(list(command), args.ranks, backend, port), env, args.group_timeout)
        return _outcome(group_dir, args.ranks, code)


def run_group(cmd: list[str], env: dict, timeout: float) -> int | None:
    """Run ``cmd`` (mlx.launch) in a session of its own; None when it ended by itself, else the
    code this launcher ends with (124 past ``timeout``, 130 interrupted, 143 terminated). Every
    process of that session is stopped before this returns."""
    proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, start_new_session=True)

    def terminated(signum, frame):
        raise _Stopped(128 + signum)

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    for s in before:
        signal.signal(s, terminated)
    try:
        proc.wait(timeout=timeout)
        return None
    except subprocess.TimeoutExpired:
        print(f"blockwidth: error: the group ran past --group-timeout {timeout:g}s: every rank "
              f"stopped", file=sys.stderr)
        return ExitCode.TIMED_OUT
    except KeyboardInterrupt:
        print("blockwidth: interrupted: every rank stopped", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except _Stopped as e:
        return e.code
    finally:
        _stop(proc)
        for s, h in before.items():
            signal.signal(s, h)


class _Stopped(BlockwidthError):
    """The launcher was told to stop (SIGTERM, SIGHUP): it ends with 128 + the signal."""

    def __init__(self, code: int) -> None:
        super().__init__(f"stopped by signal {code - 128}", exit_code=code)
        self.code = code


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the launcher's whole session (mlx.launch and every rank it started), then
    SIGKILL to whatever is left after a grace."""
    import time

    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if proc.poll() is not None and not _alive_group(proc.pid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    if proc.stdin:
        proc.stdin.close()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _outcome(group_dir: str, ranks: int, stopped: int | None) -> int:
    """The launcher's exit code: rank 0's; a failure of another rank named, and made the
    launcher's when rank 0 did not fail itself."""
    results = {}
    for r in range(ranks):
        try:
            results[r] = json.loads(Path(group_dir, f"rank-{r}.json").read_text())
        except (OSError, ValueError):
            pass
    if stopped is not None:
        return stopped
    zero = results.get(0)
    others = [res for r, res in sorted(results.items()) if r and res.get("code")]
    for res in others:
        if not zero or res.get("error") != zero.get("error"):
            log = Path(group_dir, f"rank-{res['rank']}.log")
            said = res.get("error") or _last_line(log) or f"exit code {res.get('code')}"
            print(f"blockwidth: error: rank {res['rank']}: {said}", file=sys.stderr)
    missing = [r for r in range(ranks) if r not in results]
    if zero is None:
        print(f"blockwidth: error: rank 0 ended without a result (killed, or crashed: what it said "
              f"is above){'' if len(missing) == 1 else f'; ranks {missing} too'}", file=sys.stderr)
        return ExitCode.CHECK_FAILED
    if missing:
        print(f"blockwidth: error: ranks {missing} ended without a result (killed, or crashed)", file=sys.stderr)
    code = zero.get("code")
    code = code if isinstance(code, int) else ExitCode.CHECK_FAILED
    if code == 0 and (others or missing):
        return ExitCode.CHECK_FAILED
    return code


def _last_line(path: Path) -> str:
    try:
        lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""
