"""The device probe: this machine's default MLX device as a ``policy.device.Device``, read
from MLX's ``device_info()`` and, on NVIDIA, pynvml. The one door from the policy's device
value to the hardware (the host gate reads NVML through ``nvml`` too). In a rank of a group
(``engine.distributed``) the probe answers with the group joined, so every record, profile
entry and match made in that process names the group."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Mapping

from blockwidth.policy.device import Backend, Device, Group, sm_of, visible_device
from blockwidth.policy.integers import IntegerError, parse_int

_group: Group | None = None  # the group this process is a rank of (engine.distributed.join)


def join(group: Group | None) -> None:
    """From now on this process runs as a rank of ``group`` (None: alone again)."""
    global _group
    _group = group


def probe() -> Device:
    """This process's device: the default MLX device, with the group it is a rank of, if any."""
    import dataclasses

    dev = probe_alone()
    return dataclasses.replace(dev, group=_group) if _group is not None else dev


def probe_alone() -> Device:
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


def nvml_handle(lib: Any, env: Mapping[str, str] | None = None) -> Any:
    """NVML's handle for the GPU MLX runs on (see ``visible_device``); raises where none."""
    import os

    first = visible_device(os.environ if env is None else env)
    if first is None:
        return lib.nvmlDeviceGetHandleByIndex(0)
    try:
        index = parse_int(first, 0, signed=False)
    except IntegerError:
        index = None
    if index is not None:
        # CUDA orders by speed unless CUDA_DEVICE_ORDER=PCI_BUS_ID; NVML by bus. probe()
        # cross-checks the name with MLX's own when they could differ.
        return lib.nvmlDeviceGetHandleByIndex(index)
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
