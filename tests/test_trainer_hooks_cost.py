"""What keeps trainer_hooks cheap: the direct Arrow IPC encoder (no pandas import, exact
same stream as the codec), one spool write per flush, a background thread that sleeps
between periodic wake-ups, and async completion recorded where the trainer observes it."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import time

import pytest
from fleetscope.trainer_hooks import encode

from fleetscope import codec, spool
from fleetscope import trainer_hooks as hooks
from fleetscope.schema import RECORD_TYPES, ColType
from tests.test_trainer_hooks import FAST, _no_recorder_left  # noqa: F401 (autouse fixture)


def _value(rnd: random.Random, t: ColType):
    if t in (ColType.STRING, ColType.SYMBOL):
        return rnd.choice(["", "a", "forwärd", "日本語", "x" * rnd.randint(0, 50)])
    if t == ColType.INT64:
        return rnd.choice([0, -1, 2**63 - 1, -(2**63), rnd.randint(-10**18, 10**18)])
    if t == ColType.INT32:
        return rnd.choice([0, 2**31 - 1, -(2**31), rnd.randint(-1000, 1000)])
    if t == ColType.BOOL:
        return rnd.choice([0, 1])
    return rnd.choice([0.5, -1e300, float("inf"), 3, 1e-9])


@pytest.mark.parametrize("name", sorted(RECORD_TYPES))
def test_direct_encoder_writes_the_codecs_stream(name):
    """Every record type, 1..100 rows, optional columns sometimes left out: the fast path
    is taken and pyarrow reads back exactly what the codec's own encoding holds."""
    rt = RECORD_TYPES[name]
    rnd = random.Random(name)
    lay = encode._layout(rt)
    for n in (1, 2, 3, 8, 100):
        rows = [{c.name: _value(rnd, c.type) for c in rt.columns
                 if c.default is None or rnd.random() < 0.7} for _ in range(n)]
        encode._record_batch(lay, encode._columns(lay[2], lay[3], rows), n)  # no _Slow
        got = codec.ipc_to_table(encode.ipc_stream(rt, rows))
        want = codec.rows_to_table(rt, rows)
        assert got.schema.equals(want.schema, check_metadata=True)
        assert repr(got.to_pylist()) == repr(want.to_pylist())  # repr: NaN/inf compare


@pytest.mark.parametrize("bad, named", [
    ({"step": 1.5}, "expected an integer"),
    ({"step": True}, "expected an integer"),
    ({"name": 7}, "expected a string"),
    ({"start_ns": 2**63}, "out of range"),
    ({"name": None}, "missing required field"),
])
def test_bad_values_take_the_checking_path_and_name_the_row(bad, named):
    rt = RECORD_TYPES["sections"]
    good = {"job": "j", "rank": 0, "host": "h", "step": 1, "name": "forward", "kind": "compute",
            "start_ns": 1, "end_ns": 2, "duration_ns": 1}
    with pytest.raises(codec.BatchError, match=r"sections\[1\].*" + named):
        encode.ipc_stream(rt, [good, dict(good, **bad)])


def test_spooling_never_imports_pandas(tmp_path):
    """pyarrow's ``pa.array`` imports pandas on first use (~0.5 s of CPU, GIL held);
    the hooks' encoder does not go there."""
    script = textwrap.dedent(f"""
        import sys, time
        from fleetscope import trainer_hooks as hooks
        cfg = hooks.HookConfig(flush_interval_s=0.05, inflight_interval_s=0.05,
                               poll_interval_s=0.05, metrics_interval_s=0.1)
        hooks.init(job="np", rank=0, spool={str(tmp_path)!r}, config=cfg,
                   trace_collectives=False)
        for step in range(5):
            with hooks.step(step, loss=1.0):
                with hooks.section("forward", microbatch=0):
                    time.sleep(0.05)
        hooks.shutdown()
        assert "pyarrow" in sys.modules
        print("pandas" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    from fleetscope.trainer_hooks.reader import read_job

    rows = read_job(tmp_path, "np")
    assert len(rows["sections"]) == 5 and len(rows["steps"]) == 5 and rows["metrics"]


class _CountingFile:
    def __init__(self, raw, writes: list[int]) -> None:
        self.raw, self.writes = raw, writes

    def write(self, data) -> int:
        self.writes.append(len(data))
        return self.raw.write(data)

    def close(self) -> None:
        self.raw.close()


class CountingSpoolSink(hooks.SpoolSink):
    """A real SpoolSink that counts flushes (write_many) and write() calls on its file."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.calls: list[list[str]] = []
        self.writes: list[int] = []

    def _rotate(self) -> None:
        super()._rotate()
        self._file = _CountingFile(self._file, self.writes)

    def write_many(self, batches):
        self.calls.append(sorted(batches))
        return super().write_many(batches)


def test_one_spool_write_per_flush_holds_every_record_type(tmp_path):
    sink = CountingSpoolSink(tmp_path)
    hooks.init(job="w", rank=2, sink=sink, config=FAST, trace_collectives=False)
    for step in range(6):
        with hooks.step(step, loss=0.5):
            with hooks.section("forward", microbatch=0):
                time.sleep(0.02)
    time.sleep(0.1)
    hooks.shutdown()
    assert any(len(c) > 1 for c in sink.calls), sink.calls  # record types flushed together
    assert len(sink.writes) == len(sink.calls)  # ... each flush in one write()
    frames = [f for seg in spool.list_segments(spool.rank_dir(tmp_path, "w", 2))
              for f in spool.read_frames(seg, sealed=True)]
    assert frames and not any(f.corrupt for f in frames)
    assert len(frames) == sum(len(c) for c in sink.calls)  # one frame per record type
    assert sum(sink.writes) == sum(f.end - f.start for f in frames)


def test_background_thread_sleeps_between_periodic_wakeups():
    """Default config: one wake-up per 0.5 s does the queue, in-flight rows and the
    flush together (the old loop woke every 50 ms)."""
    rec = hooks.init(job="idle", rank=0, sink=hooks.MemorySink(), trace_collectives=False)
    time.sleep(2.2)
    s = rec.stats()
    assert 3 <= s["worker_wakeups"] <= 6, s
    assert s["worker_cpu_ns"] > 0
    hooks.shutdown()
    assert len(rec.sink.rows("inflight")) >= 4  # liveness keeps its 0.5 s period


def test_async_completion_is_recorded_when_the_trainer_sees_it():
    """``is_completed()`` on a traced Work records the completion there, not at the
    background thread's next poll (0.5 s later by default)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from fleetscope.trainer.launcher import free_port

    from fleetscope.topology import Topology

    sink = hooks.MemorySink()
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        rec = hooks.init(job="a", rank=0, topology=Topology(), sink=sink)
        t = torch.ones(1024)
        work = dist.all_reduce(t, async_op=True)
        while not work.is_completed():
            time.sleep(0.0005)
        seen = time.time_ns()
        assert rec.stats()["pending"] == 0  # recorded by is_completed(), nothing to poll
        work.wait()  # a second observer does not record it twice
        hooks.shutdown()
    finally:
        dist.destroy_process_group()
    (row,) = sink.rows("collectives")
    assert row["state"] == "completed" and row["op"] == "all_reduce"
    assert row["enqueued_ns"] <= row["completed_ns"] <= seen + 5_000_000


class _FillingFile:
    """A file on a disk that fills up after ``room`` bytes (partial write, then ENOSPC)."""

    def __init__(self, raw, room: int) -> None:
        self.raw, self.room = raw, room

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(28, "No space left on device")
        n = self.raw.write(bytes(data[:self.room]))
        self.room -= n
        return n

    def close(self) -> None:
        self.raw.close()


def test_a_write_cut_short_counts_only_the_frames_it_did_not_finish(tmp_path):
    ident = {"job": "full", "rank": 0, "host": "h"}
    sections = [dict(ident, step=1, name="forward", kind="compute", start_ns=1, end_ns=2,
                     duration_ns=1)]
    steps = [dict(ident, step=1, start_ns=1, end_ns=2, duration_ns=1)]
    first = len(spool.encode_frame(encode.ipc_stream(RECORD_TYPES["sections"], sections)))
    sink = hooks.SpoolSink(tmp_path)
    sink.open(dict(ident, pid=1, local_rank=0, started_ns=0))
    sink._file = _FillingFile(sink._file, room=first + 10)
    failed = sink.write_many({"sections": sections, "steps": steps})
    assert list(failed) == ["steps"] and isinstance(failed["steps"], OSError)
    sink.close()
    (seg,) = spool.list_segments(spool.rank_dir(tmp_path, "full", 0))
    frames = list(spool.read_frames(seg, sealed=True))
    assert [f.corrupt for f in frames] == [False, True]  # the torn tail is skipped
    table = codec.ipc_to_table(frames[0].payload)
    assert table.to_pylist()[0]["name"] == "forward"
