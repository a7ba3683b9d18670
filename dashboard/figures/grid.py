"""The 3D topology grid as small multiples: one DP x TP panel per pipeline stage.

Each cell is a rank (or a bucket of adjacent DP replicas for very large jobs) coloured
by its straggler score; ranks in a non-ok state get a state marker and culprit ranks a
ring, so "which stage, which replica, which TP slot" is read off at a glance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from fleetscope.dashboard import palette
from fleetscope.dashboard.figures.common import base_layout, message_figure
from plotly.subplots import make_subplots

from fleetscope.topology import Topology

STATE_SYMBOLS = {"slow": "diamond", "stuck": "x", "hung": "x", "dead": "square", "missing": "circle-open"}
MAX_PANEL_COLS = 4


def build_grid(
    data: dict[str, Any], culprits: Sequence[int] = (), height: int | None = None
) -> go.Figure | dict[str, Any]:
    """Small-multiples figure of the ``/grid`` payload.

    Args:
        data: payload with ``topology`` and columnar ``cells`` (``pp``, ``dp``, ``tp``,
            ``rank``, ``score``, ``state``) plus ``dp_bucket`` and ``score_label``.
        culprits: ranks to ring (merged with ``data["culprits"]``).
        height: pixel height; derived from the number of panel rows when omitted.
    """
    cells = data.get("cells") or {}
    if not cells.get("rank"):
        return message_figure("No per-rank data for this job yet", height=height or 260)
    topo = data["topology"]
    pp, tp = int(topo["pp"]), int(topo["tp"])
    dp_bucket = max(1, int(data.get("dp_bucket", 1)))
    n_dp = math.ceil(int(topo["dp"]) / dp_bucket)
    n_cols = min(pp, MAX_PANEL_COLS)
    n_rows = math.ceil(pp / n_cols)
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=[f"pipeline stage pp{s}" if pp <= 2 else f"pp{s}" for s in range(pp)],
        horizontal_spacing=0.06 if n_cols > 1 else 0.0,
        vertical_spacing=0.16 if n_rows > 1 else 0.0,
    )
    scores = [s for s in cells["score"] if s is not None]
    cmin = min(scores) if scores else 0.0
    cmax = max(scores) if scores else 1.0
    if cmax - cmin < 1e-9:
        cmax = cmin + 1.0
    by_stage: dict[int, list[int]] = {s: [] for s in range(pp)}
    for i, s in enumerate(cells["pp"]):
        by_stage[int(s)].append(i)
    wanted = set(int(r) for r in culprits) | set(int(r) for r in data.get("culprits") or [])
    label = data.get("score_label", "straggler score")
    arrays: list[tuple[int, list, list, list]] = []
    for stage in range(pp):
        row, col = stage // n_cols + 1, stage % n_cols + 1
        z = [[None] * n_dp for _ in range(tp)]
        text = [[""] * n_dp for _ in range(tp)]
        ranks = [[None] * n_dp for _ in range(tp)]
        for i in by_stage[stage]:
            d, t = int(cells["dp"][i]), int(cells["tp"][i])
            z[t][d] = cells["score"][i]
            ranks[t][d] = cells["rank"][i]
            rng = f"dp{d * dp_bucket}-{d * dp_bucket + dp_bucket - 1}" if dp_bucket > 1 else f"dp{d}"
            text[t][d] = f"rank {cells['rank'][i]} · pp{stage} {rng} tp{t} · {cells['state'][i]}"
        arrays.append((len(fig.data), z, text, ranks))
        fig.add_trace(
            go.Heatmap(
                z=[[0]],
                text=[[""]],
                customdata=[[0]],
                hovertemplate=f"%{{text}}<br>{label}: %{{z:.2f}}<extra></extra>",
                colorscale=palette.SCALAR_COLORSCALE,
                zmin=cmin,
                zmax=cmax,
                showscale=stage == 0,
                colorbar=dict(title=dict(text=label, side="right"), thickness=12),
                xgap=1 if n_dp <= 16 else 0,
                ygap=1 if n_dp <= 16 else 0,
                name=f"pp{stage}",
            ),
            row=row,
            col=col,
        )
        fig.update_xaxes(
            title_text="dp" if dp_bucket == 1 else f"dp÷{dp_bucket}",
            dtick=1 if n_dp <= 16 else None,
            row=row,
            col=col,
        )
        fig.update_yaxes(title_text="tp", dtick=1 if tp <= 16 else None, row=row, col=col)
        _state_markers(fig, cells, by_stage[stage], row, col)
    meta = grid_meta(data, len(fig.data))
    for trace in grid_culprit_traces(meta, sorted(wanted)):
        fig.add_trace(trace)
    fig.update_layout(showlegend=False, meta=meta)
    base_layout(
        fig,
        height=height or max(260, 230 * n_rows),
        title=dict(text=f"topology DP {topo['dp']} × PP {pp} × TP {tp}", x=0.01, y=0.99, yanchor="top", font_size=14),
        margin=dict(l=10, r=10, t=70, b=30),
    )
    # Cell arrays go in after validation of tiny placeholders (validation is slow).
    out = fig.to_dict()
    for idx, z, text, ranks in arrays:
        out["data"][idx].update(z=z, text=text, customdata=ranks)
    return out


def grid_meta(data: dict[str, Any], overlay_start: int) -> dict[str, Any]:
    """What :func:`grid_culprit_traces` needs; ``overlay_start`` is the index of the
    first of the per-stage culprit overlay traces."""
    return {
        "topology": data["topology"],
        "dp_bucket": max(1, int(data.get("dp_bucket", 1))),
        "overlay_start": overlay_start,
    }


def grid_culprit_traces(meta: dict[str, Any], culprits: Sequence[int]) -> list[go.Scatter]:
    """One ring overlay per pipeline stage (always ``pp`` traces, possibly empty)."""
    topo = Topology.from_dict(meta["topology"])
    bucket = int(meta["dp_bucket"])
    per_stage: dict[int, list[tuple[int, int, int]]] = {s: [] for s in range(topo.pp)}
    for r in sorted(set(int(x) for x in culprits)):
        if 0 <= r < topo.world_size:
            c = topo.coords(r)
            per_stage[c.pp].append((c.dp // bucket, c.tp, r))
    traces = []
    for stage in range(topo.pp):
        pts = per_stage[stage]
        axis = "" if stage == 0 else str(stage + 1)
        traces.append(
            go.Scatter(
                x=[p[0] for p in pts],
                y=[p[1] for p in pts],
                mode="markers+text",
                marker=dict(symbol="circle-open", size=22, color=palette.CULPRIT_COLOR, line=dict(width=4)),
                text=[f"r{p[2]}" for p in pts],
                textposition="top center",
                textfont=dict(color=palette.CULPRIT_COLOR, size=12),
                hovertemplate="culprit rank %{text}<extra></extra>",
                name=f"culprits pp{stage}",
                xaxis=f"x{axis}",
                yaxis=f"y{axis}",
                cliponaxis=False,
            )
        )
    return traces


def _state_markers(fig: go.Figure, cells: dict[str, list], idx: list[int], row: int, col: int) -> None:
    groups: dict[str, tuple[list, list, list]] = {}
    for i in idx:
        state = cells["state"][i]
        if state not in STATE_SYMBOLS:
            continue
        xs, ys, ts = groups.setdefault(state, ([], [], []))
        xs.append(int(cells["dp"][i]))
        ys.append(int(cells["tp"][i]))
        ts.append(f"rank {cells['rank'][i]}: {state}")
    for state, (xs, ys, ts) in groups.items():
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                marker=dict(symbol=STATE_SYMBOLS[state], size=10, color=palette.STATE_COLORS.get(state, palette.GREY),
                            line=dict(width=1, color="white")),
                text=ts,
                hovertemplate="%{text}<extra></extra>",
                name=state,
            ),
            row=row,
            col=col,
        )
