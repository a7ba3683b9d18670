"""Job page callbacks: each one is a REST call followed by a pure figure/HTML builder."""

from __future__ import annotations

import time
from typing import Any

import dash
from dash import Input, Output, Patch, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate
from fleetscope.dashboard.client import ApiClient, items_of
from fleetscope.dashboard.components import (
    kpi,
    message,
    result_message,
    severity_badge,
    state_badge,
)
from fleetscope.dashboard.figures.common import fmt_ms, message_figure
from fleetscope.dashboard.figures.grid import build_grid, grid_culprit_traces
from fleetscope.dashboard.figures.heatmap import build_heatmap, culprit_trace, heatmap_meta
from fleetscope.dashboard.figures.timeline import build_timeline
from fleetscope.dashboard.figures.trends import build_hardware, build_trend
from fleetscope.dashboard.pages.hang import hang_panel, normalise_hang
from fleetscope.dashboard.pages.host import host_href
from fleetscope.dashboard.prefetch import Prefetcher

ACTIVE = ("open", "acknowledged")
HEATMAP_MAX_ROWS = 160
"""About one row per 3 px of the 460 px heat-map; more rows are invisible anyway."""
HEATMAP_MAX_COLS = 200
GRID_MAX_CELLS = 4096
STRAGGLER_KINDS = {"slow_compute", "slow_dataloader", "late_arrival", "gc_pause", "host_contention",
                   "straggler"}


def heatmap_params(metric: str, agg: str, from_step: int | None, to_step: int | None) -> dict[str, Any]:
    return {"metric": metric, "agg": agg, "from_step": from_step, "to_step": to_step,
            "max_rows": HEATMAP_MAX_ROWS, "max_cols": HEATMAP_MAX_COLS}  # fmt: skip


def heatmap_key(job: str, params: dict[str, Any]) -> tuple:
    return ("heatmap", job, tuple(sorted(params.items())))


def grid_key(job: str) -> tuple:
    return ("grid", job, GRID_MAX_CELLS)


def first_calls(client: ApiClient, job: str, view: dict[str, Any]) -> dict[tuple, Any]:
    """The calls the job page's first heat-map and grid callbacks make for ``view``
    (:func:`fleetscope.dashboard.pages.job.initial_view`), by prefetch key."""
    params = heatmap_params(view["metric"], view["agg"], view["from_step"], view["to_step"])
    return {
        heatmap_key(job, params): lambda: client.heatmap(job, **params),
        grid_key(job): lambda: client.grid(job, max_cells=GRID_MAX_CELLS),
    }


def _fig_error(res, what: str, height: int):
    state = "unavailable" if res.not_available else "error"
    text = f"this server does not provide {what}" if res.not_available else f"{what}: {res.error}"
    return message_figure(text, state, height=height)


def timeline_params(sel: dict | None, ranks: str | None, from_step: int | None, to_step: int | None) -> dict:
    """Rank set and step window of the timeline (and of the trace export).

    A selected cell shows its step; otherwise the last two steps of the chosen window.
    """
    sel = sel or {}
    params: dict[str, Any] = {"ranks": ranks or None, "rank": sel.get("rank")}
    if sel.get("step") is not None:
        params.update(from_step=sel["step"], to_step=sel["step"])
    elif to_step is not None:
        params.update(from_step=max(to_step - 1, from_step or 0), to_step=to_step)
    return params


def _ranks(item: dict) -> list[int]:
    ranks = item.get("ranks") or []
    if isinstance(ranks, str):
        ranks = [int(x) for x in ranks.strip("[]").split(",") if x.strip().lstrip("-").isdigit()]
    return [int(r) for r in ranks]


def _is_straggler(item: dict) -> bool:
    return str(item.get("kind", "")) in STRAGGLER_KINDS and bool(_ranks(item))


def _diag_culprits(diag: dict | None) -> list[int]:
    return [int(r) for r in (diag or {}).get("culprits", [])]


def register(app: dash.Dash, client: ApiClient, prefetcher: Prefetcher | None = None) -> None:
    def prefetched(key: tuple):
        """The result started for this page load (see :mod:`..prefetch`), if any."""
        return prefetcher.take(key) if prefetcher is not None else None

    # In the browser: the deep link is pure string work, not worth a server round trip
    # while the heat-map and grid are loading.
    app.clientside_callback(
        """function (metric, agg, from, to, ranks, sel, pathname) {
            const q = new URLSearchParams();
            const put = (k, v) => { if (v !== null && v !== undefined && v !== '') { q.append(k, v); } };
            put('metric', metric); put('agg', agg); put('from', from); put('to', to); put('ranks', ranks);
            put('rank', (sel || {}).rank); put('step', (sel || {}).step);
            const search = '?' + q.toString();
            return [search, pathname + search];
        }""",
        Output("url", "search"),
        Output("deep-link", "href"),
        Input("metric", "value"),
        Input("agg", "value"),
        Input("from-step", "value"),
        Input("to-step", "value"),
        Input("ranks", "value"),
        Input("sel", "data"),
        State("url", "pathname"),
    )

    # The heat-map and the grid are what an operator clicks first: they load alone.
    # Everything else (header, trend, diagnosis, timeline) waits until both are drawn
    # for this refresh, so those calls never compete with them for the server (one
    # store client, one Python process). ``views-ready`` changes once per refresh.
    app.clientside_callback(
        """function (hm, grid, prev) {
            const lo = Math.min((hm && hm.ts) || 0, (grid && grid.ts) || 0);
            if (!lo || lo <= (prev || 0)) { return window.dash_clientside.no_update; }
            return Math.max(hm.ts, grid.ts);
        }""",
        Output("views-ready", "data"),
        Input("hm-meta", "data"),
        Input("grid-meta", "data"),
        State("views-ready", "data"),
    )

    @app.callback(
        Output("job-header", "children"),
        Input("views-ready", "data"),
        State("job-id", "data"),
        running=[(Output("busy-header", "data"), True, False)],
    )
    def header(_ready, job):
        res = client.job(job)
        if not res.ok:
            return result_message(res, f"job {job!r}")
        j = res.data
        t = j.get("topology") or {}
        inc = client.incidents(job=job, status="active")
        open_inc = [i for i in items_of(inc.data) if i.get("job", job) == job and i.get("status", "open") in ACTIVE]
        incidents = (
            [html.Span([severity_badge(i.get("severity", "warning")), i.get("summary", i.get("kind", ""))[:90]],
                       style={"display": "block"}) for i in open_inc[:4]]
            if inc.ok else [html.Span("incidents not available" if inc.not_available else inc.error, className="fs-msg")]
        )
        rate = j.get("steps_per_s")
        ins = client.instrumentation(job)
        level = "-"
        if ins.ok:
            per_rank = ins.data.get("ranks") or {}
            level = ins.data.get("level", "?") + (f" ({len(per_rank)} rank(s) differ)" if per_rank else "")
        return html.Div(
            [
                html.Div([html.Span(j.get("name") or job, style={"fontSize": "20px", "fontWeight": 700}), " ",
                          state_badge(j.get("status", "?"))]),
                html.Div(
                    [
                        kpi("topology", f"DP {t.get('dp')} × PP {t.get('pp')} × TP {t.get('tp')}"),
                        kpi("ranks", f"{t.get('world_size', '?')}"),
                        kpi("step", "-" if j.get("last_step") is None else str(j["last_step"])),
                        kpi("step time", fmt_ms(1000.0 / rate) if rate else "-"),
                        kpi("MFU", "-" if j.get("mfu") is None else f"{100 * j['mfu']:.1f}%"),
                        kpi("active incidents", str(len(open_inc)) if inc.ok else "-", id="open-incident-count"),
                        kpi("instrumentation", level, id="instrumentation-level"),
                    ],
                    className="fs-kpis",
                ),
                html.Div(incidents or [html.Span("no active incidents", className="fs-msg")]),
            ]
        )

    @app.callback(Output("trend", "figure"), Input("views-ready", "data"), State("job-id", "data"))
    def trend(_ready, job):
        res = client.trend(job)
        return build_trend(res.data) if res.ok else _fig_error(res, "step-time trend", 200)

    # Diagnosis (and the timeline) load after the heat-map and grid: the page is usable
    # first, and the server's detectors never delay the heat-map of a large job.
    @app.callback(
        Output("diag", "data"),
        Input("views-ready", "data"),
        State("job-id", "data"),
        running=[(Output("busy-diag", "data"), True, False)],
    )
    def diagnosis(_meta, job):
        culprits: list[int] = []
        out: dict[str, Any] = {"ts": time.time()}
        s = client.stragglers(job)
        if s.ok:
            items = items_of(s.data, "stragglers", "findings")
            culprits += [int(f["ranks"][0]) for f in items if _is_straggler(f)]
            out["stragglers"] = items
        else:
            out["stragglers_error"] = "not available" if s.not_available else s.error
        # Open incidents keep a culprit marked after the detector's window moved on.
        inc = client.incidents(job=job, status="active")
        culprits += [
            int(_ranks(i)[0]) for i in items_of(inc.data)
            if i.get("job") == job and i.get("status", "open") in ACTIVE and _is_straggler(i)
        ]
        h = client.hang(job)
        hang = normalise_hang(h.data) if h.ok else None
        if hang and hang.get("stalled"):
            culprits += [int(r) for r in hang.get("culprits") or []]
        out["hang"] = hang
        out["hang_error"] = "" if h.ok else ("not available" if h.not_available else h.error)
        out["culprits"] = sorted(set(culprits))
        return out

    @app.callback(
        Output("heatmap", "figure"),
        Output("hm-meta", "data"),
        Input("metric", "value"),
        Input("agg", "value"),
        Input("from-step", "value"),
        Input("to-step", "value"),
        Input("tick", "data"),
        Input("sel", "data"),
        State("job-id", "data"),
        State("diag", "data"),
    )
    def heatmap(metric, agg, from_step, to_step, _n, sel, job, diag):
        params = heatmap_params(metric, agg, from_step, to_step)
        res = prefetched(heatmap_key(job, params)) or client.heatmap(job, **params)
        if not res.ok:
            return _fig_error(res, "the heat-map", 460), {"ts": time.time()}
        selected = (sel["rank"], sel["step"]) if sel and sel.get("step") is not None else None
        culprits = _diag_culprits(diag)
        meta = {**heatmap_meta(res.data), "culprits": culprits, "ts": time.time()}
        return build_heatmap(res.data, culprits, selected), meta

    @app.callback(
        Output("heatmap", "figure", allow_duplicate=True),
        Input("diag", "data"),
        Input("hm-meta", "data"),
        prevent_initial_call=True,
    )
    def mark_heatmap(diag, meta):
        # Only when the diagnosis changed after the heat-map was drawn with the old one.
        if not meta or not meta.get("row_labels") or meta.get("culprits") == _diag_culprits(diag):
            return no_update
        patch = Patch()
        patch["data"][1] = culprit_trace(meta, _diag_culprits(diag)).to_plotly_json()
        return patch

    @app.callback(
        Output("grid", "figure"),
        Output("grid-meta", "data"),
        Output("grid-ranks", "data"),
        Input("tick", "data"),
        Input("job-id", "data"),
        State("diag", "data"),
    )
    def grid(_n, job, diag):
        res = prefetched(grid_key(job)) or client.grid(job, max_cells=GRID_MAX_CELLS)
        if not res.ok:
            return _fig_error(res, "the topology grid", 460), {"ts": time.time()}, None
        culprits = _diag_culprits(diag)
        fig = build_grid(res.data, culprits)
        meta = dict((fig.get("layout", {}) if isinstance(fig, dict) else fig.layout.to_plotly_json()).get("meta") or {})
        meta.update(culprits=culprits, ts=time.time())
        return fig, meta, {"topology": res.data["topology"], "ranks": res.data.get("ranks", [])}

    @app.callback(
        Output("grid", "figure", allow_duplicate=True),
        Input("diag", "data"),
        Input("grid-meta", "data"),
        prevent_initial_call=True,
    )
    def mark_grid(diag, meta):
        if not meta or "overlay_start" not in meta or meta.get("culprits") == _diag_culprits(diag):
            return no_update
        patch = Patch()
        for i, trace in enumerate(grid_culprit_traces(meta, _diag_culprits(diag))):
            patch["data"][meta["overlay_start"] + i] = trace
        return patch

    @app.callback(Output("hang-panel", "children"), Input("diag", "data"), Input("grid-ranks", "data"))
    def hang(diag, grid_ranks):
        if diag and diag.get("hang_error"):
            return html.Div(message(f"hang analysis: {diag['hang_error']}",
                                    "unavailable" if diag["hang_error"] == "not available" else "error"),
                            className="fs-card")
        return hang_panel((diag or {}).get("hang"), grid_ranks)

    @app.callback(
        Output("sel", "data"),
        Input("heatmap", "clickData"),
        Input("grid", "clickData"),
        State("sel", "data"),
        prevent_initial_call=True,
    )
    def select(hm_click, grid_click, sel):
        click = hm_click if ctx.triggered_id == "heatmap" else grid_click
        if not click or not click.get("points"):
            return no_update
        p = click["points"][0]
        rank = p.get("customdata")
        if isinstance(rank, list):
            rank = rank[0] if rank else None
        if rank is None:
            return no_update
        step = p.get("x") if ctx.triggered_id == "heatmap" else None
        return {"rank": int(rank), "step": int(step) if step is not None else (sel or {}).get("step")}

    @app.callback(
        Output("timeline", "figure"),
        Input("sel", "data"),
        Input("ranks", "value"),
        Input("from-step", "value"),
        Input("to-step", "value"),
        Input("views-ready", "data"),
        State("job-id", "data"),
    )
    def timeline(sel, ranks, from_step, to_step, _ready, job):
        # Refetched even for a pinned step: a newer trigger supersedes the one in flight,
        # so skipping here could leave the panel without any answer.
        res = client.timeline(job, **timeline_params(sel, ranks, from_step, to_step))
        return build_timeline(res.data) if res.ok else _fig_error(res, "the timeline", 320)

    @app.callback(
        Output("trace-download", "data"),
        Output("export-status", "children"),
        Input("export-btn", "n_clicks"),
        State("sel", "data"),
        State("ranks", "value"),
        State("from-step", "value"),
        State("to-step", "value"),
        State("job-id", "data"),
        prevent_initial_call=True,
    )
    def export_trace(_clicks, sel, ranks, from_step, to_step, job):
        params = timeline_params(sel, ranks, from_step, to_step)
        res = client.trace(job, **params)
        if not res.ok:
            return no_update, message(f"trace export: {res.error}", "error")
        name = f"fleetscope-{job}-trace.json".replace("/", "_")
        return dcc.send_bytes(res.data, name), f"exported {len(res.data) / 1024:.0f} KiB as {name}"

    # The rank panel and hardware chart keep the layout's "select a rank" messages until
    # a rank is selected: while the page loads, no REST call and no redraw for them (Dash
    # still sends the callback once; it answers "no update" at once).
    app.clientside_callback(
        """function (sel) {
            if (!sel || sel.rank === null || sel.rank === undefined) { throw window.dash_clientside.PreventUpdate; }
            return sel;
        }""",
        Output("sel-rank", "data"),
        Input("sel", "data"),
    )

    @app.callback(
        Output("rank-panel", "children"),
        Output("hardware", "figure"),
        Input("sel-rank", "data"),
        Input("from-step", "value"),
        Input("to-step", "value"),
        State("job-id", "data"),
        State("grid-ranks", "data"),
        prevent_initial_call=True,
    )
    def rank_detail(sel, from_step, to_step, job, grid_ranks):
        if not sel or sel.get("rank") is None:
            raise PreventUpdate
        rank = int(sel["rank"])
        if sel.get("step") is not None:
            from_step, to_step = max(0, sel["step"] - 10), sel["step"] + 10
        res = client.hardware(job, rank=rank, from_step=from_step, to_step=to_step)
        state = next((d for d in (grid_ranks or {}).get("ranks", []) if d.get("rank") == rank), None)
        info = html.Div(
            [
                html.Div(f"rank {rank}", id="selected-rank", style={"fontSize": "20px", "fontWeight": 700}),
                html.Div(f"step {sel['step']}" if sel.get("step") is not None else "no step selected"),
                html.Div(["host ", dcc.Link(res.data["host"], href=app.get_relative_path(host_href(res.data["host"])))]
                         if res.ok and res.data.get("host") else ("host unknown" if res.ok else "")),
                html.Div(["state ", state_badge(state["state"] if state else "ok")]),
                html.Div(f"score {state['score']:.2f}" if state and state.get("score") else ""),
            ]
        )
        fig = build_hardware(res.data) if res.ok else _fig_error(res, "hardware metrics", 300)
        return info, fig
