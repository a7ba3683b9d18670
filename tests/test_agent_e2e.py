"""The agent end to end: real writer processes, real agent processes, a real server (chdb).

* kill -9 the agent at random points while an 8-rank job writes, restart it: the store
  holds exactly the spool's records (counts and checksums), no duplicates;
* stop the server for 30 s mid-job (the job writes on for ~10 s after it is back),
  start it again: nothing lost, the backlog drains, the writer is not slowed;
* corrupt bytes are skipped, counted and reported; log lines, heartbeats, metrics and
  the clock estimate arrive;
* the disk budget with policy drop-oldest, with the server unreachable: the spool
  stays near the budget, the drop is counted, the writer is not slowed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from fleetscope import codec, spool
from fleetscope.schema import record_type
from tests.agent_writer import expected
from tests.helpers.server import ServerProcess, free_port
from tests.helpers.waiting import wait_for

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"steps": "rank, step", "sections": "rank, step, microbatch, name",
        "collectives": "rank, group_id, seq", "inflight": "rank, step, ts_ns"}


_PROCS: list[tuple[subprocess.Popen, bool]] = []


@pytest.fixture(autouse=True)
def _kill_leftovers():
    """Whatever a test started is SIGKILLed at its end, pass or fail (no orphan agents)."""
    yield
    while _PROCS:
        p, group = _PROCS.pop()
        if group:  # the writer and its rank processes (own session)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        elif p.poll() is None:
            p.kill()
        p.wait(10)


def start_agent(spool_dir: Path, url: str, log: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "fleetscope.cli", "agent", "--server", url, "--spool",
           str(spool_dir), "--metrics-interval", "1", "--max-backoff", "1", *extra]
    with open(log, "ab") as f:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    _PROCS.append((p, False))
    return p


def start_writer(spool_dir: Path, job: str, ranks: int, steps: int, interval: float,
                 segment_bytes: int = 32 << 10) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, str(ROOT / "tests" / "agent_writer.py"), "--spool",
                          str(spool_dir), "--job", job, "--ranks", str(ranks), "--steps",
                          str(steps), "--interval", str(interval), "--segment-bytes",
                          str(segment_bytes)], cwd=ROOT, start_new_session=True)
    _PROCS.append((p, True))
    return p


def query(store_url: str, *sql: str) -> list[list[dict]]:
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "agent_store_query.py"), store_url,
                          *sql], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def state(spool_dir: Path) -> dict:
    try:
        return json.loads((spool_dir / ".fleetscope-agent" / "offsets.json").read_text())
    except (OSError, ValueError):
        return {}


def size_of(path: Path) -> int | None:
    """A spool file's size, None once retention deleted it (the agent prunes acknowledged
    segments while the tests look at the spool)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return None


def all_acked(spool_dir: Path, job: str) -> bool:
    st = state(spool_dir)
    if not st or st.get("pending"):
        return False
    for d in (spool_dir / job).glob("rank-*"):
        for seg in spool.list_segments(d):
            e = st["files"].get(f"{job}/{d.name}/{seg.name}")
            size = size_of(seg)
            if size is None:  # retention deleted it since the listing: acknowledged
                continue  # (a loss would show in the server's rows, checked after this)
            if e is None or e["offset"] < size:
                return False
    return True


def outbox_acked_with(spool_dir: Path, want_metric: str, want_log_kind: str, num_ranks: int) -> bool:
    """The agent's own outbox holds ``want_metric``, a ``want_log_kind`` log event and a
    heartbeat for each of ``num_ranks`` ranks, and the server acknowledged all of it."""
    outbox = spool_dir / ".fleetscope-agent" / "outbox"
    files = state(spool_dir).get("files", {})
    metrics, kinds, beat_ranks = set(), set(), set()
    for seg in spool.list_segments(outbox):
        e = files.get(f"@outbox/{seg.name}")
        size = size_of(seg)
        if size is None:
            return False  # pruned since the listing: look again
        if e is None or e["offset"] < size:
            return False  # written but not yet acknowledged
        for f in spool.read_frames(seg):
            if f.payload is None:
                continue
            t = codec.ipc_to_table(f.payload)
            cols = set(t.column_names)
            if {"name", "value"} <= cols:
                metrics.update(t.column("name").to_pylist())
            if {"kind", "message"} <= cols:
                kinds.update(t.column("kind").to_pylist())
            if "alive" in cols:
                beat_ranks.update(t.column("rank").to_pylist())
    return want_metric in metrics and want_log_kind in kinds and set(range(num_ranks)) <= beat_ranks


def assert_store_equals_spool(store_url: str, spool_dir: Path, job: str) -> None:
    exp = expected(spool_dir, job)
    assert set(exp) == set(KEYS) and all(v["count"] for v in exp.values())
    sql = []
    for rec, key in KEYS.items():
        tcol = record_type(rec).time_column
        sql.append(f"SELECT count() AS count, toString(sum(toInt128({tcol}))) AS sum_time, "
                   f"toString(sum(toInt128(rank) * 1000003 + toInt128(step))) AS sum_key, "
                   f"uniqExact({key}) AS uniq FROM {rec} WHERE job = '{job}'")
    for rec, (row,) in zip(KEYS, query(store_url, *sql)):
        got = {"count": row["count"], "sum_time": int(row["sum_time"]), "sum_key": int(row["sum_key"])}
        assert got == exp[rec], f"{rec}: store {got} != spool {exp[rec]}"
        assert row["uniq"] == row["count"], f"{rec}: duplicates in the store"


def poll_until(cond, timeout_s: float) -> bool:
    """Poll ``cond`` every millisecond (a short-lived state: a batch in flight) until it
    holds or ``timeout_s`` passes; returns whether it held."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():  # (state() already reads a file being replaced as empty)
            return True
        time.sleep(0.001)
    return False


def test_kill_9_agent_at_random_points_exact_once(tmp_path):
    seed = int(os.environ.get("FLEETSCOPE_TEST_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    print(f"seed {seed}")
    srv = ServerProcess(tmp_path / "srv")
    srv.start()
    try:
        sp, log = tmp_path / "spool", tmp_path / "agent.log"
        writer = start_writer(sp, "killjob", ranks=8, steps=50, interval=0.1)
        args = ("--no-clock-sync", "--batch-bytes", "256K", "--batch-delay", "0.2")
        agent = start_agent(sp, srv.base_url, log, *args)
        num_kills = kills_in_flight = 0
        offsets_file = sp / ".fleetscope-agent" / "offsets.json"
        for i in range(5):
            # kill while it ships: after its next durable write, at a random moment; the
            # second kill (and any later one, until one has) waits for a batch recorded as
            # sent and not yet acknowledged, so at least one kill lands in flight whatever
            # the machine's speed (a fast server acknowledges most batches at once)
            before = offsets_file.stat().st_mtime_ns if offsets_file.exists() else 0
            wait_for(lambda b=before: offsets_file.exists() and offsets_file.stat().st_mtime_ns != b,
                     120, "the agent to make progress")
            if i >= 1 and not kills_in_flight:
                poll_until(lambda: bool(state(sp).get("pending")), 30)
            else:
                time.sleep(rng.uniform(0.0, 0.6))
            agent.send_signal(signal.SIGKILL)
            agent.wait()
            num_kills += 1
            kills_in_flight += bool(state(sp).get("pending"))
            agent = start_agent(sp, srv.base_url, log, *args)
        assert writer.wait(120) == 0
        t0 = time.monotonic()
        wait_for(lambda: all_acked(sp, "killjob"), 120, "the agent to ship the whole spool")
        print(f"{num_kills} kills; drained {time.monotonic() - t0:.1f}s after the writer ended")
        # sealed, fully acked segments are deleted; at most each rank's newest remains
        wait_for(lambda: all(len(spool.list_segments(d)) <= 1 for d in (sp / "killjob").glob("rank-*")),
                 10, "retention of acked segments")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
        assert num_kills == 5 and kills_in_flight >= 1, kills_in_flight
        assert "re-sending batch" in log.read_text()
        srv.stop()
        assert_store_equals_spool(srv.store_url, sp, "killjob")
        dups = query(srv.store_url, "SELECT count() AS n FROM ingest_batches")
        assert dups[0][0]["n"] > 0
    finally:
        srv.kill()


OUTAGE_S = 30


def test_server_down_mid_job_nothing_lost_backlog_drains(tmp_path):
    srv = ServerProcess(tmp_path / "srv", port=free_port())
    srv.start()
    try:
        sp, log = tmp_path / "spool", tmp_path / "agent.log"
        writer = start_writer(sp, "outage", ranks=8, steps=OUTAGE_S * 10 + 150, interval=0.1)
        agent = start_agent(sp, srv.base_url, log, "--no-clock-sync")
        wait_for(lambda: state(sp).get("files"), 120, "the first acknowledged batch")
        srv.stop()
        down_at = time.monotonic()
        # the agent notices (and says so) while the server is down; then the outage lasts
        wait_for(lambda: "cannot ship" in log.read_text(), OUTAGE_S, "the agent to see the outage")
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert writer.poll() is None, "the job should still be writing when the server returns"
        backlog_before = sum(s.stat().st_size for s in sp.glob("outage/rank-*/seg-*.fsp"))
        srv.start()
        up_at = time.monotonic()
        assert up_at - down_at >= OUTAGE_S
        assert writer.wait(120) == 0
        wait_for(lambda: all_acked(sp, "outage"), 120, "the backlog to drain")
        drained_s = time.monotonic() - up_at
        agent.send_signal(signal.SIGTERM)
        agent.wait(20)
        srv.stop()
        assert_store_equals_spool(srv.store_url, sp, "outage")
        text = log.read_text()
        assert "cannot ship" in text and "acknowledged a batch; shipping" in text
        timings = [json.loads(p.read_text()) for p in (sp / "outage").glob("expected-rank-*.json")]
        # the writer never waited on us: a stall would last the whole 30 s outage (the bound
        # is loose because the test machine may be heavily shared)
        assert max(t["p99_write_s"] for t in timings) < 2.0
        print(f"backlog {backlog_before} bytes drained {drained_s:.1f}s after restart")
    finally:
        srv.kill()


def frame(record: str, rows: list[dict]) -> bytes:
    return spool.encode_frame(codec.table_to_ipc(codec.rows_to_table(record_type(record), rows),
                                                 compression=None))


def steps_rows(rank: int, steps: range) -> list[dict]:
    return [{"job": "cj", "rank": rank, "step": s, "start_ns": time.time_ns(), "end_ns": time.time_ns(),
             "duration_ns": 1} for s in steps]


def test_corrupt_bytes_logs_heartbeats_metrics_clock(tmp_path):
    sp = tmp_path / "spool"
    d0, d1 = spool.rank_dir(sp, "cj", 0), spool.rank_dir(sp, "cj", 1)
    for d, r in ((d0, 0), (d1, 1)):
        d.mkdir(parents=True)
        spool.write_rank_info(d, {"pid": os.getpid(), "host": "", "local_rank": r, "job": "cj", "rank": r})
    damaged = bytearray(frame("steps", steps_rows(0, range(100, 110))))
    damaged[-5] ^= 0x55  # payload bit flip: checksum mismatch
    (d0 / spool.segment_name(0)).write_bytes(
        frame("steps", steps_rows(0, range(0, 10))) + b"\xde\xad\xbe\xef" * 50 + bytes(damaged)
        + frame("steps", steps_rows(0, range(10, 20))))
    (d0 / spool.segment_name(1)).write_bytes(frame("steps", steps_rows(0, range(20, 25))))
    (d1 / spool.segment_name(0)).write_bytes(  # live segment: a bad frame, then good ones
        frame("steps", steps_rows(1, range(0, 5))) + spool.encode_frame(b"not arrow")
        + frame("steps", steps_rows(1, range(5, 8))))
    (d0 / "stderr.log").write_text("step 3\n[0] NCCL WARN Net : Connection closed by remote peer\nstep 4\n")
    srv = ServerProcess(tmp_path / "srv")
    srv.start()
    try:
        clock = httpx.get(f"{srv.base_url}/api/v1/clock").json()
        assert clock["receive_ns"] <= clock["send_ns"] and abs(clock["send_ns"] - time.time_ns()) < 5e9
        log = tmp_path / "agent.log"
        agent = start_agent(sp, srv.base_url, log, "--heartbeat", "0.5")
        wait_for(lambda: all_acked(sp, "cj"), 120, "the spool to be shipped")
        # a metrics export, heartbeats and the log event reach the outbox and are acked
        wait_for(lambda: outbox_acked_with(sp, "agent.clock_offset_ns", "nccl_warn", 2), 60,
                 "the agent's metrics, heartbeats and log event to be acknowledged")
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
        counters = state(sp)["counters"]
        assert counters["corrupt_frames"] >= 3 and counters["corrupt_bytes"] >= 200
        srv.stop()
        steps, events, beats, metrics = query(
            srv.store_url,
            "SELECT rank, count() AS n, min(step) AS lo, max(step) AS hi FROM steps WHERE job='cj' "
            "GROUP BY rank ORDER BY rank",
            "SELECT kind, rank, source, message FROM log_events ORDER BY ts_ns",
            "SELECT rank, argMax(alive, ts_ns) AS alive, argMax(last_step, ts_ns) AS last_step "
            "FROM heartbeats WHERE job='cj' GROUP BY rank ORDER BY rank",
            "SELECT name, value FROM metrics WHERE source='agent' AND name LIKE 'agent.clock%' "
            "ORDER BY ts_ns DESC LIMIT 2")
        assert steps == [{"rank": 0, "n": 25, "lo": 0, "hi": 24}, {"rank": 1, "n": 8, "lo": 0, "hi": 7}]
        kinds = [(e["kind"], e["rank"]) for e in events]
        assert ("nccl_warn", 0) in kinds
        assert sum(k == "spool_corrupt" for k, _ in kinds) >= 3
        assert any("not an Arrow IPC stream" in e["message"] for e in events)
        assert beats == [{"rank": -1, "alive": 1, "last_step": -1},  # the host row
                         {"rank": 0, "alive": 1, "last_step": 24}, {"rank": 1, "alive": 1, "last_step": 7}]
        clock_m = {m["name"]: m["value"] for m in metrics}
        assert 0 <= clock_m["agent.clock_uncertainty_ns"] < 50e6
        assert abs(clock_m["agent.clock_offset_ns"]) <= clock_m["agent.clock_uncertainty_ns"] + 5e6
    finally:
        srv.kill()


def test_disk_budget_drop_oldest_with_server_unreachable(tmp_path):
    sp, log = tmp_path / "spool", tmp_path / "agent.log"
    writer = start_writer(sp, "budget", ranks=2, steps=80, interval=0.05, segment_bytes=16 << 10)
    budget = 96 << 10
    batch = 16 << 10
    agent = start_agent(sp, f"http://127.0.0.1:{free_port()}", log, "--no-clock-sync",
                        "--disk-budget", str(budget), "--budget-policy", "drop-oldest",
                        "--batch-bytes", str(batch))
    try:
        assert writer.wait(120) == 0
        wait_for(lambda: state(sp).get("counters", {}).get("dropped_unacked_bytes", 0) > 0, 60,
                 "the drop to be counted")

        def unprotected_bytes() -> int:
            segs = {str(p.relative_to(sp)): size_of(p) or 0
                    for p in sp.glob("budget/rank-*/seg-*.fsp")}
            # never dropped (the policy): each rank's live segment, the pending batches' files
            # (once the writer is gone its last segment is sealed and may go too)
            protected = {str(spool.list_segments(d)[-1].relative_to(sp))
                         for d in (sp / "budget").glob("rank-*") if spool.list_segments(d)}
            protected |= {r["file"] for p in state(sp).get("pending", []) for r in p["ranges"]}
            return sum(n for k, n in segs.items() if k not in protected)

        wait_for(lambda: unprotected_bytes() <= budget, 30, "the spool to fit the budget")
        on_disk = sum(size_of(p) or 0 for p in sp.glob("budget/rank-*/seg-*.fsp"))
        assert on_disk < 4 * budget  # the spool did not keep growing (the writer wrote ~1.4 MB)
        written = sum(json.loads(p.read_text())["records"]["steps"]["count"]
                      for p in (sp / "budget").glob("expected-rank-*.json"))
        assert written == 2 * 80  # the writer wrote everything, unblocked
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(20)
    text = log.read_text()
    assert "SPOOL" in text and "DISK BUDGET" in text
    assert "deleted unacknowledged spool segment" in text
    timings = [json.loads(p.read_text()) for p in (sp / "budget").glob("expected-rank-*.json")]
    assert len(timings) == 2 and max(t["p99_write_s"] for t in timings) < 2.0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v", "-s"]))
