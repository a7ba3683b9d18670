"""Small HTML building blocks shared by the pages (cards, KPIs, explicit states)."""

from __future__ import annotations

from typing import Any

from dash import html
from fleetscope.dashboard import palette
from fleetscope.dashboard.client import ApiResult


def card(title: str | None, *children: Any, **kw: Any) -> html.Div:
    cls = "fs-card " + kw.pop("className", "")
    return html.Div(([html.H3(title)] if title else []) + list(children), className=cls.strip(), **kw)


def kpi(label: str, value: Any, **kw: Any) -> html.Div:
    return html.Div(
        [html.Div(label, className="fs-kpi-label"), html.Div(value, className="fs-kpi-value", **kw)],
        className="fs-kpi",
    )


def message(text: str, state: str = "empty", **kw: Any) -> html.Div:
    """Explicit empty / loading / error / not-available state for an HTML panel."""
    prefix = {"error": "Error: ", "unavailable": "Not available: "}.get(state, "")
    return html.Div(prefix + text, className=f"fs-msg fs-{state}", **kw)


def result_message(res: ApiResult, what: str) -> html.Div:
    """The explicit state for a failed call: not available (no such route) or error."""
    if res.not_available:
        return message(f"this server does not provide {what}", "unavailable")
    return message(f"{what}: {res.error}", "error")


def severity_badge(severity: str) -> html.Span:
    color = palette.SEVERITY_COLORS.get(str(severity).lower(), palette.GREY)
    return html.Span(str(severity), className="fs-badge", style={"background": color})


def state_badge(state: str) -> html.Span:
    color = palette.STATE_COLORS.get(state, palette.GREY)
    return html.Span(state, className="fs-badge", style={"background": color})


def table(columns: list[str], rows: list[list[Any]], row_class: list[str] | None = None, **kw: Any) -> html.Table:
    head = html.Thead(html.Tr([html.Th(c) for c in columns]))
    body = html.Tbody(
        [html.Tr([html.Td(v) for v in r], className=(row_class[i] if row_class else "")) for i, r in enumerate(rows)]
    )
    return html.Table([head, body], className="fs-table", **kw)


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def fmt_num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"
