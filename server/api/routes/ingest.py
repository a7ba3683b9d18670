"""``POST /api/v1/ingest``: telemetry batches from agents (Arrow IPC frames or JSON).

Answers 200 only after the rows are in the store; 400 malformed body or header, 409
Idempotency-Key already used by this host for other content, 413 too large (body,
decoded bytes, rows), 415 missing or wrong content type, 422 schema/value errors or a
batch the store refuses (the message names the field/row and the limit), 429 +
``Retry-After`` when the writer's queue or the in-flight bytes are full (decided from
the headers, before the body is read), 503 if the store failed.

Every 4xx but 429 carries ``X-Fleetscope-Retry: no``: the same bytes will never be
accepted, so a client must not retry them (the agent quarantines them).
"""

from __future__ import annotations

import asyncio
import re
import time

import pyarrow.compute as pc
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from fleetscope.collector import (
    Backpressure,
    BatchError,
    IngestLimits,
    KeyConflict,
    PoisonBatch,
    UnsupportedContentType,
    WriteError,
    content_digest,
    decode_request,
    is_malformed,
)
from fleetscope.server.api.deps import CollectorDep, SettingsDep
from fleetscope.server.api.models import IngestResponse, JsonBatch

from fleetscope.codec import ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE, LimitError

router = APIRouter(tags=["ingest"])

OPENAPI_MODELS = (JsonBatch,)
"""Models documented in OpenAPI components though no parameter uses them (raw body)."""

_KEY_RE = re.compile(r"^[\x21-\x7e]{1,200}$")
_HOST_RE = re.compile(r"^[\x21-\x7e]{1,200}$")
_THREAD_DECODE_BYTES = 256 * 1024
"""Bodies larger than this are decoded in a worker thread, off the event loop."""
NO_RETRY = {"X-Fleetscope-Retry": "no"}


def _error(status: int, detail: str, headers: dict[str, str] | None = None) -> JSONResponse:
    if 400 <= status < 500 and status != 429:
        headers = {**NO_RETRY, **(headers or {})}
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


class _TooLarge(Exception):
    pass


class _Busy(Exception):
    pass


async def _read_body(request: Request, limit: int, collector, inflight_limit: int, reserved: list[int]) -> bytes:
    """The body; raises _TooLarge past ``limit`` bytes, _Busy past the in-flight cap
    (a body without Content-Length is reserved chunk by chunk)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        if size > reserved[0]:
            extra = size - reserved[0]
            if not collector.reserve(extra, inflight_limit):
                raise _Busy
            reserved[0] += extra
        chunks.append(chunk)
    return b"".join(chunks)


def _foreign_hosts(principal, tables) -> tuple[str, list[str], list[str]] | None:
    """For a host-limited token: the first record type whose ``host`` column names a host
    outside the token's hosts, those hosts (sorted) and the allowed ones; else ``None``.
    Empty hosts were already filled from ``X-Fleetscope-Host`` (itself checked against the
    token), so only rows that claim another host are refused."""
    allowed = getattr(principal, "hosts", None)
    if not allowed:
        return None
    for name, table in tables.items():
        if "host" not in table.column_names or not table.num_rows:
            continue
        values = pc.unique(table.column("host")).to_pylist()
        bad = sorted(str(v) for v in values if v and v not in allowed)
        if bad:
            return name, bad, sorted(allowed)
    return None


def _busy(collector, why: str) -> JSONResponse:
    return _error(429, f"{why}; retry later", {"Retry-After": str(collector.retry_after_s)})


@router.post(
    "/ingest",
    response_model=IngestResponse,
    responses={400: {}, 409: {}, 413: {}, 415: {}, 422: {}, 429: {}, 503: {}},
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
    """Store one batch. Headers: ``Content-Type`` (required: Arrow stream or JSON),
    ``Idempotency-Key`` (batch id, for dedup; unique per sending host and bound to the
    content), ``X-Fleetscope-Host``, ``X-Fleetscope-Clock-Offset-Ns`` (added to every time
    column, at most ``max_clock_offset_s``)."""
    h = request.headers
    key = h.get("idempotency-key")
    if key is not None and not _KEY_RE.match(key):
        return _error(400, "Idempotency-Key: 1 to 200 printable ASCII characters without spaces")
    host = h.get("x-fleetscope-host", "")
    if host and not _HOST_RE.match(host):
        return _error(400, "X-Fleetscope-Host: 1 to 200 printable ASCII characters without spaces")
    offset_text = h.get("x-fleetscope-clock-offset-ns")
    offset = 0
    if offset_text is not None:
        try:
            offset = int(offset_text[:40])
        except ValueError:
            return _error(400, f"X-Fleetscope-Clock-Offset-Ns: {offset_text[:40]!r} is not an integer")
        if abs(offset) > settings.max_clock_offset_s * 1e9:
            return _error(
                400, f"X-Fleetscope-Clock-Offset-Ns: {offset} is more than max_clock_offset_s="
                f"{settings.max_clock_offset_s:g} seconds",
            )  # fmt: skip
    ct = h.get("content-type", "")
    ct_base = ct.split(";")[0].strip().lower()
    if ct_base not in (ARROW_CONTENT_TYPE, JSON_CONTENT_TYPE):
        return _error(
            415, f"Content-Type {ct[:100]!r} is not accepted: send {ARROW_CONTENT_TYPE} or {JSON_CONTENT_TYPE}"
        )
    # decided from the headers, before the body is read
    declared = h.get("content-length")
    length = int(declared) if declared is not None and declared.isdigit() and len(declared) < 19 else None
    if declared is not None and length is None:
        return _error(400, f"Content-Length: {declared[:40]!r} is not a byte count")
    if length is not None and length > settings.max_request_bytes:
        return _error(413, f"request body of {length} bytes is more than max_request_bytes={settings.max_request_bytes}")
    if collector.queue_full:
        collector.stats["rejected_429"] += 1
        if length:  # a batch refused for load still proves its host's agent is alive
            collector.note_agent(host, time.time_ns())
        return _busy(collector, f"ingest queue full ({collector.queued_rows} rows waiting)")
    reserved = [length or 0]
    if not collector.reserve(reserved[0], settings.max_inflight_bytes):
        if length:
            collector.note_agent(host, time.time_ns())
        return _busy(
            collector, f"{collector.inflight_bytes} request bytes in flight, "
            f"max_inflight_bytes={settings.max_inflight_bytes}",
        )  # fmt: skip
    try:
        return await _ingest_body(request, collector, settings, key, host, offset, offset_text, ct, reserved)
    finally:
        collector.release(reserved[0])


async def _ingest_body(request, collector, settings, key, host, offset, offset_text, ct, reserved) -> JSONResponse:
    token = collector.busy_begin(host)  # its agent is not silent while this one is in hand
    try:
        return await _handle_body(request, collector, settings, key, host, offset, offset_text, ct, reserved, token)
    finally:
        collector.busy_end(token)


async def _handle_body(request, collector, settings, key, host, offset, offset_text, ct, reserved,
                       token: int) -> JSONResponse:
    try:
        body = await _read_body(request, settings.max_request_bytes, collector, settings.max_inflight_bytes, reserved)
    except _TooLarge:
        return _error(413, f"request body larger than max_request_bytes={settings.max_request_bytes}")
    except _Busy:
        return _busy(collector, f"max_inflight_bytes={settings.max_inflight_bytes} request bytes in flight")
    limits = IngestLimits.from_settings(settings)

    def work(data: bytes):
        tables = decode_request(data, ct, host, offset, limits)
        return tables, (content_digest(tables) if key else "")

    try:
        if len(body) > _THREAD_DECODE_BYTES:
            tables, digest = await asyncio.to_thread(work, body)
        else:
            tables, digest = work(body)
    except UnsupportedContentType as e:
        return _error(415, str(e))
    except LimitError as e:
        return _error(413, str(e))
    except BatchError as e:
        return _error(400 if is_malformed(e) else 422, str(e))
    body = b""  # the decoded tables are what is kept while the write is waited for
    foreign = _foreign_hosts(getattr(request.state, "principal", None), tables)
    if foreign:
        table, hosts, allowed = foreign
        return _error(403, f"{table}.host: this token is limited to hosts {allowed}; the batch has rows "
                      f"for host {hosts[0]!r}" + (f" (and {len(hosts) - 1} other host(s))" if len(hosts) > 1 else ""))
    num_rows = sum(t.num_rows for t in tables.values())
    if num_rows:  # an empty request proves nothing about the host's agent or its jobs
        collector.busy_jobs(token, collector.note_arrival(host, tables, time.time_ns()))
    if host and offset_text is not None and num_rows:
        collector.clock_offsets[host] = {"offset_ns": offset, "updated_ns": time.time_ns()}
    try:
        result = await collector.submit(key, tables, scope=host, digest=digest)
    except Backpressure as e:
        return _error(429, str(e), {"Retry-After": str(e.retry_after_s)})
    except KeyConflict as e:
        return _error(409, str(e))
    except PoisonBatch as e:
        return _error(422, str(e))
    except WriteError as e:
        return _error(503, str(e), {"Retry-After": str(collector.retry_after_s)})
    return JSONResponse({"accepted": True, "rows": result.rows, "duplicate": result.duplicate})
