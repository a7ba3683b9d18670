"""The shipper with several batches in flight, against a loopback HTTP ingest endpoint.

The endpoint is a real HTTP server on 127.0.0.1 that decodes the bodies with the wire
codec and deduplicates by ``Idempotency-Key`` like the fleetscope server; unlike the
real one it can hold a request or stop storing on command, which the tests need to
force acknowledgements out of order and to freeze the store at a simulated crash.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fleetscope.agent.clock import ClockSync
from fleetscope.agent.heartbeats import heartbeat_rows
from fleetscope.agent.offsets import OffsetStore
from fleetscope.agent.ranks import RankRegistry
from fleetscope.agent.retention import Retention
from fleetscope.agent.shipper import Shipper
from fleetscope.agent.tailer import SpoolTailer
from fleetscope.agent.transport import Transport

from fleetscope import codec, spool
from fleetscope.schema import record_type


class Ingest(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.cond = threading.Condition()
        self.active = self.max_active = 0
        self.stored: dict[str, list[tuple[int, int]]] = {}  # key -> (rank, step) rows
        self.received: list[str] = []  # every key, repeats included, in arrival order
        self.frozen = False  # answer 503 and store nothing (the store after a crash)
        self.hold_first = threading.Event()  # set: the first request waits for `release`
        self.release = threading.Event()
        self.wait_for_peers = 0  # >0: each request waits (<=1 s) until this many are active
        self.first_key: str | None = None
        self.delay_s = 0.0  # each request takes at least this long (a slow server)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def serve(self) -> threading.Thread:
        t = threading.Thread(target=self.serve_forever, daemon=True)
        t.start()
        return t


class _Handler(BaseHTTPRequestHandler):
    server: Ingest

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        s = self.server
        body = self.rfile.read(int(self.headers["Content-Length"]))
        key = self.headers["Idempotency-Key"]
        with s.cond:
            s.received.append(key)
            first = s.first_key is None
            if first:
                s.first_key = key
            s.active += 1
            s.max_active = max(s.max_active, s.active)
            s.cond.notify_all()
            if s.wait_for_peers:
                s.cond.wait_for(lambda: s.active >= s.wait_for_peers, timeout=1.0)
        try:
            if first and s.hold_first.is_set():
                s.release.wait(30)
            if s.delay_s:
                time.sleep(s.delay_s)
            steps = codec.decode_batch(body).get("steps")
            rows = [] if steps is None else [(r, st) for r, st in zip(*(steps.column(c).to_pylist()
                                                                       for c in ("rank", "step")))]
            with s.cond:
                if s.frozen:
                    status, doc = 503, {"detail": "frozen"}
                else:
                    dup = key in s.stored
                    s.stored.setdefault(key, rows)
                    status, doc = 200, {"accepted": True, "rows": {"steps": len(rows)}, "duplicate": dup}
        finally:
            with s.cond:
                s.active -= 1
        out = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def write_spool(root: Path, ranks: int, frames: int, rows: int) -> list[tuple[int, int]]:
    """One live segment per rank (no rank.json: never sealed, never deleted)."""
    expected = []
    for r in range(ranks):
        d = spool.rank_dir(root, "j", r)
        d.mkdir(parents=True)
        with open(d / spool.segment_name(0), "wb") as f:
            for i in range(frames):
                steps = range(i * rows, (i + 1) * rows)
                t = codec.rows_to_table(record_type("steps"), [
                    {"job": "j", "rank": r, "step": s, "start_ns": s, "end_ns": s + 1,
                     "duration_ns": 1} for s in steps])
                f.write(spool.encode_frame(codec.table_to_ipc(t, compression=None)))
                expected += [(r, s) for s in steps]
    return expected


def make_shipper(root: Path, url: str, in_flight: int, batch_bytes: int, coalesce: bool = True) -> Shipper:
    offsets = OffsetStore(root / "state" / "offsets.json")
    ranks = RankRegistry("h")
    tailer = SpoolTailer(root / "spool", None, offsets, ranks)
    transport = Transport(url, "h", timeout_s=60, max_backoff_s=0.2)
    return Shipper(host="h", tailer=tailer, offsets=offsets, transport=transport,
                   clock=ClockSync(None, enabled=False), retention=Retention(offsets), ranks=ranks,
                   outbox=None, state_dir=root / "state", batch_bytes=batch_bytes,
                   batch_delay_s=0.05, poll_s=0.02, compression="zstd", in_flight=in_flight,
                   coalesce=coalesce)


def run_until_idle(sh: Shipper, timeout_s: float = 60) -> None:
    t = threading.Thread(target=sh.run, daemon=True)
    t.start()
    assert sh.idle.wait(timeout_s), "shipper did not finish"
    sh.stop()
    t.join(30)
    assert not t.is_alive()
    sh.transport.close()


def state(root: Path) -> dict:
    return json.loads((root / "state" / "offsets.json").read_text())


def assert_everything_acked(root: Path) -> None:
    st = state(root)
    assert st["pending"] == []
    sizes = {str(p.relative_to(root / "spool")): p.stat().st_size
             for p in (root / "spool").glob("j/rank-*/seg-*.fsp")}
    assert {k: v["offset"] for k, v in st["files"].items()} == sizes


def stored_rows(srv: Ingest) -> Counter:
    return Counter(row for rows in srv.stored.values() for row in rows)


def test_at_most_in_flight_requests_and_all_rows_once(tmp_path):
    expected = write_spool(tmp_path / "spool", ranks=4, frames=30, rows=20)
    srv = Ingest()
    srv.serve()
    srv.wait_for_peers = 3  # each request waits for peers, so the limit is reached
    try:
        sh = make_shipper(tmp_path, srv.url, in_flight=3, batch_bytes=4000)
        run_until_idle(sh)
    finally:
        srv.shutdown()
    assert srv.max_active == 3  # the limit is reached and never exceeded
    assert len(srv.stored) > 10
    assert stored_rows(srv) == Counter(expected)  # every row once
    assert sh.stats.num_records == len(expected)
    assert_everything_acked(tmp_path)


def test_out_of_order_acks_then_crash_resend_same_keys_exactly_once(tmp_path):
    root = tmp_path
    expected = write_spool(root / "spool", ranks=3, frames=30, rows=20)
    srv = Ingest()
    srv.serve()
    srv.hold_first.set()  # the first batch stays unacknowledged; later ones are acked
    try:
        sh = make_shipper(root, srv.url, in_flight=4, batch_bytes=4000)
        t = threading.Thread(target=sh.run, daemon=True)
        t.start()
        # wait until a batch of the first batch's file was acked beyond the gap
        first: dict = {}

        def acked_beyond_gap() -> bool:
            try:
                st = state(root)
            except (OSError, ValueError):
                return False
            with srv.cond:
                head = next((p for p in st["pending"] if p["key"] == srv.first_key), None)
                if head is None:
                    return False
                files = {r["file"] for r in head["ranges"]}
                later = [p for p in st["pending"] if p["key"] != head["key"] and p["key"] in srv.stored
                         and files & {r["file"] for r in p["ranges"]}]
                if later:
                    first.update(head=head, later=later, state=st)
                    srv.frozen = True  # "kill -9" here: from now on nothing reaches the store
                return bool(later)

        with srv.cond:
            assert srv.cond.wait_for(acked_beyond_gap, timeout=60), "no ack beyond the gap"
        crash_state = (root / "state" / "offsets.json").read_bytes()
        st, head = json.loads(crash_state), first["head"]
        # offsets never passed the unacked head batch in any of its files
        for r in head["ranges"]:
            assert st["files"].get(r["file"], {"offset": 0})["offset"] <= r["start"]
        # ...while batches acked behind it are still pending, to be re-sent under their keys
        assert all(p in st["pending"] for p in first["later"])
        sh.stop()
        srv.release.set()  # the held request is answered 503 (frozen): not stored
        t.join(30)
        assert not t.is_alive()
        sh.transport.close()
        assert srv.first_key not in srv.stored

        # restart from the state the crash left, against the same store
        (root / "state" / "offsets.json").write_bytes(crash_state)
        pending_keys = [p["key"] for p in st["pending"]]
        with srv.cond:
            stored_before = [k for k in pending_keys if k in srv.stored]
            srv.frozen, srv.received = False, []
        sh2 = make_shipper(root, srv.url, in_flight=4, batch_bytes=4000)
        run_until_idle(sh2)
    finally:
        srv.release.set()
        srv.shutdown()
    assert srv.received[:len(pending_keys)] == pending_keys  # re-sent first, in order, same keys
    assert srv.first_key not in stored_before and len(stored_before) >= 1
    assert sh2.stats.num_duplicates == len(stored_before)  # the server had those already
    assert stored_rows(srv) == Counter(expected)  # exactly once
    assert_everything_acked(root)


def _first_request_after(root: Path, delay_s: float, age_s: float) -> float:
    """Seconds from the shipper's start to its first request, spool written ``age_s`` ago."""
    import os
    import time

    write_spool(root / "spool", ranks=2, frames=3, rows=5)  # far below batch_bytes
    then = time.time_ns() - int(age_s * 1e9)
    for p in (root / "spool").glob("j/rank-*/seg-*.fsp"):
        os.utime(p, ns=(then, then))
    srv = Ingest()
    srv.serve()
    sh = make_shipper(root, srv.url, in_flight=2, batch_bytes=4 << 20)
    sh.batch_delay_s = delay_s
    t = threading.Thread(target=sh.run, daemon=True)
    t0 = time.monotonic()
    try:
        t.start()
        with srv.cond:
            assert srv.cond.wait_for(lambda: srv.received, timeout=30), "nothing was shipped"
        took = time.monotonic() - t0
        assert sh.idle.wait(30)
    finally:
        sh.stop()
        t.join(30)
        sh.transport.close()
        srv.shutdown()
    return took


def test_batch_delay_counts_from_the_write(tmp_path):
    # A small backlog written long ago ships at once: its records already waited.
    assert _first_request_after(tmp_path / "old", delay_s=3.0, age_s=60) < 2.0
    # Freshly written records still wait (most of) the delay, to coalesce with what follows.
    assert _first_request_after(tmp_path / "new", delay_s=3.0, age_s=0) >= 2.5


def _ship_live_spool(root: Path, coalesce: bool) -> tuple[Ingest, list[tuple[int, int]]]:
    """A rank appends one small frame every 10 ms for 1.5 s while a slow server (0.25 s
    a request) takes the batches; returns the server and the rows written."""
    d = spool.rank_dir(root / "spool", "j", 0)
    d.mkdir(parents=True)
    srv = Ingest()
    srv.serve()
    srv.delay_s = 0.25
    expected: list[tuple[int, int]] = []
    try:
        sh = make_shipper(root, srv.url, in_flight=4, batch_bytes=1 << 20, coalesce=coalesce)
        t = threading.Thread(target=sh.run, daemon=True)
        t.start()
        with open(d / spool.segment_name(0), "ab", buffering=0) as f:
            for step in range(150):
                tbl = codec.rows_to_table(record_type("steps"), [
                    {"job": "j", "rank": 0, "step": step, "start_ns": step, "end_ns": step + 1,
                     "duration_ns": 1}])
                f.write(spool.encode_frame(codec.table_to_ipc(tbl, compression=None)))
                expected.append((0, step))
                time.sleep(0.01)
        time.sleep(0.2)
        sh.idle.clear()
        assert sh.idle.wait(60), "shipper did not finish"
        sh.stop()
        t.join(30)
        sh.transport.close()
    finally:
        srv.shutdown()
    return srv, expected


def test_a_slow_server_gets_fewer_larger_requests_and_every_row_once(tmp_path):
    coalesced, expected = _ship_live_spool(tmp_path / "on", coalesce=True)
    per_delay, expected_too = _ship_live_spool(tmp_path / "off", coalesce=False)
    assert stored_rows(coalesced) == Counter(expected) == stored_rows(per_delay) == Counter(expected_too)
    # one batch per 50 ms delay while 4 are in flight, or one per answer (~0.25 s)
    assert len(coalesced.received) * 2 < len(per_delay.received), (len(coalesced.received),
                                                                   len(per_delay.received))
    assert coalesced.max_active == 1 and per_delay.max_active > 1  # small batches wait their turn
    assert_everything_acked(tmp_path / "on")
    # rows of one file stay in order across the requests
    order = [row for key in coalesced.received for row in coalesced.stored[key]]
    assert order == sorted(order)


def test_acked_through_moves_only_over_the_acknowledged_prefix(tmp_path):
    """Batches acknowledged out of order: each rank's ``acked_through_ns`` (what its
    heartbeat tells the hang pass) stays at what the contiguous acknowledged prefix holds,
    so a later batch stored before an earlier one never certifies the earlier one's time;
    once everything is acknowledged it is the rank's newest in-flight time."""
    root = tmp_path
    newest = {}
    for r in range(3):
        d = spool.rank_dir(root / "spool", "j", r)
        d.mkdir(parents=True)
        with open(d / spool.segment_name(0), "wb") as f:
            for i in range(40):
                t = 10**18 + i * 10**9 + r
                steps = codec.rows_to_table(record_type("steps"), [
                    {"job": "j", "rank": r, "step": i, "start_ns": t - 5, "end_ns": t - 1, "duration_ns": 4}])
                inflight = codec.rows_to_table(record_type("inflight"), [
                    {"job": "j", "rank": r, "ts_ns": t, "step": i, "kind": "collective", "op": "all_reduce",
                     "group_id": "dp.g0", "axis": "dp", "seq": i, "peer": -1, "since_ns": t - 2}])
                for table in (steps, inflight):
                    f.write(spool.encode_frame(codec.table_to_ipc(table, compression=None)))
                newest[r] = t
    srv = Ingest()
    srv.serve()
    srv.hold_first.set()
    try:
        sh = make_shipper(root, srv.url, in_flight=4, batch_bytes=3000)
        t = threading.Thread(target=sh.run, daemon=True)
        t.start()
        with srv.cond:
            assert srv.cond.wait_for(lambda: len(srv.stored) >= 2, timeout=60), "no ack behind the held batch"
        deadline = time.monotonic() + 30
        while sh.stats.num_batches < 2 and time.monotonic() < deadline:  # the shipper saw the acks
            time.sleep(0.01)
        time.sleep(0.2)
        assert sh.stats.num_batches >= 2
        acked = {s.rank: s.acked_through_ns for s in sh.ranks.all()}
        assert acked and all(v == 0 for v in acked.values()), acked  # the head batch is still out
        srv.release.set()
        assert sh.idle.wait(60)
        acked = {s.rank: s.acked_through_ns for s in sh.ranks.all()}
        assert acked == newest
        rows = heartbeat_rows("h", "", "", 8, sh.ranks, ts_ns=10**18)
        assert {r["rank"]: r["acked_through_ns"] for r in rows if r["rank"] >= 0} == newest
        sh.stop()
        t.join(30)
        sh.transport.close()
    finally:
        srv.release.set()
        srv.shutdown()
