"""Build the GPU-scale pair: a 1.04B-parameter Llama target and a distilled drafter.

The embedded demo pair (4.7M) is launch-bound on a GPU: its forward costs
what its kernel launches cost, whatever the rows, so it cannot show where a
verify stops being cheap. This target is large enough that a 1-row forward
reads ~2 GB of weights. It is built the way the demo pair is (lab/build.py:
the running Python's standard library, the demo pair's 2048-token tokenizer),
on a GPU, within a time budget:

1. target: hidden 2048, 22 layers, MLP 6144, 32 heads (4 KV heads), 1.04B
   parameters (``--shape 3.5b``: 16 layers of an 8B Llama's layer, hidden 4096, MLP 14336,
   8 KV heads, 3.5B parameters, whose step reads its weights more than it launches kernels),
   computing in bfloat16 with float32 master weights in AdamW (cosine),
   for ``--target-seconds``;
2. drafter: the target's shape cut to 2 layers (103M parameters; on a GPU a draft
   step costs its kernel launches, so width is nearly free and depth is not),
   started from the target's embedding, first two layers, norm and head, then
   distilled on the target's own greedy continuations of corpus windows (as many
   as ``--gen-seconds`` generates, ``--gen-batch`` at a time). The label at each
   position is the target's argmax after that prefix; the loss reads the positions
   from the prompt's last token on (``--drafter-labels continuation``) or all of them
   (``all``: inside the prompt from the prefill's logits), and with ``--drafter-soft``
   adds cross-entropy against the target's top-``k`` distribution (kept while generating);
3. variants: target in bfloat16 and 4-bit affine (group 64), drafter in bfloat16;
4. held-out prompts (validation text the target never trained on), and the
   drafter's acceptance per drafted token at width 4 on them, through this engine.

    python -m lab.build_gpu --out /root/gpupair       (7 to 10 minutes on an H200)

Weights stay where they are built (1b: 2 GB + 0.6 GB; 3.5b: 7 GB + 2 GB + 0.9 GB); build.json, the log and
prompts.json are small enough to commit.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_map

from lab import build as small

SHAPES = {
    "1b": (dict(hidden_size=2048, num_hidden_layers=22, intermediate_size=6144,
                num_attention_heads=32, num_key_value_heads=4),
           # Two layers: on a GPU a small model's step costs its kernel launches, so a
           # drafter pays per layer; 2 wide layers draft at ~1/11 of the target's 22.
           dict(hidden_size=2048, num_hidden_layers=2, intermediate_size=6144,
                num_attention_heads=32, num_key_value_heads=4)),
    # 16 layers of an 8B Llama's layer (hidden 4096, MLP 14336, 32 heads, 8 KV heads): 3.5B
    # parameters, 7 GB in bfloat16. The 1B's 2048-wide layers cost an H200 more in kernel
    # launches than in weight reads (a 1-row forward reads 2 GB in ~2.7 ms, ~0.8 TB/s), so its
    # step moved with the host's state by up to 1.6x and a 2-row verify cost 2-3 steps; an
    # 8B layer reads 436 MB a step. Measured on this shape (2026-11-30e): a 1-row step of 2.3 ms
    # (~3 TB/s), 2-8-row projections at 1.1-1.4x their 1-row time, but a whole 2-8-row forward
    # still ~2x (attention, host graph building). Sixteen layers train in a 10-minute build;
    # the drafter is two of them.
    "3.5b": (dict(hidden_size=4096, num_hidden_layers=16, intermediate_size=14336,
                  num_attention_heads=32, num_key_value_heads=8),
             dict(hidden_size=4096, num_hidden_layers=2, intermediate_size=14336,
                  num_attention_heads=32, num_key_value_heads=8)),
    # 6 layers of a 70B Llama's layer (hidden 8192, MLP 28672, 64 heads, 8 KV heads): 5.17B
    # parameters, 10.3 GB in bfloat16. On the 3.5B (2026-11-30f) the GPU was busy only about half
    # of a decode's time (nvidia-smi utilisation median 50 %) and the main thread on the CPU
    # 82-100 %: its step is bound by the host's per-operation work (graph building, kernel
    # encoding), which a verify pays in full, not by its weights. A layer four times as wide
    # reads four times the weights for the same host work, so a step of fewer, wider layers is
    # bound by its weights, where a verify of a few rows costs little more than a step. The
    # drafter is one such layer, started from the target's first.
    "5b": (dict(hidden_size=8192, num_hidden_layers=6, intermediate_size=28672,
                num_attention_heads=64, num_key_value_heads=8),
           dict(hidden_size=8192, num_hidden_layers=1, intermediate_size=28672,
                num_attention_heads=64, num_key_value_heads=8)),
    # For trying the script on a CPU in seconds; meaningless as a pair.
    "tiny": (dict(hidden_size=128, num_hidden_layers=2, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=2),
             dict(hidden_size=128, num_hidden_layers=1, intermediate_size=256,
                  num_attention_heads=4, num_key_value_heads=2)),
}
# Learning rates (target, drafter) by shape: 4096-wide layers on a batch of 8192 tokens train
# at half the 1B's rates (larger layers take smaller steps at the same batch).
LRS = {"1b": (6e-4, 2e-3), "3.5b": (3e-4, 1e-3), "5b": (2e-4, 6e-4), "tiny": (6e-4, 2e-3)}
COMMON = dict(model_type="llama", rms_norm_eps=1e-5, vocab_size=2048, max_position_embeddings=4096,
              rope_theta=10000.0, tie_word_embeddings=False)


def free() -> None:
    """Give MLX's cached buffers back once the arrays that used them are gone (reference cycles
    included), so that the next stage starts from the memory it needs."""
    gc.collect()
    mx.clear_cache()


def memory(stage: str) -> None:
    """Log the memory MLX holds after ``stage`` (active, and the peak since the last call)."""
    small.log(f"memory after {stage}: {mx.get_active_memory() / 1e9:.1f} GB active, "
              f"peak {mx.get_peak_memory() / 1e9:.1f} GB")
    mx.reset_peak_memory()


def timed_train(model, loss_fn, make_batch, seconds: float, lr: float, name: str,
                probe_steps: int = 10, master: bool = False) -> tuple[float, int]:
    """Train for about ``seconds``: time ``probe_steps`` steps first, then run the number of
    steps that fills the budget under a warm-up + cosine schedule. Returns (last loss, steps).

    ``master``: the model computes in bfloat16 but AdamW keeps float32 master weights and
    moments. Pure-bfloat16 AdamW loses every update smaller than the weight's 8-bit
    mantissa (~0.4 %), so once the cosine schedule brings the learning rate down the
    weights stop moving; the first 1B build stalled at a validation loss of 4.38 that way."""

    def make_step(opt):
        if not master:
            return small.compiled_step(model, loss_fn, opt)
        held = {"w": tree_map(lambda p: p.astype(mx.float32), model.trainable_parameters())}
        opt.init(held["w"])
        state = [model.state, opt.state, held]

        def step(x, *y):
            loss, grads = nn.value_and_grad(model, lambda *a: loss_fn(model, *a))(x, *y)
            grads = tree_map(lambda g: g.astype(mx.float32), grads)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            held["w"] = opt.apply_gradients(grads, held["w"])
            model.update(tree_map(lambda w: w.astype(mx.bfloat16), held["w"]))
            return loss

        return mx.compile(step, inputs=state, outputs=state), state

    step, state = make_step(optim.AdamW(learning_rate=lr * 0.05, weight_decay=0.05))
    t0 = time.time()
    for i in range(probe_steps + 2):
        if i == 2:
            mx.eval(state)
            t0 = time.time()  # the first two steps compile
        loss = step(*make_batch())
        mx.eval(state)
    per_step = (time.time() - t0) / probe_steps
    steps = max(int((seconds - (time.time() - t0)) / per_step), 20)
    # The probe's master weights and moments go before the run's are made: on the 5b they are
    # 62 GB, and two sets of them with the weights come near an H200's 141 GB
    step = state = None
    free()
    small.log(f"{name}: {per_step * 1e3:.0f} ms a step, {steps} steps in the budget"
              + (" (float32 master weights)" if master else ""))
    opt = optim.AdamW(learning_rate=small.lr_schedule(lr, steps, max(steps // 20, 1)), weight_decay=0.05)
    step, state = make_step(opt)
    t0 = time.time()
    last = float("nan")
    for i in range(steps):
        loss = step(*make_batch())
        mx.eval(state)
        if i % 100 == 0 or i == steps - 1:
            last = loss.item()
            small.log(f"{name} step {i}/{steps} loss {last:.3f} ({time.time() - t0:.0f}s)")
    return last, steps


@dataclass(frozen=True)
class Rows:
    """Distillation rows: ``tokens`` [n, P + new] (corpus prompt, then the target's greedy text),
    ``labels`` [n, P + new - 1], the target's argmax after each prefix (inside the prompt too,
    from the prefill's logits; from the prompt's last token on it is the next token), and with
    ``topk`` > 0 the target's ``topk`` largest logits and their ids at each of those positions."""

    tokens: np.ndarray
    labels: np.ndarray
    top_ids: np.ndarray | None = None  # int16: the vocabulary is 2048
    top_logits: np.ndarray | None = None  # float16

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def batch(self, idx: np.ndarray) -> tuple[mx.array, ...]:
        """Drafter inputs, hard labels and, when kept, the soft labels of rows ``idx``."""
        out = (mx.array(self.tokens[idx, :-1]), mx.array(self.labels[idx]))
        if self.top_ids is not None:
            out += (mx.array(self.top_ids[idx].astype(np.int32)), mx.array(self.top_logits[idx]))
        return out


def distil_loss(z: mx.array, labels: mx.array, top: tuple[mx.array, ...], soft: float,
                weight: mx.array | None = None) -> mx.array:
    """The drafter's loss on logits ``z`` [B, T, V]: cross-entropy against the target's argmax
    ``labels``, and with ``top`` = (ids, logits) of the target's k largest logits, ``soft`` of it
    cross-entropy against the target's distribution renormalised over those k tokens, averaged
    over the positions ``weight`` [T] marks (all when None). Greedy acceptance needs only the
    argmax; the rest of the distribution says how near the runner-up is, which a drafter
    reading each row many times over can learn from where one label cannot."""
    per = nn.losses.cross_entropy(z, labels, reduction="none")
    if top and soft > 0:
        ids, logits = top
        p = mx.softmax(logits.astype(mx.float32), axis=-1)
        z = z.astype(mx.float32)
        logq = mx.take_along_axis(z, ids, axis=-1) - mx.logsumexp(z, axis=-1, keepdims=True)
        per = (1 - soft) * per + soft * -(p * logq).sum(-1)
    if weight is None:
        return per.mean()
    return (per * weight).sum() / (weight.sum() * per.shape[0])


TOPK_ROWS = 32768  # rows per partition call: MLX's CUDA kernel puts the rows on grid.y (at most 65535)


def top_ids(logits: mx.array, k: int) -> mx.array:
    """The ids of the ``k`` largest logits along the last axis (in no order), at most
    ``TOPK_ROWS`` rows per call: MLX's CUDA partition launches one block per row on the grid's
    y axis, and a prefill of 2048 rows x 64 positions asked for 131072 ("invalid argument")."""
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [mx.argpartition(-flat[i:i + TOPK_ROWS], kth=k - 1, axis=-1)[:, :k]
             for i in range(0, flat.shape[0], TOPK_ROWS)]
    return mx.concatenate(parts).reshape(*logits.shape[:-1], k)


def greedy_rows(target, prompts: mx.array, new: int, topk: int) -> Rows:
    """``new`` greedy tokens after each prompt row, with the labels (and top-k logits) of every
    position, from the logits the prefill and each decode step compute anyway."""
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(target)
    ids, labels, tops = [prompts], [], []

    def keep(logits):  # [B, T, V]
        y = mx.argmax(logits, axis=-1)
        labels.append(y)
        if topk:
            top = top_ids(logits, topk)
            tops.append((top.astype(mx.int16), mx.take_along_axis(logits, top, axis=-1).astype(mx.float16)))
        return y[:, -1]

    y = keep(target(prompts, cache=cache))
    mx.async_eval(y, *(tops[-1] if topk else ()))
    for i in range(new):
        ids.append(y[:, None])
        if i + 1 < new:
            y = keep(target(y[:, None], cache=cache))
            # the step's top-k with its token: left lazy, each would hold the step's whole logits
            # (2048 rows x the vocabulary) until the batch ends
            mx.async_eval(y, *(tops[-1] if topk else ()))
    cat = (lambda xs: np.array(mx.concatenate(xs, axis=1)))
    return Rows(cat(ids), cat(labels), cat([t[0] for t in tops]) if topk else None,
                cat([t[1] for t in tops]) if topk else None)


def generate(target, data: np.ndarray, seconds: float, batch: int, prompt: int, new: int,
             rng: np.random.Generator, max_rows: int, topk: int = 0) -> Rows:
    """The target's greedy continuations of random corpus windows, ``batch`` at a time, for
    about ``seconds`` (at least one batch): rows of ``prompt`` corpus tokens + ``new`` greedy."""
    out: list[Rows] = []
    t0 = time.time()
    while (not out or time.time() - t0 < seconds) and len(out) * batch < max_rows:
        starts = rng.integers(0, len(data) - prompt - 1, size=batch)
        p = mx.array(np.stack([data[s:s + prompt] for s in starts]))
        out.append(greedy_rows(target, p, new, topk))
    cat = (lambda f: np.concatenate([f(r) for r in out]))
    return Rows(cat(lambda r: r.tokens), cat(lambda r: r.labels),
                cat(lambda r: r.top_ids) if topk else None, cat(lambda r: r.top_logits) if topk else None)


def held_out_prompts(val: np.ndarray, tok, n: int, length: int, rng: np.random.Generator) -> list[str]:
    """Prompt texts cut from validation windows (never trained on), each starting a line."""
    out = []
    while len(out) < n:
        s = int(rng.integers(0, len(val) - 4 * length))
        text = tok.decode(val[s:s + 4 * length].tolist())
        cut = text.find("\n")
        text = text[cut + 1:] if cut >= 0 else text
        ids = tok.encode(text).ids[:length]
        if len(ids) == length and 0 not in ids:
            out.append(tok.decode(ids))
    return out


def acceptance(target_dir: Path, drafter_dir: Path, prompts: list[str], width: int,
               tokens: int) -> dict:
    """Two readings of acceptance at ``width`` over ``prompts``: ``pooled`` = accepted / drafted
    (the share of drafted tokens kept), and ``per_position`` = the geometric per-token
    acceptance a of (1 - a^K) / (1 - a) (accepted / (accepted + rounds that rejected a
    draft); the engine's ``per_token_acceptance``). At width 4 the first is lower: a round
    drafts 3 and a rejection discards the rest of its block."""
    from blockwidth.engine.ab import per_token_acceptance
    from blockwidth.engine.decode import speculative
    from blockwidth.engine.pair import load_pair

    pair = load_pair(target_dir, drafter_dir)
    runs = [speculative(pair, pair.tokenizer.encode(p), tokens, width) for p in prompts]
    drafted = sum(r.drafted for r in runs)
    return {"width": width, "tokens": tokens,
            "pooled": round(sum(r.accepted for r in runs) / max(drafted, 1), 3),
            "per_position": round(per_token_acceptance(runs) or 0.0, 3),
            "teacher_forced": round(teacher_forced(pair, prompts, tokens), 3),
            "per_prompt": [round(r.acceptance or 0.0, 3) for r in runs]}


def teacher_forced(pair, prompts: list[str], tokens: int) -> float:
    """The drafter's top-1 agreement with the target's classic greedy continuation of each prompt,
    reading the target's own text (one drafter forward per prompt): what the per-position
    acceptance estimates, read without the draft loop (the two differ by estimator and sample:
    0.787 against 0.778 on 2026-11-30d's bf16 pair). A decode-time acceptance well under it would
    point at the engine's draft loop; one near it, at the drafter."""
    from blockwidth.engine.decode import classic

    hit = n = 0
    for p in prompts:
        ids = pair.tokenizer.encode(p)
        out = classic(pair, ids, tokens).tokens
        seq = ids + out
        guess = mx.argmax(pair.drafter(mx.array([seq[:-1]]))[0, len(ids) - 1:], axis=-1).tolist()
        hit += sum(g == t for g, t in zip(guess, out))
        n += len(out)
    return hit / max(n, 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="1b")
    ap.add_argument("--tokenizer", type=Path, default=Path(__file__).resolve().parents[1] / "engine" / "demo" / "pair" / "target-bf16")
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--target-seconds", type=float, default=210)
    ap.add_argument("--drafter-seconds", type=float, default=75)
    ap.add_argument("--target-lr", type=float, default=None, help="default: by --shape (1b 6e-4, 3.5b 3e-4)")
    ap.add_argument("--drafter-lr", type=float, default=None, help="default: by --shape (1b 2e-3, 3.5b 1e-3)")
    ap.add_argument("--drafter-soft", type=float, default=0.0, metavar="F",
                    help="weight (0..1) of the soft-label term in the drafter's loss: cross-entropy "
                         "against the target's distribution over its --drafter-topk largest logits at "
                         "each position, beside the hard label (its argmax); 0: hard labels only")
    ap.add_argument("--drafter-topk", type=int, default=16)
    ap.add_argument("--target-from", type=Path, metavar="PAIR",
                    help="a pair this script built: distil a drafter for its target (its target-bf16 and "
                         "target-4bit, linked into --out) instead of training one, to compare drafter recipes "
                         "on one target")
    ap.add_argument("--drafter-labels", choices=("continuation", "all"), default="continuation",
                    help="positions the drafter's loss reads: from the corpus prompt's last token on "
                         "(the target's greedy text), or every position (inside the prompt the label "
                         "is the target's argmax from the prefill's logits)")
    ap.add_argument("--gen-seconds", type=float, default=45,
                    help="time for the target's greedy continuations the drafter learns from")
    ap.add_argument("--gen-batch", type=int, default=512)
    ap.add_argument("--gen-rows", type=int, default=65536)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    args.target_lr = LRS[args.shape][0] if args.target_lr is None else args.target_lr
    args.drafter_lr = LRS[args.shape][1] if args.drafter_lr is None else args.drafter_lr
    if not 0.0 <= args.drafter_soft <= 1.0:
        print(f"--drafter-soft {args.drafter_soft}: a weight from 0 to 1", file=sys.stderr)
        return 2
    if args.target_from and not all((args.target_from / f"target-{v}" / "config.json").is_file()
                                    for v in ("bf16", "4bit")):
        print(f"--target-from {args.target_from}: no target-bf16 and target-4bit checkpoints there "
              f"(a folder this script built)", file=sys.stderr)
        return 2
    if args.target_from:
        # The drafter's shape, the record's target_config and the weights copied into the
        # drafter all come from --shape: a target of another shape is refused, not mis-recorded.
        try:
            got = json.loads((args.target_from / "target-bf16" / "config.json").read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"--target-from {args.target_from}: target-bf16/config.json unreadable ({e})", file=sys.stderr)
            return 2
        got = got if isinstance(got, dict) else {}
        off = [k for k, v in SHAPES[args.shape][0].items() if got.get(k) != v]
        if off:
            print(f"--target-from {args.target_from}: its target is not the --shape {args.shape} shape "
                  f"({', '.join(f'{k} {got.get(k)}' for k in off)})", file=sys.stderr)
            return 2
    if args.target_from and any((args.out / f"target-{v}").exists() and not (args.out / f"target-{v}").is_symlink()
                                for v in ("bf16", "4bit")):
        print(f"--out {args.out}: holds targets of its own; --target-from links its targets into a new "
              f"folder", file=sys.stderr)
        return 2
    if not 1 <= args.drafter_topk <= COMMON["vocab_size"]:
        print(f"--drafter-topk {args.drafter_topk}: from 1 to the vocabulary's {COMMON['vocab_size']}",
              file=sys.stderr)
        return 2

    from tokenizers import Tokenizer

    started = time.time()
    mx.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    tshape, dshape = SHAPES[args.shape]
    tconf, dconf = dict(COMMON, **tshape), dict(COMMON, **dshape)
    work = args.out / "_work"
    tok_dir = work / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(args.tokenizer / name, tok_dir / name)
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))

    texts = small.build_corpus(args.stdlib)
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(0)
    data = np.array(ids, dtype=np.int32)
    split = int(len(data) * 0.98)
    train_data, val_data = data[:split], data[split:]
    small.log(f"corpus: {len(texts)} files from {args.stdlib}, {len(data)} tokens ({split} train)")

    def ce(model, x, y):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    if args.target_from:
        # Another drafter recipe for a target already built: the same corpus split and seeds, so
        # the continuations and held-out prompts are drawn as that build drew them.
        target = small.make_model_from(args.target_from / "target-bf16")
        t_loss, t_steps = None, 0
        small.log(f"target: {args.target_from / 'target-bf16'}, not trained here")
    else:
        target = small.make_model(tconf)
        target.set_dtype(mx.bfloat16)
        gen = small.batches(train_data, args.batch, args.seq, rng)
        t_loss, t_steps = timed_train(target, ce, lambda: next(gen), args.target_seconds, args.target_lr,
                                      "target", master=True)
    n_target = sum(v.size for _, v in tree_flatten(target.parameters()))
    small.log(f"target: {n_target / 1e9:.3f}B parameters, bfloat16")
    free()
    memory("the target's training")
    target.eval()
    vx, vy = next(small.batches(val_data, 32, args.seq, np.random.default_rng(1)))
    t_val = ce(target, vx, vy).item()
    small.log(f"target last loss {'-' if t_loss is None else f'{t_loss:.3f}'}, validation loss {t_val:.3f}")
    # The targets are written as soon as they exist (target-4bit's config.json last), so that a
    # second process can distil another drafter for them (--target-from) while this one goes on.
    if args.target_from:  # the pair reads the targets where they are
        for v in ("bf16", "4bit"):
            link = args.out / f"target-{v}"
            if link.is_symlink():
                link.unlink()
            link.symlink_to((args.target_from / f"target-{v}").resolve())
    else:
        for v in ("bf16", "4bit"):  # an earlier --target-from build's links: a new target of its
            link = args.out / f"target-{v}"  # own here, not written through them into that pair
            if link.is_symlink():
                link.unlink()
        small.save_checkpoint(target, tconf, args.out / "target-bf16", tok_dir, "bfloat16")
        small.save_checkpoint(small.make_model_from(args.out / "target-bf16"), tconf, args.out / "target-4bit",
                              tok_dir, "bfloat16", quantize=True)

    # Distillation text: the target's own greedy continuations of corpus windows, which is
    # what a drafter meets when it drafts for this target (a prompt, then the target's text).
    # On those rows the label at every generated position is the target's argmax by
    # construction, so the drafter trains without a target forward per step.
    P = 64
    topk = args.drafter_topk if args.drafter_soft > 0 else 0
    generated = generate(target, train_data, args.gen_seconds, args.gen_batch, P, args.seq - P + 1,
                         np.random.default_rng(args.seed + 1), args.gen_rows, topk)
    held = generate(target, val_data, 0, 64, P, args.seq - P + 1, np.random.default_rng(args.seed + 2), 64).tokens
    free()
    memory("writing the targets and generating")
    small.log(f"generated {len(generated)} greedy continuations ({len(generated) * (args.seq - P + 1)} "
              f"target tokens{f', top-{topk} logits kept' if topk else ''}) and {held.shape[0]} held-out ones")

    drafter = small.make_model(dconf)
    n_drafter = sum(v.size for _, v in tree_flatten(drafter.parameters()))
    # Start from the target's own embedding, first layers, final norm and head wherever the
    # shapes agree: the drafter then speaks the target's representation from step 0 and
    # the distillation budget goes into agreeing with it, not into learning embeddings.
    mine = dict(tree_flatten(drafter.parameters()))
    copied = {k: v.astype(mx.float32) for k, v in tree_flatten(target.parameters())
              if k in mine and mine[k].shape == v.shape}
    if copied:
        drafter.load_weights(list(copied.items()), strict=False)
    small.log(f"drafter: {n_drafter / 1e6:.1f}M parameters, {sum(v.size for v in copied.values()) / 1e6:.1f}M "
              f"of them started from the target's")
    # The label at every position is the target's argmax after that prefix: inside the corpus
    # prompt from the prefill's logits, after it the target's own next token. "continuation"
    # reads the loss from the prompt's last token on, as the builds up to 2026-11-30c did.
    soft = args.drafter_soft
    weight = (mx.array((np.arange(args.seq) >= P - 1).astype(np.float32))
              if args.drafter_labels == "continuation" else None)

    def distil(model, x, y, *top):
        return distil_loss(model(x), y, top, soft, weight)

    def drafter_batch():
        return generated.batch(rng.integers(0, len(generated), size=args.batch))

    d_loss, d_steps = timed_train(drafter, distil, drafter_batch, args.drafter_seconds, args.drafter_lr,
                                  "drafter")
    drafter.eval()
    hx, hy = mx.array(held[:, :-1]), mx.array(held[:, 1:])
    hit = (mx.argmax(drafter(hx), axis=-1) == hy).astype(mx.float32)[:, P - 1:]
    agree = hit.mean().item()
    small.log(f"drafter last loss {d_loss:.3f}; top-1 agreement with the target's greedy text on "
              f"{held.shape[0]} held-out continuations {agree:.3f}")

    small.save_checkpoint(drafter, dconf, args.out / "drafter", tok_dir, "bfloat16")
    shutil.rmtree(work)
    prompts = held_out_prompts(val_data, tok, args.prompts, 48, np.random.default_rng(7))
    (args.out / "prompts.json").write_text(json.dumps(prompts, indent=1))
    (args.out / "prompt.txt").write_text(prompts[0])  # for `sweep --prompt-file`
    built_s = time.time() - started
    small.log(f"built in {built_s:.0f}s; measuring acceptance on {len(prompts)} held-out prompts")
    acc = {v: acceptance(args.out / f"target-{v}", args.out / "drafter", prompts, 4, 128)
           for v in ("bf16", "4bit")}
    summary = {
        "python": sys.version.split()[0], "mlx": mx.__version__, "device": str(mx.default_device()),
        "build_seconds": round(built_s, 1), "seconds": round(time.time() - started, 1),
        "shape": args.shape, "target_params": int(n_target), "drafter_params": int(n_drafter),
        "target_steps": t_steps, "generated_rows": len(generated),
        "target_from": str(args.target_from) if args.target_from else None,
        "drafter_labels": args.drafter_labels, "drafter_soft": soft, "drafter_topk": topk,
        "target_lr": args.target_lr, "drafter_lr": args.drafter_lr, "master_weights": "float32", "drafter_steps": d_steps, "tokens_per_step": args.batch * args.seq,
        "target_last_loss": None if t_loss is None else round(t_loss, 3), "target_val_loss": round(t_val, 3),
        "drafter_last_loss": round(d_loss, 3), "drafter_held_out_agreement": round(agree, 3),
        "acceptance_held_out_width4": acc,
        "target_config": tconf, "drafter_config": dconf,
    }
    (args.out / "build.json").write_text(json.dumps(summary, indent=2))
    small.log(json.dumps({k: summary[k] for k in ("build_seconds", "target_val_loss",
                                                   "drafter_held_out_agreement", "acceptance_held_out_width4")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
