"""Build the embedded demo pair: a small Llama target and a distilled drafter.

Everything comes from text every machine has offline: the running Python's
standard library source. Steps, each seeded:

1. corpus: the stdlib's ``.py`` files (tests and GUI packages left out), sorted;
2. tokenizer: byte-level BPE with a 2048-token vocabulary;
3. target: a 4.6M-parameter Llama trained on the corpus;
4. drafter: a 1.2M-parameter Llama distilled on the target's greedy outputs
   (labels are the target's argmax, on corpus windows and on the target's own
   greedy continuations);
5. variants: the target in bfloat16 and in 4-bit affine (group 64), the drafter
   in bfloat16; each a folder ``mlx_lm.load`` reads.

Run on a GPU (minutes on an H200; the CPU works, but for hours):

    python -m lab.build --out /tmp/demo

MLX on CUDA does not promise bitwise-reproducible reductions, so a rebuild is
the same procedure with the same seeds, not necessarily the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

SKIP_DIRS = {
    "test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages",
    "__pycache__", "turtledemo", "tkinter", "ensurepip", "pydoc_data",
}
EOS = "<|endoftext|>"

TARGET_CONFIG = dict(
    model_type="llama", hidden_size=256, num_hidden_layers=6, intermediate_size=640,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=2048,
    max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
)
DRAFTER_CONFIG = dict(
    model_type="llama", hidden_size=192, num_hidden_layers=2, intermediate_size=512,
    num_attention_heads=3, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=2048,
    max_position_embeddings=1024, rope_theta=10000.0, tie_word_embeddings=True,
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def build_corpus(stdlib: Path) -> list[str]:
    texts = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in sorted(files):
            if name.endswith(".py"):
                try:
                    texts.append((Path(root) / name).read_text(encoding="utf-8"))
                except (UnicodeDecodeError, OSError):
                    continue
    return texts


def train_tokenizer(texts: list[str], out: Path, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS, "bos_token": EOS, "unk_token": None,
        "model_max_length": 1024, "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": EOS, "bos_token": EOS}, indent=2))
    return tok


def make_model(config: dict):
    from mlx_lm.models import llama
    return llama.Model(llama.ModelArgs.from_dict(config))


def batches(data: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(data) - seq - 1, size=batch)
        x = np.stack([data[s:s + seq + 1] for s in starts])
        yield mx.array(x[:, :-1]), mx.array(x[:, 1:])


def lr_schedule(peak: float, steps: int, warmup: int):
    return optim.join_schedules(
        [optim.linear_schedule(1e-5, peak, warmup),
         optim.cosine_decay(peak, steps - warmup, peak * 0.05)],
        [warmup],
    )


def compiled_step(model, loss_fn, opt):
    """One compiled step of ``opt`` on ``loss_fn(model, x, y, ...)`` with gradients clipped to norm 1,
    and the state it updates (``mx.eval`` it after each step)."""
    state = [model.state, opt.state]

    def step(x, *y):  # y: the labels, and any further arrays loss_fn reads (soft labels)
        loss, grads = nn.value_and_grad(model, lambda *a: loss_fn(model, *a))(x, *y)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        opt.update(model, grads)
        return loss

    return mx.compile(step, inputs=state, outputs=state), state


def train(model, loss_fn, make_batch, steps: int, lr: float, name: str) -> float:
    opt = optim.AdamW(learning_rate=lr_schedule(lr, steps, max(steps // 20, 1)),
                      weight_decay=0.05)
    step, state = compiled_step(model, loss_fn, opt)
    t0, ema = time.time(), None
    for i in range(steps):
        x, y = make_batch()
        loss = step(x, y)
        mx.eval(state)
        if i % 100 == 0 or i == steps - 1:
            val = loss.item()
            ema = val if ema is None else 0.9 * ema + 0.1 * val
            log(f"{name} step {i}/{steps} loss {val:.3f} ({time.time() - t0:.0f}s)")
    return ema


def greedy_continuations(target, prompts: mx.array, n_new: int) -> mx.array:
    from mlx_lm.models.cache import make_prompt_cache
    cache = make_prompt_cache(target)
    logits = target(prompts, cache=cache)
    y = mx.argmax(logits[:, -1, :], axis=-1)
    out = [y]
    for _ in range(n_new - 1):
        logits = target(y[:, None], cache=cache)
        y = mx.argmax(logits[:, -1, :], axis=-1)
        out.append(y)
        mx.async_eval(y)
    return mx.concatenate([prompts, mx.stack(out, axis=1)], axis=1)


def save_checkpoint(model, config: dict, out: Path, tok_dir: Path, dtype: str,
                    quantize: bool = False) -> None:
    from mlx_lm.utils import quantize_model, save_config
    out.mkdir(parents=True, exist_ok=True)
    model.update(tree_map(lambda p: p.astype(mx.bfloat16), model.parameters()))
    config = dict(config, torch_dtype=dtype, eos_token_id=0, bos_token_id=0,
                  architectures=["LlamaForCausalLM"])
    if quantize:
        model, config = quantize_model(model, config, group_size=64, bits=4, mode="affine")
    weights = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)
    # config.json last: its presence says the checkpoint is whole (h200pipe's GPU 1 starts on
    # build_gpu's target-4bit/config.json while GPU 0's build goes on)
    save_config(config, out / "config.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--target-steps", type=int, default=2500)
    ap.add_argument("--drafter-steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    mx.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    work = args.out / "_work"
    started = time.time()

    texts = build_corpus(args.stdlib)
    log(f"corpus: {len(texts)} files, {sum(map(len, texts)) / 1e6:.1f} MB from {args.stdlib}")
    tok = train_tokenizer(texts, work / "tokenizer", TARGET_CONFIG["vocab_size"])
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    data = np.array(ids, dtype=np.int32)
    split = int(len(data) * 0.98)
    train_data, val_data = data[:split], data[split:]
    log(f"tokens: {len(data)} ({len(train_data)} train)")

    def ce(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    target = make_model(TARGET_CONFIG)
    n_target = sum(v.size for _, v in tree_flatten(target.parameters()))
    log(f"target: {n_target / 1e6:.2f}M parameters")
    gen = batches(train_data, args.batch, args.seq, rng)
    t_loss = train(target, ce, lambda: next(gen), args.target_steps, 3e-3, "target")
    target.eval()
    vx, vy = next(batches(val_data, 64, args.seq, np.random.default_rng(1)))
    t_val = ce(target, vx, vy).item()
    log(f"target train loss {t_loss:.3f} val loss {t_val:.3f}")

    # Contexts the drafter will meet while decoding: the target's own greedy text.
    pr = batches(train_data, 8 * args.batch, 64, np.random.default_rng(args.seed + 1))
    generated = []
    for _ in range(8):
        p, _ = next(pr)
        generated.append(np.array(greedy_continuations(target, p, args.seq - 64 + 1)))
    generated = np.concatenate(generated)
    log(f"generated {generated.shape[0]} greedy continuations")

    drafter = make_model(DRAFTER_CONFIG)
    n_drafter = sum(v.size for _, v in tree_flatten(drafter.parameters()))
    log(f"drafter: {n_drafter / 1e6:.2f}M parameters")
    # Three quarters of each batch is the target's own greedy text: that is what
    # the drafter has to predict while decoding.
    n_corpus = args.batch // 4
    corpus_gen = batches(train_data, n_corpus, args.seq, rng)

    def drafter_batch():
        cx, _ = next(corpus_gen)
        rows = rng.integers(0, generated.shape[0], size=args.batch - n_corpus)
        gx = mx.array(generated[rows, : args.seq])
        x = mx.concatenate([cx, gx], axis=0)
        y = mx.argmax(target(x), axis=-1)  # the target's greedy choice at every position
        return x, mx.stop_gradient(y)

    d_loss = train(drafter, ce, drafter_batch, args.drafter_steps, 3e-3, "drafter")
    drafter.eval()
    vlabels = mx.argmax(target(vx), axis=-1)
    agree = (mx.argmax(drafter(vx), axis=-1) == vlabels).astype(mx.float32).mean().item()
    log(f"drafter train loss {d_loss:.3f}; top-1 agreement with target on val {agree:.3f}")

    tok_dir = work / "tokenizer"
    save_checkpoint(target, TARGET_CONFIG, args.out / "target-bf16", tok_dir, "bfloat16")
    save_checkpoint(make_model_from(args.out / "target-bf16"), TARGET_CONFIG,
                    args.out / "target-4bit", tok_dir, "bfloat16", quantize=True)
    save_checkpoint(drafter, DRAFTER_CONFIG, args.out / "drafter", tok_dir, "bfloat16")
    shutil.rmtree(work)
    summary = {
        "python": sys.version.split()[0], "mlx": mx.__version__,
        "device": str(mx.default_device()), "seconds": round(time.time() - started, 1),
        "corpus_files": len(texts), "tokens": int(len(data)),
        "target_params": int(n_target), "drafter_params": int(n_drafter),
        "target_train_loss": round(t_loss, 3), "target_val_loss": round(t_val, 3),
        "drafter_train_loss": round(d_loss, 3), "drafter_val_agreement": round(agree, 3),
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    (args.out / "build.json").write_text(json.dumps(summary, indent=2))
    log(json.dumps(summary))
    return 0


def make_model_from(path: Path):
    from mlx_lm.utils import load_model
    model, _ = load_model(path)
    return model


if __name__ == "__main__":
    raise SystemExit(main())
