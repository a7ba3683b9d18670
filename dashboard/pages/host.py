"""The host page (``/hosts/<host>``): self-check results and the host's history across jobs.

Data: ``GET /hosts/{host}/selfcheck`` (latest probe results with fleet and history
scores, and findings) and ``GET /hosts/{host}`` (jobs it ran, how often it straggled,
incidents naming it). The layout builders here are pure: API results in, Dash
components out; the scoring and the history are the server's.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

import dash
from dash import Input, Output, dcc, html
from fleetscope.dashboard import palette
from fleetscope.dashboard.client import ApiClient, ApiResult
from fleetscope.dashboard.components import (
    card,
    kpi,
    message,
    result_message,
    severity_badge,
    table,
)

SELFCHECK_STATUS_COLORS = {
    "ok": palette.GREEN,
    "regressed": palette.ORANGE,
    "outlier": palette.ORANGE,
    "mismatch": palette.VERMILLION,
    "failed": palette.VERMILLION,
    "unknown": palette.GREY,
}
"""Badge colour of a host's / probe's self-check status (worst first: failed, mismatch,
outlier, regressed, ok)."""

PROBE_COLUMNS = ["probe", "device", "value", "of peak", "fleet ratio", "robust z",
                 "history ratio", "passed", "status"]
MAX_ROWS = 200


def layout(app: dash.Dash, host: str) -> html.Div:
    return html.Div(
        [
            dcc.Store(id="host-name", data=host),
            html.Div(
                [html.H2(host, style={"margin": "4px 0"}),
                 html.Div(message("loading self-check status…", "loading"), id="host-status")],
                className="fs-card",
            ),
            html.Div(message("loading host…", "loading"), id="host-body"),
        ]
    )


def register(app: dash.Dash, client: ApiClient) -> None:
    @app.callback(
        Output("host-status", "children"),
        Output("host-body", "children"),
        Input("tick", "data"),
        Input("host-name", "data"),
    )
    def host_view(_n, host):
        if not host:
            return message("no host selected"), []
        sc = client.host_selfcheck(host)
        hist = client.host(host)
        return status_line(sc), host_body(sc, hist, link=lambda p: app.get_relative_path(p))


def host_href(host: str) -> str:
    """Path of a host's page (relative to the dashboard root)."""
    return "/hosts/" + quote(str(host), safe="")


# ---- pure builders ----------------------------------------------------------------------
def status_badge(status: str) -> html.Span:
    color = SELFCHECK_STATUS_COLORS.get(str(status).lower(), palette.GREY)
    return html.Span(str(status), className="fs-badge", style={"background": color})


def _selfcheck_missing(res: ApiResult) -> bool:
    """A 404 from the host's self-check route that means "no results", not "no route"."""
    return res.status == 404 and not res.not_available


def selfcheck_hosts_panel(res: ApiResult, link=None) -> Any:
    """Hosts whose self-check is not ``ok`` (from ``GET /selfcheck/hosts``), each linked to
    its host page; a one-line "all N hosts pass" when none is flagged."""
    link = link or (lambda p: p)
    if not res.ok:
        if res.not_available:
            return message("this server does not provide host health or self-check results", "unavailable")
        return message(f"self-check summary: {res.error}", "error")
    hosts = (res.data or {}).get("hosts") or []
    if not hosts:
        return message("no self-check results yet: run `fleetscope selfcheck --server URL` on each host")
    bad = [h for h in hosts if h.get("status") != "ok"]
    if not bad:
        return message(f"all {len(hosts)} hosts pass their self-check")
    return table(
        ["host", "self-check", "findings", "last result"],
        [[dcc.Link(h.get("host", "?"), href=link(host_href(h.get("host", "?")))), status_badge(h.get("status", "?")),
          str(h.get("num_findings", 0)), _ts(h.get("last_ts_ns"))] for h in bad[:MAX_ROWS]],
        id="fleet-selfcheck-hosts",
    )


def status_line(sc: ApiResult) -> html.Div:
    """``self-check: <badge>`` (pass / outlier / failed ...) with the time of the last result."""
    if sc.ok and isinstance(sc.data, dict):
        status = str(sc.data.get("status", "unknown"))
        verdict = "pass" if status == "ok" else status
        return html.Div(["self-check ", status_badge(verdict),
                         html.Span(f"last result {_ts(sc.data.get('last_ts_ns'))}", className="fs-kpi-label")],
                        id="host-selfcheck-status")
    if _selfcheck_missing(sc):
        return html.Div(["self-check ", status_badge("unknown")], id="host-selfcheck-status")
    return html.Div(["self-check ", status_badge("not available")], id="host-selfcheck-status")


def host_body(sc: ApiResult, hist: ApiResult, link=None) -> html.Div:
    """Self-check card, findings card and history card for one host."""
    link = link or (lambda p: p)
    return html.Div(
        [
            card("Self-check: latest probe results", selfcheck_table(sc)),
            card("Self-check findings", findings_panel(sc)),
            card("History across jobs", history_panel(hist, link)),
        ]
    )


def selfcheck_table(sc: ApiResult) -> Any:
    if _selfcheck_missing(sc):
        return message("no self-check results for this host yet: run `fleetscope selfcheck --server URL`")
    if not sc.ok:
        return result_message(sc, "self-check results")
    probes = (sc.data or {}).get("probes") or []
    if not probes:
        return message("no self-check results for this host yet")
    rows, classes = [], []
    for p in probes[:MAX_ROWS]:
        status = str(p.get("status", "ok"))
        variant = p.get("variant") or ""
        rows.append([
            p.get("probe", "?") + (f" ({variant})" if variant else ""),
            p.get("device", ""),
            _value(p.get("value"), p.get("unit")),
            _pct(p.get("peak_fraction")),
            _num(p.get("ratio_to_median"), 3, suffix=f" (n={p.get('fleet_samples', 0)})"),
            _num(p.get("robust_z"), 2),
            _num(p.get("ratio_to_history"), 3, suffix=f" (n={p.get('history_runs', 0)})"),
            "yes" if p.get("passed", True) else "NO",
            status_badge(status),
        ])
        classes.append("" if status == "ok" else "fs-lag")
    return table(PROBE_COLUMNS, rows, row_class=classes, id="host-probes")


def findings_panel(sc: ApiResult) -> Any:
    if not sc.ok:
        return message("not available: no self-check results" if _selfcheck_missing(sc)
                       else "not available", "empty" if _selfcheck_missing(sc) else "unavailable")
    findings = (sc.data or {}).get("findings") or []
    if not findings:
        return message("no findings: every probe is within the fleet and its own history")
    items = []
    for f in findings[:MAX_ROWS]:
        evidence = f.get("evidence") or {}
        items.append(html.Div(
            [
                html.Div([severity_badge(f.get("severity", "")), html.B(f.get("kind", "")), " ",
                          f.get("summary", "")]),
                html.Div(f"{f.get('probe', '')} on {f.get('device', '')}: value {_num(f.get('value'), 4)}, "
                         f"reference {_num(f.get('reference'), 4)}, ratio {_num(f.get('ratio'), 3)}, "
                         f"score {_num(f.get('score'), 2)}", className="fs-kpi-label"),
                html.Pre(json.dumps(evidence, indent=1, sort_keys=True, default=str), className="fs-evidence")
                if evidence else None,
            ],
            className="fs-finding",
        ))
    return html.Div(items, id="host-findings")


def history_panel(hist: ApiResult, link=None) -> Any:
    link = link or (lambda p: p)
    if not hist.ok:
        if hist.not_available:
            return message("this server does not provide host history", "unavailable")
        if hist.status == 404:
            return message(f"no jobs or incidents for this host: {hist.error}")
        return message(f"host history: {hist.error}", "error")
    d = hist.data or {}
    kpis = html.Div(
        [kpi("jobs", str(d.get("num_jobs", 0))),
         kpi("jobs it straggled in", str(d.get("num_straggler_jobs", 0))),
         kpi("straggler rate", _pct(d.get("straggler_rate")))],
        className="fs-row", id="host-kpis",
    )
    jobs = d.get("jobs") or []
    job_rows = [
        [dcc.Link(j.get("job", "?"), href=link("/jobs/" + quote(str(j.get("job", "")), safe=""))),
         str(j.get("attempt", 0)),
         ", ".join(str(r) for r in (j.get("ranks") or [])[:16]),
         str(j.get("num_steps", "-")),
         _ts(j.get("last_ns")),
         "; ".join(f"{k} ×{n}" for k, n in sorted((j.get("incidents") or {}).items())) or "-"]
        for j in jobs[:MAX_ROWS]
    ]
    job_part = (table(["job", "attempt", "ranks", "steps", "last seen", "incidents"], job_rows, id="host-jobs")
                if job_rows else message("no jobs ran on this host in the window"))
    incs = d.get("incidents") or []
    inc_part = (
        table(["severity", "job", "what", "status", "opened"],
              [[severity_badge(i.get("severity", "")), i.get("job", ""),
                dcc.Link(i.get("summary") or i.get("kind", ""), href=link(f"/incidents/{i.get('id')}")),
                i.get("status", ""), _ts(i.get("opened_ns"))] for i in incs[:MAX_ROWS]],
              id="host-incidents")
        if incs else message("no incidents named this host")
    )
    return html.Div([kpis, html.H4("Jobs"), job_part, html.H4("Incidents"), inc_part])


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _num(x: Any, digits: int = 2, suffix: str = "") -> str:
    v = _finite(x)
    return "-" if v is None else f"{v:.{digits}f}{suffix}"


def _pct(x: Any) -> str:
    v = _finite(x)
    return "-" if v is None else f"{100 * v:.1f}%"


def _value(x: Any, unit: Any) -> str:
    v = _finite(x)
    return "-" if v is None else f"{v:.4g} {unit or ''}".strip()


def _ts(ns: Any) -> str:
    v = _finite(ns)
    if v is None or v <= 0:
        return "-"
    return datetime.fromtimestamp(v / 1e9, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
