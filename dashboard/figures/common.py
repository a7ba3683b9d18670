"""Shared figure styling and the explicit empty / error placeholder figures.

Importing this module makes ``plotly_white`` plotly's default template (the dashboard
is the only plotly user in its process). A figure then gets the template when it is
created, where plotly copies it without validation; setting it per figure with
``update_layout(template=...)`` validated the whole template every time, which cost
more than building the rest of most figures.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from fleetscope.dashboard import palette

_PLAIN = str.maketrans({"&": "&#38;", "<": "&#60;", ">": "&#62;"})


def plain(value: Any) -> str:
    """``value`` as text that plotly shows literally.

    Plotly renders its strings (bar text, hover text, trace names, tick and annotation
    text) as pseudo-HTML: ``<a href=...>`` becomes a link, ``<b>``/``<br>`` markup.
    Span names, op names, host names and log lines come from the telemetry, so they go
    through here: ``&``, ``<`` and ``>`` become numeric entities, which plotly decodes
    only inside text, after it has parsed the tags.
    """
    return str(value).translate(_PLAIN)


TEMPLATE = "plotly_white"
pio.templates.default = TEMPLATE

FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=12, color="#1b1f24")
LAYOUT = dict(
    font=FONT,
    margin=dict(l=10, r=10, t=36, b=30),
    paper_bgcolor="white",
    plot_bgcolor="white",
    hoverlabel=dict(font_size=12),
)
"""The dashboard's one light theme (on top of :data:`TEMPLATE`)."""


def base_layout(fig: go.Figure, height: int | None = None, **kw) -> go.Figure:
    """Apply the dashboard's one light theme to ``fig`` (in place) and return it."""
    opts: dict[str, Any] = {**LAYOUT, **kw}
    if height:
        opts["height"] = height
    fig.update_layout(**opts)
    return fig


def dict_layout(layout: dict[str, Any], height: int | None = None, **kw) -> dict[str, Any]:
    """:func:`base_layout` for a figure built as a plain dict (no plotly validation,
    for figures with thousands of cells): the theme and template go into ``layout``."""
    layout.setdefault("template", template_json())
    layout.update(copy.deepcopy(LAYOUT))
    layout.update(kw)
    if height:
        layout["height"] = height
    return layout


LABEL_CHAR_PX = 7.0
"""Width of one character of a 12 px tick label, rounded up (about 5.9 px on average
for rank labels and 6.7 px for digits in Liberation Sans / Arial)."""
X_TITLE_PX = 52
"""Bottom margin that holds a row of 12 px tick labels and an axis title under them."""


def label_px(labels) -> int:
    """Estimated pixel width of the widest of ``labels`` (12 px font)."""
    return int(max((len(str(s)) for s in labels), default=0) * LABEL_CHAR_PX + 0.999)


def fixed_margins(layout: dict[str, Any], **margin: int) -> dict[str, Any]:
    """Give ``layout`` explicit ``margin`` values and turn off plotly's axis automargin
    (in place; returns ``layout``).

    With automargin, plotly measures every tick label and title and lays the figure out
    a second time: on the heat-map and grid of a 12,288-rank job that was about half
    of each draw, on the critical path of the job page. Callers size the margins from
    their labels (:func:`label_px`) instead.
    """
    for axis in ("xaxis", "yaxis"):
        layout.setdefault(axis, {})["automargin"] = False
    layout["margin"] = {**layout.get("margin", {}), **margin}
    return layout


@lru_cache(maxsize=1)
def template_json() -> dict[str, Any]:
    """:data:`TEMPLATE` as plotly JSON (shared: callers must not modify it)."""
    return pio.templates[TEMPLATE].to_plotly_json()


@lru_cache(maxsize=8)
def colorscale_json(name: str) -> list[list[Any]]:
    """A named plotly colour scale as the ``[[position, colour], ...]`` list plotly
    itself would send (shared: callers must not modify it)."""
    return [list(x) for x in go.Heatmap(colorscale=name).colorscale]


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
    note = dict(text=prefix + plain(text), x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                font=dict(size=14, color=color))  # fmt: skip
    # One constructor call: plotly validates the layout once, not once per update.
    return go.Figure(layout=dict(
        LAYOUT, height=height, annotations=[note], xaxis=dict(visible=False), yaxis=dict(visible=False),
        meta={"state": state},
    ))  # fmt: skip


@lru_cache(maxsize=64)
def _message_json(text: str, state: str, height: int) -> dict[str, Any]:
    return message_figure(text, state, height).to_dict()


def message_dict(text: str, state: str = "empty", height: int = 220) -> dict[str, Any]:
    """:func:`message_figure` as a figure dict, built once per message (page layouts
    and callbacks return it on every load; Dash only serialises it)."""
    return _message_json(text, state, height)


def fmt_ms(value_ms: float | None) -> str:
    """Format a duration in milliseconds for labels (``-`` when unknown)."""
    if value_ms is None:
        return "-"
    if value_ms >= 10_000:
        return f"{value_ms / 1000:.1f} s"
    if value_ms >= 100:
        return f"{value_ms:.0f} ms"
    return f"{value_ms:.1f} ms"
