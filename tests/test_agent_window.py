"""The in-flight window: offsets move only over each file's contiguous acked prefix."""

from __future__ import annotations

import threading
import time

import pytest
from fleetscope.agent.offsets import Range
from fleetscope.agent.window import AckWindow

A, C = "j/rank-00000/seg-00000000.fsp", "j/rank-00001/seg-00000000.fsp"


def test_out_of_order_acks_commit_only_the_contiguous_prefix():
    w = AckWindow(limit=4)
    w.add("b1", [Range(A, 1, 0, 100)])
    w.add("b2", [Range(A, 1, 100, 200), Range(C, 2, 0, 10)])
    w.add("b3", [Range(A, 1, 200, 300)])
    # b2 first: C has nothing before it, A still waits for b1; b2 is not retired
    adv = w.ack("b2")
    assert adv.ranges == (Range(C, 2, 0, 10),) and adv.retired == ()
    adv = w.ack("b3")
    assert adv.ranges == () and adv.retired == ()
    assert (w.unacked, len(w)) == (1, 3)
    # b1 closes the gap: A moves over all three, all are retired in file order
    adv = w.ack("b1")
    assert adv.ranges == (Range(A, 1, 0, 300),)
    assert adv.retired == ("b1", "b2", "b3")
    assert (w.unacked, len(w)) == (0, 0)


def test_gap_in_one_file_does_not_hold_back_other_files_or_later_gaps():
    w = AckWindow(limit=8)
    for i in range(6):
        w.add(f"b{i}", [Range(A, 1, i * 10, i * 10 + 10)])
    assert w.ack("b0").ranges == (Range(A, 1, 0, 10),)
    assert w.ack("b2").ranges == ()
    assert w.ack("b1").ranges == (Range(A, 1, 10, 30),)  # b1+b2, stops at unacked b3
    assert w.ack("b5").ranges == ()
    assert w.ack("b3").ranges == (Range(A, 1, 30, 40),)
    adv = w.ack("b4")
    assert adv.ranges == (Range(A, 1, 40, 60),) and adv.retired == ("b4", "b5")


def test_replaced_file_is_a_different_file():
    w = AckWindow(limit=4)
    w.add("old", [Range(A, 1, 0, 100)])
    w.add("new", [Range(A, 9, 0, 50)])  # same name, new inode: its own sequence
    assert w.ack("new").ranges == (Range(A, 9, 0, 50),)


def test_batch_without_ranges_and_bad_calls():
    w = AckWindow(limit=2)
    w.add("empty", [])
    assert w.ack("empty").retired == ("empty",)
    w.add("b1", [Range(A, 1, 100, 200)])
    with pytest.raises(ValueError, match="already in flight"):
        w.add("b1", [Range(A, 1, 200, 300)])
    with pytest.raises(ValueError, match="not after"):
        w.add("b2", [Range(A, 1, 150, 250)])  # overlaps what is in flight
    w.ack("b1")
    with pytest.raises(ValueError, match="not in flight"):
        w.ack("b1")
    with pytest.raises(ValueError, match="at least 1"):
        AckWindow(limit=0)


def test_limit_blocks_until_an_ack_and_stop_releases():
    w = AckWindow(limit=2)
    stop = threading.Event()
    w.add("b1", [Range(A, 1, 0, 10)])
    w.add("b2", [Range(A, 1, 10, 20)])
    assert not w.has_slot()
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(w.wait_slot(stop, poll_s=0.05)))
    t.start()
    time.sleep(0.2)
    assert t.is_alive() and not got  # two unacked: the third waits
    w.ack("b2")  # acked beyond the gap (b1): frees a send slot, b2 is not retired
    t.join(5)
    assert got == [True] and w.has_slot() and len(w) == 2
    w.add("b3", [Range(A, 1, 20, 30)])
    t = threading.Thread(target=lambda: got.append(w.wait_slot(stop, poll_s=0.05)))
    t.start()
    stop.set()
    t.join(5)
    assert got == [True, False]


def test_unretired_batches_are_bounded_while_the_head_is_stuck():
    w = AckWindow(limit=2, max_unretired=4)
    w.add("head", [Range(A, 1, 0, 10)])
    for i in range(1, 4):
        w.add(f"b{i}", [Range(A, 1, i * 10, i * 10 + 10)])
        if i < 3:
            w.ack(f"b{i}")
    w.ack("b3")
    # one unacked (the stuck head), but four not retired: no more batches until it moves
    assert (w.unacked, len(w)) == (1, 4) and not w.has_slot()
    assert w.ack("head").retired == ("head", "b1", "b2", "b3")
    assert w.has_slot()
