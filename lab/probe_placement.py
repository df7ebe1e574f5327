"""Where a model drafter should run beside a sharded target: every rank (replicated) or rank 0
alone (its drafts sent each round), measured in one group, the same loaded shards, runs
interleaved placement by placement (docs/method.md), the drafter's split rounds timed apart.

Run by its own launcher (two ranks over ring on 127.0.0.1 unless --backend):
    python -m lab.probe_placement --out FILE [--sharding tensor] [--width 3] [--reps 10]
Rank 0 writes FILE (JSON) and prints a summary; every rank checks the placements' tokens agree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path


def _rank_main(a: argparse.Namespace) -> None:
    from blockwidth.engine import distributed as dist
    from blockwidth.engine.decode import speculative
    from blockwidth.engine.demo import DRAFTER, target
    from blockwidth.engine.demo.prompts import DEFAULT_PROMPT
    from blockwidth.engine.drafters import ModelDrafter
    from blockwidth.engine.pair import load_pair

    rank = dist.init(a.backend, a.sharding)
    pair = load_pair(a.target or target("bf16"), a.draft or DRAFTER, "model",
                     target_loader=lambda p: dist.load_target(p, rank))
    ids = pair.tokenizer.encode(DEFAULT_PROMPT)
    lock = dist.Lockstep(rank)
    make = {dist.REPLICATED: lambda: ModelDrafter(pair.drafter),
            dist.RANK0: lambda: dist.RankZeroDrafter(ModelDrafter(pair.drafter) if rank.writer else None, rank.group)}
    runs: dict[str, list] = {k: [] for k in make}
    for rep in range(a.reps + 1):  # the first pass is a discarded warm-up
        for name in (list(make) if rep % 2 == 0 else list(make)[::-1]):  # alternate who goes first
            run = speculative(pair, ids, a.tokens, a.width, drafter=make[name]())
            lock.run(run)  # same tokens on every rank, rank 0's clock
            if rep:
                runs[name].append(run)
    tokens = {k: {tuple(r.tokens) for r in v} for k, v in runs.items()}
    assert len(tokens[dist.REPLICATED] | tokens[dist.RANK0]) == 1, "placements decoded different tokens"
    if not rank.writer:
        return
    out = {"group": rank.to_dict(), "width": a.width, "tokens": a.tokens, "reps": a.reps,
           "target": str(pair.target_path), "drafter": str(pair.drafter_path), "placements": {}}
    for name, rs in runs.items():
        split = [x for r in rs for x in r.rounds if x.split and x.drafted]
        out["placements"][name] = {
            "decode_tok_s": sorted(round(r.decode_tok_s, 3) for r in rs),
            "median_decode_tok_s": round(statistics.median(r.decode_tok_s for r in rs), 3),
            "draft_ms_per_round": round(statistics.median(x.draft_s * 1e3 for x in split), 3) if split else None,
            "verify_ms_per_round": round(statistics.median(x.verify_s * 1e3 for x in split), 3) if split else None,
        }
    Path(a.out).write_text(json.dumps(out, indent=1))
    for name, p in out["placements"].items():
        print(f"{name:<10} decode {p['median_decode_tok_s']:7.2f} tok/s (median of {a.reps}; "
              f"{p['decode_tok_s'][0]}..{p['decode_tok_s'][-1]}), split rounds: draft "
              f"{p['draft_ms_per_round']} ms, verify {p['verify_ms_per_round']} ms", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--sharding", choices=("tensor", "pipeline"), default="tensor")
    ap.add_argument("--backend", default="ring")
    ap.add_argument("--width", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=900)
    a = ap.parse_args()
    from blockwidth.engine.distributed import launched_backend

    if launched_backend(os.environ) is not None:
        _rank_main(a)
        return 0
    from blockwidth.console import distributed

    port = distributed._free_ports(2)
    cmd = [sys.executable, "-c", distributed.LAUNCH, "--hosts", "127.0.0.1", "-n", "2", "--backend", a.backend,
           "--starting-port" if a.backend == "ring" else "--nccl-port", str(port), "--", sys.executable, "-m",
           "lab.probe_placement", *sys.argv[1:]]
    code = distributed.run_group(cmd, dict(os.environ), a.timeout)
    return 0 if code is None and Path(a.out).is_file() else 1


if __name__ == "__main__":
    raise SystemExit(main())
