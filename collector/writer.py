"""The single ingest writer: coalesces accepted batches into large inserts, exactly once.

Request handlers decode and validate a batch, then :meth:`IngestWriter.submit` it and
wait; the writer answers only after the rows are in the store (or with an error), so
an acknowledged batch is never lost. One writer task does all inserts, one group of
batches at a time, on its own store client in its own thread.

Deduplication with coalescing
-----------------------------
A batch is identified by its ``Idempotency-Key``. Because several batches share one
``INSERT``, ClickHouse's per-insert ``insert_deduplication_token`` alone cannot tell
whether *one* batch was already written. So every stored row carries its batch id in
the hidden ``_batch`` column, and a materialized view on each record table writes
``(batch, table, rows)`` into ``ingest_batches`` as part of the same insert. The
registry is therefore written with the rows, never before or without them.

For each group the writer (the only writer, so nothing races it):

1. collapses batches with the same key inside the group (the later ones are answered
   as duplicates of the first);
2. looks the keys up in ``ingest_batches`` and drops every (batch, table) pair that is
   already stored: a retried batch is written only for the tables that are missing,
   which also repairs a batch whose earlier attempt failed half way across tables;
3. inserts one coalesced Arrow table per record type with an
   ``insert_deduplication_token`` derived from its (table, batch ids); a failed insert
   is retried once with the same token, so an insert that did land before the error
   is not written twice (the record tables and the rollup / registry views all have
   a non-replicated deduplication window);
4. upserts the SQL ``jobs`` rows of all batches, duplicates included (idempotent), so
   a retry also repairs a control-plane update that failed after the rows landed.

A batch is reported ``duplicate`` when every one of its tables was already stored.

Scope: the guarantee holds per writer. With several server replicas on one ClickHouse
server, a retry that reaches another replica *while* the first is still inserting the
same batch can be written twice; agents keep one connection to one replica, and a
retry only follows a failed or timed-out request, so this needs a timeout shorter
than an insert.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from fleetscope.server.store import queries
from fleetscope.server.store.ddl import BATCH_COLUMN

from .jobs_sync import upsert_jobs

log = logging.getLogger(__name__)


class Backpressure(Exception):
    """The queue is full; the client should retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: int, queued_rows: int) -> None:
        super().__init__(f"ingest queue full ({queued_rows} rows waiting); retry later")
        self.retry_after_s = retry_after_s


class WriteError(RuntimeError):
    """The store refused or failed the insert; nothing was acknowledged."""


@dataclass
class IngestResult:
    rows: dict[str, int]
    duplicate: bool


@dataclass
class _Pending:
    key: str
    tables: dict[str, pa.Table]
    num_rows: int
    future: asyncio.Future = field(repr=False)
    accepted_s: float = field(default_factory=time.monotonic, repr=False)
    """When the batch was queued (for the ingest-lag metric)."""


class IngestWriter:
    """Queue + single writer. ``start()``/``stop()`` run in the server's event loop.

    Args:
        store: the :class:`fleetscope.server.store.Store`.
        db: SQLAlchemy sessionmaker for the control plane (``jobs`` upserts).
        max_queue_rows: rows waiting beyond which :meth:`submit` raises Backpressure.
        max_insert_rows: most rows coalesced into one insert per table.
        linger_s: longest wait for more batches before writing a group that is
            still smaller than ``min_insert_rows`` (bigger inserts, fewer parts).
        min_insert_rows: a group this large is written without waiting.
        retry_after_s: advised client back-off on backpressure.
        insert_threads: record tables of one group inserted in parallel (each thread
            has its own store client; chdb runs inserts without holding the GIL).
    """

    def __init__(
        self,
        store: Any,
        db: Any,
        max_queue_rows: int = 8_000_000,
        max_insert_rows: int = 2_000_000,
        linger_s: float = 0.05,
        min_insert_rows: int = 200_000,
        retry_after_s: int = 1,
        insert_threads: int = 1,
    ) -> None:
        self.store = store
        self.db = db
        self.max_queue_rows = max_queue_rows
        self.max_insert_rows = max_insert_rows
        self.linger_s = linger_s
        self.min_insert_rows = min_insert_rows
        self.retry_after_s = retry_after_s
        self.clock_offsets: dict[str, dict[str, int]] = {}
        """host -> {"offset_ns", "updated_ns"}: the last clock offset each host sent."""
        self.host_seen_ns: dict[str, int] = {}
        """host -> server time of the latest batch received from it (its agent is alive
        and shipping, however far behind its records are)."""
        self.stats: dict[str, float] = {
            "batches": 0, "rows": 0, "inserts": 0, "duplicates": 0, "rejected_429": 0,
            "groups": 0, "write_s": 0.0, "lookup_s": 0.0, "insert_s": 0.0,
        }  # fmt: skip
        self.rows_by_table: dict[str, int] = {}
        """Record table -> rows written (duplicates not counted), for GET /metrics."""
        self.last_lag_s = 0.0
        """Accepted-to-stored seconds of the oldest batch of the latest written group."""
        self._queue: deque[_Pending] = deque()
        self._queued_rows = 0
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="fleetscope-writer")
        self.insert_threads = max(1, insert_threads)
        self._insert_pool = ThreadPoolExecutor(self.insert_threads, thread_name_prefix="fleetscope-insert")
        self._local = threading.local()
        self._client: Any = None
        self._closing = False

    # ---- lifecycle -----------------------------------------------------------------
    async def start(self) -> None:
        self._client = self.store.new_client()
        self._wakeup = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="fleetscope-ingest-writer")

    async def stop(self) -> None:
        """Write everything already accepted, then stop."""
        self._closing = True
        if self._wakeup:
            self._wakeup.set()
        if self._task:
            await self._task
        self._executor.shutdown(wait=True)
        self._insert_pool.shutdown(wait=True)

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    @property
    def oldest_queued_s(self) -> float:
        """Seconds the oldest batch not yet stored has waited (0 when none waits)."""
        try:
            return time.monotonic() - self._queue[0].accepted_s
        except IndexError:
            return 0.0

    # ---- submission ----------------------------------------------------------------
    async def submit(self, key: str | None, tables: dict[str, pa.Table]) -> IngestResult:
        """Queue a validated batch and wait until it is stored.

        Raises:
            Backpressure: the queue holds too many rows already.
            WriteError: the store failed; the batch may be retried with the same key.
        """
        num_rows = sum(t.num_rows for t in tables.values())
        if self._closing:
            raise Backpressure(self.retry_after_s, self._queued_rows)
        if self._queued_rows and self._queued_rows + num_rows > self.max_queue_rows:
            self.stats["rejected_429"] += 1
            raise Backpressure(self.retry_after_s, self._queued_rows)
        assert self._wakeup is not None, "IngestWriter.start() was not called"
        fut = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(key or f"auto-{uuid.uuid4().hex}", tables, num_rows, fut))
        self._queued_rows += num_rows
        self._wakeup.set()
        return await fut

    # ---- the writer ----------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._wakeup is not None
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self._linger()
            group = self._take_group()
            try:
                results = await loop.run_in_executor(self._executor, self._write_group, group)
            except Exception as e:  # answer every waiter; the loop keeps running
                log.exception("ingest write of %d batch(es) failed", len(group))
                err = WriteError(f"store write failed: {e}")
                for p in group:
                    if not p.future.done():
                        p.future.set_exception(err)
            else:
                for p, r in zip(group, results):
                    if not p.future.done():
                        p.future.set_result(r)
            finally:
                self._queued_rows -= sum(p.num_rows for p in group)

    async def _linger(self) -> None:
        """Wait up to ``linger_s`` while the queue holds fewer than ``min_insert_rows``."""
        assert self._wakeup is not None
        deadline = time.monotonic() + self.linger_s
        while not self._closing and self._queued_rows < self.min_insert_rows:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), left)
            except asyncio.TimeoutError:
                return

    def _take_group(self) -> list[_Pending]:
        group = [self._queue.popleft()]
        rows = group[0].num_rows
        while self._queue and rows + self._queue[0].num_rows <= self.max_insert_rows:
            p = self._queue.popleft()
            group.append(p)
            rows += p.num_rows
        return group

    def _write_group(self, group: list[_Pending]) -> list[IngestResult]:
        first: dict[str, _Pending] = {}
        for p in group:
            first.setdefault(p.key, p)
        t0 = time.perf_counter()
        written = queries.written_batches(self._client, list(first))
        self.stats["lookup_s"] += time.perf_counter() - t0
        by_table: dict[str, list[tuple[str, pa.Table]]] = {}
        for key, p in first.items():
            for name, table in p.tables.items():
                if table.num_rows and (key, name) not in written:
                    by_table.setdefault(name, []).append((key, table))
        t0 = time.perf_counter()
        if len(by_table) > 1 and self.insert_threads > 1:
            futures = [self._insert_pool.submit(self._insert, n, parts) for n, parts in by_table.items()]
            for f in futures:
                f.result()  # re-raises the first failure
        else:
            for name, parts in by_table.items():
                self._insert(name, parts)
        jobs = [p.tables["jobs"] for p in group if "jobs" in p.tables]
        if jobs and self.db is not None:
            upsert_jobs(self.db, jobs)
        results = []
        for p in group:
            rows = {n: t.num_rows for n, t in p.tables.items() if t.num_rows}
            dup = first[p.key] is not p or (bool(rows) and all((p.key, n) in written for n in rows))
            results.append(IngestResult(rows=rows, duplicate=dup))
        self.stats["groups"] += 1
        self.stats["write_s"] += time.perf_counter() - t0
        self.stats["batches"] += len(group)
        self.stats["rows"] += sum(p.num_rows for p in group)
        self.stats["duplicates"] += sum(r.duplicate for r in results)
        for name, parts in by_table.items():
            self.rows_by_table[name] = self.rows_by_table.get(name, 0) + sum(t.num_rows for _, t in parts)
        self.last_lag_s = time.monotonic() - min(p.accepted_s for p in group)
        return results

    def _thread_client(self) -> Any:
        local = self._local
        client = getattr(local, "client", None)
        if client is None:
            client = local.client = self.store.new_client()
        return client

    def _insert(self, name: str, parts: list[tuple[str, pa.Table]]) -> None:
        client = self._thread_client()
        table = with_batch_column(parts)
        digest = hashlib.sha256(name.encode())
        for key, _ in sorted(parts, key=lambda kp: kp[0]):
            digest.update(b"\0" + key.encode())
        settings = {
            "insert_deduplication_token": digest.hexdigest(),
            "deduplicate_blocks_in_dependent_materialized_views": 1,
            "max_partitions_per_insert_block": 1000,
        }
        for attempt in range(2):
            try:
                t0 = time.perf_counter()
                client.insert_arrow(name, table, settings=settings)
                self.stats["inserts"] += 1
                self.stats["insert_s"] += time.perf_counter() - t0
                log.debug("inserted %d rows into %s in %.3fs", table.num_rows, name, time.perf_counter() - t0)
                return
            except Exception:
                if attempt:
                    raise
                log.warning("insert into %s failed; retrying once with the same token", name, exc_info=True)


def with_batch_column(parts: list[tuple[str, pa.Table]]) -> pa.Table:
    """Concatenate tables (zero-copy) and add the ``_batch`` column of their batch ids.

    ``_batch`` is dictionary-encoded (it is ``LowCardinality(String)`` in the store):
    one small index chunk per part, no per-row Python objects.
    """
    keys = pa.array([k for k, _ in parts], pa.string())
    chunks = [
        pa.DictionaryArray.from_arrays(pa.array(np.full(t.num_rows, i, np.int32)), keys)
        for i, (_, t) in enumerate(parts)
    ]
    table = pa.concat_tables([t for _, t in parts]) if len(parts) > 1 else parts[0][1]
    col = pa.chunked_array(chunks, type=pa.dictionary(pa.int32(), pa.string()))
    return table.append_column(pa.field(BATCH_COLUMN, col.type, nullable=False), col)
