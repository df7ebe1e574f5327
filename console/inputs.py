"""Turn command-line inputs into policy values, with one-line errors for bad input.

Shared by the headless commands and (later) the app; imports no Textual and no MLX.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Mapping

from blockwidth.engine import demo
from blockwidth.engine.checkpoint import Checkpoint, pair_id, read_checkpoint
from blockwidth.policy import files
from blockwidth.policy import profile as profiles
from blockwidth.policy.device import Device, parse_device_spec
from blockwidth.policy.drafter import DrafterInfo, DrafterKind, detect_drafter, kind_problem, pairing_problem
from blockwidth.policy.errors import BlockwidthError, ExitCode, InputError  # noqa: F401 (the front ends take them from here)
from blockwidth.policy.config import ConfigError
from blockwidth.policy.quantization import Quantization
from blockwidth.policy.resolve import Resolution, Step, resolve
from blockwidth.policy.text import shown


# The operator's own offline setting, read before engine.pair switches the hub off for
# mlx-lm: a hub id that the operator names may be downloaded unless they said offline.
_USER_OFFLINE = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")

# What a checkpoint needs: the configs and tokenizer files, and the weights when it is loaded.
_HUB_FILES = ["*.json", "tokenizer*", "*.model", "*.tiktoken", "*.txt", "*.jinja"]


_MLX_IN_THREAD = [False]


def note_mlx_thread() -> None:
    """MLX work is about to run in a thread other than the main one (the console's workers,
    the CLI's interruptible measurements): the process must then leave by ``os._exit``."""
    _MLX_IN_THREAD[0] = True


def mlx_ran_in_thread() -> bool:
    return _MLX_IN_THREAD[0]


def mlx_version() -> str | None:
    try:
        return metadata.version("mlx")
    except metadata.PackageNotFoundError:
        return None


def user_path(value: str | os.PathLike | None, what: str) -> Path | None:
    """An optional path option: None when not given; an empty one or ``~nouser`` is an error
    (an empty path must never fall back to a default)."""
    if value is None:
        return None
    return files.user_path(value, what)


def looks_like_repo_id(value: str | os.PathLike) -> bool:
    """``owner/name``, as mlx-lm takes it: one slash, no path-like start, no spaces."""
    text = str(value)
    parts = text.split("/")
    return (len(parts) == 2 and all(parts) and not text.startswith((".", "~"))
            and not any(c.isspace() for c in text))


def hub_checkpoint(repo: str, what: str, weights: bool, download: bool = True) -> Path:
    """A Hugging Face repo id from the local cache; downloaded (with progress on stderr, Ctrl-C
    cancels) only when missing there and the operator has not set HF_HUB_OFFLINE."""
    import sys

    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    patterns = _HUB_FILES + (["*.safetensors"] if weights else [])
    try:
        path = Path(snapshot_download(repo, local_files_only=True, allow_patterns=patterns))
        if (path / "config.json").is_file() and (not weights or any(path.glob("*.safetensors"))):
            return path
    except HFValidationError as e:
        raise InputError(f"{repo}: no such folder, and not a Hugging Face repo id ({e})", what) from None
    except LocalEntryNotFoundError:
        pass
    if _USER_OFFLINE:
        raise InputError(f"{repo}: no such folder, and not in the Hugging Face cache "
                         f"({constants.HF_HUB_CACHE}); HF_HUB_OFFLINE is set, so it is not downloaded", what)
    if not download:
        raise InputError(f"{repo}: not in the Hugging Face cache ({constants.HF_HUB_CACHE}); "
                         f"`blockwidth --target {repo}` downloads it, with progress", what)
    print(f"blockwidth: {CLI_NAMES.get(what, what)} {shown(repo)}: downloading {'the checkpoint' if weights else 'its configs'} "
          f"from the Hugging Face Hub into {constants.HF_HUB_CACHE} (Ctrl-C cancels)", file=sys.stderr)
    offline, constants.HF_HUB_OFFLINE = constants.HF_HUB_OFFLINE, False  # named by the operator
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns))
    except Exception as e:  # the hub raises many kinds: not found, gated, no network
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""  # the hub's are paragraphs
        raise InputError(f"{repo}: download failed ({type(e).__name__}: {first})", what) from None
    finally:
        constants.HF_HUB_OFFLINE = offline


def checkpoint_dir(value: str | os.PathLike, what: str, weights: bool = False,
                   download: bool = True) -> Path:
    """A checkpoint folder: a path, or a Hugging Face repo id (``owner/name``) as mlx-lm takes."""
    path = user_path(value, what)
    assert path is not None
    if not path.exists() and looks_like_repo_id(value):
        return hub_checkpoint(str(value), what, weights, download)
    if not path.exists():
        raise InputError(f"{path}: no such file or directory", what)
    if not path.is_dir():
        raise InputError(f"{path}: is a file, not a checkpoint folder", what)
    return path


def target_quantization(path: Path | Checkpoint) -> Quantization:
    """The target's quantization. A folder without a readable config.json is not a checkpoint:
    an error, as it is for a drafter (a config that parses but names an odd scheme is
    ``unknown``, with the reason)."""
    target = read_checkpoint(path, "target")
    try:
        return target.quantization
    except ConfigError as e:
        raise e.about("target") from None


def device_for(spec: str | None) -> Device:
    if spec:
        return parse_device_spec(spec)
    from blockwidth.engine.device import probe

    return probe()


def load_profile(path: str | None, missing_ok: bool = False) -> profiles.Profile:
    """The profile to resolve with; a named one must exist unless ``missing_ok`` (a save creates it)."""
    named = user_path(path, "profile")
    if named is not None:
        return profiles.load(named, missing_ok=missing_ok)
    return profiles.load(None, missing_ok=True)


# How each front end words an input's name, once: the command line as its flag, the console as
# its field's label (a BlockwidthError names its input by these keys; ``say`` uses the words).
CLI_NAMES: Mapping[str, str] = {
    "target": "--target", "draft": "--draft", "kind": "--kind", "device": "--device",
    "profile": "--profile", "record dir": "--record-dir", "widths": "--widths", "n": "-n",
    "tokens": "--max-tokens", "prompt": "--prompt", "prompt file": "--prompt-file",
    "max reps": "--max-reps", "max seconds": "--max-seconds", "rows": "--rows",
    "demo target": "--demo-target",
    "distributed": "--distributed",
}
CONSOLE_NAMES: Mapping[str, str] = {
    "target": "target field", "draft": "drafter field", "kind": "kind field",
    **{k: f"{k} field" for k in ("widths", "n", "tokens", "prompt", "prompt file")},
    "max reps": "reps field", "max seconds": "secs field",  # the sequential budget's labels
    # the console takes these from its command line only: said as the flags they came from
    "device": "--device", "profile": "--profile", "record dir": "--record-dir",
    "demo target": "--demo-target",
}
@dataclass(frozen=True)
class PairPaths:
    target: Path
    drafter: Path | None
    demo: bool


def pair_paths(target: str | None, draft: str | None, variant: str | None = None,
               kind: str | None = None, weights: bool = False, download: bool = True) -> PairPaths:
    """The pair's folders; the demo pair without --target (the demo drafter of --kind, none for
    lookup). ``variant``: the demo target (``bf16`` when None); given with a target it is an error,
    not ignored.
    ``weights``: the pair will be loaded, so a hub id needs its weights too, not just configs."""
    if target is not None and variant is not None:
        raise InputError(f"{variant} given with a target: it picks the demo pair's target, "
                         f"used only without one; drop one", "demo target")
    if target is None:
        if draft is not None:
            raise InputError("given without a target: name the target too", "draft")
        drafter = None if kind == DrafterKind.LOOKUP.value else demo.DRAFTERS.get(kind or "model")
        if kind is not None and kind != DrafterKind.LOOKUP.value and drafter is None:
            raise InputError(f"{kind}: the demo pair has no {kind} drafter (it has "
                             f"{', '.join(demo.DRAFTERS)} and lookup)", "kind")
        return PairPaths(demo.target(variant or "bf16"), drafter, True)
    return PairPaths(checkpoint_dir(target, "target", weights, download),
                     checkpoint_dir(draft, "draft", weights, download) if draft is not None else None,
                     False)


def drafter_info(paths: PairPaths, kind: str | None,
                 names: Mapping[str, str] = CLI_NAMES, drafter: Checkpoint | None = None) -> DrafterInfo:
    """``names``: how the detail words the inputs (CLI_NAMES or CONSOLE_NAMES), so a drafter
    opened in the console's fields is not described by a ``--draft`` flag nobody gave.
    ``drafter``: the drafter's folder as already read."""
    explicit = DrafterKind(kind) if kind else None
    if paths.drafter is None:
        k = explicit or DrafterKind.LOOKUP
        how = f"{names['kind']} given" if explicit else f"no {names['draft']}: the model-free lookup drafter"
        return DrafterInfo(k, None, how)
    detected = detect_drafter(read_checkpoint(drafter or paths.drafter, "draft").config)
    problem = kind_problem(explicit, detected, paths.drafter)
    if problem:
        raise problem
    if explicit and explicit is not detected.kind:
        return DrafterInfo(explicit, detected.declared_width,
                           f"{names['kind']} {explicit.value} given (detection said {detected.kind.value})")
    return detected


def resolution(*, target: str | None, draft: str | None, kind: str | None,
               flag: str | None, device: str | None, profile: str | None,
               env: Mapping[str, str] | None = None, variant: str | None = None,
               profile_missing_ok: bool = False, download: bool = True,
               names: Mapping[str, str] = CLI_NAMES, route: str = profiles.PATH_ENGINE,
               concurrency: int = 1) -> tuple[Resolution, PairPaths, DrafterInfo]:
    """The resolution every front end shows: ``route`` and ``concurrency`` are what it is for
    (``blockwidth serve`` resolves for mlx_lm.server under its load)."""
    paths = pair_paths(target, draft, variant, kind, download=download)
    # a kind that cannot run without (or with) this drafter is refused here as sweep refuses it:
    # resolve answered dflash with no drafter "width 4" while sweep said the drafter is missing
    problem = pairing_problem(kind, paths.drafter)
    if problem:
        raise problem
    # each folder read once for the whole resolution (its config, quantization, fingerprint)
    drafter_ck = read_checkpoint(paths.drafter, "draft") if paths.drafter is not None else None
    info = drafter_info(paths, kind, names, drafter_ck)
    target_ck = read_checkpoint(paths.target, "target")
    if info.kind is DrafterKind.MODEL and drafter_ck is not None:
        # The pair the console refuses to load, resolve refuses too: one rule (engine.pair).
        from blockwidth.engine.pair import PairError, swapped, vocabulary_mismatch

        why = vocabulary_mismatch(target_ck, drafter_ck) or swapped(target_ck, drafter_ck)  # a PairError names its input
        if why:
            raise PairError(why, "draft")
    quant = target_quantization(target_ck)
    dev = device_for(device)
    prof = load_profile(profile, profile_missing_ok)
    pid = pair_id(target_ck, drafter_ck)
    res = resolve(
        drafter_kind=info.kind, device=dev, quantization=quant, flag=flag,
        env=os.environ if env is None else env, profile=prof,
        declared_width=info.declared_width, declared_detail=info.detail,
        pair=pid, mlx_version=mlx_version(), route=route, concurrency=concurrency,
    )
    return res, paths, info


def chain_lines(chain: tuple[Step, ...]) -> list[str]:
    out = []
    for s in chain:
        mark = "->" if s.applied else "  "
        w = str(s.width) if s.width is not None else "-"
        out.append(f"  {mark} {s.source.value:<19} {w:>3}  {s.why}")
    return out
