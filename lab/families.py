"""The family compatibility survey: every mlx-lm model module's tiny checkpoint (built by
``tests.families``) through the engine, with its cache plan or its refusal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.families import *  # noqa: F401,F403  (the builder the product's tests use)
from tests.families import _exists, _fill, _args  # noqa: F401

def survey(names: list[str], tokens: int = 16, widths: tuple[int, ...] = (3,)) -> list[dict]:
    """Each family's tiny checkpoint through the engine: its cache plan (or the refusal), classic
    against mlx-lm's greedy tokens, and every width with an AgreeingDrafter against classic."""
    import tempfile

    from mlx_lm.generate import generate_step

    import mlx.core as mx

    from blockwidth.engine.decode import classic, speculative
    from blockwidth.engine.pair import PairError, load_pair

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            row: dict[str, Any] = {"family": name}
            rows.append(row)
            if name in CANNOT:
                row["result"] = f"mlx-lm cannot decode it here: {CANNOT[name]}"
                continue
            try:
                pair = load_pair(write(Path(tmp) / name, tiny_config(name), seed=1,
                                       dtype=None if name in NAMED else "float32"))
            except PairError as e:
                row["result"] = f"refused at load: {e}"
                continue
            ids = [5, 17, 33, 60, 5, 17, 90, 12]
            ref = classic(pair, ids, tokens)
            mine = [int(t) for t, _ in zip((t for t, _ in generate_step(mx.array(ids), pair.target,
                                                                          max_tokens=tokens)), range(tokens))]
            same = []
            method = ""
            for w in widths:
                run = speculative(pair, ids, tokens, w, drafter=AgreeingDrafter([ids[-1]] + ref.tokens, 0.6, seed=w))
                same.append(run.tokens == ref.tokens)
                method = run.rollback["method"] + (" (fallback)" if run.rollback["fallback"] else "")
            row["caches"] = [f"{e['kind']} x{e['layers']}" for e in pair.caches.summary()]
            row["rewind"] = method
            row["window"] = pair.window
            row["result"] = ("byte-identical" if all(same) and ref.tokens == mine else
                             f"DIFFERS (classic vs mlx-lm {ref.tokens == mine}, widths {same})")
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Every family's tiny checkpoint through the engine, "
                                             "as a Markdown table (docs/families.md)")
    ap.add_argument("families", nargs="*", help="default: every family mlx-lm ships")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    names = args.families or [*NAMED, *(f for f in families() if f not in NAMED)]
    rows = survey(names)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| family | caches (layers) | recurrent rollback | result |")
    print("|---|---|---|---|")
    for r in rows:
        caches = ", ".join(r.get("caches", [])) or "-"
        print(f"| {r['family']} | {caches} | {r.get('rewind', '-') if r.get('rewind') != 'trim' else '-'} "
              f"| {r['result']} |")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
