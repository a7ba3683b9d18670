"""Typed FastAPI dependencies: ``StoreDep``, ``SessionDep``, ``SettingsDep``,
``CollectorDep``, and authentication: the static token and scoped tokens
(:mod:`fleetscope.server.tokens`), checked per route by :func:`require_scope`."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fleetscope.collector.writer import IngestWriter
from fleetscope.server import tokens
from fleetscope.server.settings import Settings
from fleetscope.server.store import Store
from fleetscope.server.tokens import Principal
from sqlalchemy.orm import Session


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    store = request.app.state.store
    if store is None:
        raise HTTPException(503, detail="store not open yet")
    return store


def get_diagnosis_store(request: Request) -> Store:
    """The diagnosis worker's handle on the store: its own client, so a worker's queries
    never queue behind the API's reads on the main client (chdb serialises the calls made
    on one handle)."""
    store = request.app.state.diagnosis_store
    return store if store is not None else get_store(request)


def get_collector(request: Request) -> IngestWriter:
    collector = request.app.state.collector
    if collector is None:
        raise HTTPException(503, detail="collector not started yet")
    return collector


def get_session(request: Request) -> Iterator[Session]:
    db = request.app.state.db
    if db is None:
        raise HTTPException(503, detail="control-plane database not open yet")
    with db() as session:
        yield session


class Authority:
    """Checks presented tokens: the static ``FLEETSCOPE_TOKEN`` (admin) and the scoped
    tokens of the control-plane DB (:mod:`fleetscope.server.tokens`).

    Authentication is on when the static token is set or any DB token was ever made.
    Look-ups are cached for ``settings.token_cache_s`` (a revoked token stops working
    within that time), so ingest from many agents costs no DB query per request.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._enabled: tuple[float, bool] = (-1e9, False)

    @property
    def ttl_s(self) -> float:
        return float(self.app.state.settings.token_cache_s)

    def _static(self) -> str | None:
        t = self.app.state.settings.token
        return None if t is None else t.get_secret_value()

    def enabled(self) -> bool:
        if self._static() is not None:
            return True
        now = time.monotonic()
        at, on = self._enabled
        if on or now - at < self.ttl_s:
            return on  # once on, it stays on (tokens are never deleted, only revoked)
        db = self.app.state.db
        if db is None:
            return on
        with db() as session:
            on = tokens.any_tokens(session)
        self._enabled = (now, on)
        return on

    def verify(self, given: str) -> Principal | None:
        """The principal of a presented token, or ``None``."""
        static = self._static()
        if static is not None and hmac.compare_digest(given.encode(), static.encode()):
            return tokens.ADMIN
        key = tokens.digest(given)
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        db = self.app.state.db
        if db is None:
            return None
        with db() as session:
            found = tokens.lookup(session, given)
        with self._lock:
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[key] = (now, found)
        return found

    def principal(self, headers: Any, cookie: str | None = None) -> Principal | None:
        """The principal of a request's ``Authorization: Bearer`` header (or ``cookie``);
        :data:`tokens.OPEN` when authentication is off; ``None`` when it fails."""
        if not self.enabled():
            return tokens.OPEN
        header = headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        given = given.strip() if scheme.lower() == "bearer" else ""
        if not given and cookie:
            given = cookie
        return self.verify(given) if given else None


def authority(app: Any) -> Authority:
    auth: Authority = app.state.authority
    return auth


ROUTE_SCOPES: dict[str, str] = {"ingest": "ingest", "clock": "any"}
"""Route modules (by name) that do not follow the method rule of :func:`needed_scope`:
``ingest`` needs the ingest scope, ``clock`` any valid token (agents align clocks)."""

ROUTE_METHOD_SCOPES: dict[str, dict[str, str]] = {"instrumentation": {"GET": "any"}}
"""Per-method exceptions: agents (ingest tokens) read a job's instrumentation level to
hand it to the hooks; changing it stays admin."""


def needed_scope(module: str, method: str) -> str:
    """The scope a route needs: see :data:`ROUTE_SCOPES`; else ``read`` for
    GET/HEAD/OPTIONS and ``admin`` for every other method."""
    special = ROUTE_SCOPES.get(module) or ROUTE_METHOD_SCOPES.get(module, {}).get(method)
    if special is not None:
        return special
    return "read" if method in ("GET", "HEAD", "OPTIONS") else "admin"


def _check_limits(request: Request, p: Principal) -> None:
    if p.jobs:
        job = request.path_params.get("job", request.query_params.get("job"))
        if job not in p.jobs:
            raise HTTPException(403, detail=f"this token is limited to jobs {sorted(p.jobs)}: "
                                f"the request must name one of them (job={job!r})")
    if p.hosts:
        host = request.path_params.get("host", request.query_params.get("host"))
        if host is None:
            host = request.headers.get("x-fleetscope-host")
        if host not in p.hosts:
            raise HTTPException(403, detail=f"this token is limited to hosts {sorted(p.hosts)}: "
                                f"the request must name one of them (host={host!r})")


def require_scope(module: str = "") -> Callable[[Request], Principal]:
    """A dependency: 401 without a valid token, 403 when its scope or limits do not
    cover the route (``module``: the route module's name, see :func:`needed_scope`)."""

    def check(request: Request) -> Principal:
        p = authority(request.app).principal(request.headers)
        if p is None:
            raise HTTPException(
                401, detail="missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"}
            )
        needed = needed_scope(module, request.method)
        if needed == "any" and p.scope in tokens.SCOPES or p.allows(needed):
            _check_limits(request, p)
            request.state.principal = p
            return p
        raise HTTPException(403, detail=f"this token's scope {p.scope!r} does not allow "
                            f"{request.method} {request.url.path} (needs {needed!r})")

    return check


def require_token(request: Request) -> Principal:
    """401 unless a valid token is presented; any scope (the generic check)."""
    return require_scope("clock")(request)


def optional_principal(request: Request) -> Principal | None:
    """The caller's principal without raising: ``None`` when unauthenticated."""
    try:
        return authority(request.app).principal(request.headers)
    except Exception:  # noqa: BLE001 - a DB hiccup means: not authenticated
        return None


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
DiagnosisStoreDep = Annotated[Store, Depends(get_diagnosis_store)]
SessionDep = Annotated[Session, Depends(get_session)]
CollectorDep = Annotated[IngestWriter, Depends(get_collector)]
TokenDep = Annotated[Principal, Depends(require_token)]
