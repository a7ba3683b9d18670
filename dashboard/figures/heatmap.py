"""The MegaScale rank x step heat-map, from the ``/jobs/{job}/heatmap`` payload.

Rows are ranks (or buckets of adjacent ranks) in (pp, dp, tp) order, columns are steps
(or step buckets). Pipeline stages are separated by lines and labelled on the y axis;
straggler ranks get a marker at the right edge of their row. Each cell carries the rank
that produced its value, so a click opens that rank even in an aggregated view.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
from fleetscope.dashboard import palette
from fleetscope.dashboard.figures.common import (
    X_TITLE_PX,
    base_layout,
    fixed_margins,
    fmt_ms,
    label_px,
    message_figure,
)

from fleetscope.topology import Topology

MAX_TICKS = 40


def build_heatmap(
    data: dict[str, Any],
    culprits: Sequence[int] = (),
    selected: tuple[int, int] | None = None,
    height: int = 460,
) -> go.Figure | dict[str, Any]:
    """Heat-map figure for one metric of one job.

    Trace 0 is the heat-map, trace 1 always the culprit markers (possibly empty), so a
    later update can replace the markers alone (see :func:`culprit_trace`). Returned
    as a figure dict (what ``dcc.Graph`` takes) when there is data.

    Args:
        data: the ``/heatmap`` payload (``z``, ``rank``, ``steps``, ``row_labels``,
            ``row_pp``, ``unit``, ``label``, ``agg``, ``row_bucket``, ``step_bucket``).
        culprits: straggler/culprit ranks to mark.
        selected: ``(rank, step)`` of the selected cell, outlined.
        height: pixel height.
    """
    z = data.get("z") or []
    if not z or not any(v is not None for row in z for v in row):
        return message_figure(
            f"No {data.get('label', 'data')} recorded for steps "
            f"{data.get('from_step', '?')}–{data.get('to_step', '?')} yet",
            height=height,
        )
    steps: list[int] = data["steps"]
    labels: list[str] = data["row_labels"]
    row_pp: list[int] = data.get("row_pp") or [0] * len(labels)
    ranks_cells = data.get("rank") or [[None] * len(steps) for _ in z]
    unit = data.get("unit", "")
    step_bucket = int(data.get("step_bucket", 1))
    what = "worst rank" if int(data.get("row_bucket", 1)) > 1 else "rank"
    hover = (
        f"%{{y}}<br>step %{{x}} · {what} %{{customdata}}"
        f"<br>{data.get('label', '')}: %{{z:.1f}} {unit}<extra></extra>"
    )
    # Big arrays are put into the figure dict after plotly has validated a tiny
    # placeholder: validating 50k cells costs seconds and adds nothing.
    fig = go.Figure(
        go.Heatmap(
            z=[[0]],
            x=[steps[0]],
            y=[labels[0]],
            customdata=[[0]],
            hovertemplate=hover,
            colorscale=palette.SCALAR_COLORSCALE,
            colorbar=dict(title=dict(text=unit, side="right"), thickness=12, x=1.0, xanchor="left", xpad=110),
            ygap=1 if len(labels) <= 64 else 0,
            name="heatmap",
        )
    )
    fig.add_trace(culprit_trace(heatmap_meta(data), culprits))
    tickvals, ticktext = _row_ticks(labels, row_pp)
    fig.update_yaxes(
        type="category", tickvals=tickvals, ticktext=ticktext, autorange="reversed", showgrid=False
    )
    fig.update_xaxes(title="step", showgrid=False)
    separators = [  # pipeline stage boundaries
        dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=i - 0.5, y1=i - 0.5, line=dict(color="white", width=2))
        for i in range(1, len(labels))
        if row_pp[i] != row_pp[i - 1]
    ]
    if selected is not None:
        _outline_selected(fig, selected, ranks_cells, steps, step_bucket)
    title = f"{data.get('label', data.get('metric', ''))} per rank and step"
    if int(data.get("row_bucket", 1)) > 1 or step_bucket > 1:
        title += (
            f" — {data.get('agg', 'max')} of {data.get('row_bucket', 1)} ranks"
            f" × {step_bucket} steps per cell"
        )
    base_layout(fig, height=height, title=dict(text=title, x=0.01, font_size=14), margin=dict(r=170, l=10, t=36, b=30))
    out = fig.to_dict()
    scale = data.get("scale") or {}
    off = set(scale.get("off_scale_steps") or [])
    z_on = z
    if off:  # the in-progress / hung step(s) leave the colour scale: drawn apart, in grey
        cols = [j for j, st in enumerate(steps) if st in off]
        z_on = [[None if j in cols else v for j, v in enumerate(row)] for row in z]
        out["data"].append(_off_scale_trace(z, steps, labels, ranks_cells, cols, unit, data.get("label", "")))
        top = max((v for row in z for j, v in enumerate(row) if j in cols and v is not None), default=0.0)
        out["layout"].setdefault("annotations", []).append(dict(
            text=f"grey: step {', '.join(str(st) for st in sorted(off))} off the scale "
                 f"(in progress or hung; up to {fmt_ms(top) if unit == 'ms' else f'{top:g} {unit}'})",
            xref="paper", yref="paper", x=1.0, y=1.01, xanchor="right", yanchor="bottom", showarrow=False,
            font=dict(size=11, color="#57606a")))
    out["data"][0].update(z=z_on, x=steps, y=labels, customdata=ranks_cells)
    if scale.get("zmin") is not None and scale.get("zmax") is not None:
        lo, hi = float(scale["zmin"]), float(scale["zmax"])
        capped = bool(scale.get("num_capped")) or bool(off)
        out["data"][0].update(zmin=lo, zmax=hi, zauto=False)
        ticks = [lo, (lo + hi) / 2, hi]
        out["data"][0]["colorbar"].update(
            tickmode="array", tickvals=ticks,
            ticktext=[f"{t:.3g}" for t in ticks[:-1]] + [f"≥{hi:.3g} (cap)" if capped else f"{hi:.3g}"])
    out["layout"]["shapes"] = separators + list(out["layout"].get("shapes", []))
    fixed_margins(out["layout"], l=label_px(ticktext) + 12, b=X_TITLE_PX)
    return out


def _off_scale_trace(z, steps, labels, ranks_cells, cols, unit, label) -> dict[str, Any]:
    """The off-scale columns as their own grey heat-map (no colour bar), values in hover."""
    zz = [[v if j in cols else None for j, v in enumerate(row)] for row in z]
    return {
        "type": "heatmap", "name": "off scale", "z": zz, "x": steps, "y": labels, "customdata": ranks_cells,
        "colorscale": [[0, "#d0d7de"], [1, "#8c959f"]], "showscale": False, "hoverongaps": False,
        "ygap": 1 if len(labels) <= 64 else 0,
        "hovertemplate": f"%{{y}}<br>step %{{x}} · rank %{{customdata}}<br>{label}: %{{z:.1f}} {unit}"
                         "<br>off the colour scale (in progress or hung)<extra></extra>",
    }  # fmt: skip


def heatmap_meta(data: dict[str, Any]) -> dict[str, Any]:
    """What :func:`culprit_trace` needs to place markers, without the cell matrix."""
    steps = data.get("steps") or [0]
    return {
        "topology": data.get("topology"),
        "row_bucket": int(data.get("row_bucket", 1)),
        "row_labels": data.get("row_labels") or [],
        "x_edge": steps[-1] + max(1.0, (steps[-1] - steps[0]) / 40 if len(steps) > 1 else 1.0),
    }


def culprit_trace(meta: dict[str, Any], culprits: Sequence[int]) -> go.Scatter:
    """Markers at the right edge of the rows holding ``culprits`` (empty if none)."""
    rows: dict[int, list[int]] = {}
    topo_d = meta.get("topology")
    labels = meta.get("row_labels") or []
    if topo_d and labels:
        topo = Topology.from_dict(topo_d)
        for r in sorted(set(int(x) for x in culprits)):
            if 0 <= r < topo.world_size:
                c = topo.coords(r)
                pos = (c.pp * topo.dp + c.dp) * topo.tp + c.tp
                row = pos // max(1, int(meta.get("row_bucket", 1)))
                if row < len(labels):
                    rows.setdefault(row, []).append(r)
    return go.Scatter(
        x=[meta.get("x_edge", 0)] * len(rows),
        y=[labels[i] for i in rows],
        mode="markers+text",
        marker=dict(symbol="triangle-left", size=13, color=palette.CULPRIT_COLOR),
        text=["culprit r" + ",".join(str(r) for r in rs) for rs in rows.values()],
        textposition="middle right",
        textfont=dict(color=palette.CULPRIT_COLOR, size=12),
        hovertemplate="%{text}<extra></extra>",
        showlegend=False,
        name="culprits",
        cliponaxis=False,
    )


def _row_ticks(labels: list[str], row_pp: list[int]) -> tuple[list[str], list[str]]:
    n = len(labels)
    if n <= MAX_TICKS:
        return labels, labels
    # Too many rows to label each: label the first row of every stage, thinned evenly.
    idx = [i for i in range(n) if i == 0 or row_pp[i] != row_pp[i - 1]]
    if len(idx) > MAX_TICKS:
        idx = idx[:: -(-len(idx) // MAX_TICKS)]
    return [labels[i] for i in idx], [labels[i] for i in idx]


def _outline_selected(
    fig: go.Figure,
    selected: tuple[int, int],
    ranks_cells: list[list[int | None]],
    steps: list[int],
    step_bucket: int,
) -> None:
    rank, step = selected
    for i, row in enumerate(ranks_cells):
        for j, r in enumerate(row):
            if r == rank and steps[j] <= step < steps[j] + step_bucket:
                half = step_bucket / 2
                fig.add_shape(
                    type="rect",
                    x0=steps[j] - half,
                    x1=steps[j] + half,
                    y0=i - 0.5,
                    y1=i + 0.5,
                    line=dict(color=palette.VERMILLION, width=3),
                )
                return
