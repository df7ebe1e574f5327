"""Host identity for records, and the host gate: what could disturb a timing.

The gate notes other processes on the GPU, GPU utilization, clock throttle
reasons and CPU load; it warns, and can wait for a quieter host.
"""

from __future__ import annotations

import os
import platform
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from importlib import metadata

# MLX environment variables that change kernels or scheduling.
MLX_ENV_PREFIXES = ("MLX_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "OPENBLAS_")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def identity() -> dict:
    from blockwidth.engine.device import probe

    dev = probe()
    return {
        "device": dev.to_dict(),
        "driver": dev.driver,
        "kernel": platform.release(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "mlx": _version("mlx"),
        "mlx_lm": _version("mlx-lm"),
        "blockwidth": _version("blockwidth"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(MLX_ENV_PREFIXES)},
    }


@dataclass
class GateReport:
    cpu_load: float | None  # 1-minute load average per core
    gpu: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    waited_s: float = 0.0

    @property
    def quiet(self) -> bool:
        return not self.warnings

    def to_dict(self) -> dict:
        return asdict(self)


def _gpu_state() -> dict:
    from blockwidth.engine.device import nvml, nvml_handle

    with nvml() as lib:
        if lib is None:
            return {}
        try:
            h = nvml_handle(lib)  # the GPU MLX runs on, not NVML's first
            util = lib.nvmlDeviceGetUtilizationRates(h)
            procs = lib.nvmlDeviceGetComputeRunningProcesses(h)
            others = [p.pid for p in procs if p.pid != os.getpid()]
            try:
                reasons = lib.nvmlDeviceGetCurrentClocksEventReasons(h)
            except Exception:
                reasons = lib.nvmlDeviceGetCurrentClocksThrottleReasons(h)
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
    # Idle and application-clock settings are not disturbances.
    benign = 0x1 | 0x2
    return {"utilization_pct": util.gpu, "other_processes": others,
            "clock_event_reasons": int(reasons), "throttled": bool(int(reasons) & ~benign)}


def check(load_limit: float = 0.5, util_limit: int = 10) -> GateReport:
    load = None
    try:
        load = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        pass
    gpu = _gpu_state()
    warn = []
    if load is not None and load > load_limit:
        # three places: "0.50 per core (over 0.5)" read as not over it (a tryout; it was 0.504)
        warn.append(f"CPU load {load:.3f} per core (over {load_limit})")
    if gpu.get("other_processes"):
        warn.append(f"other processes on the GPU: pids {gpu['other_processes']}")
    if gpu.get("utilization_pct", 0) > util_limit:
        warn.append(f"GPU {gpu['utilization_pct']}% busy before timing")
    if gpu.get("throttled"):
        warn.append(f"GPU clocks held back (reasons 0x{gpu['clock_event_reasons']:x})")
    return GateReport(load, gpu, warn)


def gate(wait_s: float = 0.0, poll_s: float = 2.0, **limits) -> GateReport:
    """Check the host; with ``wait_s`` > 0, wait up to that long for it to be quiet."""
    start = time.monotonic()
    report = check(**limits)
    while report.warnings and time.monotonic() - start < wait_s:
        time.sleep(poll_s)
        report = check(**limits)
    report.waited_s = round(time.monotonic() - start, 2)
    return report


class ClockWatch:
    """The GPU's SM and memory clocks and its clock event reasons, read by an A/B session before
    and after each run (outside the run's clock). On the H200 classic's step moved between runs
    of one process from 2.6 to 5.3 ms, mostly near 2.7 or near 4.4, and the decision rule sets
    each width's slowest run against classic's fastest: these readings say whether the runs met
    different clocks (on 2026-11-30e they did not: 1980 MHz before and after every run, while
    classic's step still moved; ``host_reading`` looks at the host). NVML stays open for the session; without an NVIDIA GPU (or pynvml) every
    reading is None and nothing is recorded."""

    def __init__(self) -> None:
        from blockwidth.engine.device import nvml, nvml_handle

        self._stack = ExitStack()
        self._lib = self._stack.enter_context(nvml())
        self._handle = None
        if self._lib is not None:
            try:
                self._handle = nvml_handle(self._lib)
            except Exception:
                self._handle = None

    def read(self) -> dict | None:
        lib, h = self._lib, self._handle
        if h is None:
            return None
        try:
            try:
                reasons = lib.nvmlDeviceGetCurrentClocksEventReasons(h)
            except Exception:
                reasons = lib.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            return {"sm_mhz": int(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_SM)),
                    "mem_mhz": int(lib.nvmlDeviceGetClockInfo(h, lib.NVML_CLOCK_MEM)),
                    "reasons": int(reasons)}
        except Exception:
            return None

    def close(self) -> None:
        self._stack.close()
        self._handle = None


def host_reading() -> dict:
    """What the host did for this process so far, read by an A/B session before and after each run
    (``host_delta``): the main thread's and the process's CPU time, the context switches, the
    host's stolen time (/proc/stat: a virtual machine's CPUs kept waiting by the hypervisor) and
    the CPU the process last ran on. On the H200 the GPU's clock stayed at 1980 MHz while
    classic's step moved between runs from 2.3 to 3.7 ms; these say whether a slow run's host
    worked longer (more CPU time a token), waited (preempted, stolen) or moved to another CPU."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"wall_s": time.perf_counter(), "thread_cpu_s": time.thread_time(), "process_cpu_s": time.process_time(),
           "voluntary_switches": ru.ru_nvcsw, "involuntary_switches": ru.ru_nivcsw,
           "steal_ticks": None, "cpu": None}
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()  # cpu user nice system idle iowait irq softirq steal ...
        out["steal_ticks"] = int(fields[8]) if fields[0] == "cpu" and len(fields) > 8 else None
        with open("/proc/self/stat") as f:
            out["cpu"] = int(f.read().rsplit(")", 1)[1].split()[36])  # field 39, "processor"
    except (OSError, ValueError, IndexError):
        pass
    return out


def host_delta(before: dict, after: dict) -> dict:
    """The host's share of one run from two ``host_reading``s: seconds of wall clock, of the main
    thread's and the process's CPU, of stolen time over all CPUs (None where /proc/stat is not
    there), the context switches, and the CPU the process ran on at each end."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    steal = (None if before.get("steal_ticks") is None or after.get("steal_ticks") is None
             else round((after["steal_ticks"] - before["steal_ticks"]) / tick, 3))
    return {"wall_s": round(after["wall_s"] - before["wall_s"], 4),
            "thread_cpu_s": round(after["thread_cpu_s"] - before["thread_cpu_s"], 4),
            "process_cpu_s": round(after["process_cpu_s"] - before["process_cpu_s"], 4),
            "steal_s": steal,
            "voluntary_switches": after["voluntary_switches"] - before["voluntary_switches"],
            "involuntary_switches": after["involuntary_switches"] - before["involuntary_switches"],
            "cpu_before": before.get("cpu"), "cpu_after": after.get("cpu")}


def clock_spread(readings: list[dict | None], limit: float = 1.10) -> tuple[int, int] | None:
    """(lowest, highest) SM clock over the readings when the highest is ``limit``x the lowest or
    more, else None (also where nothing was read)."""
    mhz = [r["sm_mhz"] for r in readings if r and r.get("sm_mhz")]
    if not mhz or max(mhz) / min(mhz) < limit - 1e-9:  # 10 % apart counts, float rounding aside
        return None
    return min(mhz), max(mhz)

