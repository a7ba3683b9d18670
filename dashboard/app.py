"""The Dash application: navigation, URL routing, live refresh, and the pages.

``create_dash_app(api_base)`` builds a Dash app whose only data source is the REST API
at ``api_base`` (see :mod:`fleetscope.dashboard.client`). Pages:

* ``/``                -> fleet (jobs, open incidents, hosts with problems)
* ``/jobs/<job>``      -> one job; the query string holds the view state
  (``metric``, ``agg``, ``from``, ``to``, ``ranks``, ``rank``, ``step``) so every view
  is a deep link
* ``/incidents``, ``/incidents/<id>`` -> incidents, alert rules and webhooks
* ``/hosts/<host>``    -> one host: self-check results and its history across jobs
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs, unquote

import dash
from dash import Input, Output, State, dcc, html
from fleetscope.dashboard.client import ApiClient
from fleetscope.dashboard.components import message
from fleetscope.dashboard.pages import fleet, host, incidents, job

ASSETS = Path(__file__).parent / "assets"
BUSY_FLAGS = ("diag", "header", "list")
"""Callbacks with HTML/store outputs that flag themselves busy, so a live refresh
never supersedes (and so starves) them on a slow server."""


def create_dash_app(
    api_base: str | Callable[[], str],
    url_base_pathname: str = "/ui/",
    refresh_s: float = 5.0,
    token: str | None = None,
    server: bool | object = True,
    mounted: bool = False,
) -> dash.Dash:
    """Build the dashboard.

    Args:
        api_base: server URL (``http://host:port`` or ``.../api/v1``), or a callable
            returning it per request (used when mounted on a server bound to port 0).
        url_base_pathname: where the app lives, ``/ui/`` when mounted in the server.
        refresh_s: live-update interval; 0 disables live updates.
        token: bearer token for the API, if the server requires one.
        server: a Flask app to attach to, or ``True`` for a new one.
        mounted: the WSGI app is mounted under ``url_base_pathname`` by an ASGI server
            that strips that prefix from the path (``SCRIPT_NAME``): routes are then
            served at ``/`` while the browser requests ``url_base_pathname``.
    """
    if refresh_s < 0:
        raise ValueError(f"refresh_s must be >= 0, got {refresh_s}")
    client = ApiClient(api_base, token=token)
    app = dash.Dash(
        __name__,
        server=server,
        **(
            {"requests_pathname_prefix": url_base_pathname, "routes_pathname_prefix": "/"}
            if mounted
            else {"url_base_pathname": url_base_pathname}
        ),
        assets_folder=str(ASSETS),
        suppress_callback_exceptions=True,
        title="fleetscope",
        update_title=None,
    )
    # plotly.js (4.8 MB) is an async chunk Dash fetches only when the first graph
    # mounts, after the layout round trips; preloading it overlaps that download with
    # them (a cold-cache job page is interactive about a second earlier).
    plotly_js = app.get_relative_path("/_dash-component-suites/plotly/package_data/plotly.min.js")
    app.index_string = app.index_string.replace(
        "{%css%}", f'<link rel="preload" href="{plotly_js}" as="script">\n        {{%css%}}', 1
    )
    app.layout = html.Div(
        [
            dcc.Location(id="url", refresh=False),
            dcc.Interval(id="refresh", interval=int(max(refresh_s, 0.5) * 1000), disabled=refresh_s == 0),
            dcc.Store(id="tick", data=0),
            # True while a slow, non-graph callback is in flight (set via ``running``).
            *[dcc.Store(id=f"busy-{name}", data=False) for name in BUSY_FLAGS],
            html.Nav(
                [
                    html.Span("fleetscope", className="fs-brand"),
                    dcc.Link("Fleet", href=app.get_relative_path("/"), id="nav-fleet"),
                    dcc.Link("Incidents", href=app.get_relative_path("/incidents"), id="nav-incidents"),
                    dcc.Checklist(
                        id="live-toggle",
                        options=[{"label": f" live ({refresh_s:g} s)", "value": "live"}],
                        value=["live"] if refresh_s > 0 else [],
                        className="fs-live",
                    ),
                ],
                className="fs-nav",
            ),
            html.Div(id="page", className="fs-page"),
        ]
    )

    @app.callback(Output("page", "children"), Input("url", "pathname"), State("url", "search"))
    def route(pathname: str | None, search: str | None):
        path = app.strip_relative_path(pathname or "/") or ""
        query = parse_query(search)
        parts = [unquote(p) for p in path.split("/") if p]
        if not parts:
            return fleet.layout(app)
        if parts[0] == "jobs" and len(parts) == 2:
            return job.layout(app, parts[1], query)
        if parts[0] == "incidents":
            return incidents.layout(app, parts[1] if len(parts) > 1 else None)
        if parts[0] == "hosts" and len(parts) == 2:
            return host.layout(app, parts[1])
        return message(f"no page at {pathname!r}; use the links above", "error")

    # Live refresh "ticks" only when no graph is still waiting for its previous update,
    # so a slow server is never buried under overlapping refreshes.
    app.clientside_callback(
        """function (n, ...busy) {
            if (busy.some(Boolean) || document.querySelector('[data-dash-is-loading="true"]')) {
                return window.dash_clientside.no_update;
            }
            return n;
        }""",
        Output("tick", "data"),
        Input("refresh", "n_intervals"),
        *[State(f"busy-{name}", "data") for name in BUSY_FLAGS],
        prevent_initial_call=True,
    )

    @app.callback(Output("refresh", "disabled"), Input("live-toggle", "value"))
    def toggle_live(value: list[str] | None) -> bool:
        return refresh_s == 0 or "live" not in (value or [])

    fleet.register(app, client)
    job.register(app, client)
    incidents.register(app, client)
    host.register(app, client)
    return app


def parse_query(search: str | None) -> dict[str, str]:
    """``?a=1&b=x`` -> ``{"a": "1", "b": "x"}`` (last value wins)."""
    q = parse_qs((search or "").lstrip("?"), keep_blank_values=False)
    return {k: v[-1] for k, v in q.items()}
