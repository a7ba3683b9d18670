"""Shared figure styling and the explicit empty / error placeholder figures."""

from __future__ import annotations

import plotly.graph_objects as go
from fleetscope.dashboard import palette

FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=12, color="#1b1f24")


def base_layout(fig: go.Figure, height: int | None = None, **kw) -> go.Figure:
    """Apply the dashboard's one light theme to ``fig`` (in place) and return it."""
    opts = dict(
        template="plotly_white",
        font=FONT,
        margin=dict(l=10, r=10, t=36, b=30),
        paper_bgcolor="white",
        plot_bgcolor="white",
        hoverlabel=dict(font_size=12),
    )
    opts.update(kw)
    fig.update_layout(**opts)
    if height:
        fig.update_layout(height=height)
    return fig


def message_figure(text: str, state: str = "empty", height: int = 220) -> go.Figure:
    """A figure that says why there is nothing to plot.

    Args:
        text: the message, e.g. "No steps recorded yet" or an API error.
        state: ``empty`` (nothing yet), ``error`` (the call failed) or ``unavailable``
            (the server lacks the route); picks the colour of the message.
        height: pixel height, so the panel does not collapse.
    """
    color = {"error": palette.VERMILLION, "unavailable": palette.GREY}.get(state, "#57606a")
    prefix = {"error": "Error: ", "unavailable": "Not available: "}.get(state, "")
    fig = go.Figure()
    fig.add_annotation(
        text=prefix + text,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font=dict(size=14, color=color),
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(meta={"state": state})
    return base_layout(fig, height=height)


def fmt_ms(value_ms: float | None) -> str:
    """Format a duration in milliseconds for labels (``-`` when unknown)."""
    if value_ms is None:
        return "-"
    if value_ms >= 10_000:
        return f"{value_ms / 1000:.1f} s"
    if value_ms >= 100:
        return f"{value_ms:.0f} ms"
    return f"{value_ms:.1f} ms"
