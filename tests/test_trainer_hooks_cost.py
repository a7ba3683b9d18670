"""What keeps trainer_hooks cheap: the direct Arrow IPC encoder (no pandas import, exact
same stream as the codec), one spool write per flush, a background thread that sleeps
between periodic wake-ups, and async completion recorded where the trainer observes it."""

from __future__ import annotations

import math
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


def _as_stored(table) -> list[dict]:
    """The rows as the codec keeps them: the hooks write ±inf as they got it, the codec
    stores it as NaN (fleetscope.codec._finite_or_nan)."""
    return [{k: (math.nan if isinstance(v, float) and math.isinf(v) else v) for k, v in row.items()}
            for row in table.to_pylist()]


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
        assert repr(_as_stored(got)) == repr(want.to_pylist())  # repr: NaN compares


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


@pytest.mark.parametrize("name", ["sections", "collectives", "steps", "inflight"])
def test_columns_encode_the_same_stream_as_their_rows(name):
    """The background thread's column batches (constant job/rank/host, bulk chunks and
    single rows, trusted and checked columns) decode to exactly what the codec makes of
    the same rows; values the fast path must not pack (bool, numpy-like, float in an int
    column, non-str) take the checking path and name the row there."""
    from fleetscope.trainer_hooks.batch import Columns, ColumnSpec
    from fleetscope.trainer_hooks.recorder import _NAMES, _TRUSTED

    rt = RECORD_TYPES[name]
    rnd = random.Random(name)
    names = _NAMES[name]
    spec = ColumnSpec(name, {"job": "jöb", "attempt": 2, "rank": 7, "host": "h"}, names,
                      _TRUSTED[name])
    types = {c.name: c.type for c in rt.columns}
    for n_chunks, n_single in ((1, 0), (0, 1), (2, 3), (3, 1)):
        batch = Columns(spec)
        for _ in range(n_chunks):
            k = rnd.randint(1, 40)
            batch.extend([[_value(rnd, types[c]) for _ in range(k)] for c in names])
        for _ in range(n_single):
            batch.append(tuple(_value(rnd, types[c]) for c in names))
        rows = batch.rows()
        assert len(rows) == len(batch)
        got = codec.ipc_to_table(batch.ipc_stream())
        want = codec.rows_to_table(rt, rows)
        assert got.schema.equals(want.schema, check_metadata=True)
        assert repr(_as_stored(got)) == repr(want.to_pylist())
    unchecked = [c for c in names if c not in _TRUSTED[name]]
    for bad in (True, 1.5, None, b"x"):  # into a column holding what users pass
        batch = Columns(spec)
        batch.append(tuple(_value(rnd, types[c]) for c in names))
        values = [_value(rnd, types[c]) for c in names]
        values[names.index(unchecked[0])] = bad
        batch.append(tuple(values))
        with pytest.raises(codec.BatchError, match=rf"{name}\[1\]"):
            batch.ipc_stream()


class _TeeSpoolSink(hooks.SpoolSink):
    """A real SpoolSink that also keeps, as rows, every batch it was asked to write."""

    def __init__(self, directory) -> None:
        super().__init__(directory)
        self.kept: dict[str, list[dict]] = {}

    def write_many(self, batches):
        from fleetscope.trainer_hooks.batch import rows_of

        for name, batch in batches.items():
            self.kept.setdefault(name, []).extend(rows_of(batch))
        return super().write_many(batches)


def test_recorded_rows_are_the_same_in_memory_and_in_the_spool(tmp_path):
    """What the hooks record (sections, sync, async and p2p collectives, steps with and
    without extra info, in-flight rows, emitted rows) reaches the spool with exactly the
    values of the rows the recorder handed the sink."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from fleetscope.trainer.launcher import free_port
    from fleetscope.trainer_hooks import collectives
    from fleetscope.trainer_hooks.reader import read_job

    from fleetscope.topology import Topology

    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    sink = _TeeSpoolSink(tmp_path)
    send = collectives.traced("send", lambda *a, **k: None)  # no peer in a 1-rank group
    try:
        hooks.init(job="tee", rank=0, topology=Topology(), sink=sink, config=FAST)
        t = torch.ones(16)
        for step in range(4):
            with hooks.step(step, num_microbatches=2, **({"tokens": 64} if step % 2 else {})):
                for mb in range(2):
                    with hooks.section("forward", microbatch=mb):
                        dist.all_reduce(t)
                        dist.all_gather([torch.empty(16)], t)
                    send(t, 1)
                with hooks.section("grad_sync", kind="other"):
                    dist.all_reduce(t, async_op=True).wait()
                    time.sleep(0.03)
                hooks.emit("log_events", source="test", kind="note", message=f"step {step}")
        hooks.shutdown()
    finally:
        dist.destroy_process_group()
    spooled = read_job(tmp_path, "tee")
    assert {"sections", "collectives", "steps", "inflight", "metrics", "log_events"} <= set(spooled)
    for name, rows in sink.kept.items():
        want = codec.rows_to_table(RECORD_TYPES[name], rows).to_pylist()
        assert repr(spooled[name]) == repr(want), name
    colls = spooled["collectives"]
    assert len(colls) == 4 * (2 * 3 + 1)
    assert {(c["op"], c["state"]) for c in colls} == {
        ("all_reduce", "completed"), ("all_gather", "completed"), ("send", "completed")}
    assert [c["seq"] for c in colls if c["op"] == "send"] == list(range(1, 9))
    assert all(c["rank"] == 0 and c["job"] == "tee" and c["completed_ns"] >= c["enqueued_ns"]
               for c in colls)
    assert [s["tokens"] for s in spooled["steps"]] == [0, 64, 0, 64]


def test_bulk_and_one_by_one_conversion_make_the_same_rows():
    """The background thread converts a wake-up's queue in bulk (columns at once) and
    items that waited for CUDA events one at a time; both give the same rows."""
    from fleetscope.trainer_hooks.collectives import GroupInfo, Op
    from fleetscope.trainer_hooks.recorder import Recorder, perf_ns

    from fleetscope.topology import Topology

    group = GroupInfo(None, "tp.pp0.dp0", "tp", [0, 1], 1)
    t = perf_ns()
    flat = [("c", "all_reduce", group, k, 3, k % 2, 4096, "float32", -1, t + k, t + 2 * k + 5,
             "completed") for k in range(5)]
    sync = Op("send", group, 1, 3, 0, 64, "bfloat16", 0, t)
    sync.t_done = t + 9
    unseen = Op("recv", group, 1, 3, 1, 64, "bfloat16", 0, t)  # async, never seen completing
    # CPU-clock readings at entry and exit (-1: not read, the section's cpu_ns is -1)
    items = [("S", "forward", "compute", 3, k, t + k, t + 10 * k + 1, None, None, 100 * k if k else -1,
              107 * k + 3 if k else -1) for k in range(3)]
    items.append(("T", 3, t, t + 100, {"tokens": 8, "loss": 0.25}))
    ops = flat + [("C", sync), ("C", unseen)]
    rows = {}
    for how in ("bulk", "one by one"):
        rec = Recorder("j", 1, hooks.MemorySink(), topology=Topology(tp=2), config=FAST)
        rec.cpu.offset_ns = 10**18
        if how == "bulk":
            assert rec._convert_all(list(items), list(ops)) == []
        else:
            assert all(rec._convert(item) for item in ops + items)
        rows[how] = {rt: sorted(batch, key=repr) for rt, batch in rec.rows.items()}
    assert rows["bulk"] == rows["one by one"]
    assert sorted(r["cpu_ns"] for r in rows["bulk"]["sections"]) == [-1, 10, 17]
    colls = rows["bulk"]["collectives"]
    assert len(colls) == 7 and {c["state"] for c in colls} == {"completed", "started"}
    (started,) = [c for c in colls if c["state"] == "started"]
    assert started["op"] == "recv" and started["completed_ns"] == started["duration_ns"] == -1


def test_sync_ops_read_their_tensor_in_a_batch_and_free_it():
    """A synchronous CPU op does not call into libtorch for its tensor's bytes and dtype
    (cold after every blocking collective): the tensor is read when the enclosing
    section ends, at the next step, or on the background thread, whichever comes
    first. Every record still carries the right bytes and dtype, and no tensor is kept
    past those points."""
    torch = pytest.importorskip("torch")
    import gc
    import weakref

    import torch.distributed as dist
    from fleetscope.trainer.launcher import free_port

    sink = hooks.MemorySink()
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        cfg = hooks.HookConfig(poll_interval_s=30, flush_interval_s=30, inflight_interval_s=30)
        rec = hooks.init(job="d", rank=0, sink=sink, config=cfg)
        hooks.step(0)
        with hooks.section("forward"):
            t = torch.ones(100, dtype=torch.float64)
            dist.all_reduce(t)
            ref = weakref.ref(t)
            assert len(rec.unresolved) == 1  # not read inline
            del t
            gc.collect()
            assert ref() is not None  # kept until the section ends ...
        gc.collect()
        assert ref() is None and not rec.unresolved  # ... and no longer
        u = torch.ones(7, dtype=torch.int32)
        dist.all_reduce(u)  # outside any section: read at the next step
        dist.all_reduce([torch.ones(3)][0])
        hooks.step(1)
        assert not rec.unresolved
        v = torch.ones(5, dtype=torch.int64)
        dist.all_reduce(v)  # never read on the training thread: the background thread does
        rec.unresolved.clear()  # as if the background thread took it first
        hooks.shutdown()
    finally:
        dist.destroy_process_group()
    rows = sink.rows("collectives")
    assert [(r["bytes"], r["dtype"]) for r in rows] == [
        (800, "float64"), (28, "int32"), (12, "float32"), (40, "int64")]
    assert all(type(r["bytes"]) is int for r in rows)
