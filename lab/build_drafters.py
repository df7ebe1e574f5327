"""Train the demo pair's hidden-state drafters (DFlash, MTP) and retrain its draft model.

Reads the demo targets in ``engine/demo/pair`` (or ``--pair``) and writes, in
the published formats the engine loads:

- ``dflash/``: a ``DFlashDraftModel`` (2 layers, block 16) reading target
  layers 1, 3 and 5, trained on blocks of 2..16 rows of the targets' own greedy
  text: the first token given, the rest masks, each row labelled with the text;
- ``mtp/``: one DeepSeek-V3-layout NextN head (``model.layers.6.*``), trained to
  predict x[t+2] from the target's final hidden state at t and x[t+1], and, by
  feeding its own output back, x[t+3] and x[t+4] (a width-4 round);
- ``drafter/``: the Llama draft model, fine-tuned from the committed one on
  greedy text of both the bfloat16 and the 4-bit target (labels: each target's
  own argmax, ``--drafter-4bit-share`` of the rows the 4-bit one's), written only
  when its worse target's acceptance beats the committed drafter's worse one.

The training text is the targets' greedy continuations of corpus windows, so
every label is what the target itself would emit (blocks and chained steps start
inside the continuation, never in the corpus prompt). Both training forwards are
the engine's own computation (tests/test_drafter_training.py): DFlash blocks
attend to the context rows before them, and the MTP head's chained steps attend
to the committed rows and their own chain only, as engine.mtp decodes them (not,
as a plain causal pass over chained outputs would, to other rows' chains).
During training, the draft agreement at width 4 on held-out greedy text is
logged, and the weights that validated best are kept. Run on a GPU (see
drafters_gpu.sh for the budgets):

    python -m lab.build_drafters --out /tmp/drafters

A smoke test anywhere (a few steps on a CPU, where the 4-bit target's batched
forwards are very slow):

    python -m lab.build_drafters --out /tmp/smoke --targets bf16 --windows 24 --val 8 \
        --seq 64 --prompt 24 --batch 4 --blocks 2 --dflash-steps 20 --mtp-steps 20 \
        --drafter-steps 10 --accept-tokens 16

The writers (``write_dflash``, ``write_mtp``) are ``tests/checkpoints.py``'s, which also
make the random-weight checkpoints the product's tests load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_map

from blockwidth.engine import hidden
from lab.build import (DRAFTER_CONFIG, batches, build_corpus, greedy_continuations, log,
                       make_model)
from blockwidth.engine.demo.prompts import PromptsFileError, read_prompts

from blockwidth.engine.demo import PAIR_DIR as PAIR  # noqa: E402  (the demo pair stays in the product)
# The writers of the published formats: the tests' tiny checkpoints and the trained drafters
# are written by the same code, which lives with the tests (the product's tests need it).
from tests.checkpoints import dflash_config, mtp_head, write_dflash, write_mtp  # noqa: E402


# -- training -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Greedy:
    """A target's greedy text as training rows: ``rows`` (N, S) token ids, row i a prompt of
    ``first[i]`` tokens, then the target's own greedy continuation up to ``end[i]`` (exclusive),
    then padding. Prompts of different lengths (chat requests) make rows of different lengths;
    they are padded on the right, where causal attention never lets a real position see the
    padding, so the target's states and argmax at every real position are those of the row alone.
    The demo pair's rows are all one corpus prompt and one continuation: ``Greedy.of``."""

    rows: np.ndarray
    first: np.ndarray
    end: np.ndarray

    @classmethod
    def of(cls, rows: "np.ndarray | Greedy", prompt: int) -> "Greedy":
        """``rows`` as they are, or unpadded rows whose first ``prompt`` tokens are the prompt."""
        if isinstance(rows, Greedy):
            return rows
        n, seq = rows.shape
        return cls(rows, np.full(n, prompt, dtype=np.int64), np.full(n, seq, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, idx) -> "Greedy":
        return Greedy(self.rows[idx], self.first[idx], self.end[idx])


def target_features(target, x: mx.array, layers: tuple[int, ...]) -> tuple[mx.array, dict]:
    """The target's logits and the hidden states at ``layers`` (and FINAL) for a batch, one forward."""
    got: dict = {}
    with hidden.Capture(target, layers, got.update):
        logits = target(x)
    return logits, got


def dflash_blocks(model, target, feats: mx.array, tokens: np.ndarray, starts: np.ndarray,
                  seq_of: np.ndarray) -> mx.array:
    """Logits of the rows a DFlash round drafts, for blocks whose first (given) token is
    ``tokens[:, 0]`` at position ``starts``, the rest masks, reading context rows < ``starts`` of
    ``feats[seq_of]``: what engine.dflash.DFlashDrafter.propose computes for that round."""
    inp = np.full_like(tokens, model.spec.mask_token_id)
    inp[:, 0] = tokens[:, 0]
    emb = mx.stop_gradient(hidden.embed(target)(mx.array(inp)))
    h = model.train_forward(emb, feats, mx.array(starts), mx.array(seq_of))[:, 1:]
    return hidden.lm_head(target)(h)


def _leading(hit: mx.array, weight: mx.array | None = None) -> float:
    """Mean accepted drafts per drafted token of width-4 rounds from (..., 3) matches: a draft
    counts only when every one before it matched. ``weight`` (hit's leading shape): which rounds
    count (1) and which do not (0: padding)."""
    a, b, c = hit[..., 0], hit[..., 1], hit[..., 2]
    runs = (a + a * b + a * b * c) / 3
    if weight is None:
        return runs.mean().item()
    return ((runs * weight).sum() / mx.maximum(weight.sum(), 1)).item()


def _features(target, x: mx.array, layers: tuple[int, ...]) -> mx.array:
    _, got = target_features(target, x, layers)
    return mx.stop_gradient(mx.concatenate([got[i] for i in layers], axis=-1))


def train_dflash(targets, text: list[np.ndarray | Greedy], steps: int, batch: int, blocks: int,
                 lr: float, config: dict, rng: np.random.Generator, prompt: int,
                 val: list[np.ndarray | Greedy] | None = None, init: Path | None = None):
    """``text[k]`` (and ``val[k]``): rows of ``targets[k]``'s own greedy text (arrays whose first
    ``prompt`` tokens are the prompt, or Greedy rows); a batch pairs a target's hidden states with
    its own text, so every label is that target's argmax. Blocks are drawn of every size from 2
    to the config's ``block_size``.
    ``init``: continue from that DFlash checkpoint (of this config) instead of random weights."""
    from blockwidth.engine.dflash import DFlashModel, load_model, parse_spec

    spec = parse_spec(config, "demo dflash")
    if init is not None:
        model = load_model(init, spec, config, f"--dflash-init {init}")
        model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
        model.train()
        log(f"dflash: fine-tuning {init}")
    else:
        model = DFlashModel(spec)
    layers = spec.target_layer_ids
    text = [Greedy.of(t, prompt) for t in text]
    val = None if val is None else [Greedy.of(t, prompt) for t in val]

    def first(g: Greedy) -> np.ndarray:
        # blocks start at the prompt's last token or later: every label is then the target's own
        # greedy text (the prompt is not what the target would say)
        return np.maximum(g.first - 1, 1)

    def make_batch():
        k = int(rng.integers(len(targets)))
        target = targets[k]
        src = text[k].take(rng.integers(0, len(text[k]), size=batch))
        rows = src.rows
        feats = _features(target, mx.array(rows), layers)
        # a block of every width the engine may run (2..block_size rows), one length per step
        size = int(rng.integers(2, spec.block_size + 1))
        lo = first(src)
        hi = np.maximum(src.end - size, lo)  # the last start whose block ends in the text
        starts = rng.integers(lo[:, None], hi[:, None] + 1, size=(batch, blocks)).reshape(-1)
        seq_of = np.repeat(np.arange(batch), blocks)
        tokens = rows[seq_of[:, None], starts[:, None] + np.arange(size)[None, :]]
        return (feats, tokens, starts, seq_of, target)

    def loss_fn(model, feats, tokens, starts, seq_of, target):
        logits = dflash_blocks(model, target, feats, tokens, starts, seq_of)
        labels = mx.array(tokens[:, 1:])
        # earlier rows matter more: a width-4 round reads rows 1..3 only
        w = mx.exp(-mx.arange(labels.shape[1]) / 6.0)
        ce = nn.losses.cross_entropy(logits, labels, reduction="none")
        return (ce * w).sum() / (w.sum() * ce.shape[0])

    def validate() -> float:
        """Draft agreement at width 4 on held-out greedy text (leading drafts the target keeps,
        per drafted token), every 4th position of each row."""
        got = []
        for target, held in zip(targets, val):
            for i in range(0, len(held), 64):
                part = held.take(slice(i, i + 64))
                rows = part.rows
                feats = _features(target, mx.array(rows), layers)
                per = [np.arange(lo, end - 4 + 1, 4) for lo, end in zip(first(part), part.end)]
                starts = np.concatenate(per)
                seq_of = np.repeat(np.arange(len(rows)), [len(p) for p in per])
                tokens = rows[seq_of[:, None], starts[:, None] + np.arange(4)[None, :]]
                logits = dflash_blocks(model, target, feats, tokens, starts, seq_of)
                hit = (mx.argmax(logits, axis=-1) == mx.array(tokens[:, 1:])).astype(mx.float32)
                got.append(_leading(hit))
        return float(np.mean(got))

    return model, _fit(model, loss_fn, make_batch, steps, lr, "dflash",
                       validate if val is not None else None)


class _ChainCache:
    """Stands in for one head block's KV cache during training, so that the block attends exactly
    as engine.mtp.MTPDrafter makes it attend when decoding: depth 1 (the committed rows) is causal;
    the chained step at depth d from row t sits at position t + d - 1 and sees the depth-1 rows up
    to t plus its own chain (depths 2..d at row t), never other rows' chained steps."""

    def __init__(self, length: int):
        self.n = length
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []
        self.offset = 0

    def update_and_fetch(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        self.keys.append(k)
        self.values.append(v)
        return mx.concatenate(self.keys, axis=2), mx.concatenate(self.values, axis=2)

    def make_mask(self, n: int, return_array: bool = False, window_size=None) -> mx.array:
        i = mx.arange(n)
        eye = i[:, None] == i[None, :]
        return mx.concatenate([i[:, None] >= i[None, :]] + [eye] * len(self.keys), axis=1)


def mtp_forward(head, embed, h: mx.array, rows: mx.array, depth: int) -> list[mx.array]:
    """Normed outputs of ``head`` at depths 1..``depth`` for every row t, as decoding computes them:
    depth 1 reads (h[t], x[t+1]), depth d (h chained from depth d-1 at t, x[t+d]); predicts x[t+d+1].
    ``h`` (B, n, d) final-normed target hidden states at rows 0..n-1, ``rows`` (B, >= n + depth)
    tokens.

    The attention is the engine's plain arithmetic (engine.attention), whatever the shape: the
    chain's boolean mask sent the fused call to cuDNN on CUDA, where the first H200 run of this
    training managed 5 steps in 60 s. On a CPU plain and fused are bitwise equal."""
    from blockwidth.engine.attention import verify_attention

    n = h.shape[1]
    caches = [_ChainCache(n) for _ in head.blocks]
    outs = []
    chain = h[:, :n]
    with verify_attention("plain", any_shape=True):
        for d in range(1, depth + 1):
            for c in caches:
                c.offset = d - 1
            out, chain = head(chain, embed(rows[:, d:d + n]), caches)
            outs.append(out)
    return outs


MTP_DEPTH = 3  # a width-4 round chains the head three times


def init_from_last_layer(head, target) -> None:
    """Start ``head`` from ``target``'s own last decoder layer and final norm, its projection
    passing the hidden half through (identity) and the embedding half scaled down: at step 0
    the head is the target's top layer applied once more to its output, a representation the
    target's LM head already reads. For a large target with a short training budget (the 1B
    pair: the demo head's random start learns the layer from nothing)."""
    d = head.proj.weight.shape[0]
    layer = target.model.layers[-1]
    head.blocks[0].update(tree_map(lambda p: p.astype(mx.float32), layer.parameters()))
    head.norm.update(tree_map(lambda p: p.astype(mx.float32), target.model.norm.parameters()))
    w = head.proj.weight
    # the projection's input is [hidden, embedding] (MiMo) or [embedding, hidden] (the others)
    e_half = (w[:, d:] if head.hidden_first else w[:, :d]) * 0.1
    halves = [mx.eye(d), e_half] if head.hidden_first else [e_half, mx.eye(d)]
    head.proj.weight = mx.concatenate(halves, axis=1)
    mx.eval(head.parameters())


def train_mtp(targets, text: list[np.ndarray | Greedy], steps: int, batch: int, lr: float,
              target_config: dict, rng: np.random.Generator, prompt: int,
              val: list[np.ndarray | Greedy] | None = None, init_target=None):
    """``text[k]`` (and ``val[k]``): rows of ``targets[k]``'s own greedy text, as train_dflash.
    ``init_target``: an unquantized target to start the head from (init_from_last_layer)."""
    head = mtp_head(target_config)
    if init_target is not None:
        init_from_last_layer(head, init_target)
    text = [Greedy.of(t, prompt) for t in text]
    val = None if val is None else [Greedy.of(t, prompt) for t in val]
    seq = text[0].rows.shape[1]
    n = seq - MTP_DEPTH - 1  # rows t whose deepest label x[t + depth + 1] is in the text
    t = np.arange(n)[None, :]

    def weight(g: Greedy, depth: int) -> mx.array:
        """(rows, n): which rows t a head at ``depth`` learns from. Depth 1 is labelled by the
        target's argmax at t + 1, anywhere in the text; chained depths read the text as the
        drafts they stand for, so only where it is the target's own greedy continuation
        (t + 2 >= first); and never a label in the padding (t + depth + 1 < end)."""
        w = t + depth + 1 < g.end[:, None]
        if depth > 1:
            w &= t + 2 >= g.first[:, None]
        return mx.array(w.astype(np.float32))

    def features(target, rows):
        logits, got = target_features(target, rows, (hidden.FINAL,))
        return mx.stop_gradient(got[hidden.FINAL]), mx.argmax(logits, axis=-1)

    def make_batch():
        k = int(rng.integers(len(targets)))
        target = targets[k]
        src = text[k].take(rng.integers(0, len(text[k]), size=batch))
        rows = mx.array(src.rows)
        h, am = features(target, rows)
        return (h, rows, am, [weight(src, d) for d in range(1, MTP_DEPTH + 1)], target)

    def loss_fn(head, h, rows, am, ws, target):
        outs = mtp_forward(head, hidden.embed(target), h[:, :n], rows, MTP_DEPTH)
        lm = hidden.lm_head(target)
        total = 0.0
        for d in range(1, MTP_DEPTH + 1):
            labels = am[:, 1:n + 1] if d == 1 else rows[:, d + 1:d + 1 + n]
            ce = nn.losses.cross_entropy(lm(outs[d - 1]), labels, reduction="none")
            w = ws[d - 1]
            total = total + 0.7 ** (d - 1) * (ce * w).sum() / mx.maximum(w.sum(), 1)
        return total

    def validate() -> float:
        """Draft agreement at width 4 on held-out greedy text: the mean run of leading drafts the
        target would accept, per drafted token (what acceptance() measures on the demo prompts)."""
        got = []
        for target, held in zip(targets, val):
            for i in range(0, len(held), 64):
                part = held.take(slice(i, i + 64))
                rows = mx.array(part.rows)
                h, _ = features(target, rows)
                outs = mtp_forward(head, hidden.embed(target), h[:, :n], rows, MTP_DEPTH)
                lm = hidden.lm_head(target)
                hit = mx.stack([mx.argmax(lm(o), axis=-1) == rows[:, d + 2:d + 2 + n]
                                for d, o in enumerate(outs)], axis=-1)
                # rounds that start in the continuation and whose last draft is in the text
                w = (t >= part.first[:, None]) & (t + MTP_DEPTH + 1 < part.end[:, None])
                got.append(_leading(hit.astype(mx.float32), mx.array(w.astype(np.float32))))
        return float(np.mean(got))

    return head, _fit(head, loss_fn, make_batch, steps, lr, "mtp", validate if val is not None else None)


SECONDS: dict[str, float] = {}  # name -> wall-clock budget; overrides the step count


VALIDATE_EVERY = 0.1  # of the budget (or of the steps) between held-out validations


def _fit(model, loss_fn, make_batch, steps: int, lr: float, name: str,
         validate: Callable[[], float] | None = None) -> float:
    """AdamW with warm-up and cosine decay over ``steps``, or over a time budget (SECONDS[name]):
    then the schedule follows the elapsed fraction of the budget. With ``validate`` (held-out draft
    agreement, higher is better) the weights that validated best are the ones kept."""
    import math

    import mlx.optimizers as optim

    budget = SECONDS.get(name)
    opt = optim.AdamW(learning_rate=lr, weight_decay=0.05)
    grad = nn.value_and_grad(model, loss_fn)
    t0, ema, i = time.time(), None, 0
    best, best_at, next_val = -1.0, None, VALIDATE_EVERY
    kept = None

    def check(frac: float) -> None:
        nonlocal best, best_at, kept
        model.eval()
        score = validate()
        model.train()
        tag = ""
        if score > best:
            best, best_at, tag = score, i, " (best)"
            kept = tree_map(lambda p: mx.array(p), model.parameters())
            mx.eval(kept)
        log(f"{name} step {i} held-out draft agreement w4 {score:.3f}{tag} ({time.time() - t0:.0f}s)")

    if validate is not None:
        check(0.0)  # the starting weights compete too: a fine-tune that never beats them keeps them
    while True:
        if i == 3 and budget:
            t0 = time.time()  # the budget starts after the first steps: on CUDA they JIT-compile
        frac = (time.time() - t0) / budget if budget else i / max(steps, 1)
        if frac >= 1.0:
            break
        if validate is not None and frac >= next_val and i > 3:
            check(frac)
            next_val = (math.floor(frac / VALIDATE_EVERY) + 1) * VALIDATE_EVERY
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
    if validate is not None:
        check(1.0)
        if kept is not None and best_at != i:
            model.update(kept)
            log(f"{name}: kept the weights of step {best_at} (held-out agreement {best:.3f})")
    model.eval()
    return float(ema or 0.0)


def greedy_text(targets, data: np.ndarray, windows: int, prompt: int, new: int, seed: int,
                gen_batch: int = 4096) -> list[np.ndarray]:
    """Greedy continuations of corpus windows, an equal share by each target (its own argmax path:
    one array per target), in
    batches of up to ``gen_batch`` rows: few long calls (on CUDA every new KV length costs an
    attention plan) and wide ones (a batch of thousands costs a GPU little more than one row)."""
    out = []
    per_target = max(windows // len(targets), 1)
    calls = -(-per_target // gen_batch)
    per = -(-per_target // calls)
    src = batches(data, per, prompt, np.random.default_rng(seed))
    for t in targets:
        mine = []
        for _ in range(calls):
            p, _ = next(src)
            mine.append(np.array(greedy_continuations(t, p, new)))
            mx.clear_cache()
        out.append(np.concatenate(mine))
    return out


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
    """target-4bit from target-bf16, as lab.build makes it (affine, 4 bits, group 64)."""
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


def measure(pair: Path, kind: str, path: Path, variant: str, width: int = 4,
            tokens: tuple[int, ...] = (64, 128), label: str | None = None,
            prompts: list[str] | None = None) -> dict:
    """Per-drafted-token acceptance at ``width`` on ``prompts`` (None: the demo prompts), through
    this engine's loop,
    of the ``kind`` drafter at ``path`` against one demo target: pooled and per prompt, per length,
    and over all lengths ("all": accepted / drafted summed)."""
    from blockwidth.engine.decode import speculative
    from blockwidth.engine.demo.prompts import DEMO_PROMPTS
    from blockwidth.engine.pair import load_pair

    p = load_pair(pair / f"target-{variant}", path, kind)
    out: dict = {}
    tot_a = tot_d = 0
    for n in tokens:
        acc = dra = 0
        per = []
        for prompt in prompts or DEMO_PROMPTS:
            run = speculative(p, p.tokenizer.encode(prompt), n, width)
            acc, dra = acc + run.accepted, dra + run.drafted
            per.append(round(run.acceptance or 0.0, 3))
        tot_a, tot_d = tot_a + acc, tot_d + dra
        out[n] = {"pooled": round(acc / dra, 3) if dra else None, "per_prompt": per}
        log(f"acceptance w{width} {label or kind} {variant} {n} tokens: {out[n]['pooled']} {per}")
    out["all"] = tot_a / tot_d if tot_d else 0.0
    return out


def acceptance(pair: Path, built: Path, width: int = 4, tokens: tuple[int, ...] = (64, 128),
               names: set[str] | None = None, prompts: list[str] | None = None) -> dict:
    """``measure`` for every drafter in ``built`` (of ``names``) against both demo targets."""
    out: dict = {}
    for kind, name in (("model", "drafter"), ("dflash", "dflash"), ("mtp", "mtp")):
        if not (built / name).is_dir() or (names is not None and name not in names):
            continue
        for variant in ("bf16", "4bit"):
            got = measure(pair, kind, built / name, variant, width, tokens, prompts=prompts)
            for n in tokens:
                out[f"{kind} {variant} {n} tokens"] = got[n]
    return out


def main(argv: list[str] | None = None) -> int:
    from mlx_lm.utils import load_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pair", type=Path, default=PAIR)
    ap.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    ap.add_argument("--windows", type=int, default=32768, help="greedy continuations to generate (--val of them held out)")
    ap.add_argument("--gen-batch", type=int, default=4096, help="rows per greedy-generation call")
    ap.add_argument("--val", type=int, default=256, help="greedy continuations held out to validate")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=64, help="corpus tokens before each continuation")
    ap.add_argument("--dflash-steps", type=int, default=4000)
    ap.add_argument("--mtp-steps", type=int, default=4000)
    ap.add_argument("--drafter-steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=8, help="DFlash blocks per sequence")
    ap.add_argument("--dflash-lr", type=float, default=2e-3)
    ap.add_argument("--mtp-lr", type=float, default=2e-3)
    ap.add_argument("--drafter-lr", type=float, default=None,
                    help="default 3e-4 when fine-tuning (--drafter-init), 3e-3 from scratch")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--targets", choices=("bf16", "4bit"), action="append",
                    help="train on these targets' text and states (default both; on a CPU the "
                         "4-bit target's batched forwards are very slow, so a smoke test uses bf16)")
    ap.add_argument("--only", choices=("dflash", "mtp", "drafter"), action="append")
    ap.add_argument("--seconds", metavar="NAME=S", action="append", default=[],
                    help="train NAME (dflash, mtp, drafter) for S seconds instead of its steps")
    ap.add_argument("--drafter-init", type=Path, metavar="DIR",
                    help="start the draft model from these weights (default: the pair's committed "
                         "drafter); 'none' starts at random")
    ap.add_argument("--dflash-init", type=Path, metavar="DIR",
                    help="continue training this DFlash checkpoint (e.g. the pair's committed "
                         "dflash/) instead of starting at random")
    ap.add_argument("--drafter-4bit-share", type=float, default=0.5, metavar="F",
                    help="share of the draft model's training rows labelled by the 4-bit target "
                         "(the rest by the bfloat16 one); where the two targets disagree one "
                         "drafter can follow only one of them")
    ap.add_argument("--accept-tokens", default="64,128", metavar="N,N",
                    help="decode lengths of the acceptance measurement on the demo prompts "
                         "(or --prompts-file's)")
    ap.add_argument("--mtp-init", choices=("random", "last"), default="random",
                    help="start the MTP head at random (the demo head) or from the bfloat16 target's "
                         "last layer and norm (a large target, a short budget)")
    ap.add_argument("--prompts-file", metavar="JSON",
                    help="measure acceptance on this JSON list of prompts (a pair's held-out "
                         "prompts.json) instead of the demo prompts")
    ap.add_argument("--measure", type=Path, metavar="DIR",
                    help="only measure the acceptance of the drafters already built in DIR")
    args = ap.parse_args(argv)
    args.accept_tokens = tuple(int(n) for n in str(args.accept_tokens).split(","))
    if not 0.0 <= args.drafter_4bit_share <= 1.0:
        print(f"--drafter-4bit-share {args.drafter_4bit_share}: a share from 0 to 1", file=sys.stderr)
        return 2
    if args.dflash_init is not None and not (args.dflash_init / "config.json").is_file():
        print(f"--dflash-init {args.dflash_init}: no config.json there (a DFlash checkpoint folder)",
              file=sys.stderr)
        return 2
    only = set(args.only or ("dflash", "mtp", "drafter"))
    prompts = None  # --prompts-file: measure on these instead of the demo prompts
    if args.prompts_file is not None:
        try:  # checked before minutes of loading and training
            prompts = read_prompts(args.prompts_file)
        except PromptsFileError as e:
            print(e, file=sys.stderr)
            return 2
    if args.measure:
        result = acceptance(args.pair, args.measure, tokens=args.accept_tokens, prompts=prompts)
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
    variants = args.targets or ["bf16", "4bit"]
    targets = [{"bf16": t16, "4bit": t4}[v] for v in variants]
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
    t_gen = time.time()
    text = greedy_text(targets, data[: int(len(data) * 0.98)], args.windows, args.prompt,
                       args.seq - args.prompt + 1, args.seed + 1, args.gen_batch)
    n_val = min(args.val // len(targets), len(text[0]) // 4)  # per target
    val, text = [t[:n_val] for t in text], [t[n_val:] for t in text]
    log(f"greedy text: {sum(map(len, text))} rows of {text[0].shape[1]} tokens, "
        f"{n_val * len(targets)} more held out "
        f"(of the targets {', '.join(variants)}) in {time.time() - t_gen:.0f}s")
    summary: dict = {"python": sys.version.split()[0], "mlx": mx.__version__,
                     "device": str(mx.default_device()), "greedy_rows": sum(map(len, text)),
                     "held_out_rows": n_val * len(targets),
                     "args": {k: str(v) for k, v in vars(args).items()}}
    args.out.mkdir(parents=True, exist_ok=True)
    if "dflash" in only:
        cfg = dflash_config(tconfig)
        model, loss = train_dflash(targets, text, args.dflash_steps, args.batch, args.blocks,
                                   args.dflash_lr, cfg, rng, args.prompt, val, init=args.dflash_init)
        write_dflash(args.out / "dflash", cfg, model)
        summary["dflash_loss"] = round(loss, 3)
        summary["dflash_params"] = int(sum(v.size for _, v in tree_flatten(model.parameters())))
    if "mtp" in only:
        head, loss = train_mtp(targets, text, args.mtp_steps, args.batch, args.mtp_lr, tconfig, rng,
                               args.prompt, val, init_target=t16 if args.mtp_init == "last" else None)
        write_mtp(args.out / "mtp", tconfig, head)
        summary["mtp_loss"] = round(loss, 3)
        summary["mtp_params"] = int(sum(v.size for _, v in tree_flatten(head.parameters())))
    if "drafter" in only:
        summary["drafter"] = train_drafter(args, targets, data, np.concatenate(text),
                                           np.concatenate(val), rng)
    summary["seconds"] = round(time.time() - started, 1)
    summary["acceptance_w4"] = acceptance(args.pair, args.out, tokens=args.accept_tokens, names=only,
                                          prompts=prompts)
    name = "build-drafters" + ("-" + "-".join(sorted(only)) if args.only else "") + ".json"
    (args.out / name).write_text(json.dumps(summary, indent=2))
    log(json.dumps(summary))
    return 0


def adopt(wins: dict[str, dict[str, float]]) -> bool:
    """Whether a candidate drafter replaces the committed one, given each target's acceptance
    (``{"bf16": {"candidate": a, "committed": b}, ...}``): when its worse target's figure beats the
    committed drafter's worse one. One drafter serves both demo targets and they disagree on some
    tokens, so raising one can cost the other; the pair is as good as its worse target (the aim is
    >= 0.6 on each), and a candidate that trades a surplus on one for the other's shortfall is
    kept."""
    return min(w["candidate"] for w in wins.values()) > min(w["committed"] for w in wins.values())


def train_drafter(args, targets: list, data: np.ndarray, text: np.ndarray, val: np.ndarray,
                  rng: np.random.Generator) -> dict:
    """Fine-tune (or train) the model drafter on both targets' greedy text, each half of a batch
    labelled by one target's argmax; write it to ``out/drafter`` only when it beats the committed
    drafter on BOTH demo targets (acceptance at width 4 on the demo prompts, 64 and 128 tokens
    pooled), else leave ``out/drafter`` absent and say so: the committed one stays."""
    t16, t4 = targets[0], targets[-1]
    committed = args.pair / "drafter"
    init = args.drafter_init
    if init is None and committed.is_dir():
        init = committed
    if init is not None and str(init) == "none":
        init = None
    drafter = make_model(DRAFTER_CONFIG)
    if init is not None:
        drafter.load_weights(str(init / "model.safetensors"))
        drafter.update(tree_map(lambda p: p.astype(mx.float32), drafter.parameters()))
        log(f"drafter: fine-tuning {init}")
    lr = args.drafter_lr or (3e-4 if init is not None else 3e-3)
    n_corpus = args.batch // 4
    corpus = batches(data, n_corpus, args.seq, rng)
    seq = min(args.seq, text.shape[1] - 1)

    def drafter_batch():
        cx, _ = next(corpus)
        rows = rng.integers(0, text.shape[0], size=2 * args.batch - n_corpus)
        x = mx.concatenate([cx[:, :seq], mx.array(text[rows, :seq])], axis=0)
        # rows labelled by each target (--drafter-4bit-share by the 4-bit one): the drafter
        # serves both
        half = min(max(round(x.shape[0] * (1 - args.drafter_4bit_share)), 0), x.shape[0])
        parts = ([mx.argmax(t16(x[:half]), axis=-1)] if half else []) + \
            ([mx.argmax(t4(x[half:]), axis=-1)] if half < x.shape[0] else [])
        y = mx.concatenate(parts)
        return x, mx.stop_gradient(y), None

    def ce(model, x, y, _target):
        return nn.losses.cross_entropy(model(x), y, reduction="mean")

    def validate() -> float:
        """Teacher-forced agreement with each target's argmax on held-out greedy text, as leading
        runs of 3 (a width-4 round), averaged over the two targets."""
        got = []
        for target in targets:
            for i in range(0, len(val), 64):
                x = mx.array(val[i:i + 64, :seq])
                hit = (mx.argmax(drafter(x), axis=-1) == mx.argmax(target(x), axis=-1))
                hit = hit[:, args.prompt:].astype(mx.float32)
                runs = hit[:, :-2] * hit[:, 1:-1] * hit[:, 2:]
                got.append(((hit[:, :-2] + hit[:, :-2] * hit[:, 1:-1] + runs) / 3).mean().item())
        return float(np.mean(got))

    before = validate() if len(val) else None
    if before is not None:
        log(f"drafter: held-out agreement w4 before training {before:.3f}")
    loss = _fit(drafter, ce, drafter_batch, args.drafter_steps, lr, "drafter",
                validate if len(val) else None)
    drafter.eval()
    cand = args.out / "drafter-candidate"
    if cand.exists():
        shutil.rmtree(cand)
    save_drafter(drafter, cand, args.pair / "target-bf16")
    result: dict = {"loss": round(loss, 3), "init": str(init) if init else None, "lr": lr}
    final = args.out / "drafter"
    if final.exists():
        shutil.rmtree(final)
    if not committed.is_dir():
        shutil.copytree(cand, final)
        result["adopted"] = True
        log("drafter: no committed drafter to compare with; wrote out/drafter")
        return result
    wins = {}
    for variant in ("bf16", "4bit"):
        new = measure(args.pair, "model", cand, variant, tokens=args.accept_tokens,
                      label="candidate drafter")["all"]
        old = measure(args.pair, "model", committed, variant, tokens=args.accept_tokens,
                      label="committed drafter")["all"]
        wins[variant] = {"candidate": round(new, 3), "committed": round(old, 3)}
    result["demo_acceptance_w4"] = wins
    result["adopted"] = adopt(wins)
    if result["adopted"]:
        shutil.copytree(cand, final)
        log(f"drafter: ADOPTED, the candidate raises the worse target's acceptance {wins}; "
            f"wrote {final}")
    else:
        log(f"drafter: NOT adopted, the candidate does not raise the worse target's acceptance "
            f"{wins}; keep the committed one (candidate left in {cand} for inspection)")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
