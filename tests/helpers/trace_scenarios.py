"""A small gloo job traced with torch.profiler, for tests/test_import_trace.py.

Each rank runs a few steps (forward / backward / optimizer as ``record_function``
ranges, a data-parallel all-reduce of the gradients) under ``torch.profiler.profile``
and exports its Chrome trace to ``<workdir>/traces/rank<r>.json``. Rank 1 is made a
straggler in ``forward`` (a busy loop) so the imported sections show it.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

STEPS = 6
"""Steps profiled (``ProfilerStep#0..5`` on rank 0)."""
SLOW_S = 0.1


def profiled_job(rank: int, world: int, workdir: Path) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    out = workdir / "traces"
    out.mkdir(exist_ok=True)
    # rank 0 with a profiler schedule (ProfilerStep#N ranges mark the steps), rank 1
    # without (the importer infers steps from the first section's occurrences)
    path = str(out / f"rank{rank}.json")
    scheduled = dict(schedule=torch.profiler.schedule(wait=0, warmup=0, active=STEPS, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(path)) if rank == 0 else {}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, **scheduled) as prof:
        for _ in range(STEPS):
            x = torch.randn(32, 64)
            with record_function("forward"):
                loss = model(x).pow(2).mean()
                if rank == 1:
                    t_end = time.perf_counter() + SLOW_S
                    while time.perf_counter() < t_end:
                        pass
            with record_function("backward"):
                loss.backward()
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            with record_function("optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    if not scheduled:
        prof.export_chrome_trace(path)
    return {}
