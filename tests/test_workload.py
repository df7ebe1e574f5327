"""Workloads: the JSONL reader, the built-in mixed workload, chat-template rendering, bad files,
and a real workload session on the demo pair through ``sweep --workload``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from policy import workload
from policy.workload import WorkloadError

DEMO = ROOT / "engine" / "demo" / "pair"


def _write(path: Path, rows) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows),
                    encoding="utf-8")
    return path


# ---- the reader --------------------------------------------------------------------------------

def test_workload_file_round_trip(tmp_path):
    rows = [{"prompt": "def f(x):\n    return", "id": "f"},
            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12},
            "",  # a blank line holds no request
            {"prompt": "line with \u2028 inside", "id": 7}]
    path = _write(tmp_path / "w.jsonl", rows)
    w = workload.read(str(path))
    assert w.name == "w.jsonl" and w.source == str(path.resolve())
    assert [r.id for r in w.requests] == ["f", "2", "7"]  # no id: its line number
    assert [r.line for r in w.requests] == [1, 2, 4]
    assert w.requests[0].prompt == rows[0]["prompt"] and w.requests[0].max_tokens is None
    assert w.requests[1].chat and w.requests[1].messages[0].to_dict() == rows[1]["messages"][0]
    assert w.requests[1].max_tokens == 12
    assert w.requests[2].prompt == "line with \u2028 inside"
    import hashlib

    assert w.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert w.to_dict() == {"name": "w.jsonl", "source": str(path.resolve()), "sha256": w.sha256,
                           "requests": 3}
    assert workload.find(w.name, w.source, w.sha256) == w
    path.write_text(path.read_text() + '{"prompt": "one more"}\n')
    assert workload.find(w.name, w.source, w.sha256) is None  # changed since: not the same workload


def test_builtin_mixed_has_every_kind():
    w = workload.read("mixed")
    assert w.builtin and 14 <= len(w.requests) <= 18
    ids = [r.id for r in w.requests]
    for kind in ("code", "prose", "chat", "repeat", "long"):
        assert any(i.startswith(kind) for i in ids), kind
    assert sum(r.chat for r in w.requests) >= 3
    assert workload.find("mixed", "builtin", w.sha256) == w


def _fifo(tmp_path):
    p = tmp_path / "fifo.jsonl"
    os.mkfifo(p)
    return p


def _big(tmp_path):
    p = tmp_path / "big.jsonl"
    with open(p, "wb") as f:
        f.truncate(10 * 1000 * 1000)  # 10 MB, sparse
    return p


@pytest.mark.parametrize("make, needle", [
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": oops}']),
     "line 3: not valid JSON"),
    (lambda d: _write(d / "w.jsonl", []), "empty; expected one JSON request a line"),
    (lambda d: _write(d / "w.jsonl", ["", "  "]), "empty"),
    (_fifo, "is a FIFO, not a regular file"),
    (_big, "9.5 MiB is over the 4 MiB limit"),
    (lambda d: d / "missing.jsonl", "no such file"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "temperature": 0}']), "line 1: unknown key 'temperature'"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "messages": []}']), "not both"),
    (lambda d: _write(d / "w.jsonl", ['{"id": "x"}']), "no \"prompt\" or \"messages\""),
    (lambda d: _write(d / "w.jsonl", ['["a"]']), "line 1: a list; a request is an object"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": ""}']), "\"prompt\" is empty"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "max_tokens": 0}']), "\"max_tokens\" 0 must be"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "max_tokens": true}']), "\"max_tokens\" true"),
    (lambda d: _write(d / "w.jsonl", ['{"messages": [{"role": "user"}]}']), "message 1 must be"),
    (lambda d: _write(d / "w.jsonl", ['{"messages": [{"role": "user", "content": [1]}]}']),
     "\"content\" is a list, not a string"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "id": "x"}', '{"prompt": "b", "id": "x"}']),
     "line 2: id 'x' is also line 1's"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a"}'] * (workload.MAX_REQUESTS + 1)),
     f"more than {workload.MAX_REQUESTS} requests"),
    (lambda d: _write(d / "w.jsonl", [""] * workload.MAX_LINES), f"over {workload.MAX_LINES} lines"),
])
def test_bad_workload_is_one_line(tmp_path, make, needle):
    path = make(tmp_path)
    with pytest.raises(WorkloadError) as e:
        workload.read(str(path))
    text = str(e.value)
    assert needle in text
    assert "\n" not in text and text.startswith(f"--workload {path}")


def test_bad_bytes_and_unknown_builtin():
    with pytest.raises(WorkloadError, match="not UTF-8 text"):
        workload.parse(b'{"prompt": "\xff"}\n', "w", "w", "w")
    with pytest.raises(WorkloadError, match="empty path"):
        workload.read("")


# ---- preparing requests for a pair -------------------------------------------------------------

def _tokenizer(path: Path):
    from mlx_lm.tokenizer_utils import load

    return load(path)


def _templated_copy(tmp_path) -> Path:
    """The demo target with a chat template in its tokenizer config (a tmp copy)."""
    dst = tmp_path / "target-chat"
    shutil.copytree(DEMO / "target-bf16", dst)
    cfg = json.loads((dst / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg))
    return dst


def test_chat_request_renders_with_the_chat_template(tmp_path):
    from engine.workload import PROMPT, TEMPLATE, prepare

    tok = _tokenizer(_templated_copy(tmp_path))
    w = workload.read(str(_write(tmp_path / "w.jsonl", [
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "def f():"}]},
        {"prompt": "def g():", "max_tokens": 9}])))
    chat, plain = prepare(w, tok, 16)
    assert chat.rendered == TEMPLATE and plain.rendered == PROMPT
    expected = "<|system|>Be brief.\n<|user|>def f():\n<|assistant|>"
    assert tok.decode(list(chat.ids)) == expected
    assert (chat.max_tokens, plain.max_tokens) == (16, 9)
    assert list(plain.ids) == tok.encode("def g():")


def test_chat_request_refused_without_a_chat_template(tmp_path):
    from engine.workload import TRANSCRIPT, prepare

    tok = _tokenizer(DEMO / "target-bf16")
    assert not tok.has_chat_template
    path = _write(tmp_path / "w.jsonl", [{"prompt": "x"}, {"messages": [{"role": "user", "content": "hi"}], "id": "q"}])
    with pytest.raises(WorkloadError) as e:
        prepare(workload.read(str(path)), tok, 8)
    assert str(e.value) == (f"--workload {path.resolve()}: line 2 (id q): \"messages\" need a chat template, "
                            "and the target's tokenizer has none; give this request as \"prompt\" text")
    # the built-in runs on any pair: its chat requests fall back to mlx_lm.server's transcript
    mixed = prepare(workload.builtin("mixed"), tok, 8)
    assert {p.rendered for p in mixed if p.request.chat} == {TRANSCRIPT}
