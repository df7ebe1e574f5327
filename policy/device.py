"""The device a width is resolved for: a value type and the parsers of its names.

Pure: a ``Device`` is read off this machine by ``engine.device.probe`` (MLX's
``device_info()`` and, on NVIDIA, pynvml) or named by ``parse_device_spec``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Mapping

from policy.errors import BlockwidthError


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

    def describe(self) -> str:
        """``cuda sm_90 (NVIDIA H200)``, ``cpu``, ``metal (Apple M3 Max)``."""
        head = self.backend.value
        if self.backend is Backend.CUDA and self.architecture:
            head += f" {self.architecture}"
        if self.name:
            head += f" ({self.name})"
        return head

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["backend"] = self.backend.value
        return d


def mismatch(device: Device, backend: Backend, compute_capability: str | None = None,
             name: str | None = None) -> str | None:
    """Why ``device`` is not the one these keys describe (a key left None matches any), or None:
    the one device matcher (profile entries, built-in table rows, --device against the probe).
    Names compare case-blind, and a device without a name (named by --device) is not told apart
    by name."""
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
    """``cuda:9.0``, ``cuda:12.1``, ``metal``, ``cpu`` -> a Device not read off hardware."""
    m = _SPEC.match(spec.strip().lower())
    shown = repr(spec) if len(spec) <= 40 else repr(spec[:37] + "...")
    if not m and _CC_LIKE.match(spec.strip().lower()):
        raise DeviceSpecError(f"{shown}: a compute capability has at most 3 digits a part "
                              f"(e.g. cuda:9.0, cuda:12.1)", "device")
    if not m:
        raise DeviceSpecError(
            f"{shown}: expected cuda:MAJOR.MINOR in ASCII digits (e.g. cuda:9.0, cuda:12.1), "
            f"metal or cpu", "device")
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
