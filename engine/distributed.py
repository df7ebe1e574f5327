"""A target sharded with MLX's own distributed layer: the group a process is a rank of, the target
loaded with mlx-lm's sharded (tensor parallel) or pipeline loader, the lockstep that keeps every
rank's session the same, where the drafter runs, and the communication a verify round pays.

Every rank runs the same session on its shard (SPMD, as mlx-lm's own distributed generation runs
``stream_generate`` on every rank): the collectives inside the target's forward (an all_sum after
every ``ShardedToAllLinear``, or the pipeline's send/recv and closing all_gather) leave every
rank with the same logits, so every rank picks the same tokens. What is local to a rank (its
clock) must not steer the session: after every run the ranks compare their tokens (a digest
gathered from every rank) and all take rank 0's timings, so verdicts, the sequential mode's
"more repetitions?" and its budgets are decided once, as rank 0 decides them. Nothing here is a
distributed layer of its own: every byte moves through ``mx.distributed``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import mlx.core as mx

from blockwidth.policy.device import GROUP_BACKENDS, Device, Group, Member, Sharding
from blockwidth.policy.drafter import DrafterKind
from blockwidth.policy.errors import BlockwidthError, ExitCode


class DistributedError(BlockwidthError):
    """A group that cannot be formed or used, or ranks that disagree; one line that says which.
    Ranks that part mid-session end the command with 1 (a failed measurement); a group or a
    target that cannot be used is bad input (2, and the input it is about: ``distributed``,
    ``target``)."""

    exit_code = ExitCode.CHECK_FAILED


# Where a model drafter runs: on every rank (replicated: each proposes the same tokens, nothing
# is sent) or on rank 0 alone (rank0: its proposals reach the others in one all_gather a round).
# Prompt lookup has no model: every rank runs it.
REPLICATED, RANK0 = "replicated", "rank0"
PLACEMENTS = (REPLICATED, RANK0)
AGREE_RUN, AGREE_ROUND = "run", "round"  # when ranks compare tokens: after each run, or every forward


def launched_backend(env: Mapping[str, str]) -> str | None:
    """The backend a launcher set this process up for, from the variables each one sets
    (mlx.launch and MLX's docs, 'Distributed without mlx.launch'); None: not launched."""
    if "MLX_RANK" in env and "MLX_WORLD_SIZE" in env and "NCCL_HOST_IP" in env:
        return "nccl"
    if "MLX_RANK" in env and "MLX_JACCL_COORDINATOR" in env:
        return "jaccl"
    if "MLX_RANK" in env and "MLX_HOSTFILE" in env:
        return "ring"
    if any(k in env for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
        return "mpi"
    return None


# ---- bytes through the group ------------------------------------------------------------------

def gather_bytes(group, payload: bytes) -> list[bytes]:
    """Every rank's ``payload``, in rank order: two all_gathers (the lengths, then the bytes
    padded to the longest), so any payload goes through any backend that gathers uint8."""
    lens = mx.distributed.all_gather(mx.array([len(payload)], mx.int32), group=group).tolist()
    width = max(max(lens), 1)
    buf = mx.array(list(payload.ljust(width, b"\0")), mx.uint8)
    rows = mx.distributed.all_gather(buf, group=group).reshape(len(lens), width).tolist()
    return [bytes(row[:n]) for row, n in zip(rows, lens)]


def broadcast_bytes(group, payload: bytes) -> bytes:
    """Rank 0's ``payload`` on every rank."""
    return gather_bytes(group, payload)[0]


# ---- the group --------------------------------------------------------------------------------

@dataclass
class Rank:
    """This process's place in its group, and what the group is (policy.device.Group)."""

    group: Any  # mx.distributed.Group
    backend: str
    sharding: Sharding
    info: Group
    devices: tuple[dict, ...] = ()  # every rank's own device, as its probe read it
    hosts: tuple[str, ...] = ()  # every rank's host name

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    @property
    def writer(self) -> bool:
        """Rank 0: the one that prints, writes records and touches the profile."""
        return self.rank == 0

    def to_dict(self) -> dict:
        return {**self.info.to_dict(), "ranks": [{"rank": i, "host": h, "device": d}
                                                for i, (h, d) in enumerate(zip(self.hosts, self.devices))]}


def _refused(sharding: Sharding, why: str) -> DistributedError:
    """A group that cannot be joined, said of --distributed and its sharding."""
    return DistributedError(f"{sharding.value}: {why}", "distributed", ExitCode.USAGE)


def init(backend: str | None, sharding: Sharding | str) -> Rank:
    """Join the group this process was launched into (``backend`` None: the one the launcher's
    variables name), read every rank's device, and make the probe answer with the group."""
    import platform

    from blockwidth.engine import device as probe_door

    sharding = Sharding(sharding)
    backend = backend or launched_backend(os.environ)
    if backend is None:
        raise _refused(sharding, "no group to join: this process was not started by mlx.launch (or "
                                 "mpirun); run under mlx.launch, or give --ranks N")
    if backend not in GROUP_BACKENDS:
        raise _refused(sharding, f"backend {backend!r}: MLX's are {', '.join(GROUP_BACKENDS)}")
    if not mx.distributed.is_available(backend):
        raise _refused(sharding, f"backend {backend}: not available in this MLX build "
                                 f"(mx.distributed.is_available({backend!r}) is False)")
    try:
        group = mx.distributed.init(strict=True, backend=backend)
    except RuntimeError as e:
        raise _refused(sharding, f"backend {backend}: the group cannot be formed ({' '.join(str(e).split())})") from None
    if group.size() < 2:
        raise _refused(sharding, f"backend {backend}: a group of {group.size()}: nothing is sharded "
                                 "over one process")
    here = probe_door.probe_alone()
    mine = json.dumps({"device": here.to_dict(), "host": platform.node()}).encode()
    every = [json.loads(b) for b in gather_bytes(group, mine)]
    members = tuple(Member.of(_device(e["device"])) for e in every)
    info = Group(backend, sharding, group.size(), members)
    probe_door.join(info)
    return Rank(group, backend, sharding, info, tuple(e["device"] for e in every),
                tuple(e["host"] for e in every))


def _device(d: Mapping[str, Any]) -> Device:
    from blockwidth.policy.device import Backend

    return Device(Backend(d["backend"]), d.get("name") or "", d.get("architecture"),
                  d.get("compute_capability"))


def leave() -> None:
    """The probe answers for this process alone again (tests that run ranks in-process)."""
    from blockwidth.engine import device as probe_door

    probe_door.join(None)


# ---- the sharded target -----------------------------------------------------------------------

def shard_problem(config: Mapping[str, Any], sharding: Sharding, size: int) -> str | None:
    """Why mlx-lm cannot split this target over ``size`` ranks, from its config alone, or None.
    Tensor parallel splits every attention head set and the MLP's hidden size ``size`` ways;
    a pipeline gives every rank at least one layer."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    if sharding is Sharding.TENSOR:
        for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            v = text.get(key)
            if isinstance(v, int) and v % size:
                return f"{key} = {v} does not split into {size} equal shards (tensor parallel splits it {size} ways)"
        return None
    layers = text.get("num_hidden_layers")
    if isinstance(layers, int) and layers < size:
        return f"num_hidden_layers = {layers}: fewer layers than the {size} pipeline stages"
    return None


def _staged(path: Path) -> tempfile.TemporaryDirectory | None:
    """mlx-lm's pipeline loader picks each stage's files from ``model.safetensors.index.json``,
    which a single-file checkpoint does not ship: a folder beside it of links to its files and
    that index, written from the weights' own headers; None where the index is there."""
    from blockwidth.engine.checkpoint import read_header, weight_files

    if (path / "model.safetensors.index.json").is_file():
        return None
    tmp = tempfile.TemporaryDirectory(prefix="blockwidth-pipeline-")
    weight_map = {}
    for f in weight_files(path):
        weight_map.update({k: f.name for k in read_header(f) if k != "__metadata__"})
    for f in path.iterdir():
        if f.is_file():
            os.symlink(f.resolve(), Path(tmp.name) / f.name)
    (Path(tmp.name) / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return tmp


def _unsplit(sharding: Sharding, size: int, why: str) -> DistributedError:
    """A target this group cannot split, said of --target with the group it was split for."""
    return DistributedError(f"{why} ({sharding.value}-sharded over {size} ranks)", "target", ExitCode.USAGE)


def check_split(path: Path, sharding: Sharding, size: int) -> None:
    """Raise DistributedError about the target when mlx-lm cannot split it ``sharding``-wise over
    ``size`` ranks: its config's sizes, then its model class (built lazily, no weights read).
    The launcher asks before it starts a group (a refusal then costs no group start), and each
    rank again as it loads."""
    from mlx_lm.utils import load_model

    from blockwidth.policy.quantization import read_config

    path = Path(path)
    why = shard_problem(read_config(path), sharding, size)
    if why:
        raise _unsplit(sharding, size, f"{path}: {why}")
    lazy, _ = load_model(path, lazy=True, strict=False, trust_remote_code=False)
    inner = getattr(lazy, "model", None)
    if sharding is Sharding.PIPELINE and not hasattr(inner, "pipeline"):
        raise _unsplit(sharding, size, f"{path}: mlx-lm's {getattr(lazy, 'model_type', '?')} model has no "
                                       "pipeline split (model.pipeline(group)); try --distributed tensor")
    if sharding is Sharding.TENSOR and not hasattr(lazy, "shard"):
        raise _unsplit(sharding, size, f"{path}: mlx-lm's {getattr(lazy, 'model_type', '?')} model has no "
                                       "tensor-parallel split (model.shard(group)); try --distributed pipeline")


def load_target(path: Path, rank: Rank):
    """The target's shard on this rank, loaded with mlx-lm's ``sharded_load`` (its model's
    ``shard(group)`` for tensor, ``model.pipeline(group)`` for pipeline). Raises
    DistributedError about the target naming what mlx-lm cannot split."""
    from mlx_lm.utils import sharded_load

    path = Path(path)
    check_split(path, rank.sharding, rank.size)
    staged = _staged(path) if rank.sharding is Sharding.PIPELINE else None
    where = Path(staged.name) if staged else path
    pipeline = rank.group if rank.sharding is Sharding.PIPELINE else None
    tensor = rank.group if rank.sharding is Sharding.TENSOR else None
    try:
        model, _ = sharded_load(str(where), pipeline, tensor, trust_remote_code=False,
                                tokenizer_config={"trust_remote_code": False})
    except (ValueError, OSError) as e:
        raise _unsplit(rank.sharding, rank.size, f"{path}: mlx-lm cannot shard it ({' '.join(str(e).split())})") from None
    finally:
        if staged is not None:
            staged.cleanup()  # the weights are read: the links can go
    return model


# ---- where the drafter runs ---------------------------------------------------------------------

class RankZeroDrafter:
    """A model drafter that runs on rank 0 only. Its proposals reach every rank through one
    all_gather a round, in the same lazy graph as the verify (so drafting and verify still
    overlap, as mlx-lm's loop has them); the other ranks hold no drafter at all."""

    kind = DrafterKind.MODEL

    def __init__(self, inner, group) -> None:
        self.inner = inner  # None on every rank but 0
        self.group = group

    def prefill(self, prompt: mx.array) -> None:
        if self.inner is not None:
            self.inner.prefill(prompt)

    def propose(self, n: int) -> mx.array:
        if n < 1:
            return mx.array([], mx.uint32)
        # a draft model always proposes n tokens, so every rank knows the size without a sync
        mine = self.inner.propose(n) if self.inner is not None else mx.zeros((n,), mx.uint32)
        return mx.distributed.all_gather(mine.astype(mx.uint32), group=self.group)[:n]

    def commit(self, drafted: list[int], accepted: int, next_token: int) -> None:
        if self.inner is not None:
            self.inner.commit(drafted, accepted, next_token)


def drafter_factory(pair, rank: Rank, placement: str) -> Callable[[int], Any] | None:
    """What ``engine.drafters.make_drafter`` builds for this pair in this group: None for a
    replicated drafter (every rank builds its own, as alone)."""
    if placement != RANK0 or pair.kind is not DrafterKind.MODEL:
        return None
    from blockwidth.engine.drafters import ModelDrafter

    def build(width: int):
        inner = ModelDrafter(pair.drafter, width=width) if pair.drafter is not None else None
        return RankZeroDrafter(inner, rank.group)

    return build


# ---- every rank the same session ----------------------------------------------------------------

def _digest(tokens: Sequence[int]) -> bytes:
    return hashlib.sha256(struct.pack(f"<{len(tokens)}I", *tokens)).digest()


def digest(tokens: Sequence[int]) -> str:
    """The sha256 of token ids (little-endian uint32): what the ranks compare after each run."""
    return _digest(tokens).hex()


@dataclass
class Lockstep:
    """Keeps every rank's session the same (``engine.ab.run_session(lockstep=...)``): after each
    run the ranks compare their tokens and take rank 0's timings; ``agree`` gives every rank
    rank 0's answer to a question its own clock would answer (the seconds budget)."""

    rank: Rank
    runs: int = 0
    digests: list[dict] = field(default_factory=list)  # every run (warm-ups too) in the order it ran

    def run(self, run) -> None:
        times = [run.prefill_s, run.decode_s] + [t for r in run.rounds for t in (r.draft_s, r.verify_s, r.sync_s)]
        mine = _digest(run.tokens)
        every = gather_bytes(self.rank.group, mine + struct.pack(f"<{len(times)}d", *times))
        arm = "classic" if run.width is None else f"w{run.width}"
        differ = [i for i, p in enumerate(every) if p[:32] != every[0][:32]]
        if differ:
            raise DistributedError(f"run {self.runs + 1} ({arm}): rank {differ[0]} decoded other tokens "
                                   f"than rank 0 ({len(run.tokens)} tokens here); the ranks must agree")
        if any(len(p) != len(every[0]) for p in every):
            raise DistributedError(f"run {self.runs + 1} ({arm}): the ranks decoded the same tokens in "
                                   "different rounds (their drafters proposed differently)")
        self.runs += 1
        self.digests.append({"arm": arm, "tokens": len(run.tokens), "tokens_sha256": mine.hex()})
        if self.rank.writer:
            return
        theirs = struct.unpack(f"<{len(times)}d", every[0][32:])
        run.prefill_s, run.decode_s = theirs[0], theirs[1]
        it = iter(theirs[2:])
        run.rounds = [dataclasses.replace(r, draft_s=next(it), verify_s=next(it), sync_s=next(it))
                      for r in run.rounds]

    def agree(self, value, kind: type | None = None):
        """Rank 0's ``value`` on every rank: JSON, or None or a member of the str Enum ``kind``
        (a Budget)."""
        raw = value.value if kind is not None and value is not None else value
        theirs = json.loads(broadcast_bytes(self.rank.group, json.dumps(raw).encode()))
        return kind(theirs) if kind is not None and theirs is not None else theirs

    def to_dict(self) -> dict:
        return {"runs_compared": self.runs, "agreed": True, "runs": list(self.digests)}


class CheckedTarget:
    """The target with every forward's input compared across the ranks before it runs (``--agree
    round``): a rank that fed other tokens, or fed them at another cache length, stops the
    session at the first such forward. A host sync and a collective each forward: for tests."""

    def __init__(self, model, group) -> None:
        self.__dict__.update(_model=model, _group=group, forwards=0)

    def __call__(self, inputs, cache=None, **kw):
        offset = getattr(cache[0], "offset", None) if cache else None
        mine = hashlib.sha256(json.dumps([inputs.tolist(), offset]).encode()).digest()
        every = gather_bytes(self._group, mine)
        if any(p != every[0] for p in every):
            bad = next(i for i, p in enumerate(every) if p != every[0])
            raise DistributedError(f"forward {self.forwards + 1}: rank {bad} fed other tokens (or at "
                                   "another cache length) than rank 0")
        self.__dict__["forwards"] += 1
        return self._model(inputs, cache=cache, **kw)

    def __getattr__(self, name):
        return getattr(self.__dict__["_model"], name)


# ---- what a verify round pays the group ---------------------------------------------------------

def _activation_dtype(model) -> Any:
    out = model(mx.array([[1]], mx.uint32))
    mx.eval(out)
    return out.dtype


def _reductions(model) -> list[int]:
    """The output size of every all_sum a tensor-parallel forward makes (one per ShardedToAll
    projection: o_proj and down_proj in each layer of a llama-like model)."""
    from mlx.nn.layers.distributed import QuantizedShardedToAllLinear, ShardedToAllLinear

    return [m.weight.shape[0] for _, m in model.named_modules()
            if isinstance(m, (ShardedToAllLinear, QuantizedShardedToAllLinear))]


@dataclass(frozen=True)
class CommPoint:
    rows: int
    median_ms: float
    min_ms: float
    max_ms: float

    def to_dict(self) -> dict:
        return {"rows": self.rows, "median_ms": round(self.median_ms, 4),
                "min_ms": round(self.min_ms, 4), "max_ms": round(self.max_ms, 4)}


MEASURED = ("the collectives one verify forward makes, run alone at the same sizes, dtype and "
            "order (data-dependent, as in the forward) on the same stream")
NOT_MEASURED = ("how much of them the forward overlaps with compute, and the time a rank waits "
                "for another's compute (a pipeline stage waits for the stages before it): MLX "
                "times no operation inside a graph, so verify minus communication is an estimate")


@dataclass(frozen=True)
class CommCurve:
    """The communication of one verify forward by rows, measured alone."""

    sharding: str
    what: str  # the collectives, in words
    points: tuple[CommPoint, ...]
    repeats: int

    def ms(self, rows: int) -> float | None:
        return next((p.median_ms for p in self.points if p.rows == rows), None)

    def to_dict(self) -> dict:
        return {"sharding": self.sharding, "collectives": self.what, "repeats": self.repeats,
                "points": [p.to_dict() for p in self.points], "measured": MEASURED,
                "not_measured": NOT_MEASURED}


def communication(model, rank: Rank, rows: Sequence[int], hidden: int, *, repeats: int = 7,
                  warmup: int = 2) -> CommCurve:
    """Time, for each row count, the collectives a ``rows``-row forward of ``model`` makes on this
    group, alone: tensor parallel's all_sum per ShardedToAll projection, or the pipeline's
    recv/send between neighbouring stages and its closing all_gather. Every rank must call it
    at the same point (it is collective)."""
    group, r, n = rank.group, rank.rank, rank.size
    dtype = _activation_dtype(model)
    if rank.sharding is Sharding.TENSOR:
        dims = _reductions(model)
        sizes = sorted(set(dims))
        what = (f"{len(dims)} all_sum of [1, rows, {sizes[0] if len(sizes) == 1 else sizes}] "
                f"{str(dtype).removeprefix('mlx.core.')}")

        def once(k: int) -> mx.array:
            h = None
            for d in dims:
                x = mx.zeros((1, k, d), dtype)
                if h is not None:  # each waits for the one before, as layer waits for layer
                    x = x + h[..., :1]
                h = mx.distributed.all_sum(x, group=group)
            return h
    else:
        what = (f"{n - 1} send/recv between stages and 1 all_gather of [1, rows, {hidden}] "
                f"{str(dtype).removeprefix('mlx.core.')}")

        def once(k: int) -> mx.array:
            h = mx.zeros((1, k, hidden), dtype)
            if r < n - 1:
                h = mx.distributed.recv_like(h, r + 1, group=group)
            if r != 0:
                h = mx.distributed.send(h, r - 1, group=group)
            return mx.distributed.all_gather(h, group=group)[:1]

    points = []
    for k in rows:
        times = []
        for i in range(warmup + repeats):
            t0 = time.perf_counter()
            mx.eval(once(k))
            dt = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                times.append(dt)
        points.append(CommPoint(k, statistics.median(times), min(times), max(times)))
    # every rank timed its own; rank 0's figures are the group's (as for the verify)
    theirs = json.loads(broadcast_bytes(group, json.dumps([p.to_dict() for p in points]).encode()))
    points = [CommPoint(p["rows"], p["median_ms"], p["min_ms"], p["max_ms"]) for p in theirs]
    return CommCurve(rank.sharding.value, what, tuple(points), repeats)
