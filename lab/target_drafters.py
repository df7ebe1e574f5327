"""Train a DFlash drafter, an MTP head and a model drafter for any mlx-lm llama-family target.

On the GPU host, from the repository root, the whole build (about 5 minutes of one H200) is
lab/target_drafters_gpu.sh, detached; the steps it runs, each its own process:

    python -m lab.target_drafters text    --target DIR --out OUT --seconds 30
    python -m lab.target_drafters dflash  --target DIR --out OUT --seconds 50
    python -m lab.target_drafters mtp     --target DIR --out OUT --seconds 35
    python -m lab.target_drafters drafter --target DIR --out OUT --seconds 50
    python -m lab.target_drafters measure --target DIR --out OUT --kinds dflash   (mtp, drafter)

- ``text``: the target's own greedy continuations (``--new`` tokens, EOS ignored, as the engine
  measures) of chat requests rendered with the target's chat template (``--chat-share`` of the
  rows: code questions and rewrite/explain tasks made from the running Python's standard
  library, documentation questions, general requests from topic lists) and of raw standard
  library text; generated in batches of ``--gen-batch`` left-padded rows (mlx-lm's
  BatchKVCache: each row's positions and mask are its own), stored right-padded in
  ``OUT/text.npz`` (lab.build_drafters.Greedy). ``--val`` chat rows are held out to validate.
- ``dflash``: a DFlashDraftModel (``--dflash-layers`` layers reading ``--dflash-reads`` target
  layers spread as z-lab spreads them, block ``--block``) -> ``OUT/dflash/``;
- ``mtp``: one DeepSeek-V3-layout NextN head started from the target's last layer ->
  ``OUT/mtp/``;
- ``drafter``: a small model of the target's own family (the target's first ``--drafter-depth``
  layers, its embedding, final norm and head; the embedding/head frozen unless
  ``--train-embedding``), distilled on the greedy text (the target's argmax, and ``--soft`` of
  its distribution) -> ``OUT/drafter/`` with the target's tokenizer files, a folder the engine
  and ``mlx_lm.server --draft-model`` load;
- ``measure``: per drafter, acceptance at widths 2, 4, 8 through this engine's decode loop on
  held-out chat requests (lab/chat_heldout.jsonl, the built-in chat workload and the built-in
  mixed workload's chat requests), ``--tokens`` new tokens each -> ``OUT/acceptance-KIND.json``, rewritten after every
  width so a cut run keeps what it measured.

Each training step logs its held-out draft agreement at width 4 and keeps the weights that
validated best (lab.build_drafters._fit), and writes ``OUT/build-KIND.json``. The trainers and
the published formats' writers are lab.build_drafters' and tests/checkpoints.py's.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import shutil
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
HELD_OUT = ROOT / "lab" / "chat_heldout.jsonl"
# what measure reads by default: this lab's held-out requests, then the built-in chat workload
# (the real models' evidence runs it) and the built-in mixed workload's chat requests
HELD_OUT_DEFAULT = (str(HELD_OUT), "chat", "mixed")
KINDS = ("dflash", "mtp", "drafter")
ENGINE_KIND = {"dflash": "dflash", "mtp": "mtp", "drafter": "model"}
WIDTHS = (2, 4, 8)
# Files copied from the target into the model drafter's folder: its tokenizer, nothing else (a
# target's sidecar or index describes the target, not the drafter).
TOKENIZER_FILES = ("tokenizer", "special_tokens", "added_tokens", "vocab", "merges", "chat_template",
                   "generation_config")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Refusal(Exception):
    """Bad input: one line, exit 2."""


# -- training requests ------------------------------------------------------------------------

# Hand-written lists for the general requests; lab/chat_heldout.jsonl's requests are on other
# subjects (tests/test_target_drafters.py checks no held-out request is among these).
TOPICS = (
    "volcanoes", "coffee", "the moon", "bicycles", "chess", "rainforests", "honeybees",
    "the printing press", "electric cars", "jazz music", "the Roman Empire", "glaciers", "trains",
    "public libraries", "the internet", "sleep", "friendship", "mountains", "deserts", "bread",
    "clocks", "lighthouses", "penguins", "solar power", "recycling", "the human heart", "rivers",
    "the violin", "board games", "airplanes", "gardening", "earthquakes", "owls", "paper",
    "the stock market", "vaccines", "the Olympic Games", "robots", "winter", "tea", "castles",
    "submarines", "museums", "the alphabet", "spiders", "wind turbines", "dinosaurs", "maps",
    "the immune system", "cheese", "whales", "rain", "libraries of code", "old photographs",
)
GENERAL = (
    "Write a short poem about {t}.", "Explain {t} in simple terms.", "Give me three facts about {t}.",
    "Write a haiku about {t}.", "What is the history of {t}?", "Write a short story about {t}.",
    "What are the pros and cons of {t}?", "How would you explain {t} to a child?",
    "Write a tweet about {t}.", "List five words related to {t}.",
    "Write an email to a friend about {t}.", "Describe {t} in one paragraph.",
    "What are common misconceptions about {t}?", "Give me a quiz question about {t}.",
    "Compare {t} and {u}.", "Why is {t} important?", "Write a product description for {t}.",
    "Write a limerick about {t}.", "What would the world be like without {t}?",
    "Give me a title for an essay about {t}.",
)
TASKS = (
    "tie a tie", "change a flat tire", "boil an egg", "learn a new language", "start running",
    "write a cover letter", "save money", "plant a tree", "fall asleep faster", "clean a laptop keyboard",
    "prepare for a job interview", "make friends in a new city", "study for an exam", "bake bread",
    "stop procrastinating", "set up a home network", "care for a houseplant", "write a good title",
)
HOWTO = ("How do I {x}? Keep it short.", "Give me step-by-step instructions to {x}.",
         "What is the best way to {x}?", "I want to {x}. Where do I start?")
WRITE = (
    "Write a Python function `{name}({args})`. Its docstring says: {doc}",
    "Implement `{name}({args})` in Python. It should do this: {doc}",
    "Can you write a Python function called {name}? {doc}",
    "I need a function {name}({args}) for this: {doc} Please implement it.",
    "Show me how to write {name} in Python. {doc}",
)
CODE = (
    "Explain what this Python code does:\n\n```python\n{code}\n```",
    "What does this function do? Explain it step by step.\n\n```python\n{code}\n```",
    "Rewrite this function so that it is easier to read:\n\n```python\n{code}\n```",
    "Add type hints to this function:\n\n```python\n{code}\n```",
    "Write a unit test with pytest for this function:\n\n```python\n{code}\n```",
    "Is there a bug in this code? If so, fix it.\n\n```python\n{code}\n```",
    "Write a docstring for this function:\n\n```python\n{code}\n```",
    "Summarize this code in one sentence.\n\n```python\n{code}\n```",
    "```python\n{code}\n```\n\nHow could this be made faster?",
)
ASK = (
    "What does `{module}.{name}` do in Python?", "How do I use {module}.{name}? Show an example.",
    "When would I use `{name}` from the {module} module?",
)
DOCS = (
    "Summarize this in two sentences:\n\n{doc}", "Explain this to a beginner:\n\n{doc}",
    "What is the Python module `{module}` for?", "Give an example of using the `{module}` module in Python.",
    "Rewrite this paragraph in plain English:\n\n{doc}",
)
SYSTEMS = ("You are a helpful assistant.", "You are a friendly tutor. Explain things clearly.",
           "Answer in one short paragraph.", "You are an expert Python programmer.", "Be concise.")


def stdlib_files(stdlib: Path) -> list[Path]:
    from lab.build import SKIP_DIRS

    out = []
    for root, dirs, files in os.walk(stdlib):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        out += [Path(root) / f for f in sorted(files) if f.endswith(".py")]
    return out


def _first_paragraph(doc: str, chars: int = 400) -> str:
    para = " ".join(doc.strip().split("\n\n")[0].split())
    return para if len(para) <= chars else para[:chars].rsplit(" ", 1)[0] + " ..."


def harvest(files: list[Path], stdlib: Path, want: int, rng: np.random.Generator) -> dict[str, list]:
    """Material for the code requests from ``want`` or more of the standard library's functions,
    files taken in a random order: (name, args, doc) of documented functions, the source of short
    ones (<= 30 lines), (module, name) pairs, (module, docstring paragraph) of modules."""
    got: dict[str, list] = {"write": [], "code": [], "ask": [], "docs": []}
    for i in rng.permutation(len(files)):
        if len(got["code"]) >= want and len(got["write"]) >= want:
            break
        path = files[i]
        try:
            src = path.read_text(encoding="utf-8")
            tree = ast.parse(src)
        except (UnicodeDecodeError, OSError, SyntaxError, ValueError, RecursionError):
            continue
        lines = src.splitlines(keepends=True)  # once: ast.get_source_segment splits per call
        module = ".".join(path.relative_to(stdlib).with_suffix("").parts).removesuffix(".__init__")
        doc = ast.get_docstring(tree)
        if doc and len(doc) > 80:
            got["docs"].append((module, _first_paragraph(doc, 600)))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("__"):
                continue
            fdoc = ast.get_docstring(node)
            if fdoc and len(fdoc) > 20:
                got["write"].append((node.name, ast.unparse(node.args), _first_paragraph(fdoc)))
                got["ask"].append((module, node.name))
            end = node.end_lineno or node.lineno
            if 3 <= end - node.lineno + 1 <= 30:
                got["code"].append(textwrap.dedent("".join(lines[node.lineno - 1:end])).rstrip())
    return got


def chat_requests(n: int, material: dict[str, list], rng: np.random.Generator) -> list[list[dict]]:
    """``n`` chat requests (message lists): a third code tasks, a sixth each of function-writing
    requests, general requests and how-to/documentation questions, a tenth of them after a
    system message."""
    def pick(seq):
        return seq[int(rng.integers(len(seq)))]

    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.33 and material["code"]:
            text = pick(CODE).format(code=pick(material["code"]))
        elif r < 0.5 and material["write"]:
            name, args, doc = pick(material["write"])
            text = pick(WRITE).format(name=name, args=args, doc=doc)
        elif r < 0.67:
            t, u = rng.choice(len(TOPICS), size=2, replace=False)
            text = pick(GENERAL).format(t=TOPICS[t], u=TOPICS[u])
        elif r < 0.78:
            text = pick(HOWTO).format(x=pick(TASKS))
        elif r < 0.89 and material["ask"]:
            module, name = pick(material["ask"])
            text = pick(ASK).format(module=module, name=name)
        elif material["docs"]:
            module, doc = pick(material["docs"])
            text = pick(DOCS).format(module=module, doc=doc)
        else:
            text = pick(HOWTO).format(x=pick(TASKS))
        msgs = [{"role": "user", "content": text}]
        if rng.random() < 0.1:
            msgs.insert(0, {"role": "system", "content": pick(SYSTEMS)})
        out.append(msgs)
    return out


def render(tokenizer, messages_list: list[list[dict]], max_prompt: int) -> tuple[list[list[int]], int]:
    """Token ids of each chat request, rendered as a workload's chat request is (engine.workload:
    the chat template, the generation prompt added); requests longer than ``max_prompt`` tokens
    are left out. Returns (ids, how many were left out)."""
    from blockwidth.engine.workload import prepare
    from blockwidth.policy.workload import Message, Request, Workload

    reqs = tuple(Request(str(i), messages=tuple(Message(m["role"], m["content"]) for m in msgs), line=i + 1)
                 for i, msgs in enumerate(messages_list))
    ready = prepare(Workload("training requests", reqs, "", "lab.target_drafters"), tokenizer, 1,
                    where="training requests")
    ids = [list(p.ids) for p in ready if len(p.ids) <= max_prompt]
    return ids, len(ready) - len(ids)


def raw_prompts(files: list[Path], tokenizer, n: int, length: int,
                rng: np.random.Generator) -> list[list[int]]:
    """``n`` windows of ``length`` tokens of standard library text, cut from files taken in a
    random order: about four times the characters the windows need (at most 2 MB), tokenized
    once, in parallel where the tokenizer has a Rust backend."""
    if n < 1:
        return []
    chars = min(2_000_000, max(16 * n * length, 100_000))
    texts, size = [], 0
    for i in rng.permutation(len(files)):
        try:
            t = files[i].read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(t)
        size += len(t)
        if size >= chars:
            break
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    backend = getattr(getattr(tokenizer, "_tokenizer", None), "backend_tokenizer", None)
    if backend is not None:
        encoded = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    else:
        encoded = [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    data = np.array([i for ids in encoded for i in ids + [eos]], dtype=np.int64)
    starts = rng.integers(0, max(len(data) - length, 1), size=n)
    return [data[s:s + length].tolist() for s in starts]


# -- greedy text ------------------------------------------------------------------------------


def _padded_cache(left: list[int]):
    """mlx-lm's BatchKVCache for rows left-padded by ``left``, whose mask also lets each padding
    position see itself: mlx-lm's hides every key from a padding query, whose softmax is then
    0/0, and the NaN it leaves in that position's keys and values reaches the real rows through
    the next layer's attention (0 x NaN), even masked. Real queries see what they saw."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    class Padded(BatchKVCache):
        def make_mask(self, N: int, return_array: bool = False, **kwargs):
            mask = super().make_mask(N, return_array=return_array, **kwargs)
            keys = mx.arange(self._idx + N)[None]
            return mask | (keys == mx.arange(self._idx, self._idx + N)[:, None])

    return Padded(left)


def greedy_batch(target, prompts: list[list[int]], new: int, pad: int):
    """The target's ``new`` greedy tokens after each prompt, all rows in one batch: prompts
    left-padded in mlx-lm's BatchKVCache (each row's mask hides its padding and its positions
    start at 0, as the row alone), the prefill's logits taken at the last position only (a
    batch's full prefill logits would be rows x length x vocabulary). Returns (rows
    [prompt | greedy] right-padded with ``pad``, prompt lengths). Attention is the engine's
    plain arithmetic: the padding mask sends the fused call to cuDNN on CUDA
    (lab.build_drafters.mtp_forward)."""
    import mlx.core as mx

    from blockwidth.engine import hidden
    from blockwidth.engine.attention import verify_attention

    lengths = np.array([len(p) for p in prompts])
    width = int(lengths.max())
    left = (width - lengths).tolist()
    x = mx.array([[pad] * lp + p for lp, p in zip(left, prompts)])
    body, head = hidden.inner(target), hidden.lm_head(target)
    cache = [_padded_cache(left) for _ in body.layers]
    out = []
    with verify_attention("plain", any_shape=True):
        y = mx.argmax(head(body(x, cache=cache)[:, -1]), axis=-1)
        for i in range(new):
            out.append(y)
            if i + 1 < new:
                y = mx.argmax(head(body(y[:, None], cache=cache)[:, -1]), axis=-1)
                mx.async_eval(y)
    greedy = np.array(mx.stack(out, axis=1))
    rows = np.full((len(prompts), width + new), pad, dtype=np.int64)
    for r, (p, n) in enumerate(zip(prompts, lengths)):
        rows[r, :n] = p
        rows[r, n:n + new] = greedy[r]
    return rows, lengths


def step_text(args) -> dict:
    import mlx.core as mx

    target, tokenizer = load_target(args.target)
    if args.chat_share > 0 and not getattr(tokenizer, "has_chat_template", False):
        raise Refusal(f"--target {args.target}: its tokenizer has no chat template, so chat requests "
                      f"cannot be rendered; --chat-share 0 trains on raw text alone")
    rng = np.random.default_rng(args.seed)
    files = stdlib_files(args.stdlib)
    if not files:
        raise Refusal(f"--stdlib {args.stdlib}: no .py files there")
    t0 = time.time()
    n_chat = int(round(args.rows * args.chat_share))
    material = harvest(files, args.stdlib, max(n_chat // 4, 16), rng) if n_chat else None
    chat, dropped = render(tokenizer, chat_requests(int(n_chat * 1.2) + 8, material, rng),
                           args.max_prompt) if n_chat else ([], 0)
    chat = chat[:n_chat]
    raw = raw_prompts(files, tokenizer, args.rows - len(chat), args.raw_prompt, rng)
    log(f"requests: {len(chat)} chat ({dropped} over {args.max_prompt} tokens left out), "
        f"{len(raw)} raw windows of {args.raw_prompt} tokens, in {time.time() - t0:.0f}s")
    prompts = [(p, 1) for p in chat] + [(p, 0) for p in raw]
    order = rng.permutation(len(prompts))
    prompts = [prompts[i] for i in order]
    # the held-out rows are chat requests: acceptance on chat matters most
    chat_at = [i for i, (_, k) in enumerate(prompts) if k == 1]
    val_idx = set(chat_at[:args.val] if chat_at else range(min(args.val, len(prompts))))
    pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    width = max(len(p) for p, _ in prompts) + args.new
    rows, first, kind = [], [], []
    t1 = time.time()
    done = 0
    # with --seconds, batches until the budget is spent (at least one); else every row
    while done < len(prompts) and (done == 0 or not args.seconds or time.time() - t1 < args.seconds):
        part = prompts[done:done + args.gen_batch]
        got, lengths = greedy_batch(target, [p for p, _ in part], args.new, pad)
        block = np.full((len(part), width), pad, dtype=np.int64)
        block[:, :got.shape[1]] = got
        rows.append(block)
        first.append(lengths)
        kind.append(np.array([k for _, k in part]))
        done += len(part)
        mx.clear_cache()
        log(f"greedy text: {done} rows ({time.time() - t1:.0f}s)")
    rows_a, first_a = np.concatenate(rows), np.concatenate(first)
    held = np.array([i in val_idx for i in range(len(rows_a))])
    dtype = np.uint16 if int(rows_a.max()) < 2 ** 16 else np.int32
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "text.npz", rows=rows_a.astype(dtype), first=first_a,
                        end=first_a + args.new, chat=np.concatenate(kind).astype(bool), held_out=held)
    examples = [tokenizer.decode(rows_a[i, :first_a[i] + min(48, args.new)].tolist())
                for i in sorted(val_idx)[:3]]
    summary = {"rows": int(len(rows_a)), "held_out_rows": int(held.sum()),
               "chat_rows": int(np.concatenate(kind).sum()), "new_tokens": args.new,
               "row_width": width, "prompt_tokens_mean": round(float(first_a.mean()), 1),
               "generate_seconds": round(time.time() - t1, 1), "examples": examples}
    log(f"greedy text: {summary['rows']} rows ({summary['chat_rows']} chat, "
        f"{summary['held_out_rows']} held out) of {width} tokens in {summary['generate_seconds']}s")
    return summary


def load_text(out: Path):
    """(training rows, held-out rows) as lab.build_drafters.Greedy, from ``out/text.npz``."""
    from lab.build_drafters import Greedy

    path = out / "text.npz"
    if not path.is_file():
        raise Refusal(f"--out {out}: no text.npz there; run the text step first")
    z = np.load(path)
    g = Greedy(z["rows"].astype(np.int64), z["first"].astype(np.int64), z["end"].astype(np.int64))
    held = z["held_out"]
    return g.take(np.flatnonzero(~held)), g.take(np.flatnonzero(held))


# -- the drafters -----------------------------------------------------------------------------


def load_target(path: Path):
    from mlx_lm import load

    if not (path / "config.json").is_file():
        raise Refusal(f"--target {path}: no config.json there (an mlx-lm checkpoint folder)")
    return load(str(path), tokenizer_config={"trust_remote_code": False})


def target_config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def spread(n_target: int, count: int) -> tuple[int, ...]:
    """Target layers a DFlash drafter reads, spread as z-lab's build_target_layer_ids spreads
    them: from layer 1 to layer n - 3 (Qwen3-8B's 36 layers, 5 read: 1, 9, 17, 25, 33)."""
    if count == 1:
        return (n_target // 2,)
    lo, hi = 1, max(n_target - 3, 1)
    return tuple(sorted({int(round(lo + i * (hi - lo) / (count - 1))) for i in range(count)}))


def quantized(config: dict) -> bool:
    return bool(config.get("quantization") or config.get("quantization_config"))


def _budget(args, name: str) -> int:
    """Steps for _fit: with --seconds, the time budget decides (the step count is a bound only)."""
    from lab import build_drafters as bd

    bd.VALIDATE_EVERY = args.validate_every
    if args.seconds:
        bd.SECONDS[name] = args.seconds
        return 10 ** 9
    return args.steps


def step_dflash(args) -> dict:
    from mlx.utils import tree_flatten

    from lab import build_drafters as bd
    from tests.checkpoints import dflash_config, write_dflash

    target, _ = load_target(args.target)
    tconfig = target_config(args.target)
    n = tconfig["num_hidden_layers"]
    layers = tuple(args.dflash_target_layers) if args.dflash_target_layers else spread(n, args.dflash_reads)
    if not all(0 <= i < n for i in layers):
        raise Refusal(f"--dflash-target-layers {','.join(map(str, layers))}: the target has layers 0..{n - 1}")
    cfg = dflash_config(tconfig, layers=layers, n_layers=args.dflash_layers, block=args.block,
                        mask=args.mask_token)
    train, val = load_text(args.out)
    log(f"dflash: {args.dflash_layers} layers reading target layers {list(layers)}, block {args.block}")
    model, loss = bd.train_dflash([target], [train], _budget(args, "dflash"), args.batch, args.blocks,
                                  args.lr or 2e-3, cfg, np.random.default_rng(args.seed), 0, [val])
    write_dflash(args.out / "dflash", cfg, model)
    return {"loss": round(loss, 3), "target_layer_ids": list(layers), "layers": args.dflash_layers,
            "block_size": args.block, "params": int(sum(v.size for _, v in tree_flatten(model.parameters())))}


def step_mtp(args) -> dict:
    from mlx.utils import tree_flatten

    from lab import build_drafters as bd
    from tests.checkpoints import write_mtp

    target, _ = load_target(args.target)
    tconfig = target_config(args.target)
    train, val = load_text(args.out)
    # the head starts as the target's last layer: on a short budget a random head learns the
    # layer from nothing (the 1B pair's lesson); a quantized target's layer is not a float start
    init = args.mtp_init == "last" and not quantized(tconfig)
    if args.mtp_init == "last" and not init:
        log("mtp: the target is quantized; the head starts at random")
    head, loss = bd.train_mtp([target], [train], _budget(args, "mtp"), args.batch, args.lr or 2e-3,
                              tconfig, np.random.default_rng(args.seed), 0, [val],
                              init_target=target if init else None)
    write_mtp(args.out / "mtp", tconfig, head)
    return {"loss": round(loss, 3), "init": "last layer" if init else "random",
            "params": int(sum(v.size for _, v in tree_flatten(head.parameters())))}


def drafter_layers(n_target: int, count: int) -> tuple[int, ...]:
    """The target layers a ``count``-layer drafter starts from: its first ``count``, an early
    exit. On SmolLM2-135M (this CPU, 4 rows of its greedy text, before any training) layers
    0-3 under the target's final norm and head agreed with the target's argmax at 4.8 % of the
    positions; every start that kept layer 29 (0,1,28,29; 0,1,2,29; 0,29; 0,10,20,29;
    26-29; 0,27,28,29) at none: a last layer fed shallow states is no start."""
    return tuple(range(min(count, n_target)))


def drafter_config(tconfig: dict, n_layers: int) -> dict:
    c = {k: v for k, v in tconfig.items() if k not in ("quantization", "quantization_config")}
    c["num_hidden_layers"] = n_layers
    if isinstance(c.get("layer_types"), list):
        c["layer_types"] = c["layer_types"][:n_layers]
    c["torch_dtype"] = "bfloat16"
    return c


def make_drafter(target, tconfig: dict, layers: tuple[int, ...], train_embedding: bool):
    """A model of the target's own family with ``len(layers)`` layers, started from the target's
    ``layers``, embedding, final norm (and LM head when untied), in float32 for training."""
    import mlx.core as mx
    from mlx.utils import tree_map

    from blockwidth.engine import hidden

    config = drafter_config(tconfig, len(layers))
    mod = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = mod.Model(mod.ModelArgs.from_dict(config))
    src, dst = hidden.inner(target), hidden.inner(model)
    dst.embed_tokens.update(src.embed_tokens.parameters())
    dst.norm.update(src.norm.parameters())
    for i, j in enumerate(layers):
        dst.layers[i].update(src.layers[j].parameters())
    if hasattr(model, "lm_head") and hasattr(target, "lm_head"):
        model.lm_head.update(target.lm_head.parameters())
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    if not train_embedding:
        dst.embed_tokens.freeze()
        if hasattr(model, "lm_head"):
            model.lm_head.freeze()
    mx.eval(model.parameters())
    return model, config


def save_drafter(model, config: dict, out: Path, tok_dir: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    weights = {k: v.astype(mx.bfloat16) for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    for f in sorted(tok_dir.iterdir()):
        if f.is_file() and f.name.startswith(TOKENIZER_FILES):
            shutil.copy(f, out / f.name)
    save_config(config, out / "config.json")  # last: its presence says the folder is whole


def step_drafter(args) -> dict:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from lab import build_drafters as bd

    target, _ = load_target(args.target)
    tconfig = target_config(args.target)
    if quantized(tconfig):
        raise Refusal(f"--target {args.target}: quantized; the drafter starts from a float target's layers")
    n = tconfig["num_hidden_layers"]
    layers = tuple(args.drafter_layers) if args.drafter_layers else drafter_layers(n, args.drafter_depth)
    if not all(0 <= i < n for i in layers):
        raise Refusal(f"--drafter-layers {','.join(map(str, layers))}: the target has layers 0..{n - 1}")
    drafter, config = make_drafter(target, tconfig, layers, args.train_embedding)
    train, val = load_text(args.out)
    rng = np.random.default_rng(args.seed)
    soft = args.soft
    pos = np.arange(train.rows.shape[1])[None, :]

    def batch():
        src = train.take(rng.integers(0, len(train), size=args.batch))
        x = mx.array(src.rows)
        z = mx.stop_gradient(target(x))
        w = mx.array((pos < src.end[:, None]).astype(np.float32))  # every real position
        return x, z, w, None

    def loss_fn(model, x, z, w, _target):
        logits = model(x)
        per = nn.losses.cross_entropy(logits, mx.argmax(z, axis=-1), reduction="none")
        if soft > 0:
            p = mx.softmax(z.astype(mx.float32), axis=-1)
            per = (1 - soft) * per - soft * (p * nn.log_softmax(logits.astype(mx.float32), axis=-1)).sum(-1)
        return (per * w).sum() / mx.maximum(w.sum(), 1)

    def validate() -> float:
        """Teacher-forced width-4 rounds on held-out greedy text: from each position of the
        continuation (the prompt's last token on), the leading drafts that match the target's
        argmax, per drafted token."""
        got = []
        t = np.arange(val.rows.shape[1])[None, :]
        for i in range(0, len(val), 32):
            part = val.take(slice(i, i + 32))
            x = mx.array(part.rows)
            hit = (mx.argmax(drafter(x), axis=-1) == mx.argmax(target(x), axis=-1)).astype(mx.float32)
            runs = mx.stack([hit[:, :-2], hit[:, 1:-1], hit[:, 2:]], axis=-1)
            w = (t[:, :-2] >= part.first[:, None] - 1) & (t[:, :-2] + 2 < part.end[:, None])
            got.append(bd._leading(runs, mx.array(w.astype(np.float32))))
        return float(np.mean(got))

    emb = "trained" if args.train_embedding else "frozen (the target's own)"
    log(f"drafter: {len(layers)} layers started from target layers {list(layers)}, embedding {emb}")
    loss = bd._fit(drafter, loss_fn, batch, _budget(args, "drafter"), args.lr or 1e-3, "drafter",
                   validate if len(val) else None)
    save_drafter(drafter, config, args.out / "drafter", args.target)
    return {"loss": round(loss, 3), "target_layers": list(layers), "soft": soft,
            "embedding": "trained" if args.train_embedding else "frozen",
            "params": int(sum(v.size for _, v in tree_flatten(drafter.parameters())))}


# -- acceptance -------------------------------------------------------------------------------


def held_out(values: list[str]):
    """The chat requests of each held-out workload (a JSONL file, or a built-in's name), as
    (name, workload); a workload without one is refused."""
    from blockwidth.policy.workload import Workload, WorkloadError, read

    out = []
    for value in values:
        try:
            w = read(value, "--held-out")
        except WorkloadError as e:
            raise Refusal(str(e)) from None
        chat = tuple(r for r in w.requests if r.chat)
        if not chat:
            raise Refusal(f"--held-out {value}: no chat request in it")
        name = w.name if len(chat) == len(w.requests) else f"{w.name} (chat requests)"
        out.append((name, Workload(w.name, chat, w.sha256, w.source)))
    return out


def step_measure(args, kind: str) -> dict:
    """Acceptance of OUT/KIND at each width on the held-out chat requests, through this engine's
    decode loop; written to OUT/acceptance-KIND.json after every width."""
    import mlx.core as mx

    from blockwidth.engine.ab import per_token_acceptance
    from blockwidth.engine.decode import speculative
    from blockwidth.engine.pair import load_pair
    from blockwidth.engine.workload import prepare
    from blockwidth.policy.errors import BlockwidthError
    from blockwidth.policy.workload import WorkloadError

    folder = args.out / kind
    groups = held_out(args.held_out or list(HELD_OUT_DEFAULT))
    try:
        pair = load_pair(args.target, folder, ENGINE_KIND[kind])
    except BlockwidthError as e:  # the engine's one line: what it refuses about this pair
        raise Refusal(str(e)) from None
    try:
        ready = [(name, prepare(w, pair.tokenizer, args.tokens)) for name, w in groups]
    except WorkloadError as e:
        raise Refusal(str(e)) from None
    result = {"kind": ENGINE_KIND[kind], "drafter": str(folder), "target": str(args.target),
              "device": str(mx.default_device()), "mlx": mx.__version__, "new_tokens": args.tokens,
              "eos": "ignored (the A/B method's fixed token count)",
              "path": "engine (stock kernels: the exact path off)",
              "requests": {name: [p.to_dict() for p in reqs] for name, reqs in ready},
              "widths": {}}
    out = args.out / f"acceptance-{kind}.json"
    for width in args.widths:
        t0 = time.time()
        row: dict = {}
        runs_all = []
        for name, reqs in ready:
            runs = [speculative(pair, list(p.ids), p.max_tokens, width) for p in reqs]
            runs_all += runs
            row[name] = _figures(runs, per_token_acceptance) | {
                "per_request": {p.id: round(r.acceptance or 0.0, 3) for p, r in zip(reqs, runs)}}
        row["all"] = _figures(runs_all, per_token_acceptance)
        row["seconds"] = round(time.time() - t0, 1)
        result["widths"][str(width)] = row
        out.write_text(json.dumps(result, indent=2))
        log(f"acceptance {kind} w{width}: " + ", ".join(
            f"{name} {row[name]['pooled']}" for name, _ in ready) + f" ({row['seconds']}s)")
    return result


def _figures(runs, per_token) -> dict:
    drafted = sum(r.drafted for r in runs)
    accepted = sum(r.accepted for r in runs)
    rounds = sum(len(r.rounds) for r in runs)
    emitted = sum(len(r.tokens) for r in runs)
    return {"pooled": round(accepted / drafted, 3) if drafted else None,
            "per_token": round(per_token(runs) or 0.0, 3),
            "tokens_per_round": round(emitted / rounds, 2) if rounds else None,
            "accepted": accepted, "drafted": drafted, "rounds": rounds}


# -- command line -----------------------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers") from None
    if not out:
        raise argparse.ArgumentTypeError("empty")
    return out


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.target_drafters", description=__doc__.splitlines()[0])
    ap.add_argument("step", choices=("text",) + KINDS + ("measure",))
    ap.add_argument("--target", type=Path, required=True, help="an mlx-lm checkpoint folder (bfloat16)")
    ap.add_argument("--out", type=Path, required=True, help="the results folder every step shares")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="time budget of the step's generation or training (0: --steps / --rows)")
    ap.add_argument("--steps", type=int, default=200, help="training steps without --seconds")
    ap.add_argument("--seed", type=int, default=0)
    g = ap.add_argument_group("text")
    g.add_argument("--rows", type=int, default=16384, help="greedy continuations at most")
    g.add_argument("--new", type=int, default=160, help="greedy tokens per row (EOS ignored)")
    g.add_argument("--gen-batch", type=int, default=2048, help="rows per generation batch")
    g.add_argument("--chat-share", type=float, default=0.75, help="share of rows from chat requests")
    g.add_argument("--max-prompt", type=int, default=128, help="longest chat request in tokens")
    g.add_argument("--raw-prompt", type=int, default=64, help="tokens of each raw text window")
    g.add_argument("--val", type=int, default=128, help="chat rows held out to validate")
    g.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    g = ap.add_argument_group("training")
    g.add_argument("--batch", type=int, default=32, help="rows per step")
    g.add_argument("--validate-every", type=float, default=0.2, metavar="F",
                   help="validate on the held-out rows every F of the budget (or of the steps): "
                        "with a 49152-token vocabulary a validation is not free, and it is paid "
                        "out of the training budget")
    g.add_argument("--lr", type=float, default=None, help="peak learning rate (dflash, mtp 2e-3; drafter 1e-3)")
    g.add_argument("--blocks", type=int, default=16, help="DFlash blocks per row")
    g.add_argument("--block", type=int, default=16, help="DFlash block size (the width it declares)")
    g.add_argument("--dflash-layers", type=int, default=2)
    g.add_argument("--dflash-reads", type=int, default=4, help="target layers DFlash reads, spread")
    g.add_argument("--dflash-target-layers", type=_ints, default=None, help="or exactly these")
    g.add_argument("--mask-token", type=int, default=None, help="DFlash mask token (default vocab - 1)")
    g.add_argument("--mtp-init", choices=("last", "random"), default="last")
    g.add_argument("--drafter-depth", type=int, default=4, help="model drafter layers")
    g.add_argument("--drafter-layers", type=_ints, default=None, help="or exactly these target layers")
    g.add_argument("--train-embedding", action="store_true",
                   help="train the drafter's embedding (and head) too; frozen by default")
    g.add_argument("--soft", type=float, default=0.5,
                   help="share of the drafter's loss against the target's distribution")
    g = ap.add_argument_group("measure")
    g.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    g.add_argument("--widths", type=_ints, default=WIDTHS)
    g.add_argument("--tokens", type=int, default=64,
                   help="new tokens per request (sweep's default: what its sessions measure)")
    g.add_argument("--held-out", action="append", metavar="FILE|mixed",
                   help="held-out workload whose chat requests are measured, again for more "
                        "(default lab/chat_heldout.jsonl, the built-in chat and mixed)")
    return ap


def _check(args) -> None:
    if not 0.0 <= args.chat_share <= 1.0:
        raise Refusal(f"--chat-share {args.chat_share}: a share from 0 to 1")
    if not 0.0 <= args.soft <= 1.0:
        raise Refusal(f"--soft {args.soft}: a share from 0 to 1")
    for name in ("rows", "new", "gen_batch", "max_prompt", "raw_prompt", "batch", "blocks", "steps",
                 "dflash_layers", "dflash_reads", "drafter_depth", "tokens"):
        if getattr(args, name) < 1:
            raise Refusal(f"--{name.replace('_', '-')} {getattr(args, name)}: at least 1")
    if args.block < 2:
        raise Refusal(f"--block {args.block}: a block is at least 2 rows")
    if not 0.0 < args.validate_every <= 1.0:
        raise Refusal(f"--validate-every {args.validate_every}: a fraction above 0, at most 1")
    if args.seconds < 0:
        raise Refusal(f"--seconds {args.seconds}: not negative")
    if bad := [w for w in args.widths if w < 2]:
        raise Refusal(f"--widths: {bad[0]} is not a speculative width (at least 2)")
    if bad := [k for k in args.kinds if k not in KINDS]:
        raise Refusal(f"--kinds: {bad[0]} is not one of {', '.join(KINDS)}")
    if not (args.target / "config.json").is_file():
        raise Refusal(f"--target {args.target}: no config.json there (an mlx-lm checkpoint folder)")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        _check(args)
        import mlx.core as mx

        mx.random.seed(args.seed)
        t0 = time.time()
        if args.step == "measure":
            for kind in args.kinds:  # every drafter asked for is there before any is measured
                if not (args.out / kind / "config.json").is_file():
                    raise Refusal(f"--out {args.out}: no {kind}/ drafter there; run the {kind} step first")
            for kind in args.kinds:
                step_measure(args, kind)
            return 0
        summary = {"text": step_text, "dflash": step_dflash, "mtp": step_mtp,
                   "drafter": step_drafter}[args.step](args)
    except Refusal as e:
        print(f"lab.target_drafters {args.step}: {e}", file=sys.stderr)
        return 2
    summary = {"step": args.step, "seconds": round(time.time() - t0, 1), "python": sys.version.split()[0],
               "mlx": mx.__version__, "device": str(mx.default_device()),
               "args": {k: str(v) for k, v in vars(args).items()}} | summary
    (args.out / f"build-{args.step}.json").write_text(json.dumps(summary, indent=2))
    log(f"{args.step}: done in {summary['seconds']}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
