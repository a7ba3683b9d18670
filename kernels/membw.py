"""Memory bandwidth: STREAM-style copy and triad on device memory (HBM) or RAM.

* ``copy``:  ``b[:] = a``          — moves ``2 x nbytes`` (one read, one write);
* ``triad``: ``a[:] = b + s * c``  — moves ``3 x nbytes`` (two reads, one write).

``nbytes`` is the size of one float32 array; it must be far larger than the last-level
cache (H200: 50 MB L2; CPUs: tens of MB of L3) or the probe measures the cache. GB/s
are 10^9 bytes per second, as on datasheets. Both kernels are one torch call each
(``Tensor.copy_`` and ``torch.add(..., alpha=s, out=...)``): torch's vectorised
elementwise kernels already stream at close to the memory's limit, so there is no
hand-written kernel.
"""

from __future__ import annotations

import math
import time
from typing import Final

from fleetscope.kernels.devices import DeviceInfo
from fleetscope.kernels.result import ProbeResult, Progress, human_bytes, quiet
from fleetscope.kernels.timing import time_kernel

KERNELS: Final = {"copy": 2, "triad": 3}
"""Kernel name -> arrays moved per element (bytes moved = factor x nbytes)."""
MIN_PEAK_FRACTION: Final = 0.5
"""Below this fraction of a *datasheet* bandwidth the probe fails outright."""
TRIAD_SCALAR: Final = 3.0


def membw_probe(
    dev: DeviceInfo,
    *,
    kernel: str,
    nbytes: int,
    budget_s: float,
    slowdown: float = 1.0,
    progress: Progress = quiet,
) -> ProbeResult:
    """Measure the memory bandwidth of one device with one STREAM kernel.

    Args:
        dev: the device and its nominal bandwidth.
        kernel: ``copy`` or ``triad``.
        nbytes: bytes per array (rounded down to whole float32 elements).
        budget_s: seconds to spend timing.
        slowdown: test-only fault injection factor (>= 1).
        progress: progress sink.

    Returns:
        GB/s of the fastest repetition; ``passed`` is False if the kernel computed a
        wrong value or the device reaches less than half of a datasheet bandwidth.
    """
    import torch

    if kernel not in KERNELS:
        raise ValueError(f"membw kernel {kernel!r}; expected one of {sorted(KERNELS)}")
    numel = max(1, nbytes // 4)
    nbytes = numel * 4
    t0 = time.perf_counter()
    progress(f"membw {dev.device} {kernel} {human_bytes(nbytes)}/array (budget {budget_s:.1f}s)")
    a = torch.full((numel,), 1.0, device=dev.device)
    b = torch.full((numel,), 2.0, device=dev.device)
    c = torch.full((numel,), 0.5, device=dev.device)
    if kernel == "copy":

        def fn() -> None:
            b.copy_(a)

        expected = 1.0
        out = b
    else:

        def fn() -> None:
            torch.add(b, c, alpha=TRIAD_SCALAR, out=a)

        expected = 2.0 + TRIAD_SCALAR * 0.5
        out = a
    timing = time_kernel(fn, dev.device, budget_s, slowdown=slowdown)
    moved = KERNELS[kernel] * nbytes
    gbps = moved / timing.best_s / 1e9

    # Sample the output: every element of a stride, plus the last one.
    stride = max(1, numel // 4096)
    sample = torch.cat([out[::stride], out[-1:]])
    bad = int((sample != expected).sum())
    reason = ""
    if bad:
        reason = f"{bad} sampled element(s) differ from {expected}"
    elif dev.mem_source == "table" and gbps < MIN_PEAK_FRACTION * dev.mem_gbps:
        reason = f"{gbps:.0f} GB/s is under {MIN_PEAK_FRACTION:.0%} of the {dev.mem_gbps:g} nominal"
    result = ProbeResult(
        probe="membw",
        device=dev.device,
        device_model=dev.model,
        variant=f"{kernel} {human_bytes(nbytes)}",
        value=gbps,
        unit="GB/s",
        peak=dev.mem_gbps,
        passed=not reason,
        detail={
            "kernel": kernel,
            "nbytes": nbytes,
            "bytes_moved_per_call": moved,
            "median_gbps": moved / timing.median_s / 1e9,
            "reps": len(timing.rep_s),
            "calls_per_rep": timing.calls_per_rep,
            "peak_source": dev.mem_source,
            **({"reason": reason} if reason else {}),
        },
        duration_s=time.perf_counter() - t0,
    )
    frac = result.peak_fraction
    progress(
        f"membw {dev.device} {kernel}: {gbps:.1f} GB/s"
        + ("" if math.isnan(frac) else f" = {frac:.1%} of {dev.mem_gbps:g}")
        + (f"  FAIL: {reason}" if reason else "")
    )
    return result
