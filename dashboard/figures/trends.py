"""Job trend (step time and MFU over steps) and hardware (GPU/NIC metrics) figures."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import plotly.graph_objects as go
from fleetscope.dashboard import palette
from fleetscope.dashboard.figures.common import base_layout, message_figure, plain
from plotly.subplots import make_subplots


def build_trend(data: dict[str, Any], height: int = 230) -> go.Figure:
    """Step time (median and slowest rank) and MFU per step from the ``/trend`` payload."""
    steps = data.get("steps") or []
    if not steps:
        return message_figure("No completed steps yet", height=height)
    # A plain figure with an overlaying right axis: make_subplots(secondary_y) builds
    # the same layout through many validated updates (a noticeable cost per refresh).
    traces = [
        go.Scatter(x=steps, y=data.get("median_ms"), name="median step time", line=dict(color=palette.BLUE)),
        go.Scatter(x=steps, y=data.get("max_ms"), name="slowest rank", line=dict(color=palette.ORANGE, dash="dot")),
    ]
    layout: dict[str, Any] = dict(
        xaxis=dict(title=dict(text="step")), yaxis=dict(title=dict(text="ms"), rangemode="tozero"),
    )  # fmt: skip
    mfu = data.get("mfu") or []
    if any(v is not None for v in mfu):
        traces.append(go.Scatter(
            x=steps, y=[None if v is None else 100 * v for v in mfu], name="MFU %", yaxis="y2",
            line=dict(color=palette.GREEN),
        ))  # fmt: skip
        layout["yaxis2"] = dict(title=dict(text="MFU %"), overlaying="y", side="right", showgrid=False,
                                rangemode="tozero")  # fmt: skip
    fig = go.Figure(data=traces, layout=layout)
    return base_layout(
        fig,
        height=height,
        legend=dict(orientation="h", y=1.08, x=0),
        margin=dict(l=10, r=10, t=30, b=30),
    )


def build_hardware(data: dict[str, Any], height: int = 320) -> go.Figure:
    """GPU and NIC metrics of one rank's host over a step window, log events as lines.

    Args:
        data: ``/hardware`` payload: ``t0_ns``, ``series`` (list of ``name``, ``device``,
            ``ts_ns``, ``value``, ``unit``) and ``events`` (``ts_ns``, ``kind``,
            ``severity``, ``message``).
    """
    series = data.get("series") or []
    events = data.get("events") or []
    if not series and not events:
        return message_figure(
            f"No GPU/NIC metrics or log events for rank {data.get('rank', '?')} in this window",
            height=height,
        )
    t0 = int(data.get("t0_ns") or 0)
    names = sorted({s["name"] for s in series}) or ["events"]
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=[plain(n) for n in names], vertical_spacing=0.08)
    colors = [palette.BLUE, palette.ORANGE, palette.GREEN, palette.PURPLE, palette.SKY_BLUE, palette.VERMILLION]
    per_device: dict[str, int] = defaultdict(int)
    for s in series:
        row = names.index(s["name"]) + 1
        color = colors[per_device[s["name"]] % len(colors)]
        per_device[s["name"]] += 1
        fig.add_trace(
            go.Scatter(
                x=[(t - t0) / 1e9 for t in s["ts_ns"]],
                y=s["value"],
                mode="lines+markers",
                marker=dict(size=4),
                name=plain(f"{s['device'] or 'host'} {s['name']}"),
                line=dict(color=color),
            ),
            row=row,
            col=1,
        )
    for e in events[:100]:
        fig.add_vline(
            x=(int(e["ts_ns"]) - t0) / 1e9,
            line=dict(color=palette.SEVERITY_COLORS.get(e.get("severity", "error"), palette.VERMILLION), dash="dash"),
        )
    if events:
        fig.add_trace(
            go.Scatter(
                x=[(int(e["ts_ns"]) - t0) / 1e9 for e in events[:100]],
                y=[None] * min(len(events), 100),
                mode="markers",
                name="log events",
                hovertext=[plain(f"{e.get('kind')}: {e.get('message', '')[:120]}") for e in events[:100]],
                showlegend=False,
            ),
            row=1,
            col=1,
        )
    fig.update_xaxes(title_text="seconds since window start", row=len(names), col=1)
    return base_layout(fig, height=max(height, 150 * len(names)), showlegend=True,
                       legend=dict(orientation="h", y=-0.15))
