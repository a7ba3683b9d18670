"""Scenarios for tests/test_trainer_hooks_coverage.py, run on real gloo ranks by
:func:`tests.helpers.ranks.run_ranks` (each returns what the test checks)."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed import all_reduce as bound_before_init  # a name bound at import time

from fleetscope import trainer_hooks as hooks
from fleetscope.topology import Topology


def _rows(sink: hooks.MemorySink) -> list[dict]:
    keep = ("step", "group_id", "axis", "seq", "op", "bytes", "dtype", "peer", "state",
            "enqueued_ns", "completed_ns", "duration_ns")
    return [{k: r[k] for k in keep} for r in sink.rows("collectives")]


def every_call_path(rank: int, world: int, workdir: Path) -> dict:
    """One step per way of calling a collective; the step number names the way."""
    import torch.distributed._functional_collectives as funcol
    from torch.distributed import distributed_c10d
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    sink = hooks.MemorySink()
    hooks.init(job="cov", rank=rank, topology=Topology(dp=world), sink=sink)
    from torch.distributed import all_reduce as bound_after_init

    x = torch.ones(8)
    mesh = init_device_mesh("cpu", (world,))
    ways = [
        ("dist.all_reduce", lambda: dist.all_reduce(x)),
        ("distributed_c10d.all_reduce", lambda: distributed_c10d.all_reduce(x)),
        ("from-import after init", lambda: bound_after_init(x)),
        ("from-import before init", lambda: bound_before_init(x)),
        ("ProcessGroup.allreduce", lambda: dist.group.WORLD.allreduce([x]).wait()),
        ("async dist.all_reduce", lambda: dist.all_reduce(x, async_op=True).wait()),
        ("funcol.all_reduce + wait", lambda: funcol.all_reduce(x, "sum", dist.group.WORLD).wait()),
        ("funcol all_gather, implicit wait", lambda: funcol.all_gather_tensor(x, 0, dist.group.WORLD) + 1),
        ("funcol by group name", lambda: funcol.wait_tensor(torch.ops._c10d_functional.all_reduce(
            x, "sum", dist.group.WORLD.group_name))),
        ("_coalescing_manager", lambda: _coalesced(x)),
        ("batch_isend_irecv", lambda: [w.wait() for w in dist.batch_isend_irecv([
            dist.P2POp(dist.isend, x, (rank + 1) % world),
            dist.P2POp(dist.irecv, torch.empty(8), (rank - 1) % world)])]),
        ("DTensor redistribute", lambda: distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
            .redistribute(mesh, [Replicate()]).to_local()),
        ("DDP with the default comm hook", lambda: _ddp_step()),
    ]
    for step, (_, call) in enumerate(ways):
        with hooks.step(step):
            call()
    hooks.shutdown()
    return {"ways": [w for w, _ in ways], "rows": _rows(sink)}


def _ddp_step() -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    model(torch.ones(2, 8)).sum().backward()


def _coalesced(x: torch.Tensor) -> None:
    with dist._coalescing_manager(async_ops=True) as cm:
        dist.all_reduce(x)
        dist.all_reduce(x)
    cm.wait()


def hang_before_functional(rank: int, world: int, workdir: Path) -> dict:
    """Rank 1 is stuck in compute before a functional all-reduce that rank 0 waits in."""
    import torch.distributed._functional_collectives as funcol

    cfg = hooks.HookConfig(inflight_interval_s=0.2, poll_interval_s=0.2, flush_interval_s=0.2)
    hooks.init(job="hang", rank=rank, topology=Topology(dp=world), spool=workdir / "spool",
               config=cfg)
    x = torch.ones(4)
    for step in range(3):
        with hooks.step(step):
            with hooks.section("forward"):
                if rank == 1 and step == 2:
                    time.sleep(float(5))  # stuck in compute
            funcol.all_reduce(x, "sum", dist.group.WORLD).wait()
    hooks.shutdown()
    return {}
