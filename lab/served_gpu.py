"""The served path on the GPU host (docs/served.md): one pair folder through the real mlx_lm.server,
three ways, beside the engine path at the same widths, into one folder of records.

    python3 -m lab.served_gpu --pair /root/bw/gpupair --out /root/bw/results/served

1. ``stock``: sweep --path mlx-lm-server at concurrency 1 and 4 (stock mlx_lm.server);
2. ``nocudnn``: the same at concurrency 1 with MLX_CUDA_USE_CUDNN_SDPA=0 in the servers'
   environment (MLX's own attention instead of cuDNN's);
3. ``dispatch``: the same at concurrency 1 with mlx_lm.server run in-process with blockwidth's
   verify-attention dispatcher (--verify-attention, default auto: plain on CUDA);
4. ``engine``: sweep --path engine at the same widths, prompt and tokens.

Each step has its own timeout and writes its records into OUT/<step>/; OUT/summary.md sets the
served figures beside the engine's (median tok/s per arm, identity by sending, verdict) and
OUT/served_gpu.log keeps every step's stderr. A step that fails is reported and the next one
runs. On this CPU (tests) it runs on the demo pair with tiny settings.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from blockwidth.console.request import add_verify_attention

ROOT = Path(__file__).resolve().parents[1]


def steps(a: argparse.Namespace) -> list[tuple[str, list[str], dict, float]]:
    pair = Path(a.pair)
    common = ["--target", str(pair / a.target), "--draft", str(pair / "drafter"), "--widths", a.widths,
              "-n", str(a.n), "--max-tokens", str(a.tokens)]
    if a.prompt_file:
        common += ["--prompt-file", a.prompt_file]
    served = ["sweep", "--path", "mlx-lm-server", *common, "--ready-timeout", str(a.ready_timeout)]
    return [
        ("stock", [*served, "--concurrency", a.concurrency], {}, a.step_timeout * 2),  # two levels
        ("nocudnn", [*served, "--concurrency", "1"], {"MLX_CUDA_USE_CUDNN_SDPA": "0"}, a.step_timeout),
        ("dispatch", [*served, "--concurrency", "1", "--verify-attention", a.verify_attention], {},
         a.step_timeout),
        ("engine", ["sweep", "--path", "engine", *common, "--verify-attention", a.verify_attention], {},
         a.step_timeout),
    ]


def prompt_file(pair: Path, out: Path) -> str | None:
    """The pair's first prompt (build_gpu's prompts.json), as a file sweep reads; None: the demo's."""
    src = pair / "prompts.json"
    if not src.is_file():
        return None
    from blockwidth.engine.demo.prompts import read_prompts

    prompts = read_prompts(src)
    dest = out / "prompt.txt"
    dest.write_text(prompts[0], encoding="utf-8")
    return str(dest)


def run(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.prompt_file is None:
        a.prompt_file = prompt_file(Path(a.pair), out)
    log = open(out / "served_gpu.log", "a", encoding="utf-8")
    status = {}
    for name, args, env_add, timeout in steps(a):
        if name not in a.only.split(","):
            continue
        rec = out / name
        cmd = [sys.executable, "-m", "blockwidth", *args, "--record-dir", str(rec)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", **env_add)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        t0 = time.monotonic()
        log.write(f"\n[{time.strftime('%T')}] {name}: {' '.join(cmd)} env {env_add}\n")
        log.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            # SIGINT, as Ctrl-C: blockwidth stops its servers and keeps the finished levels'
            # records; a SIGKILL would leave the servers running on the GPU.
            proc.send_signal(signal.SIGINT)
            try:
                stdout, _ = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, _ = proc.communicate()
            code = "timeout"
        (out / f"{name}.txt").write_text(stdout or "", encoding="utf-8")
        status[name] = {"code": code, "seconds": round(time.monotonic() - t0, 1)}
        print(f"served_gpu: {name}: {code} in {status[name]['seconds']} s", file=sys.stderr, flush=True)
    (out / "summary.md").write_text(summary(out, status), encoding="utf-8")
    (out / "status.json").write_text(json.dumps(status, indent=1), encoding="utf-8")
    return 0 if all(s["code"] in (0, 1) for s in status.values()) else 1


def _median(v):
    return None if not v else v[1]


def summary(out: Path, status: dict) -> str:
    """Median tok/s per arm (decode at concurrency 1, aggregate above) of every record, the
    served steps beside the engine's; identity by sending and the verdict."""
    lines = ["# The served path beside the engine path", "",
             "| step | path | concurrency | arm | median tok/s | x classic | TTFT ms | identity | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in status:
        for f in sorted((out / name).glob("session-*.json")):
            rec = json.loads(f.read_text())
            arms = rec["arms"]
            classic = _median(arms[0]["decode_tok_s"])
            for arm in arms:
                med = _median(arm["decode_tok_s"])
                ratio = f"{med / classic:.2f}" if med and classic else "-"
                ident = arm.get("served_identity") or {}
                if arm["width"] is None:
                    words = "-"
                elif ident:
                    words = ", ".join(f"{k.replace('_', ' ')} {'same' if i['identical_ids'] else 'DIFFERS'}"
                                      for k, i in ident.items() if i)
                else:
                    words = "same" if (arm.get("identity") or {}).get("identical_ids") else "DIFFERS"
                ttft = arm.get("ttft_s")
                lines.append(f"| {name} | {rec.get('path', 'engine')} | {rec.get('concurrency', 1)} | "
                             f"{arm['arm']} | {med if med is not None else '-'} | {ratio} | "
                             f"{round(ttft[1] * 1e3) if ttft else '-'} | {words} | {arm['verdict']} |")
    lines += ["", "steps: " + ", ".join(f"{k} {v['code']} ({v['seconds']} s)" for k, v in status.items())]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m lab.served_gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pair", required=True, help="a pair folder: target-bf16/ (or --target) and drafter/")
    ap.add_argument("--out", required=True, help="where the records, summary.md and the log go")
    ap.add_argument("--target", default="target-bf16", help="the target's folder in the pair")
    ap.add_argument("--widths", default="4,8")
    ap.add_argument("-n", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4", help="the stock step's levels")
    add_verify_attention(ap)  # the dispatch and engine steps' mode (the product's declaration)
    ap.add_argument("--prompt-file", default=None, help="default: the pair's prompts.json first prompt")
    ap.add_argument("--step-timeout", type=float, default=50.0,
                    help="seconds a step may take (stock, with two levels: twice); 4 steps fit 4 minutes")
    ap.add_argument("--ready-timeout", type=float, default=90.0)
    ap.add_argument("--only", default="stock,nocudnn,dispatch,engine")
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
