"""What MLX's CUDA command batching costs a speculative round: the probe behind ``--cuda-graphs``.

On the H200 a verify of the 1B pair cost ~10 ms inside the decode loop against
~4.4 ms for a classic step, and a 2-layer draft step ~0.7 ms: far more than the
weights they read (2 GB at 4.8 TB/s is 0.4 ms). MLX's CUDA backend records
kernels into CUDA graphs of at most ``MLX_MAX_OPS_PER_BUFFER`` nodes (20 by
default), keys each graph on its topology, and re-instantiates it whenever an
update fails (a kernel chosen by shape changed); at most
``MLX_CUDA_GRAPH_CACHE_SIZE`` (100) graphs are kept, then all are dropped.
A verify at a new KV length every round, with row counts that vary, is the
case that pays most for that. This probe runs the engine's own decode loops
(classic, and speculative at a few widths with every round timed apart) on a
random model of the GPU pair's shape, once per MLX setting, each in a fresh
process (MLX reads these variables once), in an ABBA order against drift:

    python -m lab.probe_loop --out loop.json             # all settings
    python -m lab.probe_loop --one --json                # this process's settings

Beside each width ``w{K}`` it times ``w{K}gather``: the same loop with the verify's
projections routed through engine.linear's ``gather`` (no cuBLAS call). The
random drafter's drafts are nearly always rejected; the figures that
matter are per round (draft ms per drafted token, verify ms, ms per classic
step), which do not depend on acceptance.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

SETTINGS: dict[str, dict[str, str]] = {
    "default": {},
    "ops100": {"MLX_MAX_OPS_PER_BUFFER": "100", "MLX_MAX_MB_PER_BUFFER": "1000"},
    "ops250": {"MLX_MAX_OPS_PER_BUFFER": "250", "MLX_MAX_MB_PER_BUFFER": "4000"},
    "cache1000": {"MLX_CUDA_GRAPH_CACHE_SIZE": "1000"},
    "ops100+cache1000": {"MLX_MAX_OPS_PER_BUFFER": "100", "MLX_MAX_MB_PER_BUFFER": "1000",
                         "MLX_CUDA_GRAPH_CACHE_SIZE": "1000"},
    "nographs": {"MLX_USE_CUDA_GRAPHS": "0"},
}


@dataclass
class _Pair:  # what engine.decode reads of a pair
    target: object
    drafter: object
    context_length: int | None = None

    @property
    def kind(self):
        from blockwidth.policy.drafter import DrafterKind

        return DrafterKind.MODEL


def _models(shape: str, quant: bool):
    import mlx.core as mx
    import mlx.nn as nn

    from lab import build as small
    from lab.build_gpu import COMMON, SHAPES

    mx.random.seed(0)
    tconf, dconf = SHAPES[shape]
    out = []
    for conf, q in ((tconf, quant), (dconf, False)):
        m = small.make_model(dict(COMMON, **conf))
        m.set_dtype(mx.bfloat16)
        if q:
            nn.quantize(m, group_size=64, bits=4)
        mx.eval(m.parameters())
        out.append(m)
    return out


# Arm variants beside the stock loop: the verify's projections through engine.linear's gather,
# the same with the vector attention (no cuBLAS call left in a 16-bit verify), and through
# engine.linear's K-row gemv kernel, alone and with the vector attention (gemv and gemvv are not
# in --variants' default; h200pipe.sh asks for all five).
VARIANTS: dict[str, dict] = {"": {}, "gather": {"linear": "gather"},
                             "gv": {"linear": "gather", "attention": "vector"},
                             "gemv": {"linear": "gemv"},
                             "gemvv": {"linear": "gemv", "attention": "vector"}}


def one(shape: str, quant: bool, widths: list[int], tokens: int, reps: int,
        variants: tuple[str, ...] = ("", "gather")) -> dict:
    """The loop figures under this process's MLX settings."""
    import mlx.core as mx

    from blockwidth.engine import decode
    from blockwidth.engine.costcurve import context_ids

    target, drafter = _models(shape, quant)
    pair = _Pair(target, drafter)
    prompt = context_ids(300)
    arms: dict[str, dict] = {}

    arms_list = [None] + [(w, v) for v in variants for w in widths]

    def run(arm):
        if arm is None:
            return decode.classic(pair, prompt, tokens)
        width, variant = arm
        return decode.speculative(pair, prompt, tokens, width, split_every=1, **VARIANTS[variant])

    for w in arms_list:  # warm-up: compile kernels, first graphs
        run(w)
    samples: dict[str, list] = {}
    for _ in range(reps):
        for w in arms_list:
            name = "classic" if w is None else f"w{w[0]}{w[1]}"
            samples.setdefault(name, []).append(run(w))
    for name, runs in samples.items():
        if name == "classic":
            step = [r.verify_s * 1e3 for run_ in runs for r in run_.rounds[1:]]
            arms[name] = {"step_ms": round(statistics.median(step), 3),
                          "tok_s": round(statistics.median(r.decode_tok_s for r in runs), 1)}
        else:
            rounds = [r for run_ in runs for r in run_.rounds[1:] if r.drafted]
            arms[name] = {
                "draft_ms_per_token": round(statistics.median(r.draft_s * 1e3 / r.drafted for r in rounds), 3),
                "verify_ms": round(statistics.median(r.verify_s * 1e3 for r in rounds), 3),
                "round_ms": round(statistics.median((r.draft_s + r.verify_s + r.sync_s) * 1e3
                                                    for r in rounds), 3),
                "acceptance": round(sum(r.accepted for r in rounds) / max(sum(r.drafted for r in rounds), 1), 3),
                # gather arms: projections engine.linear routed (0 would mean "gather" was stock)
                "linear_routed_calls": sum(r.linear_routed for r in runs),
            }
    return {"mlx": mx.__version__, "device": str(mx.default_device()), "shape": shape,
            "quant": "4bit" if quant else "bf16", "tokens": tokens, "reps": reps, "arms": arms,
            "env": {k: os.environ[k] for k in sorted(os.environ) if k.startswith("MLX_")}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", action="store_true", help="measure this process's settings only")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--quant", action="store_true", help="4-bit target")
    ap.add_argument("--widths", default="4,8")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--settings", default="default,ops100,ops250,cache1000,nographs")
    ap.add_argument("--passes", type=int, default=2, help="passes over the settings, alternating order")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for one setting's process")
    ap.add_argument("--pick", type=Path, help="write the picked setting here as shell export lines")
    ap.add_argument("--variants", default="stock,gather,gv",
                    help="arm variants: stock, gather (engine.linear), gv (gather + vector attention), "
                         "gemv (engine.linear's K-row kernel), gemvv (gemv + vector attention)")
    args = ap.parse_args(argv)
    widths = [int(w) for w in args.widths.split(",")]
    variants = tuple("" if v == "stock" else v for v in args.variants.split(","))
    if any(v not in VARIANTS for v in variants):
        known = ", ".join(v or "stock" for v in VARIANTS)
        print(f"--variants {args.variants}: expected {known}", file=sys.stderr)
        return 2
    if args.one:
        r = one(args.shape, args.quant, widths, args.tokens, args.reps, variants)
        print(json.dumps(r) if args.json else r, flush=True)
        return 0
    names = args.settings.split(",")
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        print(f"--settings: unknown {', '.join(unknown)} (known: {', '.join(SETTINGS)})", file=sys.stderr)
        return 2
    results: dict[str, list] = {n: [] for n in names}
    t0 = time.time()
    for p in range(args.passes):
        for name in (names if p % 2 == 0 else names[::-1]):
            env = {k: v for k, v in os.environ.items() if k not in {k2 for s in SETTINGS.values() for k2 in s}}
            env.update(SETTINGS[name])
            cmd = [sys.executable, "-m", "lab.probe_loop", "--one", "--json", "--shape", args.shape,
                   "--widths", args.widths, "--tokens", str(args.tokens), "--reps", str(args.reps),
                   "--variants", args.variants]
            if args.quant:
                cmd.append("--quant")
            try:
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
                line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
                r = json.loads(line) if out.returncode == 0 and line else {"error": out.stderr[-500:]}
            except subprocess.TimeoutExpired:
                r = {"error": f"timed out after {args.timeout:.0f}s"}
            results[name].append(r)
            print(name, json.dumps(r.get("arms", r)), flush=True)
    doc = {"passes": args.passes, "seconds": round(time.time() - t0, 1), "settings": SETTINGS, "results": results}
    doc["modelled_ms_per_token"] = {n: [modelled(r) for r in rs] for n, rs in results.items()}
    doc["picked"] = pick(results)
    doc["modelled_ms_per_token_gather"] = {n: [modelled(r, "gather") for r in rs] for n, rs in results.items()}
    doc["modelled_ms_per_token_gemv"] = {n: [modelled(r, "gemv") for r in rs] for n, rs in results.items()}
    doc["picked_linear"] = pick_linear(results)
    doc["picked_attention"] = pick_attention(results)
    print("modelled ms per token:", doc["modelled_ms_per_token"], "gather:", doc["modelled_ms_per_token_gather"],
          "gemv:", doc["modelled_ms_per_token_gemv"],
          "picked:", doc["picked"], "linear:", doc["picked_linear"], "attention:", doc["picked_attention"],
          flush=True)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    if args.pick:
        lines = [f"export {k}={v}\n" for k, v in SETTINGS[doc["picked"]].items()]
        lines.append(f"export BW_VERIFY_LINEAR={doc['picked_linear']}\n")
        lines.append(f"export BW_VERIFY_ATTENTION={doc['picked_attention']}\n")
        args.pick.write_text("".join(lines))
    return 0


ACCEPTANCE = 0.75  # per position: the 1B pair's measured figure (docs/gpu-builds.md)
MARGIN = 0.10


def modelled(r: dict, suffix: str = "") -> float | None:
    """Speculative ms per token at this setting's best width, for a drafter of per-position
    acceptance ACCEPTANCE: round ms / expected tokens a round, (1 - a^K) / (1 - a).
    ``suffix`` "gather": the arms whose projections went through engine.linear's gather."""
    arms = r.get("arms") or {}
    best = None
    for name, a in arms.items():
        m = re.fullmatch(r"w(\d+)(\D*)", name)
        if m is None or m.group(2) != suffix:
            continue
        k = int(m.group(1))
        v = a["round_ms"] * (1 - ACCEPTANCE) / (1 - ACCEPTANCE ** k)
        best = v if best is None else min(best, v)
    return round(best, 3) if best is not None else None


def _beats(runs: list, base: str, other: str) -> bool:
    """``other`` arms' modelled ms per token below ``base`` arms' by MARGIN in every pass."""
    pairs = [(modelled(r, base), modelled(r, other)) for r in runs]
    return bool(pairs) and all(b is not None and o is not None and o < b * (1 - MARGIN) for b, o in pairs)


def pick_linear(results: dict[str, list]) -> str:
    """Of ``gather`` and ``gemv``, those whose arms' modelled ms per token beat the stock arms'
    by MARGIN in every pass of the ``default`` setting, the one with the lower median (not the
    first in a fixed order: a gemv 11 % faster than stock must not win over a gather 30 %
    faster); ``stock`` when neither does."""
    runs = results.get("default") or []
    won = [(statistics.median(modelled(r, mode) for r in runs), mode)
           for mode in ("gather", "gemv") if _beats(runs, "", mode)]
    return min(won)[1] if won else "stock"


WITH_VECTOR = {"gather": "gv", "gemv": "gemvv", "stock": None}  # the picked route + vector attention


def pick_attention(results: dict[str, list]) -> str:
    """``vector`` when the picked projection route with vector attention (gv, gemvv) beats the
    route alone by MARGIN in every pass of ``default``; else ``auto`` (plain on CUDA)."""
    runs = results.get("default") or []
    route = pick_linear(results)
    both = WITH_VECTOR.get(route)
    return "vector" if both and _beats(runs, route, both) else "auto"


def pick(results: dict[str, list]) -> str:
    """The setting whose modelled speculative ms per token beats ``default`` by MARGIN in every
    pass (the best such by median), else ``default``: one noisy pass does not change a setting."""
    base = [modelled(r) for r in results.get("default", [])]
    if not base or None in base:
        return "default"
    chosen, chosen_v = "default", statistics.median(base)
    for name, rs in results.items():
        vs = [modelled(r) for r in rs]
        if name == "default" or not vs or None in vs or len(vs) != len(base):
            continue
        if all(v < b * (1 - MARGIN) for v, b in zip(vs, base)) and statistics.median(vs) < chosen_v:
            chosen, chosen_v = name, statistics.median(vs)
    return chosen


if __name__ == "__main__":
    sys.exit(main())
