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

Keys are scoped and bound to content
------------------------------------
The stored batch id is ``scope \x1f key \x1f digest``: ``scope`` is the sending host
(``X-Fleetscope-Host``), so two hosts may use the same key; ``digest`` is
:func:`content_digest` of the decoded rows, so a key re-used with other content is
answered :class:`KeyConflict` (HTTP 409) instead of being dropped as a duplicate. The
lookup in step 2 is one primary-key range per key (``scope \x1f key \x1f`` prefix).

Poison batches
--------------
When a coalesced group fails, each of its batches is written alone, so one bad batch
never fails the others. A batch that still fails alone while the store answers a
probe is *poison*: it is answered :class:`PoisonBatch` (HTTP 422, do not retry);
if the probe fails too the store is down and the batch gets :class:`WriteError` (503,
retry).

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
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fleetscope.server.store.ddl import BATCH_COLUMN, BATCHES_TABLE

from .jobs_sync import upsert_jobs

log = logging.getLogger(__name__)


class Backpressure(Exception):
    """The queue is full; the client should retry after ``retry_after_s``."""

    def __init__(self, retry_after_s: int, queued_rows: int) -> None:
        super().__init__(f"ingest queue full ({queued_rows} rows waiting); retry later")
        self.retry_after_s = retry_after_s


class WriteError(RuntimeError):
    """The store refused or failed the insert; nothing was acknowledged."""


class PoisonBatch(WriteError):
    """The store, otherwise healthy, refuses this batch: retrying it cannot help (422)."""


class KeyConflict(Exception):
    """The Idempotency-Key was already used by this host for different content (409)."""


MAX_JOBS_SEEN: Final = 10_000
"""Jobs whose latest arrival the writer remembers (the least recent are forgotten)."""
BUSY_MAX_S: Final = 120.0
"""A request in hand for longer than this no longer proves its sender alive (a write
stuck that long is the server's own failure, reported as such)."""

SEP: Final = "\x1f"
"""Separator of the parts of a stored batch id (cannot occur in a key or host header)."""


def stored_batch_id(scope: str, key: str, digest: str) -> str:
    """The ``_batch`` value of a batch: ``scope SEP key SEP digest``."""
    return f"{scope}{SEP}{key}{SEP}{digest}"


def content_digest(tables: dict[str, pa.Table]) -> str:
    """What a batch id is bound to: 16 hex digits of SHA-256 over an order-insensitive
    fingerprint of the decoded batch (per record type: rows, the wrapping sum of every
    integer column, the total length of every string column).

    Order-insensitive because an agent re-sending a pending batch after a restart
    re-reads its frames file by file and may concatenate them in another order than the
    first attempt; the rows are the same, so it must be the same batch.
    """
    h = hashlib.sha256()
    for name in sorted(tables):
        t = tables[name]
        if not t.num_rows:
            continue
        h.update(f"{name}:{t.num_rows}".encode())
        for col_name, col in zip(t.column_names, t.columns):
            if pa.types.is_integer(col.type):
                # int64 sums wrap; narrower ones sum into int64 as if cast first
                v = pc.sum(col).as_py()
            elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
                v = _string_bytes(col)
            else:
                continue
            h.update(f"|{col_name}={v}".encode())
    return h.hexdigest()[:16]


def _string_bytes(col: pa.ChunkedArray) -> int | None:
    """Total UTF-8 bytes of a string column, from each chunk's first and last offset (no
    compute call); ``None`` for an empty column, as ``pc.sum`` gives."""
    total, seen = 0, False
    for chunk in col.chunks:
        if len(chunk):
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets = np.frombuffer(chunk.buffers()[1], dtype=width)
            total += int(offsets[chunk.offset + len(chunk)]) - int(offsets[chunk.offset])
            seen = True
    return total if seen else None


@dataclass
class IngestResult:
    rows: dict[str, int]
    duplicate: bool


@dataclass
class _Pending:
    key: str
    """The stored batch id (see :func:`stored_batch_id`)."""
    tables: dict[str, pa.Table]
    num_rows: int
    future: asyncio.Future = field(repr=False)
    prefix: str = ""
    """``scope SEP key SEP`` of a client-keyed batch ('' for an auto key)."""
    client_key: str = ""
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
        self._host_seen: dict[str, int] = {}
        self._job_seen: dict[str, int] = {}
        self._busy: dict[int, tuple[str, frozenset[str], int]] = {}
        """Requests being handled: token -> (host, jobs, start time); see :meth:`busy_begin`."""
        self._busy_next = 0
        self.stats: dict[str, float] = {
            "batches": 0, "rows": 0, "inserts": 0, "duplicates": 0, "rejected_429": 0,
            "groups": 0, "write_s": 0.0, "lookup_s": 0.0, "insert_s": 0.0,
            "conflicts_409": 0, "poison_422": 0, "isolations": 0, "inflight_429": 0,
        }  # fmt: skip
        self.inflight_bytes = 0
        """Bytes of ingest requests being read, decoded or written (see :meth:`reserve`)."""
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
    def host_seen_ns(self) -> dict[str, int]:
        """host -> server time of the latest batch received from it (its agent is alive
        and shipping, however far behind its records are); now for a host whose request
        this server is still reading, decoding or writing (a copy)."""
        out = dict(self._host_seen)
        for host, _, t in self._live_busy():
            if host:
                out[host] = t
        return out

    @property
    def job_seen_ns(self) -> dict[str, int]:
        """job -> server time of the latest batch holding its rows (the job still reports,
        however far behind its records' own times are; at most ``MAX_JOBS_SEEN`` jobs);
        now for a job in a request this server is still working on (a copy)."""
        out = dict(self._job_seen)
        for _, jobs, t in self._live_busy():
            for job in jobs:
                out[job] = t
        return out

    def _live_busy(self) -> list[tuple[str, frozenset[str], int]]:
        """(host, jobs, now) of each request in hand that began less than ``BUSY_MAX_S``
        ago: while the server works on a request, its sender is not silent - on a
        starved host one write can take longer than the silence thresholds, and the agent
        sends its next batch only once this one is answered."""
        now = time.time_ns()
        return [(h, j, now) for h, j, t0 in list(self._busy.values()) if now - t0 < BUSY_MAX_S * 1e9]

    def busy_begin(self, host: str) -> int:
        """A request from ``host`` is being handled (until :meth:`busy_end`)."""
        self._busy_next += 1
        self._busy[self._busy_next] = (host, frozenset(), time.time_ns())
        return self._busy_next

    def busy_jobs(self, token: int, jobs: set[str]) -> None:
        """The jobs whose rows the request ``token`` holds (known once decoded)."""
        cur = self._busy.get(token)
        if cur is not None and jobs:
            self._busy[token] = (cur[0], frozenset(jobs), cur[2])

    def busy_end(self, token: int) -> None:
        """The request ``token`` is answered: its host and jobs were heard from until now."""
        cur = self._busy.pop(token, None)
        if cur is None:
            return
        host, jobs, t0 = cur
        now = time.time_ns()
        if host and t0 <= self._host_seen.get(host, 0):
            self._host_seen[host] = now  # heard from at arrival: a refused one stays refused
        for job in jobs:
            self._mark_job(job, now)

    def note_agent(self, host: str, now_ns: int) -> None:
        """``host``'s agent tried to deliver a batch that was refused for load (429): it is
        alive, only the server is behind, so the host counts as heard from."""
        if host:
            self._host_seen[host] = now_ns

    def note_arrival(self, host: str, tables: dict[str, pa.Table], now_ns: int) -> set[str]:
        """A batch with rows arrived from ``host``: when it (and each job in it) last did.
        Returns the jobs it holds rows of."""
        if host:
            self._host_seen[host] = now_ns
        jobs: set[str] = set()
        for t in tables.values():
            if t.num_rows and "job" in t.column_names:
                jobs.update(str(j) for j in pc.unique(t.column("job")).to_pylist() if j is not None)
        for job in jobs:
            self._mark_job(job, now_ns)
        return jobs

    def _mark_job(self, job: str, now_ns: int) -> None:
        seen = self._job_seen
        seen.pop(job, None)  # the most recent last: the oldest go first when full
        seen[job] = now_ns
        while len(seen) > MAX_JOBS_SEEN:
            seen.pop(next(iter(seen)))

    @property
    def queued_rows(self) -> int:
        return self._queued_rows

    @property
    def queue_full(self) -> bool:
        return self._closing or self._queued_rows >= self.max_queue_rows

    def reserve(self, nbytes: int, limit: int) -> bool:
        """Count ``nbytes`` of a request in flight unless that passes ``limit`` (one
        request is always let in, so a limit below one body never blocks everything)."""
        if self.inflight_bytes and self.inflight_bytes + nbytes > limit:
            self.stats["inflight_429"] += 1
            return False
        self.inflight_bytes += nbytes
        return True

    def release(self, nbytes: int) -> None:
        self.inflight_bytes = max(0, self.inflight_bytes - nbytes)

    @property
    def oldest_queued_s(self) -> float:
        """Seconds the oldest batch not yet stored has waited (0 when none waits)."""
        try:
            return time.monotonic() - self._queue[0].accepted_s
        except IndexError:
            return 0.0

    # ---- submission ----------------------------------------------------------------
    async def submit(
        self, key: str | None, tables: dict[str, pa.Table], scope: str = "", digest: str = ""
    ) -> IngestResult:
        """Queue a validated batch and wait until it is stored.

        Args:
            key: the client's Idempotency-Key (None: a fresh one).
            scope: who sent it (the host); keys are unique per scope.
            digest: :func:`content_digest` of the batch the key is bound to.

        Raises:
            Backpressure: the queue holds too many rows already.
            KeyConflict: ``key`` was used by ``scope`` for other content.
            PoisonBatch: the store refuses this batch (do not retry as it is).
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
        if key:
            prefix = f"{scope}{SEP}{key}{SEP}"
            pending = _Pending(prefix + (digest or "-"), tables, num_rows, fut, prefix, key)
        else:
            pending = _Pending(f"auto-{uuid.uuid4().hex}", tables, num_rows, fut)
        self._queue.append(pending)
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
                outcomes = await loop.run_in_executor(self._executor, self._write_isolated, group)
            except Exception as e:  # pragma: no cover - _write_isolated answers everything
                log.exception("ingest write of %d batch(es) failed", len(group))
                outcomes = [WriteError(f"store write failed: {e}")] * len(group)
            finally:
                self._queued_rows -= sum(p.num_rows for p in group)
            for p, r in zip(group, outcomes):
                if p.future.done():
                    continue
                if isinstance(r, BaseException):
                    p.future.set_exception(r)
                else:
                    p.future.set_result(r)

    async def _linger(self) -> None:
        """Wait while the queue holds fewer than ``min_insert_rows``, until its oldest
        batch has waited ``linger_s``.

        The deadline counts from the oldest batch's arrival, not from the end of the
        previous write: a batch that queued up during a write has already lingered,
        so a busy writer goes on at once (groups of about one write time's arrivals,
        latency at most ``linger_s`` plus one write), while an idle one gathers up to
        ``linger_s`` of arrivals into one insert (chDB's cost per insert group is
        fixed: fewer, larger groups).
        """
        assert self._wakeup is not None
        if not self._queue:
            return
        deadline = self._queue[0].accepted_s + self.linger_s
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

    def _write_isolated(self, group: list[_Pending]) -> list[IngestResult | BaseException]:
        """Write the group; if it fails, write each batch alone (poison isolation)."""
        try:
            return list(self._write_group(group))
        except Exception as e:
            if len(group) == 1:
                return [self._classify(group[0], e)]
            log.warning("coalesced insert of %d batches failed (%s); writing them one by one",
                        len(group), _short(e))
            self.stats["isolations"] += 1
        out: list[IngestResult | BaseException] = []
        for p in group:
            try:
                out.extend(self._write_group([p]))
            except Exception as e:
                out.append(self._classify(p, e))
        return out

    def _classify(self, p: _Pending, err: Exception) -> WriteError:
        """Poison (store healthy, this batch refused) or an outage (store failing)."""
        try:
            self._client.command("SELECT 1")
        except Exception:
            log.exception("store write failed and the store does not answer")
            return WriteError(f"store write failed: {_short(err)}")
        self.stats["poison_422"] += 1
        log.error("the store refuses batch %r (%d rows) while healthy: %s", p.client_key or p.key,
                  p.num_rows, _short(err))
        return PoisonBatch(
            f"the store refuses this batch ({_short(err)}); it cannot be stored as it is, do not retry it"
        )

    def _lookup(self, first: dict[str, _Pending]) -> tuple[set[tuple[str, str]], set[str]]:
        """(stored (batch id, table) pairs, stored batch ids) of client-keyed batches'
        scoped keys, whatever digest they were stored with."""
        keyed = [p for p in first.values() if p.prefix]
        written: set[tuple[str, str]] = set()
        for i in range(0, len(keyed), 200):
            chunk = keyed[i : i + 200]
            where = " OR ".join(f"(batch >= {{lo{j}:String}} AND batch < {{hi{j}:String}})" for j in range(len(chunk)))
            params: dict[str, str] = {}
            for j, p in enumerate(chunk):
                params[f"lo{j}"], params[f"hi{j}"] = p.prefix, p.prefix + "\x7f"
            sql = f"SELECT DISTINCT batch, `table` FROM {BATCHES_TABLE} WHERE {where}"
            rows = self._client.query(sql, parameters=params).result_rows
            written |= {(str(b), str(t)) for b, t in rows}
        return written, {b for b, _ in written}

    def _write_group(self, group: list[_Pending]) -> list[IngestResult | BaseException]:
        first: dict[str, _Pending] = {}
        conflicts: dict[int, KeyConflict] = {}
        by_prefix: dict[str, _Pending] = {}
        for p in group:
            if p.prefix:
                q = by_prefix.setdefault(p.prefix, p)
                if q.key != p.key:  # same host and key, other content, in this group
                    conflicts[id(p)] = self._conflict(p)
                    continue
            first.setdefault(p.key, p)
        t0 = time.perf_counter()
        written, stored_ids = self._lookup(first)
        self.stats["lookup_s"] += time.perf_counter() - t0
        for key, p in list(first.items()):
            if p.prefix and key not in stored_ids and any(b.startswith(p.prefix) for b in stored_ids):
                del first[key]
                for q in group:
                    if q.key == key:
                        conflicts[id(q)] = self._conflict(q)
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
        jobs = [p.tables["jobs"] for p in group if "jobs" in p.tables and id(p) not in conflicts]
        if jobs and self.db is not None:
            upsert_jobs(self.db, jobs)
        results: list[IngestResult | BaseException] = []
        for p in group:
            if id(p) in conflicts:
                results.append(conflicts[id(p)])
                continue
            rows = {n: t.num_rows for n, t in p.tables.items() if t.num_rows}
            dup = first[p.key] is not p or (bool(rows) and all((p.key, n) in written for n in rows))
            results.append(IngestResult(rows=rows, duplicate=dup))
        self.stats["groups"] += 1
        self.stats["write_s"] += time.perf_counter() - t0
        self.stats["batches"] += len(group)
        self.stats["rows"] += sum(p.num_rows for p in group)
        self.stats["duplicates"] += sum(isinstance(r, IngestResult) and r.duplicate for r in results)
        for name, parts in by_table.items():
            self.rows_by_table[name] = self.rows_by_table.get(name, 0) + sum(t.num_rows for _, t in parts)
        self.last_lag_s = time.monotonic() - min(p.accepted_s for p in group)
        return results

    def _conflict(self, p: _Pending) -> KeyConflict:
        self.stats["conflicts_409"] += 1
        scope = p.prefix.split(SEP, 1)[0]
        return KeyConflict(
            f"Idempotency-Key {p.client_key!r} was already used by host {scope!r} for different "
            "content; send new data under a new key"
        )

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


def _short(err: BaseException, limit: int = 300) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= limit else text[:limit] + "..."


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
