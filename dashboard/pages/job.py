"""The job page layout: header, controls, heat-map, 3D grid, hang view, timeline,
rank detail with the hardware panel. The callbacks are in :mod:`.job_callbacks`."""

from __future__ import annotations

from typing import Any

import dash
from dash import dcc, html
from fleetscope.dashboard.components import card, message
from fleetscope.dashboard.figures.common import message_dict

METRIC_OPTIONS = [
    ("step", "step time"),
    ("own", "own work (step − comm)"),
    ("compute", "compute time"),
    ("comm", "communication + wait"),
    ("comm_pp", "PP wait + transfer"),
    ("comm_tp", "TP communication"),
    ("comm_dp", "DP communication"),
    ("dataloader", "data loading"),
    ("optimizer", "optimizer"),
    ("idle", "untimed"),
    ("gpu_temp", "GPU temperature"),
    ("gpu_power", "GPU power"),
    ("gpu_clock", "GPU SM clock"),
    ("gpu_util", "GPU utilisation"),
]

GRAPH_CONFIG = {"displaylogo": False, "responsive": True}


def _int(query: dict[str, str], key: str) -> int | None:
    v = query.get(key, "")
    return int(v) if v.isdigit() else None


def _graph(id_: str, text: str, height: int) -> dcc.Graph:
    # The explicit loading state is the placeholder figure; live refreshes then replace
    # the figure in place, without a spinner flashing over a readable chart.
    return dcc.Graph(id=id_, figure=message_dict(text, "loading", height=height), config=GRAPH_CONFIG)  # type: ignore[arg-type]  # dash stubs: Config TypedDict


def initial_view(query: dict[str, str]) -> dict[str, Any]:
    """Heat-map view state from the URL ``query``: what the page's controls start with."""
    metric = query.get("metric", "own")
    if metric not in dict(METRIC_OPTIONS):
        metric = "own"
    return {"metric": metric, "agg": query.get("agg", "max"), "from_step": _int(query, "from"),
            "to_step": _int(query, "to")}  # fmt: skip


def layout(app: dash.Dash, job: str, query: dict[str, str]) -> html.Div:
    """The job page for ``job``, with view state from the URL ``query``."""
    rank, step = _int(query, "rank"), _int(query, "step")
    selection: dict[str, Any] = {"rank": rank, "step": step} if rank is not None else {}
    view = initial_view(query)
    metric = view["metric"]
    return html.Div(
        [
            dcc.Store(id="job-id", data=job),
            dcc.Store(id="sel", data=selection),
            # ``sel`` once a rank is selected: the rank panel's trigger, so a page without
            # a selection makes no REST call for it (see ``job_callbacks``).
            dcc.Store(id="sel-rank", data=None),
            dcc.Store(id="diag", data={}),
            dcc.Store(id="hm-meta", data={}),
            dcc.Store(id="grid-meta", data={}),
            dcc.Store(id="views-ready", data=0),
            dcc.Store(id="grid-ranks", data=None),
            dcc.Download(id="trace-download"),
            html.Div(
                [
                    card(None, html.Div(message("loading job…", "loading"), id="job-header"), style={"flex": "1.2"}),
                    card(None, _graph("trend", "loading step times…", 200), style={"flex": "1"}),
                ],
                className="fs-row",
            ),
            card(
                None,
                html.Div(
                    [
                        html.Div([html.Label("heat-map metric"), dcc.Dropdown(
                            id="metric", options=[{"label": b, "value": a} for a, b in METRIC_OPTIONS],
                            value=metric, clearable=False, style={"width": "230px"})]),
                        html.Div([html.Label("cell aggregate"), dcc.Dropdown(
                            id="agg", options=["max", "mean", "min"], value=view["agg"],
                            clearable=False, style={"width": "100px"})]),
                        html.Div([html.Label("from step"), dcc.Input(
                            id="from-step", type="number", min=0, value=view["from_step"], debounce=True,
                            placeholder="auto")]),
                        html.Div([html.Label("to step"), dcc.Input(
                            id="to-step", type="number", min=0, value=view["to_step"], debounce=True,
                            placeholder="latest")]),
                        html.Div([html.Label("timeline ranks"), dcc.Input(
                            id="ranks", type="text", value=query.get("ranks", ""), debounce=True,
                            placeholder="e.g. 0,4 or pp.dp0.tp0")], className="fs-ranks"),
                        html.Button("Export trace (Perfetto)", id="export-btn", className="fs-btn fs-secondary"),
                        dcc.Link("share / deep link", href="", id="deep-link"),
                    ],
                    className="fs-controls",
                ),
            ),
            html.Div(
                [
                    card(None, _graph("heatmap", "loading heat-map…", 460), style={"flex": "1.5"}),
                    card(None, _graph("grid", "loading topology…", 460), style={"flex": "1"}),
                ],
                className="fs-row",
            ),
            html.Div(card("Hang", message("checking for a hang…", "loading")), id="hang-panel"),
            card(None, _graph("timeline", "loading timeline…", 320)),
            html.Div(
                [
                    card("Selected rank", html.Div(message("click a heat-map or grid cell to select a rank"),
                                                   id="rank-panel"), style={"flex": "0.6"}),
                    card(None, _graph("hardware", "select a rank for its GPU / NIC metrics", 300), style={"flex": "1.4"}),
                ],
                className="fs-row",
            ),
            html.Div(id="export-status", className="fs-msg"),
        ]
    )


def register(app: dash.Dash, client, prefetcher=None) -> None:
    """Register the job page callbacks (kept in :mod:`.job_callbacks`)."""
    from fleetscope.dashboard.pages import job_callbacks

    job_callbacks.register(app, client, prefetcher)


def prefetch(prefetcher, client, job: str, query: dict[str, str], wrap=lambda f: f) -> None:
    """Start the heat-map and grid calls of the job page the browser is loading;
    ``wrap`` prepares each call for its worker thread (e.g. carries the request context)."""
    from fleetscope.dashboard.pages import job_callbacks

    for key, call in job_callbacks.first_calls(client, job, initial_view(query)).items():
        prefetcher.start(key, wrap(call))
