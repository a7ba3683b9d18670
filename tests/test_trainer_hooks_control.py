"""Runtime control of the hooks (control file -> level), guarded CUDA events, bounded
pending ops. One gloo rank in this process."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from fleetscope.trainer.launcher import free_port
from fleetscope.trainer_hooks.clock import CudaTimer
from fleetscope.trainer_hooks.control import control_path, write_control

from fleetscope import trainer_hooks as hooks
from fleetscope.topology import Topology

FAST = hooks.HookConfig(poll_interval_s=0.05, flush_interval_s=0.05, inflight_interval_s=0.05,
                        metrics_interval_s=0.2)


@pytest.fixture()
def world1():
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    hooks.shutdown()
    dist.destroy_process_group()


def _wait_for(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "not within the time limit"
        time.sleep(0.02)


def test_level_set_through_the_control_file_takes_effect_and_keeps_seq_aligned(world1, tmp_path):
    sink = hooks.MemorySink()
    ctl = control_path(tmp_path, "j")
    rec = hooks.init(job="j", rank=0, topology=Topology(), sink=sink, control=ctl, config=FAST)
    t = torch.ones(4)
    with hooks.step(0):
        dist.all_reduce(t)
    write_control(ctl, {"level": "off"})
    t0 = time.monotonic()
    _wait_for(lambda: rec.level == 0)
    assert time.monotonic() - t0 < 5.0
    for n in (1, 2):
        with hooks.step(n):
            with hooks.section("forward"):
                dist.all_reduce(t)
                funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    time.sleep(0.2)  # in-flight rows while off
    write_control(ctl, {"level": "full"})
    _wait_for(lambda: rec.level == 3)
    with hooks.step(3):
        with hooks.section("forward"):
            dist.all_reduce(t)
    hooks.shutdown()
    coll = sink.rows("collectives")
    assert [(r["step"], r["seq"]) for r in coll] == [(0, 1), (3, 6)]  # 4 ops counted, not traced
    assert {r["step"] for r in sink.rows("steps")} == {0, 3}
    assert {r["step"] for r in sink.rows("sections")} == {3}
    levels = [r["value"] for r in sink.rows("metrics") if r["name"] == "hooks.instrumentation_level"]
    assert 0.0 in levels and levels[-1] == 3.0
    untraced = [r for r in sink.rows("inflight") if r["kind"] == "untraced"]
    assert untraced and all(r["op"] == "off" for r in untraced)


def test_control_interval_is_its_own_and_drains_stay_at_the_poll_interval(tmp_path):
    """``control_interval_s`` lets a level change show within it while the queue is
    drained only every ``poll_interval_s`` (the overhead bench runs this way)."""
    sink = hooks.MemorySink()
    ctl = control_path(tmp_path, "j")
    cfg = hooks.HookConfig(poll_interval_s=30, control_interval_s=0.05, flush_interval_s=30,
                           inflight_interval_s=30, metrics_interval_s=30)
    rec = hooks.init(job="j", rank=0, sink=sink, control=ctl, config=cfg,
                     trace_collectives=False)
    with hooks.section("forward"):
        pass
    write_control(ctl, {"level": "steps"})
    t0 = time.monotonic()
    _wait_for(lambda: rec.level == 1)
    assert time.monotonic() - t0 < 2.0
    assert len(rec.queue) == 1  # not drained by the control polls
    hooks.shutdown()
    assert len(sink.rows("sections")) == 1


def test_per_rank_level_and_a_bad_control_file(world1, tmp_path):
    sink = hooks.MemorySink()
    ctl = control_path(tmp_path, "j")
    rec = hooks.init(job="j", rank=0, topology=Topology(), sink=sink, control=ctl, config=FAST)
    write_control(ctl, {"level": "full", "ranks": {"0": "sections", "1": "off"}})
    _wait_for(lambda: rec.level == 2)
    ctl.write_text("{not json")
    _wait_for(lambda: rec.control.errors >= 1)
    assert rec.level == 2  # unchanged by a file it cannot read
    with hooks.step(0):
        with hooks.section("forward"):
            dist.all_reduce(torch.ones(2))
    hooks.shutdown()
    assert sink.rows("sections") and not sink.rows("collectives")
    with pytest.raises(ValueError, match="not one of off, steps, sections, full"):
        hooks.set_level("verbose")


class _BrokenCuda:
    """A torch stand-in whose CUDA events fail like a device in a sticky error state."""

    class cuda:  # noqa: N801
        calls = 0

        class Event:
            def __init__(self, enable_timing=True):
                _BrokenCuda.cuda.calls += 1
                raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_cuda_error_never_reaches_the_training_thread(world1):
    sink = hooks.MemorySink()
    rec = hooks.init(job="c", rank=0, topology=Topology(), sink=sink, config=FAST)
    rec.cuda = CudaTimer(_BrokenCuda, "cuda:0")
    t = torch.ones(4)
    for n in range(3):
        with hooks.step(n):
            with hooks.section("forward"):
                dist.all_reduce(t)
                dist.all_reduce(t, async_op=True).wait()
                funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    s = hooks.stats()
    hooks.shutdown()
    assert s["cuda_errors"] == 1 and s["cuda_disabled"]  # degraded to CPU timing at once
    assert _BrokenCuda.cuda.calls == 1
    assert len(sink.rows("sections")) == 3 and len(sink.rows("collectives")) == 9
    assert all(r["state"] == "completed" and r["duration_ns"] >= 0 for r in sink.rows("collectives"))
    assert all(r["device_ns"] == -1 for r in sink.rows("sections"))
    assert any(r["name"] == "hooks.cuda_errors_total" and r["value"] == 1 for r in sink.rows("metrics"))


def test_pending_async_ops_are_bounded(world1):
    sink = hooks.MemorySink()
    cfg = hooks.HookConfig(max_pending=4, poll_interval_s=30, flush_interval_s=30)
    rec = hooks.init(job="p", rank=0, topology=Topology(), sink=sink, config=cfg)
    t = torch.ones(4)
    works = [dist.all_reduce(t, async_op=True) for _ in range(10)]
    outs = [funcol.all_reduce(t, "sum", dist.group.WORLD) for _ in range(10)]
    assert len(rec.pending_async) <= 4 and len(rec.functional_pending) <= 4
    assert rec.dropped >= 12
    for w in works:
        w.wait()
    for o in outs:
        o.wait()
    hooks.shutdown()
    rows = sink.rows("collectives")
    assert len(rows) == 20  # every op has its record; the untracked ones without an end
    assert sum(r["state"] == "completed" for r in rows) == 8


def test_uninstalled_tracing_leaves_torch_as_it_was(world1):
    from torch.distributed import ProcessGroup

    sink = hooks.MemorySink()
    hooks.init(job="u", rank=0, topology=Topology(), sink=sink)
    hooks.uninstall_tracing()
    assert "allreduce" not in ProcessGroup.__dict__ or not getattr(
        ProcessGroup.__dict__["allreduce"], "_fleetscope_traced", False)
    t = torch.ones(4)
    dist.all_reduce(t)  # the restored methods still bind ``self``
    dist.group.WORLD.allreduce([t]).wait()
    funcol.all_reduce(t, "sum", dist.group.WORLD).wait()
    hooks.shutdown()
    assert sink.rows("collectives") == []
    sink2 = hooks.MemorySink()
    hooks.init(job="u", rank=0, topology=Topology(), sink=sink2)  # installs again
    dist.all_reduce(t)
    hooks.shutdown()
    assert [r["op"] for r in sink2.rows("collectives")] == ["all_reduce"]
