"""Train the demo pair's hidden-state drafters (DFlash, MTP) and retrain its draft model.

Reads the demo targets in ``engine/demo/pair`` (or ``--pair``) and writes, in
the published formats the engine loads:

- ``dflash/``: a ``DFlashDraftModel`` (2 layers, block 16) reading target
  layers 1, 3 and 5, trained on blocks of 2..16 rows of the targets' own greedy
  text: the first token given, the rest masks, each row labelled with the text;
- ``mtp/``: one DeepSeek-V3-layout NextN head (``model.layers.6.*``), trained to
  predict x[t+2] from the target's final hidden state at t and x[t+1], and, by
  feeding its own output back, x[t+3];
- ``drafter/``: the Llama draft model, distilled again on greedy text of both
  the bfloat16 and the 4-bit target (labels: each target's own argmax), so
  that it agrees with the quantized target too.

The training text is the targets' greedy continuations of corpus windows, so
every label is what the target itself would emit. Run on a GPU:

    python -m engine.demo.build_drafters --out /tmp/drafters

``--steps`` and ``--windows`` make it a smoke test anywhere (a few steps on a CPU).
The writers (``write_dflash``, ``write_mtp``) also make the random-weight
checkpoints the tests load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map

from engine import hidden
from engine.demo.build import (DRAFTER_CONFIG, batches, build_corpus, greedy_continuations, log,
                               make_model, train)

PAIR = Path(__file__).resolve().parent / "pair"
BLOCK = 16
DFLASH_LAYERS = (1, 3, 5)


def dflash_config(target_config: dict, *, layers: tuple[int, ...] = DFLASH_LAYERS, n_layers: int = 2,
                  block: int = BLOCK, mask: int | None = None) -> dict:
    """A DFlashDraftModel config for ``target_config``, laid out as z-lab's published ones."""
    t = target_config
    heads = t["num_attention_heads"]
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": block,
        "dflash_config": {"mask_token_id": t["vocab_size"] - 1 if mask is None else mask,
                          "target_layer_ids": list(layers)},
        "hidden_size": t["hidden_size"], "num_hidden_layers": n_layers,
        "num_attention_heads": heads, "num_key_value_heads": t.get("num_key_value_heads", heads),
        "head_dim": t["hidden_size"] // heads, "intermediate_size": t["intermediate_size"],
        "vocab_size": t["vocab_size"], "rms_norm_eps": t.get("rms_norm_eps", 1e-6),
        "rope_theta": t.get("rope_theta", 10000.0), "rope_scaling": None,
        "max_position_embeddings": t.get("max_position_embeddings", 2048),
        "num_target_layers": t["num_hidden_layers"], "layer_types": ["full_attention"] * n_layers,
        "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }


def write_dflash(out: Path, config: dict, model=None, seed: int = 0) -> Path:
    """Write a DFlash checkpoint (``model``'s weights, or random ones)."""
    from engine.dflash import DFlashModel, parse_spec

    if model is None:
        mx.random.seed(seed)
        model = DFlashModel(parse_spec(config, str(out)))
    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def mtp_config(target_config: dict, heads: int = 1) -> dict:
    """A separate NextN head checkpoint's config: the target's, plus the head count."""
    c = {k: v for k, v in target_config.items() if k not in ("quantization", "quantization_config")}
    arch = (target_config.get("architectures") or ["LlamaForCausalLM"])[0]
    c.update(architectures=[f"{arch}NextN"], num_nextn_predict_layers=heads)
    return c


def mtp_names(layout: str, target_config: dict, head: int = 0) -> dict[str, str]:
    """Published prefix and names of one head's own tensors in ``layout``."""
    n = target_config["num_hidden_layers"]
    if layout == "deepseek-v3":
        return {"prefix": f"model.layers.{n + head}.", "enorm": "enorm", "hnorm": "hnorm",
                "proj": "eh_proj", "norm": "shared_head.norm", "block": ""}
    if layout == "qwen3.5":
        return {"prefix": "mtp.", "enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden",
                "proj": "fc", "norm": "norm", "block": "layers.0."}
    return {"prefix": f"model.mtp_layers.{head}.", "enorm": "token_layernorm",
            "hnorm": "hidden_layernorm", "proj": "input_proj", "norm": "final_layernorm", "block": ""}


def mtp_head(target_config: dict):
    from engine.mtp import Head, Layout, build_block

    return Head(target_config["hidden_size"], float(target_config.get("rms_norm_eps", 1e-6)),
                [build_block(target_config, "demo")], Layout.DEEPSEEK)


def mtp_tensors(head, layout: str, target_config: dict, index: int = 0) -> dict[str, mx.array]:
    names = mtp_names(layout, target_config, index)
    out = {}
    for k, v in tree_flatten(head.parameters()):
        top, rest = k.split(".", 1)
        if top == "blocks":
            rest = rest.split(".", 1)[1]
            name = names["block"] + rest
        else:
            name = names[top] + "." + rest
        out[names["prefix"] + name] = v.astype(mx.bfloat16)
    return out


def write_mtp(out: Path, target_config: dict, head=None, layout: str = "deepseek-v3", seed: int = 0,
              config: dict | None = None) -> Path:
    """Write a separate MTP head checkpoint in ``layout`` (``head``'s weights, or random ones)."""
    if head is None:
        mx.random.seed(seed)
        head = mtp_head(target_config)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config or mtp_config(target_config)
    if layout == "qwen3.5":
        cfg = dict(cfg)
        cfg.pop("num_nextn_predict_layers", None)
        cfg["mtp_num_hidden_layers"] = 1
    mx.save_safetensors(str(out / "model.safetensors"), mtp_tensors(head, layout, target_config),
                        metadata={"format": "mlx"})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


# -- training -------------------------------------------------------------------------------


def target_features(target, x: mx.array, layers: tuple[int, ...]) -> tuple[mx.array, dict]:
    """The target's logits and the hidden states at ``layers`` (and FINAL) for a batch, one forward."""
    got: dict = {}
    with hidden.Capture(target, layers, got.update):
        logits = target(x)
    return logits, got


def train_dflash(targets, text: np.ndarray, steps: int, batch: int, blocks: int, lr: float,
                 config: dict, rng: np.random.Generator):
    from engine.dflash import DFlashModel, parse_spec

    spec = parse_spec(config, "demo dflash")
    model = DFlashModel(spec)
    layers = spec.target_layer_ids
    seq = text.shape[1]

    def make_batch():
        target = targets[rng.integers(len(targets))]
        rows = text[rng.integers(0, text.shape[0], size=batch)]
        x = mx.array(rows)
        _, got = target_features(target, x, layers)
        feats = mx.stop_gradient(mx.concatenate([got[i] for i in layers], axis=-1))
        # anchors: the block's first (given) token; at least 8 context rows before it
        # a block of every width the engine may run (2..16 rows), one length per step
        size = int(rng.integers(2, BLOCK + 1))
        starts = rng.integers(8, seq - size, size=(batch, blocks))
        seq_of = np.repeat(np.arange(batch), blocks)
        starts = starts.reshape(-1)
        idx = starts[:, None] + np.arange(size)[None, :]
        tokens = rows[seq_of[:, None], idx]  # (N, BLOCK) the true text of each block
        inp = np.full_like(tokens, spec.mask_token_id)
        inp[:, 0] = tokens[:, 0]
        emb = mx.stop_gradient(hidden.embed(target)(mx.array(inp)))
        return (emb, feats, mx.array(starts), mx.array(seq_of), mx.array(tokens[:, 1:]), target)

    head_of = {}

    def loss_fn(model, emb, feats, starts, seq_of, labels, target):
        h = model.train_forward(emb, feats, starts, seq_of)[:, 1:]
        logits = hidden.lm_head(target)(h)
        # earlier rows matter more: a width-4 round reads rows 1..3 only
        w = mx.exp(-mx.arange(labels.shape[1]) / 6.0)
        ce = nn.losses.cross_entropy(logits, labels, reduction="none")
        return (ce * w).sum() / (w.sum() * ce.shape[0])

    del head_of
    return model, _fit(model, loss_fn, make_batch, steps, lr, "dflash")


def train_mtp(targets, text: np.ndarray, steps: int, batch: int, lr: float, target_config: dict,
              rng: np.random.Generator):
    head = mtp_head(target_config)

    def make_batch():
        target = targets[rng.integers(len(targets))]
        rows = mx.array(text[rng.integers(0, text.shape[0], size=batch)])
        _, got = target_features(target, rows, (hidden.FINAL,))
        h = mx.stop_gradient(got[hidden.FINAL])
        return (h, rows, target)

    def loss_fn(head, h, rows, target):
        emb = hidden.embed(target)
        lm = hidden.lm_head(target)
        # depth 1: (h[t], x[t+1]) -> x[t+2]
        out, chain = head(h[:, :-2], emb(rows[:, 1:-1]))
        l1 = nn.losses.cross_entropy(lm(out), rows[:, 2:], reduction="mean")
        # depth 2, as decoding chains it: (head output at t, x[t+2]) -> x[t+3]
        out2, _ = head(chain[:, :-1], emb(rows[:, 2:-1]))
        l2 = nn.losses.cross_entropy(lm(out2), rows[:, 3:], reduction="mean")
        return l1 + 0.5 * l2

    return head, _fit(head, loss_fn, make_batch, steps, lr, "mtp")


SECONDS: dict[str, float] = {}  # name -> wall-clock budget; overrides the step count


def _fit(model, loss_fn, make_batch, steps: int, lr: float, name: str) -> float:
    """AdamW with warm-up and cosine decay over ``steps``, or over a time budget (SECONDS[name]):
    then the schedule follows the elapsed fraction of the budget."""
    import math

    import mlx.optimizers as optim

    budget = SECONDS.get(name)
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.05)
    grad = nn.value_and_grad(model, loss_fn)
    t0, ema, i = time.time(), None, 0
    while True:
        if i == 3 and budget:
            t0 = time.time()  # the budget starts after the first steps: on CUDA they JIT-compile
        frac = (time.time() - t0) / budget if budget else i / max(steps, 1)
        if frac >= 1.0:
            break
        warm = min(frac / 0.05, 1.0)
        opt.learning_rate = lr * warm * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        *args, target = make_batch()
        loss, g = grad(model, *args, target)
        g, _ = optim.clip_grad_norm(g, 1.0)
        opt.update(model, g)
        mx.eval(model.parameters(), opt.state, loss)
        if i % 100 == 0:
            v = loss.item()
            ema = v if ema is None else 0.9 * ema + 0.1 * v
            log(f"{name} step {i} loss {v:.3f} ({time.time() - t0:.0f}s)")
        i += 1
    log(f"{name}: {i} steps in {time.time() - t0:.0f}s")
    model.eval()
    return float(ema or 0.0)


def greedy_text(targets, data: np.ndarray, windows: int, prompt: int, new: int, seed: int) -> np.ndarray:
    """Greedy continuations of corpus windows, half by each target (their own argmax path)."""
    out = []
    calls = 2  # few long calls: on CUDA every new KV length costs an attention plan
    per = max(windows // (len(targets) * calls), 1)
    src = batches(data, per, prompt, np.random.default_rng(seed))
    for t in targets:
        for _ in range(calls):
            p, _ = next(src)
            out.append(np.array(greedy_continuations(t, p, new)))
    return np.concatenate(out)


def save_drafter(model, out: Path, tok_dir: Path) -> None:
    from mlx_lm.utils import save_config

    out.mkdir(parents=True, exist_ok=True)
    model.update(tree_map(lambda p: p.astype(mx.bfloat16), model.parameters()))
    config = dict(DRAFTER_CONFIG, torch_dtype="bfloat16", eos_token_id=0, bos_token_id=0,
                  architectures=["LlamaForCausalLM"])
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    save_config(config, out / "config.json")
    for f in tok_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)


def quantize_target(pair: Path) -> None:
    """target-4bit from target-bf16, as engine.demo.build makes it (affine, 4 bits, group 64)."""
    from mlx_lm.utils import load_model, quantize_model, save_config

    model, config = load_model(pair / "target-bf16")
    config = json.loads((pair / "target-bf16" / "config.json").read_text())
    model, config = quantize_model(model, config, group_size=64, bits=4, mode="affine")
    out = pair / "target-4bit"
    out.mkdir()
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())),
                        metadata={"format": "mlx"})
    save_config(config, out / "config.json")
    for f in (pair / "target-bf16").iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, out / f.name)
    log(f"quantized {out}")


def acceptance(pair: Path, built: Path, width: int = 4, tokens: tuple[int, ...] = (64, 128)) -> dict:
    """Per-drafted-token acceptance at ``width`` on the demo prompts, through this engine's loop,
    for every drafter in ``built`` against both demo targets: pooled and per prompt."""
    from engine.decode import speculative
    from engine.demo.prompts import DEMO_PROMPTS
    from engine.pair import load_pair

    out: dict = {}
    for kind, name in (("model", "drafter"), ("dflash", "dflash"), ("mtp", "mtp")):
        if not (built / name).is_dir():
            continue
        for variant in ("bf16", "4bit"):
            p = load_pair(pair / f"target-{variant}", built / name, kind)
            for n in tokens:
                acc = dra = 0
                per = []
                for prompt in DEMO_PROMPTS:
                    run = speculative(p, p.tokenizer.encode(prompt), n, width)
                    acc, dra = acc + run.accepted, dra + run.drafted
                    per.append(round(run.acceptance or 0.0, 3))
                key = f"{kind} {variant} {n} tokens"
                out[key] = {"pooled": round(acc / dra, 3) if dra else None, "per_prompt": per}
                log(f"acceptance w{width} {key}: {out[key]['pooled']} {per}")
    return out


def main(argv: list[str] | None = None) -> int:
    from mlx_lm.utils import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pair", type=Path, default=PAIR)
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--windows", type=int, default=4096, help="greedy continuations to train on")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dflash-steps", type=int, default=4000)
    ap.add_argument("--mtp-steps", type=int, default=4000)
    ap.add_argument("--drafter-steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=8, help="DFlash blocks per sequence")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("dflash", "mtp", "drafter"), action="append")
    ap.add_argument("--seconds", metavar="NAME=S", action="append", default=[],
                    help="train NAME (dflash, mtp, drafter) for S seconds instead of its steps")
    ap.add_argument("--drafter-init", type=Path, metavar="DIR",
                    help="start the draft model from these weights (fine-tune) instead of at random")
    ap.add_argument("--measure", type=Path, metavar="DIR",
                    help="only measure the acceptance of the drafters already built in DIR")
    args = ap.parse_args(argv)
    only = set(args.only or ("dflash", "mtp", "drafter"))
    if args.measure:
        result = acceptance(args.pair, args.measure)
        (args.measure / "acceptance.json").write_text(json.dumps(result, indent=2))
        return 0

    for item in args.seconds:
        name, _, sec = item.partition("=")
        SECONDS[name] = float(sec)
    mx.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    started = time.time()
    t16, _ = load_model(args.pair / "target-bf16")
    if not (args.pair / "target-4bit").is_dir():
        quantize_target(args.pair)
    t4, _ = load_model(args.pair / "target-4bit")
    tconfig = json.loads((args.pair / "target-bf16" / "config.json").read_text())
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.pair / "target-bf16" / "tokenizer.json"))
    texts = build_corpus(args.stdlib)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    data = np.array(ids, dtype=np.int32)
    log(f"corpus {len(texts)} files, {len(data)} tokens")
    text = greedy_text([t16, t4], data[: int(len(data) * 0.98)], args.windows, 64,
                       args.seq - 64 + 1, args.seed + 1)
    log(f"greedy text: {text.shape[0]} rows of {text.shape[1]} tokens (half bf16, half 4-bit target)")
    summary: dict = {"python": sys.version.split()[0], "mlx": mx.__version__,
                     "device": str(mx.default_device()), "greedy_rows": int(text.shape[0]),
                     "args": {k: str(v) for k, v in vars(args).items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    if "dflash" in only:
        cfg = dflash_config(tconfig)
        model, loss = train_dflash([t16, t4], text, args.dflash_steps, args.batch, args.blocks, 2e-3,
                                   cfg, rng)
        write_dflash(args.out / "dflash", cfg, model)
        summary["dflash_loss"] = round(loss, 3)
        summary["dflash_params"] = int(sum(v.size for _, v in tree_flatten(model.parameters())))
    if "mtp" in only:
        head, loss = train_mtp([t16, t4], text, args.mtp_steps, args.batch, 2e-3, tconfig, rng)
        write_mtp(args.out / "mtp", tconfig, head)
        summary["mtp_loss"] = round(loss, 3)
        summary["mtp_params"] = int(sum(v.size for _, v in tree_flatten(head.parameters())))
    if "drafter" in only:
        drafter = make_model(DRAFTER_CONFIG)
        if args.drafter_init:
            drafter.load_weights(str(args.drafter_init / "model.safetensors"))
            drafter.update(tree_map(lambda p: p.astype(mx.float32), drafter.parameters()))
        n_corpus = args.batch // 4
        corpus = batches(data, n_corpus, args.seq, rng)

        def drafter_batch():
            cx, _ = next(corpus)
            rows = rng.integers(0, text.shape[0], size=2 * args.batch - n_corpus)
            x = mx.concatenate([cx, mx.array(text[rows, : args.seq])], axis=0)
            # half the rows labelled by each target: the drafter serves both
            half = x.shape[0] // 2
            y = mx.concatenate([mx.argmax(t16(x[:half]), axis=-1), mx.argmax(t4(x[half:]), axis=-1)])
            return x, mx.stop_gradient(y)

        def ce(model, x, y):
            return nn.losses.cross_entropy(model(x), y, reduction="mean")

        if "drafter" in SECONDS:
            loss = _fit(drafter, lambda m, x, y, _t: ce(m, x, y), lambda: (*drafter_batch(), None),
                        args.drafter_steps, 1e-3 if args.drafter_init else 3e-3, "drafter")
        else:
            loss = train(drafter, ce, drafter_batch, args.drafter_steps, 3e-3, "drafter")
        drafter.eval()
        save_drafter(drafter, args.out / "drafter", args.pair / "target-bf16")
        summary["drafter_loss"] = round(loss, 3)
    summary["seconds"] = round(time.time() - started, 1)
    summary["acceptance_w4"] = acceptance(args.pair, args.out)
    name = "build-drafters" + ("-" + "-".join(sorted(only)) if args.only else "") + ".json"
    (args.out / name).write_text(json.dumps(summary, indent=2))
    log(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
