"""Time a kernel within a time budget, on CPU (wall clock) or GPU (CUDA events).

Every probe measures the same way: a warm-up call, a calibration call that decides how
many calls make one repetition (about ``budget / 6``, at most 50 ms), then repetitions
until the budget is spent (at least ``min_reps``). Probes report the fastest
repetition: interference from other processes only ever makes a repetition slower, so
the minimum of many short repetitions is the most repeatable figure of what the device
can do.

``slowdown`` is test-only fault injection: each repetition sleeps for
``(slowdown - 1) x`` its measured time, inside the measurement, so the probe really
takes longer, like a device running slow. It never changes what is computed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_REP_S = 0.05
"""Longest repetition: many short repetitions make the minimum robust to interference."""


def check_slowdown(slowdown: float) -> float:
    """Validate a slowdown factor (>= 1); returns it as a float."""
    try:
        f = float(slowdown)
    except (TypeError, ValueError):
        raise ValueError(f"slowdown {slowdown!r} is not a number") from None
    if not f >= 1.0 or f > 1000:
        raise ValueError(f"slowdown {slowdown!r} must be between 1 and 1000")
    return f


def synchronize(device: str) -> None:
    """Wait for all queued work on ``device`` (no-op on CPU)."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _time_calls(fn: Callable[[], Any], calls: int, device: str) -> float:
    """Seconds taken by ``calls`` back-to-back calls of ``fn`` on ``device``."""
    if device.startswith("cuda"):
        import torch

        with torch.cuda.device(device):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


@dataclass(frozen=True)
class Timing:
    """Per-call seconds of the repetitions of one timed kernel."""

    calls_per_rep: int
    rep_s: tuple[float, ...]
    """Seconds per call, one entry per repetition."""

    @property
    def best_s(self) -> float:
        return min(self.rep_s)

    @property
    def median_s(self) -> float:
        s = sorted(self.rep_s)
        mid = len(s) // 2
        return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def time_kernel(
    fn: Callable[[], Any],
    device: str,
    budget_s: float,
    *,
    slowdown: float = 1.0,
    min_reps: int = 3,
    max_reps: int = 200,
) -> Timing:
    """Time ``fn`` on ``device`` within about ``budget_s`` seconds.

    Args:
        fn: the kernel; it must enqueue the same work on every call.
        device: ``cpu`` or ``cuda:N``.
        budget_s: seconds to spend (the warm-up and at least ``min_reps`` repetitions
            run even if they overrun it).
        slowdown: test-only fault injection factor (see the module docstring).
        min_reps: fewest repetitions.
        max_reps: most repetitions.

    Returns:
        The per-call time of each repetition.
    """
    slowdown = check_slowdown(slowdown)
    deadline = time.perf_counter() + budget_s
    fn()  # warm-up: allocations, kernel selection, caches
    synchronize(device)
    one = max(_time_calls(fn, 1, device), 1e-7)
    target = min(budget_s / 6, MAX_REP_S)
    calls = max(1, int(target / one))
    reps: list[float] = []
    while len(reps) < max_reps and (len(reps) < min_reps or time.perf_counter() < deadline):
        elapsed = _time_calls(fn, calls, device)
        if slowdown > 1.0:
            t0 = time.perf_counter()
            time.sleep(elapsed * (slowdown - 1.0))
            elapsed += time.perf_counter() - t0
        reps.append(elapsed / calls)
        if elapsed > 2 * target * slowdown:  # the calibration call was lucky: shorter reps
            calls = max(1, int(target * slowdown / reps[-1]))
    return Timing(calls, tuple(reps))
