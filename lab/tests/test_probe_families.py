"""lab.probe_families (the H200's Qwen 3.5-shaped rollback record), run on a tiny shape on this CPU
so that what the GPU host runs is known to work, 4-bit affine as there."""

import json

from lab import probe_families


def test_the_families_probe_writes_a_curve_with_rollback_and_the_three_methods(tmp_path):
    out = tmp_path / "families.json"
    assert probe_families.main(["--shape", "tiny", "--quant", "affine-4", "--rows", "3",
                                "--widths", "2,3", "--context", "24", "--repeats", "2",
                                "--decode-tokens", "12", "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    assert rec["kind"] == "families-probe" and rec["shape"] == "tiny"
    assert rec["quantization"]["scheme"] == "affine" and rec["quantization"]["bits"] == 4
    assert {c["kind"] for c in rec["caches"]} == {"ArraysCache", "KVCache"}
    curve = rec["curve"]
    assert curve["rollback"] == "replay" and [p["rows"] for p in curve["points"]] == [1, 2, 3]
    assert curve["points"][0]["rollback_ms"] is None
    assert all(p["rollback_ms"] > 0 for p in curve["points"][1:])  # recurrent work, timed
    assert set(rec["methods"]) == {"replay", "reforward", "per-row"} and rec["choice"] in rec["methods"]
    for m in rec["methods"].values():
        assert set(m["cells"]) == {"2/1", "3/1", "3/2"} and m["fallback"] is None
        assert m["sum_total_ms"] > 0
    assert rec["methods"]["per-row"]["sum_rollback_ms"] < rec["methods"]["reforward"]["sum_rollback_ms"]
    d = rec["decode"]
    assert all(d[m]["identical"] for m in ("replay", "reforward", "per-row"))


def test_the_families_probe_refuses_a_width_below_two(tmp_path, capsys):
    assert probe_families.main(["--shape", "tiny", "--widths", "1,2", "--out", str(tmp_path / "x")]) == 2
    assert "at least 2" in capsys.readouterr().err
    assert probe_families.main(["--shape", "tiny", "--widths", "2-x", "--out", str(tmp_path / "x")]) == 2


def test_a_divergence_is_read_at_its_position_and_classified(tmp_path):
    """The GPU's random 4B target left classic at its first tokens under every method alike: the
    probe replays a run to its first divergence and reads both tokens' logits there. On this CPU
    nothing diverges, so a run with one token changed stands in: the replay does not choose it."""
    from types import SimpleNamespace

    from blockwidth.engine.decode import classic
    from blockwidth.engine.identity import NOT_REPRODUCED
    from blockwidth.engine.kvcache import Method
    from blockwidth.engine.pair import load_pair

    path = probe_families.write_target(tmp_path / "t", "tiny", "bf16")
    pair = load_pair(path)
    ids = pair.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    ref = classic(pair, ids, 10)
    tokens = list(ref.tokens)
    tokens[5] = (tokens[5] + 1) % 2048
    m = probe_families._margin(pair, ids, ref, SimpleNamespace(tokens=tokens), 4, Method.REPLAY, 0.1)
    assert m["position"] == 5 and m["kind"] == NOT_REPRODUCED and m["width_token"] == tokens[5]
