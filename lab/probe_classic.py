"""Does a session's verify routing slow its classic arm?

On the H200 (2026-11-30d) the sweep with ``--verify-linear gemv --verify-attention vector``
measured its classic arm at 155-220 tok/s (median step 4.4-6.7 ms) while the stock sweeps
before and after it, in other processes on the same pair, measured 204-351 (2.7-4.8 ms), and
the widths' verify times were no lower than stock's. Either the host slowed for those 94 s, or
something the routed verifies leave behind (a custom kernel, float32 attention buffers) slows
the 1-row steps that follow in the same process: a bias against classic in every such
session. This probe times classic runs interleaved with speculative runs under one routing,
in a fresh process per routing (ABBA across calls), on a random pair of the GPU pair's shape:

    python -m lab.probe_classic --variant stock|gemvv --json

Each timed classic run also carries the host's share of it (engine.session.host.host_delta: main-thread
and process CPU seconds, stolen seconds, context switches, the CPU at each end). On the H200
(2026-11-30e) the GPU's clock read 1980 MHz before and after every run while classic's step
still moved from 2.3 to 3.7 ms: a slow run with more main-thread CPU time a token worked
longer on the host; one with the same CPU time but more stolen time or switches waited.
"""

from __future__ import annotations

import argparse
import json
import statistics

VARIANTS = {"stock": {}, "gemvv": {"linear": "gemv", "attention": "vector"}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=tuple(VARIANTS), default="stock")
    ap.add_argument("--shape", default="1b")
    ap.add_argument("--width", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    import mlx.core as mx

    from blockwidth.engine import decode

    from blockwidth.engine.session import host
    from blockwidth.engine.costcurve import context_ids
    from lab.probe_loop import _models, _Pair

    pair = _Pair(*_models(args.shape, False))
    prompt = context_ids(48)
    kw = VARIANTS[args.variant]

    watch = host.ClockWatch()
    sm: list[int | None] = []  # the GPU's SM clock before each timed classic run (None: no NVML)
    hosts: list[dict] = []  # the host's share of each classic run

    def classic_ms() -> float:
        sm.append((watch.read() or {}).get("sm_mhz"))
        h0 = host.host_reading()
        run = decode.classic(pair, prompt, args.tokens)
        hosts.append(host.host_delta(h0, host.host_reading()))
        return statistics.median(r.verify_s * 1e3 for r in run.rounds[1:])

    def spec():
        return decode.speculative(pair, prompt, args.tokens, args.width, **kw)

    classic_ms()
    spec()  # warm-up of both loops
    before = [classic_ms() for _ in range(args.reps)]  # no speculative run between these
    between, rounds = [], []
    for _ in range(args.reps):
        run = spec()
        rounds.append(statistics.median(r.verify_s * 1e3 for r in run.rounds if r.split))
        between.append(classic_ms())
    watch.close()
    out = {"variant": args.variant, "device": str(mx.default_device()), "shape": args.shape,
           "width": args.width, "tokens": args.tokens,
           "classic_step_ms_alone": [round(x, 3) for x in before],
           "classic_step_ms_after_spec": [round(x, 3) for x in between],
           "spec_verify_ms": [round(x, 3) for x in rounds],
           "classic_sm_mhz": sm[1:],  # past the warm-up: the runs alone, then those between
           "classic_host": hosts[1:],  # in the same order
           "alone_median": round(statistics.median(before), 3),
           "after_spec_median": round(statistics.median(between), 3)}
    print(json.dumps(out) if args.json else
          f"{args.variant}: classic step {out['alone_median']} ms alone, {out['after_spec_median']} ms "
          f"between speculative runs (verify {statistics.median(rounds):.2f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
