"""What a rollback of recurrent state costs: a Qwen 3.5-shaped target, three ways to roll back.

A Qwen 3.5 target is gated-delta (linear attention) layers with a full-attention layer every
fourth. After a verify its recurrent state must follow the kept rows only (engine.kvcache). This
probe writes a random-weight target of a real shape (``--shape``: ``4b`` is Qwen 3.5-4B's text
config; ``cpu`` a mid shape this CPU decodes in seconds; ``tiny`` for tests), optionally 4-bit
affine, loads it through the engine and records:

1. **curve**: the engine's cost curve (rows 1..``--rows``): each verify forward's time and the
   rollback after it, keeping half its rows, with the engine's default method;
2. **methods**: per width and kept rows (1, half, all but one), a verify forward and its commit
   under each method (``replay``: the recurrent mixers again on their captured inputs;
   ``reforward``: a second forward of the kept rows; ``per-row``: the verify runs the mixers row
   by row and keeps each row's state), repetitions interleaved method by method, and the one
   with the least verify + rollback summed over them;
3. **decode**: tokens per second of speculative decoding at ``--decode-width`` with a drafter
   that agrees with classic 3 times in 4, per method, and whether each equals classic.

    python -m lab.probe_families --shape 4b --quant affine-4 --out families-4b.json   (GPU)
    python -m lab.probe_families --shape cpu --rows 8 --widths 2,4,8 --out families-cpu.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Qwen 3.5-4B's text config (Qwen/Qwen3.5-4B config.json, text_config), and smaller ones.
SHAPES = {
    "4b": dict(hidden_size=2560, num_hidden_layers=32, intermediate_size=9216,
               num_attention_heads=16, num_key_value_heads=4, head_dim=256,
               linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
               linear_value_head_dim=128, vocab_size=248320, tie_word_embeddings=True),
    "cpu": dict(hidden_size=512, num_hidden_layers=8, intermediate_size=1536,
                num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
                linear_value_head_dim=64, vocab_size=2048, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                 linear_value_head_dim=16, vocab_size=2048, tie_word_embeddings=True),
}
QUANTS = {"bf16": None, "affine-4": ("affine", 4, 64), "affine-8": ("affine", 8, 64)}


def config(shape: str) -> dict:
    """The published (multimodal) layout: the sizes under text_config."""
    text = dict(SHAPES[shape], model_type="qwen3_5_text", full_attention_interval=4,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=262144,
                rope_parameters={"rope_type": "default", "rope_theta": 10000000,
                                 "partial_rotary_factor": 0.25})
    return {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
            "text_config": text, "eos_token_id": 0}


def write_target(out: Path, shape: str, quant: str, seed: int = 0) -> Path:
    from mlx_lm.utils import quantize_model

    from tests import families

    cfg = config(shape)
    model = families.build(cfg, seed=seed, dtype="bfloat16")
    q = QUANTS[quant]
    if q is not None:
        mode, bits, group = q
        model, cfg = quantize_model(model, cfg, group, bits, mode=mode)
    return families.write(out, cfg, model=model, dtype="bfloat16")


def _parse_ints(text: str) -> list[int]:
    from blockwidth.engine.costcurve import parse_rows

    return list(parse_rows(text))


def methods_table(model, widths: list[int], context: int, reps: int) -> dict:
    """Per method, width and kept rows: median verify and rollback ms, repetitions interleaved."""
    import mlx.core as mx

    from blockwidth.engine.costcurve import context_ids
    from blockwidth.engine.kvcache import Method, Rollback, make_cache, mark, restore

    prefix = mx.array(context_ids(context), mx.uint32)
    setups = {}
    for m in Method:
        cache = make_cache(model, slack=max(widths) + 1)
        mx.eval(model(prefix[None], cache=cache))
        setups[m] = (cache, Rollback(model, cache, m))
    times: dict = {m.value: {} for m in Method}
    cells = [(k, kept) for k in widths for kept in sorted({1, (k + 1) // 2, k - 1})]
    for r in range(reps + 1):  # the first pass compiles and finds the mixers: dropped
        for k, kept in cells:
            block = mx.array([(13 * j + 7) % 200 + 10 for j in range(k)], mx.uint32)
            for m in Method:
                cache, rb = setups[m]
                start = mark(rb.leaves)
                with rb.verify(block):
                    t0 = time.perf_counter()
                    mx.eval(model(block[None], cache=cache))
                    verify = (time.perf_counter() - t0) * 1e3
                back = rb.commit(kept) * 1e3
                restore(rb.leaves, start)  # every cell at the same context
                if r:
                    cell = times[m.value].setdefault(f"{k}/{kept}", {"verify": [], "rollback": []})
                    cell["verify"].append(verify)
                    cell["rollback"].append(back)
    out: dict = {}
    for m, per in times.items():
        rows = {}
        for key, c in per.items():
            k, kept = (int(x) for x in key.split("/"))
            v, b = statistics.median(c["verify"]), statistics.median(c["rollback"])
            rows[key] = {"width": k, "kept": kept, "verify_ms": round(v, 4),
                         "rollback_ms": round(b, 4), "total_ms": round(v + b, 4)}
        out[m] = {"cells": rows, "sum_total_ms": round(sum(x["total_ms"] for x in rows.values()), 3),
                  "sum_rollback_ms": round(sum(x["rollback_ms"] for x in rows.values()), 3),
                  "fallback": setups[Method(m)][1].fallback or None}
    return out


def _margin(pair, ids, ref, run, width: int, method, max_abs_diff: float) -> dict:
    """Where ``run`` first leaves classic, and the two tokens' logits there: classic's step and
    the verify row that emitted the width's token (the run replayed with the same drafter, at its
    length, so every round has its shape); engine.identity's rule calls it a near-tie or real."""
    from blockwidth.engine.decode import classic, speculative
    from blockwidth.engine.identity import classify_margin
    from tests.families import AgreeingDrafter

    import mlx.core as mx

    pos = next(i for i, (a, b) in enumerate(zip(run.tokens, ref.tokens)) if a != b)
    seen: dict = {}

    def on_classic(p, logits):
        if p == pos:
            seen["c"] = logits.reshape(-1, logits.shape[-1])[-1].astype(mx.float32)

    def on_width(start, rows):
        if start <= pos < start + rows.shape[0]:
            seen["w"] = rows[pos - start].astype(mx.float32)

    done = [False]
    classic(pair, ids, len(ref.tokens), on_logits=on_classic, cancel=lambda: "c" in seen)
    speculative(pair, ids, len(run.tokens), width, rollback=method, on_logits=on_width,
                drafter=AgreeingDrafter([ids[-1]] + ref.tokens, 0.75, seed=width),
                on_progress=lambda n, _t: done.__setitem__(0, n > pos), cancel=lambda: done[0])
    c, w = ref.tokens[pos], run.tokens[pos]
    cl, wl = seen["c"], seen["w"]
    ok = int(mx.argmax(cl).item()) == c and int(mx.argmax(wl).item()) == w
    m = classify_margin(pos, c, w, float((cl[c] - cl[w]).item()), float((wl[w] - wl[c]).item()),
                        max_abs_diff, ok)
    return dict(m.to_dict(), describe=m.describe())


def decode_table(pair, width: int, tokens: int) -> dict:
    """Classic, then each method at ``width`` with a drafter agreeing 3 times in 4. Where a run
    leaves classic (a verify of several rows rounds differently from single steps, most of all on
    random weights, whose top logits nearly tie), the engine's exactness probe and the margin at
    the first divergence say whether that is rounding or a bug; the methods against each other
    say whether the rollback differs."""
    from blockwidth.engine.decode import classic, speculative
    from blockwidth.engine.identity import probe
    from blockwidth.engine.kvcache import Method
    from tests.families import AgreeingDrafter

    ids = pair.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    ref = classic(pair, ids, tokens)
    ex = probe(pair.target, ids, ref.tokens[:width])
    out = {"classic_tok_s": round(ref.decode_tok_s, 3), "width": width, "tokens": tokens,
           "exactness": ex.to_dict(), "exactness_says": ex.describe()}
    runs = {}
    for m in Method:
        run = speculative(pair, ids, tokens, width, rollback=m,
                          drafter=AgreeingDrafter([ids[-1]] + ref.tokens, 0.75, seed=width))
        runs[m] = run
        row = {"tok_s": round(run.decode_tok_s, 3), "identical": run.tokens == ref.tokens,
               "same_as_replay": run.tokens == runs[Method.REPLAY].tokens,
               "rounds": len(run.rounds), "accepted": run.accepted, "drafted": run.drafted,
               "rollback_ms_per_round": round(run.rollback_s * 1e3 / max(len(run.rounds), 1), 4),
               "verify_ms_median": round(statistics.median(r.verify_s for r in run.rounds) * 1e3, 4)}
        if run.tokens != ref.tokens:
            row["divergence"] = _margin(pair, ids, ref, run, width, m, ex.max_abs_diff)
        out[m.value] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=SHAPES, default="4b")
    ap.add_argument("--quant", choices=QUANTS, default="affine-4")
    ap.add_argument("--rows", type=int, default=16, help="the cost curve's rows 1..N (default 16)")
    ap.add_argument("--widths", default="2,4,8,16", help="widths of the method table")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-width", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=48, help="0: no decode table")
    ap.add_argument("--dir", type=Path, help="where the target is written (default: a temp dir)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    from blockwidth.policy.errors import BlockwidthError

    try:
        widths = _parse_ints(args.widths)
    except (ValueError, BlockwidthError) as e:  # parse_rows' InputError since the house's parsers
        print(e, file=sys.stderr)
        return 2
    if min(widths) < 2 or args.rows < 2:
        print("--widths and --rows: at least 2", file=sys.stderr)
        return 2

    import mlx.core as mx

    from blockwidth.engine import costcurve

    from blockwidth.engine.session import host
    from blockwidth.engine.pair import load_pair

    t_start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        where = args.dir or Path(tmp) / f"qwen3_5-{args.shape}"
        t0 = time.monotonic()
        write_target(where, args.shape, args.quant)
        write_s = time.monotonic() - t0
        pair = load_pair(where)
        record = {"kind": "families-probe", "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "host": host.identity(), "shape": args.shape, "config": config(args.shape)["text_config"],
                  "quantization": pair.quantization.to_dict(), "caches": pair.caches.summary(),
                  "context": args.context, "write_s": round(write_s, 2)}
        t0 = time.monotonic()
        curve = costcurve.measure(pair.target, tuple(range(1, args.rows + 1)), context=args.context,
                                  repeats=args.repeats)
        record["curve"] = curve.to_dict()
        record["curve_s"] = round(time.monotonic() - t0, 2)
        t0 = time.monotonic()
        record["methods"] = methods_table(pair.target, widths, args.context, args.repeats)
        record["methods_s"] = round(time.monotonic() - t0, 2)
        record["choice"] = min(record["methods"], key=lambda m: record["methods"][m]["sum_total_ms"])
        if args.decode_tokens:
            t0 = time.monotonic()
            record["decode"] = decode_table(pair, args.decode_width, args.decode_tokens)
            record["decode_s"] = round(time.monotonic() - t0, 2)
        mx.clear_cache()
    record["elapsed_s"] = round(time.monotonic() - t_start, 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1))
    print(f"rollback: {record['choice']} has the least verify + rollback "
          + ", ".join(f"{m} {v['sum_total_ms']:.1f} ms" for m, v in record["methods"].items()))
    for p in record["curve"]["points"]:
        print(f"  {p['rows']:>2} rows: verify {p['median_ms']:.2f} ms, rollback {p['rollback_ms'] or 0:.3f} ms")
    if "decode" in record:
        d = record["decode"]
        print(f"  decode w{d['width']}: classic {d['classic_tok_s']} tok/s; " + ", ".join(
            f"{m} {d[m]['tok_s']} ({'identical' if d[m]['identical'] else 'DIFFERS'})"
            for m in ("replay", "reforward", "per-row")))
        print(f"  exactness {d['exactness_says']}")
        for m in ("replay", "reforward", "per-row"):
            if "divergence" in d[m]:
                print(f"  {m}: first divergence at token {d[m]['divergence']['position']}, "
                      f"{d[m]['divergence']['describe']}; same tokens as replay: {d[m]['same_as_replay']}")
    print(f"wrote {args.out} in {record['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
