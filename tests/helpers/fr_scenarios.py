"""Real gloo hangs that leave Flight Recorder dumps, for tests/test_import_fr.py.

Run by :func:`tests.helpers.ranks.run_ranks` with ``TORCH_FR_BUFFER_SIZE`` set. Each
rank that is meant to dump starts a timer that writes ``_dump_fr_trace`` (pickle) or
``_dump_fr_trace_json`` to ``<workdir>/fr/<file>`` while the main thread hangs, then
exits the process (the way a watchdog dumps and aborts a hung job).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist

HANG_S = 3.0


def _dump_then_exit(path: Path | None, as_json: bool, after_s: float) -> None:
    def fire() -> None:
        if path is not None:
            from torch._C import _distributed_c10d as c

            data = c._dump_fr_trace_json() if as_json else c._dump_fr_trace(includeStackTraces=False)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        os._exit(0)

    t = threading.Timer(after_s, fire)
    t.daemon = True
    t.start()


def _warm_up(rank: int, world: int) -> None:
    x = torch.ones(8)
    sub = dist.new_group([0, 1])
    for _ in range(4):
        dist.all_reduce(x)
    if rank in (0, 1):
        dist.broadcast(x, 0, group=sub)
    dist.all_gather_into_tensor(torch.empty(8 * world), x)


def stuck_rank(rank: int, world: int, workdir: Path) -> dict:
    """Rank 1 never reaches the 6th world collective; rank 2 dies without a dump."""
    _warm_up(rank, world)
    fr = workdir / "fr"
    if rank == 2:
        _dump_then_exit(None, False, HANG_S)
    elif rank == 0:
        _dump_then_exit(fr / "nccl_trace_rank_0.json", True, HANG_S)
    else:
        _dump_then_exit(fr / f"nccl_trace_rank_{rank}", False, HANG_S)
    if rank == 1:
        time.sleep(60)  # stuck before the collective
    dist.all_reduce(torch.ones(8))
    time.sleep(60)
    return {}


def desync(rank: int, world: int, workdir: Path) -> dict:
    """The ranks call different collectives at the same sequence number (a desync that
    hangs: gloo aborts on a size mismatch within one op kind, not across kinds)."""
    dist.all_reduce(torch.ones(8))
    _dump_then_exit(workdir / "fr" / f"rank{rank}.pkl", False, HANG_S)
    if rank == 0:
        dist.all_reduce(torch.ones(8))
    else:
        dist.broadcast(torch.ones(8), 0)
    time.sleep(60)
    return {}
