"""Shipping: spool frames -> batches -> server, offsets committed after the ack.

Three threads: the *builder* (this module's :meth:`Shipper.run` loop) reads frames,
batches them by size (``batch_bytes``) and time (``batch_delay_s``); the *sender*
posts one batch at a time and commits; *retention* deletes segments (it must keep
working while the sender is stuck on an unreachable server). The builder prepares
the next batch while the previous one is on the wire (a queue of one).

On start, a batch left ``pending`` by a previous agent process is re-sent first, with
its original key (see :mod:`fleetscope.agent.offsets`).

A batch the server rejects (400/413/415/422) is bisected until the offending frames are
isolated; those are saved under ``<state>/rejected/``, skipped, counted and reported,
and the rest is shipped.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fleetscope.agent.batch import Batch, build_batch, frames_for_ranges, merge_ranges
from fleetscope.agent.clock import ClockSync
from fleetscope.agent.offsets import OffsetStore, Pending
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.ranks import RankRegistry
from fleetscope.agent.retention import Retention
from fleetscope.agent.tailer import ReadFrame, SpoolTailer
from fleetscope.agent.transport import Transport

log = logging.getLogger("fleetscope.agent")
RETENTION_EVERY_S = 1.0
REPORT_EVERY_S = 10.0


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
                 batch_bytes: int = 4 << 20, batch_delay_s: float = 0.5, poll_s: float = 0.1,
                 compression: str | None = "zstd", stop_event: threading.Event | None = None):
        self.host = host
        self.tailer = tailer
        self.offsets = offsets
        self.transport = transport
        self.clock = clock
        self.retention = retention
        self.ranks = ranks
        self.outbox = outbox
        self.rejected_dir = Path(state_dir) / "rejected"
        self.batch_bytes = batch_bytes
        self.batch_delay_s = batch_delay_s
        self.poll_s = poll_s
        self.compression = compression
        self.stats = ShipStats()
        self.stop_event = stop_event or threading.Event()
        self._queue: queue.Queue[Batch | None] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._sender: threading.Thread | None = None
        self._outstanding = 0
        self._drain_deadline: float | None = None
        self._end = False
        self._begun: dict[str, Future] = {}
        self._durable = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fleetscope-offsets")
        """Offset writes (begin/commit), in order, off the sender's critical path."""
        self.idle = threading.Event()
        """Set while nothing is pending, queued or unread (tests and benchmarks wait on it)."""

    # -- lifecycle ---------------------------------------------------------------------
    def run(self) -> None:
        """Ship until :meth:`stop`; returns after the sender thread has ended."""
        self._prune_offsets()
        self._resend_pending()
        self._sender = threading.Thread(target=self._send_loop, name="fleetscope-sender",
                                        daemon=True)
        self._sender.start()
        retention = threading.Thread(target=self._retention_loop, name="fleetscope-retention",
                                     daemon=True)
        retention.start()
        try:
            self._build_loop()
        finally:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                pass
            self._sender.join(timeout=10)
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
                    first = now
                frames += got
                size += sum(f.end - f.start for f in got)
                self.idle.clear()
            full = size >= self.batch_bytes
            # past the delay, ship as soon as the sender is free; meanwhile keep filling
            due = bool(frames) and now - first >= self.batch_delay_s and self._queue.empty()
            if full or due:
                self._dispatch(frames)
                frames, size = [], 0
                continue
            if not got:
                with self._lock:
                    quiet = not frames and self._outstanding == 0
                if quiet:
                    self.idle.set()
                if self._drain_deadline is not None and quiet:
                    self.stop_event.set()  # drained: everything on disk is acknowledged
                    break
                self.stop_event.wait(self.poll_s)

    def _dispatch(self, frames: list[ReadFrame]) -> None:
        batch = build_batch(self.host, frames, self.ranks)
        if batch.frames:
            batch.encode(self.compression)  # here, overlapping the sender's request
        with self._lock:
            self._outstanding += 1
        while not self.stop_event.is_set():
            try:
                self._queue.put(batch, timeout=0.2)
                return
            except queue.Full:
                continue

    def _retention_loop(self) -> None:
        """Retention runs on its own thread: it must act while the sender is stuck."""
        while not self.stop_event.wait(RETENTION_EVERY_S):
            busy = self.offsets.pending_files()
            try:
                self.retention.apply(self.tailer.segments(), busy)
            except OSError as e:
                log.error("retention pass failed: %s", e)

    # -- sender ------------------------------------------------------------------------
    def _take(self, block: bool) -> Batch | None:
        """The next queued batch; None when there is none (non-blocking) or at the end."""
        while not self._end:
            try:
                batch = self._queue.get(timeout=0.2) if block else self._queue.get_nowait()
            except queue.Empty:
                if not block or self.stop_event.is_set():
                    return None
                continue
            if batch is None:
                self._end = True
                return None
            return batch
        return None

    def _send_loop(self) -> None:
        nxt: Batch | None = None
        while True:
            batch = nxt if nxt is not None else self._take(block=True)
            if batch is None:
                return
            # make the next batch durably pending while this one is on the wire, so the
            # fsync never sits between two requests
            nxt = self._take(block=False)
            if nxt is not None and nxt.frames:
                self._begin(nxt, wait=False)
            done = self._ship(batch)
            if not done or self.stop_event.is_set():
                return
            with self._lock:
                self._outstanding -= 1

    def _begin(self, batch: Batch, wait: bool) -> None:
        if batch.pending is None:
            batch.pending = Pending(batch.key, batch.ranges, self.clock.estimate.offset_ns)
            self._begun[batch.key] = self._durable.submit(self.offsets.begin, batch.pending)
        fut = self._begun.get(batch.key)
        if wait and fut is not None:
            fut.result()
            del self._begun[batch.key]

    def _ship(self, batch: Batch) -> bool:
        """Send one batch (bisecting on rejection). False if stopped before the end."""
        self._report_bad(batch)
        if not batch.frames:
            if batch.ranges:
                self.offsets.skip(list(batch.ranges), self._bad_counters(batch))
            return True
        self._begin(batch, wait=True)  # durable before the first byte is sent
        pending = batch.pending
        assert pending is not None
        body = batch.encode(self.compression)
        t0 = time.perf_counter()
        res = self.transport.post_batch(body, pending.key, pending.clock_offset_ns,
                                        self.clock.estimate.uncertainty_ns, self.stop_event)
        if res.outcome == "stopped":
            return False
        if res.outcome == "ok":
            # the commit runs while the next request is on the wire; if the agent dies
            # first, the batch is still pending and is re-sent (a duplicate for the server)
            self._durable.submit(self.offsets.commit, pending, self._bad_counters(batch))
            log.debug("batch %s: %d rows, %d bytes, POST %.3fs", pending.key, batch.num_rows,
                      len(body), time.perf_counter() - t0)
            self.stats.num_batches += 1
            self.stats.num_records += batch.num_rows
            self.stats.num_bytes += len(body)
            self.stats.num_duplicates += int(res.duplicate)
            self.stats.last_ack_ns = time.time_ns()
            return True
        done = self._bisect(batch, res.status, res.detail)
        if done:
            self._durable.submit(self.offsets.skip, [], {}, pending.key)
        return done

    def _bisect(self, batch: Batch, status: int, detail: str) -> bool:
        if len(batch.frames) == 1:
            d = batch.frames[0]
            self._quarantine(d.frame, f"HTTP {status}: {detail}")
            self.offsets.skip(list(batch.ranges),
                              {"rejected_frames": 1, **self._bad_counters(batch)},
                              done_key=batch.key)
            self.stats.num_rejected_frames += 1
            return True
        log.warning("server rejected a batch of %d frames (HTTP %d: %s); bisecting",
                    len(batch.frames), status, detail)
        first, second = batch.split()
        return self._ship_quiet(first) and self._ship_quiet(second)

    def _ship_quiet(self, batch: Batch) -> bool:
        bad, batch.bad = batch.bad, []
        ok = self._ship(batch) if batch.frames else True
        if ok and bad:
            self.offsets.skip(list(merge_ranges(b[0] for b in bad)), self._bad_counters_of(bad))
        return ok

    # -- pending batch after a restart ---------------------------------------------------
    def _resend_pending(self) -> None:
        """Re-send, in order and under their keys, the batches a previous run left pending."""
        if not self.offsets.pending:
            return
        paths = {s.key: s.path for s in self.tailer.segments()}
        for p in list(self.offsets.pending):
            if self.stop_event.is_set():
                return
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
                self.offsets.skip([], {}, done_key=p.key)

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
        self.rejected_dir.mkdir(parents=True, exist_ok=True)
        name = fr.segment.key.replace("/", "_") + f".{fr.start}-{fr.end}"
        (self.rejected_dir / (name + ".frame")).write_bytes(fr.payload or b"")
        (self.rejected_dir / (name + ".txt")).write_text(why + "\n")
        msg = (f"server rejected frame at offset {fr.start} of {fr.segment.key} ({why}); "
               f"saved to {self.rejected_dir / (name + '.frame')} and skipped")
        log.error("%s", msg)
        if self.outbox is not None:
            self.outbox.write("log_events", [{
                "ts_ns": time.time_ns(), "job": fr.segment.job, "host": self.host,
                "rank": fr.segment.rank, "source": fr.segment.key, "kind": "spool_rejected",
                "severity": "error", "message": msg}])
