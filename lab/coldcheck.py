"""Cold check: does an A/B session's figure match what a new request sees?

Runs an A/B session in this process, then, for every arm, a fresh process that
loads the pair, warms its kernels at other positions (the session's warm-up
prompt) and decodes the session prompt once: nothing built for those exact
positions can be replayed there. Reports each arm's session median decode
tok/s beside the fresh figure; within 10 % means the session is cold-honest.

    python -m lab.coldcheck --target T --draft D --widths 4,8 --prompt-file P \\
        --verify-attention auto --out cold.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

# Checked when the arguments are parsed: a bad name stops the tool before any model loads.
from blockwidth.console.request import add_verify_attention, add_verify_linear  # the product's declarations

TOLERANCE = 0.10


def _prompt(args) -> str:
    """The session prompt: --prompt-file's text, or item --prompt-index of the JSON list in it
    (build_gpu's prompts.json); PromptsFileError, one line, when either is unusable."""
    from blockwidth.engine.demo.prompts import DEFAULT_PROMPT, PromptsFileError, read_prompts
    from blockwidth.policy import files

    if args.prompt_file is None:
        return DEFAULT_PROMPT
    try:
        text = files.read_text(files.user_path(args.prompt_file, "--prompt-file"), files.MAX_JSON_BYTES)
    except files.FileProblem as e:
        raise PromptsFileError.of(e, "--prompt-file") from None
    if not text.lstrip().startswith("["):
        if not text.strip():
            raise PromptsFileError(f"--prompt-file {args.prompt_file}: empty; expected a prompt or a JSON list of prompts")
        if args.prompt_index != 0:  # an index into one prompt would be ignored, and the run mislabelled
            raise PromptsFileError(f"--prompt-index {args.prompt_index}: {args.prompt_file} is one prompt "
                                   f"(plain text, not a JSON list); give 0 or leave it out")
        return text
    prompts = read_prompts(args.prompt_file, "--prompt-file")
    if not 0 <= args.prompt_index < len(prompts):
        raise PromptsFileError(f"--prompt-index {args.prompt_index}: {args.prompt_file} holds {len(prompts)} "
                               f"prompt{'s' if len(prompts) > 1 else ''}; give 0 to {len(prompts) - 1}")
    return prompts[args.prompt_index]


def _fresh(args, width: int | None) -> dict:
    cmd = [sys.executable, "-m", "lab.coldcheck", "--one", "classic" if width is None else str(width),
           "--target", args.target, "--verify-attention", args.verify_attention,
           "--verify-linear", args.verify_linear,
           "--max-tokens", str(args.max_tokens), "--prompt-index", str(args.prompt_index),
           "--widths", args.widths]
    if args.draft:
        cmd += ["--draft", args.draft]
    if args.prompt_file:
        cmd += ["--prompt-file", args.prompt_file]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def one(args) -> int:
    """In a fresh process: warm kernels elsewhere, then decode the session prompt once."""
    from blockwidth.engine.ab import warmup_prompt
    from blockwidth.engine.decode import decode
    from blockwidth.engine.pair import load_pair

    pair = load_pair(args.target, args.draft)
    ids = pair.tokenizer.encode(_prompt(args))
    width = None if args.one == "classic" else int(args.one)
    widest = max(int(w) for w in args.widths.split(","))
    warm_ids, shift = warmup_prompt(ids, args.max_tokens, widest, pair.context_length)
    kw = {} if width is None else {"attention": args.verify_attention, "linear": args.verify_linear}
    decode(pair, warm_ids, args.max_tokens, width, **kw)
    run = decode(pair, ids, args.max_tokens, width, **kw)
    print(json.dumps({"decode_tok_s": run.decode_tok_s, "tokens": len(run.tokens), "warmup_shift": shift}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft")
    ap.add_argument("--widths", default="4,8")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-file")
    ap.add_argument("--prompt-index", type=int, default=0)
    add_verify_attention(ap)
    add_verify_linear(ap)
    ap.add_argument("--fresh-runs", type=int, default=1, help="fresh processes per arm (median)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return one(args)
    from blockwidth.engine.demo.prompts import PromptsFileError

    try:  # before any model loads: a bad file or index costs no minutes
        prompt = _prompt(args)
    except PromptsFileError as e:
        print(e, file=sys.stderr)
        return 2

    from blockwidth.engine.ab import AbConfig, run_session
    from blockwidth.engine.pair import load_pair

    t0 = time.time()
    pair = load_pair(args.target, args.draft)
    widths = tuple(int(w) for w in args.widths.split(","))
    session = run_session(pair, AbConfig(widths=widths, prompt=prompt, n=args.n,
                                         max_tokens=args.max_tokens, exactness=False, predict=False,
                                         verify_attention=args.verify_attention,
                                         verify_linear=args.verify_linear))
    rows = []
    for arm in [session.classic, *session.arms]:
        # One fresh process per run: on a noisy host a single run varies by more than 10 %,
        # so --fresh-runs K gives the fresh side a median and a range too.
        fresh = [_fresh(args, arm.width) for _ in range(args.fresh_runs)]
        speeds = [f["decode_tok_s"] for f in fresh if "decode_tok_s" in f]
        errors = [f["error"] for f in fresh if "error" in f]
        med = arm.decode_range().median
        fmed = statistics.median(speeds) if speeds else None
        ratio = fmed / med if med and fmed else None
        rows.append({"arm": arm.name, "session_median_tok_s": round(med, 2),
                     "session_first_run_tok_s": round(arm.runs[0].decode_tok_s, 2),
                     "fresh_process_tok_s": round(fmed, 2) if fmed else None,
                     "fresh_runs_tok_s": [round(x, 2) for x in speeds],
                     "fresh_over_session": round(ratio, 3) if ratio else None,
                     "within_10pct": ratio is not None and abs(ratio - 1) <= TOLERANCE,
                     "error": errors[0] if errors else None})
    result = {"verify_attention": session.attention, "verify_linear": args.verify_linear, "target": args.target, "draft": args.draft,
              "max_tokens": args.max_tokens, "n": args.n, "warnings": session.warnings(),
              "replayed_arms": session.replayed_arms(), "arms": rows, "seconds": round(time.time() - t0, 1)}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
