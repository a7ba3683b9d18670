"""The 3D topology grid as small multiples: one DP x TP panel per pipeline stage.

Each cell is a rank (or a bucket of adjacent DP replicas for very large jobs) coloured
by its straggler score; ranks in a non-ok state get a state marker and culprit ranks a
ring, so "which stage, which replica, which TP slot" is read off at a glance.

The panels are laid out side by side in ONE heat-map on one pair of axes (empty cells
between them), not as plotly subplots: a browser draws one heat-map of ~5,000 cells in
a fraction of the time it takes to lay out eight subplots with sixteen axes, which was
most of the job page's load time at 12,288 ranks. The figure is built as plain dicts
with numpy (plotly's per-property validation would cost more than everything else).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from fleetscope.dashboard import palette
from fleetscope.dashboard.figures.common import (
    X_TITLE_PX,
    colorscale_json,
    dict_layout,
    fixed_margins,
    label_px,
    message_figure,
)

from fleetscope.topology import Topology

STATE_SYMBOLS = {"slow": "diamond", "stuck": "x", "hung": "x", "dead": "square", "missing": "circle-open"}
MAX_PANEL_COLS = 4
MAX_TICKS_PER_PANEL = 16


@dataclass(frozen=True)
class Panels:
    """Where the panel of each pipeline stage sits in the one heat-map: stage ``s`` is
    column ``s % cols``, row ``s // cols``; a panel is ``n_dp`` x ``tp`` cells, with
    ``gap_x`` empty columns between panels and ``gap_y`` empty rows above each row of
    panels (room for its title). Row 0 is drawn at the top (reversed y axis)."""

    pp: int
    tp: int
    n_dp: int
    cols: int
    rows: int
    gap_x: int
    gap_y: int

    @classmethod
    def of(cls, pp: int, tp: int, n_dp: int) -> Panels:
        cols = min(pp, MAX_PANEL_COLS)
        return cls(pp, tp, n_dp, cols, math.ceil(pp / cols), max(1, round(n_dp / 12)), max(1, round(tp / 4)))

    @property
    def width(self) -> int:
        return self.cols * (self.n_dp + self.gap_x) - self.gap_x

    @property
    def height(self) -> int:
        return self.rows * (self.tp + self.gap_y)

    def origin(self, stage: np.ndarray | int) -> tuple[Any, Any]:
        """(x, y) of the top-left cell of the panel of ``stage``."""
        return (stage % self.cols) * (self.n_dp + self.gap_x), (stage // self.cols) * (self.tp + self.gap_y) + self.gap_y

    def to_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("pp", "tp", "n_dp", "cols", "rows", "gap_x", "gap_y")}


def build_grid(
    data: dict[str, Any], culprits: Sequence[int] = (), height: int | None = None
) -> go.Figure | dict[str, Any]:
    """Small-multiples figure of the ``/grid`` payload, as a figure dict.

    A cell's hover names its rank and coordinates from ``customdata`` (``[rank, pp,
    first dp, tp]``; a click selects ``customdata[0]``); there is no per-cell text.

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
    bucket = max(1, int(data.get("dp_bucket", 1)))
    panels = Panels.of(int(topo["pp"]), int(topo["tp"]), math.ceil(int(topo["dp"]) / bucket))
    stage = np.asarray(cells["pp"], dtype=np.int64)
    dp = np.asarray(cells["dp"], dtype=np.int64)
    tp = np.asarray(cells["tp"], dtype=np.int64)
    rank = np.asarray(cells["rank"], dtype=np.int64)
    score = np.array([np.nan if v is None else float(v) for v in cells["score"]])
    ok = (stage >= 0) & (stage < panels.pp) & (dp >= 0) & (dp < panels.n_dp) & (tp >= 0) & (tp < panels.tp)
    x0, y0 = panels.origin(stage)
    xs, ys = x0 + dp, y0 + tp
    z = np.full((panels.height, panels.width), np.nan)
    z[ys[ok], xs[ok]] = score[ok]
    z_out = z.astype(object)  # Python floats; None (JSON null) for gaps
    z_out[np.isnan(z)] = None
    custom = np.full((panels.height, panels.width), None, dtype=object)
    for i in np.flatnonzero(ok).tolist():
        custom[ys[i], xs[i]] = [int(rank[i]), int(stage[i]), int(dp[i]) * bucket, int(tp[i])]
    cmin, cmax, capped = grid_scale(score, float(data.get("slow_score") or 1.10))
    one_tick = cmin + 0.15 * (cmax - cmin) < 1.0 < cmax - 0.15 * (cmax - cmin)  # room for a "1.00" tick
    label = data.get("score_label", "straggler score")
    dp_text = "dp%{customdata[2]}" + (f" (+{bucket - 1}: worst of {bucket} replicas)" if bucket > 1 else "")
    small = panels.n_dp <= 16 and panels.tp <= 16
    traces: list[dict[str, Any]] = [{
        "type": "heatmap", "name": "ranks", "z": z_out.tolist(),
        "customdata": custom.tolist(), "hoverongaps": False,
        "hovertemplate": f"rank %{{customdata[0]}} · pp%{{customdata[1]}} {dp_text} tp%{{customdata[3]}}"
                         f"<br>{label}: %{{z:.2f}}<extra></extra>",
        "colorscale": colorscale_json(palette.SCALAR_COLORSCALE), "zmin": cmin, "zmax": cmax,
        "xgap": 1 if small else 0, "ygap": 1 if small else 0,
        "colorbar": {"title": {"text": label, "side": "right"}, "thickness": 12, "tickmode": "array",
                     "tickvals": [cmin, 1.0, cmax] if one_tick else [cmin, cmax],
                     "ticktext": ([f"{cmin:.2f}", "1.00"] if one_tick else [f"{cmin:.2f}"])
                                 + [f"≥{cmax:.2f} (cap)" if capped else f"{cmax:.2f}"]},
    }]  # fmt: skip
    traces += _state_markers(cells, xs, ys, ok)
    meta = grid_meta(data, len(traces))
    wanted = set(int(r) for r in culprits) | set(int(r) for r in data.get("culprits") or [])
    traces += grid_culprit_traces(meta, sorted(wanted))
    layout: dict[str, Any] = {
        "xaxis": {"title": {"text": "dp" if bucket == 1 else f"dp (buckets of {bucket} replicas)"},
                  "tickangle": 0, "showgrid": False, "zeroline": False, "range": [-0.5, panels.width - 0.5],
                  **_ticks(panels, "x", bucket)},
        "yaxis": {"title": {"text": "tp"}, "showgrid": False, "zeroline": False,
                  "range": [panels.height - 0.5, -0.5], **_ticks(panels, "y", bucket)},
        "annotations": [_panel_title(panels, s) for s in range(panels.pp)],
        "showlegend": False, "meta": meta,
    }  # fmt: skip
    dict_layout(
        layout,
        height=height or max(260, 230 * panels.rows),
        title=dict(text=f"topology DP {topo['dp']} × PP {panels.pp} × TP {panels.tp}", x=0.01, y=0.99,
                   yanchor="top", font_size=14),  # fmt: skip
        margin=dict(l=10, r=10, t=50, b=30),
    )
    # The y axis holds tp numbers and the title "tp".
    fixed_margins(layout, l=label_px(layout["yaxis"]["ticktext"]) + 34, b=X_TITLE_PX)
    return {"data": traces, "layout": layout}


GRID_CAP = 2.0
"""The grid's colour scale ends at this score (2x its stage's own work); above it is the
top colour, so one rank at 5x (a stalled data loader) leaves a 1.2x rank visible."""


def grid_scale(score: np.ndarray, slow_score: float = 1.10) -> tuple[float, float, bool]:
    """(zmin, zmax, capped) of the grid's colour scale: from just below the typical rank
    (the 5th percentile, at most 0.98) to the highest score, at least 1.2x the slow
    threshold's excess (a 1.2x rank is near the top colour when nothing is slower) and
    at most :data:`GRID_CAP`."""
    known = score[np.isfinite(score)]
    if not known.size:
        return 0.0, 1.0, False
    lo = min(float(np.percentile(known, 5)), 0.98)
    top = float(known.max())
    hi = min(max(top, 1.0 + 2.5 * (slow_score - 1.0)), GRID_CAP)
    if hi - lo < 1e-9:
        hi = lo + 0.1
    return round(lo, 3), round(hi, 3), top > hi


def _ticks(panels: Panels, axis: str, bucket: int) -> dict[str, Any]:
    """Tick positions and labels (real dp / tp numbers) repeated for every panel."""
    n = panels.n_dp if axis == "x" else panels.tp
    step = max(1, math.ceil(n / MAX_TICKS_PER_PANEL))
    if axis == "x" and n > MAX_TICKS_PER_PANEL:
        local = [0, n // 2]  # the panel's last label would run into the next panel's first
    else:
        local = list(range(0, n, step))
    vals, text = [], []
    for k in range(panels.cols if axis == "x" else panels.rows):
        x0, y0 = panels.origin(k if axis == "x" else k * panels.cols)
        base = x0 if axis == "x" else y0
        vals += [base + i for i in local]
        text += [str(i * bucket if axis == "x" else i) for i in local]
    return {"tickmode": "array", "tickvals": vals, "ticktext": text}


def _panel_title(panels: Panels, stage: int) -> dict[str, Any]:
    x0, y0 = panels.origin(stage)
    return {
        "text": f"pipeline stage pp{stage}" if panels.pp <= 2 else f"pp{stage}", "showarrow": False,
        "x": x0 + (panels.n_dp - 1) / 2, "y": y0 - 0.5, "xref": "x", "yref": "y", "yanchor": "bottom",
        "font": {"size": 13},
    }  # fmt: skip


def grid_meta(data: dict[str, Any], overlay_start: int) -> dict[str, Any]:
    """What :func:`grid_culprit_traces` needs; ``overlay_start`` is the index of the
    culprit overlay trace."""
    topo = data["topology"]
    bucket = max(1, int(data.get("dp_bucket", 1)))
    panels = Panels.of(int(topo["pp"]), int(topo["tp"]), math.ceil(int(topo["dp"]) / bucket))
    return {"topology": topo, "dp_bucket": bucket, "overlay_start": overlay_start, "panels": panels.to_dict()}


def grid_culprit_traces(meta: dict[str, Any], culprits: Sequence[int]) -> list[dict[str, Any]]:
    """The culprit ring overlay (always one trace, possibly empty), as a list of trace
    dicts; a ring sits on the cell of the rank's DP bucket."""
    topo = Topology.from_dict(meta["topology"])
    bucket = int(meta["dp_bucket"])
    panels = Panels(**meta["panels"]) if meta.get("panels") else Panels.of(topo.pp, topo.tp, math.ceil(topo.dp / bucket))
    pts = []
    for r in sorted(set(int(x) for x in culprits)):
        if 0 <= r < topo.world_size:
            c = topo.coords(r)
            x0, y0 = panels.origin(c.pp)
            pts.append((x0 + c.dp // bucket, y0 + c.tp, r))
    return [{
        "type": "scatter", "name": "culprits", "x": [p[0] for p in pts], "y": [p[1] for p in pts],
        "mode": "markers+text", "text": [f"r{p[2]}" for p in pts], "textposition": "top center",
        "marker": {"symbol": "circle-open", "size": 22, "color": palette.CULPRIT_COLOR, "line": {"width": 4}},
        "textfont": {"color": palette.CULPRIT_COLOR, "size": 12},
        "hovertemplate": "culprit rank %{text}<extra></extra>", "cliponaxis": False,
    }]  # fmt: skip


def _state_markers(cells: dict[str, list], xs: np.ndarray, ys: np.ndarray, ok: np.ndarray) -> list[dict[str, Any]]:
    """A marker trace per state for the cells not ``ok`` (few, even at scale)."""
    groups: dict[str, tuple[list, list, list]] = {}
    for i, state in enumerate(cells["state"]):
        if state not in STATE_SYMBOLS or not ok[i]:
            continue
        gx, gy, gt = groups.setdefault(state, ([], [], []))
        gx.append(int(xs[i]))
        gy.append(int(ys[i]))
        gt.append(f"rank {cells['rank'][i]}: {state}")
    return [
        {"type": "scatter", "name": state, "x": gx, "y": gy, "mode": "markers", "text": gt,
         "hovertemplate": "%{text}<extra></extra>",
         "marker": {"symbol": STATE_SYMBOLS[state], "size": 10, "line": {"width": 1, "color": "white"},
                    "color": palette.STATE_COLORS.get(state, palette.GREY)}}
        for state, (gx, gy, gt) in sorted(groups.items())
    ]  # fmt: skip
