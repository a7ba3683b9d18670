"""The FastAPI application factory.

``create_app(settings)`` builds the app; its lifespan opens the ClickHouse store
(running migrations), opens the control-plane DB (running Alembic), starts the ingest
writer and then every service factory in :func:`fleetscope.server.services.service_factories`.

Routes are found, not listed: every module in ``fleetscope.server.api.routes`` that
defines ``router`` (an ``APIRouter``) is included under ``/api/v1``; one that also
defines ``root_router`` gets it included at ``/`` (health checks). A module with
``PUBLIC = True`` is exempt from authentication; every other route needs the scope
:func:`fleetscope.server.api.deps.needed_scope` names (ingest / read / admin).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import pkgutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse
from fleetscope.server.settings import Settings
from fleetscope.server.state import ServerState

from fleetscope import __version__
from fleetscope.config import API_PREFIX

log = logging.getLogger("fleetscope.server")


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the fleetscope server app (API + collector + services).

    Args:
        settings: server settings; default: read from ``FLEETSCOPE_*`` env vars.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await _startup(app, settings)
        try:
            yield
        finally:
            await _shutdown(app)

    app = FastAPI(
        title="fleetscope",
        version=__version__,
        description="Observability and diagnosis for 3D-parallel LLM training fleets.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    ServerState.install(app, settings)
    models = include_routes(app)
    _bounded_integers(app)
    _document_models(app, models)
    _local_docs(app)
    if settings.ui:
        _mount_ui(app, settings)
    _add_guards(app, settings)
    return app


def _add_guards(app: FastAPI, settings: Settings) -> None:
    """Host/Origin checks for every request (see :mod:`fleetscope.server.api.guards`)."""
    from fleetscope.server.api.guards import HostOriginGuard, allowed_hosts

    app.add_middleware(HostOriginGuard, hosts=allowed_hosts(settings.allowed_hosts, settings.host),
                       explicit=bool(settings.allowed_hosts.strip()))


def include_routes(app: FastAPI) -> list[Any]:
    """Include every route module of ``fleetscope.server.api.routes``.

    Returns the pydantic models that modules list in ``OPENAPI_MODELS`` (bodies read
    raw, e.g. the ingest formats) for :func:`_document_models`.
    """
    from fleetscope.server.api import routes
    from fleetscope.server.api.deps import require_scope

    models: list[Any] = []
    for info in sorted(pkgutil.iter_modules(routes.__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{routes.__name__}.{info.name}")
        deps = [] if getattr(module, "PUBLIC", False) else [Depends(require_scope(info.name))]
        router = getattr(module, "router", None)
        if router is not None:
            app.include_router(router, prefix=API_PREFIX, dependencies=deps)
        root = getattr(module, "root_router", None)
        if root is not None:
            app.include_router(root, dependencies=deps)
        models.extend(getattr(module, "OPENAPI_MODELS", ()))
    return models


def _bounded_integers(app: FastAPI) -> None:
    """Client errors found by fuzzing that surfaced as 500: an integer parameter past 64
    bits (e.g. a path id of 40 digits) reaching the SQL driver, and a pydantic model a
    route validates itself (``PATCH /alerts/webhooks/{id}`` with ``min_severity: "x"``).
    Both are 422 naming the rule."""
    from fastapi.responses import JSONResponse

    async def overflow(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            {"detail": f"an integer parameter is out of range (it must fit in 64 bits): {str(exc)[:200]}"},
            status_code=422,
        )

    app.add_exception_handler(OverflowError, overflow)

    from pydantic import ValidationError

    async def invalid(request: Request, exc: Exception) -> JSONResponse:
        # a model a route validates itself from client data (e.g. PATCH fields): the
        # client's error, named, instead of a 500
        errs = exc.errors() if isinstance(exc, ValidationError) else []
        parts = [f"{'.'.join(str(x) for x in e.get('loc', ())) or 'body'}: {e.get('msg', '')}" for e in errs[:5]]
        return JSONResponse({"detail": "; ".join(parts) or str(exc)[:300]}, status_code=422)

    app.add_exception_handler(ValidationError, invalid)


def _document_models(app: FastAPI, models: list[Any]) -> None:
    """Add ``models`` (and the models they reference) to the OpenAPI components."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = generate()
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(js.pop("$defs", {}))
            comps[model.__name__] = js
        # routes answer 4xx as {"detail": "<message naming the field and the limit>"};
        # FastAPI's own request validation answers a list: document both
        err = comps.get("HTTPValidationError", {}).get("properties", {})
        if "detail" in err and "anyOf" not in err["detail"]:
            err["detail"] = {"anyOf": [err["detail"], {"type": "string"}], "title": "Detail"}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


class StoreDirError(Exception):
    """The embedded store's directory cannot be created or written."""


def check_store_dir(store_url: str) -> None:
    """For a ``chdb://`` store: create its directory if missing and prove it writable
    (root ignores permission bits, so a probe file is written, not ``os.access``).

    Raises:
        StoreDirError: naming the directory and the OS error.
    """
    import os
    import tempfile

    from fleetscope.server.store.url import parse_store_url

    url = parse_store_url(store_url)
    if url.scheme != "chdb":
        return
    try:
        os.makedirs(url.path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=url.path, prefix=".fleetscope-write-check-"):
            pass
    except OSError as e:
        raise StoreDirError(
            f"store directory {url.path!r} is not writable ({e.strerror or e}); pass --store "
            "chdb:///a/writable/dir or FLEETSCOPE_STORE_URL"
        ) from None


DOCS_ASSETS = "/docs-assets"
"""Swagger UI and ReDoc files, served from the installed ``fastapi-offline`` package so
``/docs`` and ``/redoc`` work on an air-gapped cluster (no CDN)."""


def _local_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` with every asset served by this server."""
    from pathlib import Path

    try:
        import fastapi_offline
    except ImportError:  # a venv made before the dependency was added: API works, no UI
        log.warning("package fastapi-offline is not installed: /docs and /redoc are off")
        return
    from fastapi.openapi.docs import (
        get_redoc_html,
        get_swagger_ui_html,
        get_swagger_ui_oauth2_redirect_html,
    )
    from fastapi.staticfiles import StaticFiles

    static = Path(fastapi_offline.__file__).parent / "static"
    app.mount(DOCS_ASSETS, StaticFiles(directory=static), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2 = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=f"{root}{oauth2}",
            swagger_js_url=f"{root}{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png",
        )  # fmt: skip

    @app.get(oauth2, include_in_schema=False)
    async def swagger_oauth2_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS}/favicon.png", with_google_fonts=False,
        )  # fmt: skip


def _mount_ui(app: FastAPI, settings: Settings) -> None:
    """The dashboard at ``/ui``, when the dashboard component is installed: found by name
    (:data:`fleetscope.components.DASHBOARD_MOUNT`), so the server imports nothing of it."""
    from fleetscope import components

    try:
        mount_dashboard = components.resolve(components.DASHBOARD_MOUNT)
    except (components.ComponentMissing, ImportError) as e:  # no dashboard extra: no /ui
        log.info("no dashboard at /ui: %s", e)
        return
    from fleetscope.server.api.deps import authority
    from fleetscope.server.api.guards import UiGate

    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    mount_dashboard(app, f"http://{host}:{settings.port}{API_PREFIX}")
    # the dashboard behind the API's authentication (login page, HttpOnly cookie)
    app.add_middleware(UiGate, path="/ui", authority=lambda: authority(app))


async def _startup(app: FastAPI, settings: Settings) -> None:
    from fleetscope.collector.writer import IngestWriter
    from fleetscope.server.db import open_db
    from fleetscope.server.services import service_factories
    from fleetscope.server.store import Store, diagnosis_query_settings

    store = await asyncio.to_thread(Store.open, settings.store_url, settings.ttl_days)
    app.state.store = store
    app.state.diagnosis_store = store.sibling(diagnosis_query_settings(settings.diagnosis_query_nice, store))
    app.state.db = await asyncio.to_thread(open_db, settings.db_url)
    collector = IngestWriter(
        store,
        app.state.db,
        max_queue_rows=settings.max_queue_rows,
        max_insert_rows=settings.max_insert_rows,
        linger_s=settings.coalesce_linger_ms / 1000,
        min_insert_rows=settings.min_insert_rows,
        retry_after_s=settings.retry_after_s,
        insert_threads=settings.insert_threads,
    )
    await collector.start()
    app.state.collector = collector
    services: list[Any] = []
    for factory in service_factories():
        service = factory(app)
        await service.start()
        services.append(service)
    app.state.services = services
    app.state.ready = True
    log.info("fleetscope server ready: store %s, db %s", store.url.redacted(), _redact_db(settings.db_url))


async def _shutdown(app: FastAPI) -> None:
    app.state.ready = False
    for service in reversed(app.state.services):
        try:
            await service.stop()
        except Exception:
            log.exception("stopping service %r failed", service)
    collector = app.state.collector
    if collector is not None:
        await collector.stop()
    store = app.state.store
    if store is not None:
        store.close()
    if app.state.diagnosis_store is not None:
        app.state.diagnosis_store.close()
    db = app.state.db
    if db is not None:
        db.kw["bind"].dispose()


def _redact_db(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)
