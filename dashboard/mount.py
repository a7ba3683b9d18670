"""Mount the dashboard in the fleetscope server at ``/ui``.

The Dash app is a Flask (WSGI) app; it is wrapped with ``a2wsgi.WSGIMiddleware`` (the
replacement Starlette recommends for its deprecated ``starlette.middleware.wsgi``) and
mounted on the FastAPI app. The dashboard still talks to the API over HTTP on loopback,
like any other client: it never imports the server.

Its REST calls carry the credential of the browser they serve (the ``Authorization``
header, or the token cookie the server's ``/ui/login`` set): never a token of the
server's own, so an unauthenticated browser gets nothing through the dashboard that
it could not get from the API directly (the server's ``UiGate`` turns it away first).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from fleetscope import env
from fleetscope.config import API_PREFIX, UI_COOKIE

UI_PATH = "/ui"
REFRESH_ENV = env.UI_REFRESH_S.name


def mount_dashboard(app: Any, api_base: str, refresh_s: float | None = None, path: str = UI_PATH) -> Any:
    """Mount the dashboard on an ASGI app (FastAPI/Starlette) at ``path``.

    Args:
        app: the server's FastAPI app.
        api_base: URL of the API as the dashboard should call it, e.g.
            ``http://127.0.0.1:8000/api/v1``. A port of 0 (the server picks a free
            port) is resolved per request from the port the request arrived on.
        refresh_s: live-update interval of the pages; default ``FLEETSCOPE_UI_REFRESH_S``
            from the environment, else 5 s.
        path: mount point.

    Returns:
        The Dash app.
    """
    from a2wsgi import WSGIMiddleware
    from fleetscope.dashboard.app import create_dash_app

    if refresh_s is None:
        refresh_s = env.UI_REFRESH_S.get()  # ValueError naming the variable
    base: Any = api_base
    parts = urlsplit(api_base)
    if parts.port == 0:
        base = _per_request_base(parts.scheme, parts.hostname or "127.0.0.1", parts.path or API_PREFIX)
    dash_app = create_dash_app(
        base, url_base_pathname=path.rstrip("/") + "/", refresh_s=refresh_s, mounted=True,
        credential=browser_credential,
    )
    app.mount(path, WSGIMiddleware(dash_app.server))
    return dash_app


def _per_request_base(scheme: str, host: str, prefix: str):
    def resolve() -> str:
        from flask import request

        port = request.environ.get("SERVER_PORT", "80")
        return f"{scheme}://{host}:{port}{prefix}"

    return resolve


def browser_credential() -> str | None:
    """The bearer token of the browser whose request is being served, if any."""
    from flask import has_request_context, request

    if not has_request_context():
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        return given.strip()
    return request.cookies.get(UI_COOKIE) or None
