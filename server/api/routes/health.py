"""Liveness and readiness: ``/healthz`` and ``/readyz`` (also under ``/api/v1``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fleetscope.server.api.deps import optional_principal

PUBLIC = True  # never behind the bearer token: load balancers probe these

router = APIRouter(tags=["health"])
root_router = APIRouter(tags=["health"], include_in_schema=False)


async def healthz() -> dict[str, str]:
    """The process is up (says nothing about the store)."""
    return {"status": "ok"}


async def readyz(request: Request) -> JSONResponse:
    """200 once the store, the database and the collector are up; 503 before.

    The store (host, user, database), queue and ingest figures are shown only to a
    caller with a read or admin token (or to anyone when authentication is off)."""
    state = request.app.state
    if not state.ready:
        return JSONResponse({"status": "starting"}, status_code=503)
    collector = state.collector
    p = optional_principal(request)
    if p is None or p.scope not in ("read", "admin"):
        # unauthenticated (or an ingest token): up or not, nothing about the deployment
        return JSONResponse({"status": "ready"})
    return JSONResponse(
        {
            "status": "ready",
            "store": state.store.url.redacted(),
            "queued_rows": collector.queued_rows,
            "ingest": collector.stats,
        }
    )


for r in (router, root_router):
    r.add_api_route("/healthz", healthz, methods=["GET"])
    r.add_api_route("/readyz", readyz, methods=["GET"])
