"""Dense matmul throughput against the device's nominal peak.

``C = A @ B`` with square ``n x n`` operands, ``2 n^3`` FLOPs per call, through
``torch.mm`` (cuBLAS on GPU, the CPU BLAS on CPU). On GPU bf16/fp16 run on the tensor
cores; on CPU fp32. No hand-written kernel: cuBLAS(Lt) GEMMs at n = 8192 are what
Triton/CUTLASS tutorials benchmark *against*, so a hand kernel could only tie.

The result is also checked: a few rows are recomputed in float64 and must agree
within the dtype's rounding error, so a device that is fast but wrong fails.
"""

from __future__ import annotations

import math
import time
from typing import Final

from fleetscope.kernels.devices import DeviceInfo
from fleetscope.kernels.result import ProbeResult, Progress, quiet
from fleetscope.kernels.timing import time_kernel

DTYPES: Final = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
REL_TOLERANCE: Final = {"bf16": 3e-2, "fp16": 1e-2, "fp32": 1e-3}
"""Largest accepted relative (Frobenius) error of the checked rows per dtype."""
MIN_PEAK_FRACTION: Final = 0.5
"""Below this fraction of a *datasheet* peak the probe fails outright (thermal throttling,
wrong clocks, a broken device). Subtler slowness is left to the fleet-relative score."""


def matmul_flops(n: int) -> float:
    """FLOPs of one ``n x n`` by ``n x n`` matmul (multiply-adds count as two)."""
    return 2.0 * n**3


def matmul_probe(
    dev: DeviceInfo,
    *,
    n: int,
    dtype: str,
    budget_s: float,
    slowdown: float = 1.0,
    progress: Progress = quiet,
) -> ProbeResult:
    """Measure dense matmul TFLOP/s on one device.

    Args:
        dev: the device (``cpu`` or ``cuda:N``) and its peaks.
        n: matrix size.
        dtype: ``bf16``, ``fp16`` or ``fp32``.
        budget_s: seconds to spend timing.
        slowdown: test-only fault injection factor (>= 1).
        progress: progress sink.

    Returns:
        TFLOP/s of the fastest repetition; ``passed`` is False when the check of the
        product fails or the device reaches less than half of a datasheet peak.
    """
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"matmul dtype {dtype!r}; expected one of {sorted(DTYPES)}")
    torch_dtype = getattr(torch, DTYPES[dtype])
    t0 = time.perf_counter()
    progress(f"matmul {dev.device} {dtype} n={n} (budget {budget_s:.1f}s)")
    gen = torch.Generator(device=dev.device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=dev.device, dtype=torch_dtype)
    b = torch.randn(n, n, generator=gen, device=dev.device, dtype=torch_dtype)
    c = torch.empty(n, n, device=dev.device, dtype=torch_dtype)
    timing = time_kernel(lambda: torch.mm(a, b, out=c), dev.device, budget_s, slowdown=slowdown)
    tflops = matmul_flops(n) / timing.best_s / 1e12

    rows = min(8, n)
    ref = a[:rows].double() @ b.double()
    err = float(torch.linalg.norm(c[:rows].double() - ref) / torch.linalg.norm(ref))
    peak = dev.peak(dtype)
    reason = ""
    if not math.isfinite(err) or err > REL_TOLERANCE[dtype]:
        reason = f"wrong product: relative error {err:.3g} > {REL_TOLERANCE[dtype]:g}"
    elif dev.peak_source == "table" and tflops < MIN_PEAK_FRACTION * peak:
        reason = f"{tflops:.1f} TFLOP/s is under {MIN_PEAK_FRACTION:.0%} of the {peak:g} peak"
    result = ProbeResult(
        probe="matmul",
        device=dev.device,
        device_model=dev.model,
        variant=f"{dtype} n={n}",
        value=tflops,
        unit="TFLOP/s",
        peak=peak,
        passed=not reason,
        detail={
            "dtype": dtype,
            "n": n,
            "median_tflops": matmul_flops(n) / timing.median_s / 1e12,
            "reps": len(timing.rep_s),
            "calls_per_rep": timing.calls_per_rep,
            "rel_error": err,
            "peak_source": dev.peak_source,
            **({"reason": reason} if reason else {}),
        },
        duration_s=time.perf_counter() - t0,
    )
    frac = result.peak_fraction
    progress(
        f"matmul {dev.device} {dtype}: {tflops:.2f} TFLOP/s"
        + ("" if math.isnan(frac) else f" = {frac:.1%} of {peak:g}")
        + (f"  FAIL: {reason}" if reason else "")
    )
    return result
