"""The 3D topology grid as small multiples: one DP x TP panel per pipeline stage.

Each cell is a rank (or a bucket of adjacent DP replicas for very large jobs) coloured
by its straggler score; ranks in a non-ok state get a state marker and culprit ranks a
ring, so "which stage, which replica, which TP slot" is read off at a glance.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import plotly.graph_objects as go
from fleetscope.dashboard import palette
from fleetscope.dashboard.figures.common import colorscale_json, dict_layout, message_figure
from plotly.subplots import make_subplots

from fleetscope.topology import Topology

STATE_SYMBOLS = {"slow": "diamond", "stuck": "x", "hung": "x", "dead": "square", "missing": "circle-open"}
MAX_PANEL_COLS = 4


def build_grid(
    data: dict[str, Any], culprits: Sequence[int] = (), height: int | None = None
) -> go.Figure | dict[str, Any]:
    """Small-multiples figure of the ``/grid`` payload, as a figure dict.

    Built as plain dicts with numpy (thousands of cells: plotly's per-property
    validation would cost most of a second). A cell's hover names its rank from
    ``customdata`` and its position from the axes; there is no per-cell text. The x
    axis counts DP replicas: with buckets, a column sits at its first replica.

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
    bucket = max(1, int(data.get("dp_bucket", 1)))
    n_dp = math.ceil(int(topo["dp"]) / bucket)
    n_rows = math.ceil(pp / min(pp, MAX_PANEL_COLS))
    stage = np.asarray(cells["pp"], dtype=np.int64)
    dp = np.asarray(cells["dp"], dtype=np.int64)
    tpi = np.asarray(cells["tp"], dtype=np.int64)
    score = np.array([np.nan if v is None else float(v) for v in cells["score"]])
    ok = (stage >= 0) & (stage < pp) & (dp >= 0) & (dp < n_dp) & (tpi >= 0) & (tpi < tp)
    z = np.full((pp, tp, n_dp), np.nan)
    z[stage[ok], tpi[ok], dp[ok]] = score[ok]
    rank = np.full((pp, tp, n_dp), -1, dtype=np.int64)
    rank[stage[ok], tpi[ok], dp[ok]] = np.asarray(cells["rank"], dtype=np.int64)[ok]
    known = score[~np.isnan(score)]
    cmin = float(known.min()) if known.size else 0.0
    cmax = float(known.max()) if known.size else 1.0
    if cmax - cmin < 1e-9:
        cmax = cmin + 1.0
    label = data.get("score_label", "straggler score")
    where = "dp%{x}" if bucket == 1 else f"dp%{{x}} (+{bucket - 1}: worst of {bucket} replicas)"
    x = (np.arange(n_dp) * bucket).tolist()
    gap = 1 if n_dp <= 16 else 0
    traces: list[dict[str, Any]] = []
    for s in range(pp):
        axis = _axis_suffix(s)
        traces.append({
            "type": "heatmap", "name": f"pp{s}", "xaxis": f"x{axis}", "yaxis": f"y{axis}",
            "x": x, "z": _nullable(z[s]), "customdata": _nullable(rank[s], missing=-1),
            "hovertemplate": f"rank %{{customdata}} · pp{s} {where} tp%{{y}}<br>{label}: %{{z:.2f}}<extra></extra>",
            "colorscale": colorscale_json(palette.SCALAR_COLORSCALE), "zmin": cmin, "zmax": cmax,
            "showscale": s == 0, "xgap": gap, "ygap": gap,
            "colorbar": {"title": {"text": label, "side": "right"}, "thickness": 12},
        })  # fmt: skip
    traces += _state_markers(cells, stage, dp * bucket, tpi)
    meta = grid_meta(data, len(traces))
    wanted = set(int(r) for r in culprits) | set(int(r) for r in data.get("culprits") or [])
    traces += grid_culprit_traces(meta, sorted(wanted))
    layout = copy.deepcopy(_panels_layout(pp))
    for s in range(pp):
        axis = _axis_suffix(s)
        layout[f"xaxis{axis}"].update(title={"text": "dp" if bucket == 1 else f"dp (buckets of {bucket})"},
                                      **({"dtick": bucket} if n_dp <= 16 else {}))  # fmt: skip
        layout[f"yaxis{axis}"].update(title={"text": "tp"}, **({"dtick": 1} if tp <= 16 else {}))
    layout.update(showlegend=False, meta=meta)
    dict_layout(
        layout,
        height=height or max(260, 230 * n_rows),
        title=dict(text=f"topology DP {topo['dp']} × PP {pp} × TP {tp}", x=0.01, y=0.99, yanchor="top", font_size=14),
        margin=dict(l=10, r=10, t=70, b=30),
    )
    return {"data": traces, "layout": layout}


@lru_cache(maxsize=16)
def _panels_layout(pp: int) -> dict[str, Any]:
    """Axes and panel titles of the ``pp`` small multiples (shared: deep-copy it)."""
    n_cols = min(pp, MAX_PANEL_COLS)
    n_rows = math.ceil(pp / n_cols)
    fig = make_subplots(
        rows=n_rows,
        cols=n_cols,
        subplot_titles=[f"pipeline stage pp{s}" if pp <= 2 else f"pp{s}" for s in range(pp)],
        horizontal_spacing=0.06 if n_cols > 1 else 0.0,
        vertical_spacing=0.16 if n_rows > 1 else 0.0,
    )
    layout = fig.to_dict()["layout"]
    layout.pop("template", None)
    return layout


def _axis_suffix(stage: int) -> str:
    return "" if stage == 0 else str(stage + 1)


def _nullable(a: np.ndarray, missing: float | None = None) -> list[list[Any]]:
    """Nested lists with ``None`` where ``a`` is NaN (or equals ``missing``)."""
    empty = np.isnan(a) if missing is None else a == missing
    return np.where(empty, None, a.astype(object)).tolist()


def grid_meta(data: dict[str, Any], overlay_start: int) -> dict[str, Any]:
    """What :func:`grid_culprit_traces` needs; ``overlay_start`` is the index of the
    first of the per-stage culprit overlay traces."""
    return {
        "topology": data["topology"],
        "dp_bucket": max(1, int(data.get("dp_bucket", 1))),
        "overlay_start": overlay_start,
    }


def grid_culprit_traces(meta: dict[str, Any], culprits: Sequence[int]) -> list[dict[str, Any]]:
    """One ring overlay per pipeline stage (always ``pp`` traces, possibly empty), as
    trace dicts; a ring sits on the column of the rank's DP bucket."""
    topo = Topology.from_dict(meta["topology"])
    bucket = int(meta["dp_bucket"])
    per_stage: dict[int, list[tuple[int, int, int]]] = {s: [] for s in range(topo.pp)}
    for r in sorted(set(int(x) for x in culprits)):
        if 0 <= r < topo.world_size:
            c = topo.coords(r)
            per_stage[c.pp].append((c.dp // bucket * bucket, c.tp, r))
    traces = []
    for stage in range(topo.pp):
        pts = per_stage[stage]
        axis = _axis_suffix(stage)
        traces.append({
            "type": "scatter", "name": f"culprits pp{stage}", "xaxis": f"x{axis}", "yaxis": f"y{axis}",
            "x": [p[0] for p in pts], "y": [p[1] for p in pts], "mode": "markers+text",
            "marker": {"symbol": "circle-open", "size": 22, "color": palette.CULPRIT_COLOR, "line": {"width": 4}},
            "text": [f"r{p[2]}" for p in pts], "textposition": "top center",
            "textfont": {"color": palette.CULPRIT_COLOR, "size": 12},
            "hovertemplate": "culprit rank %{text}<extra></extra>", "cliponaxis": False,
        })  # fmt: skip
    return traces


def _state_markers(cells: dict[str, list], stage: np.ndarray, x: np.ndarray, tp: np.ndarray) -> list[dict[str, Any]]:
    """A marker trace per (stage, state) for the cells not ``ok`` (few, even at scale)."""
    groups: dict[tuple[int, str], tuple[list, list, list]] = {}
    for i, state in enumerate(cells["state"]):
        if state not in STATE_SYMBOLS:
            continue
        xs, ys, ts = groups.setdefault((int(stage[i]), state), ([], [], []))
        xs.append(int(x[i]))
        ys.append(int(tp[i]))
        ts.append(f"rank {cells['rank'][i]}: {state}")
    out = []
    for (s, state), (xs, ys, ts) in sorted(groups.items()):
        axis = _axis_suffix(s)
        out.append({
            "type": "scatter", "name": state, "xaxis": f"x{axis}", "yaxis": f"y{axis}", "x": xs, "y": ys,
            "mode": "markers", "text": ts, "hovertemplate": "%{text}<extra></extra>",
            "marker": {"symbol": STATE_SYMBOLS[state], "size": 10, "line": {"width": 1, "color": "white"},
                       "color": palette.STATE_COLORS.get(state, palette.GREY)},
        })  # fmt: skip
    return out
