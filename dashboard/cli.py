"""``fleetscope dashboard``: run the dashboard on its own, against any fleetscope API."""

from __future__ import annotations

import argparse

from fleetscope import env
from fleetscope.config import DEFAULT_HOST

DEFAULT_DASHBOARD_PORT = 8050

HELP = """\
Serve the fleetscope dashboard (Dash) as a standalone web app that reads everything
from a fleetscope server's REST API. The server also mounts the same dashboard at /ui,
so this is for running the UI on another machine or port.

pages: /  (fleet), /jobs/<job> (heat-map, 3D grid, timeline, hang view, hardware),
       /incidents (incidents, alert rules, webhooks)
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="serve the web dashboard against a fleetscope API",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--api", required=True, metavar="URL",
                   help="fleetscope server URL, e.g. http://127.0.0.1:8000 (the /api/v1 prefix is added)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_DASHBOARD_PORT,
                   help=f"port to serve on (default {DEFAULT_DASHBOARD_PORT})")
    p.add_argument("--refresh", type=float, default=None, metavar="SECONDS",
                   help="live-update interval in seconds; 0 disables live updates "
                        f"(default ${env.UI_REFRESH_S.name}, else {env.UI_REFRESH_S.default:g})")
    p.add_argument("--token", default=None,
                   help="bearer token, if the server requires one (or FLEETSCOPE_TOKEN). Every browser "
                        "that reaches this standalone dashboard acts with it, so it may only bind "
                        "loopback; for many users open the server's /ui, which has a login page")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:

    from fleetscope.cli import CliError

    from .client import normalize_api_base

    try:
        api = normalize_api_base(args.api)
    except ValueError as e:
        raise CliError(f"--api: {e}") from None
    if not 0 < args.port < 65536:
        raise CliError(f"--port: {args.port} is not a TCP port (1-65535)")
    if args.refresh is None:
        try:
            args.refresh = env.UI_REFRESH_S.get()
        except ValueError as e:
            raise CliError(str(e)) from None
    if args.refresh < 0:
        raise CliError(f"--refresh: {args.refresh} must be >= 0")
    from .app import create_dash_app

    token = args.token or env.TOKEN.get()
    if token and args.host not in ("127.0.0.1", "localhost", "::1"):
        raise CliError(f"--host {args.host}: a standalone dashboard with a token lends it to every "
                       "browser that reaches it; bind loopback or use the server's /ui (login page)")
    app = create_dash_app(api, url_base_pathname="/", refresh_s=args.refresh, token=token)
    print(f"fleetscope dashboard on http://{args.host}:{args.port}/  (API {api})", flush=True)
    app.run(host=args.host, port=args.port, debug=False)
    return 0
