"""Agent units on real files: durable offsets, spool tailing, batches, corrupt frames."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from fleetscope.agent.batch import batch_key, build_batch, frames_for_ranges
from fleetscope.agent.heartbeats import heartbeat_rows
from fleetscope.agent.offsets import OffsetStore, Pending, Range
from fleetscope.agent.outbox import Outbox
from fleetscope.agent.ranks import INFO_RECHECK_S, RankRegistry, spool_final_step
from fleetscope.agent.tailer import SpoolTailer, scan_frames

from fleetscope import codec, spool
from fleetscope.schema import record_type


def steps_frame(job: str, rank: int, steps: range) -> bytes:
    rows = [{"job": job, "rank": rank, "step": s, "start_ns": 10 + s, "end_ns": 20 + s,
             "duration_ns": 10} for s in steps]
    return spool.encode_frame(codec.table_to_ipc(codec.rows_to_table(record_type("steps"), rows),
                                                 compression=None))


def append(path, *frames: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        for fr in frames:
            f.write(fr)


def make_tailer(tmp_path, job=None):
    offsets = OffsetStore(tmp_path / "state" / "offsets.json")
    ranks = RankRegistry()
    return SpoolTailer(tmp_path / "spool", tmp_path / "state" / "outbox", offsets, ranks, job), offsets


def test_offsets_are_durable_and_pending_survives_reopen(tmp_path):
    store = OffsetStore(tmp_path / "offsets.json")
    p = Pending("k1", (Range("j/rank-00000/seg-00000000.fsp", 7, 0, 100),), clock_offset_ns=42)
    store.begin(p)
    reopened = OffsetStore(tmp_path / "offsets.json")
    assert reopened.pending == [p] and reopened.offset("j/rank-00000/seg-00000000.fsp", 7) == 0
    reopened.commit(p, {"corrupt_frames": 2})
    again = OffsetStore(tmp_path / "offsets.json")
    assert again.pending == []
    assert again.offset("j/rank-00000/seg-00000000.fsp", 7) == 100
    assert again.offset("j/rank-00000/seg-00000000.fsp", 8) == 0  # replaced file: new inode
    assert again.counters == {"corrupt_frames": 2}
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed away


def test_tailer_finds_new_ranks_and_segments_and_resumes(tmp_path):
    tailer, offsets = make_tailer(tmp_path)
    seg0 = spool.rank_dir(tmp_path / "spool", "j", 0) / spool.segment_name(0)
    append(seg0, steps_frame("j", 0, range(0, 3)))
    frames = tailer.read(1 << 20)
    assert [f.segment.key for f in frames] == ["j/rank-00000/seg-00000000.fsp"]
    assert not frames[0].segment.sealed
    assert tailer.read(1 << 20) == []  # read position advanced
    # a new rank and a new segment of rank 0 appear
    append(spool.rank_dir(tmp_path / "spool", "j", 1) / spool.segment_name(0), steps_frame("j", 1, range(3)))
    append(seg0.parent / spool.segment_name(1), steps_frame("j", 0, range(3, 5)))
    segs = {s.key: s for s in tailer.segments()}
    assert segs["j/rank-00000/seg-00000000.fsp"].sealed
    assert not segs["j/rank-00000/seg-00000001.fsp"].sealed
    more = tailer.read(1 << 20)
    assert sorted(f.segment.key for f in more) == ["j/rank-00000/seg-00000001.fsp",
                                                   "j/rank-00001/seg-00000000.fsp"]
    # nothing acknowledged yet: a new tailer (a restarted agent) starts over
    tailer2, _ = make_tailer(tmp_path)
    assert len(tailer2.read(1 << 20)) == 3
    # acknowledge the first frame: a restart resumes after it
    b = build_batch("h", frames, None)
    offsets.commit(Pending(b.key, b.ranges))
    tailer3, _ = make_tailer(tmp_path)
    assert len(tailer3.read(1 << 20)) == 2


def test_job_filter_and_dot_dirs_ignored(tmp_path):
    tailer, _ = make_tailer(tmp_path, job="wanted")
    append(spool.rank_dir(tmp_path / "spool", "other", 0) / spool.segment_name(0), steps_frame("other", 0, range(2)))
    append(spool.rank_dir(tmp_path / "spool", "wanted", 0) / spool.segment_name(0), steps_frame("wanted", 0, range(2)))
    append(tmp_path / "spool" / ".hidden" / "rank-00000" / spool.segment_name(0), steps_frame("x", 0, range(2)))
    assert {f.segment.job for f in tailer.read(1 << 20)} == {"wanted"}


def test_corrupt_bytes_are_skipped_and_reported_in_the_batch(tmp_path):
    tailer, _ = make_tailer(tmp_path)
    d = spool.rank_dir(tmp_path / "spool", "j", 0)
    damaged = bytearray(steps_frame("j", 0, range(10, 12)))
    damaged[30] ^= 0xFF
    not_arrow = spool.encode_frame(b"this is not an arrow stream")
    append(d / spool.segment_name(0), steps_frame("j", 0, range(0, 5)), b"\x00garbage\x00",
           bytes(damaged), not_arrow, steps_frame("j", 0, range(5, 10)))
    append(d / spool.segment_name(1), steps_frame("j", 0, range(20, 21)))  # seals segment 0
    b = build_batch("h", tailer.read(1 << 20), None)
    assert b.num_rows == 11
    reasons = [r for _, r in b.bad]
    assert len(reasons) == 3 and any("not an Arrow IPC stream" in r for r in reasons)
    # the ranges tile every byte read, so an ack moves the offset past the bad bytes
    assert sum(r.end - r.start for r in b.ranges) == sum(
        os.path.getsize(d / spool.segment_name(i)) for i in (0, 1))


def test_truncated_tail_waits_in_live_segment_and_is_final_once_sealed(tmp_path):
    tailer, _ = make_tailer(tmp_path)
    seg = spool.rank_dir(tmp_path / "spool", "j", 0) / spool.segment_name(0)
    whole = steps_frame("j", 0, range(3))
    append(seg, steps_frame("j", 0, range(0, 1)), whole[:20])
    assert [f.payload is not None for f in tailer.read(1 << 20)] == [True]
    assert tailer.read(1 << 20) == []  # the writer may still be writing the rest
    append(seg.parent / spool.segment_name(1), steps_frame("j", 0, range(5, 6)))
    got = tailer.read(1 << 20)
    assert [f.payload is None for f in got] == [True, False]  # torn tail reported, then seg 1


def test_scan_frames_window_growth_for_large_frames(tmp_path):
    big = steps_frame("j", 0, range(0, 60000))  # > the 1 MiB minimum window
    assert len(big) > (1 << 20)
    tailer, _ = make_tailer(tmp_path)
    append(spool.rank_dir(tmp_path / "spool", "j", 0) / spool.segment_name(0), big)
    frames = tailer.read(1024)
    assert len(frames) == 1 and frames[0].end == len(big)
    assert list(scan_frames(big[:100], 0, final=False)) == []


def test_batch_key_depends_on_host_file_and_range_only(tmp_path):
    r = (Range("j/rank-00000/seg-00000000.fsp", 5, 0, 100),)
    assert batch_key("h1", r) == batch_key("h1", r)
    assert batch_key("h1", r) != batch_key("h2", r)
    assert batch_key("h1", r) != batch_key("h1", (Range(r[0].file, 5, 0, 101),))


def test_pending_batch_is_rebuilt_identically_from_its_ranges(tmp_path):
    tailer, _ = make_tailer(tmp_path)
    d = spool.rank_dir(tmp_path / "spool", "j", 3)
    append(d / spool.segment_name(0), steps_frame("j", 3, range(4)), steps_frame("j", 3, range(4, 9)))
    b = build_batch("h", tailer.read(1 << 20), None)
    paths = {s.key: s.path for s in tailer.segments()}
    again = build_batch("h", frames_for_ranges(b.ranges, paths), None)
    assert again.key == b.key and again.num_rows == b.num_rows == 9
    assert codec.decode_batch(again.encode("zstd"))["steps"].drop(["loss"]).equals(
        codec.decode_batch(b.encode("zstd"))["steps"].drop(["loss"]))  # loss is NaN


def test_batch_fills_empty_host_and_tracks_rank_liveness(tmp_path):
    tailer, _ = make_tailer(tmp_path)
    d = spool.rank_dir(tmp_path / "spool", "j", 2)
    spool.write_rank_info(d, {"pid": os.getpid(), "host": "", "local_rank": 2})
    inflight = codec.rows_to_table(record_type("inflight"), [{
        "job": "j", "rank": 2, "ts_ns": 500, "step": 4, "kind": "collective", "op": "all_reduce",
        "group_id": "dp.pp0.tp0", "seq": 17, "since_ns": 400}])
    append(d / spool.segment_name(0), steps_frame("j", 2, range(5)),
           spool.encode_frame(codec.table_to_ipc(inflight, compression=None)))
    ranks = tailer.ranks
    b = build_batch("node7", tailer.read(1 << 20), ranks)
    tables = codec.decode_batch(b.encode(None))
    assert set(tables["steps"].column("host").to_pylist()) == {"node7"}
    (st,) = ranks.all()
    assert (st.rank, st.local_rank, st.last_step) == (2, 2, 4)
    assert st.inflight_op == "collective:all_reduce dp.pp0.tp0 seq=17"
    assert ranks.writer_alive(st)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()  # reaped: the pid names no process
    return p.pid


def test_a_dead_ranks_heartbeat_reports_the_last_step_in_its_spool(tmp_path):
    """A heartbeat that sees a rank's exit before the shipper read its final steps reports
    the spool's last step (the server waits for the store to hold it before judging who
    fell behind), and the exit at once."""
    tailer, _ = make_tailer(tmp_path)
    d = spool.rank_dir(tmp_path / "spool", "j", 1)
    spool.write_rank_info(d, {"pid": os.getpid(), "host": "", "local_rank": 1})
    append(d / spool.segment_name(0), steps_frame("j", 1, range(5)))
    ranks = tailer.ranks
    build_batch("h", tailer.read(1 << 20), ranks)  # the shipper has read steps 0-4
    inflight = codec.rows_to_table(record_type("inflight"), [{
        "job": "j", "rank": 1, "ts_ns": 900, "step": 9, "kind": "idle", "since_ns": 900}])
    append(d / spool.segment_name(0), steps_frame("j", 1, range(5, 8)), b"FSP1-damaged-bytes")
    append(d / spool.segment_name(1), steps_frame("j", 1, range(8, 10)),
           spool.encode_frame(codec.table_to_ipc(inflight, compression=None)))

    def row() -> dict:
        (r,) = [x for x in heartbeat_rows("h", "", "", 0, ranks, ts_ns=1) if x["rank"] == 1]
        return r

    assert (row()["alive"], row()["last_step"]) == (True, 4)  # alive: what was read
    spool.write_rank_info(d, {"pid": _dead_pid(), "host": "", "local_rank": 1})
    time.sleep(INFO_RECHECK_S + 0.1)
    assert (row()["alive"], row()["last_step"]) == (False, 9)  # gone: its spool's last step
    assert spool_final_step(d) == 9 and spool_final_step(tmp_path / "none") == -1
    # a restarted rank (a new process) whose new segment holds no step yet: the one before it
    append(d / spool.segment_name(2), spool.encode_frame(codec.table_to_ipc(inflight, compression=None)))
    spool.write_rank_info(d, {"pid": _dead_pid(), "host": "", "local_rank": 1})
    time.sleep(INFO_RECHECK_S + 0.1)
    assert (row()["alive"], row()["last_step"]) == (False, 9)


def test_outbox_segments_rotate_and_are_tailed(tmp_path):
    tailer, _ = make_tailer(tmp_path)
    box = Outbox(tmp_path / "state" / "outbox", max_segment_bytes=2000)
    for i in range(20):
        box.write("log_events", [{"ts_ns": i, "host": "h", "kind": "oom", "message": f"m{i}"}])
    box.close()
    segs = tailer.segments()
    assert len(segs) > 1 and all(s.key.startswith("@outbox/") for s in segs)
    b = build_batch("h", tailer.read(1 << 20), None)
    assert b.num_rows == 20 and not b.bad
    # a second agent run starts a fresh segment, sealing the old ones
    Outbox(tmp_path / "state" / "outbox").write("log_events", [{"ts_ns": 1, "host": "h", "kind": "x", "message": "y"}])
    assert all(s.sealed for s in tailer.segments()[:-1])


def test_invalid_state_file_version_is_refused(tmp_path):
    (tmp_path / "offsets.json").write_text(json.dumps({"version": 99}))
    with pytest.raises(ValueError, match="version 99"):
        OffsetStore(tmp_path / "offsets.json")
