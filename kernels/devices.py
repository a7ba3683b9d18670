"""Which devices a host has, what they are, and what they should be able to do.

Nominal peaks come from a table of known accelerators (vendor datasheet figures for
*dense* math, i.e. without 2:4 sparsity) or, for CPUs, from the hardware: cores ×
clock × FLOPs per cycle for the widest FMA the CPU advertises. Any figure can be
configured instead through the environment, which wins over both:

* ``FLEETSCOPE_PEAK_TFLOPS`` — dense peak of the matmul dtype in TFLOP/s;
* ``FLEETSCOPE_PEAK_MEM_GBPS`` — nominal memory bandwidth in GB/s (10^9 bytes/s).

The CPU memory bandwidth cannot be read reliably without root (DMI tables), so it
stays unknown (fraction of peak NaN) unless configured.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass
from typing import Any, Final

from fleetscope import env

ENV_PEAK_TFLOPS: Final = env.PEAK_TFLOPS.name
ENV_PEAK_MEM_GBPS: Final = env.PEAK_MEM_GBPS.name


@dataclass(frozen=True)
class GpuSpec:
    """Datasheet figures of one accelerator model (dense, no sparsity)."""

    match: tuple[str, ...]
    """Lower-case substrings that must all occur in ``torch.cuda.get_device_name()``."""
    bf16_tflops: float
    fp16_tflops: float
    fp32_tflops: float
    """Plain FP32 (CUDA cores, not TF32)."""
    mem_gbps: float
    """Nominal device-memory bandwidth, GB/s (10^9 bytes per second)."""


# Most specific patterns first: the first spec whose substrings all match wins.
GPU_SPECS: Final[tuple[GpuSpec, ...]] = (
    GpuSpec(("gh200",), 989.0, 989.0, 67.0, 4000.0),
    GpuSpec(("h200",), 989.0, 989.0, 67.0, 4800.0),
    GpuSpec(("h100", "pcie"), 756.0, 756.0, 51.0, 2000.0),
    GpuSpec(("h100", "nvl"), 835.0, 835.0, 60.0, 3900.0),
    GpuSpec(("h100",), 989.0, 989.0, 67.0, 3350.0),  # SXM5, "NVIDIA H100 80GB HBM3"
    GpuSpec(("h800",), 989.0, 989.0, 67.0, 3350.0),
    GpuSpec(("b200",), 2250.0, 2250.0, 80.0, 8000.0),
    GpuSpec(("a100", "80gb", "pcie"), 312.0, 312.0, 19.5, 1935.0),
    GpuSpec(("a100", "80gb"), 312.0, 312.0, 19.5, 2039.0),
    GpuSpec(("a100",), 312.0, 312.0, 19.5, 1555.0),
    GpuSpec(("a800",), 312.0, 312.0, 19.5, 2039.0),
    GpuSpec(("l40s",), 362.0, 362.0, 91.6, 864.0),
    GpuSpec(("l4",), 121.0, 121.0, 30.3, 300.0),
    GpuSpec(("a10",), 125.0, 125.0, 31.2, 600.0),
    GpuSpec(("v100",), 0.0, 125.0, 15.7, 900.0),  # no bf16 tensor cores
)


@dataclass(frozen=True)
class DeviceInfo:
    """One compute device of this host and its nominal capabilities."""

    device: str
    """torch device string: ``cuda:0`` ... or ``cpu``."""
    model: str
    """Device model, e.g. ``NVIDIA H200`` or the CPU model name."""
    peak_tflops: dict[str, float]
    """Dense peak per dtype name (``bf16``, ``fp16``, ``fp32``); NaN if unknown."""
    peak_source: str
    """Where the peaks came from: ``table``, ``derived``, ``configured`` or ``unknown``."""
    mem_gbps: float
    """Nominal memory bandwidth in GB/s; NaN if unknown."""
    mem_source: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def peak(self, dtype: str) -> float:
        """Nominal dense peak for ``dtype`` in TFLOP/s (NaN when unknown or zero)."""
        v = self.peak_tflops.get(dtype, math.nan)
        return v if v > 0 else math.nan


def gpu_spec(name: str) -> GpuSpec | None:
    """The datasheet entry matching a CUDA device name, or None for an unknown model."""
    low = name.lower()
    for spec in GPU_SPECS:
        if all(s in low for s in spec.match):
            return spec
    return None


def _env_float(name: str) -> float | None:
    """A peak override from the environment (declared in :mod:`fleetscope.env`)."""
    return {v.name: v for v in (env.PEAK_TFLOPS, env.PEAK_MEM_GBPS)}[name].get()


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (falls back to ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _cpu_flags_and_mhz() -> tuple[set[str], float]:
    flags: set[str] = set()
    mhz = math.nan
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("cpu MHz") and math.isnan(mhz):
                    mhz = float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    try:  # the nominal maximum beats the momentary clock when the kernel exposes it
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f:
            mhz = int(f.read().strip()) / 1000.0
    except (OSError, ValueError):
        pass
    return flags, mhz


def cpu_fp32_flops_per_cycle(flags: set[str]) -> int:
    """FP32 FLOPs per core per cycle assuming two FMA pipes of the widest vector unit."""
    if "avx512f" in flags:
        return 64  # 2 pipes x 16 lanes x 2 (multiply + add)
    if "fma" in flags and "avx2" in flags:
        return 32
    if "avx" in flags:
        return 16
    if "asimd" in flags:  # Arm NEON: 2 x 4 lanes x 2 per cycle on most server cores
        return 16
    return 8


def cpu_info(num_threads: int | None = None) -> DeviceInfo:
    """Describe the CPU as a device; the peak uses the threads torch will use.

    Args:
        num_threads: cores the probes run on (default: ``torch.get_num_threads()``).
    """
    if num_threads is None:
        import torch

        num_threads = torch.get_num_threads()
    configured = _env_float(ENV_PEAK_TFLOPS)
    if configured is not None:
        peak, source = configured, "configured"
    else:
        flags, mhz = _cpu_flags_and_mhz()
        if math.isnan(mhz):
            peak, source = math.nan, "unknown"
        else:
            per_cycle = cpu_fp32_flops_per_cycle(flags)
            peak, source = num_threads * mhz * 1e6 * per_cycle / 1e12, "derived"
    mem = _env_float(ENV_PEAK_MEM_GBPS)
    return DeviceInfo(
        device="cpu",
        model=cpu_model(),
        peak_tflops={"fp32": peak},
        peak_source=source,
        mem_gbps=mem if mem is not None else math.nan,
        mem_source="configured" if mem is not None else "unknown",
    )


def cuda_info(index: int) -> DeviceInfo:
    """Describe CUDA device ``index`` from its name and the datasheet table."""
    import torch

    name = torch.cuda.get_device_name(index)
    spec = gpu_spec(name)
    configured = _env_float(ENV_PEAK_TFLOPS)
    if configured is not None:
        peaks = {"bf16": configured, "fp16": configured, "fp32": configured}
        source = "configured"
    elif spec is not None:
        peaks = {"bf16": spec.bf16_tflops, "fp16": spec.fp16_tflops, "fp32": spec.fp32_tflops}
        source = "table"
    else:
        peaks, source = {}, "unknown"
    mem = _env_float(ENV_PEAK_MEM_GBPS)
    if mem is not None:
        mem_gbps, mem_source = mem, "configured"
    elif spec is not None:
        mem_gbps, mem_source = spec.mem_gbps, "table"
    else:
        mem_gbps, mem_source = math.nan, "unknown"
    return DeviceInfo(f"cuda:{index}", name, peaks, source, mem_gbps, mem_source)


def local_devices(device: str | None = None) -> list[DeviceInfo]:
    """The devices to probe: every local CUDA device, else the CPU.

    Args:
        device: restrict to one device (``cpu``, ``cuda`` for all GPUs, or ``cuda:N``).

    Raises:
        ValueError: the requested device does not exist here (the message names it).
    """
    import torch

    has_cuda = torch.cuda.is_available()
    if device in (None, "cuda"):
        if has_cuda:
            return [cuda_info(i) for i in range(torch.cuda.device_count())]
        if device == "cuda":
            raise ValueError("device 'cuda' requested but torch sees no CUDA device")
        return [cpu_info()]
    if device == "cpu":
        return [cpu_info()]
    if device.startswith("cuda:"):
        try:
            index = int(device.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"bad device {device!r}; expected cpu, cuda or cuda:N") from None
        if not has_cuda or not 0 <= index < torch.cuda.device_count():
            raise ValueError(f"device {device!r} does not exist on this host")
        return [cuda_info(index)]
    raise ValueError(f"bad device {device!r}; expected cpu, cuda or cuda:N")


def software_versions() -> dict[str, Any]:
    """Library versions that decide whether two numerics hashes are comparable."""
    import torch

    out: dict[str, Any] = {"torch": torch.__version__}
    if torch.cuda.is_available():
        out["cuda"] = torch.version.cuda
    return out
