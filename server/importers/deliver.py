"""Deliver imported records: to a server's ingest API, or straight into a store.

``--server URL`` posts Arrow batches to ``POST /api/v1/ingest`` with an idempotency
key derived from the content, so re-running an import stores nothing twice;
``--store URL`` writes the tables with the store client (an offline import into a chdb
directory no server holds). Progress goes to stderr.
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any

BATCH_ROWS = 50_000


class Progress:
    """A one-line progress bar on stderr (only when it is a terminal, or forced)."""

    def __init__(self, total: int, label: str, stream: Any = None, force: bool = False) -> None:
        self.total, self.label, self.done = max(1, int(total)), label, 0
        self.stream = stream or sys.stderr
        self.enabled = force or getattr(self.stream, "isatty", lambda: False)()
        self._last = 0.0

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            frac = min(1.0, self.done / self.total)
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label} [{bar:<30s}] {self.done}/{self.total}")
            if self.done >= self.total:
                self.stream.write("\n")
            self.stream.flush()


def _batches(tables: Mapping[str, list[dict[str, Any]]]) -> Iterable[tuple[str, list[dict]]]:
    for name, rows in tables.items():
        for i in range(0, len(rows), BATCH_ROWS):
            yield name, rows[i:i + BATCH_ROWS]


def deliver(tables: Mapping[str, list[dict[str, Any]]], *, server: str | None = None,
            store: str | None = None, token: str | None = None, label: str = "import") -> dict[str, int]:
    """Send ``{record type: rows}`` to a server or a store; rows written per type."""
    from fleetscope import codec
    from fleetscope.cli import CliError

    batches = list(_batches(tables))
    progress = Progress(len(batches), label)
    written: dict[str, int] = {}
    if server:
        import httpx

        from fleetscope.config import API_PREFIX

        headers = {"Content-Type": codec.ARROW_CONTENT_TYPE}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        with httpx.Client(base_url=server.rstrip("/"), timeout=120) as client:
            for name, rows in batches:
                body = codec.encode_batch({name: rows})
                key = "import-" + hashlib.sha256(body).hexdigest()[:40]
                try:
                    r = client.post(f"{API_PREFIX}/ingest", content=body,
                                    headers={**headers, "Idempotency-Key": key})
                except httpx.HTTPError as e:
                    raise CliError(f"cannot reach {server}: {e}") from None
                if r.status_code != 200:
                    raise CliError(f"server answered {r.status_code} for {name}: {r.text[:300]}")
                written[name] = written.get(name, 0) + len(rows)
                progress.advance()
    elif store:
        from fleetscope.server.store import Store

        from fleetscope.schema import record_type

        st = Store.open(store)
        try:
            for name, rows in batches:
                st.insert_arrow(name, codec.rows_to_table(record_type(name), rows))
                written[name] = written.get(name, 0) + len(rows)
                progress.advance()
        finally:
            st.close()
    return written
