"""One rank's part of tests/test_distributed.py's check that the lockstep catches ranks that
disagree (run by mlx.launch, two ranks over ring on 127.0.0.1; no model). Writes what it saw
to OUT/rank-N.json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx

from blockwidth.engine import distributed as dist
from blockwidth.engine.decode import DecodeRun, Round
from blockwidth.policy.verdict import Budget


class Echo:
    """Stands in for a target's forward where only its inputs matter: the check runs before it."""

    def __call__(self, inputs, cache=None):
        return inputs


def main(out: Path) -> None:
    rank = dist.init("ring", "tensor")
    r = rank.rank
    seen: dict = {"rank": r, "size": rank.size, "group": rank.info.to_dict()}
    lock = dist.Lockstep(rank)
    # the same tokens, other clocks: every rank ends with rank 0's timings
    same = DecodeRun(None, [5, 6, 7], 3, 0.1 * (r + 1), 0.2 * (r + 1),
                     [Round(0, 0, 1, 0.0, 0.01 * (r + 1), 0.0) for _ in range(3)])
    lock.run(same)
    seen["decode_s"], seen["verify_s"] = same.decode_s, [x.verify_s for x in same.rounds]
    # other tokens on rank 1: every rank must stop, naming the rank
    other = DecodeRun(4, [5, 6, 7 + r], 3, 0.1, 0.2, [Round(2, 2, 3, 0.0, 0.01, 0.0)])
    try:
        lock.run(other)
        seen["tokens_differ"] = None
    except dist.DistributedError as e:
        seen["tokens_differ"] = str(e)
    # the budget a rank's own clock would give: rank 0's on every rank
    seen["budget"] = getattr(lock.agree(Budget.SECONDS if r == 0 else None, Budget), "value", None)
    checked = dist.CheckedTarget(Echo(), rank.group)
    checked(mx.array([[1, 2]], mx.uint32))
    try:
        checked(mx.array([[1, 2 + r]], mx.uint32))
        seen["inputs_differ"] = None
    except dist.DistributedError as e:
        seen["inputs_differ"] = str(e)
    seen["forwards"] = checked.forwards
    seen["gathered"] = [b.decode() for b in dist.gather_bytes(rank.group, b"x" * (r + 1))]
    (out / f"rank-{r}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
