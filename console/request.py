"""What an A/B session is asked to do, parsed once for the CLI and the console.

The pair flags (``--target``, ``--draft``, ``--kind``, ``--demo-target``) and the
session fields (widths, n, tokens, prompt, sequential budget) are checked here.
A bad field raises ``FieldError``, which knows *which* field it is about, so each
front end names it in its own words (``--max-tokens`` on the command line, the
``tokens`` field in the console). No Textual, no MLX.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Mapping

from console.inputs import InputError, user_path
from policy.profile import MAX_WIDTH, MIN_WIDTH

MAX_PROMPT_BYTES = 4 << 20  # far beyond any context this engine runs; bounds a read of /dev/zero

KINDS = ("model", "lookup", "dflash", "mtp", "eagle")


class Field(str, Enum):
    WIDTHS = "widths"
    N = "n"
    TOKENS = "tokens"
    PROMPT = "prompt"
    PROMPT_FILE = "prompt file"
    MAX_REPS = "max reps"
    MAX_SECONDS = "max seconds"


CLI_NAMES: Mapping[Field, str] = {
    Field.WIDTHS: "--widths", Field.N: "-n", Field.TOKENS: "--max-tokens", Field.PROMPT: "--prompt",
    Field.PROMPT_FILE: "--prompt-file", Field.MAX_REPS: "--max-reps", Field.MAX_SECONDS: "--max-seconds",
}
CONSOLE_NAMES: Mapping[Field, str] = {f: f"{f.value} field" for f in Field}


class FieldError(InputError):
    """One field is wrong. ``str()`` words it for the command line; ``say`` for another front end."""

    def __init__(self, field: Field, value: object, problem: str) -> None:
        self.field, self.value, self.problem = field, value, problem
        super().__init__(self.say(CLI_NAMES))

    def say(self, names: Mapping[Field, str]) -> str:
        v = self.value
        shown = "" if v is None else f" {v!r}" if self.field is Field.WIDTHS else f" {v}"
        return f"{names[self.field]}{shown}: {self.problem}"


@dataclass(frozen=True)
class SessionRequest:
    widths: tuple[int, ...]
    n: int
    tokens: int
    prompt: str
    sequential: bool = False
    max_reps: int = 12
    max_seconds: float = 600.0

    @property
    def workload(self) -> str | None:
        """The workload the prompt names (``@mixed``, ``@FILE``), or None for a prompt."""
        return workload_ref(self.prompt)

    def settings(self) -> str:
        """The one settings line the console and the record's readers see."""
        mode = (f"sequential up to {self.max_reps} reps / {self.max_seconds:g} s" if self.sequential
                else "fixed n")
        what = f"workload {self.workload}" if self.workload else f"prompt {len(literal_prompt(self.prompt))} chars"
        return (f"widths {','.join(map(str, self.widths))} · n {self.n} · {self.tokens} tokens · {mode}"
                f" · {what}")


def workload_ref(prompt: str) -> str | None:
    """The console's prompt field names a workload with a leading ``@`` (``@mixed``, the built-in;
    ``@~/traffic.jsonl``, a file); ``@@`` starts a prompt that begins with ``@``."""
    if prompt.startswith("@") and not prompt.startswith("@@"):
        return prompt[1:].strip()
    return None


def read_workload(req: SessionRequest, pair):
    """The workload the console's prompt field names, read, rendered for ``pair`` and checked
    against its context; FieldError (the prompt field) names what is wrong."""
    from engine.workload import prepare
    from policy.workload import WorkloadError, read

    ref = req.workload
    shown = f"@{ref}"
    if not ref:
        raise FieldError(Field.PROMPT, req.prompt, "name a workload after @: @mixed, or @FILE (JSONL)")
    try:
        w = read(ref, flag="@")
        prepared = prepare(w, pair.tokenizer, req.tokens, where=shown if w.builtin else w.source)
    except WorkloadError as e:
        text = str(e)
        raise FieldError(Field.PROMPT, shown, text[2:] if text.startswith("@ ") else text) from None
    ctx = pair.context_length
    # what the tokens field may be: the longest request that takes it bounds it
    most = min((ctx - len(p.ids) for p in prepared if p.request.max_tokens is None), default=0) if ctx else 0
    for p in prepared:
        if ctx is not None and len(p.ids) + p.max_tokens > ctx:
            said = (f"request {p.id} (line {p.request.line}) of {shown}: its {len(p.ids)} prompt tokens "
                    f"+ {p.max_tokens} new exceed the target's context of {ctx}")
            if p.request.max_tokens is None:  # the tokens field set them: that is the one to fix
                raise FieldError(Field.TOKENS, req.tokens, f"{said}; at most {max(most, 0)} for every "
                                                           f"request of it")
            raise FieldError(Field.PROMPT, shown, said + " (its own max_tokens)")
    return w


def literal_prompt(prompt: str) -> str:
    """The prompt text itself: a leading ``@@`` stands for ``@``."""
    return prompt[1:] if prompt.startswith("@@") else prompt


def parse_widths(text: str) -> tuple[int, ...]:
    out = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            raise FieldError(Field.WIDTHS, text, "empty: give widths such as 2,4,8"
                             if not str(text).strip() else "an empty entry between commas")
        if not part.isascii() or not part.isdigit():  # int() also reads '1_0' and '٤'
            raise FieldError(Field.WIDTHS, text, f"{part!r} is not an integer")
        w = int(part)
        if not MIN_WIDTH <= w <= MAX_WIDTH:
            raise FieldError(Field.WIDTHS, text,
                             f"width {w} is out of range; each width is {MIN_WIDTH}..{MAX_WIDTH}")
        out.append(w)
    return tuple(dict.fromkeys(out))


def _count(field: Field, value: str | int, least: int = 1) -> int:
    t = str(value).strip()
    if not t.isascii() or not t.isdigit():  # int() also reads '1_0' and non-ASCII digits
        raise FieldError(field, value, "must be a whole number")
    v = int(t)
    if v < least:
        raise FieldError(field, value, f"must be at least {least}")
    return v


def session_request(*, widths: str, n: str | int, tokens: str | int, prompt: str,
                    sequential: bool = False, max_reps: str | int = 12,
                    max_seconds: str | float = 600.0) -> SessionRequest:
    """Every session field checked; the first bad one raises ``FieldError``."""
    ws = parse_widths(widths)
    if not prompt:
        raise FieldError(Field.PROMPT, None, "empty; the session needs a prompt to continue")
    try:
        secs = float(max_seconds)
    except ValueError:
        raise FieldError(Field.MAX_SECONDS, max_seconds, "must be a number") from None
    if not math.isfinite(secs) or secs <= 0:
        raise FieldError(Field.MAX_SECONDS, max_seconds, "must be a finite number above 0")
    return SessionRequest(ws, _count(Field.N, n), _count(Field.TOKENS, tokens), prompt, sequential,
                          _count(Field.MAX_REPS, max_reps), secs)


def check_fits(req: SessionRequest, prompt_tokens: int, context: int | None) -> None:
    """The prompt and the new tokens must fit the target's context (found before any run)."""
    if context is not None and prompt_tokens + req.tokens > context:
        raise FieldError(Field.TOKENS, req.tokens,
                         f"the prompt's {prompt_tokens} tokens + {req.tokens} new exceed the target's "
                         f"context of {context}; at most {max(context - prompt_tokens, 0)}")


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """``--prompt`` or ``--prompt-file`` (not both, read bounded); the demo prompt without either."""
    from engine.demo.prompts import DEFAULT_PROMPT
    from policy import files

    if prompt is not None and prompt_file is not None:
        raise InputError("give --prompt or --prompt-file, not both")
    if prompt_file is not None:
        p = user_path(prompt_file, "--prompt-file")
        try:
            return files.read_text(p, MAX_PROMPT_BYTES)
        except files.FileProblem as e:
            raise InputError(f"--prompt-file {e}") from None
    return prompt if prompt is not None else DEFAULT_PROMPT


def add_pair_args(p: argparse.ArgumentParser, draft_required: bool = False) -> None:
    p.add_argument("--target", metavar="T", help="target checkpoint folder or Hugging Face repo id (default: the demo pair)")
    p.add_argument("--draft", metavar="D", required=draft_required,
                   help="drafter checkpoint folder or repo id (none: the model-free lookup drafter)")
    p.add_argument("--kind", choices=KINDS, help="drafter kind; wins over detection")
    p.add_argument("--demo-target", choices=("bf16", "4bit"), default="bf16",
                   help="which demo target when --target is not given (default bf16)")


def integer(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: ASCII digits only (int() also reads '1_0' and Arabic-Indic digits),
    within [lo, hi]; ``why`` says where the bound comes from."""
    def parse(text: str) -> int:
        t = text.strip()
        digits = t[1:] if t[:1] in "+-" else t
        if not digits or not digits.isascii() or not digits.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer (ASCII digits only)")
        v = int(t)
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{v} is out of range {lo}..{hi}" + (f" ({why})" if why else ""))
        return v
    return parse


def seconds(lo: float, hi: float, *, open_low: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds in [lo, hi] (or (lo, hi] with open_low)."""
    def parse(text: str) -> float:
        t = text.strip()
        try:
            if not t.isascii() or "_" in t:  # float() also reads '1_0' and non-ASCII digits
                raise ValueError
            v = float(t)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(v) or v < lo or v > hi or (open_low and v == lo):
            low = f"more than {lo:g}" if open_low else f"at least {lo:g}"
            raise argparse.ArgumentTypeError(f"{text!r}: expected {low} and at most {hi:g} seconds")
        return v
    return parse
