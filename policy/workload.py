"""Workloads: the requests a session runs, read from JSONL or built in.

One request a line: ``{"prompt": "..."}`` or ``{"messages": [{"role": ..., "content": ...}]}``
(rendered later with the target tokenizer's chat template, as a server would), with optional
``"max_tokens"`` (new tokens for that request), ``"id"`` and ``"class"`` (the kind of request it
is, the operator's label: a session gives each class's speed-up its own interval). The file is read bounded (size,
line count) through ``policy.files``, and every problem is one line naming the line it is on.
Parsing is pure; ``read`` is the thin door to the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from blockwidth.policy import files
from blockwidth.policy.errors import BlockwidthError

MAX_WORKLOAD_BYTES = 4 * files.MiB
MAX_REQUESTS = 512  # lines with a request; a session runs every arm on every one of them
MAX_LINES = 4 * MAX_REQUESTS  # blank lines included: bounds the scan before any JSON is parsed
MAX_NEW_TOKENS = 65536  # as sweep's --max-tokens
KEYS = ("prompt", "messages", "max_tokens", "id", "class")
MAX_ID_CHARS = 200  # a request id names it in tables and error lines
MAX_CLASS_CHARS = 40  # a class names a line of the session's summary
BUILTIN = ("mixed", "chat")  # names --workload takes besides a file (chat: chat-template requests)


class WorkloadError(BlockwidthError, ValueError):
    """A workload that cannot be used; str() is the one line to show (where, what is wrong)."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def to_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Request:
    id: str
    prompt: str | None = None
    messages: tuple[Message, ...] | None = None
    max_tokens: int | None = None  # None: the session's
    line: int = 0  # 1-based line in its file
    group: str | None = None  # its "class": the kind of request, as the operator labels it

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def head(self, chars: int = 60) -> str:
        """A short view of the request for tables: its prompt's start, or the last user turn."""
        text = self.prompt if self.prompt is not None else next(
            (m.content for m in reversed(self.messages or ()) if m.role == "user"),
            self.messages[-1].content if self.messages else "")
        flat = " ".join(text.split())
        return flat if len(flat) <= chars else flat[:chars - 1] + "…"


@dataclass(frozen=True)
class Workload:
    name: str  # a built-in's name, or the file's name
    requests: tuple[Request, ...]
    sha256: str  # of the bytes it was read from
    source: str  # "builtin" or the file's path

    @property
    def builtin(self) -> bool:
        return self.source == "builtin"

    def describe(self) -> str:
        chats = sum(r.chat for r in self.requests)
        return (f"workload {self.name}: {len(self.requests)} request{'s' if len(self.requests) != 1 else ''}"
                + (f" ({chats} chat)" if chats else "") + f", sha256 {self.sha256[:12]}")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "sha256": self.sha256,
                "requests": len(self.requests)}


def single(prompt: str, name: str = "prompt") -> Workload:
    """One prompt as a workload of one request (what --prompt and the console's text are)."""
    return Workload(name, (Request("1", prompt=prompt, line=1),),
                    hashlib.sha256(prompt.encode("utf-8")).hexdigest(), "prompt")


_TYPES = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
          float: "a number", type(None): "null"}


def _quoted(v: Any, limit: int = 60, as_json: bool = True) -> str:
    """A value as an error line quotes it (JSON, or Python's repr), short: a 1 MB id made a 1 MB
    line."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10 ** 60:
        return "(a number of more than 60 digits)"
    text = json.dumps(v) if as_json else repr(v)
    return text if len(text) <= limit else text[:limit - 4] + "..." + text[-1]


def _what(v: Any) -> str:
    return _TYPES.get(type(v), "a value")


def _request(item: Any, where: str, line: int) -> Request:
    def bad(problem: str) -> WorkloadError:
        return WorkloadError(f"{where}: line {line}: {problem}")

    if not isinstance(item, dict):
        raise bad(f"{_what(item)}; a request is an object with \"prompt\" or \"messages\"")
    unknown = [k for k in item if k not in KEYS]
    if unknown:
        raise bad(f"unknown key {unknown[0]!r} (a request takes {', '.join(KEYS)})")
    has_p, has_m = "prompt" in item, "messages" in item
    if has_p == has_m:
        raise bad("give \"prompt\" or \"messages\", not both" if has_p
                  else "no \"prompt\" or \"messages\"")
    prompt = messages = None
    if has_p:
        prompt = item["prompt"]
        if not isinstance(prompt, str):
            raise bad(f"\"prompt\" is {_what(prompt)}, not a string")
        if not prompt:
            raise bad("\"prompt\" is empty")
    else:
        raw = item["messages"]
        if not isinstance(raw, list) or not raw:
            raise bad("\"messages\" must be a non-empty list of {\"role\", \"content\"} objects")
        out = []
        for i, m in enumerate(raw, 1):
            if not isinstance(m, dict) or set(m) - {"role", "content"} or "role" not in m or "content" not in m:
                raise bad(f"message {i} must be an object with \"role\" and \"content\" only")
            if not isinstance(m["role"], str) or not m["role"]:
                raise bad(f"message {i}: \"role\" must be a non-empty string")
            if not isinstance(m["content"], str):
                raise bad(f"message {i}: \"content\" is {_what(m['content'])}, not a string")
            out.append(Message(m["role"], m["content"]))
        messages = tuple(out)
    max_tokens = item.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or not 1 <= max_tokens <= MAX_NEW_TOKENS):
        raise bad(f"\"max_tokens\" {json.dumps(max_tokens)} must be a whole number 1..{MAX_NEW_TOKENS}")
    rid = item.get("id", str(line))
    if isinstance(rid, bool) or not isinstance(rid, (str, int)) or rid == "":
        raise bad(f"\"id\" {_quoted(rid)} must be a non-empty string or a number")
    if len(str(rid)) > MAX_ID_CHARS:  # an id names a request in tables and error lines
        raise bad(f"\"id\" {_quoted(rid)} has {len(str(rid)):,} characters; at most {MAX_ID_CHARS}")
    group = item.get("class")
    if group is not None and (not isinstance(group, str) or not group.strip() or len(group) > MAX_CLASS_CHARS
                              or any(not ch.isprintable() for ch in group)):
        raise bad(f"\"class\" {_quoted(group)} must be a name of 1..{MAX_CLASS_CHARS} printable characters")
    return Request(str(rid), prompt, messages, max_tokens, line, group)


def parse(data: bytes, where: str, name: str, source: str) -> Workload:
    """The workload in ``data`` (JSONL bytes), or WorkloadError naming ``where`` and the line."""
    if data.count(b"\n") >= MAX_LINES:
        raise WorkloadError(f"{where}: over {MAX_LINES} lines; a workload holds at most "
                            f"{MAX_REQUESTS} requests")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise WorkloadError(f"{where}: not UTF-8 text (at byte offset {e.start}, counting from 0)") from None
    requests: list[Request] = []
    seen: dict[str, int] = {}
    # split on newlines only: splitlines() also breaks at U+2028, which JSON strings may hold
    for line, raw in enumerate(text.split("\n"), 1):
        if not raw.strip():
            continue  # a blank line (a trailing one, or between groups) holds no request
        if len(requests) == MAX_REQUESTS:
            raise WorkloadError(f"{where}: more than {MAX_REQUESTS} requests (line {line})")
        try:
            item = files.loads_json(raw, f"line {line}")
        except files.FileProblem as e:
            raise WorkloadError(f"{where}: {e}") from None
        req = _request(item, where, line)
        if req.id in seen:
            raise WorkloadError(f"{where}: line {line}: id {_quoted(req.id, as_json=False)} is also "
                                f"line {seen[req.id]}'s")
        seen[req.id] = line
        requests.append(req)
    if not requests:
        raise WorkloadError(f"{where}: empty; expected one JSON request a line "
                            f"({{\"prompt\": ...}} or {{\"messages\": [...]}})")
    return Workload(name, tuple(requests), hashlib.sha256(data).hexdigest(), source)


def builtin(name: str) -> Workload:
    """A workload shipped with the package (package data: policy/workloads/NAME.jsonl)."""
    if name not in BUILTIN:
        raise WorkloadError(f"no built-in workload {name!r} (built in: {', '.join(BUILTIN)})")
    data = (resources.files("blockwidth.policy") / "workloads" / f"{name}.jsonl").read_bytes()
    return parse(data, f"built-in workload {name}", name, "builtin")


def read(value: str | os.PathLike, flag: str = "--workload") -> Workload:
    """``--workload``'s value: a built-in's name or a JSONL file. Raises WorkloadError whose
    text starts with ``flag``."""
    text = os.fspath(value)
    if text in BUILTIN:
        return builtin(text)
    try:
        path = files.user_path(text, flag)
        data = files.read_bytes(path, MAX_WORKLOAD_BYTES)
    except files.FileProblem as e:
        said = str(e)
        raise WorkloadError(said if said.startswith(flag) else f"{flag} {said}") from None
    return parse(data, f"{flag} {path}", Path(path).name, str(Path(path).resolve()))


def find(name: str, source: str, sha256: str) -> Workload | None:
    """The workload an entry's evidence names, if it is here with the same content."""
    try:
        got = builtin(name) if source == "builtin" else read(source)
    except WorkloadError:
        return None
    return got if got.sha256 == sha256 else None
