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

from blockwidth.console.inputs import CLI_NAMES, CONSOLE_NAMES, InputError, user_path  # noqa: F401 (the field names)
from blockwidth.policy.auto import AUTO
from blockwidth.policy.integers import IntegerError, parse_int, shorten
from blockwidth.policy.profile import MAX_WIDTH, MIN_WIDTH

MAX_PROMPT_BYTES = 4 << 20  # far beyond any context this engine runs; bounds a read of /dev/zero
PATH_MAX = 4096  # Linux's longest path: a workload's path (@FILE) is shown whole up to it

KINDS = ("model", "lookup", "dflash", "mtp", "eagle")


class Field(str, Enum):
    WIDTHS = "widths"
    N = "n"
    TOKENS = "tokens"
    PROMPT = "prompt"
    PROMPT_FILE = "prompt file"
    MAX_REPS = "max reps"
    MAX_SECONDS = "max seconds"


class FieldError(InputError):
    """One field is wrong: its value and the problem; the front end words the field's name
    (``say(CLI_NAMES)``: ``-n 0: must be at least 1``; ``say(CONSOLE_NAMES)``: ``n field 0: ...``)."""

    def __init__(self, field: Field, value: object, problem: str, limit: int = 80) -> None:
        self.field, self.value, self.problem = field, value, problem
        v = value
        self.shown = ("" if v is None else f" {shorten(repr(v), limit)}" if field is Field.WIDTHS
                      else f" {shorten(v, limit)}")
        super().__init__(f"{self.shown}: {problem}".lstrip(), field.value)

    def say(self, names: Mapping[str, str] | None = None) -> str:
        word = (names or {}).get(self.field.value) or self.field.value
        return f"{word}{self.shown}: {self.problem}"  # the value between the name and the problem


@dataclass(frozen=True)
class SessionRequest:
    widths: tuple[int | str, ...]
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
    from blockwidth.engine.workload import prepare
    from blockwidth.policy.workload import WorkloadError, read

    ref = req.workload
    shown = f"@{ref}"
    if not ref:
        raise FieldError(Field.PROMPT, req.prompt, "name a workload after @: @mixed, or @FILE (JSONL)")
    try:
        w = read(ref, flag="@")
        prepared = prepare(w, pair.tokenizer, req.tokens, where=shown)
    except WorkloadError as e:
        # The field's value names the workload, whole where it can name a file (a path's file
        # name is at its end); the reader's message names it too: said once, not twice.
        raise FieldError(Field.PROMPT, shown, _unnamed(str(e), ref, shown),
                         limit=PATH_MAX if len(shown) <= PATH_MAX else 80) from None
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


def _unnamed(said: str, ref: str, shown: str) -> str:
    """A workload reader's message (``@ PATH: problem``; prepare's ``@REF: problem``) without
    the name it starts with."""
    from blockwidth.policy.files import FileProblem, user_path

    names = [shown, f"@ {ref}"]
    try:
        names.append(f"@ {user_path(ref, '@')}")
    except FileProblem:
        pass
    for name in names:
        if said.startswith(f"{name}: "):
            return said[len(name) + 2:]
    return said[2:] if said.startswith("@ ") else said


def literal_prompt(prompt: str) -> str:
    """The prompt text itself: a leading ``@@`` stands for ``@``."""
    return prompt[1:] if prompt.startswith("@@") else prompt


def parse_widths(text: str) -> tuple[int | str, ...]:
    """Widths such as ``2,4,8``; ``auto`` is one more arm (a width per round, policy.auto)."""
    out: list[int | str] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            raise FieldError(Field.WIDTHS, text, "empty: give widths such as 2,4,8"
                             if not str(text).strip() else "an empty entry between commas")
        if part.lower() == AUTO:
            out.append(AUTO)
            continue
        try:
            w = parse_int(part, MIN_WIDTH, MAX_WIDTH, signed=False)
        except IntegerError as e:
            if not e.out_of_range:
                raise FieldError(Field.WIDTHS, text,
                                 f"{shorten(repr(part))} is not an integer (nor auto)") from None
            raise FieldError(Field.WIDTHS, text, f"width {e.shown} is out of range; each width is "
                                                 f"{MIN_WIDTH}..{MAX_WIDTH}"
                                                 + (" (width 1 is classic, which every session runs)"
                                                    if e.shown.strip() == "1" else "")) from None
        out.append(w)
    return tuple(dict.fromkeys(out))


# The session's bounds, the CLI's flags and the console's fields alike (a tryout: the console
# took n 99999999999999999999 and offered to run it for 2.9e19 minutes; the CLI said 1..100)
MAX_N = 100
MAX_TOKENS = 65536  # then bounded by the target's context
MAX_REPS = 1000
MAX_SECONDS = 86400.0


def _count(field: Field, value: str | int, most: int) -> int:
    try:
        return parse_int(value, 1, most, signed=False)
    except IntegerError as e:
        if not e.out_of_range and not str(value).strip().startswith("-"):
            raise FieldError(field, value, f"must be a whole number 1..{most}") from None
        raise FieldError(field, value, f"must be 1..{most}") from None


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
    if not math.isfinite(secs) or secs <= 0 or secs > MAX_SECONDS:
        raise FieldError(Field.MAX_SECONDS, max_seconds, f"must be a number above 0, at most {MAX_SECONDS:.0f}")
    return SessionRequest(ws, _count(Field.N, n, MAX_N), _count(Field.TOKENS, tokens, MAX_TOKENS), prompt,
                          sequential, _count(Field.MAX_REPS, max_reps, MAX_REPS), secs)


def check_fits(req: SessionRequest, prompt_tokens: int, context: int | None) -> None:
    """The prompt and the new tokens must fit the target's context (found before any run)."""
    if context is not None and prompt_tokens + req.tokens > context:
        raise FieldError(Field.TOKENS, req.tokens,
                         f"the prompt's {prompt_tokens} tokens + {req.tokens} new exceed the target's "
                         f"context of {context}; at most {max(context - prompt_tokens, 0)}")


def read_prompt(prompt: str | None, prompt_file: str | None) -> str:
    """``--prompt`` or ``--prompt-file`` (not both, read bounded); the demo prompt without either."""
    from blockwidth.engine.demo.prompts import DEFAULT_PROMPT
    from blockwidth.policy import files

    if prompt is not None and prompt_file is not None:
        raise InputError("give --prompt or --prompt-file, not both")
    if prompt_file is not None:
        p = user_path(prompt_file, Field.PROMPT_FILE.value)
        try:
            return files.read_text(p, MAX_PROMPT_BYTES)
        except files.FileProblem as e:
            raise e.about(Field.PROMPT_FILE.value) from None
    if prompt is None:
        return DEFAULT_PROMPT
    try:
        # An argument that is not UTF-8 reaches Python as lone surrogates, which no tokenizer
        # takes (a TypeError from deep inside it); --prompt-file says where the bad byte is.
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InputError(f"not valid UTF-8 (a byte that is not text at character {e.start}, counting "
                         f"from 0); pass the text as UTF-8, or in a file with --prompt-file",
                         Field.PROMPT.value) from None
    return prompt


def add_pair_args(p: argparse.ArgumentParser, draft_required: bool = False) -> None:
    p.add_argument("--target", metavar="T", help="target checkpoint folder or Hugging Face repo id (default: the demo pair)")
    p.add_argument("--draft", metavar="D", required=draft_required,
                   help="drafter checkpoint folder or repo id (none: the model-free lookup drafter)")
    p.add_argument("--kind", choices=KINDS, help="drafter kind; wins over detection")
    p.add_argument("--demo-target", choices=("bf16", "4bit"), default=None,
                   help="which demo target when --target is not given (default bf16; with --target, an error)")


def add_verify_attention(p: argparse.ArgumentParser, *, served: bool = False) -> None:
    """``--verify-attention``, as every command and lab tool that decodes declares it: one default,
    one help, and the choices checked as the arguments are parsed, so a bad name stops before any
    model loads (the modes are engine.attention's). ``served``: for ``serve``, where not giving it
    means the stock mlx_lm.server and giving it runs the server in-process with the dispatcher."""
    from blockwidth.engine.attention import CHOICES, VerifyAttention

    if served:
        p.add_argument("--verify-attention", choices=CHOICES, default=None,
                       help="run mlx_lm.server in-process with blockwidth's verify-attention dispatcher "
                            "in this mode (auto: plain on CUDA; on CPU and Metal a no-op route); "
                            "default: the stock mlx_lm.server")
        return
    p.add_argument("--verify-attention", choices=CHOICES, default=VerifyAttention.AUTO.value,
                   help="attention of verify forwards (2..64 rows against the KV cache): auto = "
                        "plain on CUDA (no per-length cuDNN plan), fused elsewhere")


def add_verify_linear(p: argparse.ArgumentParser) -> None:
    """``--verify-linear``, declared once as ``--verify-attention`` is (engine.linear's modes)."""
    from blockwidth.engine.linear import CHOICES, VerifyLinear

    p.add_argument("--verify-linear", choices=CHOICES, default=VerifyLinear.AUTO.value,
                   help="projections of verify forwards: auto = stock (or qmv where a committed "
                        "measurement has it winning); gather keeps 2..64-row 16-bit projections "
                        "off cuBLAS on CUDA; gemv sends 2..8-row ones to a kernel that reads the "
                        "weights once for all rows, qmv 2..8-row affine 4- and 8-bit ones (CUDA; "
                        "engine/linear.py)")


def add_exact(p: argparse.ArgumentParser) -> None:
    """``--exact``, declared once (engine.exact's modes)."""
    from blockwidth.engine.exact import CHOICES, Exact

    p.add_argument("--exact", choices=CHOICES, default=Exact.AUTO.value,
                   help="the exact path: every forward of 1..16 rows, classic's steps too, "
                        "row-invariant so a width's output is classic's byte for byte (CUDA: each "
                        "verify row computed as MLX's 1-row step, or every forward on the engine's "
                        "kernels, whichever the session timed cheaper; auto = on where every op of "
                        "the pair is covered, with the reason said; on a CPU the stock kernels "
                        "already are)")


def integer(lo: int, hi: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: ASCII digits only (int() also reads '1_0' and Arabic-Indic digits),
    within [lo, hi]; ``why`` says where the bound comes from."""
    def parse(text: str) -> int:
        try:
            return parse_int(text, lo, hi)
        except IntegerError as e:
            if not e.out_of_range:
                raise argparse.ArgumentTypeError(f"{shorten(repr(text))} is not an integer (ASCII digits only)") from None
            raise argparse.ArgumentTypeError(f"{e.shown} is out of range {lo}..{hi}"
                                             + (f" ({why})" if why else "")) from None
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
            raise argparse.ArgumentTypeError(f"{shorten(repr(text))} is not a number of seconds") from None
        if not math.isfinite(v) or v < lo or v > hi or (open_low and v == lo):
            low = f"more than {lo:g}" if open_low else f"at least {lo:g}"
            raise argparse.ArgumentTypeError(f"{shorten(repr(text))}: expected {low} and at most {hi:g} seconds")
        return v
    return parse
