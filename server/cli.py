"""``fleetscope server``: the API, the collector and the background services in one process."""

from __future__ import annotations

import argparse

HELP = """\
Run the fleetscope server: REST API (/api/v1, OpenAPI at /docs), the ingest collector
(POST /api/v1/ingest), the background services (diagnosis, alerts) and, unless
--no-ui, the dashboard at /ui.

Every option can also be set by environment variable (FLEETSCOPE_STORE_URL,
FLEETSCOPE_DB_URL, FLEETSCOPE_HOST, FLEETSCOPE_PORT, FLEETSCOPE_TOKEN,
FLEETSCOPE_TTL_DAYS, FLEETSCOPE_MAX_REQUEST_BYTES, ...); flags win over the environment.
"""

EPILOG = """\
examples:
  fleetscope server                                          # embedded store in ./.fleetscope/store
  fleetscope server --store chdb:///var/lib/fleetscope/store --port 8000
  fleetscope server --store http://default:secret@clickhouse:8123/fleetscope \\
                    --db postgresql+psycopg://fleetscope:secret@postgres/fleetscope \\
                    --host 0.0.0.0        # needs FLEETSCOPE_TOKEN when not on loopback
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "server",
        help="run the API + collector server",
        description=HELP,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--store",
        metavar="URL",
        help="ClickHouse store: chdb:///abs/dir, chdb://rel/dir (embedded; one process owns it) "
        "or http(s)://user:pass@host:8123/db (default ./.fleetscope/store)",
    )
    p.add_argument(
        "--db",
        metavar="URL",
        help="control-plane SQL database (SQLAlchemy URL), sqlite:///path or "
        "postgresql+psycopg://... (default sqlite:///./.fleetscope/control.db)",
    )
    p.add_argument("--host", metavar="H", help="interface to bind (default 127.0.0.1)")
    p.add_argument("--port", metavar="P", type=int, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--no-ui", action="store_true", help="do not mount the dashboard at /ui")
    p.set_defaults(func=run)
    register_worker(subparsers)


WORKER_HELP = """\
Run a diagnosis worker: the diagnosis loop (stragglers, hangs, MFU, silent jobs and
hosts -> incidents -> alert outbox) in its own process. `fleetscope server` starts one by
default (FLEETSCOPE_DIAGNOSIS_WORKER=process); run more for scale-out, with the server
started with FLEETSCOPE_DIAGNOSIS_WORKER=off or alongside its own. Workers lease each
job in the control-plane DB, so two never diagnose the same job at once.

With an embedded store (chdb://, owned by the server process) the worker reaches the
store through the server (--server URL, internal diagnosis query route); with a
ClickHouse server URL (http(s)://) it connects to it directly. The bearer token comes
from FLEETSCOPE_TOKEN (never from argv).
"""


def register_worker(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "worker", help="run a diagnosis worker process", description=WORKER_HELP,
        epilog="examples:\n  fleetscope worker --server http://127.0.0.1:8000 --db sqlite:///./.fleetscope/control.db\n"
               "  fleetscope worker --store http://default:secret@clickhouse:8123/fleetscope "
               "--db postgresql+psycopg://u:p@pg/fleetscope --server http://api:8000",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--server", metavar="URL", help="the fleetscope server (needed with a chdb:// store; "
                   "also used to wake the alert dispatcher and read agent delivery times)")
    p.add_argument("--store", metavar="URL", help="ClickHouse store URL (default FLEETSCOPE_STORE_URL)")
    p.add_argument("--db", metavar="URL", help="control-plane SQL database (default FLEETSCOPE_DB_URL)")
    p.add_argument("--parent-pid", metavar="PID", type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from fleetscope.cli import CliError

    ns = argparse.Namespace(store=args.store, db=args.db, host=None, port=None, no_ui=True)
    settings = build_settings(ns)
    if args.server is not None and not args.server.startswith(("http://", "https://")):
        raise CliError(f"--server {args.server!r}: expected http(s)://host:port")
    from fleetscope.server.alerts.outbox import OutboxSink
    from fleetscope.server.diagnosis.worker import run_worker as run
    from fleetscope.server.store.url import parse_store_url

    if parse_store_url(settings.store_url).embedded and not args.server:
        raise CliError(f"--store {settings.store_url!r} is embedded (owned by the server process): "
                       "give --server URL")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run(settings, args.server, OutboxSink(settings.public_url or ""), args.parent_pid))
    except KeyboardInterrupt:
        pass
    except RuntimeError as e:
        raise CliError(str(e)) from None
    return 0


def build_settings(args: argparse.Namespace):
    """Settings from the environment, overridden by the given flags."""
    from fleetscope.server.settings import Settings
    from fleetscope.server.store.url import StoreURLError
    from pydantic import ValidationError

    from fleetscope.cli import CliError

    overrides = {
        "store_url": args.store,
        "db_url": args.db,
        "host": args.host,
        "port": args.port,
    }
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if args.no_ui:
        overrides["ui"] = False
    try:
        return Settings(**overrides)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'settings'}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors())
        raise CliError(msgs) from None
    except StoreURLError as e:
        raise CliError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    from fleetscope.cli import CliError

    settings = build_settings(args)
    from fleetscope.server.app import StoreDirError, check_store_dir

    try:
        check_store_dir(settings.store_url)
    except StoreDirError as e:
        raise CliError(str(e)) from None
    try:
        serve(settings)
    except OSError as e:
        raise CliError(f"cannot serve on {settings.host}:{settings.port}: {e}") from None
    return 0


def serve(settings) -> None:
    """Run uvicorn (uvloop + httptools when installed) until interrupted."""
    import logging

    import uvicorn
    from fleetscope.server.app import create_app

    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    app = create_app(settings)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        loop=_pick("uvloop", "asyncio"),
        http=_pick("httptools", "h11"),
        log_level=settings.log_level,
        access_log=settings.log_level == "debug",
        timeout_graceful_shutdown=30,
    )


def _pick(preferred: str, fallback: str) -> str:
    import importlib.util

    return preferred if importlib.util.find_spec(preferred) else fallback
