"""Sizes and time budgets of the quick and full suites, per device kind.

The quick suite is what ``fleetscope train --preflight`` runs before step 0: at most
about 30 s per host on GPU, process start-up and NCCL set-up included. The full suite
gives each probe more time and more sizes (the figures are steadier). Sizes that enter
a result's ``variant`` are the same in both modes where possible, so quick and full
results of a host are compared with each other.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final

MODES: Final = ("quick", "full")
KiB, MiB, GiB = 2**10, 2**20, 2**30


@dataclass(frozen=True)
class Plan:
    """What the suite runs and for how long."""

    matmul_dtypes: tuple[str, ...]
    """One matmul probe per dtype."""
    matmul_n: int
    matmul_budget_s: float
    """Seconds per dtype."""
    membw_bytes: int
    """Bytes per array; far above the last-level cache."""
    membw_budget_s: float
    """Seconds per kernel (copy, triad)."""
    numerics_n: int
    numerics_depth: int
    numerics_repeats: int
    collective_sizes: tuple[int, ...]
    """Per-rank buffer sizes of the all-reduce / all-to-all sweep."""
    collective_budget_s: float
    """Seconds per collective op."""
    p2p_bytes: int
    p2p_budget_s: float
    """Seconds for all pairs together."""
    p2p_pattern: str
    """``all`` ordered pairs (full) or a ``ring`` i->i+1 (quick: n pairs, not n(n-1))."""
    group_timeout_s: float
    """Give up on a local process group that has not finished after this long."""
    membw_kernels: tuple[str, ...] = ("copy", "triad")

    def scaled(self, factor: float) -> Plan:
        """The same plan with every time budget multiplied by ``factor``."""
        return replace(
            self,
            matmul_budget_s=self.matmul_budget_s * factor,
            membw_budget_s=self.membw_budget_s * factor,
            collective_budget_s=self.collective_budget_s * factor,
            p2p_budget_s=self.p2p_budget_s * factor,
        )


_GPU_QUICK = Plan(
    matmul_dtypes=("bf16",),
    matmul_n=8192,
    matmul_budget_s=2.0,
    membw_bytes=1 * GiB,
    membw_budget_s=1.0,
    numerics_n=2048,
    numerics_depth=8,
    numerics_repeats=3,
    collective_sizes=(32 * MiB, 256 * MiB),
    collective_budget_s=2.0,
    p2p_bytes=64 * MiB,
    p2p_budget_s=2.0,
    p2p_pattern="ring",
    group_timeout_s=120.0,
)
_GPU_FULL = replace(
    _GPU_QUICK,
    matmul_dtypes=("bf16", "fp16"),
    matmul_budget_s=5.0,
    membw_budget_s=3.0,
    numerics_repeats=10,
    collective_sizes=(1 * MiB, 8 * MiB, 64 * MiB, 256 * MiB, 1 * GiB),
    collective_budget_s=8.0,
    p2p_bytes=256 * MiB,
    p2p_budget_s=15.0,
    p2p_pattern="all",
    group_timeout_s=600.0,
)
_CPU_QUICK = Plan(  # CPU figures only need to be comparable across a CPU fleet
    matmul_dtypes=("fp32",),
    matmul_n=1024,
    matmul_budget_s=0.6,
    membw_bytes=64 * MiB,
    membw_budget_s=0.3,
    numerics_n=256,
    numerics_depth=4,
    numerics_repeats=3,
    collective_sizes=(256 * KiB, 4 * MiB),
    collective_budget_s=0.6,
    p2p_bytes=4 * MiB,
    p2p_budget_s=0.6,
    p2p_pattern="ring",
    group_timeout_s=120.0,
)
_CPU_FULL = replace(
    _CPU_QUICK,
    matmul_budget_s=5.0,
    membw_budget_s=3.0,
    numerics_repeats=10,
    collective_sizes=(64 * KiB, 1 * MiB, 4 * MiB, 16 * MiB),
    collective_budget_s=5.0,
    p2p_bytes=16 * MiB,
    p2p_budget_s=4.0,
    p2p_pattern="all",
    group_timeout_s=600.0,
)


def plan_for(mode: str, cuda: bool) -> Plan:
    """The plan of ``mode`` (``quick`` or ``full``) for GPU (``cuda``) or CPU hosts."""
    if mode not in MODES:
        raise ValueError(f"selfcheck mode {mode!r}; expected one of {MODES}")
    if cuda:
        return _GPU_QUICK if mode == "quick" else _GPU_FULL
    return _CPU_QUICK if mode == "quick" else _CPU_FULL
