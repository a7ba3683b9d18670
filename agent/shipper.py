"""Shipping: spool frames -> batches -> server, offsets committed after the ack.

Threads: the *builder* (:meth:`Shipper.run`) reads frames, batches them by size
(``batch_bytes``) and time (``batch_delay_s``) and encodes them; ``in_flight``
*senders* POST batches concurrently (with one request at a time the agent is
latency-bound: it and the server wait for each other); *retention* deletes segments
(it must keep working while the senders are stuck on an unreachable server).

Coalescing (``coalesce``, on by default; ``agent/coalesce.py`` states the rules): a
batch past ``batch_delay_s`` is cut only while nothing is on the wire; while a request
is out the next batch keeps filling, up to ``batch_bytes``, and full batches go at once
(up to ``in_flight`` of them). The server's cost per request is mostly fixed, so a slow
server gets fewer, larger requests rather than one per agent per ``batch_delay_s``. A
batch is coalesced *before* it is made pending, so its key, its durable ranges and its
re-send after a restart are those of any other batch.

Acknowledgements may arrive out of order; :class:`~fleetscope.agent.window.AckWindow`
lets a file's durable offset move only over its contiguous acknowledged prefix, and a
batch acknowledged beyond a gap stays ``pending`` until the gap closes. Every batch is
made durably pending (in the order the batches were cut) before its first byte is
sent; offset writes run in order on one thread, off the senders' critical path.

On start, the batches left ``pending`` by a previous agent process are re-sent first,
in order, with their original keys (see :mod:`fleetscope.agent.offsets`).

A batch the server rejects (400/413/415/422) is bisected until the offending frames are
isolated; those are saved under ``<state>/rejected/``, skipped, counted and reported,
and the rest is shipped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fleetscope.agent.batch import Batch, build_batch, frames_for_ranges
from fleetscope.agent.clock import ClockSync
from fleetscope.agent.config import BATCH_BYTES, BATCH_DELAY_S, POLL_S, REJECTED_MAX_BYTES
from fleetscope.agent.offsets import OffsetStore, Pending
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.ranks import RankRegistry
from fleetscope.agent.retention import Retention
from fleetscope.agent.tailer import ReadFrame, SpoolTailer
from fleetscope.agent.transport import Transport
from fleetscope.agent.window import AckWindow

log = logging.getLogger("fleetscope.agent")
RETENTION_EVERY_S = 1.0
REPORT_EVERY_S = 10.0
STOP_JOIN_S = 10.0


def _written_ago_s(frames: list[ReadFrame]) -> float:
    """How long ago the newest of these frames was written at the latest (segment mtimes).

    ``batch_delay_s`` bounds how long a record waits between being spooled and being
    shipped, so it counts from the write, not from when the agent read it: a backlog
    (agent restart, server outage, a burst read at once) ships without a fresh wait,
    while records read as they are written still wait up to the delay to coalesce.
    """
    newest = max(f.segment.mtime_ns for f in frames)
    return max(0.0, (time.time_ns() - newest) / 1e9)


@dataclass
class ShipStats:
    num_batches: int = 0
    num_records: int = 0
    num_bytes: int = 0
    num_duplicates: int = 0
    num_corrupt_frames: int = 0
    num_corrupt_bytes: int = 0
    num_rejected_frames: int = 0
    last_ack_ns: int = -1


class Shipper:
    def __init__(self, *, host: str, tailer: SpoolTailer, offsets: OffsetStore,
                 transport: Transport, clock: ClockSync, retention: Retention,
                 ranks: RankRegistry | None, outbox: Outbox | None, state_dir: Path,
                 batch_bytes: int = BATCH_BYTES, batch_delay_s: float = BATCH_DELAY_S, poll_s: float = POLL_S,
                 compression: str | None = "zstd", in_flight: int = 4, coalesce: bool = True,
                 stop_event: threading.Event | None = None,
                 rejected_max_bytes: int = REJECTED_MAX_BYTES):
        self.host = host
        self.tailer = tailer
        self.offsets = offsets
        self.transport = transport
        self.clock = clock
        self.retention = retention
        self.ranks = ranks
        self.outbox = outbox
        self.rejected_dir = Path(state_dir) / "rejected"
        self.rejected_max_bytes = rejected_max_bytes
        """Cap on ``rejected/``: the oldest saved frames are deleted (counted) beyond it."""
        self.batch_bytes = batch_bytes
        self.batch_delay_s = batch_delay_s
        self.poll_s = poll_s
        self.compression = compression
        self.stats = ShipStats()
        self.stop_event = stop_event or threading.Event()
        self.in_flight = in_flight
        self.coalesce = coalesce
        """Nagle for batches: past the delay, cut only when nothing is on the wire."""
        # ``in_flight`` requests on the wire (one per sender thread) plus as many batches
        # built, pending and ready for the next free sender: the server coalesces
        # concurrent requests into one insert, so acks come in groups, and a group of
        # free senders must find a group of batches, not wait for them to be built
        self.window = AckWindow(2 * in_flight, max_unretired=4 * in_flight)
        self._work: queue.Queue[tuple[Batch, Future] | None] = queue.Queue()
        self._stats_lock = threading.Lock()
        self._ack_lock = threading.Lock()
        self._senders: list[threading.Thread] = []
        self._drain_deadline: float | None = None
        self._order: deque[tuple[str, dict[tuple[str, int], int]]] = deque()
        """Dispatched batches in cut order, (key, newest in-flight time per rank), until
        they and every batch before them are acknowledged (:meth:`_advance_acked`)."""
        self._acked_keys: set[str] = set()
        """Acknowledged keys still behind an unacknowledged batch in ``_order``."""
        self._durable = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetscope-offsets")
        """Offset writes (begin/commit), in order, off the senders' critical path."""
        self.idle = threading.Event()
        """Set while nothing is in flight or unread (tests and benchmarks wait on it)."""

    # -- lifecycle ---------------------------------------------------------------------
    def run(self) -> None:
        """Ship until :meth:`stop`; returns after the sender threads have ended."""
        self._prune_offsets()
        self._resend_pending()
        for i in range(self.in_flight):
            t = threading.Thread(target=self._send_loop, name=f"fleetscope-sender-{i}", daemon=True)
            t.start()
            self._senders.append(t)
        retention = threading.Thread(target=self._retention_loop, name="fleetscope-retention",
                                     daemon=True)
        retention.start()
        try:
            self._build_loop()
        finally:
            self.stop_event.set()
            for _ in self._senders:
                self._work.put(None)
            deadline = time.monotonic() + STOP_JOIN_S
            for t in self._senders:
                t.join(timeout=max(0.0, deadline - time.monotonic()))
            retention.join(timeout=5)
            self._durable.shutdown(wait=True)  # acknowledged batches get committed

    def stop(self) -> None:
        self.stop_event.set()

    def drain(self, timeout_s: float) -> None:
        """Ship what is already on disk, then stop (at the latest after ``timeout_s``)."""
        self._drain_deadline = time.monotonic() + timeout_s
        t = threading.Timer(timeout_s, self._drain_expired)
        t.daemon = True
        t.start()

    def _drain_expired(self) -> None:
        if not self.stop_event.is_set():
            log.warning("drain timeout: stopping with unshipped data; it stays in the spool")
            self.stop_event.set()

    # -- builder -----------------------------------------------------------------------
    def _build_loop(self) -> None:
        frames: list[ReadFrame] = []
        size = 0
        first = 0.0
        last_report = time.monotonic()
        reported = (0, 0)
        while not self.stop_event.is_set():
            now = time.monotonic()
            if now - last_report >= REPORT_EVERY_S:
                last_report = now
                cur = (self.stats.num_records, self.stats.num_batches)
                if cur != reported:
                    reported = cur
                    log.info("shipped %d records in %d batches; backlog %d bytes",
                             cur[0], cur[1], self.retention.stats.unacked_bytes)
            got = self.tailer.read(self.batch_bytes - size) if size < self.batch_bytes else []
            if got:
                if not frames:
                    first = now - _written_ago_s(got)
                frames += got
                size += sum(f.end - f.start for f in got)
                self.idle.clear()
            full = size >= self.batch_bytes
            # past the delay, ship as soon as a sender is free; meanwhile keep filling. With
            # coalescing, past the delay only when nothing is on the wire either: while the
            # server works on one batch the next one grows (up to batch_bytes), so a slow
            # server gets fewer, larger requests instead of one per batch_delay_s
            due = bool(frames) and now - first >= self.batch_delay_s and self.window.has_slot() \
                and (not self.coalesce or self.window.unacked == 0)
            if full or due:
                self._dispatch(frames)
                frames, size = [], 0
                continue
            if not got:
                quiet = not frames and len(self.window) == 0
                if quiet:
                    self.idle.set()
                if self._drain_deadline is not None and quiet:
                    self.stop_event.set()  # drained: everything on disk is acknowledged
                    break
                self.stop_event.wait(self.poll_s)

    def _dispatch(self, frames: list[ReadFrame]) -> None:
        """Build and encode a batch, wait for room in the window, make it pending, queue it."""
        batch = build_batch(self.host, frames, self.ranks)
        if batch.frames:
            batch.encode(self.compression)  # here, overlapping the senders' requests
        if not self.window.wait_slot(self.stop_event):
            return  # stopping: nothing of it was made pending; it is re-read next start
        self.window.add(batch.key, batch.ranges)
        with self._ack_lock:
            self._order.append((batch.key, batch.inflight_ns))
        if not batch.frames:  # corrupt frames only: nothing to send, done at once
            self._report_bad(batch)
            self._acked(batch)
            return
        batch.pending = Pending(batch.key, batch.ranges, self.clock.estimate.offset_ns)
        # begins are written in dispatch order: a batch is never pending without every
        # batch cut before it from the same files being pending (or committed) too
        self._work.put((batch, self._durable.submit(self.offsets.begin, batch.pending)))

    def _retention_loop(self) -> None:
        """Retention runs on its own thread: it must act while the senders are stuck."""
        while not self.stop_event.wait(RETENTION_EVERY_S):
            busy = self.offsets.pending_files()
            try:
                self.retention.apply(self.tailer.segments(), busy)
            except OSError as e:
                log.error("retention pass failed: %s", e)

    # -- senders -----------------------------------------------------------------------
    def _send_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            batch, begun = item
            try:
                self._report_bad(batch)
                t0 = time.perf_counter()
                begun.result()  # durable before the first byte is sent
                waited = time.perf_counter() - t0
                if waited > 0.1:
                    log.debug("batch %s waited %.2fs for its pending record (slow disk?)",
                              batch.key, waited)
                if self._ship(batch):
                    self._acked(batch)
            except Exception:
                log.exception("sending batch %s failed unexpectedly; stopping the agent (what is "
                              "not acknowledged stays pending and is re-sent on the next start)",
                              batch.key)
                self.stop_event.set()
                return

    def _acked(self, batch: Batch) -> None:
        """Commit what the ack allows: each file's contiguous acked prefix, retired batches."""
        with self._ack_lock:  # ack order = order of the durable writes
            adv = self.window.ack(batch.key)
            self._advance_acked(batch.key)
            try:
                self._durable.submit(self.offsets.skip, list(adv.ranges),
                                     self._bad_counters(batch), done=adv.retired)
            except RuntimeError:  # shut down while this request was still out: re-sent later
                log.debug("batch %s acknowledged after shutdown; it stays pending", batch.key)

    def _advance_acked(self, key: str) -> None:
        """Move each rank's ``acked_through_ns`` over the batches now acknowledged with
        every batch cut before them (lock held). A rank writes its records in order and
        the builder reads them in order, so once this prefix is acknowledged the server
        holds every record of the rank up to its newest in-flight record in the prefix,
        whichever order the requests were stored in (the hang pass certifies silence
        from it: :mod:`fleetscope.server.diagnosis.progress`)."""
        self._acked_keys.add(key)
        through: dict[tuple[str, int], int] = {}
        while self._order and self._order[0][0] in self._acked_keys:
            k, inflight = self._order.popleft()
            self._acked_keys.discard(k)
            for rank, ts in inflight.items():
                if ts > through.get(rank, -1):
                    through[rank] = ts
        if through and self.ranks is not None:
            self.ranks.acked(through)

    def _ship(self, batch: Batch) -> bool:
        """POST one pending batch (bisecting on rejection). False if stopped before the end."""
        assert batch.pending is not None
        body = batch.encode(self.compression)
        t0 = time.perf_counter()
        res = self.transport.post_batch(body, batch.pending.key, batch.pending.clock_offset_ns,
                                        self.clock.estimate.uncertainty_ns, self.stop_event)
        if res.outcome == "stopped":
            return False
        if res.outcome == "ok":
            log.debug("batch %s: %d rows, %d bytes, POST %.3fs", batch.key, batch.num_rows,
                      len(body), time.perf_counter() - t0)
            with self._stats_lock:
                self.stats.num_batches += 1
                self.stats.num_records += batch.num_rows
                self.stats.num_bytes += len(body)
                self.stats.num_duplicates += int(res.duplicate)
                self.stats.last_ack_ns = time.time_ns()
            return True
        return self._bisect(batch, res.status, res.detail)

    def _bisect(self, batch: Batch, status: int, detail: str) -> bool:
        """Ship the halves of a rejected batch, each under its own pending key.

        The halves only leave ``pending`` when done; the offsets move when the whole
        batch is done (with the other batches in flight, via the window).
        """
        if len(batch.frames) == 1:
            self._quarantine(batch.frames[0].frame, f"HTTP {status}: {detail}")
            with self._stats_lock:
                self.stats.num_rejected_frames += 1
            self._durable.submit(self.offsets.add_counters, {"rejected_frames": 1}).result()
            return True
        log.warning("server rejected a batch of %d frames (HTTP %d: %s); bisecting",
                    len(batch.frames), status, detail)
        for half in batch.split():
            half.pending = Pending(half.key, half.ranges, self.clock.estimate.offset_ns)
            self._durable.submit(self.offsets.begin, half.pending).result()
            if not self._ship(half):
                return False
            self._durable.submit(self.offsets.skip, [], {}, done_key=half.key)
        return True

    # -- pending batch after a restart ---------------------------------------------------
    def _resend_pending(self) -> None:
        """Re-send, in order and under their keys, the batches a previous run left pending."""
        if not self.offsets.pending:
            return
        paths = {s.key: s.path for s in self.tailer.segments()}
        for p in list(self.offsets.pending):
            if self.stop_event.is_set():
                return
            if p not in self.offsets.pending:
                continue  # a half of a rejected batch, shipped again while bisecting it
            frames = frames_for_ranges(p.ranges, paths)
            if frames is None:
                log.error("pending batch %s refers to a file that is gone or replaced; "
                          "dropping it (its bytes may or may not have reached the server)", p.key)
                self.offsets.skip([], {"pending_lost": 1}, done_key=p.key)
                continue
            batch = build_batch(self.host, frames, self.ranks)
            if batch.key != p.key:
                log.error("pending batch %s re-read as %s; sending under the original key",
                          p.key, batch.key)
            log.info("re-sending batch %s left pending by the previous agent run", p.key)
            self._report_bad(batch)
            body = batch.encode(self.compression)
            res = self.transport.post_batch(body, p.key, p.clock_offset_ns,
                                            self.clock.estimate.uncertainty_ns, self.stop_event)
            if res.outcome == "ok":
                self.offsets.commit(p, self._bad_counters(batch))
                self.stats.num_batches += 1
                self.stats.num_records += batch.num_rows
                self.stats.num_duplicates += int(res.duplicate)
            elif res.outcome == "rejected" and self._bisect(batch, res.status, res.detail):
                self.offsets.commit(p, self._bad_counters(batch))

    def _prune_offsets(self) -> None:
        present = {s.key for s in self.tailer.segments()}
        pending = self.offsets.pending_files()
        for key in list(self.offsets.files):
            if key not in present and key not in pending:
                self.offsets.forget(key)

    # -- bad frames ----------------------------------------------------------------------
    def _bad_counters(self, batch: Batch) -> dict[str, int]:
        return self._bad_counters_of(batch.bad)

    @staticmethod
    def _bad_counters_of(bad) -> dict[str, int]:
        if not bad:
            return {}
        return {"corrupt_frames": len(bad), "corrupt_bytes": sum(f.end - f.start for f, _ in bad)}

    def _report_bad(self, batch: Batch) -> None:
        for fr, reason in batch.bad:
            with self._stats_lock:
                self.stats.num_corrupt_frames += 1
                self.stats.num_corrupt_bytes += fr.end - fr.start
            msg = (f"skipped {fr.end - fr.start} bytes at offset {fr.start} of spool file "
                   f"{fr.segment.key}: {reason}")
            log.warning("%s", msg)
            if self.outbox is not None:
                self.outbox.write("log_events", [{
                    "ts_ns": time.time_ns(), "job": fr.segment.job, "host": self.host,
                    "rank": fr.segment.rank, "source": fr.segment.key, "kind": "spool_corrupt",
                    "severity": "warning", "message": msg}])

    def _quarantine(self, fr: ReadFrame, why: str) -> None:
        name = fr.segment.key.replace("/", "_") + f".{fr.start}-{fr.end}"
        payload = fr.payload or b""
        saved = len(payload) <= self.rejected_max_bytes // 2
        try:
            self.rejected_dir.mkdir(parents=True, exist_ok=True)
            if saved:
                (self.rejected_dir / (name + ".frame")).write_bytes(payload)
            (self.rejected_dir / (name + ".txt")).write_text(why[:2000] + "\n")
            self._cap_rejected()
        except OSError as e:  # a full disk must not stop shipping the rest
            saved = False
            log.error("cannot save rejected frame %s: %s", name, e)
        where = f"saved to {self.rejected_dir / (name + '.frame')}" if saved else \
            f"not saved (over half of the rejected/ cap of {self.rejected_max_bytes} bytes, or unwritable)"
        msg = (f"server rejected frame at offset {fr.start} of {fr.segment.key} ({why[:500]}); "
               f"{where} and skipped")
        log.error("%s", msg)
        if self.outbox is not None:
            self.outbox.write("log_events", [{
                "ts_ns": time.time_ns(), "job": fr.segment.job, "host": self.host,
                "rank": fr.segment.rank, "source": fr.segment.key, "kind": "spool_rejected",
                "severity": "error", "message": msg}])

    def _cap_rejected(self) -> None:
        """Delete the oldest files of ``rejected/`` until it holds at most the cap."""
        files = []
        for e in os.scandir(self.rejected_dir):
            if e.is_file(follow_symlinks=False):
                st = e.stat(follow_symlinks=False)
                files.append((st.st_mtime_ns, e.name, st.st_size))
        total = sum(f[2] for f in files)
        evicted = 0
        for _, name, size in sorted(files):
            if total <= self.rejected_max_bytes:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.rejected_dir / name)
            total -= size
            evicted += 1
        if evicted:
            log.warning("rejected/ over its cap of %d bytes: deleted the %d oldest files",
                        self.rejected_max_bytes, evicted)
            self.offsets.add_counters({"rejected_evicted": evicted})
