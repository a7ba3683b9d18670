"""``POST /api/v1/ingest``: telemetry batches from agents (Arrow IPC frames or JSON).

Answers 200 only after the rows are in the store; 400 malformed body, 413 too large,
415 wrong content type, 422 schema/value errors (the message names the field/row),
429 + ``Retry-After`` when the writer's queue is full, 503 if the store failed.
"""

from __future__ import annotations

import asyncio
import re
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fleetscope.collector import (
    Backpressure,
    BatchError,
    UnsupportedContentType,
    WriteError,
    decode_request,
    is_malformed,
)
from fleetscope.server.api.deps import CollectorDep, SettingsDep
from fleetscope.server.api.models import IngestResponse, JsonBatch

from fleetscope.codec import ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE

router = APIRouter(tags=["ingest"])

OPENAPI_MODELS = (JsonBatch,)
"""Models documented in OpenAPI components though no parameter uses them (raw body)."""

_KEY_RE = re.compile(r"^[\x21-\x7e]{1,200}$")
_THREAD_DECODE_BYTES = 256 * 1024
"""Bodies larger than this are decoded in a worker thread, off the event loop."""


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The body, or None when it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@router.post(
    "/ingest",
    response_model=IngestResponse,
    responses={400: {}, 413: {}, 415: {}, 422: {}, 429: {}, 503: {}},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                ARROW_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}},
                JSON_CONTENT_TYPE: {"schema": {"$ref": "#/components/schemas/JsonBatch"}},
            },
        }
    },
)
async def ingest(request: Request, collector: CollectorDep, settings: SettingsDep) -> JSONResponse:
    """Store one batch. Headers: ``Idempotency-Key`` (batch id, for dedup),
    ``X-Fleetscope-Host``, ``X-Fleetscope-Clock-Offset-Ns`` (added to every time column)."""
    h = request.headers
    key = h.get("idempotency-key")
    if key is not None and not _KEY_RE.match(key):
        return _error(400, "Idempotency-Key: 1 to 200 printable ASCII characters without spaces")
    host = h.get("x-fleetscope-host", "")
    offset_text = h.get("x-fleetscope-clock-offset-ns")
    offset = 0
    if offset_text is not None:
        try:
            offset = int(offset_text)
        except ValueError:
            return _error(400, f"X-Fleetscope-Clock-Offset-Ns: {offset_text!r} is not an integer")
        if abs(offset) > 10**18:
            return _error(400, f"X-Fleetscope-Clock-Offset-Ns: {offset} is out of range")
    body = await _read_body(request, settings.max_request_bytes)
    if body is None:
        return _error(413, f"request body larger than max_request_bytes={settings.max_request_bytes}")
    ct = h.get("content-type", "")
    try:
        if len(body) > _THREAD_DECODE_BYTES:
            tables = await asyncio.to_thread(decode_request, body, ct, host, offset)
        else:
            tables = decode_request(body, ct, host, offset)
    except UnsupportedContentType as e:
        return _error(415, str(e))
    except BatchError as e:
        return _error(400 if is_malformed(e) else 422, str(e))
    if host:
        collector.host_seen_ns[host] = time.time_ns()
    if host and offset_text is not None:
        collector.clock_offsets[host] = {"offset_ns": offset, "updated_ns": time.time_ns()}
    try:
        result = await collector.submit(key, tables)
    except Backpressure as e:
        return _error(429, str(e), {"Retry-After": str(e.retry_after_s)})
    except WriteError as e:
        return _error(503, str(e), {"Retry-After": str(collector.retry_after_s)})
    return JSONResponse({"accepted": True, "rows": result.rows, "duplicate": result.duplicate})
