"""Workloads: the JSONL reader, the built-in mixed workload, chat-template rendering, bad files,
and a real workload session on the demo pair through ``sweep --workload``."""

from __future__ import annotations

import json
import re
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from blockwidth.policy import workload
from blockwidth.policy.workload import WorkloadError

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
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "class": 3}']), "\"class\" 3 must be a name"),
    (lambda d: _write(d / "w.jsonl", ['{"prompt": "a", "class": " "}']), "\"class\" \" \" must be a name"),
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
    from blockwidth.engine.workload import PROMPT, TEMPLATE, prepare

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
    from blockwidth.engine.workload import TRANSCRIPT, prepare

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


# ---- a real workload session on the demo pair, through sweep --workload ------------------------

def test_sweep_workload_end_to_end(tmp_path, blockwidth):
    """Three requests (two prompts, one chat through a chat template) on the demo pair with a
    templated tokenizer: every arm runs every request, interleaved with the arms rotated per
    request, classic closing with a pass; identity per request; each width's ratio, interval and
    p-value in --json; the record reproduces its intervals from its own samples and seed."""
    from blockwidth.console.inputs import resolution
    from blockwidth.engine.session import record
    from blockwidth.policy import stats

    target = _templated_copy(tmp_path)
    wl = _write(tmp_path / "w.jsonl", [
        {"id": "a", "prompt": "class Stack:\n    def __init__(self):\n        self"},
        {"id": "b", "prompt": "def read_config(path):\n    result = {}\n    with open(path) as f:\n        for",
         "max_tokens": 8},
        {"id": "c", "messages": [{"role": "user", "content": "def main():"}]}])
    p = blockwidth("sweep", "--target", str(target), "--draft", str(DEMO / "drafter"), "--workload", str(wl),
                   "--widths", "2,3", "-n", "2", "--max-tokens", "12", "--seed", "7", "--json",
                   "--record-dir", str(tmp_path / "rec"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["workload"]["requests"] == 3 and d["workload"]["sha256"] == workload.read(str(wl)).sha256
    assert [r["id"] for r in d["requests"]] == ["a", "b", "c"]
    assert [r["rendered"] for r in d["requests"]] == ["prompt", "prompt", "chat template"]
    # the widths given, then the width in effect for this pair when it is not among them (issue
    # 25: the answer an operator gets is always measured)
    in_effect = resolution(target=str(target), draft=str(DEMO / "drafter"), kind=None, flag=None,
                           device=None, profile=None, profile_missing_ok=True)[0].engine_width
    widths = [2, 3] + ([in_effect] if in_effect not in (None, 2, 3) else [])
    assert [a["width"] for a in d["arms"][1:]] == widths
    names = [f"w{w}" for w in widths]
    # interleaved: every request in each pass, the widths' order rotated request by request,
    # and a closing classic pass
    one_pass = [f"{rid}/{arm}" for k, rid in enumerate("abc")
                for arm in ["classic", *names[k % len(names):], *names[:k % len(names)]]]
    assert one_pass[:3] == ["a/classic", "a/w2", "a/w3"] and one_pass[len(names) + 2] == "b/w3"
    assert d["order"] == one_pass * 2 + ["a/classic", "b/classic", "c/classic"]
    for r in d["requests"]:
        counts = {a["arm"]: len(a["samples"]) for a in r["arms"]}
        assert counts == {"classic": 3, **{n: 2 for n in names}}
        assert all(s["tokens"] == (8 if r["id"] == "b" else 12) for a in r["arms"] for s in a["samples"])
        assert all(a["identity"]["identical_ids"] for a in r["arms"][1:])  # CPU: bitwise exact
    # the session's arms are per pass: every request's tokens in one sample
    assert [len(a["samples"]) for a in d["arms"]] == [3] + [2] * len(widths)
    assert all(s["tokens"] == 12 + 8 + 12 for a in d["arms"] for s in a["samples"])
    assert d["stats"]["seed"] == 7 and d["stats"]["min_gain"] == 0.03
    rec = record.load(Path(d["record_path"]))
    again = record.reproduce(rec)
    for a in d["arms"][1:]:
        est = again[a["width"]]
        assert (a["ratio"], a["ratio_ci"], a["p_value"]) == (round(est.ratio, 4), est.ci.to_list(), round(est.p, 6))
        identical = not a["differs_on"]
        # the verdict is the interval rule's, in both directions
        if a["verdict"] == "wins":
            assert est.ci.lo > 1.03 and identical
        elif a["verdict"] == "slower":
            assert est.ci.hi < 1
        elif a["verdict"] == "below min gain":
            assert 1 <= est.ci.hi < 1.03
        else:
            assert a["verdict"] == "undecided" and est.ci.lo <= 1.03 <= est.ci.hi
    # the point ratio is the ratio of aggregates over every request and run
    classic, arms = record.stats_samples(rec)
    assert d["arms"][1]["ratio"] == round(stats.ratio(arms[2], classic), 4)
    # and the record's samples are what it reproduces from: change one and the interval moves
    rec["requests"][0]["arms"][1]["samples"][0]["decode_s"] *= 3
    assert record.reproduce(rec)[2] != again[2]
    assert (tmp_path / "rec" / Path(d["record_path"]).name).exists()


def test_a_workload_s_classes_each_get_their_own_interval(tmp_path, blockwidth):
    """Requests labelled with a "class": each class's speed-up with its own interval, drawn as the
    workload's are, printed and recorded (a workload whose kinds disagree is undecided as a
    whole: this says which kind a width served). Without two classes, nothing of the kind."""
    w = _write(tmp_path / "w.jsonl", [
        json.dumps({"id": "a1", "class": "code", "prompt": "def add(a, b):\n    return a + b\n\ndef add(a, b):"}),
        json.dumps({"id": "a2", "class": "code", "prompt": "def sub(a, b):\n    return a - b\n\ndef sub(a, b):"}),
        json.dumps({"id": "b1", "class": "prose", "prompt": "The cat sat on the mat. The cat sat on the"})])
    rec = tmp_path / "rec"
    p = blockwidth("sweep", "--kind", "lookup", "--widths", "2", "-n", "2", "--max-tokens", "4",
                   "--workload", str(w), "--record-dir", str(rec))
    assert p.returncode in (0, 1), p.stderr
    lines = p.stdout.splitlines()
    at = lines.index("by class of request (each its own interval, not a verdict):")
    assert re.fullmatch(r"  code \(2 requests\): w2 [\d.]+x \[[\d.]+, [\d.]+\], w4 [\d.]+x \[[\d.]+, [\d.]+\]",
                        lines[at + 1]), lines[at + 1]
    assert lines[at + 2].startswith("  prose (1 request): w2 ")
    record = json.loads(next(rec.glob("*.json")).read_text())
    assert record["classes"]["code"]["requests"] == ["a1", "a2"] and set(record["classes"]["prose"]["widths"]) == {"2", "4"}
    assert [r.get("class") for r in record["requests"]] == ["code", "code", "prose"]
    one = _write(tmp_path / "one.jsonl", [json.dumps({"class": "code", "prompt": "x = 1\nx = 1\nx ="}),
                                          json.dumps({"prompt": "y = 2\ny = 2\ny ="})])
    p = blockwidth("sweep", "--kind", "lookup", "--widths", "2", "-n", "2", "--max-tokens", "4",
                   "--workload", str(one), "--record-dir", str(rec))
    assert "by class" not in p.stdout


def test_sweep_workload_text_shows_the_requests_and_the_interval(tmp_path, blockwidth):
    wl = _write(tmp_path / "w.jsonl", [{"id": "first", "prompt": "def f(x):\n    return"},
                                       {"id": "second", "prompt": "import os\n\n\ndef main():\n   "}])
    p = blockwidth("sweep", "--workload", str(wl), "--widths", "2", "-n", "1", "--max-tokens", "6",
                   "--seed", "1", "--record-dir", str(tmp_path / "rec"))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "workload w.jsonl: 2 requests" in out
    assert "per request (prompt tokens; classic decode tok/s; each width's speed-up there):" in out
    assert "\\nper request" not in out  # a blank line above it, not an escaped newline (seen in the real models' records)
    assert any(line.startswith("first ") for line in out.splitlines())
    assert "best width per request:" in out
    assert "95 % bootstrap interval resampling requests, then runs, seed 1" in out
    assert "per-request speed-up by width" in out and "ratio above is over all tokens" in out
    # the plot's value is the median request's, named so beside the verdict's ratio
    assert "the figure is the median request's" in out
    w2 = [line for line in out.splitlines() if line.startswith("w2 ") and "best on" in line]
    assert w2 and all(len(line) <= 76 for line in w2), w2  # whole at 80 columns (the console's too)
    assert "decision:" in out and "record:" in out


@pytest.mark.parametrize("args, needle", [
    (("--workload", "mixed", "--prompt", "x"), "give --workload or --prompt, not both"),
    (("--min-gain", "3"), "'3': expected a gain from 0 up to 1 (0 % to 100 %) (did you mean 3%?)"),
    (("--min-gain", "x%"), "is not a fraction (0.03) or a percentage (3%)"),
    (("--workload", "nope.jsonl"), "--workload nope.jsonl: no such file"),
])
def test_sweep_workload_bad_input_exit_2(args, needle, tmp_path, blockwidth):
    p = blockwidth("sweep", "-n", "1", "--max-tokens", "4", "--record-dir", str(tmp_path), *args)
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_sweep_refuses_bad_json_on_line_3_and_chat_without_a_template(tmp_path, blockwidth):
    bad = _write(tmp_path / "bad.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": "c",}'])
    p = blockwidth("sweep", "--workload", str(bad), "--record-dir", str(tmp_path / "rec"))
    assert p.returncode == 2 and "line 3: not valid JSON" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "rec").exists()
    chat = _write(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"}], "id": "q"}])
    p = blockwidth("sweep", "--workload", str(chat), "-n", "1", "--record-dir", str(tmp_path / "rec"))
    assert p.returncode == 2 and "line 1 (id q): \"messages\" need a chat template" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


# ---- the tie rule and the evidence on fixed figures ------------------------------------------------

def _fixed_session(speeds: dict, classic_tok_s=(40.0, 41.5, 42.0, 40.5), workload_=None):
    """A session judged by the real decide, from fixed timings on the demo tokenizer."""
    from blockwidth.engine.ab import AbConfig, Arm, Session, Verdict, decide
    from blockwidth.engine.identity import compare
    from tests.states import CONTINUATION, DEFAULT_PROMPT, TOKENS, _run, demo_pair

    tok = demo_pair().tokenizer
    out = tok.encode(CONTINUATION)[:TOKENS]
    config = AbConfig(widths=tuple(speeds), prompt=DEFAULT_PROMPT, n=3, max_tokens=TOKENS, seed=3,
                      workload=workload_)
    classic = Arm(None, [_run(None, v, out) for v in classic_tok_s], verdict=Verdict.CONTROL)
    arms = [Arm(w, [_run(w, v, out) for v in vs]) for w, vs in speeds.items()]
    s = Session(config, tok.encode(DEFAULT_PROMPT), classic, arms, reps=3, started_at=0.0, seed=3)
    for arm in arms:
        arm.identity = compare(classic.runs[0].tokens, arm.runs[0].tokens, tok)
    decide(s)
    return s


def test_session_tie_rule_chooses_the_smaller_width_on_fixed_figures():
    """w2 and w4 both win (disjoint, intervals above 1.03); w4 is a little faster, but the
    intervals overlap: width 2 is chosen, and the why-line says why."""
    s = _fixed_session({2: [60.0, 61.0, 62.5], 4: [60.5, 62.0, 63.0], 8: [30.0, 31.0, 33.0]})
    assert [a.verdict.value for a in s.arms] == ["wins", "wins", "slower"]
    assert s.estimates[4].ratio > s.estimates[2].ratio and s.estimates[2].ci.overlaps(s.estimates[4].ci)
    assert s.recommendation == 2 and s.choice.best == 4
    assert s.why.startswith("width 2 at 1.")
    assert "smallest winning width whose interval overlaps the best's (w4" in s.why
    # far apart, the faster one stays
    s = _fixed_session({2: [44.0, 45.0, 46.0], 4: [60.0, 62.0, 63.0]})
    assert s.recommendation == 4 and s.why.startswith("width 4 is the fastest winner")


def test_disjoint_but_below_the_minimum_gain_is_not_a_win():
    """Slowest 42.3 beats classic's fastest 42.0 (the old rule's win), but about 1.01x: below min
    gain, which saves as a decline; with --min-gain 0 the same figures win."""
    from blockwidth.console.outcome import Tone, headline

    s = _fixed_session({2: [42.3, 42.4, 42.5]}, classic_tok_s=(41.9, 42.0, 41.95, 41.9))
    assert s.estimates[2].ci.hi < 1.03
    assert s.arms[0].verdict.value == "below min gain" and s.recommendation is None
    assert "lies below 1 + the 3 % minimum gain" in s.arms[0].why
    h = headline(s)
    assert h.saveable and h.tone is Tone.PLAIN and "no measured width clears the 3% minimum gain" in h.text
    import dataclasses

    from blockwidth.engine.ab import decide

    s.config = dataclasses.replace(s.config, min_gain=0.0)
    decide(s)
    assert s.arms[0].verdict.value == "wins" and s.recommendation == 2


def test_profile_entry_keeps_the_workload_and_interval_through_toml(tmp_path):
    from blockwidth.console import profile_file
    from blockwidth.console.outcome import PairFacts, profile_entry
    from blockwidth.policy import profile as profiles
    from blockwidth.policy.device import parse_device_spec
    from tests.states import demo_pair

    w = workload.builtin("mixed")
    s = _fixed_session({4: [60.0, 62.0, 63.0]}, workload_=w)
    pair = demo_pair()
    e = profile_entry(s, PairFacts(pair.kind, pair.quantization, pair.pair_id), parse_device_spec("cpu"),
                      mlx="0.32.4", measured_at="2026-01-01T00:00:00Z", record="r.json")
    assert e.width == 4
    path = tmp_path / "p.toml"
    profile_file.save(path, e)
    back = profiles.load(path).entries[0].evidence
    assert back["workload"] == {"name": "mixed", "source": "builtin", "sha256": w.sha256,
                                "requests": len(w.requests)}
    assert back["ratio_ci"] == s.estimates[4].ci.to_list() and back["seed"] == 3
    assert back["min_gain"] == 0.03


def test_check_measure_replays_the_entrys_workload(tmp_path):
    """The workload an entry names is found again when its content is the same (the built-in, or
    the file at its path); a changed file is said, and the check falls back to a prompt."""
    from blockwidth.console.check import _workload_for
    from blockwidth.policy.profile import Entry

    def entry(evidence):
        e = Entry.__new__(Entry)
        object.__setattr__(e, "evidence", evidence)
        return e

    w = workload.builtin("mixed")
    got, where = _workload_for(entry({"workload": w.to_dict()}))
    assert got == w and where.startswith("the entry's workload: workload mixed: 16 requests")
    f = _write(tmp_path / "w.jsonl", [{"prompt": "a"}])
    fw = workload.read(str(f))
    assert _workload_for(entry({"workload": fw.to_dict()}))[0] == fw
    f.write_text('{"prompt": "b"}\n')
    got, where = _workload_for(entry({"workload": fw.to_dict()}))
    assert got is None and "is not here with sha256" in where
    assert _workload_for(entry({})) == (None, "")


def _fixed_workload(ratios: list[float], widths=(2, 3, 4, 6, 8)):
    """A workload session from fixed timings: request k runs classic at 40 tok/s and width w at
    40 x ratios[k] x (1 - 0.01 w); judged by the real decide."""
    from blockwidth.engine.ab import AbConfig, Arm, RequestArms, Session, Verdict, _add_pass, decide
    from blockwidth.engine.identity import compare
    from blockwidth.engine.workload import PROMPT, Prepared
    from blockwidth.policy.workload import Request, Workload
    from tests.states import CONTINUATION, DEFAULT_PROMPT, TOKENS, _run, demo_pair

    tok = demo_pair().tokenizer
    out = tok.encode(CONTINUATION)[:TOKENS]
    reqs = tuple(Request(f"request-{k}", prompt=DEFAULT_PROMPT, line=k + 1) for k in range(len(ratios)))
    w = Workload("fixed", reqs, "0" * 64, "builtin")
    config = AbConfig(widths=widths, prompt="", n=3, max_tokens=TOKENS, seed=5, workload=w)
    ids = tuple(tok.encode(DEFAULT_PROMPT))
    per = []
    for k, r in enumerate(ratios):
        classic = Arm(None, [_run(None, v, out) for v in (40.0, 40.4, 39.8, 40.2)], verdict=Verdict.CONTROL)
        arms = [Arm(x, [_run(x, 40 * r * (1 - 0.01 * x) * f, out) for f in (0.99, 1.0, 1.01)]) for x in widths]
        for a in arms:
            a.identity = compare(classic.runs[0].tokens, a.runs[0].tokens, tok)
        per.append(RequestArms(Prepared(reqs[k], ids, TOKENS, PROMPT), classic, arms))
    s = Session(config, list(ids), Arm(None, verdict=Verdict.CONTROL), [Arm(x) for x in widths],
                requests=per, reps=3, started_at=0.0, seed=5)
    for _ in range(4):
        _add_pass(s, [None, *widths])
    for a in s.arms:
        a.identity = per[0].arm(a.width).identity
    decide(s)
    return s


def test_workload_verdict_is_the_intervals_and_the_table_folds_to_80_columns():
    from blockwidth.console.render import ratio_rows, request_table

    s = _fixed_workload([1.6, 1.5, 1.7, 1.4, 1.55, 1.65, 1.45, 1.5])
    assert [len(a.runs) for a in [s.classic, *s.arms]] == [4, 3, 3, 3, 3, 3]  # one run per pass
    assert all(a.verdict.value == "wins" for a in s.arms)
    # w2 is fastest (the width costs 1 % a step here) and w3's interval overlaps it: the tie
    # rule keeps the smaller, here the fastest itself
    assert s.recommendation == s.choice.width == 2
    table = request_table(s, fold=2)
    assert all(len(line) <= 80 for line in table), max(table, key=len)
    rows = [line for line in table if line.startswith("request-")]
    # the 2 best (1.7x, 1.65x) and 2 worst (1.4x, 1.45x) by w2, in their workload order
    assert [r.split()[0] for r in rows] == ["request-2", "request-3", "request-5", "request-6"]
    assert "4 more requests between the 2 worst and 2 best by w2" in table[-2]
    assert table[-1] == "best width per request: w2 on 8"
    assert [r[0] for r in ratio_rows(s)] == ["w2", "w3", "w4", "w6", "w8"]
    # a count of requests out of how many ("best on 0" read as a value)
    assert [r[4] for r in ratio_rows(s)][:2] == ["best on 8/8 requests", "best on 0/8 requests"]
    # a request whose output differs takes the win away from the whole workload
    from blockwidth.engine.ab import decide

    bad = s.requests[3].arm(2)
    bad.identity = type(bad.identity)(**{**bad.identity.to_dict(), "identical_ids": False, "first_divergence": 2})
    decide(s)
    assert s.arm(2).verdict.value == "faster, output differs" and s.differing_requests(2) == ["request-3"]
    assert s.recommendation == 3


def test_workload_mixed_requests_make_a_wide_interval():
    """Half the requests gain 1.6x, half lose (0.7x): the aggregate may favour the width, but
    drawing requests again could give either: undecided, not a win."""
    s = _fixed_workload([1.6, 0.7, 1.6, 0.7, 1.6, 0.7], widths=(2,))
    e = s.estimates[2]
    assert e.ci.lo < 1.03 < e.ci.hi and s.arms[0].verdict.value == "undecided"
    assert "the interval straddles 1 + the 3 % minimum gain" in s.arms[0].why


def test_check_measure_replays_the_workload_an_entry_was_decided_on(tmp_path, blockwidth):
    """A decline of width 32 on the 4-bit demo target (about 4x slower than classic on a CPU),
    decided on a two-request workload: --check --measure runs that workload again, both
    requests, and the interval rule finds width 32 still slower."""
    from tests.test_check import CPU_4BIT, MLX, by_name, write_profile

    wl = _write(tmp_path / "w.jsonl", [{"id": "one", "prompt": "def f(x):\n    return", "max_tokens": 8},
                                       {"id": "two", "prompt": "import os\n\n\ndef main():\n   ", "max_tokens": 8}])
    w = workload.read(str(wl))
    p = write_profile(tmp_path, CPU_4BIT + f'decline = true\nmlx = "{MLX}"\n'
                      f'evidence = {{ widths = [32], workload = {{ name = "{w.name}", source = "{w.source}", '
                      f'sha256 = "{w.sha256}", requests = 2 }} }}\n')
    r = blockwidth("--check", "--measure", "--device", "cpu", "--demo-target", "4bit", "-n", "2",
                   "--profile", str(p), "--record-dir", str(tmp_path / "rec"), "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    m = by_name(json.loads(r.stdout))["measure: target-4bit + drafter"]
    assert m["status"] == "pass", m
    assert m["figures"]["prompt"].startswith("the entry's workload: workload w.jsonl: 2 requests")
    assert m["figures"]["workload"]["sha256"] == w.sha256
    assert m["figures"]["arms"]["w32"]["verdict"] == "slower" and m["figures"]["arms"]["w32"]["ratio_ci"][1] < 1
    rec = json.loads(Path(m["figures"]["record"]).read_text())
    assert [q["id"] for q in rec["requests"]] == ["one", "two"]


@pytest.mark.slow
def test_sweep_builtin_mixed_headless_json(tmp_path, blockwidth):
    """What the GPU host runs, at its smallest: the built-in workload, headless, --json and a
    record (every request, the chat ones through mlx_lm.server's transcript on the demo pair)."""
    p = blockwidth("sweep", "--workload", "mixed", "--widths", "2", "-n", "1", "--max-tokens", "4",
                   "--json", "--record-dir", str(tmp_path / "rec"))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    w = workload.builtin("mixed")
    assert d["workload"] == w.to_dict() and len(d["requests"]) == len(w.requests)
    assert {r["rendered"] for r in d["requests"] if r["kind"] == "chat"} == \
        {"plain transcript (no chat template: mlx_lm.server's fallback)"}
    assert d["arms"][1]["ratio_ci"] and d["stats"]["seed"] is not None
    assert Path(d["record_path"]).is_file()


# ---- the console: the prompt field takes a workload ------------------------------------------------

def test_console_prompt_field_runs_a_workload_and_folds_its_requests_at_80x24(tmp_path):
    """@FILE in the prompt field runs the workload; at 80x24 the details fold the requests to the
    worst and best, the plot is each width's per-request speed-up. A bad workload is one line
    in the console's words, with the prompt field marked."""
    import asyncio

    from textual.widgets import Input

    from blockwidth.console.app import BlockwidthApp, Options
    from tests.test_app import _settle, _text, _type_fields

    rows = [{"id": f"r{k}", "prompt": p, "max_tokens": 6} for k, p in enumerate(
        ["def f(x):\n    return", "import os\n\n\ndef main():\n   ", "class A:\n    def __init__(self):\n        self",
         "for i in range(10):\n   ", "x = [1, 2, 3]\ny ="])]
    wl = _write(tmp_path / "w.jsonl", rows)
    bad = _write(tmp_path / "bad.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": c}'])

    async def go():
        app = BlockwidthApp(Options(device="cpu", profile=str(tmp_path / "p.toml"), record_dir=str(tmp_path / "rec")))
        async with app.run_test(size=(80, 24)) as pilot:
            await _settle(app, pilot)
            assert app.query_one("#prompt", Input).value == "@mixed"  # the default: the built-in workload
            app.query_one("#prompt", Input).value = f"@{bad}"
            await _type_fields(pilot, "2", "1", "6")
            await pilot.press("enter")
            await _settle(app, pilot)
            err = _text(app, "#error")
            assert f"prompt field @{bad}: line 3: not valid JSON" in err and "--" not in err
            assert err.count("bad.jsonl") == 1  # the path once, whole, however long tmp_path is
            assert app.query_one("#prompt", Input).has_class("-bad") and app.session is None
            app.query_one("#prompt", Input).value = f"@{wl}"
            await _type_fields(pilot, "2", "1", "6")
            await pilot.press("enter")
            await _settle(app, pilot)
            s = app.session
            assert s is not None and len(s.requests) == 5 and s.workload.name == "w.jsonl"
            assert "workload " in _text(app, "#settings")
            assert "speed-up per request" in _text(app, "#plot")
            details = _text(app, "#details")
            assert "per request (prompt tokens; classic decode tok/s" in details
            assert "1 more request between the 2 worst and 2 best" in details
            assert "95 % bootstrap interval" in details
            # Identity: } picks the next request; ] another width keeps it (it reset to the first)
            widths = [a.width for a in s.arms if a.runs]
            assert len(widths) >= 2, widths
            await pilot.press("2")  # the Identity tab
            app.show_identity(widths[0], 0)
            await pilot.press("right_curly_bracket", "right_curly_bracket")
            await pilot.pause()
            assert app._selected_request == 2
            await pilot.press("right_square_bracket")
            await pilot.pause()
            assert app._selected_width == widths[1] and app._selected_request == 2  # every text identical
            await pilot.resize_terminal(140, 40)
            await pilot.pause()
            assert "more requests between" not in _text(app, "#details")  # room for all of them
            await pilot.press("q")

    asyncio.run(go())


def test_the_committed_cpu_workload_record_reproduces_its_intervals():
    """lab/records/workload-mixed-cpu-demo: the built-in workload on the demo pair (CPU); its
    intervals and p-values come back from its own samples and seed."""
    import gzip

    from blockwidth.engine.session import record

    rec = json.load(gzip.open(ROOT / "lab" / "records" / "workload-mixed-cpu-demo.json.gz"))
    assert rec["workload"]["name"] == "mixed" and len(rec["requests"]) == rec["workload"]["requests"] == 16
    again = record.reproduce(rec)
    for a in rec["arms"][1:]:
        est = again[a["width"]]
        assert (a["ratio"], a["ratio_ci"], a["p_value"]) == (round(est.ratio, 4), est.ci.to_list(), round(est.p, 6))


def test_a_one_request_workload_records_its_request_not_the_demo_prompt(tmp_path, capsys):
    """A --workload of one request recorded the built-in demo prompt as its prompt and
    `requests: null`. Its request is recorded as a workload's are, its rounds once."""
    from blockwidth.console.cli import main
    from blockwidth.engine.session import record

    wl = _write(tmp_path / "one.jsonl", [{"id": "only", "prompt": "def area(r):\n    return"}])
    assert main(["sweep", "--workload", str(wl), "--widths", "2", "-n", "1", "--max-tokens", "4",
                 "--record-dir", str(tmp_path / "rec"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    rec = record.load(Path(d["record_path"]))
    assert [r["id"] for r in rec["requests"]] == ["only"] and rec["workload"]["requests"] == 1
    assert rec["prompt"]["text_head"] == "def area(r): return"  # the request's head, not the demo prompt
    assert rec["prompt"]["tokens"] == rec["requests"][0]["prompt_tokens"]
    # the rounds are kept once, in the session's arms (which are this request's)
    assert all("rounds_detail" not in s for a in rec["requests"][0]["arms"] for s in a["samples"])
    assert all("rounds_detail" in s for a in rec["arms"] for s in a["samples"])
    assert record.reproduce(rec)[2].ratio > 0


def test_runs_without_decode_time_leave_no_interval_and_keep_the_session():
    """A served width whose stream sent every token in one chunk has no decode time;
    the interval's 'no decode time to divide by' ended the sweep (exit 2, the runs lost). Now
    the session stands on its ranges and says, in one warning, why there is no interval."""
    from blockwidth.engine.session import record
    from blockwidth.engine.ab import AbConfig, Arm, Session, Verdict, decide
    from blockwidth.engine.decode import DecodeRun
    from blockwidth.engine.identity import compare
    from tests.states import CONTINUATION, DEFAULT_PROMPT, TOKENS, _run, demo_pair

    pair = demo_pair()
    tok = pair.tokenizer
    out = tok.encode(CONTINUATION)[:TOKENS]
    config = AbConfig(widths=(2,), prompt=DEFAULT_PROMPT, n=3, max_tokens=TOKENS, seed=3)
    classic = Arm(None, [_run(None, v, out) for v in (40.0, 41.0, 40.5, 41.5)], verdict=Verdict.CONTROL)
    at_once = Arm(2, [DecodeRun(2, list(out), 20, 0.3, 0.0, []) for _ in range(3)])
    s = Session(config, tok.encode(DEFAULT_PROMPT), classic, [at_once], reps=3, started_at=0.0, seed=3)
    at_once.identity = compare(out, out, tok)
    decide(s)  # raised StatsError before
    assert s.estimates == {} and s.no_interval == "no decode time to divide by"
    (line,) = [w for w in s.warnings() if w.startswith("no speed-up interval")]
    assert "w2 had runs whose tokens all came at once" in line and "every run is in the record" in line
    rec = record.build(s, pair, host={})
    assert line in rec["warnings"] and len(rec["arms"][1]["samples"]) == 3


def test_the_console_lists_each_class_a_width_a_line():
    """At 80 columns the plot's lines are cut at the edge: the console gives each width its line."""
    from types import SimpleNamespace

    from blockwidth.console.render import class_lines
    from blockwidth.policy.stats import Estimate, Interval

    est = {w: Estimate(1.21, Interval(1.02, 1.4), 0.01, "exact", 0.05) for w in (2, 3, 4)}
    s = SimpleNamespace(by_class={"spelling": (("a", "b", "c", "d", "e"), est), "lists": (("f",), est)})
    lines = class_lines(s, narrow=True)
    assert lines[2:5] == ["  spelling (5 requests): w2 1.21x [1.02, 1.40]", "    w3 1.21x [1.02, 1.40]",
                          "    w4 1.21x [1.02, 1.40]"]
    assert lines[5].startswith("  lists (1 request): w2") and all(len(x) <= 76 for x in lines)
    wide = class_lines(s)
    assert wide[2] == "  spelling (5 requests): w2 1.21x [1.02, 1.40], w3 1.21x [1.02, 1.40], w4 1.21x [1.02, 1.40]"
    assert class_lines(SimpleNamespace(by_class={})) == []
