"""The device a width is resolved for: a value type, a spec parser and the probe.

Pure code takes a ``Device``; only ``probe()`` touches hardware (MLX's
``device_info()`` and, on NVIDIA, pynvml).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Iterator, Mapping


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


# [0-9], not \d: \d also matches Arabic-Indic and other digits, which int() reads as numbers
# (the README promises ASCII digits); a compute capability has one or two digits a part.
_SPEC = re.compile(r"^(cuda|metal|cpu|gpu)(?::([0-9]{1,3})\.([0-9]{1,3}))?$")
_CC_LIKE = re.compile(r"^(cuda|gpu):[0-9]+\.[0-9]+$")


class DeviceSpecError(ValueError):
    pass


def sm_of(cc: str) -> str:
    major, minor = cc.split(".")
    return f"sm_{major}{minor}"


def parse_device_spec(spec: str) -> Device:
    """``cuda:9.0``, ``cuda:12.1``, ``metal``, ``cpu`` -> a Device not read off hardware."""
    m = _SPEC.match(spec.strip().lower())
    shown = repr(spec) if len(spec) <= 40 else repr(spec[:37] + "...")
    if not m and _CC_LIKE.match(spec.strip().lower()):
        raise DeviceSpecError(f"--device {shown}: a compute capability has at most 3 digits a part "
                              f"(e.g. cuda:9.0, cuda:12.1)")
    if not m:
        raise DeviceSpecError(
            f"--device {shown}: expected cuda:MAJOR.MINOR in ASCII digits (e.g. cuda:9.0, cuda:12.1), "
            f"metal or cpu")
    kind, major, minor = m.groups()
    if kind in ("cuda", "gpu"):
        if major is None:
            raise DeviceSpecError(
                f"--device {shown}: a CUDA device needs its compute capability, e.g. cuda:9.0")
        cc = f"{int(major)}.{int(minor)}"
        return Device(Backend.CUDA, name="", architecture=sm_of(cc), compute_capability=cc)
    if major is not None:
        raise DeviceSpecError(f"--device {shown}: only cuda takes a compute capability")
    return Device(Backend(kind))


def probe() -> Device:
    """Read this machine's default MLX device. Never raises for missing NVIDIA parts."""
    import mlx.core as mx

    info: dict[str, Any] = {}
    try:
        info = dict(mx.device_info())
    except Exception:  # an MLX without device_info, or no GPU
        info = {}
    dev = mx.default_device()
    if dev.type == mx.cpu:
        import platform

        return Device(Backend.CPU, name=platform.processor() or platform.machine(),
                      mlx_version=mx.__version__, probed=True,
                      memory_bytes=_int(info.get("memory_size")))
    if hasattr(mx, "cuda") and mx.cuda.is_available():
        major = info.get("compute_capability_major")
        minor = info.get("compute_capability_minor")
        cc = f"{major}.{minor}" if major is not None and minor is not None else None
        name, driver = _nvml(str(info.get("device_name", "")))
        return Device(Backend.CUDA, name=name, architecture=info.get("architecture") or (sm_of(cc) if cc else None),
                      compute_capability=cc, memory_bytes=_int(info.get("total_memory")),
                      driver=driver, mlx_version=mx.__version__, probed=True)
    return Device(Backend.METAL, name=str(info.get("device_name", "")),
                  architecture=info.get("architecture"),
                  memory_bytes=_int(info.get("memory_size")),
                  mlx_version=mx.__version__, probed=True)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """pynvml, initialised for the block and shut down after; None where there is no NVIDIA
    driver or no pynvml. The one door to NVML for the probe and the host gate."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the pynvml shim's deprecation notice
            import pynvml

        pynvml.nvmlInit()
    except Exception:
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


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


def nvml_handle(lib: Any, env: Mapping[str, str] | None = None) -> Any:
    """NVML's handle for the GPU MLX runs on (see ``visible_device``); raises where none."""
    import os

    first = visible_device(os.environ if env is None else env)
    if first is None:
        return lib.nvmlDeviceGetHandleByIndex(0)
    if first.isascii() and first.isdigit() and len(first) <= 6:
        # CUDA orders by speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML by bus. probe()
        # cross-checks the name with MLX's own when they could differ.
        return lib.nvmlDeviceGetHandleByIndex(int(first))
    if first.upper().startswith(("GPU-", "MIG-")):
        return lib.nvmlDeviceGetHandleByUUID(first)
    raise LookupError(f"CUDA_VISIBLE_DEVICES={first!r} names no GPU NVML can find")


def _nvml(fallback_name: str) -> tuple[str, str | None]:
    with nvml() as lib:
        if lib is None:
            return fallback_name, None
        try:
            h = nvml_handle(lib)
            name = lib.nvmlDeviceGetName(h)
            driver = lib.nvmlSystemGetDriverVersion()
        except Exception:
            return fallback_name, None
        name = name.decode() if isinstance(name, bytes) else name
        driver = driver.decode() if isinstance(driver, bytes) else driver
        if fallback_name and name and fallback_name.lower() not in name.lower() \
                and name.lower() not in fallback_name.lower():
            # NVML picked another GPU than MLX runs on (device order differs): trust MLX's name.
            return fallback_name, driver
        return name or fallback_name, driver
