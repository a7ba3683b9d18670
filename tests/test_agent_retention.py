"""Retention and the disk budget policy (agent/retention.py), on real files."""

from __future__ import annotations

import logging
import os
import time

from fleetscope.agent.offsets import OffsetStore, Pending, Range
from fleetscope.agent.ranks import RankRegistry
from fleetscope.agent.retention import Retention
from fleetscope.agent.tailer import SpoolTailer

from fleetscope import spool


def setup(tmp_path, num_segments=5, size=1000):
    d = spool.rank_dir(tmp_path / "spool", "j", 0)
    d.mkdir(parents=True)
    base = time.time_ns()
    for i in range(num_segments):
        p = d / spool.segment_name(i)
        p.write_bytes(b"x" * size)
        os.utime(p, ns=(base + i * 10**9, base + i * 10**9))  # oldest first by mtime
    offsets = OffsetStore(tmp_path / "offsets.json")
    tailer = SpoolTailer(tmp_path / "spool", None, offsets, RankRegistry())
    return tailer, offsets, d


def ack(offsets, tailer, indices):
    for s in tailer.segments():
        if spool.segment_index(s.path) in indices:
            offsets.commit(Pending("k", (Range(s.key, s.ino, 0, s.size),)))


def names(d):
    return [spool.segment_index(p) for p in spool.list_segments(d)]


def test_acked_sealed_segments_go_at_once_unacked_and_live_stay(tmp_path):
    tailer, offsets, d = setup(tmp_path)
    ack(offsets, tailer, {0, 1, 3, 4})  # 4 is acked but live (newest): kept
    Retention(offsets).apply(tailer.segments())
    assert names(d) == [2, 4]
    assert "j/rank-00000/seg-00000000.fsp" not in offsets.files  # forgotten with the file


def test_budget_deletes_acked_oldest_first_when_retained(tmp_path):
    tailer, offsets, d = setup(tmp_path)
    ack(offsets, tailer, {0, 1, 2})
    r = Retention(offsets, budget_bytes=3500, retain_acked=True)
    r.apply(tailer.segments())
    assert names(d) == [2, 3, 4]  # 0 and 1 (oldest acked) went; 2 stays: now within budget
    assert r.stats.deleted_acked_segments == 2 and r.stats.spool_bytes == 3000


def test_budget_policy_keep_never_deletes_unacked_and_warns(tmp_path, caplog):
    tailer, offsets, d = setup(tmp_path)
    r = Retention(offsets, budget_bytes=2000, policy="keep")
    with caplog.at_level(logging.WARNING, logger="fleetscope.agent"):
        r.apply(tailer.segments())
    assert names(d) == [0, 1, 2, 3, 4]
    assert "SPOOL OVER DISK BUDGET" in caplog.text and "policy keep" in caplog.text
    assert r.stats.unacked_bytes == 5000


def test_near_budget_warns_before_anything_unacked_goes(tmp_path, caplog):
    tailer, offsets, d = setup(tmp_path)
    r = Retention(offsets, budget_bytes=5300, policy="drop-oldest")
    with caplog.at_level(logging.WARNING, logger="fleetscope.agent"):
        r.apply(tailer.segments())
    assert names(d) == [0, 1, 2, 3, 4]
    assert "SPOOL NEAR DISK BUDGET" in caplog.text and r.stats.budget_warnings == 1


def test_budget_policy_drop_oldest_deletes_oldest_sealed_unacked(tmp_path, caplog):
    tailer, offsets, d = setup(tmp_path)
    ack(offsets, tailer, {2})
    dropped = []
    r = Retention(offsets, budget_bytes=2500, policy="drop-oldest",
                  on_drop=lambda s, lost: dropped.append((s.key, lost)))
    busy = {"j/rank-00000/seg-00000003.fsp"}  # in a batch being sent: never dropped
    with caplog.at_level(logging.ERROR, logger="fleetscope.agent"):
        r.apply(tailer.segments(), busy)
    # 2 (acked) goes first, then the oldest unacked 0 and 1; 3 is busy, 4 is live
    assert names(d) == [3, 4]
    assert [k for k, _ in dropped] == ["j/rank-00000/seg-00000000.fsp", "j/rank-00000/seg-00000001.fsp"]
    assert offsets.counters["dropped_unacked_bytes"] == 2000
    assert "deleted unacknowledged spool segment" in caplog.text
