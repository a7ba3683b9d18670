"""Model FLOPs utilisation per step and detection of a sustained decline.

MFU of a step = model FLOPs of the step / (step time x world size x device peak FLOP/s).
Without a known device peak (CPU runs) the same analysis runs on achieved FLOP/s.
A decline is a change point: the split of the window that maximises the difference of
segment medians in units of its standard error (noise from the MAD of the residuals);
it is reported when significant and at least ``min_drop`` large, with the ranks whose
collective launch skew (time peers wait for them) or own work grew most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .findings import Finding, FindingKind, Severity
from .robust import MEDIAN_SE_FACTOR, mad_sigma


@dataclass(frozen=True)
class MfuConfig:
    window_steps: int = 120
    min_segment: int = 6
    """Steps on each side of a change point."""
    z: float = 5.0
    min_drop: float = 0.05
    """Smallest relative decline reported (5%)."""


def mfu_series(
    steps: pd.DataFrame, model_flops_per_step: float, device_peak_flops: float, world_size: int
) -> pd.DataFrame:
    """Per step: job step time (slowest rank), achieved FLOP/s and MFU (NaN if peak unknown)."""
    if steps.empty:
        return pd.DataFrame(columns=["step", "step_s", "flops_per_s", "mfu"])
    per = steps.groupby("step", as_index=False)["duration_ns"].max().sort_values("step")
    step_s = per["duration_ns"].to_numpy(dtype=float) / 1e9
    fps = np.where(step_s > 0, model_flops_per_step / np.maximum(step_s, 1e-12), np.nan)
    peak = device_peak_flops * max(world_size, 1)
    mfu = fps / peak if device_peak_flops > 0 else np.full(len(fps), np.nan)
    return pd.DataFrame({"step": per["step"].to_numpy(), "step_s": step_s, "flops_per_s": fps, "mfu": mfu})


def change_point(y: np.ndarray, min_segment: int) -> tuple[int, float, float]:
    """Best single split ``k`` of ``y``: returns (k, t statistic, relative change after/before)."""
    n = len(y)
    best = (-1, 0.0, 0.0)
    if n < 2 * min_segment:
        return best
    for k in range(min_segment, n - min_segment + 1):
        a, b = np.median(y[:k]), np.median(y[k:])
        resid = np.concatenate([y[:k] - a, y[k:] - b])
        sigma = max(mad_sigma(resid, 0.0), 1e-12 * max(abs(a), 1.0))
        t = abs(a - b) / (MEDIAN_SE_FACTOR * sigma * math.sqrt(1 / k + 1 / (n - k)))
        if t > best[1]:
            best = (k, t, float((b - a) / a) if a else 0.0)
    return best


def _job_wide(busy_growth: pd.Series, num_ranks: int) -> bool:
    """The growth of own work is shared by the ranks: the typical rank grew by at least
    half as much as the rank that grew most (and more than half of the ranks grew)."""
    if num_ranks < 3 or busy_growth.empty or busy_growth.iloc[0] <= 0:
        return False
    return float(busy_growth.median()) >= 0.5 * float(busy_growth.iloc[0])


def detect_mfu_drop(
    job: str, series: pd.DataFrame, breakdown: pd.DataFrame | None = None,
    config: MfuConfig = MfuConfig(),
) -> Finding | None:
    """A sustained decline of MFU (or achieved FLOP/s), attributed to ranks when possible."""
    s = series.dropna(subset=["flops_per_s"]).tail(config.window_steps)
    if len(s) < 2 * config.min_segment:
        return None
    col = "mfu" if s["mfu"].notna().all() else "flops_per_s"
    y = s[col].to_numpy(dtype=float)
    k, t, rel = change_point(y, config.min_segment)
    if k < 0 or t < config.z or rel > -config.min_drop:
        return None
    change_step = int(s["step"].iloc[k])
    evidence = {
        "metric": col,
        "before": float(np.median(y[:k])),
        "after": float(np.median(y[k:])),
        "change_step": change_step,
        "t_statistic": round(t, 2),
    }
    ranks: tuple[int, ...] = ()
    if breakdown is not None and not breakdown.empty:
        b = breakdown[breakdown["step"].isin(s["step"])]
        before = b[b["step"] < change_step].groupby("rank").median(numeric_only=True)
        after = b[b["step"] >= change_step].groupby("rank").median(numeric_only=True)
        delta = (after - before).dropna()
        if not delta.empty:
            skew = delta["wait_caused_ns"].sort_values(ascending=False)
            busy = delta["busy_ns"].sort_values(ascending=False)
            lead = skew if skew.iloc[0] >= busy.iloc[0] else busy
            cause = "collective launch skew" if lead is skew else "own work"
            top = lead[lead > 0.5 * lead.iloc[0]].index[:4] if lead.iloc[0] > 0 else []
            if _job_wide(busy, len(before)):
                # every rank's own work grew alike: nothing singles a rank out (machine load,
                # clocks, a shared filesystem or network); naming four of them would mislead
                cause, top = "all ranks slowed alike", []
                evidence["median_busy_growth_ms"] = round(float(busy.median()) / 1e6, 3)
            ranks = tuple(int(r) for r in top)
            evidence["attribution"] = cause
            evidence["growth_ms_per_step"] = {str(r): round(float(lead[r]) / 1e6, 3) for r in top}
    return Finding(
        kind=FindingKind.MFU_DROP, job=job, ranks=ranks, score=round(t / config.z, 3),
        severity=Severity.WARNING, first_step=change_step, last_step=int(s["step"].iloc[-1]),
        est_slowdown=round(max(-rel, 0.0) / max(1 + rel, 1e-9), 4),
        summary=f"{col} fell {-rel:.0%} from step {change_step}"
        + (f"; grew most on rank(s) {list(ranks)} ({evidence.get('attribution')})" if ranks
           else f"; {evidence['attribution']}" if "attribution" in evidence else ""),
        evidence=evidence,
    )
