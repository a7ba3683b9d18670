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
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import dash
import flask
from dash import Input, Output, State, dcc, html
from dash.exceptions import PreventUpdate
from fleetscope.dashboard import plotly_bundle
from fleetscope.dashboard.client import ApiClient
from fleetscope.dashboard.components import message
from fleetscope.dashboard.pages import fleet, host, incidents, job
from fleetscope.dashboard.prefetch import Prefetcher

from fleetscope import env

ASSETS = Path(__file__).parent / "assets"
DCC = Path(dcc.__file__).parent
ASYNC_CHUNKS = ("async-graph.js", "async-dropdown.js")
"""dcc's lazily loaded components that the pages use (``dcc.Graph``, ``dcc.Dropdown``)."""
BUSY_FLAGS = ("diag", "header", "list")
"""Callbacks with HTML/store outputs that flag themselves busy, so a live refresh
never supersedes (and so starves) them on a slow server."""


def create_dash_app(
    api_base: str | Callable[[], str],
    url_base_pathname: str = "/ui/",
    refresh_s: float = env.UI_REFRESH_S.default,
    token: str | None = None,
    server: Any = True,
    mounted: bool = False,
    credential: Callable[[], str | None] | None = None,
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
        credential: per-request bearer token (the browser's own, when mounted in the
            server); used instead of ``token`` when it returns one.
    """
    if refresh_s < 0:
        raise ValueError(f"refresh_s must be >= 0, got {refresh_s}")
    client = ApiClient(api_base, token=token, credential=credential)
    prefixes: dict[str, Any] = (
        {"requests_pathname_prefix": url_base_pathname, "routes_pathname_prefix": "/"}
        if mounted
        else {"url_base_pathname": url_base_pathname}
    )
    app = dash.Dash(
        __name__,
        server=server,
        **prefixes,
        assets_folder=str(ASSETS),
        suppress_callback_exceptions=True,
        title="fleetscope",
        update_title=None,  # type: ignore[arg-type]  # dash's stub says str; None is documented
    )
    # plotly.js and the Graph/Dropdown code are async chunks Dash fetches only when the
    # first graph mounts; preloading them overlaps their download with the renderer's
    # own bundles and the layout request. plotly.js is the cartesian partial bundle
    # when it matches the installed plotly (see :mod:`.plotly_bundle`).
    chunks = [f"dash/dcc/{c}" for c in ASYNC_CHUNKS if (DCC / c).exists()]
    head = "".join(
        f'<link rel="preload" href="{app.get_relative_path(f"/_dash-component-suites/{p}")}" as="script">\n        '
        for p in chunks
    )
    if plotly_bundle.use_partial():
        bundle_route = plotly_bundle.route_path()
        app.server.add_url_rule(
            app.config.routes_pathname_prefix.rstrip("/") + bundle_route,
            "fleetscope_plotly_js",
            _serve_partial_plotly,
        )
        head += plotly_bundle.head_html(app.get_relative_path(bundle_route))
    else:
        full = app.get_relative_path("/_dash-component-suites/plotly/package_data/plotly.min.js")
        head += f'<link rel="preload" href="{full}" as="script">\n        '
    app.index_string = app.index_string.replace("{%css%}", head + "{%css%}", 1)

    def render(pathname: str | None, search: str | None):
        query = parse_query(search)
        parts = page_parts(app, pathname)
        if not parts:
            return fleet.layout(app)
        if parts[0] == "jobs" and len(parts) == 2:
            return job.layout(app, parts[1], query)
        if parts[0] == "incidents":
            return incidents.layout(app, parts[1] if len(parts) > 1 else None)
        if parts[0] == "hosts" and len(parts) == 2:
            return host.layout(app, parts[1])
        return message(f"no page at {pathname!r}; use the links above", "error")

    def shell() -> html.Div:
        # The page of the URL the browser is on comes with the layout itself (the
        # layout request's Referer names it): its own callbacks (the job page's
        # heat-map and grid) start at once, one server round trip earlier than with
        # a routing callback. Without a usable Referer the router renders it.
        first = page_of_referrer(app)
        if first is not None:
            prefetch_job_views(*first)
        return html.Div(
            [
                dcc.Location(id="url", refresh=False),
                # The pathname the server rendered into ``page`` with the layout.
                dcc.Store(id="page-rendered", data=first[0] if first else ""),
                # Not None: a Store set to None reports a data change when it mounts.
                dcc.Store(id="page-path", data=""),
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
                html.Div(render(*first) if first else message("loading…", "loading"), id="page",
                         className="fs-page"),
            ]
        )

    app.layout = shell

    # In the browser: the page the server rendered into the layout needs no round trip.
    # ``page-path`` is what the router last rendered ("": nothing yet).
    app.clientside_callback(
        """function (pathname, rendered, routed) {
            const dc = window.dash_clientside;
            if (!pathname || (!routed && pathname === rendered)) { throw dc.PreventUpdate; }
            return pathname;
        }""",
        Output("page-path", "data"),
        Input("url", "pathname"),
        State("page-rendered", "data"),
        State("page-path", "data"),
    )

    @app.callback(
        Output("page", "children"),
        Input("page-path", "data"),
        State("url", "search"),
        prevent_initial_call=True,
    )
    def route(pathname: str | None, search: str | None):
        if not pathname:
            raise PreventUpdate
        return render(pathname, search)

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

    app.clientside_callback(
        f"""function (value) {{ return {'true' if refresh_s == 0 else 'false'} || !(value || []).includes('live'); }}""",
        Output("refresh", "disabled"),
        Input("live-toggle", "value"),
    )

    # The job page's heat-map and grid calls start with the request for the layout:
    # its callbacks ask for them a few hundred ms later, after the layout is rendered.
    # (Started with the request for the page itself, they competed with the serving of
    # Dash's script bundles: the scripts arrived 150-400 ms later and the page became
    # interactive later, not earlier.)
    prefetcher = Prefetcher()
    app.server.extensions["fleetscope_prefetch"] = prefetcher

    def prefetch_job_views(pathname: str, search: str) -> None:
        parts = page_parts(app, pathname)
        if len(parts) == 2 and parts[0] == "jobs":
            # The request context goes along: an API URL resolved per request needs it.
            job.prefetch(prefetcher, client, parts[1], parse_query(search), wrap=flask.copy_current_request_context)

    fleet.register(app, client)
    job.register(app, client, prefetcher)
    incidents.register(app, client)
    host.register(app, client)
    return app


def _serve_partial_plotly():
    # Versioned URL: cached for a year, like Dash's fingerprinted bundles.
    resp = flask.Response(plotly_bundle.served_bytes(), mimetype="text/javascript")
    resp.headers["Cache-Control"] = "public, max-age=31536000, immutable"
    return resp


def page_parts(app: dash.Dash, pathname: str | None) -> list[str]:
    """Path segments of a dashboard page below the app's path (``[]`` for the fleet page)."""
    path = app.strip_relative_path(pathname or "/") or ""
    return [unquote(p) for p in path.split("/") if p]


def page_of_referrer(app: dash.Dash) -> tuple[str, str] | None:
    """``(pathname, search)`` of the dashboard page that requested the layout, from
    the request's ``Referer`` (same host, under the app's path); ``None`` otherwise
    (no request, no or a foreign Referer)."""
    if not flask.has_request_context():
        return None
    ref = urlsplit(flask.request.referrer or "")
    prefix = app.config.requests_pathname_prefix
    if ref.netloc != flask.request.host or not (ref.path + "/").startswith(prefix):
        return None
    return ref.path, ("?" + ref.query if ref.query else "")


def parse_query(search: str | None) -> dict[str, str]:
    """``?a=1&b=x`` -> ``{"a": "1", "b": "x"}`` (last value wins)."""
    q = parse_qs((search or "").lstrip("?"), keep_blank_values=False)
    return {k: v[-1] for k, v in q.items()}
