"""Simulated host agents: one per host, shipping through the agent's own transport.

Each simulated agent is a :class:`fleetscope.agent.transport.Transport` (retries with
backoff and jitter, ``Retry-After`` on 429, ``Idempotency-Key``, ``X-Fleetscope-Host``
and the clock headers) bodies are the agent wire format (:func:`fleetscope.codec.
encode_batch`), and at most ``in_flight`` requests of one host are on the wire at a
time (the agent's bound). All agents share one keep-alive HTTP client and a small pool
of sender threads: a thousand real ``httpx`` clients would measure this machine, not
the server.

Coalescing (:mod:`fleetscope.agent.coalesce`), as the agent does: a host's sender,
when it starts, takes every batch queued for that host at that moment (bounded rows
and bytes) and POSTs them as one request, so the request rate adapts to the server's
latency instead of staying at one request per host per ``batch_delay_s``. At most one
send per host waits for a sender thread; ``CoalesceLimits(enabled=False)`` restores
one request per batch (the bench's baseline).
"""

from __future__ import annotations

import copy
import hashlib
import logging
import struct
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import numpy as np
import pyarrow as pa
from fleetscope.agent import coalesce
from fleetscope.agent.clock import ClockSync
from fleetscope.agent.coalesce import CoalesceLimits, Sized
from fleetscope.agent.transport import Transport

from fleetscope import codec

log = logging.getLogger("fleetscope.sim")
_LEN = struct.Struct("<I")


def encode_body(tables: dict[str, pa.Table], compression: str | None) -> bytes:
    """The agent wire format (:func:`fleetscope.codec.encode_batch`: one ``FSB1`` frame
    per record type) for tables that are canonical by construction (built on
    ``RecordType.arrow_schema()``): ``conform``'s per-column checks, ~0.1 ms per table,
    would be most of the simulator's cost at 1,536 hosts. The server decodes and
    validates every frame as it does an agent's (``tests/test_simulator.py`` checks the
    round trip through the collector's validator)."""
    out = bytearray()
    for table in tables.values():
        if table.num_rows:
            payload = codec.table_to_ipc(table, compression)
            out += codec.FRAME_MAGIC + _LEN.pack(len(payload)) + payload
    return bytes(out)


@dataclass
class ShipStats:
    batches: int = 0
    rows_acked: int = 0
    bytes_sent: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_detail: str = ""
    rows_queued: int = 0
    batches_cut: int = 0
    """Batches handed to the agents (``requests`` <= this: coalesced ones count once)."""
    requests: int = 0
    """Acknowledged requests."""
    splits_413: int = 0
    """Coalesced requests the server refused as too large, sent again as halves."""
    post_s: list[float] = field(default_factory=list)


class SimAgents:
    """The agents of all simulated hosts."""

    def __init__(self, server: str, hosts: list[str], run_id: str, *, token: str | None = None,
                 in_flight: int = 4, senders: int = 8, compression: str | None = None,
                 timeout_s: float = 30.0, max_backoff_s: float = 5.0, clock_sync: bool = True,
                 coalescing: CoalesceLimits | None = None, world_size: int = 0) -> None:
        self.hosts, self.run_id = hosts, run_id
        self.in_flight, self.compression = in_flight, compression
        self.coalescing = coalescing or CoalesceLimits()
        self.template = Transport(server, hosts[0], timeout_s=timeout_s, max_backoff_s=max_backoff_s,
                                  token=token)
        # one pool for all agents, as wide as the senders (httpx's default is 100)
        old = self.template.client
        self.template.client = httpx.Client(base_url=old.base_url, timeout=old.timeout, headers=old.headers,
                                            limits=httpx.Limits(max_connections=senders + 8,
                                                                max_keepalive_connections=senders + 8))
        old.close()
        self.clock = ClockSync(self.template.client, num_rounds=4, enabled=clock_sync)
        self.clock.measure()
        self._transports: dict[int, Transport] = {}
        self.queues: list[deque[Sized[tuple[int, dict[str, pa.Table]]]]] = [deque() for _ in hosts]
        self.outstanding = [0] * len(hosts)
        """Sends of each host started or waiting for a sender thread (<= ``in_flight``)."""
        self.waiting = [False] * len(hosts)
        """A send of this host waits for a sender thread (it takes the queue when it runs)."""
        self.queued = [[0, 0] for _ in hosts]
        """Rows and bytes queued per host (not yet taken by a send)."""
        self.seq = [0] * len(hosts)
        self.world_size = world_size
        self.acked_through = np.zeros(max(world_size, 0), dtype=np.int64)
        """Per rank, the newest in-flight time whose batch and every batch of its host
        before it are acknowledged (the agent's ``acked_through_ns``; 0: none yet)."""
        self._inflight_of: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        """(host, batch no) -> the batch's in-flight (ranks, times), until it is in the prefix."""
        self._acked_seqs: list[set[int]] = [set() for _ in hosts]
        self._prefix = [0] * len(hosts)
        """Per host, the batch number up to which every batch is acknowledged."""
        self.oldest: dict[tuple[int, int], float] = {}
        """(host, batch no) -> monotonic time the batch was cut, until acknowledged."""
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=senders, thread_name_prefix="fleetscope-sim-send")
        self.stats = ShipStats()
        self.idle = threading.Condition(self.lock)

    def transport(self, h: int) -> Transport:
        t = self._transports.get(h)
        if t is None:
            t = copy.copy(self.template)  # shares the keep-alive client; own host and counters
            t.host = self.hosts[h]
            t._lock = threading.Lock()  # noqa: SLF001
            t.num_retries = t.num_throttled = 0
            self._transports[h] = t
        return t

    def key(self, h: int, n: int) -> str:
        """The batch's idempotency key: same bytes (host, batch number) -> same key."""
        digest = hashlib.sha256(f"{self.run_id}\n{self.hosts[h]}\n{n}".encode()).hexdigest()
        return "fsim1-" + digest[:40]

    # ------------------------------------------------------------------ submit
    def ship(self, data: dict[str, tuple[pa.Table, np.ndarray]]) -> int:
        """Cut one batch per host from ``take()``'s tables; returns rows queued."""
        if not data:
            return 0
        num_hosts = len(self.hosts)
        per_host: dict[int, dict[str, pa.Table]] = {}
        for name, (table, offs) in data.items():
            for h in range(num_hosts):
                a, b = int(offs[h]), int(offs[h + 1])
                if b > a:
                    per_host.setdefault(h, {})[name] = table.slice(a, b - a)
        inflight = data.get("inflight")
        if inflight is not None and self.world_size:
            i_rank = inflight[0].column("rank").to_numpy().astype(np.int64)
            i_ts = inflight[0].column("ts_ns").to_numpy().astype(np.int64)
            i_offs = inflight[1]
        rows = 0
        now = time.monotonic()
        with self.lock:
            for h, tables in per_host.items():
                n = sum(t.num_rows for t in tables.values())
                rows += n
                self.seq[h] += 1
                item = Sized((self.seq[h], tables), n, coalesce.table_bytes(tables))
                self.queues[h].append(item)
                self.queued[h][0] += item.num_rows
                self.queued[h][1] += item.num_bytes
                self.oldest[(h, self.seq[h])] = now
                if inflight is not None and self.world_size:
                    a, b = int(i_offs[h]), int(i_offs[h + 1])
                    self._inflight_of[(h, self.seq[h])] = (i_rank[a:b], i_ts[a:b])
            self.stats.rows_queued += rows
            self.stats.batches_cut += len(per_host)
            for h in per_host:
                self._pump(h)
        return rows

    def _pump(self, h: int) -> None:
        """Start a send of this host if it has batches, room, and none waiting (lock held).

        Coalescing, a send starts while another of the host's is on the wire only for a
        full request's worth of batches (:func:`fleetscope.agent.coalesce.should_send`).
        """
        if self.queues[h] and not self.waiting[h] and self.outstanding[h] < self.in_flight \
                and not self.stop_event.is_set() \
                and coalesce.should_send(self.outstanding[h], *self.queued[h], self.coalescing):
            self.outstanding[h] += 1
            self.waiting[h] = True
            self.pool.submit(self._send, h)

    def _send(self, h: int) -> None:
        with self.lock:
            self.waiting[h] = False
            batch = coalesce.take(self.queues[h], self.coalescing)
            self.queued[h][0] -= sum(b.num_rows for b in batch)
            self.queued[h][1] -= sum(b.num_bytes for b in batch)
            self._pump(h)  # what is left (over the bounds, or queued later) goes next
        try:
            if batch:
                coalesce.send_splitting(batch, lambda part: self._post(h, part))
        except Exception:  # a bug here must not wedge the host's queue
            log.exception("simulated agent %s: sending batches %s failed", self.hosts[h],
                          [s.item[0] for s in batch])
        finally:
            with self.lock:
                self.outstanding[h] -= 1
                for s in batch:
                    self.oldest.pop((h, s.item[0]), None)
                self._advance_acked(h, [s.item[0] for s in batch])
                self._pump(h)
                self.idle.notify_all()

    def _post(self, h: int, batch: list[Sized[tuple[int, dict[str, pa.Table]]]]) -> tuple[bool, int]:
        """POST these batches of host ``h`` as one request; (acknowledged?, status)."""
        tables = coalesce.merge_tables([s.item[1] for s in batch])
        num_rows = sum(s.num_rows for s in batch)
        key = coalesce.coalesced_key([self.key(h, s.item[0]) for s in batch])
        body = encode_body(tables, self.compression)
        est = self.clock.estimate
        t0 = time.perf_counter()
        res = self.transport(h).post_batch(body, key, est.offset_ns, est.uncertainty_ns, self.stop_event)
        took = time.perf_counter() - t0
        with self.lock:
            st = self.stats
            if res.outcome == "ok":
                st.batches += len(batch)
                st.requests += 1
                st.rows_acked += num_rows
                st.bytes_sent += len(body)
                st.duplicates += int(res.duplicate)
                if len(st.post_s) < 200_000:
                    st.post_s.append(took)
            elif res.outcome == "rejected" and res.status == 413 and len(batch) > 1:
                st.splits_413 += 1
                log.info("server refused a coalesced request of %d batches as too large (%s); "
                         "sending halves", len(batch), res.detail)
            elif res.outcome == "rejected":
                st.rejected += len(batch)
                if not st.rejected_detail:
                    st.rejected_detail = f"HTTP {res.status}: {res.detail}"
                    log.error("server rejected a simulated batch of %s: %s", self.hosts[h],
                              st.rejected_detail)
        return res.outcome == "ok", res.status

    def _advance_acked(self, h: int, seqs: list[int]) -> None:
        """Move ``acked_through`` of host ``h``'s ranks over the batches now acknowledged
        with every earlier batch of the host, as the agent does (lock held). A batch
        given up (rejected, or stopped) counts as done: the agent skips it too."""
        done = self._acked_seqs[h]
        done.update(seqs)
        while self._prefix[h] + 1 in done:
            self._prefix[h] += 1
            done.discard(self._prefix[h])
            got = self._inflight_of.pop((h, self._prefix[h]), None)
            if got is not None and got[0].size:
                np.maximum.at(self.acked_through, got[0], got[1])

    # ------------------------------------------------------------------ state
    def backlog(self) -> tuple[int, float]:
        """(batches not yet acknowledged, age in s of the oldest of them)."""
        with self.lock:
            if not self.oldest:
                return 0, 0.0
            return len(self.oldest), time.monotonic() - min(self.oldest.values())

    @property
    def throttled(self) -> int:
        return sum(t.num_throttled for t in list(self._transports.values()))

    @property
    def retries(self) -> int:
        return sum(t.num_retries for t in list(self._transports.values()))

    def drain(self, timeout_s: float) -> bool:
        """Wait until every queued batch is acknowledged (or ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while self.oldest:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.idle.wait(min(left, 0.5))
        return True

    def close(self) -> None:
        self.stop_event.set()
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.template.close()
