"""Heat-map shaping: bucket sizes, (pp, dp, tp) row labels and the cell matrix."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from fleetscope.topology import Topology


def row_bucket_size(topo: Topology, max_rows: int) -> int:
    """Ranks per heat-map row so that at most ``max_rows`` rows remain.

    Buckets larger than a TP group are rounded up to whole TP groups (and smaller ones
    to a divisor of TP), so a row never mixes a TP group with part of its neighbour.
    """
    n = topo.world_size
    bucket = max(1, math.ceil(n / max(1, max_rows)))
    if bucket == 1:
        return 1
    if bucket >= topo.tp:
        return math.ceil(bucket / topo.tp) * topo.tp
    while topo.tp % bucket:
        bucket += 1
    return bucket


def step_bucket_size(num_steps: int, max_cols: int) -> int:
    return max(1, math.ceil(num_steps / max(1, max_cols)))


def _span(values: list[int], axis: str) -> str:
    lo, hi = min(values), max(values)
    return f"{axis}{lo}" if lo == hi else f"{axis}{lo}-{hi}"


def row_labels(topo: Topology, row_bucket: int) -> tuple[list[str], list[int], list[list[int]]]:
    """Label, pipeline stage and (first, last) display rank of every heat-map row.

    With one rank per row the label is ``r5 pp1 dp0 tp1``; a bucket reads
    ``pp0 dp0-5 tp0-7`` (its coordinate ranges).
    """
    order = topo.display_order()
    labels, stages, spans = [], [], []
    for start in range(0, len(order), row_bucket):
        members = order[start : start + row_bucket]
        coords = [topo.coords(r) for r in members]
        if len(members) == 1:
            labels.append(topo.label(members[0]))
        else:
            labels.append(
                " ".join(
                    (
                        _span([c.pp for c in coords], "pp"),
                        _span([c.dp for c in coords], "dp"),
                        _span([c.tp for c in coords], "tp"),
                    )
                )
            )
        stages.append(coords[0].pp)
        spans.append([members[0], members[-1]])
    return labels, stages, spans


def cell_matrix(
    cells: pd.DataFrame, num_rows: int, num_cols: int
) -> tuple[list[list[float | None]], list[list[int | None]]]:
    """Dense ``z`` (value, ``None`` where empty) and ``rank`` (worst rank) matrices."""
    z: list[list[float | None]] = [[None] * num_cols for _ in range(num_rows)]
    ranks: list[list[int | None]] = [[None] * num_cols for _ in range(num_rows)]
    if cells is not None and not cells.empty:
        rows = cells["row"].to_numpy()
        cols = cells["col"].to_numpy()
        vals = cells["value"].to_numpy(dtype=float)
        worst = cells["worst_rank"].to_numpy()
        for r, c, v, w in zip(rows, cols, vals, worst):
            r, c = int(r), int(c)
            if 0 <= r < num_rows and 0 <= c < num_cols and v == v:
                z[r][c] = round(float(v), 3)
                ranks[r][c] = int(w)
    return z, ranks


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
        "steps": [from_step + i * step_bucket for i in range(num_cols)],
        "row_labels": labels,
        "row_pp": stages,
        "row_ranks": spans,
        "z": z,
        "rank": ranks,
    }
