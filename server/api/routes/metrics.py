"""``GET /metrics``: the server's Prometheus metrics (text exposition format).

Behind the bearer token like every other route when one is set: give Prometheus a
read-only token (``authorization: {credentials_file: ...}`` in its scrape config).
What is exported and where it comes from: :mod:`fleetscope.server.metrics`.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from fleetscope.server.metrics import fleet_metrics
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

root_router = APIRouter(tags=["metrics"])


@root_router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    """Per-job step time, rate, MFU and diagnosis state, and the server's own health."""
    return Response(generate_latest(fleet_metrics(request.app)), media_type=CONTENT_TYPE_LATEST)
