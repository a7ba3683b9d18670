"""Heat-map shaping: bucket sizes, (pp, dp, tp) row labels and the cell matrix."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from fleetscope.topology import Topology


def row_bucket_size(topo: Topology, max_rows: int) -> int:
    """Ranks per heat-map row so that at most ``max_rows`` rows remain.

    A bucket never splits a TP group (nor mixes a TP group with part of its
    neighbour) and, where possible, never straddles two pipeline stages: the size is
    the smallest divisor of the stage size (DP x TP) that is a multiple (or divisor)
    of TP and big enough; beyond one stage, a whole number of stages.
    """
    n = topo.world_size
    need = max(1, math.ceil(n / max(1, max_rows)))
    if need == 1:
        return 1
    stage = topo.dp * topo.tp
    if need <= stage:
        for size in range(need, stage + 1):
            if stage % size == 0 and (size % topo.tp == 0 or topo.tp % size == 0):
                return size
    return math.ceil(need / stage) * stage


def step_bucket_size(num_steps: int, max_cols: int) -> int:
    return max(1, math.ceil(num_steps / max(1, max_cols)))


def _span(lo: int, hi: int, axis: str) -> str:
    return f"{axis}{lo}" if lo == hi else f"{axis}{lo}-{hi}"


def display_coords(topo: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(pp, dp, tp, rank) of every display position: ranks sorted by (pp, dp, tp)."""
    pos = np.arange(topo.world_size)
    pp, dp, tp = pos // (topo.dp * topo.tp), (pos // topo.tp) % topo.dp, pos % topo.tp
    stride, strides = 1, {}
    for axis in topo.axes_fastest_first:
        strides[axis] = stride
        stride *= topo.size(axis)
    rank = pp * strides["pp"] + dp * strides["dp"] + tp * strides["tp"]
    return pp, dp, tp, rank


def row_labels(topo: Topology, row_bucket: int) -> tuple[list[str], list[int], list[list[int]]]:
    """Label, pipeline stage and (first, last) display rank of every heat-map row.

    With one rank per row the label is ``r5 pp1 dp0 tp1``; a bucket reads
    ``pp0 dp0-5 tp0-7`` (its coordinate ranges).
    """
    pp, dp, tp, rank = display_coords(topo)
    labels, stages, spans = [], [], []
    for start in range(0, topo.world_size, row_bucket):
        sl = slice(start, min(start + row_bucket, topo.world_size))
        if sl.stop - sl.start == 1:
            labels.append(topo.label(int(rank[start])))
        else:
            labels.append(
                f"{_span(pp[sl].min(), pp[sl].max(), 'pp')} {_span(dp[sl].min(), dp[sl].max(), 'dp')} "
                f"{_span(tp[sl].min(), tp[sl].max(), 'tp')}"
            )
        stages.append(int(pp[start]))
        spans.append([int(rank[start]), int(rank[sl.stop - 1])])
    return labels, stages, spans


def cell_matrix(
    cells: pd.DataFrame | None, num_rows: int, num_cols: int
) -> tuple[list[list[float | None]], list[list[int | None]]]:
    """Dense ``z`` (value, ``None`` where empty) and ``rank`` (worst rank) matrices."""
    z = np.full((num_rows, num_cols), np.nan)
    worst = np.full((num_rows, num_cols), -1, dtype=np.int64)
    if cells is not None and not cells.empty:
        r = cells["row"].to_numpy(dtype=np.int64)
        c = cells["col"].to_numpy(dtype=np.int64)
        ok = (r >= 0) & (r < num_rows) & (c >= 0) & (c < num_cols)
        z[r[ok], c[ok]] = np.round(cells["value"].to_numpy(dtype=float)[ok], 3)
        worst[r[ok], c[ok]] = cells["worst_rank"].to_numpy(dtype=np.int64)[ok]
    empty = np.isnan(z)
    z_obj = z.astype(object)  # Python floats; None (JSON null) where empty
    z_obj[empty] = None
    rank_obj = worst.astype(object)
    rank_obj[empty] = None
    return z_obj.tolist(), rank_obj.tolist()


SCALE_PERCENTILES = (2.0, 98.0)
"""The colour scale spans these percentiles of the cells on the scale: one extreme cell
(a hung step's 30 s, a GC pause) cannot wash every other cell into one colour, and a
slow rank (an eighth of the cells of an 8-rank job) still reaches the top colour."""
OFF_SCALE_STEP = 3.0
"""A step (column) whose median cell is this many times the median column is off the
scale (an in-progress, partial or hung step): drawn apart, its values in the hover."""


def color_scale(z: list[list[float | None]], steps: list[int]) -> dict[str, Any]:
    """Robust colour range of a heat-map: ``zmin``/``zmax`` from :data:`SCALE_PERCENTILES`
    of the cells outside off-scale columns, the steps left off the scale (the last
    column when its median is :data:`OFF_SCALE_STEP` times the typical column's, or any
    column that far out), how many cells lie above the cap and the largest value."""
    m = np.array([[np.nan if v is None else float(v) for v in row] for row in z], dtype=float)
    if m.size == 0 or np.isnan(m).all():
        return {"zmin": None, "zmax": None, "off_scale_steps": [], "num_capped": 0, "max_value": None}
    with np.errstate(all="ignore"):
        col_med = np.nanmedian(np.where(np.isnan(m).all(axis=0, keepdims=True), 0.0, m), axis=0)
    valid = ~np.isnan(m).all(axis=0)
    typical = float(np.median(col_med[valid])) if valid.any() else 0.0
    off = valid & (col_med > OFF_SCALE_STEP * max(typical, 1e-9)) if typical > 0 else np.zeros_like(valid)
    on = m[:, ~off]
    vals = on[~np.isnan(on)]
    if vals.size == 0:
        vals = m[~np.isnan(m)]
    lo, hi = (float(np.percentile(vals, q)) for q in SCALE_PERCENTILES)
    if hi - lo < 1e-9:
        hi = lo + max(abs(lo) * 0.01, 1e-3)
    return {
        "zmin": round(lo, 3), "zmax": round(hi, 3),
        "off_scale_steps": [int(steps[j]) for j in np.flatnonzero(off) if j < len(steps)],
        "num_capped": int((on > hi).sum()),
        "max_value": round(float(np.nanmax(m)), 3),
    }


def heatmap_payload(
    job: str,
    topo: Topology,
    metric: Any,
    agg: str,
    from_step: int,
    to_step: int,
    row_bucket: int,
    step_bucket: int,
    cells: pd.DataFrame,
) -> dict[str, Any]:
    """The JSON body of ``GET /jobs/{job}/heatmap``."""
    labels, stages, spans = row_labels(topo, row_bucket)
    num_cols = max(0, math.ceil((to_step - from_step + 1) / step_bucket))
    z, ranks = cell_matrix(cells, len(labels), num_cols)
    steps = [from_step + i * step_bucket for i in range(num_cols)]
    return {
        "job": job,
        "metric": metric.key,
        "label": metric.label,
        "unit": metric.unit,
        "agg": agg,
        "topology": topo.to_dict(),
        "num_ranks": topo.world_size,
        "from_step": from_step,
        "to_step": to_step,
        "row_bucket": row_bucket,
        "step_bucket": step_bucket,
        "steps": steps,
        "row_labels": labels,
        "row_pp": stages,
        "row_ranks": spans,
        "z": z,
        "rank": ranks,
        "scale": color_scale(z, steps),
    }
