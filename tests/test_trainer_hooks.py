"""trainer_hooks in one process: sections, steps, sinks, drops, fork safety, 1-rank gloo."""

from __future__ import annotations

import dataclasses
import os
import time

import pytest
from fleetscope.trainer_hooks.reader import read_job

from fleetscope import codec, spool
from fleetscope import trainer_hooks as hooks
from fleetscope.schema import RECORD_TYPES
from fleetscope.topology import Topology

FAST = hooks.HookConfig(poll_interval_s=0.01, flush_interval_s=0.05, inflight_interval_s=0.05,
                        metrics_interval_s=0.2)


@pytest.fixture(autouse=True)
def _no_recorder_left():
    yield
    hooks.shutdown()


def test_disabled_hooks_are_noops():
    assert not hooks.enabled()

    @hooks.section("decorated")
    def f(x):
        return x + 1

    with hooks.section("forward", microbatch=1):
        hooks.step(3)
        hooks.emit("jobs", job="x", dp=1, tp=1, pp=1)
    assert f(1) == 2
    assert hooks.stats() == {}


def test_sections_steps_microbatch_and_metrics_in_memory_sink():
    sink = hooks.MemorySink()
    hooks.init(job="j", rank=3, topology=Topology(dp=2, tp=2, pp=1), sink=sink, config=FAST,
               trace_collectives=False)

    @hooks.section("optimizer")
    def opt():
        time.sleep(0.002)

    for step in range(2):
        with hooks.step(step, num_microbatches=2, tokens=64):
            for mb in range(2):
                with hooks.section("forward", microbatch=mb):
                    with hooks.section("inner"):
                        time.sleep(0.001)
            opt()
            hooks.step_info(loss=2.5 - step)
    hooks.shutdown()
    sections = sink.rows("sections")
    assert len(sections) == 2 * (2 * 2 + 1)
    inner = [s for s in sections if s["name"] == "inner"]
    assert [s["microbatch"] for s in inner] == [0, 1, 0, 1]  # inherited from the enclosing section
    assert all(s["kind"] == "other" for s in inner)
    fwd = [s for s in sections if s["name"] == "forward"]
    assert all(s["kind"] == "compute" and s["duration_ns"] >= 1_000_000 for s in fwd)
    assert {s["kind"] for s in sections if s["name"] == "optimizer"} == {"optimizer"}
    assert all(s["rank"] == 3 and s["job"] == "j" and s["device_ns"] == -1 for s in sections)
    # epoch-based absolute times
    assert abs(sections[0]["start_ns"] - time.time_ns()) < 60e9
    steps = sink.rows("steps")
    assert [(s["step"], s["loss"], s["num_microbatches"]) for s in steps] == [(0, 2.5, 2), (1, 1.5, 2)]
    assert all(s["end_ns"] - s["start_ns"] == s["duration_ns"] > 0 for s in steps)
    metrics = {m["name"]: m for m in sink.rows("metrics") if m["source"] == "hooks"}
    assert metrics["hooks.hooked_calls_total"]["value"] >= 10
    assert 0 < metrics["hooks.overhead_ns_per_call"]["value"] < 1e6
    assert sink.info["rank"] == 3 and sink.info["tp"] == 1 and sink.closed
    for rt, rows in sink.records.items():  # every row fits the schema
        codec.rows_to_table(RECORD_TYPES[rt], rows)


def test_sections_on_a_cpu_device_carry_the_threads_cpu_time():
    """On the CPU (no event clock) a section's ``cpu_ns`` is the CPU time of the thread
    that ran it: a section that sleeps or waits for a core keeps its wall time in
    ``duration_ns`` but adds almost nothing to ``cpu_ns``; one that computes adds its work."""
    sink = hooks.MemorySink()
    hooks.init(job="j", rank=0, sink=sink, config=FAST, trace_collectives=False)
    with hooks.step(0):
        with hooks.section("dataloader"):
            time.sleep(0.05)
        with hooks.section("forward"):
            end = time.thread_time_ns() + 30_000_000
            while time.thread_time_ns() < end:
                pass
    hooks.shutdown()
    by = {s["name"]: s for s in sink.rows("sections")}
    assert by["dataloader"]["duration_ns"] >= 50_000_000
    assert 0 <= by["dataloader"]["cpu_ns"] < 10_000_000
    assert 30_000_000 <= by["forward"]["cpu_ns"] <= by["forward"]["duration_ns"] + 1_000_000
    assert all(s["device_ns"] == -1 for s in by.values())
    for rt, rows in sink.records.items():
        codec.rows_to_table(RECORD_TYPES[rt], rows)

    sink = hooks.MemorySink()  # switched off: not measured
    hooks.init(job="j", rank=0, sink=sink, trace_collectives=False,
               config=dataclasses.replace(FAST, section_cpu_time=False))
    with hooks.step(0), hooks.section("forward"):
        pass
    hooks.shutdown()
    assert [s["cpu_ns"] for s in sink.rows("sections")] == [-1]


def test_adjacent_sections_share_one_cpu_clock_reading():
    """A section entered right after another ended on the same thread starts from that
    end's CPU-clock reading (one syscall less); after a pause, or on another thread, it
    reads the clock itself. Either way the sections' cpu_ns stay exact differences."""
    import threading

    sink = hooks.MemorySink()
    rec = hooks.init(job="j", rank=0, sink=sink, config=FAST, trace_collectives=False)
    reads: list[int] = []
    clock = iter(range(1000, 10**6, 100))

    def counting_clock() -> int:
        reads.append(threading.get_ident())
        return next(clock)

    rec.thread_cpu_ns = counting_clock
    with hooks.step(0):
        for name in ("forward", "backward", "optimizer"):
            with hooks.section(name):
                pass
    assert len(reads) == 4  # one entry reading, then each end's reading reused
    time.sleep(0.01)  # a pause: the next section reads the clock at entry
    with hooks.section("dataloader"):
        pass
    assert len(reads) == 6

    def other() -> None:
        with hooks.section("forward", kind="other"):
            pass

    with hooks.section("forward"):
        pass
    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert reads[-2] == reads[-1] == t.ident  # its own entry reading, not the main thread's
    hooks.shutdown()
    cpu = [s["cpu_ns"] for s in sink.rows("sections")]
    assert cpu == [100, 100, 100, 100, 100, 100]
    assert hooks.recorder.CPU_REUSE_NS == 20_000


def test_inflight_records_while_inside_a_section():
    sink = hooks.MemorySink()
    hooks.init(job="j", rank=0, sink=sink, config=FAST, trace_collectives=False)
    hooks.step(7)
    with hooks.section("dataloader"):
        time.sleep(0.4)
    time.sleep(0.15)
    hooks.shutdown()
    rows = sink.rows("inflight")
    busy = [r for r in rows if r["kind"] == "section" and r["op"] == "dataloader"]
    assert len(busy) >= 4
    assert len({r["since_ns"] for r in busy}) == 1 and all(r["step"] == 7 for r in busy)
    assert busy[-1]["ts_ns"] - busy[0]["ts_ns"] >= 0.2e9
    assert any(r["kind"] == "idle" for r in rows)


def test_spool_sink_writes_rank_dir_frames_and_rotates(tmp_path):
    sink = hooks.SpoolSink(tmp_path, segment_bytes=4096)
    hooks.init(job="job7", rank=5, sink=sink, config=FAST, trace_collectives=False, local_rank=1)
    for step in range(30):
        hooks.step(step)
        with hooks.section("forward", microbatch=0):
            pass
        time.sleep(0.01)
    hooks.shutdown()
    d = spool.rank_dir(tmp_path, "job7", 5)
    info = spool.read_rank_info(d)
    assert {"pid", "host", "local_rank", "job", "rank", "started_ns"} <= set(info)
    assert info["rank"] == 5 and info["local_rank"] == 1 and info["pid"] == os.getpid()
    assert len(spool.list_segments(d)) >= 2
    for seg in spool.list_segments(d):
        for frame in spool.read_frames(seg, sealed=True):
            assert not frame.corrupt
            # one uncompressed Arrow IPC stream of one record type per frame
            assert codec.decode_batch(codec.FRAME_MAGIC + len(frame.payload).to_bytes(4, "little")
                                      + frame.payload)
    rows = read_job(tmp_path, "job7")
    assert sorted(s["step"] for s in rows["sections"]) == list(range(30))
    assert len(rows["steps"]) == 30


class CrashingSink(hooks.MemorySink):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def write(self, record_type, rows):
        self.calls += 1
        raise RuntimeError("disk on fire")


def test_crashing_sink_and_unwritable_dir_count_drops(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for sink in (CrashingSink(), hooks.SpoolSink(blocker / "spool")):
        rec = hooks.init(job="j", rank=0, sink=sink, config=FAST, trace_collectives=False)
        for step in range(5):
            hooks.step(step)
            with hooks.section("forward"):
                time.sleep(0.01)
        hooks.shutdown()
        s = rec.stats()
        assert s["dropped_records"] >= 10 and s["sink_errors"] >= 1
        assert s["records_written"] == 0


def test_full_queue_drops_are_counted_and_reported():
    sink = hooks.MemorySink()
    cfg = hooks.HookConfig(queue_capacity=8, poll_interval_s=30, metrics_interval_s=30)
    rec = hooks.init(job="j", rank=0, sink=sink, config=cfg, trace_collectives=False)
    for _ in range(100):
        with hooks.section("forward"):
            pass
    assert rec.stats()["queue_dropped"] == 92
    hooks.shutdown()
    assert len(sink.rows("sections")) == 8
    dropped = [m["value"] for m in sink.rows("metrics") if m["name"] == "hooks.dropped_records_total"]
    assert dropped and dropped[-1] >= 92


def test_forked_child_is_disabled():
    sink = hooks.MemorySink()
    hooks.init(job="j", rank=0, sink=sink, config=FAST, trace_collectives=False)
    pid = os.fork()
    if pid == 0:  # child: must not record into the parent's sink/spool
        code = 3 if hooks.enabled() else 0
        with hooks.section("forward"):
            pass
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert hooks.enabled()


def test_section_overhead_is_measured_and_small():
    rec = hooks.init(job="j", rank=0, sink=hooks.MemorySink(), config=FAST,
                     trace_collectives=False)
    for _ in range(2000):
        with hooks.section("forward"):
            pass
    s = rec.stats()
    assert s["calls"] == 2000
    assert 0 < s["overhead_ns"] / s["calls"] < 50_000  # generous bound for a loaded 2-core CI box


@pytest.mark.gpu
def test_cuda_sections_use_device_time():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    sink = hooks.MemorySink()
    hooks.init(job="j", rank=0, sink=sink, config=FAST, trace_collectives=False,
               device=torch.device("cuda", 0))
    a = torch.randn(2048, 2048, device="cuda")
    with hooks.section("forward"):
        for _ in range(10):
            a = a @ a / 2048
    hooks.shutdown()
    (row,) = sink.rows("sections")
    assert row["device_ns"] > 0 and row["duration_ns"] == row["device_ns"]


def test_inflight_names_a_collective_still_running_on_the_device():
    """GPU case without a GPU: an op whose end event has not fired (a stand-in event,
    since CUDA cannot exist here) is what the rank waits on, even when the training
    thread itself is idle. The real path runs in bench/gpu_check.py on a CUDA machine."""
    from fleetscope.trainer_hooks.collectives import GroupInfo, Op
    from fleetscope.trainer_hooks.recorder import Recorder, perf_ns

    class PendingEvent:
        def query(self):
            return False

    rec = Recorder("j", 1, hooks.MemorySink(), topology=Topology(dp=2), config=FAST)
    group = GroupInfo(None, "dp.pp0.tp0", "dp", [0, 1], 1)
    op = Op("all_reduce", group, 7, 3, -1, 1024, "float32", -1, perf_ns() - 2_000_000_000)
    op.ev1 = PendingEvent()
    rec.enqueue(("C", op))
    rec._drain()
    assert rec.waiting  # not converted: the device has not finished it
    rec._inflight()
    (row,) = rec.rows["inflight"]
    assert (row["kind"], row["op"], row["group_id"], row["seq"], row["step"]) == (
        "collective", "all_reduce", "dp.pp0.tp0", 7, 3)
    assert time.time_ns() - row["since_ns"] >= 1.9e9
