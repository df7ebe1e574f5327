"""A workload made ready for a pair: each request's prompt token ids, as a server would make them.

``prompt`` is encoded as mlx_lm.server encodes a completion's prompt; ``messages`` go through
the target tokenizer's chat template with the generation prompt added, as mlx_lm.server does
for a chat completion. A tokenizer without a chat template is refused for a file's
``messages``; the built-in workload, which must run on any pair, falls back there to
mlx_lm.server's own plain transcript (``convert_chat``), and says so.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from blockwidth.policy.workload import Request, Workload, WorkloadError

PROMPT = "prompt"
TEMPLATE = "chat template"
TRANSCRIPT = "plain transcript (no chat template: mlx_lm.server's fallback)"


@dataclass(frozen=True)
class Prepared:
    request: Request
    ids: tuple[int, ...]
    max_tokens: int
    rendered: str  # PROMPT, TEMPLATE or TRANSCRIPT

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def sha256(self) -> str:
        """Of the token ids the target saw: a chat request's hash follows its rendering."""
        return hashlib.sha256(",".join(map(str, self.ids)).encode("ascii")).hexdigest()

    def to_dict(self) -> dict:
        return {"id": self.id, "line": self.request.line, "kind": "chat" if self.request.chat else "prompt",
                "rendered": self.rendered, "prompt_tokens": len(self.ids), "max_tokens": self.max_tokens,
                "sha256": self.sha256, "text_head": self.request.head(120),
                **({"class": self.request.group} if self.request.group is not None else {})}


def _where(workload: Workload) -> str:
    return f"built-in workload {workload.name}" if workload.builtin else f"--workload {workload.source}"


def prepare(workload: Workload, tokenizer, max_tokens: int, where: str | None = None) -> list[Prepared]:
    """Every request's ids and new-token count (its own ``max_tokens``, else ``max_tokens``).
    Raises WorkloadError naming the request's line (after ``where``: the workload as the front
    end names it; by default as the command line does)."""
    out = []
    where = where or _where(workload)
    has_template = bool(getattr(tokenizer, "has_chat_template", False))
    for req in workload.requests:
        at = f"{where}: line {req.line} (id {req.id})"
        if not req.chat:
            ids, how = list(tokenizer.encode(req.prompt)), PROMPT
        elif has_template:
            try:
                ids = list(tokenizer.apply_chat_template([m.to_dict() for m in req.messages],
                                                         add_generation_prompt=True))
            except Exception as e:  # a template may raise anything (jinja's TemplateError, ...)
                raise WorkloadError(f"{at}: the target's chat template failed on these messages "
                                    f"({type(e).__name__}: {' '.join(str(e).split())})") from None
            how = TEMPLATE
        elif workload.builtin:
            from mlx_lm.server import convert_chat

            ids, how = list(tokenizer.encode(convert_chat([m.to_dict() for m in req.messages]))), TRANSCRIPT
        else:
            raise WorkloadError(f"{at}: \"messages\" need a chat template, and the target's tokenizer "
                                f"has none; give this request as \"prompt\" text")
        if not ids:
            raise WorkloadError(f"{at}: renders to no tokens")
        out.append(Prepared(req, tuple(int(i) for i in ids), req.max_tokens or max_tokens, how))
    return out


def file_item(req: Request, tokenizer) -> dict:
    """``req`` as a line of a workload file that gives the target the same ids: a chat request
    for a tokenizer without a chat template (which only the built-in workload may run, through
    mlx_lm.server's plain transcript) is written as that transcript's "prompt" text, since a
    file's "messages" need a template."""
    item: dict = {"id": req.id}
    if req.chat and not getattr(tokenizer, "has_chat_template", False):
        from mlx_lm.server import convert_chat

        item["prompt"] = convert_chat([m.to_dict() for m in req.messages])
    elif req.chat:
        item["messages"] = [m.to_dict() for m in req.messages]
    else:
        item["prompt"] = req.prompt
    if req.max_tokens is not None:
        item["max_tokens"] = req.max_tokens
    return item

