"""The served path: widths measured through the real ``mlx_lm.server``.

blockwidth starts the installed mlx-lm's server on loopback ports, as an operator runs it (one
process with the draft model, whose widths interleave through each request's
``num_draft_tokens``, and one without it for classic), streams ``/v1/completions`` requests to
them over plain HTTP, and stops every process it started however the session ends. The schedule
(warm-up, interleaving, the classic brackets) and the verdicts are the engine path's
(``engine.ab.interleave`` and ``engine.ab.decide``); only what runs an arm differs.

What the server does not show is said, not guessed: it reports no acceptance (so none is
recorded), and it stops at EOS (the engine path runs fixed lengths), so every sample records
the tokens it produced. Its prompt cache is part of what is measured: each request records how
many prompt tokens the cache served, and a width's text is compared with classic's for a first
sending (a server whose cache is off: ``--prompt-cache-size 0``) and for the timed requests,
which repeat the prompt and hit the cache.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from blockwidth.policy.errors import BlockwidthError, ExitCode
from blockwidth.policy.profile import (MAX_CONCURRENCY, PATH_SERVER, SERVER_ENV_PREFIX, num_draft_tokens,
                                       server_arg_problem, server_env_problems)
from blockwidth.policy.text import folder_label, shown

HOST = "127.0.0.1"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 600.0  # one socket read; a healthy stream sends a chunk per token
LOG_TAIL_BYTES = 64 << 10
CRASH_WAIT_S = 2.0  # a failed request: how long its server may take to exit before it is named
# The stock server, as its own deprecation note asks to be run; and the same server in a
# process with blockwidth's verify-attention dispatcher active in its generation thread.
STOCK_COMMAND = ("-m", "mlx_lm", "server")
DISPATCH_COMMAND = ("-m", "blockwidth.engine.mlxserver")


class ServedError(BlockwidthError):
    """The served path cannot go on: one line naming the server and what happened. What the
    input causes exits 2: a server argument blockwidth sets, a level out of range, a port in use,
    a server that exits at start on the operator's arguments or cannot load the checkpoint."""


class ServerFailed(ServedError):
    """mlx_lm.server failed, not the input: it could not be started, did not become ready in
    time, exited while serving, or failed a request. The environment failed: exit 3."""

    exit_code = ExitCode.ENVIRONMENT


def server_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """MLX's own switches in the environment the servers inherit (policy.profile's
    SERVER_ENV_PREFIX): what a served record and entry keep, since they pick the kernels the
    measurement ran on; one that a profile could not hold is left out (and would not be valid
    for MLX either)."""
    environ = os.environ if environ is None else environ
    out = {k: environ[k] for k in sorted(environ) if k.startswith(SERVER_ENV_PREFIX)}
    return {k: v for k, v in out.items() if not server_env_problems({k: v})}


def server_version() -> str | None:
    try:
        return metadata.version("mlx-lm")
    except metadata.PackageNotFoundError:
        return None


def check_server_args(args: Sequence[str], what: str = "--server-args") -> tuple[str, ...]:
    """The operator's extra mlx_lm.server arguments: any but those blockwidth sets itself or
    never passes, and their abbreviations (policy.profile.server_arg_problem, which a profile
    entry's server.args meet too)."""
    out = tuple(str(a) for a in args)
    why = server_arg_problem(list(out))
    if why:
        raise ServedError(f"{what}: {why}")
    return out


def port_free(port: int, host: str = HOST) -> bool:
    """Whether mlx_lm.server could listen on ``host:port`` now. SO_REUSEADDR, as its HTTP
    server sets it: a port whose last server stopped a moment ago holds only TIME_WAIT
    connections, which a listener may reuse (a bare bind called the port in use)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except (OSError, OverflowError):
            return False
    return True


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- processes

_live: dict[int, "Server"] = {}  # every server this process started and has not stopped
_live_lock = threading.Lock()


def _stop_all_at_exit() -> None:
    for server in list(_live.values()):
        server.stop()


atexit.register(_stop_all_at_exit)


@dataclass(frozen=True)
class ServerSpec:
    """One mlx_lm.server process: the pair, the operator's extra arguments, and how it runs."""

    role: str  # what messages call it: "classic", "draft", "first-sending"
    model: Path
    draft: Path | None = None
    args: tuple[str, ...] = ()
    verify_attention: str | None = None  # None: the stock server; a mode: the dispatcher in-process
    port: int | None = None  # None: a free loopback port
    host: str = HOST
    env: tuple[tuple[str, str], ...] = ()  # added to this process's environment
    draft_tokens: int | None = None  # --num-draft-tokens for the process (None: per request)
    exact: bool = False  # the exact path in-process (engine.exact): the dispatcher, whatever mode

    @property
    def dispatcher(self) -> str | None:
        """The verify attention the in-process server runs with; None: the stock server."""
        return self.verify_attention or ("auto" if self.exact else None)

    def _dispatch(self) -> list[str]:
        return [*DISPATCH_COMMAND, "--verify-attention", str(self.dispatcher),
                *(("--exact", "on") if self.exact else ())]

    def _arguments(self, port: int | None) -> list[str]:
        from blockwidth.engine.mlxserver import _option

        out = ["--model", str(self.model)]
        if self.draft is not None:
            out += ["--draft-model", str(self.draft)]
            if self.draft_tokens is not None:
                out += ["--num-draft-tokens", str(self.draft_tokens)]
        if self.exact and _option(list(self.args), "--prefill-step-size") is None:
            # prompt chunks of at most the exact path's rows: each row of a chunk is then computed
            # as its 1-row step, so a prefix's KV rows are the same bits whichever request, chunk
            # or server computed them (the prompt cache reuses prefixes across requests)
            from blockwidth.engine.attention import EXACT_MAX_ROWS

            out += ["--prefill-step-size", str(EXACT_MAX_ROWS)]
        out += list(self.args)
        return out + ([] if port is None else ["--host", self.host, "--port", str(port)])

    def argv(self, port: int) -> list[str]:
        head = [sys.executable, *(STOCK_COMMAND if self.dispatcher is None else self._dispatch())]
        return head + self._arguments(port)

    def command_line(self, port: int | None = None) -> list[str]:
        """``argv(port)`` as an operator types it: mlx_lm.server's console script (or the
        dispatcher's module) for the interpreter, the same arguments in the same order; with no
        ``port``, no host and port either."""
        head = ["mlx_lm.server"] if self.dispatcher is None else ["python", *self._dispatch()]
        return head + self._arguments(port)


class Server:
    """A started mlx_lm.server: its process, its port and its log. ``stop`` is idempotent."""

    def __init__(self, spec: ServerSpec, log_dir: Path, tee=None):
        """``tee``: a text stream that also gets the server's output, line by line (``serve``
        shows the operator mlx_lm.server's own log); the log file gets it either way."""
        self.spec = spec
        self.tee = tee
        self._copier: threading.Thread | None = None
        # readiness probes sent whose 404 access line the tee has not yet swallowed: the probe is
        # refused on purpose (engine answered, nothing generated), and a "404" on an operator's
        # screen at startup read as a fault
        self._probe_lines = 0
        # set once stop() is asked: MLX's C++ teardown in the server, whose generation thread ran
        # MLX, may abort at exit with "terminate called without an active exception"
        # (ml-explore/mlx#3126, the abort blockwidth's own exit avoids with os._exit): after a stop
        # the operator asked for, that line is the server's teardown, not a fault, and is kept in
        # its log only
        self._stopping = False
        self.port = spec.port
        self.log_path = Path(log_dir) / f"{spec.role}.log"
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_s: float | None = None
        self.exit_code: int | None = None

    @property
    def name(self) -> str:
        pid = f", pid {self.proc.pid}" if self.proc else ""
        return f"mlx_lm.server ({self.spec.role}{pid}, port {self.port})"

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        if self.port is None:
            self.port = free_port(self.spec.host)
        elif not port_free(self.port, self.spec.host):
            raise ServedError(f"port {self.port} on {self.spec.host} is in use: mlx_lm.server "
                              f"({self.spec.role}) cannot listen there; choose another port")
        env = dict(os.environ)
        env.update(dict(self.spec.env))
        env.setdefault("PYTHONUNBUFFERED", "1")
        log = open(self.log_path, "wb")
        try:
            # Its own session: a Ctrl-C at the terminal reaches blockwidth, which stops it; the
            # server never sees a half-delivered interrupt of its own.
            self.proc = subprocess.Popen(self.spec.argv(self.port), stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE if self.tee else log,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        except OSError as e:
            log.close()
            raise ServerFailed(f"mlx_lm.server ({self.spec.role}) cannot be started: {e.strerror}") from None
        if self.tee:
            self._copier = threading.Thread(target=self._copy, args=(self.proc.stdout, log),
                                            name="blockwidth-server-log", daemon=True)
            self._copier.start()
        else:
            log.close()
        self.started_at = time.monotonic()
        with _live_lock:
            _live[self.proc.pid] = self

    def _copy(self, pipe, log) -> None:
        try:
            for raw in iter(pipe.readline, b""):
                log.write(raw)
                log.flush()
                if self._probe_lines and b'"POST /v1/completions HTTP/1.1" 404' in raw:
                    self._probe_lines -= 1  # the readiness probe's own refusal: kept in the log only
                    continue
                if self._stopping and raw.startswith(b"terminate called without an active exception"):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    # the server's log echoes folder names and requests: one shown line each
                    self.tee.write(shown(raw.decode("utf-8", errors="replace").rstrip("\r\n")) + "\n")
                    self.tee.flush()
        finally:
            log.close()

    def log_tail(self, limit: int = LOG_TAIL_BYTES) -> list[str]:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - limit))
                text = fh.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        return [line.rstrip() for line in text.splitlines() if line.strip()]

    def last_error(self) -> str:
        """The line of its log that says what went wrong: the last exception, else the last line."""
        lines = self.log_tail()
        for line in reversed(lines):
            head = line.split(":", 1)[0].strip()
            if (head.endswith(("Error", "Exception", "error")) or line.startswith("error:")
                    or ": error:" in line):
                return _bounded(line)
        return _bounded(lines[-1]) if lines else "(its log is empty)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, deadline: float, cancel: threading.Event | None = None) -> None:
        """Until the server answers a request with its model loaded, or ServedError. The server
        answers /health before its model loads (the generation thread loads it), so readiness is
        a request that only the generation thread answers: a prompt that is not text, refused by
        the tokenizer after the model is loaded and before anything is generated or cached."""
        assert self.proc is not None
        while True:
            if cancel is not None and cancel.is_set():
                raise KeyboardInterrupt
            code = self.proc.poll()
            if code is not None:
                self.exit_code = code
                raise ServedError(f"{self.name} exited at start (code {code}): {self.last_error()}")
            if any("Address already in use" in line for line in self.log_tail(8 << 10)):
                raise ServedError(f"port {self.port} on {self.spec.host} is in use: {self.name} "
                                  f"cannot listen there; choose another port")
            if time.monotonic() >= deadline:
                raise ServerFailed(f"{self.name} did not become ready in "
                                  f"{time.monotonic() - self.started_at:.0f} s (--ready-timeout); "
                                  f"its log ends: {self.last_error()}")
            status = self._get("/health")
            if status == 503:
                raise ServedError(f"{self.name} cannot load the model: {self.last_error()}")
            if status == 200:
                answer = self._probe(deadline)
                if answer is not None:
                    if "generation thread died" in answer:
                        raise ServedError(f"{self.name} cannot load the model: {self.last_error()}")
                    self.ready_s = time.monotonic() - self.started_at
                    return
            time.sleep(0.1)

    def _get(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (OSError, ValueError):
            return None

    def _probe(self, deadline: float) -> str | None:
        body = json.dumps({"prompt": 0, "max_tokens": 1}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        # counted before it is sent: the server logs the refusal before the answer reaches here
        undo = self.tee is not None  # taken back unless a 404 was logged
        if undo:
            self._probe_lines += 1
        try:
            with urllib.request.urlopen(req, timeout=max(1.0, deadline - time.monotonic())) as r:
                return r.read(4096).decode("utf-8", errors="replace")
        except urllib.error.HTTPError as e:
            undo = undo and e.code != 404  # a 404 was logged: the tee swallows it
            return e.read(4096).decode("utf-8", errors="replace")
        except (OSError, ValueError):
            return None  # no answer, so no line either
        finally:
            if undo:
                self._probe_lines = max(0, self._probe_lines - 1)

    def stop(self, graceful: bool = False) -> None:
        """SIGTERM to its process group (``graceful``: SIGINT first, which mlx_lm.server answers
        by shutting down its HTTP server and joining its generation thread), SIGKILL after
        STOP_TIMEOUT_S; waits until it is gone."""
        proc = self.proc
        if proc is None:
            return
        self._stopping = True
        with _live_lock:
            _live.pop(proc.pid, None)
        for sig in ((signal.SIGINT,) if graceful else ()) + (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_TIMEOUT_S)
        if self._copier is not None:
            self._copier.join(timeout=STOP_TIMEOUT_S)
        if self.exit_code is None:
            self.exit_code = proc.returncode

    def crashed(self, wait_s: float = 0.0) -> ServedError | None:
        """A ServedError naming this server and the end of its log, if it is no longer running.
        ``wait_s``: how long a server that is going may take to be gone (a request it reset can
        arrive before its process has exited)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None and wait_s > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait_s)
        if self.proc.poll() is None:
            return None
        self.exit_code = self.proc.returncode
        return ServerFailed(f"{self.name} exited (code {self.exit_code}) while serving: "
                           f"{self.last_error()} (log: {self.log_path})")


def _bounded(text: str, limit: int = 300) -> str:
    text = shown(" ".join(text.split()))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Servers:
    """The servers of one session, started together and stopped on every way out (including
    SIGTERM and SIGHUP to blockwidth, which raise KeyboardInterrupt while they run). Logs are
    removed after a clean stop and kept, and named, after a failure."""

    def __init__(self, specs: Iterable[ServerSpec], *, ready_timeout: float = READY_TIMEOUT_S,
                 on_start: Callable[[Server], None] | None = None,
                 cancel: threading.Event | None = None):
        self.specs = list(specs)
        self.ready_timeout = ready_timeout
        self.on_start = on_start or (lambda s: None)
        self.cancel = cancel
        self.log_dir = Path(tempfile.mkdtemp(prefix="blockwidth-served-"))
        self.servers: dict[str, Server] = {}
        self._signals: dict[int, Any] = {}
        self.keep_logs = False

    def __enter__(self) -> "Servers":
        self._trap_signals()
        try:
            for spec in self.specs:  # started together: they load their models side by side
                server = Server(spec, self.log_dir)
                self.servers[spec.role] = server
                server.start()
                self.on_start(server)
            deadline = time.monotonic() + self.ready_timeout
            for server in self.servers.values():
                try:
                    server.wait_ready(deadline, self.cancel)
                except ServedError as e:
                    raise e.adding(f" (log: {server.log_path})") from None
        except BaseException as e:
            self.keep_logs = not isinstance(e, KeyboardInterrupt)
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __getitem__(self, role: str) -> Server:
        return self.servers[role]

    def stop(self, role: str) -> None:
        self.servers[role].stop()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            self.keep_logs = True
        try:
            for server in self.servers.values():
                server.stop()
        finally:
            self._restore_signals()
            if not self.keep_logs:
                shutil.rmtree(self.log_dir, ignore_errors=True)

    def _trap_signals(self) -> None:
        """SIGTERM and SIGHUP, where nothing handles them (they would end the process and leave
        the servers running), raise KeyboardInterrupt, so the servers are stopped on the way out;
        a handler the caller set (the served sweep's, which cancels) stays."""
        if threading.current_thread() is not threading.main_thread():
            return

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) is not signal.SIG_DFL:
                continue
            with contextlib.suppress(ValueError, OSError):
                self._signals[sig] = signal.signal(sig, interrupt)

    def _restore_signals(self) -> None:
        for sig, handler in self._signals.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, handler)
        self._signals.clear()


# ---------------------------------------------------------------- requests

@dataclass
class Completion:
    """One streamed /v1/completions request, as the client saw it."""

    text: str
    tokens: int  # completion tokens the server reports (usage)
    prompt_tokens: int | None
    cached_tokens: int | None  # prompt tokens the server's prompt cache served
    finish_reason: str | None
    sent: float  # time.monotonic() when the request was sent
    first: float | None  # when the first text arrived
    last: float | None  # when the last text arrived
    done: float
    chunks: int
    num_draft_tokens: int | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.first - self.sent if self.first is not None else None

    @property
    def decode_s(self) -> float:
        return (self.last - self.first) if self.first is not None and self.last is not None else 0.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first over the time from the first text to the last (the stream's
        token times; time to first token excluded, as the engine path excludes prefill)."""
        return (self.tokens - 1) / self.decode_s if self.decode_s > 0 and self.tokens > 1 else 0.0

    @property
    def e2e_s(self) -> float:
        return self.done - self.sent

    def summary(self) -> dict[str, Any]:
        return {"tokens": self.tokens, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "finish_reason": self.finish_reason,
                "ttft_s": _r(self.ttft_s), "decode_tok_s": _r(self.decode_tok_s),
                "e2e_s": _r(self.e2e_s), "chunks": self.chunks,
                "num_draft_tokens": self.num_draft_tokens}


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def complete(server: Server, prompt: str | list[dict], max_tokens: int, num_draft_tokens: int | None = None,
             *, cancel: threading.Event | None = None,
             timeout: float = REQUEST_TIMEOUT_S) -> Completion | None:
    """Stream one greedy completion from ``server``; None when cancelled mid-stream (the
    connection is closed, which stops the server's generation). Raises ServedError. A prompt
    is text (/v1/completions); chat messages (a list) go to /v1/chat/completions, where the
    server renders them with the target's chat template as the engine path does."""
    chat = isinstance(prompt, list)
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0,
                            "stream": True, "stream_options": {"include_usage": True},
                            **({"messages": prompt} if chat else {"prompt": prompt})}
    if num_draft_tokens is not None:
        body["num_draft_tokens"] = num_draft_tokens
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    req = urllib.request.Request(server.url + endpoint, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    parts: list[str] = []
    usage: dict = {}
    finish = None
    first = last = None
    chunks = 0
    sent = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            for raw in resp:
                if cancel is not None and cancel.is_set():
                    return None
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue  # ": keepalive" comments during a long prefill
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                msg = json.loads(data)
                if msg.get("usage"):
                    usage = msg["usage"]
                for choice in msg.get("choices", ()):
                    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                    if text:
                        now = time.monotonic()
                        first = now if first is None else first
                        last = now
                        chunks += 1
                        parts.append(text)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
    except urllib.error.HTTPError as e:
        detail = e.read(2000).decode("utf-8", errors="replace")
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(detail).get("error", detail)
        raise ServerFailed(f"{server.name} refused the request (HTTP {e.code}): {_bounded(detail)}") from None
    except (OSError, ValueError) as e:
        crash = server.crashed(wait_s=CRASH_WAIT_S)  # a reset connection: the process may be going
        if crash is not None:
            raise crash from None
        if cancel is not None and cancel.is_set():
            return None
        raise ServerFailed(f"{server.name}: the request failed ({_bounded(str(e))})") from None
    details = usage.get("prompt_tokens_details") or {}
    return Completion("".join(parts), int(usage.get("completion_tokens") or 0),
                      usage.get("prompt_tokens"), details.get("cached_tokens"), finish, sent,
                      first, last, time.monotonic(), chunks, num_draft_tokens)


def burst(server: Server, prompt: str | list[dict], max_tokens: int, num_draft_tokens: int | None,
          concurrency: int, *, cancel: threading.Event) -> list[Completion] | None:
    """``concurrency`` requests sent at once, each from its own client thread; None if cancelled."""
    if concurrency == 1:
        c = complete(server, prompt, max_tokens, num_draft_tokens, cancel=cancel)
        return None if c is None else [c]
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="blockwidth-client")
    try:
        futures = [pool.submit(complete, server, prompt, max_tokens, num_draft_tokens, cancel=cancel)
                   for _ in range(concurrency)]
        pending = set(futures)
        while pending:  # short waits, so that Ctrl-C reaches the main thread
            _, pending = wait(pending, timeout=0.2)
        results = [f.result() for f in futures]
    except BaseException:
        cancel.set()  # the other clients stop at their next chunk
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if any(r is None for r in results):
        return None
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------- identity of text

CONTEXT_CHARS = 24


@dataclass(frozen=True)
class TextIdentity:
    """A served text against classic's, byte for byte (the server sends text, not token ids:
    positions are characters). ``identical_ids`` is the name the verdict rule reads."""

    identical: bool
    first_divergence: int | None  # character index
    classic_len: int
    width_len: int
    sending: str = ""  # "first sending" or "cached repeat"
    before: str = ""
    classic_after: str = ""
    width_after: str = ""

    @property
    def identical_ids(self) -> bool:
        return self.identical

    @property
    def identical_bytes(self) -> bool:
        return self.identical

    def describe(self) -> str:
        if self.identical:
            return f"byte-identical ({self.classic_len} characters)"
        return (f"{self.sending + ': ' if self.sending else ''}differs from classic at character "
                f"{self.first_divergence}: …{self.before!r} then classic {self.classic_after!r} vs "
                f"width {self.width_after!r}")

    def to_dict(self) -> dict:
        return {"identical_ids": self.identical, "identical_bytes": self.identical,
                "unit": "characters", "first_divergence": self.first_divergence,
                "classic_len": self.classic_len, "width_len": self.width_len, "sending": self.sending,
                "before": self.before, "classic_after": self.classic_after,
                "width_after": self.width_after, "margin": None}


def compare_text(classic: str, width: str, sending: str = "") -> TextIdentity:
    if classic == width:
        return TextIdentity(True, None, len(classic), len(width), sending)
    n = next((i for i, (a, b) in enumerate(zip(classic, width)) if a != b), min(len(classic), len(width)))
    return TextIdentity(False, n, len(classic), len(width), sending,
                        classic[max(0, n - CONTEXT_CHARS):n], classic[n:n + CONTEXT_CHARS],
                        width[n:n + CONTEXT_CHARS])


# ---------------------------------------------------------------- one arm's run

@dataclass
class ServedRun:
    """One burst of ``concurrency`` requests to one arm: what ``engine.ab`` reads of a run.

    The verdict's figure (``decode_tok_s``) is the request's decode tok/s at concurrency 1,
    comparable with the engine path's, and the burst's aggregate tok/s above 1 (every request's
    tokens over the burst's wall time), which is what a loaded server delivers."""

    width: int | None
    requests: list[Completion]
    concurrency: int
    identity: list[TextIdentity] = field(default_factory=list)  # per request, against classic
    # what engine.ab and engine.session.record read of an engine run; the server shows none of it
    clocks: dict | None = None
    host: dict | None = None
    attention: dict | None = None
    rounds: tuple = ()
    linear_routed: int = 0
    drafted: int = 0
    accepted: int = 0
    declined_rounds: int = 0

    @property
    def classic(self) -> bool:
        return self.width is None

    @property
    def speculative_rounds(self) -> int:
        # The server reports no rounds; a width's requests were sent with its num_draft_tokens.
        return 0 if self.classic else 1

    @property
    def wall_s(self) -> float:
        return max(r.done for r in self.requests) - min(r.sent for r in self.requests)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.requests)

    @property
    def aggregate_tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.requests[0].decode_tok_s if self.concurrency == 1 else self.aggregate_tok_s

    @property
    def decode_s(self) -> float:
        return self.requests[0].decode_s if self.concurrency == 1 else self.wall_s

    @property
    def e2e_tok_s(self) -> float:
        return self.aggregate_tok_s

    @property
    def prompt_tokens(self) -> int:
        return self.requests[0].prompt_tokens or 0

    def summary(self) -> dict[str, Any]:
        return {"width": self.width, "concurrency": self.concurrency,
                "decode_tok_s": round(self.decode_tok_s, 3), "e2e_tok_s": round(self.e2e_tok_s, 3),
                "aggregate_tok_s": round(self.aggregate_tok_s, 3), "wall_s": round(self.wall_s, 4),
                "tokens": self.tokens,
                "requests": [dict(r.summary(), identical=i.identical if i else None,
                                  sending="cached repeat" if (r.cached_tokens or 0) > 0 else "first sending")
                             for r, i in zip(self.requests, self.identity or [None] * len(self.requests))]}

    def rounds_table(self) -> None:
        return None

    @classmethod
    def combine_pass(cls, width: int | None, runs: list["ServedRun"]) -> "ServedPass":
        """A workload's pass as one run (engine.ab.pass_run's served twin)."""
        return ServedPass(width, [q for r in runs for q in r.requests], runs[0].concurrency,
                          [i for r in runs for i in r.identity], parts=list(runs))


@dataclass
class ServedPass(ServedRun):
    """Every request of a workload's pass: tokens and decode time summed over its runs."""

    parts: list[ServedRun] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.parts)

    @property
    def decode_s(self) -> float:
        return sum(r.decode_s for r in self.parts)

    @property
    def decode_tok_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.parts)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.parts)


# ---------------------------------------------------------------- the session

@dataclass(frozen=True)
class ServedPair:
    """What the records and the profile read of a pair the server loads (no weights here)."""

    target_path: Path
    drafter_path: Path
    quantization: Any
    fingerprints: dict
    target_config: dict
    tokenizer: Any
    kind: Any = None
    token_rows: int | None = None  # rows of the pair's smallest embedding table (engine.shapes)

    @property
    def pair_id(self) -> str:
        from blockwidth.engine.checkpoint import pair_key

        return pair_key(self.fingerprints["target"], self.fingerprints.get("drafter"))

    @property
    def context_length(self) -> int | None:
        from blockwidth.policy.config import context_length

        return context_length(self.target_config)  # the engine path's rule (text_config too)

    def describe(self) -> str:
        return (f"{folder_label(self.target_path)} [{self.quantization.describe()}] + {folder_label(self.drafter_path)} "
                f"(model), served by mlx_lm.server {server_version()}")


def served_pair(target: Path, drafter: Path) -> ServedPair:
    """Check the pair with the engine path's own check (engine.pair.check_pair: configs, weights'
    headers, the vocabulary and the tokenizers), without loading weights: the server loads them.
    Raises engine.pair.PairError, naming its input (``target`` or ``draft``)."""
    from blockwidth.engine.pair import check_pair, token_rows
    from blockwidth.policy.drafter import DrafterKind

    checked = check_pair(target, drafter, DrafterKind.MODEL)
    tck, dck = checked.target, checked.drafter
    # what the server would index, checked here as the engine path checks it
    rows = token_rows(checked.tokenizer, tck.path, tck.weights, dck.weights, "target", "draft")
    return ServedPair(tck.path, dck.path, checked.quantization,
                      {"target": tck.fingerprint, "drafter": dck.fingerprint}, tck.config,
                      checked.tokenizer, DrafterKind.MODEL, token_rows=rows)


@dataclass(frozen=True)
class ServedConfig:
    ab: Any  # engine.ab.AbConfig: widths, prompt, n, max_tokens, sequential budget
    concurrency: tuple[int, ...] = (1,)
    server_args: tuple[str, ...] = ()
    verify_attention: str | None = None  # None: stock mlx_lm.server
    port: int | None = None  # the classic server's; the draft server takes the next one
    ready_timeout: float = READY_TIMEOUT_S
    exact: bool = False  # every server on the exact path (engine.exact), in-process


@dataclass
class ServedLevel:
    """One concurrency level: an engine.ab.Session whose runs are ServedRuns, and what only the
    served path has (first sendings, identity per sending)."""

    concurrency: int
    session: Any  # engine.ab.Session
    identity: dict[str, dict[str, TextIdentity | None]] = field(default_factory=dict)
    short_runs: int = 0  # requests that stopped before max_tokens (EOS or a stop)
    fewest_tokens: int | None = None
    classic_differs: TextIdentity | None = None  # classic's own requests against its first sending


@dataclass
class ServedSession:
    config: ServedConfig
    pair: ServedPair
    levels: list[ServedLevel] = field(default_factory=list)
    reference: Completion | None = None  # classic's first sending
    first_sendings: dict[int, Completion] = field(default_factory=dict)  # width -> its first sending
    # a workload's: request id -> classic's first sending, and -> width -> its first sending
    # (the first request's are ``reference`` and ``first_sendings`` too)
    references: dict[str, Completion] = field(default_factory=dict)
    first_by_request: dict[str, dict[int, Completion]] = field(default_factory=dict)
    servers: dict[str, dict] = field(default_factory=dict)  # role -> argv, pid, ready_s, env
    warnings: list[str] = field(default_factory=list)
    cancelled: bool = False

    def server_record(self) -> dict[str, Any]:
        c = self.config
        return {"program": "mlx_lm.server", "mlx_lm": server_version(),
                "args": list(c.server_args),
                "env": server_env(),  # MLX_* switches the servers inherited (picks kernels)
                "verify_attention": c.verify_attention,  # None: the stock server
                "exact": c.exact,  # every server in-process on the exact path
                "processes": self.servers,
                "first_sending": "a third process with --prompt-cache-size 0 (no request there "
                                 "reuses a cache), one request per width",
                "fixed_length": False,
                "acceptance": "not reported by mlx_lm.server"}


def check_concurrency(levels: Sequence[int]) -> tuple[int, ...]:
    out = tuple(dict.fromkeys(levels))
    for c in out:
        if not 1 <= c <= MAX_CONCURRENCY:
            raise ServedError(f"--concurrency {c}: expected 1..{MAX_CONCURRENCY} concurrent requests")
    if not out:
        raise ServedError("--concurrency: give at least one level, e.g. 1,4,16")
    return out


def run_served(pair: ServedPair, config: ServedConfig, *,
               on_event: Callable[[Any], None] | None = None,
               on_server: Callable[[Server], None] | None = None,
               on_level: Callable[[ServedSession, ServedLevel], None] | None = None,
               cancel: threading.Event | None = None) -> ServedSession:
    """A served A/B session at every concurrency level. Each finished level is handed to
    ``on_level`` at once (so a record is written before the next level can fail); so is the
    level under way when ``cancel`` is set, after the request in flight, with what it kept
    (marked cancelled). Raises ServedError when a server cannot start, load its model, or dies;
    KeyboardInterrupt passes through after every server has stopped (a cancel before any
    timed run was kept is one)."""
    from blockwidth.engine import ab
    from blockwidth.engine.attention import current_backend, effective

    emit = on_event or (lambda e: None)
    cancel = cancel or threading.Event()
    abc = config.ab
    widths = tuple(dict.fromkeys(abc.widths))
    levels = check_concurrency(config.concurrency)
    sends = requests_of(pair, abc)
    ids = list(sends[0][3])
    warm_ids, shift = ab.warmup_prompt(ids, abc.max_tokens, max(widths), pair.context_length)
    warm_prompt = pair.tokenizer.decode(warm_ids) if shift else "\n# warm-up\n" + pair.tokenizer.decode(ids)
    session = ServedSession(config, pair)
    classic_port = config.port
    draft_port = None if config.port is None else config.port + 1
    specs = [
        ServerSpec("classic", pair.target_path, None, config.server_args, config.verify_attention,
                   classic_port, exact=config.exact),
        ServerSpec("draft", pair.target_path, pair.drafter_path, config.server_args,
                   config.verify_attention, draft_port, exact=config.exact),
        # every request there is a first sending: the cache keeps nothing
        ServerSpec("first-sending", pair.target_path, pair.drafter_path,
                   (*config.server_args, "--prompt-cache-size", "0"), config.verify_attention, None,
                   exact=config.exact),
    ]
    backend = current_backend()
    attention = "fused" if config.verify_attention is None else effective(config.verify_attention, backend).value

    with Servers(specs, ready_timeout=config.ready_timeout, on_start=on_server, cancel=cancel) as servers:
        for role, s in servers.servers.items():
            session.servers[role] = {"argv": s.spec.command_line(), "pid": s.pid, "port": s.port,
                                     "ready_s": _r(s.ready_s, 2)}
        if any("Draft model tokenizer does not match" in line for line in servers["draft"].log_tail()):
            session.warnings.append("mlx_lm.server says the draft model's tokenizer does not match the "
                                    "target's")
        total = len(sends) * (len(widths) + 1)
        emit(ab.Event("phase", "first sendings", phase="first sendings", runs=total))
        for k, (rid, payload, max_tokens, _, _) in enumerate(sends):
            ref = complete(servers["classic"], payload, max_tokens, cancel=cancel)
            if ref is None:
                raise KeyboardInterrupt
            session.references[rid] = ref
            if pair.context_length is not None and (ref.prompt_tokens or 0) + max_tokens + max(widths) > pair.context_length:
                raise ServedError(f"{'request ' + rid + ': ' if len(sends) > 1 else ''}prompt {ref.prompt_tokens} "
                                  f"+ --max-tokens {max_tokens} + width {max(widths)} exceeds the target's "
                                  f"context of {pair.context_length} tokens")
            mine = session.first_by_request.setdefault(rid, {})
            for i, w in enumerate(widths):
                first = complete(servers["first-sending"], payload, max_tokens, num_draft_tokens(w), cancel=cancel)
                if first is None:
                    raise KeyboardInterrupt
                mine[w] = first
                emit(ab.Event("phase", f"w{w}", run=k * (len(widths) + 1) + i + 2, runs=total,
                              phase="first sendings"))
        session.reference = session.references[sends[0][0]]
        session.first_sendings = session.first_by_request[sends[0][0]]
        servers.stop("first-sending")  # its memory back before the timed runs

        for level in levels:
            if cancel.is_set():
                break
            lv = _run_level(pair, config, widths, level, servers, session, warm_prompt, shift,
                            attention, backend, emit, cancel, sends)
            if lv.session.cancelled and not any(a.runs for a in (lv.session.classic, *lv.session.arms)):
                raise KeyboardInterrupt  # cancelled before anything was kept: no record of nothing
            session.levels.append(lv)
            if on_level is not None:
                on_level(session, lv)
            if lv.session.cancelled:
                break
    session.cancelled = cancel.is_set()
    return session


def requests_of(pair, abc) -> list[tuple[str, str | list[dict], int, tuple[int, ...], Any]]:
    """What the session sends: (request id, prompt text or chat messages, new tokens, the ids the
    engine path would decode, engine.workload.Prepared or None) per request; without a workload,
    the prompt alone. A chat request goes to the server as messages, rendered there by the same
    chat template (or transcript) that engine.workload.prepare renders with."""
    if abc.workload is None:
        return [("1", abc.prompt, abc.max_tokens, tuple(pair.tokenizer.encode(abc.prompt)), None)]
    from blockwidth.engine.workload import prepare

    out = []
    for p in prepare(abc.workload, pair.tokenizer, abc.max_tokens):
        req = p.request
        payload = [m.to_dict() for m in req.messages] if req.chat else req.prompt
        out.append((p.id, payload, p.max_tokens, p.ids, p))
    return out


def _run_level(pair, config: ServedConfig, widths, level: int, servers: Servers,
               session: ServedSession, warm_prompt: str, shift: int, attention: str, backend: str,
               emit, cancel: threading.Event, sends=None) -> ServedLevel:
    from blockwidth.engine import ab

    abc = config.ab
    sends = sends or requests_of(pair, abc)
    ids = list(sends[0][3])
    control = ab.Verdict.CONTROL
    if abc.workload is None:
        s = ab.Session(abc, ids, ab.Arm(None, verdict=control), [ab.Arm(w) for w in widths],
                       seed=ab.seed_of(abc))
    else:  # as engine.ab.run_session lays out a workload: one request's arms are the session's
        per = [ab.RequestArms(p, ab.Arm(None, verdict=control), [ab.Arm(w) for w in widths])
               for _, _, _, _, p in sends]
        many = len(per) > 1
        classic, arms = ((ab.Arm(None, verdict=control), [ab.Arm(w) for w in widths]) if many
                         else (per[0].classic, per[0].arms))
        s = ab.Session(abc, ids, classic, arms, seed=ab.seed_of(abc), requests=per)
    many = len(s.requests) > 1
    s.backend, s.attention = backend, attention
    s.warmup_shift = shift or 1  # the warm-up's prompt is not the session's: other positions
    s.drafter_kind = "model"
    # each arm's request: what it sends, and whose first sendings it is compared with
    owner = {id(a): (rid, payload, mt) for (rid, payload, mt, _, _), r in zip(sends, s.requests or [None])
             if r is not None for a in [r.classic, *r.arms]}
    first = sends[0][:3]
    lv = ServedLevel(level, s)
    t_start = time.monotonic()
    started = [0]
    emit(ab.Event("session", message=f"concurrency {level}: {len(widths)} widths, n={abc.n}, "
                                     f"{abc.max_tokens} tokens" + (f", {len(sends)} requests" if many else "")))

    def one(arm, rep: int, keep: bool = True, closing: bool = False):
        index = started[0]
        started[0] += 1
        runs = max(abc.planned_runs, started[0])
        rid, payload, max_tokens = owner.get(id(arm), first)
        emit(ab.Event("arm", arm.name, rep, 0, max_tokens, run=index, runs=runs, closing=closing,
                      request=rid if many else ""))
        server = servers["classic" if arm.width is None else "draft"]
        ndt = None if arm.width is None else num_draft_tokens(arm.width)
        got = burst(server, payload if keep else warm_prompt, max_tokens, ndt, level,
                    cancel=cancel)
        if got is None:
            return None
        run = ServedRun(arm.width, got, level)
        if keep:
            ref = session.references.get(rid, session.reference).text
            run.identity = [compare_text(ref, r.text, "cached repeat" if (r.cached_tokens or 0) > 0
                                         else "first sending") for r in got]
            arm.runs.append(run)
            s.order.append(f"{rid}/{arm.name}" if many else arm.name)
            _set_identity(lv, session, arm, rid, key=f"{rid}/{arm.name}" if many else None)
        else:
            s.warmup[arm.name] = run
        emit(ab.Event("progress", arm.name, rep, max_tokens, max_tokens, run=index,
                      runs=runs, closing=closing, request=rid if many else ""))
        return run

    ab.interleave(s, one, cancel=cancel, emit=emit, t_start=t_start)
    s.cancelled = cancel.is_set()
    if many:  # per request, then each width's word over all of them (the first that differs)
        for r in s.requests:
            for arm in r.arms:
                _set_identity(lv, session, arm, r.id, key=f"{r.id}/{arm.name}")
        for arm in s.arms:
            entries = [lv.identity[f"{r.id}/{arm.name}"] for r in s.requests if f"{r.id}/{arm.name}" in lv.identity]
            lv.identity[arm.name] = {k: next((e[k] for e in entries if e.get(k) is not None and not e[k].identical),
                                             next((e[k] for e in entries if e.get(k) is not None), None))
                                     for k in dict.fromkeys(k for e in entries for k in e)}
            ids_ = [r.arm(arm.width).identity for r in s.requests if r.arm(arm.width).identity is not None]
            arm.identity = next((i for i in ids_ if not i.identical), ids_[0] if ids_ else None)
    else:
        for arm in s.arms:
            _set_identity(lv, session, arm, sends[0][0])
    classic_diff = [i for r in s.classic.runs for i in r.identity if not i.identical]
    lv.classic_differs = classic_diff[0] if classic_diff else None
    done = [q for a in (s.classic, *s.arms) for r in a.runs for q in r.requests]
    short = [q for q in done if q.tokens < abc.max_tokens]
    lv.short_runs, lv.fewest_tokens = len(short), min((q.tokens for q in short), default=None)
    ab.decide(s)
    s.elapsed_s = time.monotonic() - t_start
    emit(ab.Event("cancelled" if s.cancelled else "done", message=f"concurrency {level}: {s.decision}"))
    return lv


def _set_identity(lv: ServedLevel, session: ServedSession, arm, rid: str | None = None,
                  key: str | None = None) -> None:
    """An arm's identity: its first sending's and its timed requests' (which repeat the prompt and
    hit the prompt cache) against classic's first sending; the first that differs stands for the
    arm, as the engine path's first differing run does. ``rid``: the workload request the arm
    runs (its own reference and first sendings); ``key``: its name in ``lv.identity``."""
    ref = session.references.get(rid, session.reference).text if rid else session.reference.text
    first = ((session.first_by_request.get(rid) if rid else None) or session.first_sendings).get(arm.width)
    first_id = compare_text(ref, first.text, "first sending") if first is not None else None
    timed = [i for r in arm.runs for i in r.identity]
    cached = [i for i in timed if i.sending == "cached repeat"]
    fresh = [i for i in timed if i.sending == "first sending"]
    cached_id = next((i for i in cached if not i.identical), cached[0] if cached else None)
    entry: dict[str, TextIdentity | None] = {"first_sending": first_id, "cached_repeat": cached_id}
    if fresh:
        entry["timed_first_sending"] = next((i for i in fresh if not i.identical), fresh[0])
    lv.identity[key or arm.name] = entry
    ids = [i for i in (first_id, *timed) if i is not None]
    arm.identity = next((i for i in ids if not i.identical), ids[0] if ids else None)


def level_warnings(session: ServedSession, lv: ServedLevel) -> list[str]:
    """What only the served path can flatter or hide, beside the engine's warnings."""
    out = list(session.warnings)
    mt = session.config.ab.max_tokens
    if lv.short_runs:
        out.append(f"the server stops at EOS: {lv.short_runs} request(s) ended before {mt} tokens "
                   f"(fewest {lv.fewest_tokens}); their tok/s are of the tokens produced (the "
                   f"engine path runs fixed lengths)")
    if lv.classic_differs is not None:
        out.append(f"classic at concurrency {lv.concurrency} is not classic's first sending: "
                   f"{lv.classic_differs.describe()}")
    per_request = any("/" in name for name in lv.identity)  # a workload's: said per request only
    differs = {name: e for name, e in lv.identity.items() if "/" in name or not per_request
               if any(i is not None and not i.identical for i in e.values())}
    for name, e in differs.items():
        which = [k.replace("_", " ") for k, i in e.items() if i is not None and not i.identical]
        out.append(f"{name}: mlx_lm.server's text differs from classic's ({', '.join(which)})")
    if lv.concurrency > 1 and session.config.exact:
        out.append(f"on the exact path every server serves one request at a time (batched decode "
                   f"masks by array, which the rows kernel does not take): classic's "
                   f"{lv.concurrency} clients queue as the widths' do")
    elif lv.concurrency > 1:
        out.append(f"mlx_lm.server serves requests one at a time when a draft model is loaded "
                   f"(is_batchable = draft_model is None): the widths' {lv.concurrency} clients "
                   f"queue, classic's are batched")
    return out


def level_record(session: ServedSession, lv: ServedLevel, host: dict, gate: dict | None) -> dict:
    """The engine path's record of this level's session, with what the served path adds."""
    from blockwidth.engine.session import record

    rec = record.build(lv.session, session.pair, host, gate, route=PATH_SERVER)
    rec["concurrency"] = lv.concurrency
    rec["server"] = session.server_record()
    rec["warnings"] = rec["warnings"] + level_warnings(session, lv)
    for arm in rec["arms"]:
        arm["served_identity"] = {k: (i.to_dict() if i is not None else None)
                                  for k, i in lv.identity.get(arm["arm"], {}).items()}
        runs = next(a for a in [lv.session.classic, *lv.session.arms] if a.name == arm["arm"]).runs
        reqs = [q for r in runs for q in r.requests]
        arm["ttft_s"] = _range([q.ttft_s for q in reqs if q.ttft_s is not None])
        arm["latency_s"] = _range([q.e2e_s for q in reqs])
        arm["aggregate_tok_s"] = _range([r.aggregate_tok_s for r in runs])
        arm["request_decode_tok_s"] = _range([q.decode_tok_s for q in reqs])
    ref = session.reference
    rec["served"] = {
        "verdict_figure": ("decode tok/s of the request (stream token times, time to first token "
                           "excluded)" if lv.concurrency == 1 else
                           f"aggregate tok/s of {lv.concurrency} concurrent requests (their tokens "
                           f"over the burst's wall time)"),
        "reference": {"arm": "classic", "sending": "first sending", "tokens": ref.tokens,
                      "cached_tokens": ref.cached_tokens, "text_head": ref.text[:200]},
        "first_sendings": {f"w{w}": dict(c.summary(), identical=c.text == ref.text)
                           for w, c in session.first_sendings.items()},
        "short_runs": lv.short_runs,
    }
    if session.config.ab.workload is not None:  # each request's own reference and first sendings
        rec["served"]["requests"] = {
            rid: {"reference": {"tokens": c.tokens, "cached_tokens": c.cached_tokens, "text_head": c.text[:200]},
                  "first_sendings": {f"w{w}": dict(f.summary(), identical=f.text == c.text)
                                     for w, f in session.first_by_request.get(rid, {}).items()}}
            for rid, c in session.references.items()}
    return rec


def _range(values: list[float]) -> list[float] | None:
    if not values:
        return None
    return [round(min(values), 4), round(statistics.median(values), 4), round(max(values), 4)]
