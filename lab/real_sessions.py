"""Short A/B sessions of the real pairs on this CPU, for evidence where `sweep`'s full session
does not fit the time: the engine's own session (engine.ab.run_session, what `sweep` runs) at
n = 1 without the warm-up, the exactness probe and the cost curve (each a prefill or more per
width), every run of every request kept in a record as `sweep` writes it.

    python -m lab.real_sessions NAME OUT_DIR --target T [--draft D] [--kind K]
        (--workload FILE|mixed|chat | --prompt-file F) --widths 2,4 --max-tokens N

On a busy 2-core CPU one row of SmolLM2-135M costs 0.2-0.5 s and a prefill costs its prompt's
rows, so these are a look at acceptance and speed per request class, not a decision: n = 1
leaves every range a point, and the interval resamples requests only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.real_sessions")
    p.add_argument("name")
    p.add_argument("out", type=Path)
    p.add_argument("--target", required=True)
    p.add_argument("--draft")
    p.add_argument("--kind")
    p.add_argument("--workload")
    p.add_argument("--prompt-file")
    p.add_argument("--widths", default="2")
    p.add_argument("--max-tokens", type=int, default=12)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)

    from blockwidth.console import records as record_files
    from blockwidth.engine import ab, host, record
    from blockwidth.engine.pair import load_pair
    from blockwidth.policy import workload as workloads

    pair = load_pair(a.target, a.draft, a.kind)
    wl = workloads.read(a.workload) if a.workload else None
    prompt = Path(a.prompt_file).read_text() if a.prompt_file else ""
    cfg = ab.AbConfig(widths=tuple(int(w) for w in a.widths.split(",")), prompt=prompt, n=1,
                      max_tokens=a.max_tokens, warmup=False, exactness=False, predict=False,
                      workload=wl, seed=a.seed)
    gate = host.gate()
    t0 = time.monotonic()

    def on_event(e) -> None:
        if e.kind in ("rep", "done", "cancelled") or (e.kind == "arm" and e.run % 8 == 0):
            print(f"  [{time.monotonic() - t0:6.0f}s] {e.kind} {e.request} {e.arm} {e.message}".rstrip(),
                  file=sys.stderr, flush=True)

    import threading

    from blockwidth.console.measure import run_interruptibly

    cancel = threading.Event()  # Ctrl-C (or timeout -s INT) stops it after the forward under way;
    # the runs so far are recorded, as sweep records a cancelled session
    session, _ = run_interruptibly(lambda: ab.run_session(pair, cfg, on_event=on_event, cancel=cancel),
                                   cancel, "the session")
    rec = record.build(session, pair, host.identity(), gate.to_dict())
    rec["lab"] = {"script": "lab/real_sessions.py", "name": a.name,
                  "note": "n = 1, no warm-up, no exactness probe, no cost curve: a look, not a decision"}
    a.out.mkdir(parents=True, exist_ok=True)
    path = record_files.write(rec, a.out)
    print(json.dumps({"name": a.name, "record": str(path), "elapsed_s": round(time.monotonic() - t0, 1),
                      "decision": session.decision}))
    for r in session.per_request:
        c = r.classic
        if c.decode_range() is None:
            print(f"{r.id:<16} not run")
            continue
        line = [f"{r.id:<16} {len(r.prepared.ids):4d} tok  classic {c.decode_range().median:6.2f} tok/s"]
        for arm in r.arms:
            d = arm.decode_range()
            if d is None:
                continue
            acc = arm.acceptance
            same = "same" if arm.identity is not None and arm.identity.identical_ids else "DIFFERS"
            line.append(f"{arm.name} {d.median:6.2f} tok/s ({d.median / c.decode_range().median:4.2f}x, "
                        f"accept {acc:.2f}, {same})" if acc is not None else f"{arm.name} {d.median:6.2f} ({same})")
        print("  ".join(line))
    for arm in session.arms:
        est = session.estimates.get(arm.width)
        print(f"{arm.name}: {arm.verdict.value}" + (f", {est.ratio:.2f}x [{est.ci.lo:.2f}, {est.ci.hi:.2f}]"
                                                     if est else "") + f" acceptance {arm.acceptance}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
