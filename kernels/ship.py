"""Send probe results to the server as ``probes`` records (``POST /api/v1/ingest``).

Uses only the standard library (``urllib``), so the kernels extra needs nothing beyond
torch. The body is the Arrow wire format of :mod:`fleetscope.codec` (or its JSON form);
the batch id goes in ``Idempotency-Key``, so a retried batch is stored once. A 429/503
is retried after the server's ``Retry-After``; other 4xx are not retried.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fleetscope import codec
from fleetscope.config import API_PREFIX


class ShipError(RuntimeError):
    """The server refused the batch or could not be reached; the message says why."""


def encode_probes(records: Sequence[Mapping[str, Any]], fmt: str) -> tuple[bytes, str]:
    """Encode ``probes`` rows as the wire body; returns (body, content type)."""
    rows = [dict(r) for r in records]
    if fmt == "arrow":
        return codec.encode_batch({"probes": rows}), codec.ARROW_CONTENT_TYPE
    if fmt == "json":
        return codec.encode_json({"probes": rows}), codec.JSON_CONTENT_TYPE
    raise ValueError(f"wire format {fmt!r}; expected arrow or json")


def ingest_url(server: str) -> str:
    """``http://h:8000`` -> ``http://h:8000/api/v1/ingest`` (validates the scheme)."""
    base = server.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"server URL {server!r} must start with http:// or https://")
    return base + API_PREFIX + "/ingest"


def ship_records(
    server: str,
    records: Sequence[Mapping[str, Any]],
    *,
    host: str,
    fmt: str = "arrow",
    batch_id: str | None = None,
    token: str | None = None,
    timeout_s: float = 30.0,
    attempts: int = 5,
) -> dict[str, Any]:
    """POST ``probes`` rows to the server; returns its JSON answer.

    Args:
        server: base URL, e.g. ``http://ctl:8000``.
        records: rows of the ``probes`` record type.
        host: sent as ``X-Fleetscope-Host``.
        fmt: ``arrow`` (default) or ``json``.
        batch_id: ``Idempotency-Key``; a fresh UUID by default.
        token: bearer token of a server that requires one.
        timeout_s: per-request timeout.
        attempts: tries for connection errors and 429/503.

    Raises:
        ShipError: refused (4xx other than 429) or unreachable after all attempts.
    """
    url = ingest_url(server)
    body, content_type = encode_probes(records, fmt)
    headers = {
        "Content-Type": content_type,
        "Idempotency-Key": batch_id or f"selfcheck-{uuid.uuid4()}",
        "X-Fleetscope-Host": host,
    }
    if token:
        headers["Authorization"] = f"Bearer {token}"
    last = ""
    for attempt in range(attempts):
        req = urllib.request.Request(url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read() or b"{}")  # type: ignore[no-any-return]
        except urllib.error.HTTPError as e:
            detail = _detail(e)
            if e.code not in (429, 503):
                raise ShipError(f"{url} refused the probe batch: HTTP {e.code}: {detail}") from None
            last = f"HTTP {e.code}: {detail}"
            wait = _retry_after(e.headers.get("Retry-After"), attempt)
        except (urllib.error.URLError, OSError) as e:
            last = str(getattr(e, "reason", e))
            wait = min(2.0**attempt * 0.5, 10.0)
        if attempt + 1 < attempts:
            time.sleep(wait)
    raise ShipError(f"could not ship probe results to {url} after {attempts} attempts: {last}")


def _detail(e: urllib.error.HTTPError) -> str:
    try:
        raw = e.read()
        doc = json.loads(raw)
        return str(doc.get("detail", doc)) if isinstance(doc, dict) else str(doc)
    except (ValueError, OSError):
        return e.reason if isinstance(e.reason, str) else str(e)


def _retry_after(value: str | None, attempt: int) -> float:
    try:
        return min(max(float(value or ""), 0.0), 30.0)
    except ValueError:
        return min(2.0**attempt * 0.5, 10.0)
