"""The product on real pretrained models (tests/real.py): SmolLM2-135M-Instruct and Gemma 3 270M,
converted from the GGUF files that PyPI packages ship.

Few tokens and short prompts on purpose: on a busy 2-core CPU one row of the 135M model costs
0.2-0.5 s, and a verify of w rows costs about w rows there, so every run here is a handful of
rows. Sessions run in-process through the engine's A/B session (what `sweep` runs) without the
warm-up, exactness probe and prediction, which the demo pair's tests cover.
"""

from __future__ import annotations

import json
from pathlib import Path


from blockwidth.console.cli import main
from blockwidth.engine import ab, decode
from blockwidth.engine.pair import load_pair
from blockwidth.policy import workload

CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Write a Python function that adds two numbers."}]


def _smol(real: Path, variant: str) -> Path:
    return real / "smollm2" / variant


def _linked(src: Path, to: Path, **config) -> Path:
    """A copy of ``src`` whose weights are links and whose config.json has ``config`` applied."""
    to.mkdir()
    for f in src.iterdir():
        if f.name != "config.json":
            (to / f.name).symlink_to(f)
    (to / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()), **config}))
    return to


def _session(pair, requests: list[dict], widths: tuple, max_tokens: int) -> ab.Session:
    data = "\n".join(json.dumps(r) for r in requests).encode()
    wl = workload.parse(data, "test workload", "test", "test")
    cfg = ab.AbConfig(widths=widths, prompt="", n=1, max_tokens=max_tokens, warmup=False, exactness=False,
                      predict=False, workload=wl, seed=1)
    return ab.run_session(pair, cfg)


def test_the_converted_variants_give_the_same_greedy_text(real_models):
    """The file's own 4-bit (Q/K rows un-permuted, rope as HF's), a dequantized bfloat16 and an
    8-bit g64 re-quantization answer a chat prompt with the same tokens: the conversion is right
    (a wrong rope or tokenizer gives other text, or none)."""
    texts = {}
    for variant in ("native", "bf16", "q8g64"):
        pair = load_pair(_smol(real_models, variant))
        ids = list(pair.tokenizer.apply_chat_template(CHAT, add_generation_prompt=True))
        assert ids[:1] == [1] and len(ids) == 26  # <|im_start|>, as llama.cpp renders the template
        run = decode.classic(pair, ids, 6)
        texts[variant] = (run.tokens, pair.tokenizer.decode(run.tokens))
    assert texts["native"] == texts["bf16"] == texts["q8g64"], texts
    assert "def" in texts["bf16"][1]


def test_inspect_counts_a_mixed_checkpoint_and_reads_the_tensors(real_models, capsys):
    """SmolLM2's file is 4-bit layers and an 8-bit tied embedding, with float32 scales: inspect
    counts 134.5M parameters (not 162.8M, the embedding counted as 4-bit) and reports the
    tensors' dtypes, not config.json's."""
    assert main(["inspect", str(_smol(real_models, "native")), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["parameters"] == 134_515_008
    assert d["quantization"]["bits"] == 4 and d["scales_dtype"] == "float32"
    assert main(["inspect", str(_smol(real_models, "bf16")), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["parameters"] == 134_515_008 and d["dtype"] == "bfloat16" and d["scales_dtype"] is None
    assert main(["inspect", str(real_models / "gemma3" / "bf16"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model_type"] == "gemma3_text" and d["sliding_window"] == 512
    assert 268_000_000 < d["parameters"] < 269_000_000


def test_inspect_says_when_config_json_names_another_dtype(real_models, tmp_path, capsys):
    """A config that says float16 over float32 tensors and scales (as a converter may leave it):
    the tensors are what the CPU computes in, and inspect says both."""
    folder = _linked(_smol(real_models, "native"), tmp_path / "m", torch_dtype="float16")
    assert main(["inspect", str(folder), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["dtype"], d["scales_dtype"], d["config_dtype"]) == ("float32", "float32", "float16")
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "dtype        float32 (config.json says float16)" in out and "scales       float32" in out


def test_resolve_the_real_pair_and_refuse_another_vocabulary(real_models, capsys):
    bf16, native = _smol(real_models, "bf16"), _smol(real_models, "native")
    assert main(["resolve", "--target", str(bf16), "--draft", str(native), "--kind", "model", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["drafter_kind"] == "model" and d["width"] >= 2
    assert str(native.resolve()) in d["serve_command"]
    # Gemma's 262144-token vocabulary is not SmolLM2's: refused, naming both sizes
    code = main(["resolve", "--target", str(bf16), "--draft", str(real_models / "gemma3" / "bf16"),
                 "--kind", "model"])
    err = capsys.readouterr().err
    assert code == 2 and "49152" in err and "262144" in err and len(err.strip().splitlines()) == 1


def test_lookup_session_on_a_chat_request(real_models):
    """The lookup drafter on the bf16 target, a chat request through its chat template: every
    width's text is classic's (byte-identical on the CPU)."""
    pair = load_pair(_smol(real_models, "bf16"))
    s = _session(pair, [{"id": "chat", "messages": CHAT},
                        {"id": "repeat", "prompt": "one, two, three, four, one, two, three, four, one, two,"}],
                 (3,), 6)
    assert [r.prepared.rendered for r in s.requests] == ["chat template", "prompt"]
    for r in s.requests:
        (arm,) = r.arms
        assert arm.identity is not None and arm.identity.identical_ids, r.prepared.id
    rounds = [x for r in s.requests for run in r.arms[0].runs for x in run.rounds]
    assert any(x.accepted for x in rounds)  # the repeated list is drafted and kept
    # the record says what the cost was measured on: the tensors' dtypes, not config.json's word
    from blockwidth.engine.session import record

    assert record.build(s, pair, host={})["pair"]["target_dtypes"] == {"weights": "bfloat16", "scales": None}


def test_model_drafter_session_the_4bit_drafts_for_the_bf16(real_models):
    """The file's own 4-bit as the draft model of its bfloat16: a real pair of one tokenizer."""
    pair = load_pair(_smol(real_models, "bf16"), _smol(real_models, "native"))
    s = _session(pair, [{"id": "chat", "messages": CHAT}], (2,), 5)
    (arm,) = s.requests[0].arms
    assert arm.identity.identical_ids
    rounds = [x for run in arm.runs for x in run.rounds]
    assert sum(x.accepted for x in rounds) >= len(rounds) // 2  # a quantization of the target agrees


def test_gemma3_lookup_past_its_sliding_window_is_identical(real_models, tmp_path):
    """Gemma 3's sliding-window layers (a rotating cache) through speculative rounds and
    rewinds past the window. The real window is 512: crossing it costs a ~520-row prefill per
    run, minutes on this CPU, so this copy of the real weights has its window cut to 16 (the
    same cache kind and rewind; the real window is crossed in lab/evidence/real-cpu-2026-12-04)."""
    pair = load_pair(_linked(real_models / "gemma3" / "bf16", tmp_path / "gemma3-w16", sliding_window=16))
    prompt = "Count: one, two, three, four, five, six, one, two, three, four,"
    s = _session(pair, [{"id": "count", "prompt": prompt}], (3,), 10)
    r = s.requests[0]
    assert len(r.prepared.ids) + 10 > 16 + 8  # well past the window
    (arm,) = r.arms
    assert arm.identity.identical_ids


def test_the_sweep_estimate_counts_its_prefills(real_models, capsys):
    """The pre-run estimate counted a prefill as one row (said 45.6 s, took 832 s).
    On this CPU a row of SmolLM2 costs about a 1-row forward, so ten 300-token prefills are
    minutes, and the line says so and counts them."""
    import threading

    from blockwidth.console import measure

    pair = load_pair(_smol(real_models, "bf16"))
    cfg = ab.AbConfig(widths=(2, 4), prompt="", n=2, max_tokens=8)
    prefills = measure.session_prefills(cfg, [300, 40], 300)
    # warm-up of 3 arms, 2 x 3 runs + the closing classic on each request, 2 probes, the curve
    assert prefills == [300] * 3 + [300] * 7 + [40] * 7 + [300] * 2 + [300 + 8 + 4]
    measure._say_how_long(pair.target, [1] * 40, "sweep", quiet=False, cancel=threading.Event(),
                          lower_only=True, prefills=prefills)
    line = capsys.readouterr().err
    assert f"it runs 40 forwards and {len(prefills)} prefills of {sum(prefills)} tokens" in line
    minutes = line.split("about ")[1].split(" ")
    assert minutes[1] in ("min", "h")  # not the ~20 s that 40 + 20 single rows would be


def test_the_committed_real_model_win_is_kept_true_by_check(real_models, capsys):
    """The saved entry from SmolLM2 bf16 + lookup on spelling fixes (this CPU, w2 1.14x [1.06,
    1.22], n 12): `check`'s static checks pass on it from a fresh clone (its record is found
    beside the profile), and on an x86_64 CPU the real pair resolves to its width 2."""
    import platform

    from tests.conftest import ROOT

    prof = ROOT / "lab/evidence/real-cpu-2026-12-04c/engine-spelling/profile.toml"
    assert main(["check", "--profile", str(prof), "--device", "cpu",
                 "--target", str(_smol(real_models, "bf16")), "--kind", "lookup"]) == 0
    out = capsys.readouterr().out
    assert "0 fail" in out and "record: record" in out and "present" in out
    if platform.machine() == "x86_64":
        assert "resolve: bf16 + lookup: 2 (profile: measured winner" in out, out


def test_the_file_edits_record_on_the_cpu_says_what_its_readme_says():
    """lab/evidence/real-cpu-2026-12-05: SmolLM2 + lookup over whole-file edits (the traffic where
    lookup is known to pay) was slower at both widths, every text classic's; the README's
    figures are the record's, and both workloads written for it parse as workloads."""
    import gzip

    from tests.conftest import ROOT

    base = ROOT / "lab/evidence/real-cpu-2026-12-05"
    (rec,) = (base / "file-edits").glob("session-*.json.gz")
    s = json.loads(gzip.open(rec).read())
    assert s["pair"]["drafter_kind"] == "lookup" and s["pair"]["target_quantization"]["group_size"] == 32
    assert s["workload"]["name"] == "file-edits.jsonl" and len(s["requests"]) == 8
    arms = {a["arm"]: a for a in s["arms"]}
    assert {a["verdict"] for n, a in arms.items() if n != "classic"} == {"slower"}
    assert round(arms["w4"]["ratio"], 2) == 0.62 and round(arms["w8"]["ratio"], 2) == 0.38
    for r in s["requests"]:
        for a in r["arms"]:
            assert a["arm"] == "classic" or a["identity"]["identical_bytes"], (r["id"], a["arm"])
    assert not s["decision"]["saveable"]
    readme = (base / "README.md").read_text()
    assert "0.62x [0.54, 0.72]" in readme and "0.38x [0.31, 0.47]" in readme
    texts = [json.loads(x) for x in (base / "function-edits" / "classic-texts.jsonl").read_text().splitlines()]
    assert len(texts) == 8
    for name in ("file-edits.jsonl", "function-edits.jsonl"):
        assert len(workload.read(ROOT / "lab/prompts" / name).requests) == 8
