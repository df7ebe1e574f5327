"""The device a width is resolved for: a value type and the parsers of its names.

Pure: a ``Device`` is read off this machine by ``engine.device.probe`` (MLX's
``device_info()`` and, on NVIDIA, pynvml) or named by ``parse_device_spec``. A process that is
one rank of a group (a target sharded with MLX's distributed layer) runs on a ``Device`` that
carries its ``Group``: the backend, the sharding and every member's device, so that a width
measured on two GPUs over NCCL never matches one GPU, nor one GPU's width the group.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Mapping

from blockwidth.policy.errors import BlockwidthError


class Backend(str, Enum):
    CUDA = "cuda"
    METAL = "metal"
    CPU = "cpu"


@dataclass(frozen=True)
class Device:
    backend: Backend
    name: str = ""
    architecture: str | None = None  # e.g. sm_90
    compute_capability: str | None = None  # "9.0", "12.1"
    memory_bytes: int | None = None
    driver: str | None = None
    mlx_version: str | None = None
    probed: bool = False  # False: named by --device, not read off this machine
    group: "Group | None" = None  # this device is one rank of a group (None: a single device)

    def describe(self) -> str:
        """``cuda sm_90 (NVIDIA H200)``, ``cpu``, ``metal (Apple M3 Max)``; a rank of a group
        as its group: ``2 ranks over nccl, tensor-sharded: cuda sm_90 (NVIDIA H200) x2``."""
        if self.group is not None:
            return self.group.describe()
        return self.alone()

    def alone(self) -> str:
        """This device itself, group or not."""
        head = self.backend.value
        if self.backend is Backend.CUDA and self.architecture:
            head += f" {self.architecture}"
        if self.name:
            head += f" ({self.name})"
        return head

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["backend"] = self.backend.value
        if self.group is None:
            d.pop("group")  # a single device's dict reads as it did before groups existed
        else:
            d["group"] = self.group.to_dict()
        return d


class Sharding(str, Enum):
    """How mlx-lm splits a target over a group: ``shard(group)`` (tensor parallel: every rank
    holds a slice of every layer, an all-reduce per layer) or ``pipeline(group)`` (every rank
    holds whole layers, the hidden state passes rank to rank)."""

    TENSOR = "tensor"
    PIPELINE = "pipeline"


# MLX's distributed backends (mx.distributed.init(backend=...)).
GROUP_BACKENDS = ("ring", "nccl", "mpi", "jaccl")


@dataclass(frozen=True)
class Member:
    """One rank's device as a group key compares it: backend, compute capability, name."""

    backend: Backend
    compute_capability: str | None = None
    name: str | None = None

    @classmethod
    def of(cls, device: Device) -> "Member":
        return cls(device.backend, device.compute_capability, device.name or None)

    def describe(self) -> str:
        head = self.backend.value
        if self.compute_capability:
            head += f" {sm_of(self.compute_capability)}"
        return head + (f" ({self.name})" if self.name else "")

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.backend.value}
        if self.compute_capability:
            d["compute_capability"] = self.compute_capability
        if self.name:
            d["device_name"] = self.name
        return d

    def mismatch(self, other: "Member") -> str | None:
        """Why ``other`` is not this member (a key this one leaves None matches any)."""
        return mismatch(Device(other.backend, other.name or "", compute_capability=other.compute_capability),
                        self.backend, self.compute_capability, self.name)


@dataclass(frozen=True)
class Group:
    """A group of ranks one sharded target runs on: MLX's backend, the sharding, and each
    member's device in rank order (``members`` empty: any devices, for an entry that names none)."""

    backend: str
    sharding: Sharding
    size: int
    members: tuple[Member, ...] = ()

    def describe(self) -> str:
        head = f"{self.size} ranks over {self.backend}, {self.sharding.value}-sharded"
        if not self.members:
            return head
        names = [m.describe() for m in self.members]
        if len(set(names)) == 1:
            return f"{head}: {names[0]} x{len(names)}"
        return f"{head}: {', '.join(names)}"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"backend": self.backend, "sharding": self.sharding.value, "size": self.size}
        if self.members:
            d["members"] = [m.to_dict() for m in self.members]
        return d

    def key(self, *, case_blind: bool = False) -> tuple:
        """What a profile slot holds of it: two entries with one key are for one group."""
        return (self.backend, self.sharding.value, self.size,
                tuple((m.backend.value, m.compute_capability,
                       m.name.lower() if case_blind and m.name else m.name) for m in self.members))

    def mismatch(self, here: "Group") -> str | None:
        """Why ``here`` (the group this process runs in) is not this one, or None."""
        if self.backend != here.backend or self.sharding is not here.sharding or self.size != here.size:
            return f"for {self.describe()}; this is {here.describe()}"
        if self.members:
            if len(here.members) != len(self.members):
                return f"for {self.describe()}; this is {here.describe()}"
            for rank, (want, got) in enumerate(zip(self.members, here.members)):
                why = want.mismatch(got)
                if why:
                    return f"for {self.describe()}; rank {rank} here: {why}"
        return None


class GroupSpecError(BlockwidthError, ValueError):
    """A group table or a group spec (``nccl:2:tensor``) that is wrong: the message names it."""


def group_from_dict(d: Mapping[str, Any]) -> Group:
    """A group as a record or a profile entry writes it (``Group.to_dict``); raises
    GroupSpecError naming the first key that is wrong."""
    problems = group_problems(d)
    if problems:
        raise GroupSpecError(problems[0])
    members = tuple(Member(Backend(m["backend"]), m.get("compute_capability"), m.get("device_name"))
                    for m in d.get("members") or ())
    return Group(d["backend"], Sharding(d["sharding"]), d["size"], members)


def group_problems(d: Any) -> list[str]:
    """Every problem with a group table, worded for a profile line (``group.size = 0: ...``)."""
    if not isinstance(d, Mapping):
        return ["group must be a table {backend, sharding, size, members}"]
    out = []
    extra = set(d) - {"backend", "sharding", "size", "members"}
    if extra:
        out.append(f"group has unknown keys {sorted(extra)!r:.160} (expected backend, sharding, size, members)")
    if d.get("backend") not in GROUP_BACKENDS:
        out.append(f"group.backend = {d.get('backend')!r:.60}: expected one of {', '.join(GROUP_BACKENDS)}")
    if d.get("sharding") not in {s.value for s in Sharding}:
        out.append(f"group.sharding = {d.get('sharding')!r:.60}: expected tensor or pipeline")
    size = d.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or not 2 <= size <= 4096:
        out.append(f"group.size = {size!r:.60}: expected an integer 2..4096 (ranks)")
        size = None
    members = d.get("members", [])
    if not isinstance(members, list):
        out.append("group.members must be a list of tables {backend, compute_capability, device_name}")
        return out
    if members and size is not None and len(members) != size:
        out.append(f"group.members lists {len(members)} devices for group.size = {size}")
    for i, m in enumerate(members):
        where = f"group.members[{i}]"
        if not isinstance(m, Mapping):
            out.append(f"{where} must be a table {{backend, compute_capability, device_name}}")
            continue
        if set(m) - {"backend", "compute_capability", "device_name"}:
            out.append(f"{where} has unknown keys (expected backend, compute_capability, device_name)")
        if m.get("backend") not in {b.value for b in Backend}:
            out.append(f"{where}.backend = {m.get('backend')!r:.60}: expected one of cuda, metal, cpu")
        cc = m.get("compute_capability")
        if cc is not None and not (isinstance(cc, str) and re.fullmatch(r"\d+\.\d+", cc)):
            out.append(f"{where}.compute_capability = {cc!r:.60}: expected a string like \"9.0\"")
        name = m.get("device_name")
        if name is not None and not isinstance(name, str):
            out.append(f"{where}.device_name = {name!r:.60}: expected a string")
    return out


def group_of(device: Device, backend: str, sharding: Sharding | str, size: int) -> Group:
    """A group named, not probed: ``size`` ranks of ``device`` (``--group``)."""
    return Group(backend, Sharding(sharding), size, (Member.of(device),) * size)


_GROUP_SPEC = re.compile(r"^(ring|nccl|mpi|jaccl):(\d+):(tensor|pipeline)$")


def parse_group_spec(spec: str, device: Device) -> Device:
    """``nccl:2:tensor`` -> ``device`` as one rank of 2 over nccl, tensor-sharded, every member
    ``device`` (a group named to resolve or check for, not one this process runs in: the part
    of ``--device`` after ``@``)."""
    m = _GROUP_SPEC.match(spec.strip().lower())
    if not m:
        raise GroupSpecError(f"group {spec!r}: expected BACKEND:RANKS:SHARDING, e.g. nccl:2:tensor "
                             f"(backend {', '.join(GROUP_BACKENDS)}; sharding tensor or pipeline)")
    backend, size, sharding = m.group(1), int(m.group(2)), m.group(3)
    if not 2 <= size <= 4096:
        raise GroupSpecError(f"group {spec!r}: a group has 2..4096 ranks")
    import dataclasses

    return dataclasses.replace(device, group=group_of(device, backend, sharding, size))


def mismatch(device: Device, backend: Backend, compute_capability: str | None = None,
             name: str | None = None, group: Group | None = None) -> str | None:
    """Why ``device`` is not the one these keys describe (a key left None matches any), or None:
    the one device matcher (profile entries, built-in table rows, --device against the probe).
    Names compare case-blind, and a device without a name (named by --device) is not told apart
    by name. ``group`` is the one key None does not leave open: None is a single device, so a
    group's width never applies to one device, nor one device's to a group (the communication
    every verify round pays is part of what was measured)."""
    if group is None and device.group is not None:
        return f"for a single device; this is {device.group.describe()}"
    if group is not None:
        if device.group is None:
            return f"for {group.describe()}; this is a single device, {device.alone()}"
        why = group.mismatch(device.group)
        if why:
            return why
    if backend is not device.backend:
        return f"for {backend.value}; this device is {device.describe()}"
    if compute_capability and compute_capability != device.compute_capability:
        return (f"for compute capability {compute_capability}; this device has "
                f"{device.compute_capability or 'none known'}")
    if name and device.name and name.lower() != device.name.lower():
        return f"for device {name!r}; this device is {device.name!r}"
    return None


# [0-9], not \d: \d also matches Arabic-Indic and other digits, which int() reads as numbers
# (the README promises ASCII digits); a compute capability has one or two digits a part.
_SPEC = re.compile(r"^(cuda|metal|cpu|gpu)(?::([0-9]{1,3})\.([0-9]{1,3}))?$")
_CC_LIKE = re.compile(r"^(cuda|gpu):[0-9]+\.[0-9]+$")


class DeviceSpecError(BlockwidthError, ValueError):
    """A --device that names no device this tool knows."""


def sm_of(cc: str) -> str:
    major, minor = cc.split(".")
    return f"sm_{major}{minor}"


def parse_device_spec(spec: str) -> Device:
    """``cuda:9.0``, ``cuda:12.1``, ``metal``, ``cpu`` -> a Device not read off hardware;
    ``cuda:9.0@nccl:2:tensor`` -> that device as a rank of a group of 2 such (``parse_group_spec``)."""
    if "@" in spec:
        head, _, group = spec.partition("@")
        try:
            return parse_group_spec(group, parse_device_spec(head))
        except GroupSpecError as e:
            raise DeviceSpecError(f"{spec!r}: after @ {str(e).split(': ', 1)[1]}", "device") from None
    m = _SPEC.match(spec.strip().lower())
    shown = repr(spec) if len(spec) <= 40 else repr(spec[:37] + "...")
    if not m and _CC_LIKE.match(spec.strip().lower()):
        raise DeviceSpecError(f"{shown}: a compute capability has at most 3 digits a part "
                              f"(e.g. cuda:9.0, cuda:12.1)", "device")
    if not m:
        raise DeviceSpecError(
            f"{shown}: expected cuda:MAJOR.MINOR in ASCII digits (e.g. cuda:9.0, cuda:12.1), "
            f"metal or cpu, and for a group @BACKEND:RANKS:SHARDING (cuda:9.0@nccl:2:tensor)", "device")
    kind, major, minor = m.groups()
    if kind in ("cuda", "gpu"):
        if major is None:
            raise DeviceSpecError(
                f"{shown}: a CUDA device needs its compute capability, e.g. cuda:9.0", "device")
        cc = f"{int(major)}.{int(minor)}"
        return Device(Backend.CUDA, name="", architecture=sm_of(cc), compute_capability=cc)
    if major is not None:
        raise DeviceSpecError(f"{shown}: only cuda takes a compute capability", "device")
    return Device(Backend(kind))


def visible_device(env: Mapping[str, str]) -> str | None:
    """The NVML selector of the GPU that CUDA (and so MLX) calls device 0.

    NVML numbers every GPU on the host and ignores CUDA_VISIBLE_DEVICES: with
    ``CUDA_VISIBLE_DEVICES=3`` the device MLX runs on is NVML's index 3 (or a
    ``GPU-``/``MIG-`` UUID when the variable names one). ``None``: unset, so index 0.
    An empty value hides every GPU: ``""``.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return raw.split(",")[0].strip()


# ---- a rank's launch environment ---------------------------------------------------------------

# What launchers set for each process of a group (mlx.launch: MLX_RANK, MLX_WORLD_SIZE; Open MPI
# and PMI their own), read as numbers here, where they enter: MLX_RANK=abc was a ValueError
# traceback.
RANK_VARIABLES = ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
SIZE_VARIABLES = ("MLX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
MAX_RANKS = 4096  # far above any group this tool shards a target over


class LaunchError(BlockwidthError):
    """A launcher's variable that does not say a rank: one line naming it."""


def launch_rank(env: Mapping[str, str]) -> int:
    """This process's rank as the first of RANK_VARIABLES set says it (0 where none is), checked
    against the world size where one is set; LaunchError naming the variable otherwise."""
    from blockwidth.policy.integers import IntegerError, parse_int

    def read(names: tuple[str, ...], lo: int, hi: int) -> tuple[str, int] | None:
        name = next((n for n in names if env.get(n, "").strip()), None)
        if name is None:
            return None
        try:
            return name, parse_int(env[name], lo, hi, signed=False)
        except IntegerError as e:
            raise LaunchError(f"{name}={e.shown}: expected a whole number {lo}..{hi} (set by the "
                              f"launcher: run under mlx.launch, or give --ranks N)") from None

    size = read(SIZE_VARIABLES, 1, MAX_RANKS)
    rank = read(RANK_VARIABLES, 0, MAX_RANKS - 1)
    if rank is None:
        return 0
    if size is not None and rank[1] >= size[1]:
        raise LaunchError(f"{rank[0]}={rank[1]}: not a rank of a group of {size[1]} ({size[0]}={size[1]})")
    return rank[1]
